// The plain types of an instance's sandbox that the store knows: how an image instance's ids map
// to the host's, its root, what a sandbox of it binds (Target), and the one rule of whom it runs
// as. Data, no machinery: the store (persistence) includes this and nothing else of sandbox/
// (tests/architecture.sh keeps it so).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "audit/audit.hpp"
#include "base/users.hpp"
#include "config/config.hpp"

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

// The host folders of one instance that a sandbox binds, and its network mode.
struct Target {
  std::string instance_id;
  std::filesystem::path workspace;           // bound read-write at namespace.workspace_mount
  std::filesystem::path output;              // bound read-write at namespace.output_mount
  std::filesystem::path shared_output_root;  // bound read-only at shared_output_mount when enabled
  config::Network network = config::Network::host;
  // A living instance: one long-lived sandbox per instance that every execution joins (started
  // on first use; see LivingStatus). Its status file and locks live in `state_dir`, a host-only
  // folder of the instance (<instance>/status) that the sandbox never sees.
  bool persistent = false;
  std::filesystem::path state_dir;
  // The instance's folder below "ns-hpc" in every cgroup hierarchy ([namespace] limits; its
  // commands' and jobs' groups below it): "<id>@<store>", so two stores (instances_dir) with an
  // instance of the same id never share limits or kill each other's processes.
  std::string cgroup_folder;
  // An instance on an image (always persistent); nullopt: the host's own root, read-only.
  std::optional<ImageRoot> image;
  // The instance's audit log (what a `filtered` instance's proxy allowed and refused goes there).
  std::filesystem::path audit_log;
  // The instance's additions to [network] allow (`filtered`).
  std::vector<std::string> network_allow;
  // How that log is rotated ([audit]): the helpers that write it follow it too.
  audit::Rotation audit_rotation;
  // The instance's own idle_stop (seconds, 0 = never); nullopt: [namespace] idle_stop.
  std::optional<std::int64_t> idle_stop;
  // The store's audit log (<instances_dir>/.audit.log): a keeper that ends a sandbox whose
  // instance folder was removed under it says so there.
  std::filesystem::path store_audit_log;
  // Variables every command of the instance gets (a desktop's DISPLAY, ...), before
  // [namespace] env and the command's own.
  std::vector<std::pair<std::string, std::string>> env;
  // Run in the living sandbox each time it starts, once it is up (a desktop's session): joined as
  // any command, `input` on its stdin, for at most `timeout`. Its failure is logged, never the
  // start's: the sandbox serves its commands either way.
  struct OnStart {
    std::vector<std::string> argv;
    std::string input;
    std::chrono::milliseconds timeout{60000};
  };
  std::optional<OnStart> on_start;
};

// Whom a sandbox of `target` runs as on the host, and whom the files made for it belong to: an
// image instance's uid 0 as root (its own range), the caller as a normal user; otherwise
// `plain` (users::sandbox_owner). The one place that decides it per instance.
inline std::optional<users::Identity> host_identity(const Target& target, const std::optional<users::Identity>& plain) {
  if (!target.image) return plain;
  if (::geteuid() != 0) return std::nullopt;
  return users::Identity{target.image->ids.host_base, target.image->ids.host_gid};
}

}  // namespace nshpc::sandbox
