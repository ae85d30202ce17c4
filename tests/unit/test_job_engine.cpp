// The job engine against a fake sandbox backend: no bwrap, no kernel namespaces. A fake process
// ends when the test says so (its wait fd, an eventfd, becomes readable); its wait() can be held
// at a gate to stand for a slow finish.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/time.hpp"
#include "instances/instances.hpp"
#include "common/temp_dir.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/execution.hpp"
#include "store/store.hpp"

namespace {

namespace fs = std::filesystem;
namespace jobs = nshpc::jobs;
namespace sandbox = nshpc::sandbox;
namespace store = nshpc::store;
using namespace std::chrono_literals;

// One fake sandbox run: what the engine did to it, and the test's controls.
struct FakeRun {
  nshpc::UniqueFd fd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;
  int exit_code = -1;
  bool gate_open = true;   // wait() returns only while open
  bool in_wait = false;
  bool waited = false;     // wait() returned: the process is reaped
  int kills = 0;
  int kills_after_reap = 0;  // kill() during or after wait(): a reaped pid may be someone else's
  bool disowned = false;
  std::vector<std::string> argv;

  void end(int code) {
    {
      std::lock_guard lock(mu);
      if (ended) return;
      ended = true;
      exit_code = code;
    }
    std::uint64_t one = 1;
    ASSERT_EQ(::write(fd.get(), &one, sizeof one), static_cast<ssize_t>(sizeof one));
    cv.notify_all();
  }
  void set_gate(bool open) {
    {
      std::lock_guard lock(mu);
      gate_open = open;
    }
    cv.notify_all();
  }
  // Waits (bounded) until kill() was called.
  bool wait_killed(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return kills > 0; });
  }
  // Waits (bounded) until wait() is entered.
  bool wait_entered(std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return in_wait; });
  }
};

class FakeProcess final : public sandbox::Process {
 public:
  explicit FakeProcess(std::shared_ptr<FakeRun> run) : run_(std::move(run)) {}
  pid_t pid() const override { return 0; }
  pid_t sandbox_pid() const override { return 0; }
  int pidfd() const override { return run_->fd.get(); }
  sandbox::ExitStatus wait() override {
    std::unique_lock lock(run_->mu);
    run_->in_wait = true;
    run_->cv.notify_all();
    run_->cv.wait(lock, [&] { return run_->ended && run_->gate_open; });
    run_->in_wait = false;
    run_->waited = true;
    run_->cv.notify_all();
    sandbox::ExitStatus st;
    st.started = true;
    st.exit_code = run_->exit_code;
    return st;
  }
  void kill() override {
    {
      std::lock_guard lock(run_->mu);
      ++run_->kills;
      if (run_->in_wait || run_->waited) ++run_->kills_after_reap;
    }
    run_->cv.notify_all();
    run_->end(128 + 9);
  }
  void disown() override { run_->disowned = true; }

 private:
  std::shared_ptr<FakeRun> run_;
};

class FakeBackend final : public sandbox::Backend {
 public:
  std::string_view name() const override { return "fake"; }
  std::unique_ptr<sandbox::Process> start(const sandbox::RunSpec& spec) override {
    auto run = std::make_shared<FakeRun>();
    run->argv = spec.argv;
    {
      std::lock_guard lock(mu_);
      runs_.push_back(run);
    }
    return std::make_unique<FakeProcess>(run);
  }
  sandbox::LivingStatus living_status(const sandbox::Target&) override { return {}; }
  sandbox::LivingStatus start_living(const sandbox::Target&) override { return {}; }
  bool change_network(const sandbox::Target&) override { return false; }
  bool stop_living(const sandbox::Target&, std::string_view, std::chrono::milliseconds) override { return false; }
  std::vector<sandbox::LivingProcess> living_processes(const sandbox::Target&) override { return {}; }
  bool commands_share_pids() const override { return false; }
  std::vector<std::string> end_stray_sandboxes(const std::filesystem::path&) override { return {}; }
  std::vector<std::string> describe(const sandbox::RunSpec& spec) const override { return spec.argv; }
  // Its runs are execute()'s, with execute()'s status file: found again from it, as bwrap's are.
  // Another backend's handle is not its to read.
  std::unique_ptr<sandbox::Execution> attach(const sandbox::ExecutionHandle& handle) override {
    if (handle.backend == name()) return sandbox::attach_by_status_file(handle);
    return Backend::attach(handle);
  }

  std::shared_ptr<FakeRun> run(std::size_t i) {
    std::lock_guard lock(mu_);
    return i < runs_.size() ? runs_[i] : nullptr;
  }
  std::size_t started() {
    std::lock_guard lock(mu_);
    return runs_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<FakeRun>> runs_;
};

class JobEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.ns.instances_dir = tmp_.path() / "instances";
    config_.server.state_dir = tmp_.path() / "state";
    config_.ns.sandbox_uid = static_cast<uint32_t>(::getuid());  // no chown in unit tests
    config_.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
    config_.jobs.local.use_cgroups = false;
    config_.jobs.cancel_grace = 1;
    instances_ = std::make_unique<nshpc::instances::Service>(config_, std::move(owned_backend_));
    instances_->create("demo", {}, "test");
  }
  void TearDown() override {
    // Whatever a test left running ends, so the watcher has nothing to wait for.
    for (std::size_t i = 0; backend_.run(i); ++i) {
      backend_.run(i)->set_gate(true);
      backend_.run(i)->end(0);
    }
    instances_.reset();
  }
  // The instances service's engine (archive and delete ask it whether jobs still run).
  jobs::Engine& engine() { return instances_->jobs(); }
  jobs::Record submit(const std::string& command = "echo hi") {
    jobs::SubmitRequest req;
    req.instance_id = "demo";
    req.argv = {"/bin/sh", "-c", command};
    return engine().submit(req, "test");
  }
  jobs::View wait(const std::string& job_id, std::chrono::milliseconds timeout = 10s) {
    return engine().wait("demo", job_id, timeout, {0, 0});
  }
  fs::path base() const { return config_.ns.instances_dir / "demo"; }
  fs::path state_file(const std::string& job_id) const { return base() / ".ns_hpc_jobs" / (job_id + ".state"); }
  // Audit lines of the instance with this event.
  std::size_t audited(const std::string& event, const std::string& job_id) const {
    std::ifstream in(base() / "audit.log");
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);) {
      auto j = nshpc::parse_json_or_discarded(line);
      if (j.is_object() && j.value("event", "") == event && j.value("job_id", "") == job_id) ++n;
    }
    return n;
  }

  nshpc::tests::TempDir tmp_{"nshpc-jobengine"};
  nshpc::config::Config config_ = nshpc::config::built_in();
  std::unique_ptr<FakeBackend> owned_backend_ = std::make_unique<FakeBackend>();
  FakeBackend& backend_ = *owned_backend_;  // owned by instances_ once it is made
  std::unique_ptr<nshpc::instances::Service> instances_;
};

TEST_F(JobEngine, AJobRunsAndItsEndIsRecordedOnce) {
  const auto rec = submit("exit 3");
  EXPECT_EQ(rec.state, jobs::State::running);
  ASSERT_EQ(backend_.started(), 1u);
  EXPECT_EQ(backend_.run(0)->argv, (std::vector<std::string>{"/bin/sh", "-c", "exit 3"}));
  EXPECT_EQ(engine().tracked(), 1u);
  backend_.run(0)->end(3);
  const auto v = wait(rec.id);
  EXPECT_EQ(v.record.state, jobs::State::failed);
  EXPECT_EQ(v.record.exit_code, 3);
  EXPECT_EQ(v.record.reason, "exit code 3");
  EXPECT_EQ(audited("job.failed", rec.id), 1u);
  EXPECT_EQ(engine().tracked(), 0u);
}

// On disk {"handle": {"backend", "version", "data"}}: whose it is, beside what only that backend
// reads.
TEST_F(JobEngine, TheRecordKeepsATypedHandleThatNamesItsBackend) {
  const auto rec = submit();
  EXPECT_EQ(rec.handle.backend, "fake");
  EXPECT_EQ(rec.handle.version, sandbox::ExecutionHandle::kVersion);
  EXPECT_TRUE(rec.handle.data.contains("status_path"));
  const auto on_disk = nshpc::parse_json(nshpc::fs::read_file(state_file(rec.id)).value_or(""));
  EXPECT_EQ(on_disk["handle"], rec.handle.to_json());
  EXPECT_EQ(on_disk["handle"]["backend"], "fake");
  for (const char* old : {"backend", "cgroups", "bwrap_pid", "status_path", "pid"})
    EXPECT_FALSE(on_disk.contains(old)) << old;
}

TEST_F(JobEngine, CancelKillsARunningJobAndRecordsItCancelled) {
  const auto rec = submit("sleep 100");
  const auto after = engine().cancel("demo", rec.id, "test");
  EXPECT_EQ(after.state, jobs::State::cancelled);
  EXPECT_EQ(backend_.run(0)->kills, 1);  // SIGTERM reached nothing (no namespace): killed after the grace
  EXPECT_EQ(audited("job.cancelled", rec.id), 1u);
}

TEST_F(JobEngine, TheCapsRefuseOneJobTooMany) {
  config_.jobs.max_running_per_instance = 2;
  submit();
  submit();
  EXPECT_THROW(submit(), nshpc::UsageError);
  backend_.run(0)->end(0);
  wait(engine().list("demo").back().id);
}

TEST_F(JobEngine, AnArchiveIsRefusedWhileAJobRuns) {
  const auto rec = submit();
  EXPECT_THROW(instances_->archive("demo", "test"), nshpc::UsageError);
  backend_.run(0)->end(0);
  EXPECT_EQ(wait(rec.id).record.state, jobs::State::completed);
  instances_->archive("demo", "test");
  EXPECT_FALSE(fs::exists(base()));
}

// Found by the submit, then archived before its record was written: the archive must wait for
// the pending record (and then refuse), never leave a job folder where the instance was.
TEST_F(JobEngine, AnArchiveDuringASubmitWaitsForItAndIsRefused) {
  std::future<void> archive;
  std::atomic<bool> archived{false};
  jobs::EngineHooks hooks;
  hooks.instance_found = [&](const std::string&) {
    if (archive.valid()) return;
    archive = std::async(std::launch::async, [&] {
      instances_->archive("demo", "test");
      archived = true;
    });
    // Unless the submit holds archives off, the archive runs to its end here.
    archive.wait_for(500ms);
  };
  engine().set_hooks(hooks);
  const auto rec = submit();
  EXPECT_THROW(archive.get(), nshpc::UsageError);
  EXPECT_FALSE(archived && fs::exists(base() / ".ns_hpc_jobs")) << "a job folder recreated after the archive";
  EXPECT_FALSE(archived && fs::exists(base() / "status")) << "a status folder recreated after the archive";
  EXPECT_EQ(rec.state, jobs::State::running);
}

// A job an earlier server left running, looked at by two callers at once: watched once.
TEST_F(JobEngine, AJobLeftByAnotherProcessIsAdoptedOnceWhenTwoLookAtOnce) {
  // Its sandbox init: a child of ours, named (with its pid namespace) in the job's status file.
  const pid_t init = ::fork();
  ASSERT_GE(init, 0);
  if (init == 0) {
    ::pause();
    ::_exit(0);
  }
  struct stat ns;
  ASSERT_EQ(::stat(fmt::format("/proc/{}/ns/pid", init).c_str(), &ns), 0);
  const std::string id = "0123456789ab";
  const fs::path status = base() / "status" / (id + ".status");
  fs::create_directories(status.parent_path());
  fs::create_directories(base() / ".ns_hpc_jobs");
  std::ofstream(status) << nlohmann::json{{"child-pid", init}, {"pid-namespace", ns.st_ino}}.dump() << "\n";
  const std::string now = nshpc::timeutil::iso_utc();
  std::ofstream(state_file(id)) << nlohmann::json{{"job_id", id},
                                                  {"instance_id", "demo"},
                                                  {"command", "sleep 100"},
                                                  {"mode", "local"},
                                                  {"status", "running"},
                                                  {"created_at", now},
                                                  {"started_at", now},
                                                  // Its cgroups are gone already.
                                                  {"handle", sandbox::ExecutionHandle{
                                                                 "fake", 1,
                                                                 {{"status_path", status.string()},
                                                                  {"pid", 1},
                                                                  {"cgroups", {"/sys/fs/cgroup/ns-hpc/demo/" + id}}}}
                                                                 .to_json()}}
                                       .dump();
  std::atomic<int> adoptions{0};
  std::future<jobs::View> other;
  jobs::EngineHooks hooks;
  hooks.adopting = [&](const std::string&) {
    if (adoptions++ > 0) return;
    other = std::async(std::launch::async, [&] { return engine().view("demo", id, {0, 0}); });
    other.wait_for(2s);  // the second look runs to its end unless the first one holds the job
  };
  engine().set_hooks(hooks);
  EXPECT_EQ(engine().view("demo", id, {0, 0}).record.state, jobs::State::running);
  EXPECT_EQ(other.get().record.state, jobs::State::running);
  EXPECT_EQ(adoptions, 1);
  EXPECT_EQ(engine().tracked(), 1u);
  // It ends: the exit code on record, then the init goes.
  std::ofstream(status, std::ios::app) << nlohmann::json{{"exit-code", 0}}.dump() << "\n";
  ::kill(init, SIGKILL);
  EXPECT_EQ(wait(id).record.state, jobs::State::completed);
  EXPECT_EQ(audited("job.completed", id), 1u);
  ::waitpid(init, nullptr, WNOHANG);
}

// A job on record as another backend's (its exit code in a status file this backend could
// read): never read as this backend's, nor signalled. Its submitter is gone, so nobody can follow
// it: it is lost, and the reason says whose it was.
TEST_F(JobEngine, AJobOfABackendThisServerDoesNotHaveIsLostNamingIt) {
  const std::string id = "00aa11bb22cc";
  const fs::path status = base() / "status" / (id + ".status");
  fs::create_directories(status.parent_path());
  fs::create_directories(base() / ".ns_hpc_jobs");
  std::ofstream(status) << nlohmann::json{{"child-pid", 999999}, {"pid-namespace", 4026531836u}}.dump() << "\n"
                        << nlohmann::json{{"exit-code", 0}}.dump() << "\n";
  const std::string now = nshpc::timeutil::iso_utc();
  std::ofstream(state_file(id)) << nlohmann::json{{"job_id", id},
                                                  {"instance_id", "demo"},
                                                  {"command", "true"},
                                                  {"mode", "local"},
                                                  {"status", "running"},
                                                  {"created_at", now},
                                                  {"started_at", now},
                                                  {"owner_pid", 0},
                                                  {"handle", {{"backend", "crun"},
                                                              {"version", 1},
                                                              {"data", {{"status_path", status.string()}}}}}}
                                       .dump();
  const auto v = wait(id);
  EXPECT_EQ(v.record.state, jobs::State::lost);
  EXPECT_NE(v.record.reason.find("'crun' backend"), std::string::npos) << v.record.reason;
  EXPECT_FALSE(v.record.exit_code) << "another backend's status was read as this one's";
  EXPECT_EQ(audited("job.lost", id), 1u);
  // Its handle stays on record as it was.
  const auto on_disk = nshpc::parse_json(nshpc::fs::read_file(state_file(id)).value_or(""));
  EXPECT_EQ(on_disk["handle"]["backend"], "crun");
}

// A job that ends by itself while a cancel waits out its grace, its finish slow: the cancel must
// not signal the process once its finish has begun (its pid may be reaped and reused by then).
TEST_F(JobEngine, ACancelLeavesAJobBeingFinishedAlone) {
  const auto rec = submit("sleep 100");
  auto run = backend_.run(0);
  run->set_gate(false);
  auto cancel = std::async(std::launch::async, [&] { return engine().cancel("demo", rec.id, "test"); });
  // The cancel has been asked for (then it waits out the grace of 1 s).
  for (int i = 0; i < 500 && audited("job.cancel_requested", rec.id) == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(audited("job.cancel_requested", rec.id), 1u);
  run->end(0);
  ASSERT_TRUE(run->wait_entered());  // its finish is under way, held in wait()
  run->wait_killed(2500ms);          // past the grace: a kill now would be one too many
  run->set_gate(true);
  const auto after = cancel.get();
  EXPECT_EQ(run->kills_after_reap, 0);
  EXPECT_TRUE(jobs::is_final(after.state));
  EXPECT_EQ(audited("job." + jobs::to_string(after.state), rec.id), 1u);
}

// One job's finish is slow: the watcher goes on with the others.
TEST_F(JobEngine, AnotherJobsEndIsRecordedWhileOneIsBeingFinished) {
  const auto slow = submit();
  const auto quick = submit();
  backend_.run(0)->set_gate(false);
  backend_.run(0)->end(0);
  ASSERT_TRUE(backend_.run(0)->wait_entered());
  backend_.run(1)->end(0);
  EXPECT_EQ(wait(quick.id, 3s).record.state, jobs::State::completed);
  backend_.run(0)->set_gate(true);
  EXPECT_EQ(wait(slow.id).record.state, jobs::State::completed);
}

}  // namespace
