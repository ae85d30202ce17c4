// A port of a sandbox exposed on the host's loopback (expose_port): a process of its own per
// exposed port, the ns-hpc binary itself, run as
//   ns-hpc __port-forward --port P --audit FILE [--audit-rotation MAX_BYTES,KEEP] --instance ID --watch-pid PID
// with descriptors
//   3  a listening TCP socket on the host's loopback (the server made it, so the port it reports
//      is the one bound, and a port in use is refused before anything starts);
//   4  the sandbox's network namespace;
//   5  the user namespace that owns it, when the server is not root (optional).
// It joins the namespace at start, so every socket it makes afterwards is the sandbox's, while
// descriptor 3 stays the host's. For each connection accepted there it connects to 127.0.0.1:P
// inside (else [::1]:P) and copies bytes both ways, half-closes included. A connection refused
// inside is closed at once.
//
// What it writes to the audit log: a line a minute while there is traffic
// (network.port_traffic: port, host_port, connections, bytes each way, refused). It ends on
// SIGTERM, and when the --watch-pid process (the sandbox's init, or its held namespace's holder)
// ends.
#pragma once

#include <string_view>

namespace nshpc::network {

inline constexpr std::string_view kForwardCommand = "__port-forward";
int forward_main(int argc, char** argv);

}  // namespace nshpc::network
