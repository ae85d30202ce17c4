#include "base/safe_path.hpp"

#include <linux/openat2.h>
#include <sys/syscall.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <cerrno>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::fs {

namespace {

std::string shown_or(std::string_view shown, std::string_view relative) {
  return std::string(shown.empty() ? relative : shown);
}

}  // namespace

UniqueFd open_beneath(int dir_fd, std::string_view relative, int flags, mode_t mode, Resolve how,
                      std::string_view shown) {
  if (relative.empty() || relative.front() == '/')
    throw SysError(EINVAL, "open", fmt::format("{} (not a relative path)", shown_or(shown, relative)));
  if (relative.find('\0') != std::string_view::npos)
    throw SysError(EINVAL, "open", fmt::format("{} (contains a NUL byte)", shown_or(shown, relative)));
  open_how spec{};
  // O_PATH takes no other flags (openat2 refuses them); anything else never blocks on open.
  const int nofollow = how == Resolve::in_root_follow ? 0 : O_NOFOLLOW;
  const int extra = (flags & O_PATH) ? (O_CLOEXEC | nofollow) : (O_CLOEXEC | nofollow | O_NONBLOCK);
  spec.flags = static_cast<std::uint64_t>(flags | extra);
  spec.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
  spec.resolve = how == Resolve::beneath_no_links ? (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
                                                  : (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
  const std::string path(relative);
  long fd;
  do {
    fd = ::syscall(SYS_openat2, dir_fd, path.c_str(), &spec, sizeof spec);
  } while (fd < 0 && (errno == EINTR || errno == EAGAIN));  // EAGAIN: a concurrent rename; retry
  if (fd < 0) throw SysError(errno, "open", shown_or(shown, relative));
  return UniqueFd(static_cast<int>(fd));
}

std::optional<std::string> untrusted_file_problem(const struct stat& st, const Expect& expect) {
  if (!S_ISREG(st.st_mode)) return std::string("it is not a regular file");
  if (expect.single_link && st.st_nlink != 1)
    return fmt::format("it has {} hard links (only a file with one link is read)", st.st_nlink);
  if (expect.owner && st.st_uid != *expect.owner)
    return fmt::format("it belongs to uid {}, not to the sandbox's uid {}", st.st_uid, *expect.owner);
  return std::nullopt;
}

UniqueFd open_untrusted_file(int dir_fd, std::string_view relative, const Expect& expect, Refusal* refusal) {
  auto refuse = [&](int code, std::string why) {
    if (refusal) *refusal = {code, std::move(why)};
    return UniqueFd();
  };
  UniqueFd fd;
  try {
    fd = open_beneath(dir_fd, relative, O_RDONLY | O_NOCTTY);
  } catch (const SysError& e) {
    switch (e.code()) {
      case ENOENT: return refuse(ENOENT, "it does not exist");
      case ELOOP: return refuse(ELOOP, "it is a symbolic link, or a link is on its way (never followed)");
      case EXDEV: return refuse(EXDEV, "the path leaves its folder (never followed)");
      case ENXIO: return refuse(ENXIO, "it is not a regular file");
      default: return refuse(e.code(), e.what());
    }
  }
  struct stat st;
  if (::fstat(fd.get(), &st) < 0) return refuse(errno, fmt::format("fstat: {}", std::strerror(errno)));
  if (auto why = untrusted_file_problem(st, expect)) return refuse(S_ISREG(st.st_mode) ? EPERM : ENXIO, *why);
  return fd;
}

UniqueFd create_beneath(int dir_fd, std::string_view relative, mode_t mode,
                        std::optional<std::pair<uid_t, gid_t>> owner, std::string_view shown) {
  const std::string rel(relative);
  const auto slash = rel.rfind('/');
  UniqueFd parent;
  std::string leaf = rel;
  if (slash != std::string::npos) {
    const std::string dir = rel.substr(0, slash);
    leaf = rel.substr(slash + 1);
    const std::string dir_shown = shown.empty() ? dir : std::string(shown.substr(0, shown.rfind('/')));
    try {
      parent = open_beneath(dir_fd, dir, O_PATH | O_DIRECTORY, 0, Resolve::beneath_no_links, dir_shown);
    } catch (const SysError& e) {
      if (e.code() != ENOENT || dir.find('/') != std::string::npos) throw;
      if (::mkdirat(dir_fd, dir.c_str(), 0755) < 0 && errno != EEXIST) throw SysError(errno, "mkdir", dir_shown);
      parent = open_beneath(dir_fd, dir, O_RDONLY | O_DIRECTORY, 0, Resolve::beneath_no_links, dir_shown);
      if (owner && ::geteuid() == 0 && ::fchown(parent.get(), owner->first, owner->second) < 0)
        throw SysError(errno, "chown", dir_shown);
    }
  }
  const int base = parent ? parent.get() : dir_fd;
  UniqueFd fd;
  for (int attempt = 0;; ++attempt) {
    try {
      fd = open_beneath(base, leaf, O_RDWR | O_APPEND | O_CREAT | O_EXCL, mode, Resolve::beneath_no_links,
                        shown_or(shown, relative));
      break;
    } catch (const SysError& e) {
      // Something already there (put by the sandbox): removed without following it, once.
      if (e.code() != EEXIST || attempt > 0) throw;
      if (::unlinkat(base, leaf.c_str(), 0) < 0 && errno != ENOENT) throw SysError(errno, "unlink", shown_or(shown, relative));
    }
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  if (owner && ::geteuid() == 0 && ::fchown(fd.get(), owner->first, owner->second) < 0)
    throw SysError(errno, "chown", shown_or(shown, relative));
  return fd;
}

std::vector<std::string> entry_names(int dir_fd, std::string_view shown) {
  // fdopendir owns the descriptor it is given: a duplicate, so `dir_fd` stays the caller's.
  UniqueFd listing(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 3));
  if (!listing) throw SysError(errno, "dup", shown);
  std::unique_ptr<DIR, int (*)(DIR*)> stream(::fdopendir(listing.get()), &::closedir);
  if (!stream) throw SysError(errno, "opendir", shown);
  listing.release();
  ::rewinddir(stream.get());  // the duplicate shares the offset of a folder read before
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(stream.get())) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
    errno = 0;
  }
  if (errno != 0) throw SysError(errno, "read folder", shown);
  return names;
}

void prune_beneath(int dir_fd, std::string_view relative, std::string_view prefix, std::string_view suffix,
                   std::size_t keep) {
  UniqueFd folder;
  try {
    folder = open_beneath(dir_fd, relative, O_RDONLY | O_DIRECTORY, 0, Resolve::beneath_no_links, relative);
  } catch (const SysError& e) {
    if (e.code() == ENOENT) return;
    throw;
  }
  std::vector<std::string> names;
  for (std::string& name : entry_names(folder.get(), relative))
    if (name.size() >= prefix.size() + suffix.size() && name.starts_with(prefix) && name.ends_with(suffix))
      names.push_back(std::move(name));
  if (names.size() <= keep) return;
  std::sort(names.begin(), names.end());
  for (std::size_t i = 0; i + keep < names.size(); ++i)
    if (::unlinkat(folder.get(), names[i].c_str(), 0) < 0 && errno != ENOENT && errno != EISDIR && errno != EPERM)
      throw SysError(errno, "unlink", std::string(relative) + "/" + names[i]);
}

}  // namespace nshpc::fs
