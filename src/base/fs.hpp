// File-system helpers with careful resource handling: atomic writes, locks, safe removal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/fd.hpp"

namespace nshpc::fs {

namespace stdfs = std::filesystem;

// Writes `data` to `path` atomically: a temporary file in the same folder, fsync, rename, fsync
// of the folder. Readers see the old or the new content, never a mix; a crash leaves no partial
// file behind (a stray temporary at worst, named ".<name>.tmp-*").
void atomic_write(const stdfs::path& path, std::string_view data, mode_t mode = 0644);

// Reads a whole file; nullopt when it does not exist; throws SysError on other failures.
std::optional<std::string> read_file(const stdfs::path& path);

// fsync of a directory, so a rename or create inside it is durable.
void sync_dir(const stdfs::path& dir);

// An exclusive flock(2) on a lock file, held for the object's lifetime. Works between processes;
// released by the kernel if the holder dies.
class FileLock {
 public:
  // Blocks until the lock is acquired. Creates the lock file (0600) when missing.
  explicit FileLock(const stdfs::path& lock_file);
  FileLock(FileLock&&) noexcept = default;
  FileLock& operator=(FileLock&&) noexcept = default;

 private:
  UniqueFd fd_;
};

// Removes a tree without ever following a symbolic link (openat/unlinkat with O_NOFOLLOW), so a
// link planted inside (by a sandbox) cannot redirect the removal. Missing path = no-op.
// However deep the tree, it holds a bounded number of descriptors.
void remove_tree(const stdfs::path& path);
// The same for the entry `name` (one component) of the folder `parent_fd`; `shown` names it in
// errors. Missing = no-op.
void remove_tree_at(int parent_fd, const std::string& name, const stdfs::path& shown);

// Disk use of a tree (allocated blocks, a file with several links once), counted without
// following links and with a bounded number of descriptors; folders this process may not open
// count as folders, their contents not at all.
struct TreeUsage {
  std::uint64_t bytes = 0;
  std::uint64_t files = 0;
  std::uint64_t folders = 0;
  std::uint64_t skipped = 0;  // folders this process may not open, left out
};
TreeUsage tree_usage(const stdfs::path& path);
// Of the folder open on `dir_fd` (O_RDONLY | O_DIRECTORY); `shown` names it in errors.
TreeUsage tree_usage_at(int dir_fd, const stdfs::path& shown);

// The names of the folders in `dir` (entries the file system types as folders, or does not type),
// sorted, without "." and ".."; none when `dir` does not exist. Throws SysError.
std::vector<std::string> folder_names(const stdfs::path& dir);

// mkdir -p with a mode for the created folders.
void make_dirs(const stdfs::path& path, mode_t mode = 0755);

// Opens a directory as an O_PATH descriptor without following a final symlink.
UniqueFd open_dir_path(const stdfs::path& path);

// Whether the file or folder open on `fd` has been removed: no name leads to it any more
// (st_nlink 0), or its handle went stale (a network file system). How every process ns-hpc leaves
// running for an instance (a keeper, on its status file; a network helper, on the state folder
// it serves, opened with open_dir_path) notices that the instance's folder was removed under it
// (rm -rf of the instance, or of the whole instances folder): each looks every kRemovedCheck and
// then ends what it runs. A descriptor fstat cannot read for another reason counts as present.
bool removed(int fd);
inline constexpr std::chrono::seconds kRemovedCheck{1};

// The first executable `name` on $PATH (or `name` itself when it contains a '/').
std::optional<std::string> find_program(const std::string& name);

// This program's own path (/proc/self/exe; when the file was replaced on disk, its successor's).
// `why` says what it is for, in the error. Throws SysError.
std::string self_program(std::string_view why);

// Expands a leading "~" and $VAR / ${VAR} references (HOME for ~). Unknown variables expand to "".
std::string expand_user_vars(std::string_view text,
                             const std::function<std::optional<std::string>(std::string_view)>& env);

}  // namespace nshpc::fs
