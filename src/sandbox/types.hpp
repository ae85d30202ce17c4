// The plain types of an instance's sandbox that the store persists: how an image instance's ids
// map to the host's, and its root. Data only, no behaviour: the store (persistence) includes this
// and nothing else of sandbox/ (a test keeps it so: tests/architecture.sh).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace nshpc::sandbox {

// How an image instance's ids map to the host's (sandbox/layers.hpp).
struct UidMapping {
  enum class Kind {
    range,   // 0..count-1 inside: root's own range, or a normal user's uid plus its /etc/subuid range
    single,  // only uid 0 inside, the user's own uid outside: no distinct system users
  };
  Kind kind = Kind::single;
  uid_t host_base = 0;      // the host uid of uid 0 inside
  gid_t host_gid = 0;       // the host gid of gid 0 inside
  std::uint32_t count = 1;  // ids inside: 0..count-1
  // A normal user's range (written by newuidmap/newgidmap, as mmdebstrap --mode=unshare maps):
  // ids 1..count-1 inside are sub_uid.. and sub_gid.. outside. 0: root's ranges, contiguous from
  // host_base.
  uid_t sub_uid = 0;
  gid_t sub_gid = 0;
  std::string source;  // where it comes from, for doctor and describe_instance
};

// An instance on an image: its root file system is an overlay of the image version's root
// (read-only, shared by every instance on it, seen through the instance's ids) and the
// instance's own writable layer; commands run as uid 0 of a user namespace with `ids`.
struct ImageRoot {
  std::string image;              // "name@version", for messages
  std::filesystem::path rootfs;   // the image version's root file system
  std::filesystem::path layer;    // the instance's layer: upper/ and work/ (owned by its root)
  // An empty folder (0755) its sandbox's starter mounts the root on, in a mount namespace of its
  // own (bwrap binds it by path, so the instance's host uid must be able to reach it).
  std::filesystem::path mount_dir;
  UidMapping ids;
};

}  // namespace nshpc::sandbox
