// sandbox::attach: finding an execution again from its handle (after a server restart), without
// a sandbox — the status file is written here, and children of the test stand for a sandbox init
// (identified by pid and pid namespace) or a job keeper (holding the status file open).
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "base/json.hpp"
#include "common/temp_dir.hpp"
#include "sandbox/execution.hpp"
#include "sandbox/status.hpp"

namespace {

namespace fs = std::filesystem;
namespace sandbox = nshpc::sandbox;
using nlohmann::json;

// A child that waits to be killed, after opening `hold` (when given) so that it holds it open.
pid_t paused_child(const fs::path& hold = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!hold.empty() && ::open(hold.c_str(), O_RDONLY) < 0) ::_exit(1);
    for (;;) ::pause();
  }
  return pid;
}

std::uint64_t pid_namespace_of(pid_t pid) {
  struct stat st {};
  ::stat(fmt::format("/proc/{}/ns/pid", pid).c_str(), &st);
  return st.st_ino;
}

class Attach : public ::testing::Test {
 protected:
  void write(const json& doc) { std::ofstream(status_, std::ios::app) << doc.dump() << "\n"; }
  json handle() const { return {{"status_path", status_.string()}, {"pid", 12345}}; }

  nshpc::tests::TempDir tmp_{"nshpc-attach"};
  fs::path status_ = tmp_.path() / "job.status";
};

TEST_F(Attach, NothingOnRecordIsNeverStarted) {
  std::ofstream(status_).flush();
  auto exec = sandbox::attach(handle());
  EXPECT_EQ(exec->seen(), sandbox::Seen::never_started);
  EXPECT_TRUE(exec->ended());
  const auto st = exec->wait();
  EXPECT_FALSE(st.started);
  EXPECT_TRUE(st.error.empty());
  // A handle that names no status file at all is the same.
  EXPECT_EQ(sandbox::attach(json::object())->seen(), sandbox::Seen::never_started);
}

TEST_F(Attach, AnExitCodeOnRecordIsHowItEnded) {
  write({{"child-pid", 999999}, {"pid-namespace", 4026531836u}});
  write({{"exit-code", 3}});
  auto exec = sandbox::attach(handle());
  EXPECT_EQ(exec->seen(), sandbox::Seen::exited);
  const auto st = exec->wait();
  EXPECT_TRUE(st.started);
  EXPECT_EQ(st.exit_code, 3);
  ASSERT_TRUE(st.ended_at.has_value());  // bwrap's last write: the file's time
  EXPECT_LT(std::chrono::system_clock::now() - *st.ended_at, std::chrono::minutes(1));
  EXPECT_FALSE(exec->enforces_time_limit());  // an earlier release's sandbox: no keeper
}

TEST_F(Attach, AKeepersReportOfTheEndAndTheDeadlineAreKept) {
  write({{sandbox::kKeeperKey, 999999}, {sandbox::kStartedKey, 1000}});
  write({{"child-pid", 999998}, {"pid-namespace", 4026531836u}});
  write({{sandbox::kDeadlineKey, 2000}});
  write({{"exit-code", 143}});
  write({{sandbox::kEndedKey, 3000}});
  auto exec = sandbox::attach(handle());
  EXPECT_TRUE(exec->enforces_time_limit());
  const auto st = exec->wait();
  EXPECT_TRUE(st.timed_out);
  EXPECT_EQ(st.exit_code, 143);
  EXPECT_EQ(st.ended_at, std::chrono::system_clock::time_point(std::chrono::milliseconds(3000)));
}

// A sandbox init that runs: found by pid and pid namespace; SIGKILL at the end, reaped.
TEST_F(Attach, ARunningInitIsWatchedAndKilledAtTheEnd) {
  const pid_t init = paused_child();
  write({{"child-pid", init}, {"pid-namespace", pid_namespace_of(init)}});
  auto exec = sandbox::attach(handle());
  ASSERT_EQ(exec->seen(), sandbox::Seen::running);
  EXPECT_FALSE(exec->ended());
  // The exit code on record ends it, though the init (an earlier release's) still runs.
  write({{"exit-code", 0}});
  EXPECT_TRUE(exec->ended());
  const auto st = exec->wait();
  EXPECT_EQ(st.exit_code, 0);
  EXPECT_EQ(::kill(init, 0), -1) << "the init outlived its execution";  // killed and reaped
}

// The same pid in another pid namespace is someone else: not the execution's init.
TEST_F(Attach, APidOfAnotherNamespaceIsNotTheInit) {
  const pid_t other = paused_child();
  write({{"child-pid", other}, {"pid-namespace", pid_namespace_of(other) + 1}});
  auto exec = sandbox::attach(handle());
  EXPECT_EQ(exec->seen(), sandbox::Seen::vanished);
  exec->kill_tree(true);  // must reach nothing
  EXPECT_EQ(::kill(other, 0), 0);
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
}

// A keeper's pid is only a claim: it counts while that process holds the status file open.
TEST_F(Attach, AKeeperIsRecognisedByTheStatusFileItHoldsOpen) {
  std::ofstream(status_).flush();
  const pid_t keeper = paused_child(status_);
  const pid_t impostor = paused_child();
  write({{sandbox::kKeeperKey, impostor}});
  // Until the keeper stand-in has opened the file.
  auto holds = [&] {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator(fmt::format("/proc/{}/fd", keeper), ec))
      if (fs::read_symlink(fd.path(), ec) == fs::canonical(status_)) return true;
    return false;
  };
  for (int i = 0; i < 400 && !holds(); ++i) ::usleep(5000);
  ASSERT_TRUE(holds());
  EXPECT_EQ(sandbox::attach(handle())->seen(), sandbox::Seen::never_started);
  write({{sandbox::kKeeperKey, keeper}});
  auto exec = sandbox::attach(handle());
  EXPECT_EQ(exec->seen(), sandbox::Seen::keeper);
  EXPECT_FALSE(exec->ended());
  for (pid_t p : {keeper, impostor}) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

// A record of the previous release keeps the job's cgroups beside the handle: they become part
// of it (and groups that are gone are no error).
TEST_F(Attach, ThePreviousReleasesCgroupFieldJoinsTheHandle) {
  std::ofstream(status_).flush();
  const std::vector<std::string> legacy = {"/sys/fs/cgroup/ns-hpc/no-such-instance/0123456789ab"};
  auto exec = sandbox::attach({{"status_path", status_.string()}}, legacy);
  EXPECT_EQ(exec->handle()["cgroups"], json(legacy));
  EXPECT_EQ(exec->handle()["status_path"], status_.string());
  // A handle that has them already keeps its own.
  auto current = sandbox::attach({{"status_path", status_.string()}, {"cgroups", json::array()}}, legacy);
  EXPECT_EQ(current->handle()["cgroups"], json::array());
}

}  // namespace
