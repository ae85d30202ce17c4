// Job records on disk: what earlier releases wrote still loads (their handles as bwrap's untyped
// ones, found by the bwrap backend), and saves back in the typed form.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>

#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"
#include "base/text.hpp"
#include "common/temp_dir.hpp"
#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "jobs/support.hpp"
#include "sandbox/execution.hpp"

namespace {

using nshpc::jobs::Mode;
using nshpc::jobs::Record;
using nshpc::jobs::State;
using nshpc::sandbox::ExecutionHandle;

// Written by the release before records were serialised by nlohmann-json (a local job that
// completed and a Slurm job that failed), byte for byte.
constexpr const char* kOldLocal = R"({
  "argv": ["/bin/sh", "-c", "echo hi"],
  "cancel_requested": false,
  "cgroups": ["/sys/fs/cgroup/ns-hpc/demo/0123456789ab"],
  "command": "echo hi",
  "created_at": "2024-05-01T10:00:00.000Z",
  "exit_code": 0,
  "finished_at": "2024-05-01T10:00:01.500Z",
  "instance_id": "demo",
  "job_id": "0123456789ab",
  "limits": {"cpus": 2, "memory": 1024, "output": 100, "pids": 256, "time": 3600},
  "mode": "local",
  "owner_pid": 4242,
  "owner_start": 987654,
  "pid": 4343,
  "reason": "",
  "started_at": "2024-05-01T10:00:00.100Z",
  "status": "completed",
  "status_path": "/var/lib/ns-hpc/instances/demo/status/0123456789ab.status",
  "stderr_path": "/var/lib/ns-hpc/instances/demo/workspace/.ns_hpc_output/0123456789ab.err",
  "stdout_path": "/var/lib/ns-hpc/instances/demo/workspace/.ns_hpc_output/0123456789ab.out",
  "unenforced": ["memory: no writable memory controller"]
})";

constexpr const char* kOldSlurm = R"({
  "argv": ["/bin/sh", "-c", "exit 3"],
  "cancel_requested": false,
  "cgroups": [],
  "command": "exit 3",
  "created_at": "2024-05-01T10:00:00.000Z",
  "exit_code": 3,
  "finished_at": "2024-05-01T10:00:09.000Z",
  "instance_id": "demo",
  "job_id": "ba9876543210",
  "limits": {"cpus": 1},
  "mode": "slurm",
  "owner_pid": 4242,
  "owner_start": 987654,
  "pid": 0,
  "reason": "exit code 3",
  "scheduler_error": "",
  "scheduler_reason": "NonZeroExitCode",
  "scheduler_state": "FAILED",
  "signal": 0,
  "slurm_job_id": "17",
  "started_at": "2024-05-01T10:00:02.000Z",
  "status": "failed",
  "status_path": "",
  "stderr_path": "/w/.ns_hpc_output/ba9876543210.err",
  "stdout_path": "/w/.ns_hpc_output/ba9876543210.out",
  "unenforced": []
})";

// The old file as it is written now: its bwrap fields ("pid", "status_path") and its cgroups in
// the data of a typed handle of backend "bwrap", version 0; no handle when they were empty (a
// Slurm job).
nlohmann::json as_written_now(const char* old) {
  nlohmann::json j = nshpc::parse_json(old);
  nlohmann::json data = nlohmann::json::object();
  if (j["pid"] != 0) data["pid"] = j["pid"];
  if (j["status_path"] != "") data["status_path"] = j["status_path"];
  if (!j["cgroups"].empty()) data["cgroups"] = j["cgroups"];
  j.erase("pid");
  j.erase("status_path");
  j.erase("cgroups");
  if (!data.empty()) j["handle"] = {{"backend", "bwrap"}, {"version", 0}, {"data", data}};
  return j;
}

TEST(JobRecord, AnOldLocalRecordLoadsAndSavesBackTheSame) {
  auto r = Record::from_json(nshpc::parse_json(kOldLocal));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, "0123456789ab");
  EXPECT_EQ(r->instance_id, "demo");
  EXPECT_EQ(r->mode, Mode::local);
  EXPECT_EQ(r->state, State::completed);
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->handle, (ExecutionHandle{"bwrap", 0,
                                        {{"pid", 4343},  // read from "pid"
                                         {"status_path", "/var/lib/ns-hpc/instances/demo/status/0123456789ab.status"},
                                         {"cgroups", {"/sys/fs/cgroup/ns-hpc/demo/0123456789ab"}}}}));
  EXPECT_EQ(r->owner_start, 987654u);
  EXPECT_EQ(r->limits.at("memory"), 1024);
  EXPECT_EQ(r->argv, (std::vector<std::string>{"/bin/sh", "-c", "echo hi"}));
  EXPECT_EQ(r->unenforced.size(), 1u);
  EXPECT_FALSE(r->signal);
  EXPECT_EQ(r->to_json(), as_written_now(kOldLocal));  // no Slurm keys in a local record
  EXPECT_EQ(Record::from_json(r->to_json())->to_json(), r->to_json());
}

TEST(JobRecord, AnOldSlurmRecordLoadsAndSavesBackTheSame) {
  auto r = Record::from_json(nshpc::parse_json(kOldSlurm));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->mode, Mode::slurm);
  EXPECT_EQ(r->state, State::failed);
  EXPECT_EQ(r->slurm_job_id, "17");
  EXPECT_EQ(r->scheduler_state, "FAILED");
  EXPECT_EQ(r->signal, 0);
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->to_json(), as_written_now(kOldSlurm));
  EXPECT_TRUE(r->handle.empty());
}

// Written by the release before records kept a backend and a handle (bwrap_pid under its name),
// for a running job, byte for byte.
constexpr const char* kCurrentLocal = R"({
  "argv": ["/bin/sh", "-c", "sleep 100"],
  "bwrap_pid": 5151,
  "cancel_requested": false,
  "cgroups": [],
  "command": "sleep 100",
  "created_at": "2025-01-02T03:04:05.000Z",
  "exit_code": null,
  "finished_at": "",
  "instance_id": "demo",
  "job_id": "00112233aabb",
  "limits": {"cpus": 1, "memory": 512, "output": 100, "pids": 256, "time": 3600},
  "mode": "local",
  "owner_pid": 4242,
  "owner_start": 987654,
  "reason": "",
  "started_at": "2025-01-02T03:04:05.100Z",
  "status": "running",
  "status_path": "/var/lib/ns-hpc/instances/demo/status/00112233aabb.status",
  "stderr_path": "/var/lib/ns-hpc/instances/demo/workspace/.ns_hpc_output/00112233aabb.err",
  "stdout_path": "/var/lib/ns-hpc/instances/demo/workspace/.ns_hpc_output/00112233aabb.out",
  "unenforced": []
})";

TEST(JobRecord, ARecordOfTheCurrentReleaseLoadsWithItsBwrapFieldsAsTheHandle) {
  auto r = Record::from_json(nshpc::parse_json(kCurrentLocal));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, State::running);
  EXPECT_EQ(r->handle, (ExecutionHandle{
                           "bwrap", 0, {{"pid", 5151}, {"status_path", "/var/lib/ns-hpc/instances/demo/status/00112233aabb.status"}}}));
  const auto j = r->to_json();
  EXPECT_FALSE(j.contains("bwrap_pid"));
  EXPECT_FALSE(j.contains("status_path"));
  EXPECT_FALSE(j.contains("pid"));
  EXPECT_FALSE(j.contains("cgroups"));
  EXPECT_FALSE(j.contains("backend"));
  EXPECT_EQ(j["handle"]["backend"], "bwrap");
  EXPECT_EQ(Record::from_json(j)->to_json(), j);
  // A pending job's record (no pid yet) keeps its status file.
  auto pending = nshpc::parse_json(kCurrentLocal);
  pending["bwrap_pid"] = 0;
  pending["status"] = "pending";
  EXPECT_EQ(Record::from_json(pending)->handle,
            (ExecutionHandle{"bwrap", 0, {{"status_path", "/var/lib/ns-hpc/instances/demo/status/00112233aabb.status"}}}));
}

// Written by the release before handles were typed: the backend's name beside an untyped handle
// (its data as now), the cgroups of an even earlier record beside both; a running job, byte for
// byte.
constexpr const char* kUntypedHandle = R"({
  "argv": ["/bin/sh", "-c", "sleep 100"],
  "backend": "bwrap",
  "cancel_requested": false,
  "cgroups": ["/sys/fs/cgroup/ns-hpc/demo@x/44556677ccdd"],
  "command": "sleep 100",
  "created_at": "2025-06-07T08:09:10.000Z",
  "exit_code": null,
  "finished_at": "",
  "handle": {"pid": 6161, "status_path": "@STATUS@"},
  "instance_id": "demo",
  "job_id": "44556677ccdd",
  "limits": {"cpus": 1, "memory": 512, "output": 100, "pids": 256, "time": 3600},
  "mode": "local",
  "owner_pid": 4242,
  "owner_start": 987654,
  "reason": "",
  "started_at": "2025-06-07T08:09:10.100Z",
  "status": "running",
  "stderr_path": "/var/lib/ns-hpc/instances/demo/workspace/.ns_hpc_output/44556677ccdd.err",
  "stdout_path": "/var/lib/ns-hpc/instances/demo/workspace/.ns_hpc_output/44556677ccdd.out",
  "unenforced": []
})";

// As this release writes it: the handle typed.
constexpr const char* kTypedHandle = R"({
  "argv": ["/bin/sh", "-c", "sleep 100"],
  "cancel_requested": false,
  "command": "sleep 100",
  "created_at": "2026-01-02T03:04:05.000Z",
  "exit_code": null,
  "finished_at": "",
  "handle": {"backend": "bwrap", "version": 1,
             "data": {"cgroups": ["/sys/fs/cgroup/ns-hpc/demo@x/8899aabbccdd"], "pid": 7171, "status_path": "@STATUS@"}},
  "instance_id": "demo",
  "job_id": "8899aabbccdd",
  "limits": {"cpus": 1},
  "mode": "local",
  "owner_pid": 4242,
  "owner_start": 987654,
  "reason": "",
  "started_at": "2026-01-02T03:04:05.100Z",
  "status": "running",
  "stderr_path": "/w/.ns_hpc_output/8899aabbccdd.err",
  "stdout_path": "/w/.ns_hpc_output/8899aabbccdd.out",
  "unenforced": []
})";

TEST(JobRecord, AnUntypedHandleLoadsAsBwrapsWithTheCgroupsBesideItInItsData) {
  auto r = Record::from_json(nshpc::parse_json(kUntypedHandle));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->handle, (ExecutionHandle{"bwrap", 0,
                                        {{"pid", 6161},
                                         {"status_path", "@STATUS@"},
                                         {"cgroups", {"/sys/fs/cgroup/ns-hpc/demo@x/44556677ccdd"}}}}));
  const auto j = r->to_json();
  EXPECT_FALSE(j.contains("backend"));
  EXPECT_FALSE(j.contains("cgroups"));
  EXPECT_EQ(Record::from_json(j)->to_json(), j);
  // A handle that has cgroups of its own keeps them.
  auto own = nshpc::parse_json(kUntypedHandle);
  own["handle"]["cgroups"] = nlohmann::json::array();
  EXPECT_EQ(Record::from_json(own)->handle.data["cgroups"], nlohmann::json::array());
  // The name beside it says whose it is (a test's backend, say).
  auto named = nshpc::parse_json(kUntypedHandle);
  named["backend"] = "fake";
  EXPECT_EQ(Record::from_json(named)->handle.backend, "fake");
  // A pending job's: the backend that was to run it, nothing else.
  auto pending = nshpc::parse_json(kUntypedHandle);
  pending["handle"] = nlohmann::json::object();
  pending["cgroups"] = nlohmann::json::array();
  pending["status"] = "pending";
  EXPECT_EQ(Record::from_json(pending)->handle, (ExecutionHandle{"bwrap", 0, nlohmann::json::object()}));
}

TEST(JobRecord, ATypedHandleLoadsAndSavesBackTheSame) {
  const auto j = nshpc::parse_json(kTypedHandle);
  auto r = Record::from_json(j);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->handle.backend, "bwrap");
  EXPECT_EQ(r->handle.version, 1);
  EXPECT_EQ(r->handle.data["pid"], 7171);
  EXPECT_EQ(r->to_json(), j);
}

// What the bwrap backend finds from each shape a release wrote: the job's exit code on record in
// its status file; the same record naming another backend is never read as bwrap's.
TEST(JobRecord, EveryShapeOnRecordIsFoundByTheBackendThatMadeIt) {
  const nshpc::tests::TempDir tmp("nshpc-job-record");
  const std::string status = (tmp.path() / "job.status").string();
  std::ofstream(status) << R"({"child-pid": 999999, "pid-namespace": 4026531836})" << "\n"
                        << R"({"exit-code": 5})" << "\n";
  const auto backend = nshpc::sandbox::make_bwrap_backend(nshpc::config::built_in());
  const auto with_status = [&](const char* text) {
    std::string out = text;
    // The oldest shapes name their status file at the top level.
    for (const char* old : {"/var/lib/ns-hpc/instances/demo/status/0123456789ab.status",
                            "/var/lib/ns-hpc/instances/demo/status/00112233aabb.status", "@STATUS@"})
      out = nshpc::text::replace_at(out, nshpc::text::find_all(out, old), std::string_view(old).size(), status);
    return nshpc::parse_json(out);
  };
  for (const char* shape : {kOldLocal, kCurrentLocal, kUntypedHandle, kTypedHandle}) {
    auto r = Record::from_json(with_status(shape));
    ASSERT_TRUE(r) << shape;
    auto exec = backend->attach(r->handle);
    ASSERT_EQ(exec->seen(), nshpc::sandbox::Seen::exited) << shape;
    EXPECT_EQ(exec->wait().exit_code, 5) << shape;
  }
  for (auto foreign : {with_status(kUntypedHandle), with_status(kTypedHandle)}) {
    if (foreign.contains("backend"))
      foreign["backend"] = "crun";
    else
      foreign["handle"]["backend"] = "crun";
    auto exec = backend->attach(Record::from_json(foreign)->handle);
    EXPECT_EQ(exec->seen(), nshpc::sandbox::Seen::unreadable);
    const std::string error = exec->wait().error;
    EXPECT_NE(error.find("'crun' backend"), std::string::npos) << error;
  }
}

TEST(JobRecord, AHandleOfTheWrongShapeIsCorrupt) {
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"backend", "bwrap"}, {"handle", 7}}));
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"backend", 7}, {"handle", {{"pid", 1}}}}));
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"cgroups", "/sys/fs/cgroup/x"}, {"pid", 1}}));
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"handle", {{"backend", "bwrap"}, {"version", 1}, {"data", 7}}}}));
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"handle", {{"backend", ""}, {"version", 1}, {"data", {}}}}}));
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"handle", {{"backend", "bwrap"}, {"data", {}}}}}));
}

TEST(JobRecord, MissingKeysTakeTheDefaultsAndNullIsNoValue) {
  auto r = Record::from_json({{"job_id", "00000000000a"}, {"exit_code", nullptr}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->mode, Mode::local);
  EXPECT_EQ(r->state, State::pending);
  EXPECT_FALSE(r->exit_code);
  EXPECT_TRUE(r->handle.empty());
  EXPECT_TRUE(r->argv.empty());
  const auto j = r->to_json();
  EXPECT_TRUE(j["exit_code"].is_null());
  EXPECT_EQ(j["status"], "pending");
  EXPECT_FALSE(j.contains("state"));
  EXPECT_FALSE(j.contains("id"));
}

TEST(JobRecord, CorruptRecordsAreRefusedAndUnknownNamesReadAsLostAndLocal) {
  EXPECT_FALSE(Record::from_json(nlohmann::json::array()));
  EXPECT_FALSE(Record::from_json({{"job_id", "not-an-id"}}));
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"exit_code", "zero"}}));
  auto r = Record::from_json({{"job_id", "00000000000a"}, {"status", "exploded"}, {"mode", "cloud"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, State::lost);
  EXPECT_EQ(r->mode, Mode::local);
}

TEST(JobRecord, StateAndModeNamesRoundTrip) {
  for (State s : {State::pending, State::running, State::completed, State::failed, State::cancelled, State::timed_out,
                  State::lost, State::out_of_memory, State::node_fail, State::preempted})
    EXPECT_EQ(nshpc::jobs::parse_state(nshpc::jobs::to_string(s)), s);
  EXPECT_EQ(nshpc::jobs::to_string(State::timed_out), "timed_out");
  EXPECT_FALSE(nshpc::jobs::parse_state("exploded"));
  EXPECT_EQ(nshpc::jobs::parse_mode("slurm"), Mode::slurm);
  EXPECT_FALSE(nshpc::jobs::parse_mode("cloud"));
}

}  // namespace

// A pending job's submitter that crashed and was never reaped (a zombie keeps its pid and start
// time) submits nothing any more: the job is not left pending for it.
TEST(JobRecord, AZombieSubmitterIsNotAlive) {
  nshpc::SpawnSpec spec;
  spec.program = "sleep";
  spec.argv = {"sleep", "1000"};
  nshpc::SpawnedChild child = nshpc::spawn(spec);  // killed and reaped however the test ends
  nshpc::jobs::Record rec;
  rec.owner_pid = child.pid();
  rec.owner_start = nshpc::jobs::start_time_of(child.pid());
  ASSERT_NE(rec.owner_start, 0u);
  EXPECT_TRUE(nshpc::jobs::submitter_alive(rec));
  nshpc::signal_pidfd(child.pidfd(), SIGKILL);
  ASSERT_TRUE(nshpc::wait_pidfd(child.pidfd(), std::chrono::seconds(30)));  // exited, not reaped
  EXPECT_FALSE(nshpc::jobs::submitter_alive(rec)) << "a zombie submits nothing";
  child.wait();
  EXPECT_FALSE(nshpc::jobs::submitter_alive(rec));
}
