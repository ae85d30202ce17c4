// The captured-run pump against host processes standing in for a sandbox (no bwrap): stdin fed
// to cat, the output cap, the timeout and cancellation killing the tree, the drain after the end,
// write-through sinks. The tree test runs its command in a pid namespace of its own (unshare), as
// a sandbox does, so that killing its init kills a setsid'd, SIGTERM-ignoring grandchild too.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.hpp"
#include "base/pidfd.hpp"
#include "sandbox/capture.hpp"
#include "sandbox/spawn.hpp"

namespace {

namespace sandbox = nshpc::sandbox;
using nshpc::UniqueFd;
using namespace std::chrono_literals;

// A host process as an execution: its pidfd is the wait fd; kill_tree() is SIGKILL to it.
class HostExecution final : public sandbox::Execution {
 public:
  HostExecution(const std::vector<std::string>& argv, int in, int out, int err) {
    UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
    auto or_null = [&](int fd) { return fd >= 0 ? fd : null_fd.get(); };
    sandbox::ChildSetup setup;
    setup.program = argv.at(0);
    setup.argv = argv;
    setup.envp = {"PATH=/usr/bin:/bin", "LANG=C"};
    setup.fds = {{or_null(in), 0}, {or_null(out), 1}, {or_null(err), 2}};
    child_ = sandbox::spawn(setup);
  }
  ~HostExecution() override {
    if (waited_) return;
    kill_tree(false);
    wait();
  }
  int wait_fd() const override { return child_.pidfd(); }
  sandbox::ExitStatus wait() override {
    if (waited_) return status_;
    const int raw = child_.wait();
    waited_ = true;
    status_.started = true;
    status_.exit_code = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    return status_;
  }
  void signal(int sig) override { nshpc::signal_pidfd(child_.pidfd(), sig); }
  void kill_tree(bool) override {
    ++kills;
    if (!waited_) nshpc::signal_pidfd(child_.pidfd(), SIGKILL);
  }
  int kills = 0;

 private:
  sandbox::Child child_;
  bool waited_ = false;
  sandbox::ExitStatus status_;
};

// Starts `argv` on fresh pipes and runs the pump over it.
struct Captured {
  sandbox::CaptureResult result;
  int kills = 0;
};
Captured run(const std::vector<std::string>& argv, const sandbox::CaptureOptions& options) {
  nshpc::Pipe in, out = nshpc::make_pipe(), err = nshpc::make_pipe();
  if (!options.input.empty()) in = nshpc::make_pipe();
  HostExecution exec(argv, in.read.get(), out.write.get(), err.write.get());
  in.read.reset();
  out.write.reset();
  err.write.reset();
  Captured c;
  c.result = sandbox::pump(exec, {std::move(in.write), std::move(out.read), std::move(err.read)}, options);
  c.kills = exec.kills;
  return c;
}

std::vector<std::string> sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

// Whether a process with exactly this command line exists (zombies have none).
bool process_running(const std::vector<std::string>& cmdline) {
  std::string want;
  for (const auto& a : cmdline) want += a + '\0';
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.empty() || name[0] < '0' || name[0] > '9') continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (got == want) return true;
  }
  return false;
}

TEST(CapturePump, FeedsStdinToCatAndKeepsWhatItPrints) {
  sandbox::CaptureOptions options;
  // More than a pipe holds: the pump writes while it reads, without blocking on either.
  for (int i = 0; options.input.size() < 1024 * 1024; ++i) options.input += "line " + std::to_string(i) + "\n";
  options.timeout = 20s;
  const auto c = run({"/bin/cat"}, options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::finished);
  EXPECT_TRUE(c.result.status.started);
  EXPECT_EQ(c.result.status.exit_code, 0);
  EXPECT_EQ(c.result.out, options.input);
  EXPECT_EQ(c.result.err, "");
  EXPECT_EQ(c.kills, 0);
}

TEST(CapturePump, ACommandThatDoesNotReadItsStdinEndsNormally) {
  sandbox::CaptureOptions options;
  options.input = std::string(4 * 1024 * 1024, 'x');  // EPIPE once it is gone, never SIGPIPE for us
  options.timeout = 20s;
  const auto c = run(sh("echo done; exit 3"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::finished);
  EXPECT_EQ(c.result.status.exit_code, 3);
  EXPECT_EQ(c.result.out, "done\n");
}

TEST(CapturePump, TheOutputCapKeepsTheFirstBytesAndKillsTheCommand) {
  sandbox::CaptureOptions options;
  options.output_cap = 10000;
  options.timeout = 20s;
  const auto c = run({"/usr/bin/yes", "0123456789"}, options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::output_limit);
  EXPECT_EQ(c.result.out.size() + c.result.err.size(), 10000u);
  EXPECT_EQ(c.result.out.substr(0, 11), "0123456789\n");
  EXPECT_GE(c.kills, 1);
  EXPECT_EQ(c.result.status.exit_code, 128 + SIGKILL);
}

TEST(CapturePump, StdoutAndStderrShareTheCap) {
  sandbox::CaptureOptions options;
  options.output_cap = 6;
  options.timeout = 20s;
  const auto c = run(sh("printf abcd; printf efgh >&2; sleep 30"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::output_limit);
  EXPECT_EQ(c.result.out.size() + c.result.err.size(), 6u);
  EXPECT_LT(c.result.duration, 10s);
}

// The command's init is pid 1 of a pid namespace; a grandchild in a session of its own ignores
// SIGTERM. At the timeout the pump kills the tree: nothing of it is left.
TEST(CapturePump, TheTimeoutKillsTheWholeTreeAndKeepsThePartialOutput) {
  const std::vector<std::string> marker = {"sleep", "97.125"};
  ASSERT_FALSE(process_running(marker));
  sandbox::CaptureOptions options;
  options.timeout = 700ms;
  const auto start = std::chrono::steady_clock::now();
  const auto c = run({"/usr/bin/unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "/bin/sh",
                      "-c", "setsid sh -c 'trap \"\" TERM; exec sleep 97.125' </dev/null >/dev/null 2>&1 & "
                            "echo started; sleep 60"},
                     options);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(c.result.ending, sandbox::Ending::timed_out);
  EXPECT_EQ(c.result.out, "started\n");
  EXPECT_GE(c.kills, 1);
  EXPECT_LT(took, 10s);
  // The namespace's processes are killed as its init goes; give the kernel a moment.
  bool left = true;
  for (int i = 0; i < 200 && (left = process_running(marker)); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(left) << "the setsid'd grandchild outlived the timeout";
}

TEST(CapturePump, CancellationKillsTheCommandWithinASlice) {
  sandbox::CaptureOptions options;
  options.timeout = 30s;
  const auto start = std::chrono::steady_clock::now();
  options.cancelled = [&] { return std::chrono::steady_clock::now() - start > 300ms; };
  const auto c = run(sh("echo hi; sleep 30"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::cancelled);
  EXPECT_GE(c.kills, 1);
  EXPECT_LT(c.result.duration, 5s);
  EXPECT_GE(c.result.duration, 300ms);
}

TEST(CapturePump, ProgressIsReportedWhileTheCommandRuns) {
  sandbox::CaptureOptions options;
  options.timeout = 20s;
  options.progress_interval = 100ms;
  std::vector<std::chrono::milliseconds> seen;
  options.progress = [&](const sandbox::CaptureProgress& p) { seen.push_back(p.elapsed); };
  const auto c = run(sh("sleep 0.45"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::finished);
  ASSERT_GE(seen.size(), 3u);
  EXPECT_LT(seen.front(), seen.back());
}

// Each progress call sees the output kept so far, so a long command can be followed as it runs.
TEST(CapturePump, ProgressSeesTheOutputSoFar) {
  sandbox::CaptureOptions options;
  options.timeout = 20s;
  options.progress_interval = 100ms;
  std::vector<std::string> seen;
  options.progress = [&](const sandbox::CaptureProgress& p) { seen.emplace_back(p.out); };
  const auto c = run(sh("echo one; sleep 0.5; echo two; sleep 0.5"), options);
  EXPECT_EQ(c.result.out, "one\ntwo\n");
  EXPECT_NE(std::find(seen.begin(), seen.end(), "one\n"), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), "one\ntwo\n"), seen.end());
}

// A background process still holding the pipes when the command exits: what it writes within
// the drain grace is kept, and the pump does not wait for it beyond the grace.
TEST(CapturePump, TheDrainAfterTheEndIsBoundedByTheGrace) {
  sandbox::CaptureOptions options;
  options.timeout = 20s;
  options.drain_grace = 600ms;
  const auto c = run(sh("echo first; (sleep 0.2; echo late) & (sleep 1.5; echo too-late) & exit 0"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::finished);
  EXPECT_EQ(c.result.out, "first\nlate\n");
  EXPECT_LT(c.result.duration, 1400ms);
  EXPECT_EQ(c.kills, 0);
}

TEST(CapturePump, WriteThroughSinksGetTheOutputAsItComes) {
  UniqueFd out(::memfd_create("out", MFD_CLOEXEC)), err(::memfd_create("err", MFD_CLOEXEC));
  ASSERT_TRUE(out && err);
  sandbox::CaptureOptions options;
  options.timeout = 20s;
  options.out = sandbox::Sink::write_to(out.get());
  options.err = sandbox::Sink::write_to(err.get());
  const auto c = run(sh("echo to-out; echo to-err >&2"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::finished);
  EXPECT_EQ(c.result.out, "");  // written through, not kept
  auto contents = [](int fd) {
    char buf[64] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
    return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  };
  EXPECT_EQ(contents(out.get()), "to-out\n");
  EXPECT_EQ(contents(err.get()), "to-err\n");
}

TEST(CapturePump, ASinkThatIsGoneDoesNotStopTheCommand) {
  nshpc::Pipe gone = nshpc::make_pipe();
  gone.read.reset();  // writing there: EPIPE (SIGPIPE blocked by the pump)
  sandbox::CaptureOptions options;
  options.timeout = 20s;
  options.out = sandbox::Sink::write_to(gone.write.get());
  const auto c = run(sh("echo one; echo two; exit 4"), options);
  EXPECT_EQ(c.result.ending, sandbox::Ending::finished);
  EXPECT_EQ(c.result.status.exit_code, 4);
}

}  // namespace
