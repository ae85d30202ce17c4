// Jobs from the command line against real bwrap (and real cgroups when running as root).
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

bool is_root() { return ::geteuid() == 0; }

class Jobs : public ::testing::Test {
 protected:
  void SetUp() override { env_.create("alpha"); }
  json run(std::vector<std::string> extra, const std::vector<std::string>& command, int* exit_code = nullptr) {
    std::vector<std::string> args{"instance", "run", "alpha", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    args.insert(args.end(), command.begin(), command.end());
    Result r = env_.run(args);
    if (exit_code) *exit_code = r.exit_code;
    auto j = nshpc::parse_json_or_discarded(r.out);
    EXPECT_TRUE(j.is_object()) << r.out << r.err;
    return j;
  }
  json status(const std::string& job, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"instance", "status", "alpha", job, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = env_.run(args);
    auto j = nshpc::parse_json_or_discarded(r.out);
    EXPECT_TRUE(j.is_object()) << r.out << r.err;
    return j;
  }
  Env env_{"[jobs]\ncancel_grace = 1\n"};
};

}  // namespace

TEST_F(Jobs, CompletedAndFailedWithExitCodesAndTails) {
  int rc = -1;
  json ok = run({}, {"echo hello; echo oops >&2"}, &rc);
  EXPECT_EQ(ok["status"], "completed");
  EXPECT_EQ(ok["exit_code"], 0);
  EXPECT_EQ(ok["stdout_tail"], "hello");
  EXPECT_EQ(ok["stderr_tail"], "oops");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ok["stdout_path"].get<std::string>().rfind("/workspace/.ns_hpc_output/", 0), 0u);
  json bad = run({}, {"exit 42"}, &rc);
  EXPECT_EQ(bad["status"], "failed");
  EXPECT_EQ(bad["exit_code"], 42);
  EXPECT_EQ(rc, 42);
}

TEST_F(Jobs, SeveralWordsRunExactlyWithoutAShell) {
  json j = run({}, {"printf", "[%s]", "a b", "$HOME", ""});
  EXPECT_EQ(j["stdout_tail"], "[a b][$HOME][]");
}

TEST_F(Jobs, TailIsCappedInLines) {
  json j = run({"--tail", "3"}, {"seq 1 100"});
  EXPECT_EQ(j["stdout_tail"], "98\n99\n100");
}

TEST_F(Jobs, DetachedJobKeepsRunningAndIsCancelledOnRequest) {
  json j = run({"--timeout", "1"}, {"sleep 30"});
  ASSERT_EQ(j["status"], "running");
  const std::string id = j["job_id"];
  EXPECT_EQ(status(id)["status"], "running");  // another process re-attaches to it
  Result c = env_.run({"instance", "cancel", "alpha", id, "--json"});
  EXPECT_EQ(nshpc::parse_json(c.out)["status"], "cancelled") << c.out << c.err;
  Result list = env_.run({"instance", "jobs", "alpha", "--json"});
  EXPECT_EQ(nshpc::parse_json(list.out)[0]["status"], "cancelled");
}

TEST_F(Jobs, NoDetachCancelsWhenTheWaitRunsOut) {
  json j = run({"--timeout", "1", "--no-detach"}, {"sleep 30"});
  EXPECT_EQ(j["status"], "cancelled");
}

TEST_F(Jobs, CancelKillsASetsidTreeThatIgnoresSigterm) {
  json j = run({"--timeout", "1"}, {"setsid sh -c 'trap \"\" TERM; exec sleep $((55554+1)).5' & trap '' TERM; "
                                    "sleep $((55554+1)).6"});
  ASSERT_EQ(j["status"], "running");
  ASSERT_TRUE(eventually([] { return processes_with("55555.").size() >= 2; }, std::chrono::seconds(5)));
  Result c = env_.run({"instance", "cancel", "alpha", j["job_id"], "--json"});
  EXPECT_EQ(nshpc::parse_json(c.out)["status"], "cancelled");
  EXPECT_TRUE(eventually([] { return processes_with("55555.").empty(); }, std::chrono::seconds(5)))
      << processes_with("55555.").size() << " survivors";
}

TEST_F(Jobs, WallTimeLimitTimesOut) {
  json j = run({"-l", "time=1", "--timeout", "20"}, {"sleep 30"});
  EXPECT_EQ(j["status"], "timed_out");
  EXPECT_NE(j["reason"].get<std::string>().find("time limit of 1 s"), std::string::npos) << j.dump();
}

TEST_F(Jobs, OutputLimitStopsTheJob) {
  json j = run({"-l", "output=1"}, {"head -c 3000000 /dev/zero"});
  EXPECT_EQ(j["status"], "output_limit");
  EXPECT_NE(j["reason"].get<std::string>().find("output limit"), std::string::npos) << j.dump();
}

TEST_F(Jobs, LimitsOverTheirMaximumOrUnknownAreRefusedAndNothingRuns) {
  Result over = env_.run({"instance", "run", "alpha", "-l", "memory=999999999", "--", "true"});
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_NE(over.err.find("over its maximum"), std::string::npos) << over.err;
  Result unknown = env_.run({"instance", "run", "alpha", "-l", "gpus=1", "--", "true"});
  EXPECT_NE(unknown.err.find("unknown limit 'gpus'"), std::string::npos) << unknown.err;
  Result notnum = env_.run({"instance", "run", "alpha", "-l", "cpus=two", "--", "true"});
  EXPECT_NE(notnum.err.find("whole numbers"), std::string::npos) << notnum.err;
  EXPECT_EQ(nshpc::parse_json(env_.run({"instance", "jobs", "alpha", "--json"}).out).size(), 0u);
}

TEST_F(Jobs, EmptyCommandUnknownInstanceAndUnknownJobAreClearErrors) {
  EXPECT_NE(env_.run({"instance", "run", "alpha", "--", "  "}).err.find("command is empty"), std::string::npos);
  EXPECT_NE(env_.run({"instance", "run", "ghost", "--", "true"}).err.find("instance 'ghost' not found"),
            std::string::npos);
  EXPECT_NE(env_.run({"instance", "status", "alpha", "0123456789ab"}).err.find("not found"), std::string::npos);
  EXPECT_NE(env_.run({"instance", "status", "alpha", "nope"}).err.find("not a job id"), std::string::npos);
}

TEST_F(Jobs, AJobThatEndsWhileNobodyWatchesGetsItsRealExitCode) {
  json j = run({"--timeout", "0"}, {"sleep 1; echo late; exit 7"});
  ASSERT_EQ(j["status"], "running");
  // The sandbox's own status file has the exit code once the job is over: no server looks.
  const auto status_file = env_.instances() / "alpha/status" / (j["job_id"].get<std::string>() + ".status");
  ASSERT_TRUE(eventually([&] { return read_text(status_file).find("\"exit-code\"") != std::string::npos; },
                         std::chrono::seconds(30)))
      << read_text(status_file);
  json later = status(j["job_id"]);
  EXPECT_EQ(later["status"], "failed");
  EXPECT_EQ(later["exit_code"], 7);
  EXPECT_EQ(later["stdout_tail"], "late");
  // Recorded once: exactly one final audit line.
  auto log = read_text(env_.instances() / "alpha/audit.log");
  std::size_t finals = 0;
  for (std::size_t at = 0; (at = log.find("\"event\":\"job.failed\"", at)) != std::string::npos; ++at) ++finals;
  EXPECT_EQ(finals, 1u) << log;
}

TEST_F(Jobs, ARunningJobCanBeWaitedOnFromAnotherProcess) {
  json j = run({"--timeout", "0"}, {"sleep 2; echo finished"});
  ASSERT_EQ(j["status"], "running");
  json done = status(j["job_id"], {"--timeout", "20"});
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["stdout_tail"], "finished");
}

TEST_F(Jobs, ArchiveIsRefusedWhileAJobRuns) {
  json j = run({"--timeout", "0"}, {"sleep 30"});
  Result r = env_.run({"instance", "archive", "alpha", "--force"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("still running"), std::string::npos) << r.err;
  env_.run({"instance", "cancel", "alpha", j["job_id"]});
  EXPECT_EQ(env_.run({"instance", "archive", "alpha", "--force"}).exit_code, 0);
}

TEST_F(Jobs, MemoryHogIsKilledAtItsLimitAndReportedAsOutOfMemory) {
  if (!is_root()) GTEST_SKIP() << "memory limits need writable cgroups (root here)";
  json j = run({"-l", "memory=64", "--timeout", "30"},
               {"perl -e '@a=(); while(1){push @a, q(x) x (1<<20)}'"});
  EXPECT_EQ(j["status"], "out_of_memory") << j.dump();
  EXPECT_NE(j["reason"].get<std::string>().find("out of memory"), std::string::npos) << j.dump();
}

TEST_F(Jobs, CpuQuotaHolds) {
  if (!is_root()) GTEST_SKIP() << "cpu limits need writable cgroups (root here)";
  // Two busy loops for 2 s of wall time under a 1-core quota use about 2 s of CPU, not 4.
  json j = run({"-l", "cpus=1", "--timeout", "30"},
               {"/bin/bash", "-c",
                "busy() { local end=$((SECONDS+2)); while [ $SECONDS -lt $end ]; do :; done; }; "
                "TIMEFORMAT=%U+%S; { time ( busy & busy & wait ); } 2>&1 | tail -1"});
  ASSERT_EQ(j["status"], "completed") << j.dump();
  const std::string t = j["stdout_tail"];
  const double cpu = std::stod(t.substr(0, t.find('+'))) + std::stod(t.substr(t.find('+') + 1));
  EXPECT_LT(cpu, 3.2) << t;
  EXPECT_GT(cpu, 0.5) << t;
}

TEST_F(Jobs, PidsLimitHolds) {
  if (!is_root()) GTEST_SKIP() << "pids limits need writable cgroups (root here)";
  json j = run({"-l", "pids=20", "--timeout", "30"},
               {"perl -e '$n=0; for (1..60) { $p=fork(); last unless defined $p; if (!$p) { sleep 5; exit 0 } "
                "$n++ } print \"started $n\\n\"'"});
  const std::string out = j["stdout_tail"];
  ASSERT_EQ(out.rfind("started ", 0), 0u) << j.dump();
  EXPECT_LT(std::stoi(out.substr(8)), 20) << out;
}

TEST(JobsPrefix, CgroupsCommandIsPutInFrontOfBwrap) {
  Env env("[jobs.local]\ncgroups_command = [\"/usr/bin/env\", \"NSHPC_PREFIX_SEEN=yes\"]\n");
  env.create("alpha");
  Result r = env.run({"instance", "run", "alpha", "--json", "--", "echo prefix=$NSHPC_PREFIX_SEEN"});
  json j = nshpc::parse_json_or_discarded(r.out);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["stdout_tail"], "prefix=yes");  // env ran first and passed its variable through bwrap
}

TEST(JobsAsUser, LimitsThisHostCannotEnforceAreReportedNotIgnored) {
  if (is_root()) GTEST_SKIP() << "as root the cgroups are writable here";
  Env env;
  env.create("alpha");
  Result r = env.run({"instance", "run", "alpha", "--json", "-l", "memory=100", "--", "true"});
  json j = nshpc::parse_json(r.out);
  EXPECT_EQ(j["status"], "completed");
  ASSERT_FALSE(j["unenforced"].empty()) << r.out;
  EXPECT_NE(j["unenforced"].dump().find("memory"), std::string::npos) << r.out;
}

// Parallel submit_job calls through one server: the caps are checked and taken in one step, so
// they hold however the calls interleave (each refusal names its cap). Slurm jobs count too.
TEST(JobCaps, ParallelSubmitsCannotPassTheCapsTogether) {
  Env env{"[jobs]\ncancel_grace = 1\nmax_running_per_instance = 2\nmax_running = 3\n"};
  env.create("alpha");
  env.create("beta");
  McpSession server(env);
  auto submit_all = [&](const std::string& instance, int n) {
    std::vector<int> ids;
    for (int i = 0; i < n; ++i)
      ids.push_back(server.call("submit_job", {{"instance_id", instance}, {"command", "sleep 60"}, {"timeout", 0}}));
    std::vector<std::string> started, refused;
    for (int id : ids) {
      json r = server.wait_for(id);
      if (r["result"].value("isError", false))
        refused.push_back(result_text(r));
      else
        started.push_back(r["result"]["structuredContent"].value("job_id", ""));
    }
    return std::make_pair(started, refused);
  };
  auto [alpha, alpha_refused] = submit_all("alpha", 8);
  EXPECT_EQ(alpha.size(), 2u) << "jobs running in one instance beyond max_running_per_instance = 2";
  ASSERT_EQ(alpha_refused.size(), 8u - alpha.size());
  for (const auto& why : alpha_refused) EXPECT_NE(why.find("max_running_per_instance"), std::string::npos) << why;

  auto [beta, beta_refused] = submit_all("beta", 4);
  EXPECT_EQ(beta.size(), 1u) << "jobs running in the server beyond max_running = 3";
  for (const auto& why : beta_refused) EXPECT_NE(why.find("([jobs] max_running)"), std::string::npos) << why;

  // A place is given back when a job ends: cancel one, and the next submit is taken.
  for (const auto& job : alpha) server.tool("cancel_job", {{"instance_id", "alpha"}, {"job_id", job}});
  auto [again, again_refused] = submit_all("alpha", 1);
  EXPECT_EQ(again.size(), 1u) << (again_refused.empty() ? "" : again_refused[0]);
  for (const auto& job : again) server.tool("cancel_job", {{"instance_id", "alpha"}, {"job_id", job}});
  for (const auto& job : beta) server.tool("cancel_job", {{"instance_id", "beta"}, {"job_id", job}});
}

// What is not found is said by the module; where to look is said for each audience: the tool
// that lists them to an agent, the command to a person.
TEST(NotFound, EachAudienceIsToldWhereToLook) {
  Env env{"[jobs]\ncancel_grace = 1\n"};
  env.create("alpha");
  const Result job = env.run({"instance", "status", "alpha", "0123456789ab"});
  EXPECT_NE(job.err.find("job '0123456789ab' not found in instance 'alpha'; 'ns-hpc instance jobs ID'"),
            std::string::npos)
      << job.err;
  const Result instance = env.run({"instance", "describe", "ghost"});
  EXPECT_NE(instance.err.find("instance 'ghost' not found; 'ns-hpc instance list'"), std::string::npos) << instance.err;

  McpSession server(env);
  const std::string said =
      result_text(server.call_and_wait("poll_job", {{"instance_id", "alpha"}, {"job_id", "0123456789ab"}}));
  EXPECT_NE(said.find("not found in instance 'alpha'; list_jobs lists"), std::string::npos) << said;
  EXPECT_EQ(said.find("ns-hpc"), std::string::npos) << said;
  const std::string ghost = result_text(server.call_and_wait("describe_instance", {{"instance_id", "ghost"}}));
  EXPECT_NE(ghost.find("instance 'ghost' not found; list_instances lists"), std::string::npos) << ghost;

  // A job id one character off an existing one is a likely typo.
  const nlohmann::json job_done = server.tool("submit_job", {{"instance_id", "alpha"}, {"command", "true"}, {"timeout", 10}});
  const std::string id = job_done.value("job_id", std::string());
  ASSERT_EQ(id.size(), 12u) << job_done.dump();
  std::string typo = id;
  typo[5] = typo[5] == 'a' ? 'b' : 'a';
  const std::string near = result_text(server.call_and_wait("poll_job", {{"instance_id", "alpha"}, {"job_id", typo}}));
  EXPECT_NE(near.find("did you mean '" + id + "'?"), std::string::npos) << near;
  const Result by_cli = env.run({"instance", "status", "alpha", typo.substr(0, 11)});
  EXPECT_NE(by_cli.err.find("did you mean '" + id + "'?"), std::string::npos) << by_cli.err;
}
