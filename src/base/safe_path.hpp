// The one way the server opens a path that a sandbox can write (a workspace, an output folder,
// later an instance root): resolved beneath a directory descriptor the server owns, never
// following a link out of it, never blocking on what it finds (a FIFO, a device), and checked
// for being what the server expects (a regular file of the sandbox's uid with one link).
//
// Everything under such a folder is hostile: a sandbox can swap any entry for a symlink, a FIFO
// or a hard link at any moment. openat2(2) resolves the whole path in the kernel in one step, so
// there is no window between a check and the use.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.hpp"

namespace nshpc::fs {

enum class Resolve {
  // No component may be a symlink (or a magic link), and ".." may not climb above the folder:
  // for paths the server names itself (job output files).
  beneath_no_links,
  // The folder is the root: absolute symlinks and ".." stay inside it (RESOLVE_IN_ROOT), magic
  // links are refused. For paths as a sandbox sees them (its own links keep working).
  in_root,
  // As in_root, and a symlink at the last component is followed too (inside the folder): for
  // reading a path as the sandbox would (its `cat link` reads the target).
  in_root_follow,
};

// openat2(dir_fd, relative, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode) (no O_NOFOLLOW with
// in_root_follow) with the
// resolution rules above. `relative` must not be absolute or empty. Throws SysError keeping the
// errno (ELOOP or EXDEV: a link or a mount on the way; ENOSYS: the kernel has no openat2) with
// `shown` (the path as a person knows it) in the message.
UniqueFd open_beneath(int dir_fd, std::string_view relative, int flags, mode_t mode = 0,
                      Resolve how = Resolve::beneath_no_links, std::string_view shown = {});

// What a file opened from a sandbox-writable folder must be before the server reads it.
struct Expect {
  std::optional<uid_t> owner;  // nullopt: any owner
  bool single_link = true;     // st_nlink == 1 (a hard link to someone else's file is refused)
};

// Why `st` is not an acceptable regular file, or nullopt when it is.
std::optional<std::string> untrusted_file_problem(const struct stat& st, const Expect& expect);

// Why a file was not read. `code` is the errno of the refusal — ENOENT: it is not there; ELOOP:
// it is a link, or one is on its way; EXDEV: the path leaves its folder; ENXIO: not a regular
// file; EPERM: it failed `expect` (links, owner); else what open or fstat said — and `why` says
// it in a sentence for people.
struct Refusal {
  int code = 0;
  std::string why;
};

// Opens a regular file for reading beneath `dir_fd` (Resolve::beneath_no_links), without blocking
// and checked with `expect`. Returns an invalid descriptor and fills `refusal` (when given) when
// the file was not read.
UniqueFd open_untrusted_file(int dir_fd, std::string_view relative, const Expect& expect,
                             Refusal* refusal = nullptr);

// Creates (O_EXCL) a regular file beneath `dir_fd`, `relative` one or more components deep,
// creating a missing parent folder (one level, mode 0755) first. With `owner` the new entries
// are given to that uid/gid (by descriptor). Opened O_RDWR | O_APPEND. Throws SysError.
UniqueFd create_beneath(int dir_fd, std::string_view relative, mode_t mode,
                        std::optional<std::pair<uid_t, gid_t>> owner, std::string_view shown = {});

// The names of the entries of the folder `dir_fd` ("." and ".." left out), read through a
// duplicate so `dir_fd` stays the caller's. Throws SysError with `shown`.
std::vector<std::string> entry_names(int dir_fd, std::string_view shown);

// Removes the entries of the folder `relative` beneath `dir_fd` whose names start with `prefix`
// and end with `suffix`, all but the last `keep` in name order. Never follows a link (a link is removed as a link);
// a folder of that name is left alone. A missing folder is nothing to do; other failures throw.
void prune_beneath(int dir_fd, std::string_view relative, std::string_view prefix, std::string_view suffix,
                   std::size_t keep);

}  // namespace nshpc::fs
