#include "base/fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc {

Pipe make_pipe() {
  int fds[2];
  check_sys(::pipe2(fds, O_CLOEXEC), "pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

namespace fs {

namespace {

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}", rng());
}

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
  const stdfs::path tmp = dir / fmt::format(".{}.tmp-{}", path.filename().string(), random_suffix());
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

// Empties the directory open at `dirfd` (which the caller then removes).
void remove_contents(int dirfd, const stdfs::path& shown) {
  int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 3);
  if (dup < 0) throw SysError(errno, "dup", shown.string());
  DIR* dir = ::fdopendir(dup);
  if (!dir) {
    int err = errno;
    ::close(dup);
    throw SysError(err, "opendir", shown.string());
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(dir, ::closedir);
  while (struct dirent* entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    if (::unlinkat(dirfd, entry->d_name, 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) throw SysError(errno, "unlink", (shown / name).string());
    int child = ::openat(dirfd, entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child < 0 && errno == EACCES) {
      // A folder the sandbox made unreadable (chmod 000): we own it, so open it up first.
      ::fchmodat(dirfd, entry->d_name, 0700, 0);
      child = ::openat(dirfd, entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (child < 0) throw SysError(errno, "open", (shown / name).string());
    UniqueFd child_fd(child);
    ::fchmod(child, 0700);  // best effort: lets us unlink entries of a read-only folder
    remove_contents(child, shown / name);
    if (::unlinkat(dirfd, entry->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT)
      throw SysError(errno, "rmdir", (shown / name).string());
  }
}

}  // namespace

void remove_tree(const stdfs::path& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) < 0) {
    if (errno == ENOENT) return;
    throw SysError(errno, "stat", path.string());
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) < 0 && errno != ENOENT) throw SysError(errno, "unlink", path.string());
    return;
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", path.string());
  ::fchmod(fd.get(), 0700);
  remove_contents(fd.get(), path);
  fd.reset();
  if (::rmdir(path.c_str()) < 0 && errno != ENOENT) throw SysError(errno, "rmdir", path.string());
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
