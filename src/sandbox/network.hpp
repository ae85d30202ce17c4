// The network of an instance's sandbox beyond its own namespace. Every mode but `host` gives the
// sandbox a network namespace of its own (bwrap --unshare-net); what serves it from outside:
//   off       nothing: its own loopback only;
//   nat       pasta (Debian's passt), attached to the namespace from outside, with `prohibit`
//             routes inside for every address of the host's own (pasta would reach the host's
//             services through them): the outside world, not the host;
//   filtered  ns-hpc's allow-list proxy (network/proxy.hpp): a process of its own in the host's
//             namespace serving a listening socket that lives in the sandbox's, on 127.0.0.1:3128
//             (the proxy variables point there); nothing else leaves.
// For a living instance these start with its sandbox, change while it runs, and end with it
// (they watch its init). Their records live in the instance's state folder.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace nshpc::sandbox {

// Where a `filtered` sandbox finds the proxy (its own loopback).
inline constexpr std::uint16_t kProxyPort = 3128;

struct NetworkPlan {
  std::string instance_id;
  config::Network mode = config::Network::host;
  std::vector<std::string> allow;    // [network] allow
  std::vector<std::string> resolve;  // [network] resolve
  std::filesystem::path state_dir;   // the instance's host-only state folder
  std::filesystem::path audit_log;   // where the proxy writes what it allowed and refused
};

}  // namespace nshpc::sandbox
