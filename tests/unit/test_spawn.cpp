// base/spawn: the one process starter, against the real kernel (no privileges needed).
#include "base/spawn.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/pidfd.hpp"

namespace {

using namespace std::chrono_literals;
using nshpc::Pipe;
using nshpc::SpawnSpec;
using nshpc::UniqueFd;

std::string read_all(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

SpawnSpec shell(const std::string& script) {
  SpawnSpec spec;
  spec.program = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  return spec;
}

// Runs `spec` with stdout on a pipe; returns what it printed and its wait status.
std::pair<std::string, int> output_of(SpawnSpec spec) {
  Pipe out = nshpc::make_pipe();
  spec.fds.emplace_back(out.write.get(), 1);
  nshpc::SpawnedChild child = nshpc::spawn(spec);
  out.write.reset();
  std::string text = read_all(out.read.get());
  return {text, child.wait()};
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

}  // namespace

// A descriptor lands at the number asked for, even where a source sits at another's target;
// anything not mapped is closed, O_CLOEXEC or not.
TEST(Spawn, MapsDescriptorsAndClosesTheRest) {
  Pipe a = nshpc::make_pipe(), b = nshpc::make_pipe();
  UniqueFd stray(::open("/dev/null", O_WRONLY));  // no O_CLOEXEC: would be inherited by plain exec
  ASSERT_TRUE(stray);
  SpawnSpec spec = shell("echo one >&5; echo two >&6; echo three 2>/dev/null >&" + std::to_string(stray.get()) +
                         " && echo stray-open >&5; exit 0");
  spec.fds = {{a.write.get(), 5}, {b.write.get(), 6}};
  nshpc::SpawnedChild child = nshpc::spawn(spec);
  a.write.reset();
  b.write.reset();
  EXPECT_EQ(read_all(a.read.get()), "one\n");
  EXPECT_EQ(read_all(b.read.get()), "two\n");
  const int status = child.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  // Without close_other_fds the child keeps what it inherits (the keeper hands bwrap its fds).
  SpawnSpec keep = shell("echo x >&" + std::to_string(stray.get()) + " && echo kept");
  keep.close_other_fds = false;
  EXPECT_EQ(output_of(keep).first, "kept\n");
}

TEST(Spawn, AppliesRlimitsEnvironmentAndWorkingDirectory) {
  SpawnSpec spec = shell("ulimit -n; echo \"$ONLY\"; pwd");
  spec.rlimits = {{RLIMIT_NOFILE, 37}};
  spec.envp = std::vector<std::string>{"ONLY=this"};
  spec.cwd = "/usr";
  auto [out, status] = output_of(spec);
  EXPECT_EQ(out, "37\nthis\n/usr\n");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// The child's signal handling starts fresh whatever this process blocked or ignored.
TEST(Spawn, SignalsAreDefaultInTheChild) {
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGTERM, &ignore, &old);
  nshpc::SpawnedChild child = nshpc::spawn(shell("kill -TERM $$; sleep 5"));
  ::sigaction(SIGTERM, &old, nullptr);
  const int status = child.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
}

// The pidfd becomes readable when the child exits; wait() gives its status.
TEST(Spawn, PidfdIsReadableAtExit) {
  nshpc::SpawnedChild child = nshpc::spawn(shell("sleep 0.2; exit 7"));
  ASSERT_GE(child.pidfd(), 0);
  EXPECT_FALSE(nshpc::wait_pidfd(child.pidfd(), 0ms));
  EXPECT_TRUE(nshpc::wait_pidfd(child.pidfd(), 5000ms));
  const int status = child.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << status;
}

TEST(Spawn, AProgramThatCannotStartIsASysErrorNamingItWithItsErrno) {
  for (const std::string& program : {std::string("/nonexistent/program"), std::string("nshpc-no-such-program")}) {
    SpawnSpec spec;
    spec.program = program;
    spec.argv = {program};
    try {
      nshpc::spawn(spec);
      ADD_FAILURE() << program << " started";
    } catch (const nshpc::SysError& e) {
      EXPECT_EQ(e.code(), ENOENT) << e.what();
      EXPECT_NE(std::string(e.what()).find(program), std::string::npos) << e.what();
    }
  }
  SpawnSpec cwd = shell("true");
  cwd.cwd = "/nonexistent";
  try {
    nshpc::spawn(cwd);
    ADD_FAILURE() << "chdir to a missing folder succeeded";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("chdir(/nonexistent)"), std::string::npos) << e.what();
  }
}

// A child not waited for or released is killed and reaped with its handle: no process and no
// zombie is left. A released one runs on.
TEST(Spawn, AHandleKillsAndReapsItsChildUnlessReleased) {
  pid_t pid = -1;
  {
    nshpc::SpawnedChild child = nshpc::spawn(shell("exec sleep 60"));
    pid = child.pid();
    ASSERT_TRUE(alive(pid));
  }
  EXPECT_FALSE(alive(pid)) << "pid " << pid << " is still there (running or a zombie)";

  nshpc::SpawnedChild released = nshpc::spawn(shell("exec sleep 60"));
  const pid_t kept = released.release();
  { nshpc::SpawnedChild gone = std::move(released); }
  EXPECT_TRUE(alive(kept));
  ::kill(kept, SIGKILL);
  int status = 0;
  EXPECT_EQ(::waitpid(kept, &status, 0), kept);
}

// die_with_parent: the child gets the signal when the process that started it ends.
TEST(Spawn, DieWithParentEndsTheChildWithItsParent) {
  for (const int signal : {SIGKILL, 0}) {
    Pipe report = nshpc::make_pipe(), go = nshpc::make_pipe();
    const pid_t parent = ::fork();
    ASSERT_GE(parent, 0);
    if (parent == 0) {
      // The test's single-threaded child: starts the grandchild, tells its pid, waits to be told to go.
      SpawnSpec spec = shell("exec sleep 60");
      spec.die_with_parent = signal;
      pid_t pid = spawn(spec).release();
      if (::write(report.write.get(), &pid, sizeof pid) != sizeof pid) ::_exit(1);
      char c;
      if (::read(go.read.get(), &c, 1) < 0) ::_exit(1);
      ::_exit(0);
    }
    report.write.reset();
    pid_t grandchild = -1;
    ASSERT_EQ(::read(report.read.get(), &grandchild, sizeof grandchild), static_cast<ssize_t>(sizeof grandchild));
    UniqueFd pidfd = nshpc::open_pidfd(grandchild);
    ASSERT_TRUE(pidfd);
    ASSERT_EQ(::write(go.write.get(), "x", 1), 1);
    int status = 0;
    ASSERT_EQ(::waitpid(parent, &status, 0), parent);
    if (signal != 0) {
      EXPECT_TRUE(nshpc::wait_pidfd(pidfd.get(), 5000ms)) << "the child outlived its parent";
    } else {
      EXPECT_FALSE(nshpc::wait_pidfd(pidfd.get(), 300ms)) << "without die_with_parent the child ended too";
      nshpc::signal_pidfd(pidfd.get(), SIGKILL);
      EXPECT_TRUE(nshpc::wait_pidfd(pidfd.get(), 5000ms));
    }
  }
}

// Cgroup joins need a writable cgroup (tests/integration/test_cgroups.cpp); a descriptor that
// refuses the write is the step named in the error.
TEST(Spawn, AFailedCgroupJoinIsNamed) {
  UniqueFd not_a_cgroup(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // write(2) fails: EBADF
  SpawnSpec spec = shell("true");
  spec.join_cgroups = {not_a_cgroup.get()};
  try {
    nshpc::spawn(spec);
    ADD_FAILURE() << "started although the join failed";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), EBADF);
    EXPECT_NE(std::string(e.what()).find("cgroup"), std::string::npos) << e.what();
  }
}
