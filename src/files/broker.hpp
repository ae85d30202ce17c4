// File operations the server may not do itself, done by a helper that is root of a user
// namespace mapping the instance's ids.
//
// A normal user's image instance makes files the server cannot manage from outside: files of the
// accounts made inside (owned by the user's subordinate uids), folders with a mode that keeps
// even their owner out. As root of a user namespace that maps those ids, a process has every
// capability over them. The broker is such a process: the ns-hpc binary itself, run as
//   <as_mapped_root prefix: unshare --map-users/--map-groups --map-root-user --> ns-hpc __file-broker
// with a SOCK_SEQPACKET socket on descriptor 3. It does single system calls for the server, on
// descriptors the server passes it (SCM_RIGHTS) beneath the roots the server opened, and passes
// the descriptors it opens back:
//   - openat2 with the resolver's rules (fs::open_beneath: never out of the descriptor's tree),
//   - mkdirat, unlinkat, renameat2, symlinkat of one name in a folder (never a path),
//   - fchmod of a descriptor, fchown of one to the owner of another, fs::remove_tree_at of one
//     name, and fs::tree_usage of a folder (a count that would leave out closed folders).
// It opens nothing by path and takes no path with a '/' where a name is asked for, so it reaches
// only what the server's descriptors reach. It runs in the host's mount namespace, cannot be
// seen from any sandbox (none shares its pid namespace), is not dumpable, and ends with the
// server (parent-death signal) or when the socket closes.
//
// The resolver (files/resolver.hpp) asks the broker only after its own call failed with EACCES
// or EPERM, so a failed call has changed nothing, and an instance whose files the server can
// manage never starts one.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/safe_path.hpp"
#include "base/spawn.hpp"

namespace nshpc::files {

// argv[1] that makes ns-hpc a file broker (dispatched in main() before anything else is set up).
inline constexpr std::string_view kBrokerCommand = "__file-broker";

class Broker {
 public:
  // `argv`: how to start it (the namespace prefix, then this program and kBrokerCommand). Started
  // on first use; a broker that cannot start says why on every call.
  explicit Broker(std::vector<std::string> argv);
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;
  ~Broker();

  // As fs::open_beneath, done by the broker. Throws SysError.
  UniqueFd open_beneath(int dir_fd, std::string_view relative, int flags, mode_t mode, fs::Resolve how,
                        std::string_view shown);
  // The system calls of that name: 0, or the errno. Throw SysError only when the broker cannot
  // be reached.
  int mkdirat(int dir_fd, const std::string& name, mode_t mode);
  int unlinkat(int dir_fd, const std::string& name, int flags);
  int renameat2(int from_dir, const std::string& from, int to_dir, const std::string& to, unsigned flags);
  int symlinkat(const std::string& target, int dir_fd, const std::string& name);
  int fchmod(int fd, mode_t mode);
  // fchown of `fd` to the owner and group of `like` (ids as the broker's namespace sees them, so
  // none are translated here).
  int fchown_like(int fd, int like);
  // fs::remove_tree_at(dir_fd, name): 0, or the errno it failed with.
  int remove_tree_at(int dir_fd, const std::string& name);
  // fs::tree_usage of the folder `dir_fd` (any descriptor of it). Throws SysError.
  fs::TreeUsage tree_usage(int dir_fd, std::string_view shown);

  enum class Op : std::uint32_t { open = 1, mkdir, unlink, rename, symlink, chmod, remove_tree, chown_like, usage };

 private:
  struct Reply {
    int error = 0;
    UniqueFd fd;
    fs::TreeUsage usage;
  };
  Reply call(Op op, std::initializer_list<int> fds, std::uint32_t flags, std::uint32_t mode, std::uint32_t resolve,
             std::string_view name, std::string_view name2 = {});
  void start();

  std::mutex mutex_;  // one request at a time on the socket
  std::vector<std::string> argv_;
  UniqueFd socket_;
  UniqueFd stderr_;  // the broker's standard error, for why it did not start
  SpawnedChild child_;
  std::string failed_;  // why it could not be started or reached; then every call throws
};

// The broker's side: serves requests on descriptor 3 until it closes. Returns the exit status.
int broker_main(int argc, char** argv);

}  // namespace nshpc::files
