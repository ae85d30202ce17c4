#include "base/copy_tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>  // FICLONE
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/safe_path.hpp"

namespace nshpc::fs {

namespace {

namespace stdfs = std::filesystem;

bool unsupported(int err) { return err == ENOTSUP || err == EOPNOTSUPP; }

// Extended attributes, read from one entry and written to another: by descriptor for files and
// folders, through /proc/self/fd/<folder>/<name> (the folder held by descriptor, the last
// component never followed) for links and nodes.
struct XattrAccess {
  int fd = -1;          // the entry itself, or -1
  std::string path;     // else this path, never followed at its end
  ssize_t list(char* buf, std::size_t size) const {
    return fd >= 0 ? ::flistxattr(fd, buf, size) : ::llistxattr(path.c_str(), buf, size);
  }
  ssize_t get(const char* name, void* buf, std::size_t size) const {
    return fd >= 0 ? ::fgetxattr(fd, name, buf, size) : ::lgetxattr(path.c_str(), name, buf, size);
  }
  int set(const char* name, const void* value, std::size_t size) const {
    return fd >= 0 ? ::fsetxattr(fd, name, value, size, 0) : ::lsetxattr(path.c_str(), name, value, size, 0);
  }
};

XattrAccess by_fd(int fd) { return {fd, {}}; }
XattrAccess by_name(int dir, const std::string& name) {
  return {-1, fmt::format("/proc/self/fd/{}/{}", dir, name)};
}

// Grows `buf` until the call fits (the attributes may change between the size query and the read).
template <typename Call>
ssize_t sized(std::vector<char>& buf, Call call) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const ssize_t need = call(nullptr, 0);
    if (need <= 0) return need;
    buf.resize(static_cast<std::size_t>(need));
    const ssize_t got = call(buf.data(), buf.size());
    if (got >= 0 || errno != ERANGE) return got;
  }
  errno = ERANGE;
  return -1;
}

void copy_xattrs(const XattrAccess& from, const XattrAccess& to, const std::string& shown) {
  std::vector<char> names;
  const ssize_t listed = sized(names, [&](char* b, std::size_t s) { return from.list(b, s); });
  if (listed < 0) {
    if (unsupported(errno) || errno == ENOENT) return;
    throw SysError(errno, "list extended attributes of", shown);
  }
  std::vector<char> value;
  for (ssize_t at = 0; at < listed;) {
    const char* name = names.data() + at;
    at += static_cast<ssize_t>(std::char_traits<char>::length(name)) + 1;
    const ssize_t got = sized(value, [&](char* b, std::size_t s) { return from.get(name, b, s); });
    if (got < 0) {
      if (errno == ENODATA || unsupported(errno)) continue;  // removed meanwhile
      throw SysError(errno, fmt::format("read extended attribute {} of", name), shown);
    }
    if (to.set(name, value.data(), static_cast<std::size_t>(got)) < 0 && !unsupported(errno))
      throw SysError(errno, fmt::format("set extended attribute {} on", name), shown);
  }
}

void copy_range(int from, int to, off_t start, off_t end, const std::string& shown, std::uint64_t& bytes) {
  off_t in = start, out = start;
  bool in_kernel = true;
  std::vector<char> buffer;
  while (in < end) {
    const std::size_t want = static_cast<std::size_t>(std::min<off_t>(end - in, off_t{1} << 30));
    ssize_t n;
    if (in_kernel) {
      n = ::copy_file_range(from, &in, to, &out, want, 0);
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        in_kernel = false;
        continue;
      }
    } else {
      buffer.resize(1 << 20);
      n = ::pread(from, buffer.data(), std::min(want, buffer.size()), in);
      for (ssize_t done = 0; n > 0 && done < n;) {
        const ssize_t w = ::pwrite(to, buffer.data() + done, static_cast<std::size_t>(n - done), out + done);
        if (w < 0) {
          if (errno == EINTR) continue;
          throw SysError(errno, "write", shown);
        }
        done += w;
      }
      if (n > 0) {
        in += n;
        out += n;
      }
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "copy", shown);
    }
    if (n == 0) return;  // the file shrank while it was read
    bytes += static_cast<std::uint64_t>(n);
  }
}

// The content of `from` into the empty file `to`: a clone where the filesystem shares blocks,
// else its data ranges one by one (holes stay holes).
void copy_content(int from, int to, off_t size, const std::string& shown, std::uint64_t& bytes) {
  if (size == 0) return;
  if (::ioctl(to, FICLONE, from) == 0) {
    bytes += static_cast<std::uint64_t>(size);
    return;
  }
  off_t at = 0;
  while (at < size) {
    const off_t data = ::lseek(from, at, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // nothing but a hole to the end
      if (errno == EINVAL || unsupported(errno)) {  // no hole detection here: all of it
        copy_range(from, to, at, size, shown, bytes);
        break;
      }
      throw SysError(errno, "seek", shown);
    }
    off_t hole = ::lseek(from, data, SEEK_HOLE);
    if (hole < 0) hole = size;
    copy_range(from, to, data, std::min(hole, size), shown, bytes);
    at = hole;
  }
  if (::ftruncate(to, size) < 0) throw SysError(errno, "truncate", shown);
}

class Copier {
 public:
  explicit Copier(std::string shown_root) : shown_root_(std::move(shown_root)) {}

  // The folder `src` (its stat `st`) as the new folder `name` of `dst_parent`; `rel` is its path
  // below the tree's top ("" for the top itself, whose descriptor then becomes the one that hard
  // links are made relative to).
  void folder(int src, const struct stat& st, int dst_parent, const std::string& name, const std::string& rel,
              int depth) {
    const std::string shown = shown_of(rel);
    if (depth > kMaxCopyTreeDepth)
      throw SysError(ELOOP, "copy", fmt::format("{} (more than {} folders deep)", shown, kMaxCopyTreeDepth));
    check_sys(::mkdirat(dst_parent, name.c_str(), 0700), "mkdir", shown);
    ++copied_.entries;
    UniqueFd dst = open_beneath(dst_parent, name, O_RDONLY | O_DIRECTORY, 0, Resolve::beneath_no_links, shown);
    if (rel.empty()) top_dst_ = dst.get();
    for (const std::string& n : entry_names(src, shown)) entry(src, dst.get(), n, rel.empty() ? n : rel + "/" + n, depth);
    finish(by_fd(src), by_fd(dst.get()), dst.get(), nullptr, st, shown);
    if (rel.empty()) top_dst_ = -1;
  }

  TreeCopied result() const { return copied_; }

 private:
  std::string shown_of(const std::string& rel) const { return rel.empty() ? shown_root_ : shown_root_ + "/" + rel; }

  void entry(int src_dir, int dst_dir, const std::string& name, const std::string& rel, int depth) {
    const std::string shown = shown_of(rel);
    struct stat st;
    if (::fstatat(src_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno == ENOENT) return skip();
      throw SysError(errno, "stat", shown);
    }
    switch (st.st_mode & S_IFMT) {
      case S_IFDIR: {
        std::optional<mode_t> widened;
        UniqueFd sub = open_or_skip(src_dir, name, O_RDONLY | O_DIRECTORY, shown, widened);
        if (!sub) return;
        struct stat now;
        if (::fstat(sub.get(), &now) < 0) throw SysError(errno, "stat", shown);
        if (widened) now.st_mode = (now.st_mode & S_IFMT) | *widened;
        folder(sub.get(), now, dst_dir, name, rel, depth + 1);
        if (widened) check_sys(::fchmod(sub.get(), *widened), "chmod", shown);
        return;
      }
      case S_IFREG:
        return file(src_dir, dst_dir, name, rel, shown);
      case S_IFLNK: {
        std::string target(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 255) + 1, '\0');
        const ssize_t n = ::readlinkat(src_dir, name.c_str(), target.data(), target.size());
        if (n < 0) {
          if (errno == ENOENT || errno == EINVAL) return skip();  // gone, or no longer a link
          throw SysError(errno, "read link", shown);
        }
        target.resize(static_cast<std::size_t>(n));
        check_sys(::symlinkat(target.c_str(), dst_dir, name.c_str()), "symlink", shown);
        ++copied_.entries;
        return finish(by_name(src_dir, name), by_name(dst_dir, name), -1, &name, st, shown, dst_dir);
      }
      case S_IFIFO:
      case S_IFCHR: {
        // A FIFO, or the overlay's whiteout (0:0); never any other device.
        if (S_ISCHR(st.st_mode) && st.st_rdev != makedev(0, 0)) return skip();
        check_sys(::mknodat(dst_dir, name.c_str(), (st.st_mode & S_IFMT) | 0600, st.st_rdev), "make node", shown);
        ++copied_.entries;
        return finish(by_name(src_dir, name), by_name(dst_dir, name), -1, &name, st, shown, dst_dir);
      }
      default:
        return skip();  // sockets, block devices
    }
  }

  void file(int src_dir, int dst_dir, const std::string& name, const std::string& rel, const std::string& shown) {
    std::optional<mode_t> widened;
    UniqueFd in = open_or_skip(src_dir, name, O_RDONLY | O_NOCTTY, shown, widened);
    if (!in) return;
    if (widened) check_sys(::fchmod(in.get(), *widened), "chmod", shown);
    struct stat st;
    if (::fstat(in.get(), &st) < 0) throw SysError(errno, "stat", shown);
    if (!S_ISREG(st.st_mode)) return skip();  // swapped for something else meanwhile
    const std::pair<dev_t, ino_t> key{st.st_dev, st.st_ino};
    if (st.st_nlink > 1) {
      if (auto first = links_.find(key); first != links_.end()) {
        check_sys(::linkat(top_dst_, first->second.c_str(), dst_dir, name.c_str(), 0), "link", shown);
        ++copied_.entries;
        return;
      }
    }
    UniqueFd out(::openat(dst_dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) throw SysError(errno, "create", shown);
    ++copied_.entries;
    // The source was opened without blocking (a FIFO swapped in must not hang the copy).
    if (const int flags = ::fcntl(in.get(), F_GETFL); flags >= 0) ::fcntl(in.get(), F_SETFL, flags & ~O_NONBLOCK);
    copy_content(in.get(), out.get(), st.st_size, shown, copied_.bytes);
    finish(by_fd(in.get()), by_fd(out.get()), out.get(), nullptr, st, shown);
    if (st.st_nlink > 1) links_.emplace(key, rel);
  }

  // An entry beneath `dir` opened without following a link; invalid (and counted as skipped) when
  // it vanished or became a link meanwhile. An entry of this process's own uid whose mode keeps
  // even its owner out (a file 000, a folder 000: a normal user's copy has no capability to
  // override it) is opened by making that very inode readable first (through the descriptor,
  // never by name); `widened` then holds its mode, which the caller puts back — a file's at once,
  // a folder's once its entries are copied (looking them up needs it).
  UniqueFd open_or_skip(int dir, const std::string& name, int flags, const std::string& shown,
                        std::optional<mode_t>& widened) {
    try {
      try {
        return open_beneath(dir, name, flags, 0, Resolve::beneath_no_links, shown);
      } catch (const SysError& e) {
        if (e.code() != EACCES || ::geteuid() == 0) throw;
        UniqueFd path = open_beneath(dir, name, O_PATH, 0, Resolve::beneath_no_links, shown);
        struct stat st;
        if (::fstat(path.get(), &st) < 0 || st.st_uid != ::geteuid()) throw;
        const std::string self = fmt::format("/proc/self/fd/{}", path.get());
        const mode_t access = S_ISDIR(st.st_mode) ? S_IRWXU : S_IRUSR;
        check_sys(::chmod(self.c_str(), (st.st_mode & 07777) | access), "chmod", shown);
        widened = st.st_mode & 07777;
        UniqueFd opened(::open(self.c_str(), (flags & ~O_NOFOLLOW) | O_CLOEXEC | O_NONBLOCK));
        if (!opened) {
          const int err = errno;
          ::chmod(self.c_str(), *widened);
          throw SysError(err, "open", shown);
        }
        return opened;
      }
    } catch (const SysError& e) {
      if (e.code() == ENOENT || e.code() == ELOOP || e.code() == ENOTDIR || e.code() == ENXIO) {
        skip();
        return UniqueFd();
      }
      throw;
    }
  }

  // Owner, then mode (a chown clears set-id bits), then extended attributes (a chown drops
  // security.capability), then times (last: making the entries changed them).
  void finish(const XattrAccess& from, const XattrAccess& to, int fd, const std::string* name, const struct stat& st,
              const std::string& shown, int dir = -1) {
    if (fd >= 0) {
      check_sys(::fchown(fd, st.st_uid, st.st_gid), "chown", shown);
      check_sys(::fchmod(fd, st.st_mode & 07777), "chmod", shown);
    } else {
      check_sys(::fchownat(dir, name->c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW), "chown", shown);
      // A link has no mode of its own; a node in this (host-only) copy is changed by name.
      if (!S_ISLNK(st.st_mode)) check_sys(::fchmodat(dir, name->c_str(), st.st_mode & 07777, 0), "chmod", shown);
    }
    copy_xattrs(from, to, shown);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (fd >= 0)
      check_sys(::futimens(fd, times), "set times of", shown);
    else
      check_sys(::utimensat(dir, name->c_str(), times, AT_SYMLINK_NOFOLLOW), "set times of", shown);
  }

  void skip() { ++copied_.skipped; }

  std::string shown_root_;
  TreeCopied copied_;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;  // first copy of a multiply linked file
  int top_dst_ = -1;  // the copy's top folder while it is filled: links_ paths are relative to it
};

}  // namespace

TreeCopied copy_tree_exact(const stdfs::path& from, const stdfs::path& to) {
  UniqueFd src(::open(from.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!src) throw SysError(errno, "open", from.string());
  struct stat st;
  check_sys(::fstat(src.get(), &st), "stat", from.string());
  const stdfs::path parent = to.parent_path().empty() ? stdfs::path(".") : to.parent_path();
  UniqueFd dst_parent(::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dst_parent) throw SysError(errno, "open", parent.string());
  Copier copier(from.string());
  copier.folder(src.get(), st, dst_parent.get(), to.filename().string(), "", 0);
  return copier.result();
}

int copy_tree_main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: ns-hpc %s FROM TO\n", std::string(kCopyTreeCommand).c_str());
    return 2;
  }
  // Two descriptors a level: room for the deepest tree allowed.
  struct rlimit files;
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  try {
    const TreeCopied copied = copy_tree_exact(argv[2], argv[3]);
    std::printf("{\"entries\":%llu,\"bytes\":%llu,\"skipped\":%llu}\n",
                static_cast<unsigned long long>(copied.entries), static_cast<unsigned long long>(copied.bytes),
                static_cast<unsigned long long>(copied.skipped));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace nshpc::fs
