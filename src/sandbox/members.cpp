#include "sandbox/members.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/error.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"

namespace nshpc::sandbox {

namespace {

bool in_namespace(pid_t pid, std::uint64_t pid_ns) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/ns/pid", static_cast<int>(pid));
  struct stat st;
  return ::stat(path, &st) == 0 && st.st_ino == pid_ns;
}

}  // namespace

UniqueFd open_member(pid_t pid, std::uint64_t pid_ns) {
  if (pid <= 0 || !in_namespace(pid, pid_ns)) return {};
  UniqueFd fd = open_pidfd(pid);
  // Checked again with the pidfd held: the pid cannot be reused for another process now.
  if (!fd || !in_namespace(pid, pid_ns)) return {};
  return fd;
}

std::size_t signal_members(std::uint64_t pid_ns, int sig) {
  std::size_t count = 0;
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), ::closedir);
  if (!proc) return 0;
  while (dirent* e = ::readdir(proc.get())) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    UniqueFd fd = open_member(static_cast<pid_t>(std::atoi(e->d_name)), pid_ns);
    if (!fd) continue;
    try {
      signal_pidfd(fd.get(), sig);
      ++count;
    } catch (const std::exception&) {
      // Not ours to signal (EPERM): nothing else to do for it.
    }
  }
  return count;
}

pid_t parent_of(pid_t pid) {
  try {
    const std::optional<proc::Stat> stat = proc::read_stat(pid);
    return stat ? stat->ppid : 0;
  } catch (const SysError&) {
    return 0;  // unreadable: as good as gone for a walk of the tree
  }
}

bool living_main_process(const TreeMember& member, pid_t init) {
  if (member.pid == init) return true;
  if (member.ppid != init) return false;
  return proc::read_cmdline(member.pid) == std::vector<std::string>{"sleep", "86400"};  // kLivingMain's idler
}

std::vector<TreeMember> tree_members(std::uint64_t pid_ns) {
  std::vector<TreeMember> out;
  std::map<std::uint64_t, bool> below;  // pid namespace -> its parent is pid_ns
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), ::closedir);
  if (!proc) return out;
  while (dirent* e = ::readdir(proc.get())) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/ns/pid", static_cast<int>(pid));
    UniqueFd ns(::open(path, O_RDONLY | O_CLOEXEC));
    if (!ns) continue;
    struct stat st;
    if (::fstat(ns.get(), &st) < 0) continue;
    bool member = st.st_ino == pid_ns;
    if (!member) {
      auto it = below.find(st.st_ino);
      if (it == below.end()) {
        bool is_below = false;
        UniqueFd parent(::ioctl(ns.get(), NS_GET_PARENT));
        struct stat pst;
        if (parent && ::fstat(parent.get(), &pst) == 0) is_below = pst.st_ino == pid_ns;
        it = below.emplace(st.st_ino, is_below).first;
      }
      member = it->second;
    }
    if (member) out.push_back({pid, parent_of(pid), static_cast<std::uint64_t>(st.st_ino)});
  }
  return out;
}

}  // namespace nshpc::sandbox
