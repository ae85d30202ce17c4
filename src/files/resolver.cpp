#include "files/resolver.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/random.hpp"
#include "base/safe_path.hpp"
#include "files/broker.hpp"

namespace nshpc::files {

namespace {

using fs::Resolve;

// How deep copy() descends (each level holds two descriptors).
constexpr int kMaxCopyDepth = 128;

// Links InstanceFiles::resolve looks through for one path, absolute and relative together: the
// kernel follows at most 40 in one resolution (then ELOOP), and this bounds the walk's work.
constexpr int kMaxLinks = 40;

std::string rel_or_dot(const std::string& rel) { return rel.empty() ? std::string(".") : rel; }

// ---------------------------------------------------------------------------------------------
// The identity regime (resolver.hpp): while an Acting lives, this thread's file system calls run
// with `who`'s filesystem uid and gid and no supplementary group (the sandbox's user has none), so
// the kernel grants exactly what that user may do. Per thread: setfsuid/setfsgid are, and the
// groups are set with the raw system call (glibc's setgroups would change every thread's). From
// root, a non-zero fsuid also drops the filesystem capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER,
// CAP_CHOWN, ...); going back to 0 raises them again. nullopt: nothing changes. A scope inside
// one of the same identity costs two system calls; scopes of two different identities are never
// nested (copy() switches per call instead), so nullopt never has to mean "back to root".
class Acting {
 public:
  explicit Acting(const std::optional<users::Identity>& who) {
    if (!who) return;
    const auto uid_now = static_cast<uid_t>(::setfsuid(static_cast<uid_t>(-1)));
    const auto gid_now = static_cast<gid_t>(::setfsgid(static_cast<gid_t>(-1)));
    if (uid_now == who->uid && gid_now == who->gid) return;  // an enclosing operation's
    const int count = ::getgroups(0, nullptr);
    if (count < 0) throw SysError(errno, "getgroups", "of this thread");
    groups_.resize(static_cast<std::size_t>(count));
    if (count > 0 && ::getgroups(count, groups_.data()) < 0) throw SysError(errno, "getgroups", "of this thread");
    if (::syscall(SYS_setgroups, 0, nullptr) < 0)
      throw SysError(errno, "setgroups", fmt::format("(none, to act as uid {})", who->uid));
    old_uid_ = uid_now;
    old_gid_ = gid_now;
    active_ = true;
    ::setfsgid(who->gid);
    ::setfsuid(who->uid);
    // setfsuid says nothing of a failure: asked again, the kernel answers with what is in force.
    if (static_cast<uid_t>(::setfsuid(static_cast<uid_t>(-1))) != who->uid ||
        static_cast<gid_t>(::setfsgid(static_cast<gid_t>(-1))) != who->gid) {
      restore();
      throw SysError(EPERM, "setfsuid", fmt::format("{}:{} (the identity of the instance's files)", who->uid, who->gid));
    }
  }
  ~Acting() {
    if (active_) restore();
  }
  Acting(const Acting&) = delete;
  Acting& operator=(const Acting&) = delete;

 private:
  void restore() noexcept {
    ::setfsuid(old_uid_);  // first: back to 0 gives the capabilities back (setgroups needs CAP_SETGID)
    ::setfsgid(old_gid_);
    ::syscall(SYS_setgroups, groups_.size(), groups_.data());
    active_ = false;
  }
  bool active_ = false;
  uid_t old_uid_ = 0;
  gid_t old_gid_ = 0;
  std::vector<gid_t> groups_;
};

bool same_identity(const std::optional<users::Identity>& a, const std::optional<users::Identity>& b) {
  if (!a || !b) return !a && !b;
  return a->uid == b->uid && a->gid == b->gid;
}

// No identity: this process's own (a scope that changes nothing).
const std::optional<users::Identity> kOwnIdentity;

std::string join_shown(const std::string& base, std::string_view rel) {
  if (rel.empty()) return base.empty() ? "/" : base;
  if (base.empty() || base == "/") return "/" + std::string(rel);
  return base + "/" + std::string(rel);
}

// "a/b/c" -> ("a/b", "c"); "c" -> ("", "c").
std::pair<std::string, std::string> split_leaf(const std::string& rel) {
  const auto slash = rel.rfind('/');
  if (slash == std::string::npos) return {"", rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

std::vector<std::string> components(std::string_view rel) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= rel.size()) {
    auto end = rel.find('/', start);
    if (end == std::string_view::npos) end = rel.size();
    if (end > start) out.emplace_back(rel.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The system calls beneath a root: by the server, and when it is refused (EACCES, EPERM) and the
// root has a broker, by the broker (a refused call changed nothing, so it is done again whole).

bool refused(int code) { return code == EACCES || code == EPERM; }

UniqueFd open_in(Broker* broker, int dir, std::string_view rel, int flags, mode_t mode, Resolve how,
                 std::string_view shown) {
  try {
    return fs::open_beneath(dir, rel, flags, mode, how, shown);
  } catch (const SysError& e) {
    if (!broker || !refused(e.code())) throw;
  }
  return broker->open_beneath(dir, rel, flags, mode, how, shown);
}

// These return 0 or the errno.
int mkdir_in(Broker* broker, int dir, const std::string& name, mode_t mode) {
  if (::mkdirat(dir, name.c_str(), mode) == 0) return 0;
  const int err = errno;
  return broker && refused(err) ? broker->mkdirat(dir, name, mode) : err;
}

int unlink_in(Broker* broker, int dir, const std::string& name) {
  if (::unlinkat(dir, name.c_str(), 0) == 0) return 0;
  const int err = errno;
  return broker && refused(err) ? broker->unlinkat(dir, name, 0) : err;
}

int rename_in(Broker* broker, int from_dir, const std::string& from, int to_dir, const std::string& to, unsigned flags) {
  if (::renameat2(from_dir, from.c_str(), to_dir, to.c_str(), flags) == 0) return 0;
  const int err = errno;
  return broker && refused(err) ? broker->renameat2(from_dir, from, to_dir, to, flags) : err;
}

int symlink_in(Broker* broker, const std::string& target, int dir, const std::string& name) {
  if (::symlinkat(target.c_str(), dir, name.c_str()) == 0) return 0;
  const int err = errno;
  return broker && refused(err) ? broker->symlinkat(target, dir, name) : err;
}

int chmod_in(Broker* broker, int fd, mode_t mode) {
  if (::fchmod(fd, mode) == 0) return 0;
  const int err = errno;
  return broker && refused(err) ? broker->fchmod(fd, mode) : err;
}

// lstat of `name` in the folder `dir`; through the broker, of the entry itself opened O_PATH.
int stat_in(Broker* broker, int dir, const std::string& name, struct stat& st) {
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return 0;
  const int err = errno;
  if (!broker || !refused(err)) return err;
  try {
    UniqueFd fd = broker->open_beneath(dir, name, O_PATH, 0, Resolve::beneath_no_links, name);
    return ::fstat(fd.get(), &st) == 0 ? 0 : errno;
  } catch (const SysError& e) {
    return e.code();
  }
}

// The target of the link `name` in `dir`.
int readlink_in(Broker* broker, int dir, const std::string& name, std::string& target) {
  char buffer[PATH_MAX];
  ssize_t len = ::readlinkat(dir, name.c_str(), buffer, sizeof buffer - 1);
  if (len < 0 && broker && refused(errno)) {
    try {
      UniqueFd fd = broker->open_beneath(dir, name, O_PATH, 0, Resolve::beneath_no_links, name);
      len = ::readlinkat(fd.get(), "", buffer, sizeof buffer - 1);
    } catch (const SysError& e) {
      return e.code();
    }
  }
  if (len < 0) return errno;
  target.assign(buffer, static_cast<std::size_t>(len));
  return 0;
}

void remove_tree_in(Broker* broker, int dir, const std::string& name, const std::string& shown) {
  try {
    fs::remove_tree_at(dir, name, shown);
    return;
  } catch (const SysError& e) {
    if (!broker || !refused(e.code())) throw;
  }
  if (const int err = broker->remove_tree_at(dir, name)) throw SysError(err, "delete", shown);
}

// ---------------------------------------------------------------------------------------------

// EPERM unless `fd` (a file or folder beneath a confined root, any descriptor of it, O_PATH
// too) is on one of the confinement's file systems and is the tree's own (Root::confine).
void check_confined(const Confinement& c, int fd, const std::string& shown, const char* what) {
  struct statfs sfs;
  if (::fstatfs(fd, &sfs) < 0) throw SysError(errno, "statfs", shown);
  const auto type = static_cast<std::int64_t>(sfs.f_type);
  if (const char* name = kernel_interface(type))
    throw SysError(EPERM, what, fmt::format("{} (on {}, a kernel interface, not the sandbox's own files)", shown, name));
  if (!c.allows(type))
    throw SysError(EPERM, what,
                   fmt::format("{} (on a file system of type {:#x}, not one the sandbox's own files are on)", shown,
                               static_cast<std::uint64_t>(type)));
  struct stat st;
  if (::fstat(fd, &st) < 0) throw SysError(errno, "stat", shown);
  if (!c.owns(st.st_uid))
    throw SysError(EPERM, what,
                   fmt::format("{} (it belongs to uid {}, not to the sandbox's uid {})", shown, st.st_uid, c.uid));
}

void check_confined(const Root& root, int fd, const std::string& shown, const char* what) {
  if (root.confinement()) check_confined(*root.confinement(), fd, shown, what);
}

// `path` (an O_PATH descriptor) opened again with `flags`: that very file, through this process's
// /proc/self/fd, never its path a second time. Checked by the caller before.
UniqueFd reopen(int path, int flags, const std::string& shown) {
  const std::string self = fmt::format("/proc/self/fd/{}", path);
  UniqueFd fd(::open(self.c_str(), flags | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", shown);
  return fd;
}

// `rel` of `dir` opened for reading beneath a confined root: found O_PATH (nothing of the file
// opened yet), refused unless it is a regular file (or, with `folders`, a folder) that
// check_confined allows, then that very file opened. ENXIO for anything else (a FIFO, a device).
Opened open_confined(const Confinement& c, Broker* broker, int dir, const std::string& rel, Resolve how,
                     const std::string& shown, const char* what, bool folders) {
  UniqueFd path = open_in(broker, dir, rel, O_PATH, 0, how, shown);
  struct stat st;
  if (::fstat(path.get(), &st) < 0) throw SysError(errno, "stat", shown);
  const bool is_dir = S_ISDIR(st.st_mode);
  if (!S_ISREG(st.st_mode) && !(folders && is_dir))
    throw SysError(ENXIO, what, shown + (folders ? " (not a regular file or a folder)" : " (not a regular file)"));
  check_confined(c, path.get(), shown, what);
  const int flags = is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY | O_NOCTTY | O_NONBLOCK;
  Opened opened;
  try {
    opened.fd = reopen(path.get(), flags, shown);
  } catch (const SysError& e) {
    // The broker may what this process may not (a file of an account made inside): it opens the
    // path again, as the sandbox's root could; the file it finds must be the one checked.
    if (!broker || !refused(e.code())) throw;
    opened.fd = broker->open_beneath(dir, rel, flags, 0, how, shown);
  }
  if (::fstat(opened.fd.get(), &opened.st) < 0) throw SysError(errno, "stat", shown);
  if (opened.st.st_dev != st.st_dev || opened.st.st_ino != st.st_ino)
    throw SysError(EAGAIN, what, shown + " (it was replaced as it was opened; try again)");
  return opened;
}

void refuse_read_only(const Location& at) {
  if (at.root->read_only()) throw SysError(EROFS, "write", at.shown() + " (a read-only folder)");
}

// The folder that holds the last component of `at`, resolved inside the root (O_PATH).
// EBUSY for the root itself; EINVAL for a last component "..".
UniqueFd open_parent(const Location& at, std::string& leaf) {
  if (at.rel.empty()) throw SysError(EBUSY, "change", at.shown() + " (the folder itself)");
  auto [parent, name] = split_leaf(at.rel);
  if (name == ".." || name == ".") throw SysError(EINVAL, "change", at.shown() + " (ends in '..')");
  leaf = std::move(name);
  const std::string shown = join_shown(at.root->shown(), parent);
  UniqueFd dir = open_in(at.root->broker().get(), at.root->fd(), rel_or_dot(parent), O_PATH | O_DIRECTORY, 0,
                         Resolve::in_root_follow, shown);
  check_confined(*at.root, dir.get(), shown, "change");
  return dir;
}

// The new file that replaces `was` (a file of the tree's own) gets its owner and group: a file of
// an account made inside stays that account's. Where this process may give it: as root, or
// through the broker. Best effort: the content is what was asked for.
void keep_owner(Broker* broker, int fd, const struct stat& was, int dir, const std::string& leaf) {
  struct stat now;
  if (::fstat(fd, &now) < 0 || (now.st_uid == was.st_uid && now.st_gid == was.st_gid)) return;
  if (::fchown(fd, was.st_uid, was.st_gid) == 0 || !broker || !refused(errno)) return;
  try {
    UniqueFd like = broker->open_beneath(dir, leaf, O_PATH, 0, Resolve::beneath_no_links, leaf);
    struct stat st;
    if (::fstat(like.get(), &st) == 0 && st.st_uid == was.st_uid && st.st_gid == was.st_gid)
      broker->fchown_like(fd, like.get());
  } catch (const SysError&) {
  }
}

void give_to_owner(const Root& root, int fd, const std::string& shown) {
  if (!root.chown_new()) return;
  if (::fchownat(fd, "", root.owner_uid(), root.owner_gid(), AT_EMPTY_PATH) < 0)
    throw SysError(errno, "chown", shown);
}

// Every folder of `rel` (a folder path beneath the root) exists afterwards; returns it (O_PATH).
// One component at a time from the folder reached so far (linear in the path's length); a link
// on the way (or "..") is taken by opening the path so far from the root, following links inside
// it as the kernel does (at most 40 of them in one resolution, then ELOOP).
UniqueFd ensure_dirs(const Root& root, const std::string& rel, mode_t mode) {
  Broker* broker = root.broker().get();
  UniqueFd current = open_in(broker, root.fd(), ".", O_PATH | O_DIRECTORY, 0, Resolve::in_root_follow, root.shown());
  std::string prefix;
  for (const std::string& part : components(rel)) {
    if (!prefix.empty()) prefix += '/';
    prefix += part;
    const std::string shown = join_shown(root.shown(), prefix);
    try {
      current = open_in(broker, current.get(), part, O_PATH | O_DIRECTORY, 0, Resolve::beneath_no_links, shown);
      continue;
    } catch (const SysError& e) {
      if (e.code() == ELOOP || e.code() == EXDEV) {
        current = open_in(broker, root.fd(), prefix, O_PATH | O_DIRECTORY, 0, Resolve::in_root_follow, shown);
        continue;
      }
      if (e.code() != ENOENT) throw;
    }
    check_confined(root, current.get(), join_shown(root.shown(), split_leaf(prefix).first), "mkdir");
    if (const int err = mkdir_in(broker, current.get(), part, mode); err != 0 && err != EEXIST)
      throw SysError(err, "mkdir", shown);
    // Opened again without following anything: a link swapped in meanwhile is refused.
    UniqueFd made = open_in(broker, current.get(), part, O_PATH | O_DIRECTORY, 0, Resolve::beneath_no_links, shown);
    give_to_owner(root, made.get(), shown);
    current = std::move(made);
  }
  return current;
}

// EPERM when `st` (a file or a folder beneath `root`) is not the tree's own: read_file and copy
// hand out only what the sandbox itself owns (a root-owned 0600 file planted in a workspace, or
// a hard link to someone else's file, stays where it is).
void refuse_foreign(const Root& root, const struct stat& st, const std::string& shown, const char* what) {
  if (root.any_owner() || root.owns(st.st_uid)) return;
  throw SysError(EPERM, what,
                 fmt::format("{} (it belongs to uid {}, not to the sandbox's uid {})", shown, st.st_uid, root.owner_uid()));
}

void check_cancelled(const Cancelled& cancelled, const std::string& shown) {
  if (cancelled && cancelled()) throw SysError(ECANCELED, "copy", shown + " (cancelled)");
}

void copy_bytes(int from, int to, const std::string& shown) {
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "read", shown);
    }
    if (n == 0) return;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(to, buffer + done, static_cast<std::size_t>(n - done));
      if (w < 0) {
        if (errno == EINTR) continue;
        throw SysError(errno, "write", shown);
      }
      done += w;
    }
  }
}

void clear_nonblock(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK)) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

// Copies the folder `src_fd` into the new folder `name` of `dst_parent` (never following links
// in the source: they are copied as links). `src_shown`/`shown`: the source and the destination
// as people see them. Every file and folder must be the source tree's own (refuse_foreign), as
// for read_file: the first that is not ends the copy with EPERM naming it.
//
// `reading`/`writing`: the identity of each side's system calls (see Acting), switched per call;
// both kOwnIdentity when the caller holds one scope for the whole copy (the two roots act alike).
// A file or folder of another uid is refused before it is opened: named as such even where its
// mode would refuse the open too.
void copy_tree(const Root& from, const Root& root, int src_fd, int dst_parent, const std::string& name, mode_t mode,
               const std::string& src_shown, const std::string& shown, int depth, const Cancelled& cancelled,
               const std::optional<users::Identity>& reading, const std::optional<users::Identity>& writing) {
  if (depth > kMaxCopyDepth) throw SysError(ELOOP, "copy", src_shown + " (more than 128 folders deep)");
  check_cancelled(cancelled, src_shown);
  Broker* reader = from.broker().get();
  Broker* writer = root.broker().get();
  UniqueFd dst;
  {
    Acting as(writing);
    // Made 0700 and given its mode once its content is in (a read-only folder is copied too).
    if (const int err = mkdir_in(writer, dst_parent, name, 0700)) throw SysError(err, "mkdir", shown);
    dst = open_in(writer, dst_parent, name, O_RDONLY | O_DIRECTORY, 0, Resolve::beneath_no_links, shown);
    give_to_owner(root, dst.get(), shown);
  }
  for (const std::string& n : fs::entry_names(src_fd, src_shown)) {
    const std::string child_src = src_shown + "/" + n;
    const std::string child_shown = shown + "/" + n;
    check_cancelled(cancelled, child_src);
    struct stat st;
    if (const int err = [&] {
          Acting as(reading);
          return stat_in(reader, src_fd, n, st);
        }()) {
      if (err == ENOENT) continue;
      throw SysError(err, "stat", child_src);
    }
    if (S_ISDIR(st.st_mode)) {
      refuse_foreign(from, st, child_src, "copy");
      UniqueFd sub;
      try {
        Acting as(reading);
        sub = open_in(reader, src_fd, n, O_RDONLY | O_DIRECTORY, 0, Resolve::beneath_no_links, child_src);
      } catch (const SysError& e) {
        if (e.code() == ENOENT || e.code() == ELOOP || e.code() == ENOTDIR) continue;  // swapped meanwhile
        throw;
      }
      struct stat sst;
      if (::fstat(sub.get(), &sst) < 0) throw SysError(errno, "stat", child_src);
      refuse_foreign(from, sst, child_src, "copy");
      check_confined(from, sub.get(), child_src, "copy");
      copy_tree(from, root, sub.get(), dst.get(), n, sst.st_mode, child_src, child_shown, depth + 1, cancelled, reading,
                writing);
    } else if (S_ISLNK(st.st_mode)) {
      std::string target;
      if (Acting as(reading); readlink_in(reader, src_fd, n, target) != 0) continue;
      Acting as(writing);
      if (const int err = symlink_in(writer, target, dst.get(), n)) throw SysError(err, "symlink", child_shown);
      if (root.chown_new() &&
          ::fchownat(dst.get(), n.c_str(), root.owner_uid(), root.owner_gid(), AT_SYMLINK_NOFOLLOW) < 0)
        throw SysError(errno, "chown", child_shown);
    } else if (S_ISREG(st.st_mode)) {
      refuse_foreign(from, st, child_src, "copy");
      UniqueFd in;
      try {
        Acting as(reading);
        in = open_in(reader, src_fd, n, O_RDONLY, 0, Resolve::beneath_no_links, child_src);
      } catch (const SysError& e) {
        if (e.code() == ENOENT || e.code() == ELOOP) continue;
        throw;
      }
      struct stat ist;
      if (::fstat(in.get(), &ist) < 0 || !S_ISREG(ist.st_mode)) continue;
      refuse_foreign(from, ist, child_src, "copy");
      check_confined(from, in.get(), child_src, "copy");
      clear_nonblock(in.get());
      UniqueFd out;
      {
        Acting as(writing);
        out = open_in(writer, dst.get(), n, O_WRONLY | O_CREAT | O_EXCL, ist.st_mode & 01777, Resolve::beneath_no_links,
                      child_shown);
        clear_nonblock(out.get());
        if (const int err = chmod_in(writer, out.get(), ist.st_mode & 01777)) throw SysError(err, "chmod", child_shown);
        give_to_owner(root, out.get(), child_shown);
      }
      copy_bytes(in.get(), out.get(), child_shown);
    }
    // FIFOs, sockets and devices are not copied.
  }
  Acting as(writing);
  if (const int err = chmod_in(writer, dst.get(), mode & 07777)) throw SysError(err, "chmod", shown);
}

// EACCES (or EPERM) when the regular file `leaf` of `dir` may not be written by this thread's
// identity: a file's content is replaced as `echo > file` in the sandbox replaces it, though the
// new content is put in place by a rename that needs only the folder's permission. A broker's
// namespace root may write every file of the instance's ids, as the sandbox's root may.
// faccessat2 (Linux 5.8) with AT_EACCESS asks with the filesystem identity; glibc's emulation on an
// older kernel asks with the effective uid (root: allowed, as before the regime).
void refuse_unwritable(Broker* broker, int dir, const std::string& leaf, const struct stat& st, const std::string& shown) {
  if (::faccessat(dir, leaf.c_str(), W_OK, AT_EACCESS | AT_SYMLINK_NOFOLLOW) == 0) return;
  const int err = errno;
  if (err == ENOENT || (broker && refused(err))) return;  // gone meanwhile: the write creates it
  throw SysError(err, "write", fmt::format("{} (mode {:04o}, uid {})", shown, st.st_mode & 07777, st.st_uid));
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::optional<users::Identity> acting_identity(const std::optional<Owner>& owner, bool as_root) {
  if (!as_root || !owner || owner->uid == 0 || owner->others > 0) return std::nullopt;
  return users::Identity{owner->uid, owner->gid};
}

Root::Root(UniqueFd dir, std::string shown, std::optional<Owner> owner, bool read_only, bool any_owner,
           std::shared_ptr<Broker> broker)
    : dir_(std::move(dir)),
      shown_(std::move(shown)),
      owner_uid_(owner ? owner->uid : ::geteuid()),
      owner_gid_(owner ? owner->gid : ::getegid()),
      acts_as_(acting_identity(owner)),
      // Acting as the owner, what is made is the owner's already (and in a set-group-id folder of
      // the folder's group, as the sandbox's own would be).
      chown_new_(owner.has_value() && ::geteuid() == 0 && !acts_as_),
      read_only_(read_only),
      any_owner_(any_owner),
      others_from_(owner ? owner->others_from : 0),
      others_(owner ? owner->others : 0),
      broker_(std::move(broker)) {}

Root Root::open(const stdfs::path& dir, std::string shown, std::optional<Owner> owner, bool read_only,
                bool any_owner, std::shared_ptr<Broker> broker) {
  return Root(fs::open_dir_path(dir), std::move(shown), owner, read_only, any_owner, std::move(broker));
}

void Root::confine(std::vector<std::int64_t> file_systems) {
  confinement_ = Confinement{std::move(file_systems), owner_uid_, others_from_, others_};
}

bool Confinement::allows(std::int64_t f_type) const {
  return !kernel_interface(f_type) && std::find(file_systems.begin(), file_systems.end(), f_type) != file_systems.end();
}

const char* kernel_interface(std::int64_t f_type) {
  // linux/magic.h, and the few it lacks on older headers spelled out.
  static constexpr std::pair<std::int64_t, const char*> kInterfaces[] = {
      {PROC_SUPER_MAGIC, "proc"},
      {SYSFS_MAGIC, "sysfs"},
      {DEVPTS_SUPER_MAGIC, "devpts"},
      {SECURITYFS_MAGIC, "securityfs"},
      {DEBUGFS_MAGIC, "debugfs"},
      {TRACEFS_MAGIC, "tracefs"},
      {CGROUP_SUPER_MAGIC, "cgroup"},
      {CGROUP2_SUPER_MAGIC, "cgroup2"},
      {BPF_FS_MAGIC, "bpf"},
      {0x62656570, "configfs"},
      {PSTOREFS_MAGIC, "pstore"},
      {EFIVARFS_MAGIC, "efivarfs"},
      {0x19800202, "mqueue"},
      {BINFMTFS_MAGIC, "binfmt_misc"},
      {0x65735543, "fusectl"},
      {SELINUX_MAGIC, "selinuxfs"},
      {SMACK_MAGIC, "smackfs"},
      {0x5a3c69f0, "apparmorfs"},
      {NSFS_MAGIC, "nsfs"},
      {PIPEFS_MAGIC, "pipefs"},
      {SOCKFS_MAGIC, "sockfs"},
      {ANON_INODE_FS_MAGIC, "anon_inodefs"},
      {USBDEVICE_SUPER_MAGIC, "usbdevfs"},
      {AUTOFS_SUPER_MAGIC, "autofs"},
      {0x67596969, "rpc_pipefs"},
      {0x6e667364, "nfsd"},
      {0x444d4142, "dmabuf"},
      {0x5345434d, "secretmem"},
      {0xabba1974, "xenfs"},
  };
  for (const auto& [magic, name] : kInterfaces)
    if (magic == f_type) return name;
  return nullptr;
}

std::string Location::shown() const { return join_shown(root ? root->shown() : std::string(), rel); }

std::string normalize(std::string_view path) {
  if (path.find('\0') != std::string_view::npos) throw UsageError("the path contains a NUL byte");
  const bool absolute = !path.empty() && path.front() == '/';
  std::vector<std::string> out;
  for (std::string& part : components(path)) {
    if (part == ".") continue;
    if (part == "..") {
      if (!out.empty() && out.back() != "..")
        out.pop_back();
      else if (!absolute)
        out.push_back(part);
      continue;
    }
    out.push_back(std::move(part));
  }
  std::string joined;
  for (const auto& part : out) joined += (joined.empty() ? "" : "/") + part;
  return absolute ? "/" + joined : joined;
}

const char* to_string(EntryType type) {
  switch (type) {
    case EntryType::file: return "file";
    case EntryType::directory: return "directory";
    case EntryType::symlink: return "symlink";
    case EntryType::other: return "other";
  }
  return "other";
}

EntryType entry_type(mode_t mode) {
  if (S_ISREG(mode)) return EntryType::file;
  if (S_ISDIR(mode)) return EntryType::directory;
  if (S_ISLNK(mode)) return EntryType::symlink;
  return EntryType::other;
}

Opened open_read(const Location& at) {
  Acting as(at.root->acts_as());
  if (at.root->confinement()) {
    Opened opened = open_confined(*at.root->confinement(), at.root->broker().get(), at.root->fd(), rel_or_dot(at.rel),
                                  Resolve::in_root_follow, at.shown(), "read", /*folders=*/true);
    clear_nonblock(opened.fd.get());
    return opened;
  }
  Opened opened;
  try {
    opened.fd = open_in(at.root->broker().get(), at.root->fd(), rel_or_dot(at.rel), O_RDONLY | O_NOCTTY, 0,
                        Resolve::in_root_follow, at.shown());
  } catch (const SysError& e) {
    // A file of another uid is refused as such, whatever its mode (as copy() refuses it).
    if (e.code() != EACCES) throw;
    struct stat st {};
    bool known = false;
    try {
      UniqueFd path = open_in(at.root->broker().get(), at.root->fd(), rel_or_dot(at.rel), O_PATH, 0,
                              Resolve::in_root_follow, at.shown());
      known = ::fstat(path.get(), &st) == 0;
    } catch (const SysError&) {
      // a folder on the way is closed too: the open's refusal stands
    }
    if (known && S_ISREG(st.st_mode)) refuse_foreign(*at.root, st, at.shown(), "read");
    throw;
  }
  if (::fstat(opened.fd.get(), &opened.st) < 0) throw SysError(errno, "stat", at.shown());
  if (S_ISREG(opened.st.st_mode)) {
    refuse_foreign(*at.root, opened.st, at.shown(), "read");
  } else if (!S_ISDIR(opened.st.st_mode)) {
    throw SysError(ENXIO, "read", at.shown() + " (not a regular file or a folder)");
  }
  clear_nonblock(opened.fd.get());
  return opened;
}

struct stat stat_at(const Location& at, bool follow) {
  Acting as(at.root->acts_as());
  struct stat st;
  if (follow || at.rel.empty()) {
    UniqueFd fd = open_in(at.root->broker().get(), at.root->fd(), rel_or_dot(at.rel), O_PATH, 0, Resolve::in_root_follow,
                          at.shown());
    if (::fstat(fd.get(), &st) < 0) throw SysError(errno, "stat", at.shown());
    return st;
  }
  std::string leaf;
  UniqueFd parent = open_parent(at, leaf);
  if (const int err = stat_in(at.root->broker().get(), parent.get(), leaf, st)) throw SysError(err, "stat", at.shown());
  return st;
}

std::string read_link(const Location& at) {
  Acting as(at.root->acts_as());
  std::string leaf;
  UniqueFd parent = open_parent(at, leaf);
  std::string target;
  if (const int err = readlink_in(at.root->broker().get(), parent.get(), leaf, target))
    throw SysError(err, "readlink", at.shown());
  return target;
}

std::vector<Entry> list_dir(const Location& at, std::size_t max_entries) {
  Acting as(at.root->acts_as());
  Broker* broker = at.root->broker().get();
  UniqueFd fd;
  if (at.root->confinement())
    fd = open_confined(*at.root->confinement(), broker, at.root->fd(), rel_or_dot(at.rel), Resolve::in_root_follow,
                       at.shown(), "list", /*folders=*/true)
             .fd;
  else
    fd = open_in(broker, at.root->fd(), rel_or_dot(at.rel), O_RDONLY | O_DIRECTORY, 0, Resolve::in_root_follow,
                 at.shown());
  UniqueFd listing(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3));
  if (!listing) throw SysError(errno, "dup", at.shown());
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::fdopendir(listing.get()), &::closedir);
  if (!dir) throw SysError(errno, "opendir", at.shown());
  listing.release();
  std::vector<Entry> entries;
  while (entries.size() < max_entries) {
    const dirent* d = ::readdir(dir.get());
    if (!d) break;
    std::string_view name = d->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (stat_in(broker, fd.get(), d->d_name, st) != 0) continue;  // gone meanwhile
    Entry e;
    e.name = std::string(name);
    e.type = entry_type(st.st_mode);
    e.size = static_cast<std::uint64_t>(st.st_size);
    e.mode = st.st_mode & 07777;
    e.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    e.uid = st.st_uid;
    entries.push_back(std::move(e));
  }
  return entries;
}

// ---------------------------------------------------------------------------------------------

PendingFile::PendingFile(std::optional<users::Identity> acts_as, std::shared_ptr<Broker> broker, UniqueFd dir,
                         UniqueFd fd, std::string temp, std::string leaf, std::string shown, bool no_replace)
    : acts_as_(std::move(acts_as)),
      broker_(std::move(broker)),
      dir_(std::move(dir)),
      fd_(std::move(fd)),
      temp_(std::move(temp)),
      leaf_(std::move(leaf)),
      shown_(std::move(shown)),
      no_replace_(no_replace) {}

PendingFile::~PendingFile() {
  if (committed_) return;
  try {
    Acting as(acts_as_);
    unlink_in(broker_.get(), dir_.get(), temp_);
  } catch (const SysError&) {
    // the broker could not be reached, or the identity not taken: the temporary stays (a dot file
    // named .ns-hpc-…tmp)
  }
}

void PendingFile::write(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd_.get(), data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "write", shown_);
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void PendingFile::write_from(int from) { copy_bytes(from, fd_.get(), shown_); }

std::optional<UniqueFd> PendingFile::open_current() const {
  Acting as(acts_as_);
  try {
    if (confinement_) {
      Opened opened = open_confined(*confinement_, broker_.get(), dir_.get(), leaf_, Resolve::beneath_no_links, shown_,
                                    "read", /*folders=*/false);
      clear_nonblock(opened.fd.get());
      return std::move(opened.fd);
    }
    UniqueFd fd = open_in(broker_.get(), dir_.get(), leaf_, O_RDONLY | O_NOCTTY, 0, Resolve::beneath_no_links, shown_);
    struct stat st;
    if (::fstat(fd.get(), &st) < 0) throw SysError(errno, "stat", shown_);
    if (!S_ISREG(st.st_mode)) throw SysError(ENXIO, "read", shown_ + " (not a regular file)");
    clear_nonblock(fd.get());
    return fd;
  } catch (const SysError& e) {
    if (e.code() == ENOENT) return std::nullopt;
    throw;
  }
}

struct stat PendingFile::commit() {
  if (committed_) throw SysError(EINVAL, "commit", shown_ + " (already committed)");
  Acting as(acts_as_);
  if (::fsync(fd_.get()) < 0) throw SysError(errno, "fsync", shown_);
  const unsigned flags = no_replace_ ? RENAME_NOREPLACE : 0;
  if (const int err = rename_in(broker_.get(), dir_.get(), temp_, dir_.get(), leaf_, flags))
    throw SysError(err, "rename", shown_);
  committed_ = true;
  struct stat st;
  if (::fstat(fd_.get(), &st) < 0) throw SysError(errno, "stat", shown_);
  // The rename itself made durable (best effort: the folder may not be readable).
  try {
    UniqueFd d = open_in(broker_.get(), dir_.get(), ".", O_RDONLY | O_DIRECTORY, 0, Resolve::beneath_no_links, shown_);
    ::fsync(d.get());
  } catch (const SysError&) {
  }
  return st;
}

std::unique_ptr<PendingFile> begin_write(const Location& at, const WriteOptions& options) {
  refuse_read_only(at);
  if (at.rel.empty()) throw SysError(EISDIR, "write", at.shown());
  auto [parent_rel, leaf] = split_leaf(at.rel);
  if (leaf == ".." || leaf == ".") throw SysError(EINVAL, "write", at.shown() + " (ends in '..')");
  Acting as(at.root->acts_as());
  Broker* broker = at.root->broker().get();
  UniqueFd parent;
  if (options.create_parents)
    parent = ensure_dirs(*at.root, parent_rel, 0755);
  else
    parent = open_in(broker, at.root->fd(), rel_or_dot(parent_rel), O_PATH | O_DIRECTORY, 0, Resolve::in_root_follow,
                     join_shown(at.root->shown(), parent_rel));
  check_confined(*at.root, parent.get(), join_shown(at.root->shown(), parent_rel), "write");
  mode_t mode = options.mode.value_or(0644);
  struct stat st;
  bool replaces = false;  // a regular file of the tree's own
  if (const int err = stat_in(broker, parent.get(), leaf, st); err == 0) {
    if (S_ISDIR(st.st_mode)) throw SysError(EISDIR, "write", at.shown() + " (a folder)");
    if (options.no_replace) throw SysError(EEXIST, "create", at.shown());
    if (at.root->confinement() && S_ISREG(st.st_mode)) refuse_foreign(*at.root, st, at.shown(), "write");
    replaces = S_ISREG(st.st_mode) && at.root->owns(st.st_uid);
    if (S_ISREG(st.st_mode)) refuse_unwritable(broker, parent.get(), leaf, st, at.shown());
    if (S_ISREG(st.st_mode) && !options.mode) mode = st.st_mode & 01777;  // no set-id bits
  } else if (err != ENOENT) {
    throw SysError(err, "stat", at.shown());
  }
  const std::string temp = fmt::format(".{}.ns-hpc-{}.tmp", leaf.substr(0, 200), random::hex(6));
  UniqueFd fd = open_in(broker, parent.get(), temp, O_RDWR | O_CREAT | O_EXCL, mode, Resolve::beneath_no_links,
                        at.shown());
  clear_nonblock(fd.get());
  std::unique_ptr<PendingFile> pending(
      new PendingFile(at.root->acts_as(), at.root->broker(), std::move(parent), std::move(fd), temp, leaf, at.shown(),
                      options.no_replace));
  pending->confinement_ = at.root->confinement();
  if (const int err = chmod_in(broker, pending->fd(), mode)) throw SysError(err, "chmod", at.shown());
  give_to_owner(*at.root, pending->fd(), at.shown());
  if (replaces) keep_owner(broker, pending->fd(), st, pending->dir_.get(), leaf);
  return pending;
}

void make_dir(const Location& at, bool parents, mode_t mode) {
  refuse_read_only(at);
  Acting as(at.root->acts_as());
  if (parents) {
    ensure_dirs(*at.root, at.rel, mode);
    return;
  }
  std::string leaf;
  UniqueFd parent = open_parent(at, leaf);
  Broker* broker = at.root->broker().get();
  if (const int err = mkdir_in(broker, parent.get(), leaf, mode)) throw SysError(err, "mkdir", at.shown());
  UniqueFd made = open_in(broker, parent.get(), leaf, O_PATH | O_DIRECTORY, 0, Resolve::beneath_no_links, at.shown());
  give_to_owner(*at.root, made.get(), at.shown());
}

void remove(const Location& at, bool recursive) {
  refuse_read_only(at);
  Acting as(at.root->acts_as());
  std::string leaf;
  UniqueFd parent = open_parent(at, leaf);
  Broker* broker = at.root->broker().get();
  struct stat st;
  if (const int err = stat_in(broker, parent.get(), leaf, st)) throw SysError(err, "delete", at.shown());
  if (!S_ISDIR(st.st_mode)) {
    if (const int err = unlink_in(broker, parent.get(), leaf)) throw SysError(err, "delete", at.shown());
    return;
  }
  if (!recursive) throw SysError(EISDIR, "delete", at.shown() + " (a folder: only with recursive)");
  remove_tree_in(broker, parent.get(), leaf, at.shown());
}

void rename(const Location& from, const Location& to, bool overwrite) {
  refuse_read_only(from);
  refuse_read_only(to);
  // One system call cannot run as two identities: trees of two owners are copied, then removed,
  // each side as its own (the callers do so on EXDEV, as across file systems).
  if (!same_identity(from.root->acts_as(), to.root->acts_as()))
    throw SysError(EXDEV, "move", fmt::format("{} to {} (trees of two owners)", from.shown(), to.shown()));
  Acting as(to.root->acts_as());
  std::string from_leaf, to_leaf;
  UniqueFd from_parent = open_parent(from, from_leaf);
  UniqueFd to_parent = open_parent(to, to_leaf);
  const unsigned flags = overwrite ? 0 : RENAME_NOREPLACE;
  if (const int err = rename_in(from.root->broker().get(), from_parent.get(), from_leaf, to_parent.get(), to_leaf, flags))
    throw SysError(err, "move", fmt::format("{} to {}", from.shown(), to.shown()));
}

void copy(const Location& from, const Location& to, bool overwrite, const Cancelled& cancelled) {
  refuse_read_only(to);
  Opened src = open_read(from);  // as the source's identity
  // What follows is the destination's, as its identity; a folder's entries are read as the
  // source's, switched per call only when the two differ (Acting: scopes of two identities are
  // never nested).
  const bool alike = same_identity(from.root->acts_as(), to.root->acts_as());
  const std::optional<users::Identity>& as_to = to.root->acts_as();
  std::string to_leaf;
  Broker* broker = to.root->broker().get();
  UniqueFd to_parent;
  struct stat existing;
  bool exists = false;
  {
    Acting as(as_to);
    to_parent = open_parent(to, to_leaf);
    exists = stat_in(broker, to_parent.get(), to_leaf, existing) == 0;
  }
  if (exists && !overwrite) throw SysError(EEXIST, "copy", fmt::format("{} to {}", from.shown(), to.shown()));
  if (!src.is_dir()) {
    if (exists && S_ISDIR(existing.st_mode)) {
      Acting as(as_to);
      remove_tree_in(broker, to_parent.get(), to_leaf, to.shown());
    }
    WriteOptions options;
    options.mode = src.st.st_mode & 01777;
    auto pending = begin_write(to, options);
    pending->write_from(src.fd.get());
    pending->commit();
    return;
  }
  if (!from.rel.empty() && (to.rel == from.rel || to.rel.starts_with(from.rel + "/")) && to.root == from.root)
    throw SysError(EINVAL, "copy", fmt::format("{} into itself ({})", from.shown(), to.shown()));
  refuse_foreign(*from.root, src.st, from.shown(), "copy");
  Acting as(alike ? as_to : kOwnIdentity);  // the whole copy, when the two sides act alike
  const auto& reading = alike ? kOwnIdentity : from.root->acts_as();
  const auto& writing = alike ? kOwnIdentity : as_to;
  // A folder is copied whole or not at all: into a temporary next to the destination, put in
  // place with one rename once every file was copied; a refusal, an error or a cancellation
  // removes the temporary and leaves the destination as it was.
  const std::string temp = fmt::format(".{}.ns-hpc-{}.tmp", to_leaf.substr(0, 200), random::hex(6));
  const std::string to_dir = split_leaf(to.rel).first;
  const std::string temp_shown = join_shown(to.root->shown(), to_dir.empty() ? temp : to_dir + "/" + temp);
  auto discard = [&](const std::string& name) {
    try {
      Acting as(writing);
      remove_tree_in(broker, to_parent.get(), name, temp_shown);
    } catch (const SysError&) {
      // left as a dot folder named .<name>.ns-hpc-….tmp; the error that ended the copy is what counts
    }
  };
  try {
    copy_tree(*from.root, *to.root, src.fd.get(), to_parent.get(), temp, src.st.st_mode, from.shown(), to.shown(), 0,
              cancelled, reading, writing);
  } catch (...) {
    discard(temp);
    throw;
  }
  Acting as_destination(writing);
  // Overwrite: exchanged with what is there (then that is removed); else only where nothing is.
  int err = overwrite ? rename_in(broker, to_parent.get(), temp, to_parent.get(), to_leaf, RENAME_EXCHANGE) : ENOENT;
  if (err == 0) {
    discard(temp);  // now the replaced destination
    return;
  }
  if (err == EINVAL) {  // a file system without RENAME_EXCHANGE: what is there goes first
    try {
      remove_tree_in(broker, to_parent.get(), to_leaf, to.shown());
    } catch (...) {
      discard(temp);
      throw;
    }
    err = ENOENT;
  }
  if (err == ENOENT) err = rename_in(broker, to_parent.get(), temp, to_parent.get(), to_leaf, RENAME_NOREPLACE);
  if (err != 0) {
    discard(temp);
    throw SysError(err, "copy", fmt::format("{} to {}", from.shown(), to.shown()));
  }
}

// ---------------------------------------------------------------------------------------------

namespace {

// The path after `mount` ("/workspace") in `path` (normalised, absolute), or nullopt.
std::optional<std::string> under(const std::string& path, const std::string& mount) {
  if (mount.empty() || mount == "/") return std::nullopt;
  if (path == mount) return std::string();
  if (path.size() > mount.size() && path.starts_with(mount) && path[mount.size()] == '/')
    return path.substr(mount.size() + 1);
  return std::nullopt;
}

}  // namespace

InstanceFiles::InstanceFiles(const InstanceView& view)
    : workspace_(fs::open_dir_path(view.workspace), normalize(view.workspace_mount), view.owner, false, false,
                 view.broker),
      output_(fs::open_dir_path(view.output), normalize(view.output_mount), view.owner, false, false, view.broker) {}

Location InstanceFiles::map(std::string_view path) const {
  if (path.empty()) throw UsageError("the path is empty; give a path such as 'notes.txt' or '/workspace/notes.txt'");
  if (path.size() > kMaxPathBytes)
    throw UsageError(fmt::format("the path is {} bytes; the limit is {} bytes (PATH_MAX): give a shorter path",
                                 path.size(), kMaxPathBytes));
  std::string full = normalize(path.front() == '/' ? std::string(path) : workspace_.shown() + "/" + std::string(path));
  if (auto rel = under(full, workspace_.shown())) return Location{&workspace_, *rel};
  if (auto rel = under(full, output_.shown())) return Location{&output_, *rel};
  throw UsageError(fmt::format("'{}' is outside this instance's files: the file tools reach {} (relative paths start "
                               "there) and {}",
                               std::string(path), workspace_.shown(), output_.shown()));
}

Location InstanceFiles::resolve(std::string_view path, Follow follow) const {
  Location at = map(path);
  // Absolute links on the way name sandbox paths (/workspace/x, /output/y): taken through the
  // mount map here, so they lead where they lead in the sandbox. This only decides where to
  // open; the open itself (openat2 in the root) keeps every guarantee whatever the sandbox
  // changes meanwhile. Relative links are left to the kernel; a link out is left as it is (the
  // kernel re-roots it, and finds nothing).
  int links = 0;
  while (std::optional<Location> next = through_absolute_link(at, follow, links)) at = std::move(*next);
  return at;
}

std::optional<Location> InstanceFiles::through_absolute_link(const Location& at, Follow follow, int& links) const {
  // One component at a time from the folder reached so far, so the walk costs a few system
  // calls per component (never the path so far again for each one). nullopt: no absolute link
  // on the way, or the walk cannot go on (a missing component, a file, a refusal, too many
  // links): the open that follows says why. Looked at as the root's identity, as the open is.
  Acting as(at.root->acts_as());
  Broker* broker = at.root->broker().get();
  const std::vector<std::string> parts = components(at.rel);
  const std::size_t checked = follow == Follow::last ? parts.size() : (parts.empty() ? 0 : parts.size() - 1);
  if (checked == 0) return std::nullopt;
  UniqueFd dir;
  try {
    dir = open_in(broker, at.root->fd(), ".", O_PATH | O_DIRECTORY, 0, Resolve::beneath_no_links, at.root->shown());
  } catch (const SysError&) {
    return std::nullopt;
  }
  std::string prefix;
  for (std::size_t i = 0; i < checked; ++i) {
    if (!prefix.empty()) prefix += '/';
    prefix += parts[i];
    std::string target;
    const int err = readlink_in(broker, dir.get(), parts[i], target);
    if (err != 0 && err != EINVAL) return std::nullopt;  // EINVAL: not a link
    if (err == 0 && ++links > kMaxLinks) return std::nullopt;  // the open says ELOOP
    if (err == 0 && !target.empty() && target.front() == '/') {
      for (std::size_t j = i + 1; j < parts.size(); ++j) (target += '/') += parts[j];
      if (target.size() > kMaxPathBytes)
        throw SysError(ENAMETOOLONG, "resolve",
                       fmt::format("{} (through its link {}, the path is {} bytes; the limit is {})", at.shown(),
                                   join_shown(at.root->shown(), prefix), target.size(), kMaxPathBytes));
      try {
        return map(target);
      } catch (const UsageError&) {
        return std::nullopt;
      }
    }
    if (i + 1 == checked) break;
    try {
      // A relative link is followed as the kernel follows it: the path so far opened again from
      // the root (at most kMaxLinks times); a folder is entered directly.
      dir = err == 0 ? open_in(broker, at.root->fd(), prefix, O_PATH | O_DIRECTORY, 0, Resolve::in_root_follow, prefix)
                     : open_in(broker, dir.get(), parts[i], O_PATH | O_DIRECTORY, 0, Resolve::beneath_no_links, prefix);
    } catch (const SysError&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace nshpc::files
