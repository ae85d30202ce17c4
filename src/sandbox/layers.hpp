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

namespace nshpc::sandbox {

// How an image instance's ids map to the host's.
struct UidMapping {
  enum class Kind {
    range,   // 65536 ids: uid 0 inside is `host_base` outside (root's own range, or /etc/subuid's)
    single,  // only uid 0 inside, the user's own uid outside: no distinct system users
  };
  Kind kind = Kind::single;
  uid_t host_base = 0;
  std::uint32_t count = 1;
  std::string source;  // where it comes from, for doctor and describe_instance
};

// The first id of the ranges root gives image instances: 65536-aligned, at or above 2^20 and
// above every range in `subuid`/`subgid` (their text) and every id in `passwd`/`group`.
uid_t root_range_floor(std::string_view subuid, std::string_view subgid, std::string_view passwd,
                       std::string_view group);

// The mapping image instances of this process get: as root, its own range starting at the floor
// (each instance then takes the next free 65536); as a normal user, the first /etc/subuid range
// of at least 65536 ids (newuidmap writes it), else a single-uid map.
UidMapping image_uid_mapping();

// A user namespace in which uid/gid 0..count-1 are host_base.. on the host, held by a descriptor
// (its creating process is gone). Only root can map an arbitrary range. Throws SysError.
UniqueFd mapped_user_namespace(uid_t host_base, std::uint32_t count);

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
