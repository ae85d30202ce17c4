// The instance tools over a fake sandbox backend (no kernel, no living sandbox): what they ask
// the backend, in which order, and what they publish. The living sandbox itself is tested with
// the bwrap backend elsewhere.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "cli/app.hpp"
#include "common/temp_dir.hpp"
#include "mcp/server.hpp"
#include "instances/computers.hpp"
#include "instances/instances.hpp"
#include "store/store.hpp"
#include "tools/internal.hpp"
#include "tools/tools.hpp"

namespace {

namespace sandbox = nshpc::sandbox;
namespace store = nshpc::store;
namespace tools = nshpc::tools;
namespace mcp = nshpc::mcp;
using nlohmann::json;

// Answers the living_* calls from a table and records them; runs nothing.
class FakeBackend final : public sandbox::Backend {
 public:
  std::map<std::string, sandbox::LivingStatus> status;  // by instance id; absent: never ran
  std::vector<std::string> calls;                        // "status a", "stop a restarted 7000", ...
  bool status_fails = false;
  std::optional<nshpc::NeedsAction> start_fails;  // thrown by start_living when set
  bool network_changes = false;                   // change_network applies a change at once
  bool share_pids = true;                         // commands_share_pids

  std::string_view name() const override { return "fake"; }
  std::vector<std::pair<std::string, std::string>> last_env;  // of the last run asked for
  std::unique_ptr<sandbox::Process> start(const sandbox::RunSpec& spec) override {
    last_env = spec.env;
    throw nshpc::Error("fake: no runs");
  }
  sandbox::LivingStatus living_status(const sandbox::Target& t) override {
    record("status " + t.instance_id);
    EXPECT_TRUE(t.persistent) << "living_status asked for a target that is not persistent: " << t.instance_id;
    if (status_fails) throw nshpc::Error("fake: cannot tell");
    return status[t.instance_id];
  }
  sandbox::LivingStatus start_living(const sandbox::Target& t) override {
    record("start " + t.instance_id);
    if (start_fails) throw *start_fails;
    auto& s = status[t.instance_id];
    s = {};
    s.running = true;
    s.since = std::chrono::system_clock::now();
    s.processes = 1;
    s.memory_bytes = 1 << 20;
    return s;
  }
  bool change_network(const sandbox::Target&) override { return network_changes; }
  bool stop_living(const sandbox::Target& t, std::string_view why, std::chrono::milliseconds grace) override {
    record(fmt::format("stop {} {} {}", t.instance_id, why, grace.count()));
    EXPECT_TRUE(std::filesystem::exists(t.workspace)) << "stopped after its files moved: " << t.instance_id;
    auto& s = status[t.instance_id];
    const bool was = s.running;
    s = {};
    if (was) {
      s.last_end = std::string(why);
      s.ended_at = std::chrono::system_clock::now();
    }
    return was;
  }
  std::vector<sandbox::LivingProcess> living_processes(const sandbox::Target& t) override {
    record("ps " + t.instance_id);
    return {};
  }
  bool commands_share_pids() const override { return share_pids; }
  std::vector<std::string> end_stray_sandboxes(const std::filesystem::path&) override { return {}; }
  std::vector<std::string> describe(const sandbox::RunSpec&) const override { return {}; }

 private:
  void record(std::string call) {
    std::lock_guard lock(mu_);
    calls.push_back(std::move(call));
  }
  std::mutex mu_;
};

class InstanceToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.ns.instances_dir = tmp_.path() / "instances";
    config_.server.state_dir = tmp_.path() / "state";
    config_.ns.sandbox_uid = static_cast<uint32_t>(::getuid());
    config_.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
    config_.ns.idle_stop = 900;
    config_.jobs.cancel_grace = 7;
    instances_ = std::make_unique<nshpc::instances::Service>(config_, std::move(owned_backend_));
    const tools::Services services{config_, *instances_, nullptr, /*job_tools=*/false};
    server_ = std::make_unique<mcp::Server>(tools::server_info(), tools::server_options(config_, services));
    tools::register_all(*server_, services);
    session_ = std::make_unique<mcp::Session>(
        *server_, "s1", [this](const json& m) { replies_.push_back(m); },
        [](std::function<void()> work) { work(); });
    rpc("initialize", {{"protocolVersion", "2025-11-25"},
                       {"capabilities", json::object()},
                       {"clientInfo", {{"name", "unit"}, {"version", "1"}}}});
    session_->receive(json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump());
  }
  void TearDown() override { session_.reset(); }

  json rpc(const std::string& method, json params) {
    const int id = next_id_++;
    session_->receive(json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}}.dump());
    for (const auto& m : replies_)
      if (m.contains("id") && m["id"] == id) return m;
    ADD_FAILURE() << "no reply to " << method;
    return json();
  }
  // The tool's result (isError, content, structuredContent).
  json call(const std::string& tool, json args = json::object()) {
    return rpc("tools/call", {{"name", tool}, {"arguments", std::move(args)}})["result"];
  }
  static std::string text(const json& result) { return result["content"][0]["text"].get<std::string>(); }
  void create(const std::string& id, bool persistent) {
    store::CreateOptions options;
    options.persistent = persistent;
    instances_->create(id, options, "test");
  }
  std::vector<std::string> audit_events(const std::string& id) {
    std::vector<std::string> events;
    std::ifstream in(config_.ns.instances_dir / id / "audit.log");
    for (std::string line; std::getline(in, line);) events.push_back(nshpc::parse_json(line)["event"]);
    return events;
  }

  nshpc::tests::TempDir tmp_;
  nshpc::config::Config config_;
  std::unique_ptr<FakeBackend> owned_backend_ = std::make_unique<FakeBackend>();
  FakeBackend& backend_ = *owned_backend_;  // owned by instances_ once it is made
  std::unique_ptr<nshpc::instances::Service> instances_;
  std::unique_ptr<mcp::Server> server_;
  std::unique_ptr<mcp::Session> session_;
  std::vector<json> replies_;
  int next_id_ = 1;
};

TEST_F(InstanceToolsTest, ToolsListHasStopAndRestartAndPersistentArguments) {
  const json list = rpc("tools/list", json::object())["result"]["tools"];
  std::map<std::string, json> by_name;
  for (const auto& t : list) by_name[t["name"]] = t;
  ASSERT_TRUE(by_name.count("stop_instance"));
  ASSERT_TRUE(by_name.count("restart_instance"));
  EXPECT_EQ(by_name["stop_instance"]["inputSchema"]["required"], json::array({"instance_id"}));
  EXPECT_EQ(by_name["create_instance"]["inputSchema"]["properties"]["persistent"]["type"], "boolean");
  EXPECT_EQ(by_name["update_instance"]["inputSchema"]["properties"]["persistent"]["type"], "boolean");
  EXPECT_EQ(by_name["describe_instance"]["outputSchema"]["type"], "object");
  EXPECT_NE(by_name["create_instance"]["description"].get<std::string>().find("15 min"), std::string::npos);
}

TEST_F(InstanceToolsTest, CreateAndUpdateTakePersistent) {
  json created = call("create_instance", {{"instance_id", "liv"}, {"persistent", true}});
  ASSERT_FALSE(created.value("isError", false)) << created;
  EXPECT_EQ(created["structuredContent"]["persistent"], true);
  EXPECT_TRUE(instances_->store().get("liv").persistent);
  json plain = call("create_instance", {{"instance_id", "eph"}});
  EXPECT_EQ(plain["structuredContent"]["persistent"], false);

  json updated = call("update_instance", {{"instance_id", "eph"}, {"persistent", true}});
  ASSERT_FALSE(updated.value("isError", false)) << updated;
  EXPECT_EQ(updated["structuredContent"]["persistent"], true);
  EXPECT_TRUE(instances_->store().get("eph").persistent);
}

TEST_F(InstanceToolsTest, MakingARunningInstanceNonPersistentIsRefused) {
  create("liv", true);
  backend_.status["liv"].running = true;
  json refused = call("update_instance", {{"instance_id", "liv"}, {"persistent", false}});
  EXPECT_TRUE(refused.value("isError", false));
  EXPECT_NE(text(refused).find("stop_instance"), std::string::npos) << text(refused);
  EXPECT_TRUE(instances_->store().get("liv").persistent);

  backend_.status["liv"].running = false;
  json done = call("update_instance", {{"instance_id", "liv"}, {"persistent", false}});
  EXPECT_FALSE(done.value("isError", false)) << done;
  EXPECT_FALSE(instances_->store().get("liv").persistent);
}

TEST_F(InstanceToolsTest, ListAsksTheBackendOnlyAboutPersistentInstances) {
  create("eph", false);
  create("liv", true);
  create("off", true);
  auto& s = backend_.status["liv"];
  s.running = true;
  s.since = std::chrono::system_clock::now();
  s.processes = 3;
  s.memory_bytes = 5 << 20;
  backend_.status["off"].last_end = "idle for 900 s";

  json listed = call("list_instances", {{"sort", "id"}});
  ASSERT_FALSE(listed.value("isError", false)) << listed;
  EXPECT_EQ(backend_.calls, (std::vector<std::string>{"status liv", "status off"}));
  const json& items = listed["structuredContent"]["instances"];
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["persistent"], false);
  EXPECT_FALSE(items[0].contains("state"));
  EXPECT_EQ(items[1]["state"], "running");
  EXPECT_EQ(items[1]["processes"], 3);
  EXPECT_EQ(items[1]["memory_bytes"], 5 << 20);
  EXPECT_TRUE(items[1].contains("running_since"));
  EXPECT_EQ(items[2]["state"], "stopped");
  EXPECT_EQ(items[2]["last_end"], "idle for 900 s");
  EXPECT_NE(text(listed).find("running since"), std::string::npos) << text(listed);
  EXPECT_NE(text(listed).find("stopped (last: idle for 900 s)"), std::string::npos) << text(listed);
}

TEST_F(InstanceToolsTest, AnUnknownStateNeverFailsTheListing) {
  create("liv", true);
  backend_.status_fails = true;
  json listed = call("list_instances");
  ASSERT_FALSE(listed.value("isError", false)) << listed;
  EXPECT_EQ(listed["structuredContent"]["instances"][0]["state"], "unknown");
  EXPECT_EQ(listed["structuredContent"]["instances"][0]["state_error"], "fake: cannot tell");
}

TEST_F(InstanceToolsTest, DescribeShowsTheLivingState) {
  create("liv", true);
  backend_.status["liv"].running = true;
  backend_.status["liv"].processes = 2;
  json described = call("describe_instance", {{"instance_id", "liv"}});
  ASSERT_FALSE(described.value("isError", false)) << described;
  EXPECT_EQ(described["structuredContent"]["state"], "running");
  EXPECT_NE(text(described).find("Persistent: yes, running"), std::string::npos) << text(described);
}

TEST_F(InstanceToolsTest, StopEndsTheLivingSandboxWithTheCancelGrace) {
  create("liv", true);
  backend_.status["liv"].running = true;
  json stopped = call("stop_instance", {{"instance_id", "liv"}});
  ASSERT_FALSE(stopped.value("isError", false)) << stopped;
  EXPECT_EQ(backend_.calls, (std::vector<std::string>{"stop liv stopped 7000", "status liv"}));
  EXPECT_EQ(stopped["structuredContent"]["was_running"], true);
  EXPECT_EQ(stopped["structuredContent"]["state"], "stopped");
  EXPECT_EQ(stopped["structuredContent"]["jobs_ended"], json::array());
  EXPECT_NE(text(stopped).find("Stopped instance 'liv'"), std::string::npos) << text(stopped);
  const auto events = audit_events("liv");
  EXPECT_NE(std::find(events.begin(), events.end(), "instance.stopped"), events.end());

  json again = call("stop_instance", {{"instance_id", "liv"}});
  EXPECT_FALSE(again.value("isError", false));
  EXPECT_EQ(again["structuredContent"]["was_running"], false);
  EXPECT_NE(text(again).find("was not running"), std::string::npos) << text(again);
}

TEST_F(InstanceToolsTest, RestartStopsThenStartsAFreshSandbox) {
  create("liv", true);
  backend_.status["liv"].running = true;
  json restarted = call("restart_instance", {{"instance_id", "liv"}});
  ASSERT_FALSE(restarted.value("isError", false)) << restarted;
  EXPECT_EQ(backend_.calls, (std::vector<std::string>{"stop liv restarted 7000", "start liv"}));
  EXPECT_EQ(restarted["structuredContent"]["state"], "running");
  EXPECT_EQ(restarted["structuredContent"]["was_running"], true);
  const auto events = audit_events("liv");
  EXPECT_NE(std::find(events.begin(), events.end(), "instance.restarted"), events.end());
}

TEST_F(InstanceToolsTest, StopAndRestartRefuseWhatIsNotLiving) {
  create("eph", false);
  for (const char* tool : {"stop_instance", "restart_instance"}) {
    json refused = call(tool, {{"instance_id", "eph"}});
    EXPECT_TRUE(refused.value("isError", false)) << tool;
    EXPECT_NE(text(refused).find("not persistent"), std::string::npos) << text(refused);
    json missing = call(tool, {{"instance_id", "ghost"}});
    EXPECT_TRUE(missing.value("isError", false)) << tool;
    EXPECT_NE(text(missing).find("'ghost' not found; list_instances"), std::string::npos) << text(missing);
  }
  EXPECT_TRUE(backend_.calls.empty());
}

// Every instance's sandbox side is ended before its files move: a living sandbox, and the groups
// an ephemeral instance's commands left.
TEST_F(InstanceToolsTest, ArchiveAndDeleteStopALivingInstanceFirst) {
  create("liv", true);
  create("gone", true);
  create("eph", false);
  EXPECT_FALSE(call("archive_instance", {{"instance_id", "liv"}}).value("isError", false));
  EXPECT_FALSE(call("delete_instance", {{"instance_id", "gone"}}).value("isError", false));
  EXPECT_FALSE(call("archive_instance", {{"instance_id", "eph"}}).value("isError", false));
  std::vector<std::string> stops;
  for (const std::string& c : backend_.calls)
    if (c.starts_with("stop ")) stops.push_back(c);
  EXPECT_EQ(stops, (std::vector<std::string>{"stop liv archived 7000", "stop gone deleted 7000", "stop eph archived 7000"}));
}

// Reset and snapshots of instances on the host's root (their workspace only), through the tools,
// with the real store and cp: a living one is stopped first, each step is audited, errors name
// what exists. (Image instances: tests/integration/test_snapshots.cpp, as root.)
TEST_F(InstanceToolsTest, SnapshotsOfAHostRootInstanceStopItFirstAndRestoreItsWorkspace) {
  create("liv", true);
  backend_.status["liv"].running = true;
  const auto ws = config_.ns.instances_dir / "liv" / "workspace";
  std::ofstream(ws / "a") << "one";
  std::filesystem::create_directories(ws / "sub");
  std::filesystem::create_symlink("/etc/passwd", ws / "sub" / "link");
  json taken = call("snapshot_instance", {{"instance_id", "liv"}, {"name", "s1"}});
  ASSERT_FALSE(taken.value("isError", false)) << taken;
  EXPECT_EQ(taken["structuredContent"]["was_running"], true);
  EXPECT_EQ(taken["structuredContent"]["snapshot"]["has_layer"], false);
  EXPECT_EQ(taken["structuredContent"]["restarted"], true);
  EXPECT_NE(text(taken).find("Its sandbox was stopped for this (every process ended) and runs again."),
            std::string::npos)
      << text(taken);
  EXPECT_EQ(backend_.calls.front(), "stop liv stopped for a snapshot 7000");

  std::ofstream(ws / "a") << "two";
  std::ofstream(ws / "b") << "new";
  json restored = call("restore_snapshot", {{"instance_id", "liv"}, {"name", "s1"}});
  ASSERT_FALSE(restored.value("isError", false)) << restored;
  std::ifstream a(ws / "a");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), "one");
  EXPECT_FALSE(std::filesystem::exists(ws / "b"));
  EXPECT_EQ(std::filesystem::read_symlink(ws / "sub" / "link"), "/etc/passwd") << "a link stays a link";

  json taken_again = call("snapshot_instance", {{"instance_id", "liv"}, {"name", "s1"}});
  EXPECT_TRUE(taken_again.value("isError", false));
  EXPECT_NE(text(taken_again).find("already has a snapshot named 's1'"), std::string::npos) << text(taken_again);
  json unknown = call("delete_snapshot", {{"instance_id", "liv"}, {"name", "s2"}});
  EXPECT_NE(text(unknown).find("has no snapshot 's2'; its snapshots: s1"), std::string::npos) << text(unknown);
  json bad = call("restore_snapshot", {{"instance_id", "liv"}, {"name", ".."}});
  EXPECT_NE(text(bad).find("'..' is not a snapshot name"), std::string::npos) << text(bad);

  json refused = call("factory_reset_instance", {{"instance_id", "liv"}});
  EXPECT_TRUE(refused.value("isError", false));
  EXPECT_NE(text(refused).find("runs on the host's root (read-only)"), std::string::npos) << text(refused);
  EXPECT_TRUE(std::filesystem::exists(ws / "a"));
  json wiped = call("factory_reset_instance", {{"instance_id", "liv"}, {"include_workspace", true}});
  ASSERT_FALSE(wiped.value("isError", false)) << wiped;
  EXPECT_EQ(wiped["structuredContent"]["workspace_emptied"], true);
  EXPECT_EQ(wiped["structuredContent"]["layer_reset"], false);
  EXPECT_TRUE(std::filesystem::is_empty(ws));

  json listed = call("list_snapshots", {{"instance_id", "liv"}});
  EXPECT_EQ(listed["structuredContent"]["count"], 1);
  json described = call("describe_instance", {{"instance_id", "liv"}});
  EXPECT_GT(described["structuredContent"]["disk_usage"]["snapshots_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(described["structuredContent"]["disk_usage"]["layer_bytes"], 0);
  EXPECT_FALSE(call("delete_snapshot", {{"instance_id", "liv"}, {"name", "s1"}}).value("isError", false));
  EXPECT_EQ(call("list_snapshots", {{"instance_id", "liv"}})["structuredContent"]["count"], 0);

  const auto events = audit_events("liv");
  for (const char* event : {"instance.snapshot_taken", "instance.snapshot_restored", "instance.reset",
                            "instance.snapshot_deleted"})
    EXPECT_NE(std::find(events.begin(), events.end(), event), events.end()) << event;
}

// A living sandbox is stopped for each copy or swap and started again after it, in that order;
// one that was not running stays stopped.
TEST_F(InstanceToolsTest, ALivingSandboxIsStoppedForTheCopyAndStartedAgainAfterIt) {
  create("liv", true);
  json first = call("snapshot_instance", {{"instance_id", "liv"}, {"name", "s1"}});
  ASSERT_FALSE(first.value("isError", false)) << first;
  EXPECT_EQ(first["structuredContent"]["restarted"], false);
  EXPECT_EQ(std::count(backend_.calls.begin(), backend_.calls.end(), "start liv"), 0);
  EXPECT_FALSE(backend_.status["liv"].running);
  backend_.status["liv"].running = true;
  backend_.calls.clear();
  json restored = call("restore_snapshot", {{"instance_id", "liv"}, {"name", "s1"}});
  ASSERT_FALSE(restored.value("isError", false)) << restored;
  EXPECT_EQ(restored["structuredContent"]["was_running"], true);
  EXPECT_EQ(restored["structuredContent"]["restarted"], true);
  const auto stop = std::find(backend_.calls.begin(), backend_.calls.end(), "stop liv stopped for a snapshot's restore 7000");
  const auto start = std::find(backend_.calls.begin(), backend_.calls.end(), "start liv");
  ASSERT_NE(stop, backend_.calls.end());
  ASSERT_NE(start, backend_.calls.end());
  EXPECT_LT(stop, start) << "stopped for the copy, started after it";
  EXPECT_TRUE(backend_.status["liv"].running);
}

// An ephemeral instance has no living sandbox to stop: nothing is asked of the backend.
TEST_F(InstanceToolsTest, SnapshotsOfAnEphemeralInstanceAskNothingOfTheBackend) {
  create("eph", false);
  json taken = call("snapshot_instance", {{"instance_id", "eph"}, {"name", "s1"}});
  ASSERT_FALSE(taken.value("isError", false)) << taken;
  EXPECT_EQ(taken["structuredContent"]["was_running"], false);
  EXPECT_TRUE(backend_.calls.empty()) << backend_.calls.front();
}

// What only an action mends is found below the faces and worded by each face for its audience:
// the tool result names the tool that does it, or what to ask of the server's operator, and never
// a command for the agent to run; the CLI names its commands and no tool.
TEST_F(InstanceToolsTest, WhatNeedsAnActionIsWordedForTheAgentAndForThePerson) {
  using Action = nshpc::NeedsAction::Action;
  struct Case {
    Action action;
    std::string tool;  // in the tool result
    std::string cli;   // in the CLI's advice
  };
  const std::vector<Case> cases = {
      {Action::choose_network, "update_instance with network 'filtered' or 'off'",
       "choose 'filtered' or 'off' (ns-hpc instance update liv --network filtered)"},
      {Action::reset_instance, "factory_reset_instance puts its root back to the image, or restore_snapshot",
       "(ns-hpc instance reset liv) or restore a snapshot (ns-hpc instance snapshot-restore liv NAME)"},
      {Action::build_image, "ask the server's operator to build the image as the user who runs the server",
       "build the image as the user who runs ns-hpc (ns-hpc image build NAME)"},
      {Action::check_id_ranges, "ask the server's operator to check the ranges in /etc/subuid and /etc/subgid",
       "check your ranges in /etc/subuid and /etc/subgid ('ns-hpc doctor' checks them)"},
      {Action::check_host, "try again; if it fails again, ask the server's operator to run `ns-hpc doctor`",
       "run 'ns-hpc doctor' and try again"},
  };
  create("liv", true);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cli);
    backend_.start_fails = nshpc::NeedsAction(c.action, "instance 'liv': what was found", "liv");
    const json result = call("restart_instance", {{"instance_id", "liv"}});
    ASSERT_TRUE(result.value("isError", false)) << result;
    const std::string said = text(result);
    EXPECT_EQ(said.rfind("instance 'liv': what was found; ", 0), 0u) << said;
    EXPECT_NE(said.find(c.tool), std::string::npos) << said;
    // An agent runs no CLI: a command is named only as what the operator is asked to run.
    const auto named = said.find("ns-hpc ");
    if (named != std::string::npos) EXPECT_LT(said.find("the server's operator"), named) << said;
    for (const char* command : {"ns-hpc instance", "ns-hpc image", "--network"})
      EXPECT_EQ(said.find(command), std::string::npos) << said;

    const std::string advice = nshpc::cli::needs_action_advice(*backend_.start_fails);
    EXPECT_NE(advice.find(c.cli), std::string::npos) << advice;
    for (const char* tool : {"_instance", "_snapshot", "operator"})
      EXPECT_EQ(advice.find(tool), std::string::npos) << advice;
  }
  // Where the failing layer does not know the instance, the CLI names the argument to give.
  EXPECT_NE(nshpc::cli::needs_action_advice(nshpc::NeedsAction(Action::reset_instance, "a layer"))
                .find("ns-hpc instance reset ID"),
            std::string::npos);
}

// tools/list is read by a model on every turn: every tool says what it does, every argument (nested
// ones too) what it is, and an outputSchema names only the fields every result has.
TEST_F(InstanceToolsTest, EveryToolAndEveryArgumentIsDescribed) {
  const json list = rpc("tools/list", json::object())["result"]["tools"];
  ASSERT_GT(list.size(), 20u);
  std::function<void(const std::string&, const json&)> described = [&](const std::string& where, const json& schema) {
    if (!schema.contains("properties")) return;
    for (const auto& [name, property] : schema["properties"].items()) {
      const std::string at = where + "." + name;
      EXPECT_FALSE(property.value("description", "").empty()) << at << " has no description";
      described(at, property);
    }
  };
  for (const json& tool : list) {
    const std::string name = tool["name"];
    EXPECT_FALSE(tool.value("description", "").empty()) << name;
    EXPECT_FALSE(tool.contains("title")) << name << ": the name says it";
    described(name, tool["inputSchema"]);
    EXPECT_EQ(tool["outputSchema"]["type"], "object") << name;
    EXPECT_FALSE(tool["outputSchema"]["required"].empty()) << name;
  }
}

// The guide served as ns-hpc.md names every tool this server has, and neither it nor the server's
// instructions say the network is "'host' or 'off'": instances default to nat, and filtered exists.
TEST_F(InstanceToolsTest, TheGuideAndTheInstructionsNameEveryToolAndNetworkMode) {
  const json read = rpc("resources/read", {{"uri", "resource://ns-hpc/context/ns-hpc.md"}});
  ASSERT_TRUE(read.contains("result")) << read;
  const std::string guide = read["result"]["contents"][0]["text"];
  for (const json& tool : rpc("tools/list", json::object())["result"]["tools"])
    EXPECT_NE(guide.find("`" + tool["name"].get<std::string>() + "`"), std::string::npos)
        << tool["name"] << " is not in the guide's tool table";
  for (const char* mode : {"`off`", "`nat`", "`filtered`", "`host`"}) EXPECT_NE(guide.find(mode), std::string::npos) << mode;
  EXPECT_EQ(guide.find("`host` or `off`"), std::string::npos);
  const std::string instructions = tools::server_info().instructions;
  for (const char* mode : {"'off'", "'nat'", "'filtered'", "'host'"})
    EXPECT_NE(instructions.find(mode), std::string::npos) << mode << " in: " << instructions;
  EXPECT_EQ(instructions.find("'host' or 'off'"), std::string::npos) << instructions;
}

// describe_instance counts a running instance's processes once: the living state's count (what
// runs in its sandbox); the instance group's count is shown only against limits that are set.
TEST_F(InstanceToolsTest, DescribeCountsTheProcessesOnce) {
  create("liv", true);
  backend_.status["liv"].running = true;
  backend_.status["liv"].processes = 2;
  json described = call("describe_instance", {{"instance_id", "liv"}});
  ASSERT_FALSE(described.value("isError", false)) << described;
  const std::string said = text(described);
  EXPECT_NE(said.find("2 processes in its sandbox"), std::string::npos) << said;
  const std::regex count("[0-9]+ process");
  EXPECT_EQ(std::distance(std::sregex_iterator(said.begin(), said.end(), count), std::sregex_iterator()), 1) << said;
  EXPECT_EQ(described["structuredContent"]["processes"], 2);
  EXPECT_FALSE(described["structuredContent"]["limits"].contains("usage")) << "no limits here: nothing counted against them";
}

// A network switch applied at once says what it did: turning the network on cuts nothing.
TEST_F(InstanceToolsTest, ANetworkSwitchSaysWhatChanged) {
  backend_.network_changes = true;
  ASSERT_FALSE(call("create_instance", {{"instance_id", "n"}, {"network", "off"}}).value("isError", false));
  const std::string on = text(call("set_network_access", {{"instance_id", "n"}, {"enabled", true}}));
  EXPECT_NE(on.find("applied at once: its processes keep running and may now connect out"), std::string::npos) << on;
  EXPECT_EQ(on.find("cut"), std::string::npos) << on;
  const std::string off = text(call("set_network_access", {{"instance_id", "n"}, {"enabled", false}}));
  EXPECT_NE(off.find("their connections out were cut"), std::string::npos) << off;
  const std::string filtered = text(call("update_instance", {{"instance_id", "n"}, {"network", "filtered"}}));
  EXPECT_NE(filtered.find("may now connect out ('filtered')"), std::string::npos) << filtered;
  const std::string added = text(call("update_instance", {{"instance_id", "n"}, {"network_allow", {"pypi.org"}}}));
  EXPECT_NE(added.find("may now reach the hosts added"), std::string::npos) << added;
  const std::string removed = text(call("update_instance", {{"instance_id", "n"}, {"network_allow", json::array()}}));
  EXPECT_NE(removed.find("connections the new allow list forbids were cut"), std::string::npos) << removed;
}

// list_instances shows which instances are on an image, in the text and the data.
TEST_F(InstanceToolsTest, ListInstancesShowsWhichAreOnAnImage) {
  create("plain", false);
  create("img", false);
  const auto meta_file = config_.ns.instances_dir / "img" / "metadata.json";
  json meta = nshpc::parse_json([&] {
    std::ifstream in(meta_file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }());
  meta["root"] = "image:deb@1";
  meta["ids"] = {{"host_base", ::getuid()}, {"count", 1}};
  std::ofstream(meta_file) << meta.dump();
  json listed = call("list_instances", {{"sort", "id"}});
  ASSERT_FALSE(listed.value("isError", false)) << listed;
  const json& items = listed["structuredContent"]["instances"];
  ASSERT_EQ(items.size(), 2u) << listed;
  EXPECT_EQ(items[0]["image"], "deb@1");
  EXPECT_FALSE(items[1].contains("image"));
  EXPECT_NE(text(listed).find("img  (on image deb@1, "), std::string::npos) << text(listed);
}

// restore_instance takes instance_id as every other tool does: the id it was archived from (its
// newest archive) or an archive name; given with archive_name, both must name the same archive.
TEST_F(InstanceToolsTest, RestoreTakesTheInstanceIdItWasArchivedFrom) {
  create("lab", false);
  const std::string first = call("archive_instance", {{"instance_id", "lab"}})["structuredContent"]["archive_name"];
  json back = call("restore_instance", {{"instance_id", "lab"}});
  ASSERT_FALSE(back.value("isError", false)) << back;
  EXPECT_EQ(back["structuredContent"]["id"], "lab");
  EXPECT_EQ(back["structuredContent"]["restored_from"], first);

  const std::string second = call("archive_instance", {{"instance_id", "lab"}})["structuredContent"]["archive_name"];
  json both = call("restore_instance", {{"archive_name", second}, {"instance_id", "lab"}, {"new_instance_id", "lab2"}});
  ASSERT_FALSE(both.value("isError", false)) << both;
  EXPECT_EQ(both["structuredContent"]["id"], "lab2");

  create("other", false);
  const std::string third = call("archive_instance", {{"instance_id", "other"}})["structuredContent"]["archive_name"];
  json disagree = call("restore_instance", {{"archive_name", third}, {"instance_id", "lab"}});
  EXPECT_TRUE(disagree.value("isError", false)) << disagree;
  EXPECT_NE(text(disagree).find("do not name the same archive"), std::string::npos) << text(disagree);
  json neither = call("restore_instance", json::object());
  EXPECT_TRUE(neither.value("isError", false));
  EXPECT_NE(text(neither).find("give archive_name or instance_id"), std::string::npos) << text(neither);
}

// read_file says which lines a page holds and whether it is the whole file; the old `truncated`
// (which meant "a long line was cut", false on a partial page) is gone.
TEST_F(InstanceToolsTest, APartialPageOfAFileSaysSo) {
  config_.ns.workspace_mount = "/workspace";  // as a config file gives it
  config_.ns.output_mount = "/output";
  create("f", false);
  {
    std::ofstream out(config_.ns.instances_dir / "f" / "workspace" / "big.txt");
    for (int i = 1; i <= 500; ++i) out << "line " << i << "\n";
  }
  json page = call("read_file", {{"instance_id", "f"}, {"path", "big.txt"}, {"limit", 10}});
  ASSERT_FALSE(page.value("isError", false)) << page;
  const json& s = page["structuredContent"];
  EXPECT_FALSE(s.contains("truncated")) << s;
  EXPECT_EQ(s["complete"], false);
  EXPECT_EQ(s["offset"], 1);
  EXPECT_EQ(s["lines"], 10);
  EXPECT_EQ(s["total_lines"], 500);
  EXPECT_EQ(s["next_offset"], 11);
  EXPECT_EQ(s["long_lines_cut"], 0);
  EXPECT_NE(text(page).find("lines 1-10 of 500"), std::string::npos) << text(page);
  EXPECT_NE(text(page).find("[more: read_file with offset 11 for the next lines (490 left)]"), std::string::npos)
      << text(page);
  json whole = call("read_file", {{"instance_id", "f"}, {"path", "big.txt"}});
  EXPECT_EQ(whole["structuredContent"]["complete"], true) << whole["structuredContent"];
  EXPECT_FALSE(whole["structuredContent"].contains("next_offset"));
}

// terminal_execute's description says what this server does with a persistent instance's
// background processes, for both answers of the backend.
TEST(InstanceToolsDescription, TerminalSaysWhetherLaterCallsSeeBackgroundProcesses) {
  for (const bool share : {true, false}) {
    SCOPED_TRACE(share);
    nshpc::tests::TempDir tmp;
    nshpc::config::Config config;
    config.ns.instances_dir = tmp.path() / "instances";
    config.server.state_dir = tmp.path() / "state";
    config.ns.sandbox_uid = static_cast<uint32_t>(::getuid());
    config.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
    auto backend = std::make_unique<FakeBackend>();
    backend->share_pids = share;
    nshpc::instances::Service instances(config, std::move(backend));
    const tools::Services services{config, instances, nullptr, /*job_tools=*/false};
    mcp::Server server(tools::server_info(), tools::server_options(config, services));
    tools::register_all(server, services);
    std::vector<json> replies;
    mcp::Session session(server, "s1", [&](const json& m) { replies.push_back(m); },
                         [](std::function<void()> work) { work(); });
    session.receive(json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"},
                         {"params", {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()},
                                     {"clientInfo", {{"name", "unit"}, {"version", "1"}}}}}}.dump());
    session.receive(json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump());
    session.receive(json{{"jsonrpc", "2.0"}, {"id", 2}, {"method", "tools/list"}, {"params", json::object()}}.dump());
    std::string description;
    for (const json& m : replies)
      if (m.value("id", 0) == 2)
        for (const json& tool : m["result"]["tools"])
          if (tool["name"] == "terminal_execute") description = tool["description"];
    ASSERT_FALSE(description.empty());
    if (share) {
      EXPECT_NE(description.find("keeps background processes and /tmp (later calls' ps and kill see them)"),
                std::string::npos) << description;
    } else {
      EXPECT_NE(description.find("(they run on, but later calls' ps and kill do not see them)"), std::string::npos)
          << description;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Below the protocol: what a request's trace context and its lack of a session mean for what it
// starts, the audit and temporary computers.

namespace {

// A request as the MCP core describes it to a tool; `session` empty: a 2026-07-28 request.
class StubRequest final : public mcp::RequestContext {
 public:
  StubRequest(std::string session, std::string traceparent, std::string tracestate = {})
      : session_(std::move(session)), traceparent_(std::move(traceparent)), tracestate_(std::move(tracestate)) {}
  bool cancelled() const override { return false; }
  bool wait_cancelled_for(std::chrono::milliseconds) const override { return false; }
  void progress(double, std::optional<double>, const std::string&) override {}
  void log(mcp::LogLevel, const json&, const std::string&) override {}
  mcp::Era era() const override { return session_.empty() ? mcp::Era::modern : mcp::Era::legacy; }
  const std::string& protocol_version() const override { return version_; }
  std::string client_name() const override { return "unit/1"; }
  const std::string& session_id() const override { return session_; }
  json client_capabilities() const override { return json::object(); }
  const std::string& traceparent() const override { return traceparent_; }
  const std::string& tracestate() const override { return tracestate_; }
  const json& input_responses() const override { return responses_; }
  const std::string& request_state() const override { return state_; }
  TaskMode task_mode() const override { return TaskMode::none; }
  std::optional<std::int64_t> requested_task_ttl() const override { return std::nullopt; }
  json request_client(const std::string&, json, std::chrono::milliseconds) override {
    throw nshpc::Error("no client here");
  }

 private:
  std::string session_, traceparent_, tracestate_;
  std::string version_ = "2026-07-28", state_;
  json responses_ = json::object();
};

constexpr const char* kTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

std::optional<std::string> env_value(const std::vector<std::pair<std::string, std::string>>& env, const char* name) {
  for (const auto& [n, v] : env)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace

TEST_F(InstanceToolsTest, ACallsTraceReachesTheCommandsEnvironmentAndItsAuditLine) {
  create("t", false);
  const tools::ToolContext ctx{tools::Services{config_, *instances_, nullptr, false}};
  const store::Instance inst = instances_->store().get("t");
  tools::TerminalRequest req;
  req.instance_id = "t";
  req.argv = {"env"};
  req.timeout = 5;
  StubRequest traced("", kTraceparent, "vendor=1");
  EXPECT_THROW(tools::run_terminal_request(ctx, inst, req, 1024, traced), nshpc::Error);  // the fake runs nothing
  EXPECT_EQ(env_value(backend_.last_env, "TRACEPARENT"), kTraceparent);
  EXPECT_EQ(env_value(backend_.last_env, "TRACESTATE"), "vendor=1");

  StubRequest plain("s1", "");
  EXPECT_THROW(tools::run_terminal_request(ctx, inst, req, 1024, plain), nshpc::Error);
  EXPECT_FALSE(env_value(backend_.last_env, "TRACEPARENT"));
  EXPECT_FALSE(env_value(backend_.last_env, "TRACESTATE"));

  // A variable the caller gave itself stays theirs.
  req.env = {{"TRACEPARENT", "mine"}};
  EXPECT_THROW(tools::run_terminal_request(ctx, inst, req, 1024, traced), nshpc::Error);
  EXPECT_EQ(env_value(backend_.last_env, "TRACEPARENT"), "mine");

  // The audit line: the trace, and a sessionless actor without a dangling '@'.
  mcp::ToolResult result = mcp::ToolResult::text("ok");
  tools::audit_tool_call(ctx, "terminal_execute", {{"instance_id", "t"}}, result, std::chrono::milliseconds(3), traced);
  tools::audit_tool_call(ctx, "terminal_execute", {{"instance_id", "t"}}, result, std::chrono::milliseconds(3), plain);
  std::vector<json> calls;
  std::ifstream in(config_.ns.instances_dir / "t" / "audit.log");
  for (std::string line; std::getline(in, line);)
    if (json j = nshpc::parse_json(line); j["event"] == "mcp.tool_call") calls.push_back(j);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].dump().find("\"traceparent\":\"" + std::string(kTraceparent) + "\"") != std::string::npos, true)
      << calls[0].dump();
  EXPECT_NE(calls[0].dump().find("\"tracestate\":\"vendor=1\""), std::string::npos) << calls[0].dump();
  EXPECT_NE(calls[0].dump().find("\"mcp:unit/1\""), std::string::npos) << calls[0].dump();
  EXPECT_EQ(calls[1].dump().find("traceparent"), std::string::npos) << calls[1].dump();
  EXPECT_NE(calls[1].dump().find("\"mcp:unit/1@s1\""), std::string::npos) << calls[1].dump();
}

TEST(JobTrace, LocalJobsGetItInTheirEnvironmentSlurmJobsThroughEnv1) {
  StubRequest traced("", kTraceparent);
  nshpc::jobs::SubmitRequest local = nshpc::jobs::shell_job("t", "echo hi", "/bin/bash");
  tools::add_job_trace(local, traced);
  EXPECT_EQ(env_value(local.env, "TRACEPARENT"), kTraceparent);
  EXPECT_FALSE(env_value(local.env, "TRACESTATE"));  // none was sent

  nshpc::jobs::SubmitRequest slurm = nshpc::jobs::shell_job("t", "echo hi", "/bin/bash");
  slurm.mode = nshpc::jobs::Mode::slurm;
  tools::add_job_trace(slurm, traced);
  EXPECT_TRUE(slurm.env.empty());  // Slurm jobs take no variables
  EXPECT_EQ(slurm.argv, (std::vector<std::string>{"/usr/bin/env", std::string("TRACEPARENT=") + kTraceparent,
                                                   "/bin/bash", "-c", "echo hi"}));
  EXPECT_EQ(slurm.display, "echo hi");

  nshpc::jobs::SubmitRequest untraced = nshpc::jobs::shell_job("t", "echo hi", "/bin/bash");
  untraced.mode = nshpc::jobs::Mode::slurm;
  StubRequest plain("s1", "");
  tools::add_job_trace(untraced, plain);
  EXPECT_EQ(untraced.argv, (std::vector<std::string>{"/bin/bash", "-c", "echo hi"}));
}

// Temporary computers of requests without a session: held by this process's lease.
class ComputerLeaseTest : public InstanceToolsTest {
 protected:
  void SetUp() override {
    // A finished image on disk, as `ns-hpc image build` leaves one (the fake backend runs nothing on it).
    config_.ns.images_dir = tmp_.path() / "images";
    config_.ns.default_image = "debian";
    const auto version = config_.ns.images_dir / "debian" / "20260101T000000Z";
    std::filesystem::create_directories(version / "rootfs" / "usr");
    std::ofstream(version / "image.json") << R"({"suite": "bookworm", "owners": "root"})";
    std::filesystem::create_directory_symlink("20260101T000000Z", config_.ns.images_dir / "debian" / "current");
    InstanceToolsTest::SetUp();
  }
  bool exists(const std::string& id) { return instances_->store().exists(id); }
};

TEST_F(ComputerLeaseTest, ALeaseExpiresARenewalExtendsItALegacyHolderIsUnaffected) {
  nshpc::instances::Computers computers(*instances_, "debian", std::chrono::seconds(2));
  const std::string lease = nshpc::instances::lease_key();
  EXPECT_TRUE(nshpc::instances::is_lease_key(lease));
  EXPECT_FALSE(nshpc::instances::is_lease_key(nshpc::instances::owner_key("stdio")));
  computers.acquire("leased", true, nshpc::config::Network::off, lease, "test");
  computers.acquire("legacy", true, nshpc::config::Network::off, nshpc::instances::owner_key("s1"), "test");
  EXPECT_TRUE(computers.expire_leases("test").empty());  // within its lease
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_TRUE(computers.renew("leased"));  // two more seconds from now
  EXPECT_FALSE(computers.renew("legacy"));  // a session holds it, not a lease
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_TRUE(computers.expire_leases("test").empty()) << "2.4 s after it was made, 1.2 s after its renewal";
  EXPECT_TRUE(exists("leased"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_EQ(computers.expire_leases("test"), std::vector<std::string>{"leased"});
  EXPECT_FALSE(exists("leased"));
  EXPECT_TRUE(exists("legacy"));  // its session still runs (this process)
  EXPECT_TRUE(computers.sweep("test").empty());
  EXPECT_EQ(computers.release(nshpc::instances::owner_key("s1"), "test"), std::vector<std::string>{"legacy"});
}

TEST_F(ComputerLeaseTest, ASweepOfAnotherServerCountsALeaseOnlyUntilItRunsOut) {
  nshpc::instances::Computers mine(*instances_, "debian", std::chrono::seconds(1));
  mine.acquire("leased", true, nshpc::config::Network::off, nshpc::instances::lease_key(), "test");
  nshpc::instances::Computers other(*instances_, "debian");  // another server process's view
  EXPECT_TRUE(other.sweep("test").empty());
  EXPECT_EQ(other.list().at(0).holders, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_EQ(other.sweep("test"), std::vector<std::string>{"leased"});
}

TEST_F(ComputerLeaseTest, ASessionlessComputerCreateTakesALease) {
  // Through the computer's tool layer, as a 2026-07-28 client calls it (no session).
  const tools::Services services{config_, *instances_, nullptr, /*job_tools=*/false};
  mcp::Server server(tools::server_info(), tools::computer_server_options(config_, services, "home"));
  tools::ComputerSettings settings;
  settings.computer_id = "home";
  settings.lease = std::chrono::seconds(1);
  tools::register_computer(server, services, settings);
  mcp::Session session(server, "s1", [this](const json& m) { replies_.push_back(m); },
                       [](std::function<void()> work) { work(); });
  // The legacy session's call: held by its session as today.
  session.receive(json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"},
                       {"params", {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()},
                                   {"clientInfo", {{"name", "unit"}, {"version", "1"}}}}}}.dump());
  session.receive(json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump());
  session.receive(json{{"jsonrpc", "2.0"}, {"id", 2}, {"method", "tools/call"},
                       {"params", {{"name", "computer_create"}, {"arguments", {{"computer_id", "by-session"}}}}}}.dump());
  ASSERT_TRUE(exists("by-session")) << replies_.back().dump();
  const auto owners = [this](const std::string& id) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(config_.ns.instances_dir / id / "owners"))
      names.push_back(e.path().filename().string());
    return names;
  };
  EXPECT_EQ(owners("by-session"), std::vector<std::string>{nshpc::instances::owner_key("s1")});
  // A 2026-07-28 request (no initialize, its version in _meta) on a stdio-like session: no session id.
  mcp::Session modern(server, "stdio", [this](const json& m) { replies_.push_back(m); },
                      [](std::function<void()> work) { work(); });
  modern.receive(json{{"jsonrpc", "2.0"}, {"id", 3}, {"method", "tools/call"},
                      {"params", {{"name", "computer_create"},
                                  {"arguments", {{"computer_id", "sessionless"}}},
                                  {"_meta", {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                                             {"io.modelcontextprotocol/clientInfo", {{"name", "unit"}, {"version", "2"}}},
                                             {"io.modelcontextprotocol/clientCapabilities", json::object()}}}}}}
                     .dump());
  ASSERT_TRUE(exists("sessionless")) << replies_.back().dump();
  EXPECT_EQ(owners("sessionless"), std::vector<std::string>{nshpc::instances::lease_key()});
  // Its lease (1 s) runs out on the server's own timer, no session needed; the session's stays.
  for (int i = 0; i < 40 && exists("sessionless"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(exists("sessionless"));
  EXPECT_TRUE(exists("by-session"));
}
