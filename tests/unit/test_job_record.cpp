// Job records on disk: what earlier releases wrote still loads, and saves back the same.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"
#include "jobs/jobs.hpp"
#include "jobs/support.hpp"

namespace {

using nshpc::jobs::Mode;
using nshpc::jobs::Record;
using nshpc::jobs::State;

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

// The old file as it is written now: its bwrap fields ("pid", "status_path") in the handle of
// backend "bwrap", or neither key when they were empty (a Slurm job).
nlohmann::json as_written_now(const char* old) {
  nlohmann::json j = nshpc::parse_json(old);
  nlohmann::json handle = nlohmann::json::object();
  if (j["pid"] != 0) handle["pid"] = j["pid"];
  if (j["status_path"] != "") handle["status_path"] = j["status_path"];
  j.erase("pid");
  j.erase("status_path");
  if (!handle.empty()) {
    j["backend"] = "bwrap";
    j["handle"] = handle;
  }
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
  EXPECT_EQ(r->backend, "bwrap");
  EXPECT_EQ(r->handle, (nlohmann::json{{"pid", 4343},  // read from "pid"
                                       {"status_path", "/var/lib/ns-hpc/instances/demo/status/0123456789ab.status"}}));
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
  EXPECT_TRUE(r->backend.empty());
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
  EXPECT_EQ(r->backend, "bwrap");
  EXPECT_EQ(r->handle, (nlohmann::json{{"pid", 5151},
                                       {"status_path", "/var/lib/ns-hpc/instances/demo/status/00112233aabb.status"}}));
  const auto j = r->to_json();
  EXPECT_FALSE(j.contains("bwrap_pid"));
  EXPECT_FALSE(j.contains("status_path"));
  EXPECT_FALSE(j.contains("pid"));
  EXPECT_EQ(Record::from_json(j)->to_json(), j);
  // A pending job's record (no pid yet) keeps its status file.
  auto pending = nshpc::parse_json(kCurrentLocal);
  pending["bwrap_pid"] = 0;
  pending["status"] = "pending";
  EXPECT_EQ(Record::from_json(pending)->handle,
            (nlohmann::json{{"status_path", "/var/lib/ns-hpc/instances/demo/status/00112233aabb.status"}}));
}

TEST(JobRecord, AHandleThatIsNoObjectIsCorrupt) {
  EXPECT_FALSE(Record::from_json({{"job_id", "00000000000a"}, {"backend", "bwrap"}, {"handle", 7}}));
}

TEST(JobRecord, MissingKeysTakeTheDefaultsAndNullIsNoValue) {
  auto r = Record::from_json({{"job_id", "00000000000a"}, {"exit_code", nullptr}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->mode, Mode::local);
  EXPECT_EQ(r->state, State::pending);
  EXPECT_FALSE(r->exit_code);
  EXPECT_TRUE(r->backend.empty());
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
