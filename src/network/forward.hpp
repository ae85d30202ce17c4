// A port of a sandbox exposed on the host's loopback (expose_port): a process of its own per
// exposed port, the ns-hpc binary itself, run as
//   ns-hpc __port-forward --port P --audit FILE --instance ID --watch-pid PID --record FILE [--uid U --gid G]
// with descriptors
//   3  a listening TCP socket on the host's loopback (the server had it bound as the identity
//      this process runs as, so the port it reports is the one bound, a port in use is refused
//      before anything starts, and a privileged port cannot be had);
//   4  the sandbox's network namespace;
//   5  the user namespace that owns it, when the server is not root (optional).
// It joins the namespace at start, so every socket it makes afterwards is the sandbox's, while
// descriptor 3 stays the host's; then, with --uid/--gid (a server running as root), it becomes
// that user (the sandbox's own uid) and keeps no capability: what the sandbox sends passes
// through a process that is not root. For each connection accepted on descriptor 3 it connects
// to 127.0.0.1:P inside (else [::1]:P) and copies bytes both ways, half-closes included. A
// connection refused inside is closed at once.
//
// What it writes to the audit log, through a descriptor opened before it gave up its uid: a line
// a minute while there is traffic (network.port_traffic: port, host_port, connections, bytes each
// way, refused). It never rotates the log (the server and the proxy do); after a rotation its
// lines go to the rotated file. It ends on SIGTERM, when the --watch-pid process (the sandbox's
// init, or its held namespace's holder) ends, and when the folder of its --record (its pid file,
// in the instance's state folder) is removed (fs::removed).
#pragma once

#include <string_view>

namespace nshpc::network {

inline constexpr std::string_view kForwardCommand = "__port-forward";
int forward_main(int argc, char** argv);

}  // namespace nshpc::network
