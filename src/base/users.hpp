#pragma once

#include <sys/types.h>

#include <string>

namespace nshpc::users {

// "alice" for the real uid, or "uid 1234" when it has no name.
std::string current_user_name();

// Who did something, for the audit log: "cli:alice".
std::string cli_actor();

}  // namespace nshpc::users
