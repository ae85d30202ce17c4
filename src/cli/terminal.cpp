// `instance enter`: an interactive bash on a private pseudo-terminal. ns-hpc owns the PTY and
// relays it to the user's terminal, so nothing in the sandbox can reach the real terminal
// (TIOCSTI is also blocked by seccomp); bash gets job control because the PTY is its
// controlling terminal.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "cli/signals.hpp"

namespace nshpc::cli {

namespace {

// Puts the user's terminal in raw mode for the object's lifetime.
class RawMode {
 public:
  explicit RawMode(int fd) : fd_(fd) {
    if (::tcgetattr(fd_, &saved_) < 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(fd_, TCSADRAIN, &raw) == 0;
  }
  ~RawMode() {
    if (active_) ::tcsetattr(fd_, TCSADRAIN, &saved_);
  }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

struct Pty {
  UniqueFd master;
  UniqueFd slave;
};

Pty open_pty() {
  Pty pty;
  pty.master.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!pty.master) throw SysError(errno, "posix_openpt");
  if (::grantpt(pty.master.get()) < 0) throw SysError(errno, "grantpt");
  if (::unlockpt(pty.master.get()) < 0) throw SysError(errno, "unlockpt");
  char name[128];
  if (::ptsname_r(pty.master.get(), name, sizeof name) != 0) throw SysError(errno, "ptsname");
  pty.slave.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!pty.slave) throw SysError(errno, "open", name);
  return pty;
}

void copy_window_size(int from, int to) {
  winsize ws{};
  if (::ioctl(from, TIOCGWINSZ, &ws) == 0) ::ioctl(to, TIOCSWINSZ, &ws);
}

// Writes everything or gives up quietly (the other side went away).
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Relays until the sandbox's side of the PTY is closed. Returns a stop signal or 0.
int relay(int master, StopSignals& signals) {
  bool stdin_open = true;
  char buf[16384];
  for (;;) {
    pollfd fds[3] = {{master, POLLIN, 0}, {signals.fd(), POLLIN, 0}, {stdin_open ? 0 : -1, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "poll");
    }
    if (fds[1].revents & POLLIN) {
      int sig = signals.take();
      if (sig == SIGWINCH)
        copy_window_size(STDIN_FILENO, master);
      else if (sig)
        return sig;
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        return 0;  // EIO: every process holding the terminal has gone
      }
      write_all(STDOUT_FILENO, buf, static_cast<size_t>(n));
    }
    if (stdin_open && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n <= 0) {
        stdin_open = false;  // end of input: send EOF (Ctrl-D) to the shell once
        const char eof = 4;
        write_all(master, &eof, 1);
      } else {
        write_all(master, buf, static_cast<size_t>(n));
      }
    }
  }
}

}  // namespace

int run_interactive(Context& ctx, const store::Instance& inst) {
  if (!::isatty(STDIN_FILENO))
    throw UsageError(fmt::format(
        "'instance enter' needs a terminal on stdin; for scripts use: ns-hpc bwrap {} -- CMD", inst.id));
  const std::vector<std::string> command{"/bin/bash", "-i"};
  sandbox::RunSpec spec = make_run_spec(ctx, inst, command);
  Pty pty = open_pty();
  copy_window_size(STDIN_FILENO, pty.master.get());
  spec.stdio = {pty.slave.get(), pty.slave.get(), pty.slave.get()};
  spec.terminal = true;

  StopSignals signals({SIGWINCH});
  const auto started = std::chrono::steady_clock::now();
  auto process = ctx.backend().start(spec);
  pty.slave.reset();  // only the sandbox holds it now: its exit closes the terminal
  int stop_signal;
  {
    RawMode raw(STDIN_FILENO);
    stop_signal = relay(pty.master.get(), signals);
  }
  if (stop_signal) process->kill();
  sandbox::ExitStatus status = process->wait();
  return finish_sandbox_run(ctx, inst, command, "sandbox.enter", status, std::chrono::steady_clock::now() - started,
                stop_signal);
}

}  // namespace nshpc::cli
