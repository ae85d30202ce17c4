// The dashboard's JSON API (docs/api.md): filled in by the API work.
#include "dashboard/dashboard.hpp"
