#include "base/fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/random.hpp"

namespace nshpc {

Pipe make_pipe() {
  int fds[2];
  check_sys(::pipe2(fds, O_CLOEXEC), "pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

namespace fs {

namespace {

void write_all(int fd, std::string_view data, const stdfs::path& what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "write", what.string());
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

void sync_dir(const stdfs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", dir.string());
  if (::fsync(fd.get()) < 0 && errno != EINVAL) throw SysError(errno, "fsync", dir.string());
}

void atomic_write(const stdfs::path& path, std::string_view data, mode_t mode) {
  const stdfs::path dir = path.parent_path().empty() ? stdfs::path(".") : path.parent_path();
  const stdfs::path tmp = dir / fmt::format(".{}.tmp-{}", path.filename().string(), random::hex(8));
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd) throw SysError(errno, "create", tmp.string());
  try {
    write_all(fd.get(), data, tmp);
    if (::fchmod(fd.get(), mode) < 0) throw SysError(errno, "chmod", tmp.string());
    if (::fsync(fd.get()) < 0) throw SysError(errno, "fsync", tmp.string());
    fd.reset();
    if (::rename(tmp.c_str(), path.c_str()) < 0) throw SysError(errno, "rename", path.string());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  sync_dir(dir);
}

std::optional<std::string> read_file(const stdfs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw SysError(errno, "open", path.string());
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "read", path.string());
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

FileLock::FileLock(const stdfs::path& lock_file) {
  fd_.reset(::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd_) throw SysError(errno, "open lock file", lock_file.string());
  while (::flock(fd_.get(), LOCK_EX) < 0) {
    if (errno != EINTR) throw SysError(errno, "flock", lock_file.string());
  }
}

namespace {

// Descriptors a tree walk holds at most, however deep the tree (a sandbox can make a chain of
// thousands of folders; one descriptor per level would run out at the fd limit).
constexpr std::size_t kMaxOpenLevels = 16;

struct Level {
  std::string name;  // in its parent (empty for the root)
  dev_t dev = 0;
  ino_t ino = 0;
  UniqueFd fd;                        // closed for levels far above the current one
  std::vector<std::string> subdirs;   // still to visit
};

// Opens the folder `name` of `parent` for reading, never following a link; nullopt when the entry
// is gone or is no longer a folder (a sandbox swapped a link or a file in since it was listed).
// `make_accessible`: a folder whose mode keeps this process out (chmod 000 by a sandbox) is made
// 0700 first. The mode is changed on the very inode that was opened (O_PATH | O_NOFOLLOW, then
// chmod through /proc/self/fd/N), never by name: a link swapped in between cannot redirect it.
std::optional<UniqueFd> open_subdir(int parent, const std::string& name, bool make_accessible,
                                    const stdfs::path& shown) {
  UniqueFd entry(::openat(parent, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!entry) {
    if (errno == ENOENT) return std::nullopt;
    throw SysError(errno, "open", shown.string());
  }
  struct stat st;
  if (::fstat(entry.get(), &st) < 0) throw SysError(errno, "stat", shown.string());
  if (!S_ISDIR(st.st_mode)) return std::nullopt;
  // Re-opened through the O_PATH descriptor: the same inode, now with a permission check.
  UniqueFd fd(::openat(entry.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd && errno == EACCES && make_accessible) {
    // A folder the sandbox made unreadable (chmod 000): we own it, so open it up first.
    const std::string self = fmt::format("/proc/self/fd/{}", entry.get());
    if (::chmod(self.c_str(), 0700) < 0) throw SysError(errno, "chmod", shown.string());
    fd.reset(::openat(entry.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  if (!fd) throw SysError(errno, "open", shown.string());
  return fd;
}

// Depth-first walk of the tree at `root` without following any link, holding at most
// kMaxOpenLevels descriptors: a level whose descriptor was closed is re-opened from its child
// through ".." and checked to be the same folder (device and inode) before it is used.
//   on_entry(dirfd, name, st): every entry that is not a folder, with its lstat
//   on_leave(parent_fd, name): after a folder's contents were visited (not for the root)
// `make_accessible`: chmod folders 0700 first (for removal of a tree this process owns); without
// it, folders this process may not open are left out.
void walk_tree(int root_fd, const stdfs::path& root,
               const std::function<void(int, const char*, const struct stat&)>& on_entry,
               const std::function<void(int, const std::string&)>& on_leave, bool make_accessible,
               std::uint64_t* skipped = nullptr) {
  std::vector<Level> stack;
  stdfs::path shown = root;
  auto enter = [&](UniqueFd fd, std::string name) {
    struct stat st;
    if (::fstat(fd.get(), &st) < 0) throw SysError(errno, "stat", shown.string());
    if (make_accessible) ::fchmod(fd.get(), 0700);  // lets us unlink entries of a read-only folder
    Level level{std::move(name), st.st_dev, st.st_ino, std::move(fd), {}};
    int dup = ::fcntl(level.fd.get(), F_DUPFD_CLOEXEC, 3);
    if (dup < 0) throw SysError(errno, "dup", shown.string());
    DIR* dir = ::fdopendir(dup);
    if (!dir) {
      int err = errno;
      ::close(dup);
      throw SysError(err, "opendir", shown.string());
    }
    std::unique_ptr<DIR, int (*)(DIR*)> guard(dir, ::closedir);
    while (struct dirent* entry = ::readdir(dir)) {
      std::string_view entry_name = entry->d_name;
      if (entry_name == "." || entry_name == "..") continue;
      struct stat est;
      if (::fstatat(level.fd.get(), entry->d_name, &est, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT) continue;
        throw SysError(errno, "stat", (shown / entry_name).string());
      }
      if (S_ISDIR(est.st_mode))
        level.subdirs.emplace_back(entry_name);
      else
        on_entry(level.fd.get(), entry->d_name, est);
    }
    stack.push_back(std::move(level));
    if (stack.size() > kMaxOpenLevels) stack[stack.size() - kMaxOpenLevels - 1].fd.reset();
  };
  UniqueFd first(::fcntl(root_fd, F_DUPFD_CLOEXEC, 3));
  if (!first) throw SysError(errno, "dup", root.string());
  enter(std::move(first), "");
  while (!stack.empty()) {
    Level& top = stack.back();
    if (!top.subdirs.empty()) {
      std::string name = std::move(top.subdirs.back());
      top.subdirs.pop_back();
      std::optional<UniqueFd> child;
      try {
        child = open_subdir(top.fd.get(), name, make_accessible, shown / name);
        if (!child) {
          // Gone meanwhile, or no longer a folder: a link or a file swapped in since the
          // listing is an entry like the others (removed as itself, never followed).
          struct stat est;
          if (::fstatat(top.fd.get(), name.c_str(), &est, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(est.st_mode))
            on_entry(top.fd.get(), name.c_str(), est);
          continue;
        }
      } catch (const SysError& e) {
        // A count (not a removal) leaves out what this process may not read: in a normal user's
        // image instance, folders of its subordinate uids and the overlay's work folder.
        if (e.code() == EACCES && !make_accessible) {
          if (skipped) ++*skipped;
          continue;
        }
        throw;
      }
      shown /= name;
      enter(std::move(*child), std::move(name));
      continue;
    }
    if (stack.size() == 1) return;
    Level done = std::move(stack.back());
    stack.pop_back();
    shown = shown.parent_path();
    Level& parent = stack.back();
    if (!parent.fd) {
      UniqueFd up(::openat(done.fd.get(), "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      struct stat st;
      if (!up || ::fstat(up.get(), &st) < 0) throw SysError(errno, "open", (shown / "..").string());
      if (st.st_dev != parent.dev || st.st_ino != parent.ino)
        throw SysError(ESTALE, "walk", fmt::format("{} (the folder was moved while it was walked)", shown.string()));
      parent.fd = std::move(up);
    }
    done.fd.reset();
    on_leave(parent.fd.get(), done.name);
  }
}

}  // namespace

void remove_tree_at(int parent_fd, const std::string& name, const stdfs::path& shown) {
  struct stat st;
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return;
    throw SysError(errno, "stat", shown.string());
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent_fd, name.c_str(), 0) < 0 && errno != ENOENT) throw SysError(errno, "unlink", shown.string());
    return;
  }
  std::optional<UniqueFd> fd = open_subdir(parent_fd, name, /*make_accessible=*/true, shown);
  if (!fd) {  // swapped for a link or a file since the stat: removed as itself
    if (::unlinkat(parent_fd, name.c_str(), 0) < 0 && errno != ENOENT) throw SysError(errno, "unlink", shown.string());
    return;
  }
  walk_tree(
      fd->get(), shown,
      [&](int dirfd, const char* entry, const struct stat&) {
        if (::unlinkat(dirfd, entry, 0) < 0 && errno != ENOENT) throw SysError(errno, "unlink", (shown / entry).string());
      },
      [&](int parent, const std::string& entry) {
        if (::unlinkat(parent, entry.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT)
          throw SysError(errno, "rmdir", (shown / entry).string());
      },
      /*make_accessible=*/true);
  fd.reset();
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT)
    throw SysError(errno, "rmdir", shown.string());
}

void remove_tree(const stdfs::path& path) { remove_tree_at(AT_FDCWD, path.string(), path); }

TreeUsage tree_usage(const stdfs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return {};
    throw SysError(errno, "open", path.string());
  }
  return tree_usage_at(fd.get(), path);
}

TreeUsage tree_usage_at(int dir_fd, const stdfs::path& shown) {
  TreeUsage usage;
  std::set<std::pair<dev_t, ino_t>> linked;  // files with several links count once
  walk_tree(
      dir_fd, shown,
      [&](int, const char*, const struct stat& st) {
        ++usage.files;
        if (st.st_nlink > 1 && !linked.emplace(st.st_dev, st.st_ino).second) return;
        usage.bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
      },
      [&](int, const std::string&) {
        ++usage.folders;
        usage.bytes += 4096;
      },
      /*make_accessible=*/false, &usage.skipped);
  return usage;
}

std::vector<std::string> folder_names(const stdfs::path& dir) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) {
    if (errno == ENOENT) return names;
    throw SysError(errno, "list", dir.string());
  }
  while (const struct dirent* e = ::readdir(d.get())) {
    const std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
    names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void make_dirs(const stdfs::path& path, mode_t mode) {
  stdfs::path current;
  for (const auto& part : path) {
    current /= part;
    if (::mkdir(current.c_str(), mode) < 0 && errno != EEXIST)
      throw SysError(errno, "mkdir", current.string());
  }
  struct stat st;
  if (::stat(path.c_str(), &st) < 0) throw SysError(errno, "stat", path.string());
  if (!S_ISDIR(st.st_mode)) throw SysError(ENOTDIR, "mkdir", path.string());
}

UniqueFd open_dir_path(const stdfs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", path.string());
  return fd;
}

bool removed(int fd) {
  struct stat st;
  if (::fstat(fd, &st) < 0) return errno == ESTALE;
  return st.st_nlink == 0;
}

std::string self_program(std::string_view why) {
  std::error_code ec;
  std::string path = stdfs::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw SysError(ec.value(), "readlink", fmt::format("/proc/self/exe (the path of ns-hpc, {})", why));
  constexpr std::string_view deleted = " (deleted)";
  if (path.size() > deleted.size() && path.ends_with(deleted)) path.resize(path.size() - deleted.size());
  return path;
}

std::optional<std::string> find_program(const std::string& name) {
  if (name.find('/') != std::string::npos)
    return ::access(name.c_str(), X_OK) == 0 ? std::optional<std::string>(name) : std::nullopt;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!dirs.empty()) {
    auto colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    dirs = colon == std::string_view::npos ? std::string_view{} : dirs.substr(colon + 1);
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::string expand_user_vars(std::string_view text,
                             const std::function<std::optional<std::string>(std::string_view)>& env) {
  std::string out;
  size_t i = 0;
  if (!text.empty() && text[0] == '~' && (text.size() == 1 || text[1] == '/')) {
    out = env("HOME").value_or("");
    i = 1;
  }
  while (i < text.size()) {
    char c = text[i];
    if (c != '$' || i + 1 >= text.size()) {
      out += c;
      ++i;
      continue;
    }
    size_t start, end, next;
    if (text[i + 1] == '{') {
      start = i + 2;
      end = text.find('}', start);
      if (end == std::string_view::npos) {
        out += text.substr(i);
        break;
      }
      next = end + 1;
    } else {
      start = i + 1;
      end = start;
      while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
        ++end;
      next = end;
    }
    if (end == start) {
      out += c;
      ++i;
      continue;
    }
    out += env(text.substr(start, end - start)).value_or("");
    i = next;
  }
  return out;
}

}  // namespace fs
}  // namespace nshpc
