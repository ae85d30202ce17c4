// The one translation unit that compiles toml++ itself (the rest include it as headers), so the
// binary needs no libtomlplusplus.so at run time.
#define TOML_IMPLEMENTATION
#include <toml++/toml.h>
