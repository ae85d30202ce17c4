// The caller's terminal stays the caller's. Each test runs ns-hpc on a terminal the test owns (its
// stdin, stdout, stderr and controlling terminal, as a login shell has), lets the sandbox attack
// the terminal it was given, and checks the test's terminal afterwards: same termios, same line
// discipline, and the command's output relayed to it (src/cli/pty_relay.cpp).
#include <fcntl.h>
#include <linux/tty.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cstring>

#include "base/fd.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nshpc::UniqueFd;

namespace {

struct TerminalState {
  termios attrs{};
  int ldisc = -1;
};

TerminalState state_of(int fd) {
  TerminalState s;
  EXPECT_EQ(::tcgetattr(fd, &s.attrs), 0) << std::strerror(errno);
  EXPECT_EQ(::ioctl(fd, TIOCGETD, &s.ldisc), 0) << std::strerror(errno);
  return s;
}

void expect_unchanged(const TerminalState& before, const TerminalState& after) {
  EXPECT_EQ(after.ldisc, before.ldisc) << "the sandbox changed our terminal's line discipline";
  EXPECT_EQ(after.attrs.c_lflag & (ECHO | ICANON | ISIG), before.attrs.c_lflag & (ECHO | ICANON | ISIG))
      << "the sandbox changed our terminal's echo or line editing";
  EXPECT_EQ(after.attrs.c_iflag, before.attrs.c_iflag) << std::hex << after.attrs.c_iflag;
  EXPECT_EQ(after.attrs.c_oflag, before.attrs.c_oflag) << std::hex << after.attrs.c_oflag;
  EXPECT_EQ(after.attrs.c_cflag, before.attrs.c_cflag) << std::hex << after.attrs.c_cflag;
  EXPECT_EQ(after.attrs.c_lflag, before.attrs.c_lflag) << std::hex << after.attrs.c_lflag;
  EXPECT_EQ(std::memcmp(after.attrs.c_cc, before.attrs.c_cc, sizeof before.attrs.c_cc), 0)
      << "control characters changed";
}

// A pseudo-terminal the test holds both ends of; ns-hpc runs on its slave.
class OwnTerminal {
 public:
  OwnTerminal() {
    winsize size{24, 80, 0, 0};
    int master = -1, slave = -1;
    if (::openpty(&master, &slave, nullptr, nullptr, &size) < 0) ADD_FAILURE() << "openpty: " << std::strerror(errno);
    master_.reset(master);
    slave_.reset(slave);
    ::fcntl(master, F_SETFD, FD_CLOEXEC);
    ::fcntl(slave, F_SETFD, FD_CLOEXEC);
  }
  ~OwnTerminal() {
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  OwnTerminal(const OwnTerminal&) = delete;
  OwnTerminal& operator=(const OwnTerminal&) = delete;

  int slave() const { return slave_.get(); }
  int master() const { return master_.get(); }
  pid_t pid() const { return pid_; }
  const std::string& screen() const { return screen_; }

  // Starts ns-hpc in a new session with this terminal as its controlling terminal and as stdout
  // and stderr; as stdin too unless `stdin_on_terminal` is false (then /dev/null).
  void start(const Env& env, const std::vector<std::string>& args, bool stdin_on_terminal = true) {
    auto argv = env.argv_for(args);
    auto envp = env.env_for({"TERM=xterm"});
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : envp) e.push_back(s.data());
    e.push_back(nullptr);
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      ::setsid();
      ::ioctl(slave_.get(), TIOCSCTTY, 0);
      ::dup2(stdin_on_terminal ? slave_.get() : ::open("/dev/null", O_RDONLY), 0);
      ::dup2(slave_.get(), 1);
      ::dup2(slave_.get(), 2);
      ::execve(a[0], a.data(), e.data());
      ::_exit(127);
    }
    pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    ASSERT_TRUE(pidfd_) << "pidfd_open: " << std::strerror(errno);
  }

  // Reads what ns-hpc writes until `text` has appeared; false if it exits or `limit` passes first.
  bool wait_for(const std::string& text, std::chrono::seconds limit = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (screen_.find(text) == std::string::npos && read_some(deadline)) {
    }
    return screen_.find(text) != std::string::npos;
  }

  // Reads until ns-hpc has exited; its exit code (128+N when signal N killed it), -1 on timeout.
  int finish(std::chrono::seconds limit = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (read_some(deadline)) {
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) {
      ADD_FAILURE() << "ns-hpc did not exit; screen so far: " << screen_;
      return -1;
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  // Appends what the master has; false once ns-hpc has exited (after taking the rest) or the
  // deadline has passed.
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{master_.get(), POLLIN, 0}, {pidfd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0) return errno == EINTR;
    char buf[4096];
    if (fds[0].revents & POLLIN) {
      ssize_t n = ::read(master_.get(), buf, sizeof buf);
      if (n > 0) screen_.append(buf, static_cast<size_t>(n));
    }
    if (!(fds[1].revents & POLLIN)) return true;
    ::fcntl(master_.get(), F_SETFL, O_NONBLOCK);  // exited: take what is left, then stop
    ssize_t n;
    while ((n = ::read(master_.get(), buf, sizeof buf)) > 0) screen_.append(buf, static_cast<size_t>(n));
    return false;
  }

  UniqueFd master_, slave_, pidfd_;
  pid_t pid_ = -1;
  std::string screen_;
};

class Terminal : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.create("alpha");
    env_.install_probe("alpha");
  }
  Env env_;
};

}  // namespace

TEST_F(Terminal, BwrapKeepsTheSandboxAwayFromTheCallersTerminal) {
  OwnTerminal term;
  const TerminalState before = state_of(term.slave());
  ASSERT_EQ(before.ldisc, N_TTY);
  ASSERT_TRUE(before.attrs.c_lflag & ECHO);
  ASSERT_TRUE(before.attrs.c_lflag & ICANON);
  // The probe switches its stdin's terminal to the null line discipline once the test has typed
  // a key (so the marker is on our screen before the terminal it went through goes dead).
  term.start(env_, {"bwrap", "alpha", "--", "sh", "-c",
                    "stty -echo raw; echo relayed-$((6*7)); head -c1 >/dev/null; "
                    "/workspace/probe tiocsetd >/workspace/tiocsetd.out; exit 3"});
  ASSERT_TRUE(term.wait_for("relayed-42")) << term.screen();
  ASSERT_EQ(::write(term.master(), "x", 1), 1);
  EXPECT_EQ(term.finish(), 3) << term.screen();
  expect_unchanged(before, state_of(term.slave()));
  EXPECT_NE(read_text(env_.instances() / "alpha/workspace/tiocsetd.out").find("tiocsetd: "), std::string::npos)
      << "the probe did not run";
}

TEST_F(Terminal, OutputOnlyTerminalIsKeptAwayToo) {
  OwnTerminal term;
  const TerminalState before = state_of(term.slave());
  term.start(env_, {"bwrap", "alpha", "--", "sh", "-c",
                    "[ -t 0 ] || [ ! -t 1 ] || echo stdout-only-a-tty; stty -echo raw <&1; echo relayed-$((6*7))"},
             /*stdin_on_terminal=*/false);
  EXPECT_EQ(term.finish(), 0) << term.screen();
  EXPECT_NE(term.screen().find("stdout-only-a-tty"), std::string::npos) << term.screen();
  EXPECT_NE(term.screen().find("relayed-42"), std::string::npos) << term.screen();
  expect_unchanged(before, state_of(term.slave()));
}

class TerminalStop : public Terminal, public ::testing::WithParamInterface<int> {};

TEST_P(TerminalStop, TerminalIsRestoredWhenTheCliIsStopped) {
  const int sig = GetParam();
  OwnTerminal term;
  const TerminalState before = state_of(term.slave());
  term.start(env_, {"bwrap", "alpha", "--", "sh", "-c", "stty -echo raw; echo ready-$((6*7)); exec sleep 60"});
  ASSERT_TRUE(term.wait_for("ready-42")) << term.screen();
  ASSERT_EQ(::kill(term.pid(), sig), 0);
  EXPECT_EQ(term.finish(), 128 + sig) << term.screen();
  expect_unchanged(before, state_of(term.slave()));
}

INSTANTIATE_TEST_SUITE_P(Signals, TerminalStop, ::testing::Values(SIGTERM, SIGINT, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& info) { return std::string(sigabbrev_np(info.param)); });

TEST_F(Terminal, TerminalIsRestoredWhenTheCommandIsKilled) {
  OwnTerminal term;
  const TerminalState before = state_of(term.slave());
  term.start(env_, {"bwrap", "alpha", "--", "sh", "-c", "stty -echo raw; kill -KILL $$"});
  EXPECT_EQ(term.finish(), 128 + SIGKILL) << term.screen();
  expect_unchanged(before, state_of(term.slave()));
}

TEST_F(Terminal, WindowSizeIsForwardedAndFollowsSigwinch) {
  OwnTerminal term;
  term.start(env_, {"bwrap", "alpha", "--", "sh", "-c", "stty size; echo ready-$((6*7)); read line; stty size"});
  ASSERT_TRUE(term.wait_for("ready-42")) << term.screen();
  EXPECT_NE(term.screen().find("24 80"), std::string::npos) << term.screen();
  winsize bigger{40, 120, 0, 0};
  ASSERT_EQ(::ioctl(term.slave(), TIOCSWINSZ, &bigger), 0);  // SIGWINCH to ns-hpc, as a resized window sends
  ASSERT_EQ(::write(term.master(), "\r", 1), 1);
  EXPECT_EQ(term.finish(), 0) << term.screen();
  EXPECT_NE(term.screen().find("40 120"), std::string::npos) << term.screen();
}
