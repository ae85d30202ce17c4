// An exact copy of a directory tree that a sandbox may be changing while it is read, made through
// descriptors only: every entry is opened beneath the descriptor of its folder with
// O_NOFOLLOW (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so a folder swapped for a symlink at any
// moment is copied as that symlink or skipped, never followed out of the tree. What an instance's
// snapshot, restore and reset copy (instances/snapshots.hpp).
//
// Exact: owners, modes (set-id bits included), times, every extended attribute this process may
// read and write (the overlay's trusted.overlay.* as root, POSIX ACLs), symlinks as symlinks, hard
// links as hard links, FIFOs and the overlay's whiteouts (character device 0:0) as such, sparse
// files sparse, blocks shared (FICLONE) where the filesystem can. Sockets and other device nodes
// are left out (nothing in an instance's tree needs them, and a sandbox cannot make them). Nothing
// of the source is ever made more readable by the copy: each entry keeps its owner and mode.
//
//   ns-hpc __copy-tree FROM TO
//
// runs it as a process of its own: as a normal user inside a user namespace mapping the files of
// the user's subordinate ids (sandbox::as_mapped_root), and always so that a cancelled copy is a
// process to end, not a thread to stop.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace nshpc::fs {

inline constexpr std::string_view kCopyTreeCommand = "__copy-tree";
// Folders deeper than this are refused (each level holds two descriptors while it is copied).
inline constexpr int kMaxCopyTreeDepth = 2048;

struct TreeCopied {
  std::uint64_t entries = 0;  // folders, files, links and nodes made
  std::uint64_t bytes = 0;    // file content copied (or cloned)
  std::uint64_t skipped = 0;  // entries that vanished or changed kind while being read, sockets, devices
};

// Copies the folder `from` to `to`, which must not exist (its parent must). The last component of
// `from` is not followed either. Throws SysError naming the entry that failed; what was made of
// `to` then stays for the caller to remove (it is the caller's staging folder).
TreeCopied copy_tree_exact(const std::filesystem::path& from, const std::filesystem::path& to);

// `ns-hpc __copy-tree FROM TO`: exit 0 when copied; 1 with the reason on stderr.
int copy_tree_main(int argc, char** argv);

}  // namespace nshpc::fs
