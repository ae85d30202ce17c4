#include "base/users.hpp"

#include <pwd.h>
#include <unistd.h>

#include <vector>

#include <fmt/format.h>

namespace nshpc::users {

std::string current_user_name() {
  uid_t uid = ::getuid();
  struct passwd pw;
  struct passwd* result = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &result) == 0 && result)
    return result->pw_name;
  return fmt::format("uid {}", uid);
}

std::string cli_actor() { return "cli:" + current_user_name(); }

std::optional<Identity> sandbox_owner(uid_t sandbox_uid, gid_t sandbox_gid, bool as_root) {
  if (!as_root || sandbox_uid == 0) return std::nullopt;
  return Identity{sandbox_uid, sandbox_gid};
}

}  // namespace nshpc::users
