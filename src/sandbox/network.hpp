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

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/pidfd.hpp"
#include "config/config.hpp"
#include "network/netns.hpp"
#include "sandbox/sandbox.hpp"

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
  audit::Rotation audit_rotation;    // [audit]: the proxy rotates it as the server does
  // The instance's own additions to the allow list (network_allow, which an agent writes): the
  // proxy never lets them open the host's own addresses.
  std::vector<std::string> instance_allow;
  config::PortRange expose_ports;    // [network] expose_port_range: the host ports expose_port may take
  std::uint16_t server_port = 0;     // [server] port: never taken by an exposed port
  // Whom the instance's sandbox runs as on the host (host_identity); nullopt: this process's uid.
  std::optional<users::Identity> runs_as;
};

// Serves the running sandbox whose init is `init` in plan.mode, from whatever serves it now (on
// record in the state folder): pasta attached or detached, the proxy started or given its new
// policy (SIGHUP). Connections the new mode forbids are cut (a detach destroys every socket of
// the namespace with a peer off its loopback; the proxy closes tunnels it no longer allows). A
// process this one starts and must reap goes to `leftovers`. `host` cannot be served this way
// (the sandbox has no namespace of its own then): the caller restarts it. Throws NeedsAction
// when the mode cannot work here (nat without pasta or /dev/net/tun), SysError/Error otherwise.
void serve_network(const NetworkPlan& plan, pid_t init, Leftovers& leftovers);

// Forwards 127.0.0.1:host_port on the host (0: a free one of plan.expose_ports) to `port` inside
// the running sandbox whose init (or holder) is `init`, and records it in plan.state_dir:
// serve_network starts it again with every new sandbox (the same host port when it is free).
// Exposing a port again keeps its host port unless another is asked for. The forwarder binds and
// runs as an unprivileged user: the sandbox's own uid when this process is root (nobody when
// that is root too), else this process's uid without capabilities. Throws UsageError when the
// host port is outside plan.expose_ports, is the server's own port, or is in use.
ExposedPort expose_port(const NetworkPlan& plan, pid_t init, std::uint16_t port, std::uint16_t host_port,
                        Leftovers& leftovers);

// Ends the forward of `port` and its record; false when it was not exposed.
bool unexpose_port(const NetworkPlan& plan, std::uint16_t port);

// The ports on record, with whether each is forwarded now.
std::vector<ExposedPort> exposed_ports(const NetworkPlan& plan);

// At a fresh start or a stop of the sandbox: what an earlier one left (pasta does not end with
// its namespace) is ended, and the record cleared (not the exposed ports: they are the instance's).
void end_network(const NetworkPlan& plan);

// The mode on record as serving the sandbox now; nullopt: none (a fresh sandbox, or `host`).
std::optional<config::Network> served_network(const std::filesystem::path& state_dir);

// The state folder that a process serving an instance's network was started for, read from its
// command line `argv` (the holder, the proxy, pasta's watcher and the forwarders name a file in
// it, and so does pasta its pid file); nullopt when `argv` is none of theirs. Each of them ends by
// itself once that folder is removed (fs::removed); `doctor` ends those that did not.
std::optional<std::filesystem::path> network_helper_folder(const std::vector<std::string>& argv);

// An instance whose commands each get a fresh sandbox keeps one network namespace for them while
// it is used: a holder process (network/netns.hpp, `__net-hold`) makes it, every command's sandbox
// joins it, and it is served as a living sandbox's is (the holder's pid in place of the init).
// Its records are in a folder of the state folder per host (`network-HOST`: Slurm jobs of the
// instance run `ns-hpc bwrap --fresh` on other nodes, which hold their own), shared by every
// server process of this host; the holder outlives them and ends after `idle` without commands.
struct HeldNetwork {
  pid_t pid = -1;
  UniqueFd pidfd;            // the holder's
  network::NetnsFds ns;      // its namespaces, for a command's sandbox to join
};

// The folder of the records of an instance's held network on this host.
std::filesystem::path held_network_dir(const std::filesystem::path& state_dir);

// The held network of plan (plan.state_dir: held_network_dir), served as plan.mode (`again`: served
// even when that mode is on record already, for a changed allow list); a holder is started when
// none runs. Throws as serve_network does, and Error when the holder cannot start.
HeldNetwork hold_network(const NetworkPlan& plan, std::chrono::seconds idle, Leftovers& leftovers, bool again = false);

// The running holder on record, nullopt when there is none.
std::optional<HeldNetwork> find_held_network(const NetworkPlan& plan);

// Ends the holder and what serves its namespace (commands still in it keep their processes and
// lose what served them). Returns whether a holder was running.
bool release_held_network(const NetworkPlan& plan);

}  // namespace nshpc::sandbox
