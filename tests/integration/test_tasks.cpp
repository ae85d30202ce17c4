// Jobs as MCP tasks through the real binary over stdio, in both wires: the 2026-07-28 Tasks
// extension (stateless requests, resultType "task", tasks/get|cancel) and 2025-11-25's
// experimental tasks (params.task, tasks/get|result|list|cancel); a task followed by a new server
// process after the first one ended; a client without tasks getting submit_job's plain result.

#include <thread>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

// `ns-hpc run` on stdio spoken to as a 2026-07-28 client: no initialize, every request carries
// its own protocol version, client info and capabilities in _meta.
class ModernStdio {
 public:
  explicit ModernStdio(const Env& env) : session_(env, {}, {"run"}, false) {}

  // One request and its response (null when none came in time).
  json rpc(const std::string& method, json params, bool with_tasks = true,
           std::chrono::seconds timeout = std::chrono::seconds(60)) {
    json caps = json::object();
    if (with_tasks) caps["extensions"] = {{"io.modelcontextprotocol/tasks", json::object()}};
    params["_meta"] = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                       {"io.modelcontextprotocol/clientInfo", {{"name", "tasks-it"}, {"version", "1"}}},
                       {"io.modelcontextprotocol/clientCapabilities", caps}};
    return session_.wait_for(session_.request(method, params), timeout);
  }

 private:
  McpSession session_;
};

// Follows a task with tasks/get (at its pollIntervalMs) until it is no longer working.
json follow(ModernStdio& server, const std::string& task_id, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    json got = server.rpc("tasks/get", {{"taskId", task_id}});
    if (!got.contains("result")) return got;
    if (got["result"]["status"] != "working" || std::chrono::steady_clock::now() > deadline) return got["result"];
    std::this_thread::sleep_for(std::chrono::milliseconds(got["result"].value("pollIntervalMs", 1000)));
  }
}

class Tasks : public ::testing::Test {
 protected:
  void SetUp() override { env_.create("alpha"); }
  Env env_{"[jobs]\ncancel_grace = 1\n[mcp]\npage_size = 2\n"};
};

}  // namespace

TEST_F(Tasks, ModernJobAsATaskFollowedToCompletion) {
  ModernStdio server(env_);
  const json created = server.rpc(
      "tools/call", {{"name", "submit_job"}, {"arguments", {{"instance_id", "alpha"}, {"command", "sleep 1; echo built; exit 3"}}}});
  ASSERT_TRUE(created.contains("result")) << created.dump();
  const json& c = created["result"];
  EXPECT_EQ(c["resultType"], "task");
  EXPECT_EQ(c["status"], "working");
  EXPECT_EQ(c["ttlMs"], nullptr);
  EXPECT_EQ(c["pollIntervalMs"], 1000);
  EXPECT_FALSE(c.contains("content")) << "a task, not a tool result";
  const std::string id = c["taskId"];
  ASSERT_EQ(id.rfind("alpha/", 0), 0u) << id;
  const json done = follow(server, id);
  ASSERT_EQ(done["status"], "completed") << done.dump();
  EXPECT_EQ(done["resultType"], "complete");
  EXPECT_FALSE(done["result"].value("isError", false)) << "exit code 3 is a result, not a failed task";
  EXPECT_EQ(done["result"]["structuredContent"]["exit_code"], 3);
  EXPECT_EQ(done["result"]["structuredContent"]["stdout_tail"], "built");
  EXPECT_EQ(done["result"]["structuredContent"]["job_id"], id.substr(6));
}

TEST_F(Tasks, ModernClientWithoutTheExtensionGetsThePlainResult) {
  ModernStdio server(env_);
  const json plain = server.rpc(
      "tools/call", {{"name", "submit_job"}, {"arguments", {{"instance_id", "alpha"}, {"command", "echo plain"}}}}, false);
  ASSERT_TRUE(plain.contains("result")) << plain.dump();
  EXPECT_EQ(plain["result"]["resultType"], "complete");
  EXPECT_FALSE(plain["result"].contains("taskId"));
  EXPECT_EQ(plain["result"]["structuredContent"]["status"], "completed");
  EXPECT_EQ(plain["result"]["structuredContent"]["stdout_tail"], "plain");
}

TEST_F(Tasks, ModernCancelStopsTheJob) {
  ModernStdio server(env_);
  const json created = server.rpc(
      "tools/call", {{"name", "submit_job"}, {"arguments", {{"instance_id", "alpha"}, {"command", "sleep $((30000+1017))"}}}});
  ASSERT_TRUE(created.contains("result")) << created.dump();
  const std::string id = created["result"]["taskId"];
  ASSERT_TRUE(eventually([] { return !processes_with("31017").empty(); }, std::chrono::seconds(20)))
      << server.rpc("tasks/get", {{"taskId", id}}).dump();
  const json ack = server.rpc("tasks/cancel", {{"taskId", id}});
  ASSERT_TRUE(ack.contains("result")) << ack.dump();
  EXPECT_FALSE(ack["result"].contains("taskId")) << "2026-07-28 acknowledges with an empty result";
  const json after = follow(server, id, std::chrono::seconds(20));
  EXPECT_EQ(after["status"], "cancelled") << after.dump();
  EXPECT_TRUE(eventually([] { return processes_with("31017").empty(); }, std::chrono::seconds(10)));
}

TEST_F(Tasks, ATaskOutlivesTheServerThatMadeIt) {
  std::string id;
  {
    ModernStdio first(env_);
    const json created = first.rpc(
        "tools/call", {{"name", "submit_job"}, {"arguments", {{"instance_id", "alpha"}, {"command", "sleep 3; echo survived"}}}});
    ASSERT_TRUE(created.contains("result")) << created.dump();
    id = created["result"]["taskId"];
  }  // the first server ends here, its job still running
  ModernStdio second(env_);
  const json done = follow(second, id);
  ASSERT_EQ(done["status"], "completed") << done.dump();
  EXPECT_EQ(done["result"]["structuredContent"]["exit_code"], 0);
  EXPECT_EQ(done["result"]["structuredContent"]["stdout_tail"], "survived");
}

TEST_F(Tasks, LegacyTaskResultListAndCancel) {
  McpSession server(env_);
  // Without params.task: the plain result, as ever.
  const json plain = server.call_and_wait("submit_job", {{"instance_id", "alpha"}, {"command", "echo plain"}});
  EXPECT_EQ(plain["result"]["structuredContent"]["stdout_tail"], "plain") << plain.dump();
  // With it: {task}, and tasks/result blocks until the job ends, then gives its CallToolResult.
  const int asked = server.request("tools/call", {{"name", "submit_job"},
                                                  {"arguments", {{"instance_id", "alpha"}, {"command", "sleep 2; echo later"}}},
                                                  {"task", {{"ttl", 60000}}}});
  const json created = server.wait_for(asked);
  ASSERT_TRUE(created.contains("result")) << created.dump();
  const json& task = created["result"]["task"];
  EXPECT_EQ(task["status"], "working");
  EXPECT_EQ(task["ttl"], nullptr) << "job records are kept: unlimited, whatever was asked";
  EXPECT_EQ(task["pollInterval"], 1000);
  const std::string id = task["taskId"];
  const auto started = std::chrono::steady_clock::now();
  const json result = server.wait_for(server.request("tasks/result", {{"taskId", id}}));
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(1000)) << "it waited for the end";
  ASSERT_TRUE(result.contains("result")) << result.dump();
  EXPECT_EQ(result["result"]["structuredContent"]["stdout_tail"], "later");
  EXPECT_EQ(result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"], id);
  const json got = server.wait_for(server.request("tasks/get", {{"taskId", id}}));
  EXPECT_EQ(got["result"]["status"], "completed") << got.dump();
  // A third job, cancelled.
  const json third = server.wait_for(server.request(
      "tools/call", {{"name", "submit_job"}, {"arguments", {{"instance_id", "alpha"}, {"command", "sleep 300"}}}, {"task", json::object()}}));
  const std::string third_id = third["result"]["task"]["taskId"];
  const json cancelled = server.wait_for(server.request("tasks/cancel", {{"taskId", third_id}}));
  ASSERT_TRUE(cancelled.contains("result")) << cancelled.dump();
  EXPECT_TRUE(eventually(
      [&] { return server.wait_for(server.request("tasks/get", {{"taskId", third_id}}))["result"]["status"] == "cancelled"; },
      std::chrono::seconds(20)));
  // tasks/list: the three jobs, newest first, two per page ([mcp] page_size = 2).
  std::vector<std::string> ids;
  json page = server.wait_for(server.request("tasks/list", json::object()));
  for (int pages = 1;; ++pages) {
    ASSERT_TRUE(page.contains("result")) << page.dump();
    EXPECT_LE(page["result"]["tasks"].size(), 2u);
    for (const auto& t : page["result"]["tasks"]) ids.push_back(t["taskId"]);
    if (!page["result"].contains("nextCursor")) {
      EXPECT_EQ(pages, 2);
      break;
    }
    page = server.wait_for(server.request("tasks/list", {{"cursor", page["result"]["nextCursor"]}}));
  }
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], third_id);
  EXPECT_EQ(ids[1], id);
}

TEST_F(Tasks, ALongTerminalCommandOfAModernClientBecomesATaskThatOutlivesItsServer) {
  std::string id;
  {
    ModernStdio first(env_);
    // A quick command answers at once, whatever its timeout.
    const json quick = first.rpc("tools/call", {{"name", "terminal_execute"},
                                                {"arguments", {{"instance_id", "alpha"}, {"command", "echo quick"}, {"timeout", 120}}}});
    ASSERT_TRUE(quick.contains("result")) << quick.dump();
    EXPECT_EQ(quick["result"]["resultType"], "complete");
    EXPECT_EQ(quick["result"]["structuredContent"]["stdout"], "quick\n");
    // A slow one with a timeout above 60 s becomes a task after 5 s.
    const json slow = first.rpc(
        "tools/call", {{"name", "terminal_execute"},
                       {"arguments", {{"instance_id", "alpha"}, {"command", "sleep 8; echo slow; exit 4"}, {"timeout", 120}}}});
    ASSERT_TRUE(slow.contains("result")) << slow.dump();
    EXPECT_EQ(slow["result"]["resultType"], "task");
    id = slow["result"]["taskId"];
  }
  // Its result, from a new server process, is terminal_execute's (not poll_job's).
  ModernStdio second(env_);
  const json done = follow(second, id);
  ASSERT_EQ(done["status"], "completed") << done.dump();
  const json& out = done["result"]["structuredContent"];
  EXPECT_EQ(out["stdout"], "slow\n") << out.dump();
  EXPECT_EQ(out["exit_code"], 4);
  EXPECT_EQ(out["instance_id"], "alpha");
  EXPECT_TRUE(out.contains("network"));
  EXPECT_GE(out["exec_duration_ms"].get<std::int64_t>(), 8000);
  EXPECT_FALSE(out.contains("job_id"));
}

TEST_F(Tasks, ATerminalCommandWithoutTheExtensionOrALongTimeoutRunsAsEver) {
  ModernStdio server(env_);
  const auto took = [&](json args, bool with_tasks) {
    const auto start = std::chrono::steady_clock::now();
    const json r = server.rpc("tools/call", {{"name", "terminal_execute"}, {"arguments", std::move(args)}}, with_tasks);
    EXPECT_EQ(r["result"]["resultType"], "complete") << r.dump();
    EXPECT_EQ(r["result"]["structuredContent"]["stdout"], "done\n") << r.dump();
    return std::chrono::steady_clock::now() - start;
  };
  // No extension: synchronous, however long.
  EXPECT_GE(took({{"instance_id", "alpha"}, {"command", "sleep 6; echo done"}, {"timeout", 120}}, false),
            std::chrono::seconds(6));
  // The extension, but a timeout of at most 60 s: synchronous too.
  EXPECT_GE(took({{"instance_id", "alpha"}, {"command", "sleep 6; echo done"}, {"timeout", 60}}, true),
            std::chrono::seconds(6));
}
