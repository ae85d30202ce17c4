#include "base/users.hpp"

#include "base/error.hpp"

#include <linux/capability.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
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

void drop_capabilities() {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw SysError(errno, "prctl", "PR_SET_NO_NEW_PRIVS");
  ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  for (int cap = 0; cap <= 63; ++cap)
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL && errno != EPERM)
      throw SysError(errno, "prctl", "PR_CAPBSET_DROP");
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capset, &header, data) != 0) throw SysError(errno, "capset", "dropping every capability");
}

}  // namespace nshpc::users
