// The display agent: `ns-hpc __display --x-fd N --control-fd M`, the process that holds a
// desktop's X connection for the server (desktop/client.hpp starts it; desktop/wire.hpp is what
// the two say). Whatever the sandbox's X server sends is parsed here and pixels are encoded here,
// never in the server: a fresh exec of the ns-hpc binary (nothing of the server's memory), run as
// the sandbox's identity, with an address-space limit, no core, no new privileges, no descriptor
// but its two sockets and a pipe of its own, and none to be had (RLIMIT_NOFILE 2 with 0 and 1
// taken), and a seccomp allow-list (reads and writes on what it has, poll, memory, time, exit:
// no open, socket, connect or exec) installed before the first byte from X is read.
#pragma once

namespace nshpc::desktop {

// The agent (argv as above). Answers requests until the control socket closes; returns 0 then,
// 2 for a wrong command line.
int agent_main(int argc, char** argv);

}  // namespace nshpc::desktop
