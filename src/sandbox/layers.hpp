// The pieces an instance on an image is made of: a user namespace that maps its uid 0 to an
// unprivileged host range, the image mounted idmapped into that range (read-only, shared by
// every instance on it), and an overlay with the instance's own writable layer above it.
// Measured here (kernel 6.18, as root): idmapped lower + overlay, then bwrap in that user
// namespace as uid 0: `apt-get install` works inside, its files land in the layer owned by the
// instance's range, capabilities exist only in the instance's namespace (sysctls: EACCES).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "base/fd.hpp"
#include "sandbox/sandbox.hpp"

namespace nshpc::sandbox {

// The first id of the ranges root gives image instances: 65536-aligned, at or above 2^20 and
// above every range in `subuid`/`subgid` (their text) and every id in `passwd`/`group`.
uid_t root_range_floor(std::string_view subuid, std::string_view subgid, std::string_view passwd,
                       std::string_view group);

// The mapping image instances of this process get: as root, its own range starting at the floor
// (each instance then takes the next free 65536); as a normal user, uid 0 inside is the user and
// 1..65536 the first /etc/subuid (and /etc/subgid) range of at least 65536 ids, written by
// newuidmap/newgidmap as mmdebstrap --mode=unshare maps them, else a single-uid map.
UidMapping image_uid_mapping();

// A user namespace with the mapping `ids`, held by a descriptor (its creating process is gone).
// As root any range (with `owned`, the process that makes it runs as host_base first, so the
// namespace belongs to that uid, which then holds every capability in it and may join it); as a
// normal user its own uid, plus its subordinate range through newuidmap/newgidmap. Throws
// SysError/Error.
UniqueFd mapped_user_namespace(const UidMapping& ids, bool owned = false);

// The host ids of an image instance's accounts other than its root (uid 1 and up inside):
// {first, count}; count 0 with a single-uid map.
std::pair<uid_t, std::uint32_t> other_ids(const UidMapping& ids);

// Checks that the image at `rootfs` can be the root of an instance with `ids`: its files must
// belong to uid 0 inside (as root: the host's root, which the idmapped mount shifts; as a normal
// user: the user, as mmdebstrap --mode=unshare leaves them). Throws UsageError naming the owner
// found and what to do.
void check_image_owner(const std::filesystem::path& rootfs, const UidMapping& ids);

// Removes a tree of an image or an instance's layer. As a normal user, what it cannot remove
// itself (files of its subordinate uids: apt's _apt folders, users made inside) is removed in a
// user namespace that maps them (as_mapped_root). Throws Error/SysError.
void remove_owned_tree(const std::filesystem::path& path);

// `argv` made to run where it can handle every file of an instance on an image: as a normal
// user, as root of a user namespace mapping 0 to the user and, with an /etc/subuid range, 1.. to
// that range (util-linux unshare --map-root-user [--map-auto]); unchanged for root.
std::vector<std::string> as_mapped_root(std::vector<std::string> argv);

// What the child starting an image instance's sandbox needs, made before its fork.
struct ImageRootSetup {
  // As root: the image's root, idmapped into the instance's ids (a detached mount). As a normal
  // user: none (the overlay is mounted inside the user namespace, on the image's folder).
  UniqueFd tree;
  UniqueFd userns;  // the instance's user namespace, owned by its uid 0's host uid
  // In the child: descriptor numbers of `tree` and `userns` (closed once used; tree_fd -1 when
  // there is none), and where the merged root is left for bwrap (--bind-fd).
  int tree_fd = -1, userns_fd = -1, root_fd = -1;
  std::string scratch, lower, merged;  // <scratch>, <scratch>/lower, <scratch>/merged
  std::string overlay_options;
  bool set_groups = true;  // false with a single-uid map (setgroups is denied in it)
};

// Prepares `image` for a sandbox: its user namespace and (as root) its idmapped image. Checks the
// layer's folders exist and belong to the instance's root, and the image to its mapping. Throws
// Error/SysError.
ImageRootSetup prepare_image_root(const ImageRoot& image);

// In the forked child, before it executes anything (async-signal-safe calls only): a private
// mount namespace with the image under the instance's layer mounted (checked writable), the
// merged root on setup.root_fd, and the instance's user namespace as its uid 0 (every
// capability there, none on the host). As root the mounts come first, then the user namespace;
// as a normal user the user namespace comes first, and owns the mount namespace and the overlay
// (userxattr). Returns 0, or an errno with `*step` naming what failed.
int enter_image_root(const ImageRootSetup& setup, const char** step);

// `source` mounted read-only at `target` with its owners seen through `userns` (an idmapped
// mount: root-owned files appear owned by the namespace's host range). Throws SysError.
void mount_idmapped(const std::filesystem::path& source, int userns_fd, const std::filesystem::path& target);

// An overlay at `target`: `lower` read-only below, `upper` (with `work`) writable above.
// `userxattr` for a mount made inside a user namespace. Checks the mount is writable (a kernel
// that cannot use upper/work mounts it read-only and says so only in its log) and throws Error
// with the reason when it is not.
void mount_overlay(const std::filesystem::path& lower, const std::filesystem::path& upper,
                   const std::filesystem::path& work, const std::filesystem::path& target, bool userxattr);

// Whether this host can give an instance a writable layer over an image, tried for real in a
// throwaway mount namespace under `scratch` (created and removed): an idmapped image and an
// overlay as root; an overlay in a user namespace (userxattr, kernel 5.11+) as a normal user.
struct LayerSupport {
  bool ok = false;
  std::string detail;  // what was tried and what happened
  std::string fix;     // when not ok
};
LayerSupport probe_layers(const std::filesystem::path& scratch);

}  // namespace nshpc::sandbox
