// The caller's terminal is never handed to a sandbox. When stdin, stdout or stderr is a terminal,
// the sandbox gets a private pseudo-terminal in its place and ns-hpc relays it, so whatever the
// sandbox does to its terminal (stty, TIOCSETD, TIOCSTI — the last is also blocked by seccomp)
// stays on the private one. With stdin on it, the PTY is the sandbox's controlling terminal (a
// shell gets job control, Ctrl-C reaches the command) and the caller's terminal is raw meanwhile,
// restored whatever ends the run. `ns-hpc bwrap` and `instance enter` both run through here.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "base/pty.hpp"
#include "cli/pty_relay.hpp"
#include "cli/signals.hpp"

namespace nshpc::cli {

namespace {

// Which of the caller's stdin, stdout and stderr are terminals, and where the sandbox's terminal
// output is shown: on stdout if that is a terminal, else stderr, else stdin's terminal.
struct CallerTerminal {
  bool on[3] = {false, false, false};
  int screen = -1;
};

std::optional<CallerTerminal> caller_terminal() {
  CallerTerminal t;
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) t.on[fd] = ::isatty(fd) == 1;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO, STDIN_FILENO}) {
    if (t.on[fd]) {
      t.screen = fd;
      return t;
    }
  }
  return std::nullopt;
}

// Puts the caller's terminal in raw mode for the object's lifetime and then back exactly as it
// was. TCSANOW: a terminal that stopped reading must not hang ns-hpc with its signals blocked.
class RawMode {
 public:
  explicit RawMode(int fd) : fd_(fd) {
    if (::tcgetattr(fd_, &saved_) < 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(fd_, TCSANOW, &raw) == 0;
  }
  ~RawMode() {
    if (active_) ::tcsetattr(fd_, TCSANOW, &saved_);
  }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

// A new PTY that starts as the caller's terminal is: its settings and window size.
Pty open_pty_like(const CallerTerminal& caller) {
  Pty pty = open_pty();
  termios attrs{};
  if (::tcgetattr(caller.on[STDIN_FILENO] ? STDIN_FILENO : caller.screen, &attrs) == 0) {
    // Without stdin the caller's terminal stays cooked and does the output processing, once.
    if (!caller.on[STDIN_FILENO]) attrs.c_oflag &= ~OPOST;
    ::tcsetattr(pty.slave.get(), TCSANOW, &attrs);
  }
  copy_window_size(caller.screen, pty.master.get());
  return pty;
}

// Writes everything or gives up quietly (the caller's terminal went away).
void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // someone made the caller's terminal non-blocking
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Shows what the sandbox wrote on its terminal; false once no process holds that terminal.
bool show_output(int master, int screen, bool until_empty) {
  char buf[16384];
  do {
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) return false;  // EIO: every process holding the terminal has gone
    write_all(screen, buf, static_cast<size_t>(n));
  } while (until_empty);
  return true;
}

// Relays between the caller's terminal and the PTY until the sandbox has exited (what it wrote
// last is shown first) or a stop signal arrives. Returns that signal, or 0.
int relay(const CallerTerminal& caller, int master, int pidfd, StopSignals& signals) {
  bool master_open = true;
  bool stdin_open = caller.on[STDIN_FILENO];
  std::string typed;  // read from the caller, not yet taken by the PTY
  char buf[16384];
  for (;;) {
    const bool read_stdin = stdin_open && master_open && typed.empty();
    const short master_events = static_cast<short>(POLLIN | (typed.empty() ? 0 : POLLOUT));
    pollfd fds[4] = {{pidfd, POLLIN, 0},
                     {signals.fd(), POLLIN, 0},
                     {master_open ? master : -1, master_events, 0},
                     {read_stdin ? STDIN_FILENO : -1, POLLIN, 0}};
    if (::poll(fds, 4, -1) < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "poll");
    }
    if (fds[1].revents & POLLIN) {
      int sig = signals.take();
      if (sig == SIGWINCH)
        copy_window_size(caller.screen, master);
      else if (sig)
        return sig;
    }
    if (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) master_open = show_output(master, caller.screen, false);
    if (master_open && (fds[2].revents & POLLOUT)) {
      ssize_t n = ::write(master, typed.data(), typed.size());
      if (n > 0) typed.erase(0, static_cast<size_t>(n));
    }
    if (fds[3].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n > 0) {
        typed.assign(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        stdin_open = false;  // end of input: send EOF (Ctrl-D) once
        typed = "\x04";
      }
    }
    if (fds[0].revents & POLLIN) {
      if (master_open) show_output(master, caller.screen, true);
      return 0;
    }
  }
}

AttachedRun ended(sandbox::Execution& execution, int stop_signal) {
  if (stop_signal) execution.kill_tree();
  return {execution.wait(), stop_signal};
}

}  // namespace

AttachedRun run_attached(instances::Service& instances, sandbox::ExecSpec spec) {
  const std::optional<CallerTerminal> caller = caller_terminal();
  if (!caller) {  // pipes and files are handed over as they are
    spec.stdio = {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO};
    StopSignals signals;  // SIGINT/SIGTERM/SIGHUP/SIGQUIT now arrive on a descriptor
    auto execution = instances.execute(std::move(spec));
    return ended(*execution, signals.wait_for_exit_or_signal(execution->wait_fd()));
  }

  Pty pty = open_pty_like(*caller);
  auto in_place = [&](int fd) { return caller->on[fd] ? pty.slave.get() : fd; };
  spec.stdio = {in_place(STDIN_FILENO), in_place(STDOUT_FILENO), in_place(STDERR_FILENO)};
  spec.terminal = caller->on[STDIN_FILENO];
  StopSignals signals({SIGWINCH});
  auto execution = instances.execute(std::move(spec));
  pty.slave.reset();  // only the sandbox holds it now
  // A command joining a living sandbox has a terminal of the sandbox's own instead (made like
  // this one): that is the one to relay.
  const int master = execution->terminal() >= 0 ? execution->terminal() : pty.master.get();
  int stop_signal;
  {
    std::optional<RawMode> raw;
    if (caller->on[STDIN_FILENO]) raw.emplace(STDIN_FILENO);
    stop_signal = relay(*caller, master, execution->wait_fd(), signals);
  }
  return ended(*execution, stop_signal);
}

}  // namespace nshpc::cli
