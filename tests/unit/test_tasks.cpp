// Jobs as MCP tasks (tools/tasks.hpp): how each job state maps to a task, and tasks/get,
// tasks/cancel and tasks/list over job records on disk, through an mcp::Session in both wires.
// No job runs here (a fake backend): the records are written as the engine writes them; jobs that
// run are the integration test's (tests/integration/test_tasks.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <fstream>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "common/temp_dir.hpp"
#include "instances/instances.hpp"
#include "jobs/job_store.hpp"
#include "mcp/server.hpp"
#include "tools/tasks.hpp"
#include "tools/tools.hpp"

namespace {

namespace jobs = nshpc::jobs;
namespace mcp = nshpc::mcp;
namespace sandbox = nshpc::sandbox;
namespace store = nshpc::store;
namespace tools = nshpc::tools;
using nlohmann::json;

jobs::Record record(jobs::State state, std::optional<int> exit_code = std::nullopt) {
  jobs::Record r;
  r.id = "0123456789ab";
  r.instance_id = "work";
  r.command = "make";
  r.state = state;
  r.exit_code = exit_code;
  r.created_at = "2026-12-01T10:00:00.000000+00:00";
  if (state != jobs::State::pending) r.started_at = "2026-12-01T10:00:01.000000+00:00";
  if (jobs::is_final(state)) r.finished_at = "2026-12-01T10:05:00.000000+00:00";
  return r;
}

TEST(JobTask, EveryJobStateMapsToATaskStatus) {
  using S = jobs::State;
  using T = mcp::Task::Status;
  const std::vector<std::pair<S, T>> cases = {
      {S::pending, T::working},     {S::running, T::working},       {S::completed, T::completed},
      {S::failed, T::completed},    {S::cancelled, T::cancelled},   {S::timed_out, T::completed},
      {S::lost, T::completed},      {S::out_of_memory, T::completed}, {S::node_fail, T::completed},
      {S::preempted, T::completed}, {S::output_limit, T::completed}};
  for (const auto& [state, status] : cases) {
    const mcp::Task t = tools::job_task(record(state), 5000);
    EXPECT_EQ(mcp::to_string(t.status), mcp::to_string(status)) << jobs::to_string(state);
    EXPECT_FALSE(t.error) << "a job is never a JSON-RPC error: " << jobs::to_string(state);
  }
}

TEST(JobTask, FieldsComeFromTheRecord) {
  jobs::Record pending = record(jobs::State::pending);
  mcp::Task t = tools::job_task(pending, 5000);
  EXPECT_EQ(t.id, "work/0123456789ab");
  EXPECT_EQ(t.created_at, "2026-12-01T10:00:00.000000+00:00");
  EXPECT_EQ(t.last_updated_at, t.created_at) << "nothing happened since it was made";
  EXPECT_FALSE(t.ttl_ms) << "job records are kept as long as their instance: unlimited";
  EXPECT_EQ(t.poll_interval_ms, tools::kLocalJobPollMs);
  EXPECT_EQ(t.status_message, "pending");

  t = tools::job_task(record(jobs::State::running), 5000);
  EXPECT_EQ(t.last_updated_at, "2026-12-01T10:00:01.000000+00:00");
  EXPECT_EQ(t.status_message, "running since 2026-12-01T10:00:01.000000+00:00");

  jobs::Record failed = record(jobs::State::failed, 2);
  failed.reason = "exit code 2";
  t = tools::job_task(failed, 5000);
  EXPECT_EQ(t.last_updated_at, "2026-12-01T10:05:00.000000+00:00");
  EXPECT_EQ(t.status_message, "failed, exit code 2: exit code 2");

  jobs::Record slurm = record(jobs::State::pending);
  slurm.mode = jobs::Mode::slurm;
  slurm.scheduler_state = "PENDING";
  slurm.scheduler_reason = "Resources";
  t = tools::job_task(slurm, 5000);
  EXPECT_EQ(t.poll_interval_ms, 5000) << "a Slurm job is asked about at the scheduler's pace";
  EXPECT_EQ(t.status_message, "pending (Slurm PENDING: Resources)");
}

// A fake backend that runs nothing: no job starts here.
class NoRuns final : public sandbox::Backend {
 public:
  std::string_view name() const override { return "fake"; }
  std::unique_ptr<sandbox::Process> start(const sandbox::RunSpec&) override { throw nshpc::Error("fake: no runs"); }
  sandbox::LivingStatus living_status(const sandbox::Target&) override { return {}; }
  sandbox::LivingStatus start_living(const sandbox::Target&) override { throw nshpc::Error("fake: no runs"); }
  bool stop_living(const sandbox::Target&, std::string_view, std::chrono::milliseconds) override { return false; }
  bool change_network(const sandbox::Target&) override { return false; }
  std::vector<sandbox::LivingProcess> living_processes(const sandbox::Target&) override { return {}; }
  bool commands_share_pids() const override { return true; }
  std::vector<std::string> end_stray_sandboxes(const std::filesystem::path&) override { return {}; }
  std::vector<std::string> describe(const sandbox::RunSpec&) const override { return {}; }
};

json envelope(bool with_tasks) {
  json caps = json::object();
  if (with_tasks) caps["extensions"] = {{"io.modelcontextprotocol/tasks", json::object()}};
  return {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
          {"io.modelcontextprotocol/clientInfo", {{"name", "unit"}, {"version", "1"}}},
          {"io.modelcontextprotocol/clientCapabilities", caps}};
}

class JobTasksTest : public ::testing::Test {
 protected:
  // What a test's server is configured with beyond the fixture's.
  virtual void configure() {}
  void SetUp() override {
    config_.ns.instances_dir = tmp_.path() / "instances";
    config_.server.state_dir = tmp_.path() / "state";
    config_.ns.sandbox_uid = static_cast<uint32_t>(::getuid());
    config_.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
    config_.mcp.max_result_chars = 100000;
    config_.mcp.page_size = 2;
    configure();
    start();
  }
  // The server, as a process starting (again) would make it.
  void start() {
    legacy_.reset();
    modern_.reset();
    server_.reset();
    instances_.reset();
    instances_ = std::make_unique<nshpc::instances::Service>(config_, std::make_unique<NoRuns>());
    const tools::Services services{config_, *instances_, nullptr, /*job_tools=*/true};
    server_ = std::make_unique<mcp::Server>(tools::server_info(), tools::server_options(config_, services));
    tools::register_all(*server_, services);
    legacy_ = session("legacy");
    rpc(*legacy_, "initialize",
        {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()}, {"clientInfo", {{"name", "unit"}, {"version", "1"}}}});
    legacy_->receive(json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump());
    modern_ = session("");
  }
  void TearDown() override {
    legacy_.reset();
    modern_.reset();
  }

  std::unique_ptr<mcp::Session> session(std::string id) {
    return std::make_unique<mcp::Session>(*server_, std::move(id), [this](const json& m) { replies_.push_back(m); },
                                          [](std::function<void()> work) { work(); });
  }
  json rpc(mcp::Session& s, const std::string& method, json params) {
    const int id = next_id_++;
    s.receive(json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}}.dump());
    for (const auto& m : replies_)
      if (m.contains("id") && m["id"] == id) return m;
    ADD_FAILURE() << "no reply to " << method;
    return json();
  }
  json modern(const std::string& method, json params, bool with_tasks = true) {
    params["_meta"] = envelope(with_tasks);
    return rpc(*modern_, method, std::move(params));
  }

  // A final job on record, as the engine leaves it, with `out` as its whole stdout.
  void job(const std::string& instance, const std::string& id, jobs::State state, std::optional<int> exit_code,
           const std::string& created_at, const std::string& out = "") {
    if (!instances_->store().exists(instance)) instances_->create(instance, {}, "test");
    const store::Instance inst = instances_->store().get(instance);
    jobs::Record r = record(state, exit_code);
    r.id = id;
    r.instance_id = instance;
    r.created_at = created_at;
    const auto dir = inst.workspace / ".ns_hpc_output";
    std::filesystem::create_directories(dir);
    std::filesystem::create_directories(jobs::JobStore::dir(inst));
    r.stdout_path = (dir / (id + ".out")).string();
    r.stderr_path = (dir / (id + ".err")).string();
    std::ofstream(r.stdout_path) << out;
    std::ofstream(r.stderr_path);
    store::Store writer(config_, instances_->store().default_network());  // the engine's store is not ours to write
    jobs::JobStore(config_, writer).save(inst, r);
  }

  nshpc::tests::TempDir tmp_;
  nshpc::config::Config config_;
  std::unique_ptr<nshpc::instances::Service> instances_;
  std::unique_ptr<mcp::Server> server_;
  std::unique_ptr<mcp::Session> legacy_, modern_;
  std::vector<json> replies_;
  int next_id_ = 1;
};

TEST_F(JobTasksTest, AFinishedJobIsACompletedTaskWithPollJobsResultNonZeroExitIncluded) {
  job("work", "aaaaaaaaaaaa", jobs::State::failed, 3, "2026-12-01T10:00:00.000000+00:00", "built half\n");
  const json got = modern("tasks/get", {{"taskId", "work/aaaaaaaaaaaa"}});
  ASSERT_TRUE(got.contains("result")) << got.dump();
  const json& t = got["result"];
  EXPECT_EQ(t["status"], "completed");
  EXPECT_EQ(t["ttlMs"], nullptr);
  EXPECT_EQ(t["pollIntervalMs"], 1000);
  EXPECT_EQ(t["createdAt"], "2026-12-01T10:00:00.000000+00:00");
  EXPECT_EQ(t["lastUpdatedAt"], "2026-12-01T10:05:00.000000+00:00");
  EXPECT_EQ(t["statusMessage"], "failed, exit code 3");
  EXPECT_FALSE(t["result"].value("isError", false)) << "a job that failed is a result, not an error";
  EXPECT_EQ(t["result"]["structuredContent"]["exit_code"], 3);
  EXPECT_EQ(t["result"]["structuredContent"]["status"], "failed");
  EXPECT_EQ(t["result"]["structuredContent"]["job_id"], "aaaaaaaaaaaa");
  EXPECT_NE(t["result"]["structuredContent"]["stdout_tail"].get<std::string>().find("built half"), std::string::npos);
  // The same as poll_job says of it.
  const json polled = rpc(*legacy_, "tools/call",
                          {{"name", "poll_job"}, {"arguments", {{"instance_id", "work"}, {"job_id", "aaaaaaaaaaaa"}}}});
  EXPECT_EQ(polled["result"]["content"], t["result"]["content"]);
  EXPECT_EQ(polled["result"]["structuredContent"], t["result"]["structuredContent"]);
}

TEST_F(JobTasksTest, ACancelledJobIsACancelledTaskAndCancellingItAgainChangesNothing) {
  job("work", "bbbbbbbbbbbb", jobs::State::cancelled, std::nullopt, "2026-12-01T10:00:00.000000+00:00");
  EXPECT_EQ(modern("tasks/get", {{"taskId", "work/bbbbbbbbbbbb"}})["result"]["status"], "cancelled");
  const json again = rpc(*legacy_, "tasks/cancel", {{"taskId", "work/bbbbbbbbbbbb"}});
  ASSERT_TRUE(again.contains("result")) << again.dump();
  EXPECT_EQ(again["result"]["status"], "cancelled");
  EXPECT_EQ(again["result"]["ttl"], nullptr);
}

TEST_F(JobTasksTest, UnknownArchivedAndDeletedIdsSayWhy) {
  const auto message = [&](const std::string& id) {
    const json r = modern("tasks/get", {{"taskId", id}});
    EXPECT_EQ(r["error"]["code"], mcp::kInvalidParams) << r.dump();
    return r["error"]["message"].get<std::string>();
  };
  EXPECT_NE(message("nope").find("task ids are <instance>/<job>"), std::string::npos) << message("nope");
  EXPECT_NE(message("work/zz").find("task ids are <instance>/<job>"), std::string::npos);
  job("work", "cccccccccccc", jobs::State::completed, 0, "2026-12-01T10:00:00.000000+00:00");
  EXPECT_NE(message("work/dddddddddddd").find("job 'dddddddddddd' not found in instance 'work'"), std::string::npos)
      << message("work/dddddddddddd");
  instances_->archive("work", "test");
  const std::string archived = message("work/cccccccccccc");
  EXPECT_NE(archived.find("belongs to instance work, which is archived"), std::string::npos) << archived;
  EXPECT_NE(archived.find("restore_instance 'work__"), std::string::npos) << archived;
  const std::string gone = message("gone/cccccccccccc");
  EXPECT_NE(gone.find("belongs to instance gone, which does not exist"), std::string::npos) << gone;
}

TEST_F(JobTasksTest, ListIsEveryInstancesJobsNewestFirstInPages) {
  job("a", "111111111111", jobs::State::completed, 0, "2026-12-01T10:00:00.000000+00:00");
  job("b", "222222222222", jobs::State::completed, 0, "2026-12-01T11:00:00.000000+00:00");
  job("a", "333333333333", jobs::State::cancelled, std::nullopt, "2026-12-01T12:00:00.000000+00:00");
  std::vector<std::string> ids;
  json page = rpc(*legacy_, "tasks/list", json::object());
  for (int pages = 1;; ++pages) {
    ASSERT_TRUE(page.contains("result")) << page.dump();
    EXPECT_LE(page["result"]["tasks"].size(), 2u) << "[mcp] page_size is 2";
    for (const auto& t : page["result"]["tasks"]) ids.push_back(t["taskId"]);
    if (!page["result"].contains("nextCursor")) {
      EXPECT_EQ(pages, 2);
      break;
    }
    page = rpc(*legacy_, "tasks/list", {{"cursor", page["result"]["nextCursor"]}});
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"a/333333333333", "b/222222222222", "a/111111111111"}));
}

TEST_F(JobTasksTest, SubmitJobTakesTasksFromLegacyClientsAndTheServerSaysSo) {
  const json init = rpc(*session("other"), "initialize",
                        {{"protocolVersion", "2025-11-25"},
                         {"capabilities", json::object()},
                         {"clientInfo", {{"name", "unit"}, {"version", "1"}}}});
  EXPECT_TRUE(init["result"]["capabilities"]["tasks"]["requests"]["tools"].contains("call")) << init.dump();
  json listed = json::array();
  for (json page = rpc(*legacy_, "tools/list", json::object());;
       page = rpc(*legacy_, "tools/list", {{"cursor", page["result"]["nextCursor"]}})) {
    for (const auto& t : page["result"]["tools"]) listed.push_back(t);
    if (!page["result"].contains("nextCursor")) break;
  }
  for (const auto& t : listed)
    EXPECT_EQ(t.contains("execution"), t["name"] == "submit_job") << t["name"];
  const json discover = modern("server/discover", json::object());
  EXPECT_TRUE(discover["result"]["capabilities"]["extensions"].contains("io.modelcontextprotocol/tasks"));
}

// A Slurm job over [mcp] confirm_slurm_cpu_hours, with confirmations on: a client with the Tasks
// extension gets it as a task in input_required, nothing submitted until it says yes.
class SlurmConfirmTest : public JobTasksTest {
 protected:
  void configure() override {
    const auto fake = [&](const std::string& name, const std::string& body) {
      const auto file = tmp_.path() / name;
      std::ofstream(file) << "#!/bin/sh\n" << body;
      ::chmod(file.c_str(), 0755);
      return file.string();
    };
    calls_ = tmp_.path() / "sbatch.calls";
    config_.jobs.slurm.sbatch_command = {fake("sbatch", "echo \"$@\" >> '" + calls_.string() + "'\necho 4242\n"),
                                         "--cpus-per-task={cpus}"};
    config_.jobs.slurm.squeue_command = {fake("squeue", "exit 0\n")};
    config_.jobs.slurm.sacct_command = {fake("sacct", "exit 0\n")};
    config_.jobs.slurm.scancel_command = {fake("scancel", "exit 0\n")};
    config_.jobs.slurm.poll_interval = 60;
    config_.jobs.slurm.limit = {{"cpus", {.default_value = 1, .max = 64}}};
    config_.jobs.max_timeout = 3600;  // no `time` resource: an hour at most
    config_.jobs.max_running = 8;
    config_.jobs.max_running_per_instance = 8;
    config_.mcp.confirm_destructive = true;
    config_.mcp.confirm_slurm_cpu_hours = 2;
  }
  void SetUp() override {
    JobTasksTest::SetUp();
    instances_->create("work", {}, "test");
  }
  std::size_t submitted() {
    std::ifstream in(calls_);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }
  json submit(std::int64_t cpus, bool with_tasks, json extra = json::object()) {
    json args = {{"instance_id", "work"}, {"command", "make -j"}, {"mode", "slurm"}, {"resources", {{"cpus", cpus}}}};
    args.update(extra);
    return modern("tools/call", {{"name", "submit_job"}, {"arguments", args}}, with_tasks);
  }
  std::filesystem::path calls_;
};

TEST_F(SlurmConfirmTest, ABigJobWaitsForTheUsersYesAcrossARestart) {
  const json created = submit(4, true);
  ASSERT_TRUE(created.contains("result")) << created.dump();
  EXPECT_EQ(created["result"]["resultType"], "task");
  EXPECT_EQ(created["result"]["status"], "input_required");
  const std::string id = created["result"]["taskId"];
  EXPECT_EQ(submitted(), 0u) << "nothing goes to Slurm before the yes";
  start();  // a restart keeps the question
  json got = modern("tasks/get", {{"taskId", id}});
  ASSERT_EQ(got["result"]["status"], "input_required") << got.dump();
  const json& asked = got["result"]["inputRequests"]["confirm"];
  EXPECT_EQ(asked["method"], "elicitation/create");
  EXPECT_NE(asked["params"]["message"].get<std::string>().find("4 CPU(s) for up to 1.0 h (4.0 CPU hours"),
            std::string::npos)
      << asked.dump();
  const json ack = modern("tasks/update",
                          {{"taskId", id}, {"inputResponses", {{"confirm", {{"action", "accept"}, {"content", {{"confirm", true}}}}}}}});
  ASSERT_TRUE(ack.contains("result")) << ack.dump();
  EXPECT_EQ(submitted(), 1u);
  got = modern("tasks/get", {{"taskId", id}});
  EXPECT_EQ(got["result"]["status"], "working") << got.dump();
  EXPECT_EQ(got["result"]["taskId"], id) << "the task keeps its id once its job exists";
  // A second yes (a retried update) submits nothing more.
  modern("tasks/update", {{"taskId", id}, {"inputResponses", {{"confirm", {{"action", "accept"}, {"content", {{"confirm", true}}}}}}}});
  EXPECT_EQ(submitted(), 1u);
}

TEST_F(SlurmConfirmTest, ANoOrACancelEndsItUnsubmitted) {
  const std::string declined = submit(8, true)["result"]["taskId"];
  modern("tasks/update", {{"taskId", declined}, {"inputResponses", {{"confirm", {{"action", "decline"}}}}}});
  EXPECT_EQ(modern("tasks/get", {{"taskId", declined}})["result"]["status"], "cancelled");
  // The yes after a no changes nothing: the question is answered.
  modern("tasks/update",
         {{"taskId", declined}, {"inputResponses", {{"confirm", {{"action", "accept"}, {"content", {{"confirm", true}}}}}}}});
  EXPECT_EQ(modern("tasks/get", {{"taskId", declined}})["result"]["status"], "cancelled");
  const std::string cancelled = submit(8, true)["result"]["taskId"];
  modern("tasks/cancel", {{"taskId", cancelled}});
  EXPECT_EQ(modern("tasks/get", {{"taskId", cancelled}})["result"]["status"], "cancelled");
  EXPECT_EQ(submitted(), 0u);
}

TEST_F(SlurmConfirmTest, SmallJobsAndClientsWithoutTasksAreNotAskedThroughATask) {
  // Under the bound: submitted at once, a task as any job is.
  const json small = submit(2, true);
  EXPECT_EQ(small["result"]["status"], "working") << small.dump();
  EXPECT_EQ(submitted(), 1u);
  // No extension and no elicitation: told to pass confirm: true; nothing submitted.
  const json refused = submit(4, false);
  EXPECT_TRUE(refused["result"].value("isError", false)) << refused.dump();
  EXPECT_NE(refused["result"]["content"][0]["text"].get<std::string>().find("confirm: true"), std::string::npos);
  EXPECT_EQ(submitted(), 1u);
  // With it: submitted.
  const json confirmed = submit(4, false, {{"confirm", true}, {"timeout", 0}});
  EXPECT_FALSE(confirmed["result"].value("isError", false)) << confirmed.dump();
  EXPECT_EQ(submitted(), 2u);
}

}  // namespace
