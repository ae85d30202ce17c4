// Backend::attach: finding an execution again from its handle (after a server restart), without
// a sandbox — the status file is written here, and children of the test stand for a sandbox init
// (identified by pid and pid namespace) or a job keeper (holding the status file open). The bwrap
// backend reads its own handles (and the untyped ones of earlier releases), never another's.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "base/fs.hpp"
#include "base/json.hpp"
#include "common/temp_dir.hpp"
#include "config/config.hpp"
#include "sandbox/execution.hpp"
#include "sandbox/handle.hpp"
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

// A paused child killed and reaped however the test ends.
struct PausedChild {
  pid_t pid = paused_child();
  ~PausedChild() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

std::uint64_t pid_namespace_of(pid_t pid) {
  struct stat st {};
  ::stat(fmt::format("/proc/{}/ns/pid", pid).c_str(), &st);
  return st.st_ino;
}

class Attach : public ::testing::Test {
 protected:
  void write(const json& doc) { std::ofstream(status_, std::ios::app) << doc.dump() << "\n"; }
  sandbox::ExecutionHandle handle() const { return {"bwrap", 1, {{"status_path", status_.string()}, {"pid", 12345}}}; }
  std::unique_ptr<sandbox::Execution> attach(const sandbox::ExecutionHandle& h) { return backend_->attach(h); }
  std::unique_ptr<sandbox::Execution> attach() { return attach(handle()); }

  nshpc::tests::TempDir tmp_{"nshpc-attach"};
  fs::path status_ = tmp_.path() / "job.status";
  std::unique_ptr<sandbox::Backend> backend_ = sandbox::make_bwrap_backend(nshpc::config::built_in());
};

TEST_F(Attach, NothingOnRecordIsNeverStarted) {
  std::ofstream(status_).flush();
  auto exec = attach();
  EXPECT_EQ(exec->seen(), sandbox::Seen::never_started);
  EXPECT_TRUE(exec->ended());
  const auto st = exec->wait();
  EXPECT_FALSE(st.started);
  EXPECT_TRUE(st.error.empty());
  // A handle that names no status file at all is the same, and so is no handle.
  EXPECT_EQ(attach({"bwrap", 1, json::object()})->seen(), sandbox::Seen::never_started);
  EXPECT_EQ(attach({})->seen(), sandbox::Seen::never_started);
}

TEST_F(Attach, AnExitCodeOnRecordIsHowItEnded) {
  write({{"child-pid", 999999}, {"pid-namespace", 4026531836u}});
  write({{"exit-code", 3}});
  auto exec = attach();
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
  auto exec = attach();
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
  auto exec = attach();
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
  auto exec = attach();
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
  EXPECT_EQ(attach()->seen(), sandbox::Seen::never_started);
  write({{sandbox::kKeeperKey, keeper}});
  auto exec = attach();
  EXPECT_EQ(exec->seen(), sandbox::Seen::keeper);
  EXPECT_FALSE(exec->ended());
  for (pid_t p : {keeper, impostor}) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

// The cgroups of the handle are the execution's (and groups that are gone are no error); its
// handle is given back as it came.
TEST_F(Attach, TheHandleComesBackAsItWasGiven) {
  std::ofstream(status_).flush();
  const sandbox::ExecutionHandle h{
      "bwrap", 1, {{"status_path", status_.string()}, {"cgroups", {"/sys/fs/cgroup/ns-hpc/no-such-instance/0123456789ab"}}}};
  auto exec = attach(h);
  EXPECT_EQ(exec->seen(), sandbox::Seen::never_started);
  EXPECT_EQ(exec->handle(), h);
}

// An earlier release's untyped handle (version 0) holds the same data: found the same.
TEST_F(Attach, AnEarlierReleasesUntypedHandleIsBwraps) {
  write({{"child-pid", 999999}, {"pid-namespace", 4026531836u}});
  write({{"exit-code", 7}});
  auto exec = attach(sandbox::ExecutionHandle::untyped({{"status_path", status_.string()}, {"pid", 4343}}));
  EXPECT_EQ(exec->seen(), sandbox::Seen::exited);
  EXPECT_EQ(exec->wait().exit_code, 7);
}

// Another backend's handle is never read as bwrap's, though its data looks like bwrap's: nothing
// of it is known here, nothing is done to it, and what wait() says names whose it is.
TEST_F(Attach, AnotherBackendsHandleIsNeverReadAsBwraps) {
  const PausedChild child;
  const pid_t init = child.pid;
  write({{"child-pid", init}, {"pid-namespace", pid_namespace_of(init)}});
  const sandbox::ExecutionHandle foreign{"crun", 1, {{"status_path", status_.string()}, {"pid", init}}};
  auto exec = attach(foreign);
  EXPECT_EQ(exec->seen(), sandbox::Seen::unreadable);
  EXPECT_TRUE(exec->ended());
  EXPECT_EQ(exec->handle(), foreign);  // kept for whoever can read it
  exec->signal(SIGTERM);
  exec->kill_tree(true);
  const auto st = exec->wait();
  EXPECT_FALSE(st.started);
  EXPECT_NE(st.error.find("'crun' backend"), std::string::npos) << st.error;
  EXPECT_NE(st.error.find("does not have"), std::string::npos) << st.error;
  EXPECT_EQ(::kill(init, 0), 0) << "another backend's sandbox was signalled";
}

// A handle of a version this release does not write (a newer release's) is not guessed at.
TEST_F(Attach, AHandleOfANewerVersionIsUnreadable) {
  write({{"child-pid", 999999}, {"pid-namespace", 4026531836u}});
  write({{"exit-code", 0}});
  auto exec = attach({"bwrap", sandbox::ExecutionHandle::kVersion + 1, {{"status_path", status_.string()}}});
  EXPECT_EQ(exec->seen(), sandbox::Seen::unreadable);
  EXPECT_NE(exec->wait().error.find(fmt::format("version {}", sandbox::ExecutionHandle::kVersion + 1)),
            std::string::npos);
}

TEST(ExecutionHandle, TheTypedFormRoundTripsAndAnythingElseIsNone) {
  const sandbox::ExecutionHandle h{"bwrap", 1, {{"status_path", "/s"}, {"pid", 3}}};
  const json on_disk = nshpc::parse_json(R"({"backend": "bwrap", "version": 1, "data": {"status_path": "/s", "pid": 3}})");
  EXPECT_EQ(h.to_json(), on_disk);
  EXPECT_EQ(sandbox::ExecutionHandle::from_json(on_disk), h);
  for (const char* text : {R"({"status_path": "/s", "pid": 3})",          // untyped: an earlier release's
                           R"({"backend": "bwrap", "version": 1, "data": 7})",
                           R"({"backend": "", "version": 1, "data": {}})",
                           R"({"backend": 3, "version": 1, "data": {}})",
                           R"({"backend": "bwrap", "version": "1", "data": {}})",
                           R"({"backend": "bwrap", "version": -1, "data": {}})",
                           R"({"backend": "bwrap", "data": {}})", "[]", "null"})
    EXPECT_FALSE(sandbox::ExecutionHandle::from_json(nshpc::parse_json(text))) << text;
}

// A living sandbox's record: its handle in sandbox.handle; an earlier release's folder has the
// status file alone, read as bwrap's untyped handle. The bwrap backend finds the sandbox from
// either, and never from another backend's.
class LivingRecord : public ::testing::Test {
 protected:
  void write_status(const json& doc) {
    std::ofstream(tmp_.path() / sandbox::kLivingStatusFile, std::ios::app) << doc.dump() << "\n";
  }
  void write_handle(const std::string& text) { std::ofstream(tmp_.path() / sandbox::kLivingHandleFile) << text; }
  std::string status_path() const { return (tmp_.path() / sandbox::kLivingStatusFile).string(); }

  nshpc::tests::TempDir tmp_{"nshpc-living-record"};
  std::unique_ptr<sandbox::Backend> backend_ = sandbox::make_bwrap_backend(nshpc::config::built_in());
};

TEST_F(LivingRecord, NothingOnRecordIsNoHandle) {
  EXPECT_FALSE(sandbox::read_living_handle(tmp_.path()));
}

TEST_F(LivingRecord, AnEarlierReleasesFolderIsReadAsBwrapsAndItsSandboxFound) {
  std::optional<PausedChild> child(std::in_place);
  const pid_t init = child->pid;
  write_status({{sandbox::kKeeperKey, 999999}, {sandbox::kStartedKey, 1000}});
  write_status({{"child-pid", init}, {"pid-namespace", pid_namespace_of(init)}});
  const auto handle = sandbox::read_living_handle(tmp_.path());
  ASSERT_TRUE(handle);
  EXPECT_EQ(*handle, (sandbox::ExecutionHandle{"bwrap", 0, {{"status_path", status_path()}}}));
  EXPECT_EQ(backend_->attach(*handle)->seen(), sandbox::Seen::running);
  child.reset();  // killed and reaped
  EXPECT_EQ(backend_->attach(*handle)->seen(), sandbox::Seen::vanished);
}

TEST_F(LivingRecord, TheHandleOnRecordNamesItsStatusFile) {
  write_status({{sandbox::kKeeperKey, 999999}, {sandbox::kStartedKey, 1000}});
  write_status({{"child-pid", 999998}, {"pid-namespace", 4026531836u}});
  write_status({{"exit-code", 137}});
  const sandbox::ExecutionHandle written{"bwrap", 1, {{"status_path", status_path()}}};
  sandbox::write_living_handle(tmp_.path(), written);
  const std::string text = nshpc::fs::read_file(tmp_.path() / sandbox::kLivingHandleFile).value_or("");
  EXPECT_EQ(nshpc::parse_json(text),
            nshpc::parse_json(fmt::format(R"({{"backend": "bwrap", "version": 1, "data": {{"status_path": "{}"}}}})",
                                          status_path())));
  const auto handle = sandbox::read_living_handle(tmp_.path());
  ASSERT_TRUE(handle);
  EXPECT_EQ(*handle, written);
  EXPECT_EQ(backend_->attach(*handle)->seen(), sandbox::Seen::exited);
  // A file that is no handle (cut short) is not one: the status file is, as an earlier release's.
  write_handle(R"({"backend": "bwrap", "vers)");
  EXPECT_EQ(sandbox::read_living_handle(tmp_.path())->version, 0);
}

TEST_F(LivingRecord, AnotherBackendsLivingSandboxIsNotBwraps) {
  write_status({{"child-pid", 999998}, {"pid-namespace", 4026531836u}});
  write_handle(fmt::format(R"({{"backend": "crun", "version": 1, "data": {{"status_path": "{}"}}}})", status_path()));
  const auto handle = sandbox::read_living_handle(tmp_.path());
  ASSERT_TRUE(handle);
  EXPECT_EQ(handle->backend, "crun");
  EXPECT_EQ(backend_->attach(*handle)->seen(), sandbox::Seen::unreadable);
  // Nor does the bwrap backend say it runs, or ever ran, as its own.
  sandbox::Target target;
  target.instance_id = "other";
  target.state_dir = tmp_.path();
  target.persistent = true;
  const sandbox::LivingStatus st = backend_->living_status(target);
  EXPECT_FALSE(st.running);
  EXPECT_NE(st.last_end.find("'crun' backend"), std::string::npos) << st.last_end;
}

}  // namespace
