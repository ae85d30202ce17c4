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

#include "base/fd.hpp"
#include "sandbox/sandbox.hpp"

namespace nshpc::sandbox {

// The first id of the ranges root gives image instances: 65536-aligned, at or above 2^20 and
// above every range in `subuid`/`subgid` (their text) and every id in `passwd`/`group`.
uid_t root_range_floor(std::string_view subuid, std::string_view subgid, std::string_view passwd,
                       std::string_view group);

// The mapping image instances of this process get: as root, its own range starting at the floor
// (each instance then takes the next free 65536); as a normal user, the first /etc/subuid range
// of at least 65536 ids (newuidmap writes it), else a single-uid map.
UidMapping image_uid_mapping();

// A user namespace in which uid/gid 0..count-1 are host_base.. on the host, held by a descriptor
// (its creating process is gone). Only root can map an arbitrary range. With `owned`, the
// process that makes it runs as host_base first, so the namespace belongs to that uid (which
// then holds every capability in it, and may join it). Throws SysError.
UniqueFd mapped_user_namespace(uid_t host_base, std::uint32_t count, bool owned = false);

// What the child starting an image instance's sandbox needs, made before its fork (as root).
struct ImageRootSetup {
  UniqueFd tree;    // the image's root, idmapped into the instance's ids (a detached mount)
  UniqueFd userns;  // the instance's user namespace, owned by its uid 0's host uid
  // In the child: descriptor numbers of `tree` and `userns` (closed once used), and where the
  // merged root is left for bwrap (--bind-fd).
  int tree_fd = -1, userns_fd = -1, root_fd = -1;
  std::string scratch, lower, merged;  // <scratch>, <scratch>/lower, <scratch>/merged
  std::string overlay_options;
};

// Prepares `image` for a sandbox: its user namespace and its idmapped image. Checks the layer's
// folders exist and belong to the instance's root. Throws Error/SysError.
ImageRootSetup prepare_image_root(const ImageRoot& image);

// In the forked child, before it executes anything (async-signal-safe calls only): a private
// mount namespace with the image under the instance's layer mounted (checked writable), the
// merged root on setup.root_fd, then the instance's user namespace as its uid 0 (every
// capability there, none on the host). Returns 0, or an errno with `*step` naming what failed.
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
