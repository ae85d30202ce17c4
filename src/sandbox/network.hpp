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
#include <optional>
#include <string>
#include <vector>

#include "base/pidfd.hpp"
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

// Serves the running sandbox whose init is `init` in plan.mode, from whatever serves it now (on
// record in the state folder): pasta attached or detached, the proxy started or given its new
// policy (SIGHUP). Connections the new mode forbids are cut (a detach destroys every socket of
// the namespace with a peer off its loopback; the proxy closes tunnels it no longer allows). A
// process this one starts and must reap goes to `leftovers`. `host` cannot be served this way
// (the sandbox has no namespace of its own then): the caller restarts it. Throws UsageError
// when the mode cannot work here (nat without pasta or /dev/net/tun), SysError/Error otherwise.
void serve_network(const NetworkPlan& plan, pid_t init, Leftovers& leftovers);

// At a fresh start or a stop of the sandbox: what an earlier one left (pasta does not end with
// its namespace) is ended, and the record cleared.
void end_network(const NetworkPlan& plan);

// The mode on record as serving the sandbox now; nullopt: none (a fresh sandbox, or `host`).
std::optional<config::Network> served_network(const std::filesystem::path& state_dir);

}  // namespace nshpc::sandbox
