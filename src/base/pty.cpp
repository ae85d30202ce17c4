#include "base/pty.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>

#include <cerrno>

#include "base/error.hpp"

namespace nshpc {

Pty open_pty() {
  Pty pty;
  pty.master.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK));
  if (!pty.master) throw SysError(errno, "posix_openpt");
  if (::grantpt(pty.master.get()) < 0) throw SysError(errno, "grantpt");
  if (::unlockpt(pty.master.get()) < 0) throw SysError(errno, "unlockpt");
  char name[128];
  if (::ptsname_r(pty.master.get(), name, sizeof name) != 0) throw SysError(errno, "ptsname");
  pty.slave.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!pty.slave) throw SysError(errno, "open", name);
  return pty;
}

void set_window_size(int fd, unsigned short rows, unsigned short cols) {
  winsize ws{};
  ws.ws_row = rows;
  ws.ws_col = cols;
  if (::ioctl(fd, TIOCSWINSZ, &ws) < 0) throw SysError(errno, "ioctl", "TIOCSWINSZ");
}

void copy_window_size(int from, int to) {
  winsize ws{};
  if (::ioctl(from, TIOCGWINSZ, &ws) == 0) ::ioctl(to, TIOCSWINSZ, &ws);
}

}  // namespace nshpc
