// Pseudo-terminals made by this process for a sandbox: the one private terminal a sandbox is
// given in place of a person's (cli/pty_relay.cpp) or a browser's (instances/terminal.hpp).
#pragma once

#include "base/fd.hpp"

namespace nshpc {

struct Pty {
  UniqueFd master;  // non-blocking: whoever relays it never waits on the sandbox's side
  UniqueFd slave;   // not our controlling terminal (O_NOCTTY); close-on-exec
};

// A new pseudo-terminal with the kernel's default settings. Throws SysError naming the step.
Pty open_pty();

// The window size of the terminal of `fd` (master or slave): TIOCSWINSZ, so the foreground
// process group of the slave gets SIGWINCH when it changed. Throws SysError.
void set_window_size(int fd, unsigned short rows, unsigned short cols);

// The window size of the terminal of `from` given to that of `to`; quietly nothing when `from`
// has none (not a terminal).
void copy_window_size(int from, int to);

}  // namespace nshpc
