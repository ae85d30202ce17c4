// WebDAV file operations beneath a served folder (see tree.hpp).
#include "dav/tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/fsuid.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/random.hpp"
#include "base/safe_path.hpp"

namespace nshpc::dav {

std::string join(const RelPath& path) {
  std::string out;
  for (const std::string& segment : path) {
    if (!out.empty()) out += '/';
    out += segment;
  }
  return out;
}

FsIdentity::FsIdentity(const std::optional<users::Identity>& who) {
  if (!who) return;
  old_gid_ = static_cast<gid_t>(::setfsgid(who->gid));
  old_uid_ = static_cast<uid_t>(::setfsuid(who->uid));
  active_ = true;
}

FsIdentity::~FsIdentity() {
  if (!active_) return;
  ::setfsuid(old_uid_);  // back to 0 restores the filesystem capabilities
  ::setfsgid(old_gid_);
}

void fail_with_errno(int err, const std::string& what, const std::string& shown) {
  switch (err) {
    case ENOENT: throw DavError(404, fmt::format("{} does not exist", shown));
    case ELOOP:
      throw DavError(403, fmt::format("{} is a symbolic link or has one on its way; WebDAV never follows links", shown));
    case EXDEV: throw DavError(403, fmt::format("{} leads outside its folder; refused", shown));
    case EACCES:
    case EPERM: throw DavError(403, fmt::format("{}: permission denied ({})", shown, what));
    case ENOTDIR: throw DavError(409, fmt::format("{}: a parent is not a folder", shown));
    case EISDIR: throw DavError(409, fmt::format("{} is a folder", shown));
    case EEXIST: throw DavError(405, fmt::format("{} already exists", shown));
    case ENOTEMPTY: throw DavError(409, fmt::format("{} is a folder that is not empty", shown));
    case ENOSPC:
    case EDQUOT: throw DavError(507, fmt::format("{}: no space left on the server's disk", shown));
    case ENAMETOOLONG: throw DavError(414, fmt::format("{}: a name is too long", shown));
    case EROFS: throw DavError(403, fmt::format("{}: the filesystem is read-only", shown));
    case ENXIO: throw DavError(403, fmt::format("{} is not a regular file or folder", shown));
    default: throw DavError(500, fmt::format("{}: {} failed: {}", shown, what, std::strerror(err)));
  }
}

namespace {

std::string shown_of(const Tree& tree, const RelPath& path) { return tree.shown + join(path); }

// The parent folder of `path` (the tree's folder for a top-level entry), as an O_PATH descriptor.
UniqueFd open_parent(const Tree& tree, const RelPath& path) {
  if (path.size() <= 1) {
    UniqueFd fd(::fcntl(tree.dir.get(), F_DUPFD_CLOEXEC, 0));
    if (!fd) fail_with_errno(errno, "dup", tree.shown);
    return fd;
  }
  const RelPath parent(path.begin(), path.end() - 1);
  try {
    return fs::open_beneath(tree.dir.get(), join(parent), O_PATH | O_DIRECTORY);
  } catch (const SysError& e) {
    if (e.code() == ENOENT || e.code() == ENOTDIR)
      throw DavError(409, fmt::format("{}: the parent folder {} does not exist", shown_of(tree, path), shown_of(tree, parent)));
    fail_with_errno(e.code(), "open", shown_of(tree, parent));
  }
}

// A folder opened for reading its entries (the tree's own folder for an empty path).
UniqueFd open_dir(const Tree& tree, const RelPath& path) {
  try {
    return fs::open_beneath(tree.dir.get(), path.empty() ? std::string(".") : join(path), O_RDONLY | O_DIRECTORY);
  } catch (const SysError& e) {
    fail_with_errno(e.code(), "open", shown_of(tree, path));
  }
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

// Removes the entry `name` of folder `parent`, a folder with everything in it.
void remove_at(int parent, const std::string& name, const std::string& shown) {
  struct stat st;
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) fail_with_errno(errno, "stat", shown);
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent, name.c_str(), 0) < 0 && errno != ENOENT) fail_with_errno(errno, "unlink", shown);
    return;
  }
  const int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) fail_with_errno(errno, "open", shown);
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd));
  if (!dir) {
    ::close(fd);
    fail_with_errno(errno, "opendir", shown);
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir.get())) {
    const std::string child = e->d_name;
    if (child != "." && child != "..") names.push_back(child);
  }
  for (const std::string& child : names) remove_at(::dirfd(dir.get()), child, shown + "/" + child);
  if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) fail_with_errno(errno, "rmdir", shown);
}

void copy_file_at(int from_dir, const std::string& from_name, int to_dir, const std::string& to_name,
                  const std::string& shown) {
  const int in_fd = ::openat(from_dir, from_name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (in_fd < 0) fail_with_errno(errno, "open", shown);
  UniqueFd in(in_fd);
  struct stat st;
  if (::fstat(in.get(), &st) < 0) fail_with_errno(errno, "stat", shown);
  if (!S_ISREG(st.st_mode)) fail_with_errno(ENXIO, "copy", shown);
  UniqueFd out(::openat(to_dir, to_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, st.st_mode & 07777));
  if (!out) fail_with_errno(errno, "create", shown);
  for (;;) {
    const ssize_t n = ::copy_file_range(in.get(), nullptr, out.get(), nullptr, 1 << 30, 0);
    if (n == 0) break;
    if (n > 0) continue;
    if (errno == EINTR) continue;
    if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) fail_with_errno(errno, "copy", shown);
    char buf[64 * 1024];  // copy_file_range refused: plain reads and writes
    for (;;) {
      const ssize_t r = ::read(in.get(), buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail_with_errno(errno, "read", shown);
      if (r == 0) break;
      for (ssize_t done = 0; done < r;) {
        const ssize_t w = ::write(out.get(), buf + done, static_cast<std::size_t>(r - done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) fail_with_errno(errno, "write", shown);
        done += w;
      }
    }
    break;
  }
}

void copy_at(int from_dir, const std::string& from_name, int to_dir, const std::string& to_name, bool recursive,
             const std::string& shown) {
  struct stat st;
  if (::fstatat(from_dir, from_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) fail_with_errno(errno, "stat", shown);
  if (S_ISLNK(st.st_mode)) return;  // links are not copied (never followed)
  if (!S_ISDIR(st.st_mode)) {
    copy_file_at(from_dir, from_name, to_dir, to_name, shown);
    return;
  }
  if (::mkdirat(to_dir, to_name.c_str(), st.st_mode & 07777) < 0) fail_with_errno(errno, "mkdir", shown);
  if (!recursive) return;
  UniqueFd src(::openat(from_dir, from_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!src) fail_with_errno(errno, "open", shown);
  UniqueFd dst(::openat(to_dir, to_name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dst) fail_with_errno(errno, "open", shown);
  const int listing = ::dup(src.get());
  if (listing < 0) fail_with_errno(errno, "dup", shown);
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(listing));
  if (!dir) {
    ::close(listing);
    fail_with_errno(errno, "opendir", shown);
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir.get())) {
    const std::string child = e->d_name;
    if (child != "." && child != "..") names.push_back(child);
  }
  for (const std::string& child : names) copy_at(src.get(), child, dst.get(), child, true, shown + "/" + child);
}

}  // namespace

std::optional<struct stat> stat_path(const Tree& tree, const RelPath& path, bool parent_must_exist) {
  FsIdentity as(tree.owner);
  struct stat st;
  if (path.empty()) {
    if (::fstat(tree.dir.get(), &st) < 0) fail_with_errno(errno, "stat", tree.shown);
    return st;
  }
  UniqueFd parent;
  try {
    parent = open_parent(tree, path);
  } catch (const DavError& e) {
    if (e.status() == 409 && !parent_must_exist) return std::nullopt;
    throw;
  }
  if (::fstatat(parent.get(), path.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return std::nullopt;
    fail_with_errno(errno, "stat", shown_of(tree, path));
  }
  if (S_ISLNK(st.st_mode)) fail_with_errno(ELOOP, "stat", shown_of(tree, path));
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) fail_with_errno(ENXIO, "stat", shown_of(tree, path));
  return st;
}

UniqueFd open_file(const Tree& tree, const RelPath& path, struct stat& st) {
  FsIdentity as(tree.owner);
  if (path.empty()) throw DavError(405, fmt::format("{} is a folder", tree.shown));
  UniqueFd fd;
  try {
    fd = fs::open_beneath(tree.dir.get(), join(path), O_RDONLY | O_NOCTTY);
  } catch (const SysError& e) {
    fail_with_errno(e.code(), "open", shown_of(tree, path));
  }
  if (::fstat(fd.get(), &st) < 0) fail_with_errno(errno, "stat", shown_of(tree, path));
  if (!S_ISREG(st.st_mode)) fail_with_errno(ENXIO, "open", shown_of(tree, path));
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::vector<DirEntry> list_dir(const Tree& tree, const RelPath& path, std::size_t limit, bool& truncated) {
  FsIdentity as(tree.owner);
  truncated = false;
  UniqueFd fd = open_dir(tree, path);
  const int listing = ::dup(fd.get());
  if (listing < 0) fail_with_errno(errno, "dup", shown_of(tree, path));
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(listing));
  if (!dir) {
    ::close(listing);
    fail_with_errno(errno, "opendir", shown_of(tree, path));
  }
  std::vector<DirEntry> out;
  while (dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (e->d_type == DT_LNK) continue;
    DirEntry entry{name, {}};
    if (::fstatat(fd.get(), name.c_str(), &entry.st, AT_SYMLINK_NOFOLLOW) < 0) continue;  // gone meanwhile
    if (!S_ISREG(entry.st.st_mode) && !S_ISDIR(entry.st.st_mode)) continue;
    if (out.size() >= limit) {
      truncated = true;
      break;
    }
    out.push_back(std::move(entry));
  }
  std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return out;
}

bool write_file(const Tree& tree, const RelPath& path, const std::function<std::size_t(char*, std::size_t)>& source) {
  FsIdentity as(tree.owner);
  const std::string shown = shown_of(tree, path);
  if (path.empty()) throw DavError(405, fmt::format("{} is a folder", tree.shown));
  UniqueFd parent = open_parent(tree, path);
  struct stat old;
  bool created = true;
  mode_t mode = 0644;
  if (::fstatat(parent.get(), path.back().c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISDIR(old.st_mode)) throw DavError(405, fmt::format("{} is a folder; PUT writes files", shown));
    created = false;
    if (S_ISREG(old.st_mode)) mode = old.st_mode & 07777;
  }
  const std::string temp = fmt::format(".{}.davput-{}", path.back().substr(0, 100), random::hex(6));
  UniqueFd out(::openat(parent.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!out) fail_with_errno(errno, "create", shown);
  if (!created) ::fchmod(out.get(), mode);  // the umask may have taken bits the old file had
  struct Cleanup {
    int dir;
    const std::string& name;
    bool armed = true;
    ~Cleanup() {
      if (armed) ::unlinkat(dir, name.c_str(), 0);
    }
  } cleanup{parent.get(), temp};
  std::vector<char> buf(256 * 1024);
  for (;;) {
    const std::size_t n = source(buf.data(), buf.size());
    if (n == 0) break;
    for (std::size_t done = 0; done < n;) {
      const ssize_t w = ::write(out.get(), buf.data() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail_with_errno(errno, "write", shown);
      done += static_cast<std::size_t>(w);
    }
  }
  if (::renameat(parent.get(), temp.c_str(), parent.get(), path.back().c_str()) < 0) fail_with_errno(errno, "rename", shown);
  cleanup.armed = false;
  return created;
}

bool create_empty(const Tree& tree, const RelPath& path) {
  FsIdentity as(tree.owner);
  if (path.empty()) return false;
  UniqueFd parent = open_parent(tree, path);
  UniqueFd fd(::openat(parent.get(), path.back().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) {
    if (errno == EEXIST) return false;
    fail_with_errno(errno, "create", shown_of(tree, path));
  }
  return true;
}

void make_dir(const Tree& tree, const RelPath& path) {
  FsIdentity as(tree.owner);
  if (path.empty()) throw DavError(405, fmt::format("{} already exists", tree.shown));
  UniqueFd parent = open_parent(tree, path);
  if (::mkdirat(parent.get(), path.back().c_str(), 0755) < 0) fail_with_errno(errno, "mkdir", shown_of(tree, path));
}

void remove_path(const Tree& tree, const RelPath& path) {
  FsIdentity as(tree.owner);
  if (path.empty()) throw DavError(403, fmt::format("{} is a mount point and cannot be deleted", tree.shown));
  UniqueFd parent = open_parent(tree, path);
  remove_at(parent.get(), path.back(), shown_of(tree, path));
}

void copy_path(const Tree& from_tree, const RelPath& from, const Tree& to_tree, const RelPath& to, bool recursive) {
  FsIdentity as(to_tree.owner);
  if (to.empty()) throw DavError(403, fmt::format("{} is a mount point", to_tree.shown));
  UniqueFd to_parent = open_parent(to_tree, to);
  if (from.empty()) {
    // The folder itself: its entries into a new folder.
    struct stat st;
    if (::fstat(from_tree.dir.get(), &st) < 0) fail_with_errno(errno, "stat", from_tree.shown);
    UniqueFd src = open_dir(from_tree, from);
    if (::mkdirat(to_parent.get(), to.back().c_str(), 0755) < 0) fail_with_errno(errno, "mkdir", shown_of(to_tree, to));
    if (!recursive) return;
    bool truncated = false;
    for (const DirEntry& e : list_dir(from_tree, from, SIZE_MAX, truncated)) {
      UniqueFd dst(::openat(to_parent.get(), to.back().c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!dst) fail_with_errno(errno, "open", shown_of(to_tree, to));
      copy_at(src.get(), e.name, dst.get(), e.name, true, shown_of(to_tree, to) + "/" + e.name);
    }
    return;
  }
  UniqueFd from_parent = open_parent(from_tree, from);
  copy_at(from_parent.get(), from.back(), to_parent.get(), to.back(), recursive, shown_of(to_tree, to));
}

void move_path(const Tree& from_tree, const RelPath& from, const Tree& to_tree, const RelPath& to) {
  if (from.empty() || to.empty()) throw DavError(403, "a mount point cannot be moved or replaced");
  {
    FsIdentity as(to_tree.owner);
    UniqueFd from_parent = open_parent(from_tree, from);
    UniqueFd to_parent = open_parent(to_tree, to);
    if (::renameat(from_parent.get(), from.back().c_str(), to_parent.get(), to.back().c_str()) == 0) return;
    if (errno != EXDEV) fail_with_errno(errno, "rename", shown_of(from_tree, from));
  }
  copy_path(from_tree, from, to_tree, to, true);
  remove_path(from_tree, from);
}

}  // namespace nshpc::dav
