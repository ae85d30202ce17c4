// What the agent sees (issue 13, "Instances at scale" and "Instances and errors"), through the real
// `ns-hpc run` over stdio and the real CLI: paged and filtered listings, archives that come back,
// errors that name the front end's own tools or commands, near misses, the network mode, a program
// that is not there, and the guides.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

bool has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

bool is_error(const json& response) { return response.value("result", json::object()).value("isError", false); }

std::set<std::string> ids_of(const json& listing) {
  std::set<std::string> ids;
  for (const auto& item : listing["instances"]) ids.insert(item["id"].get<std::string>());
  return ids;
}

}  // namespace

// list_instances pages (limit, cursor, offset), filters by id or description and sorts by last
// activity; the text says how many there are and how to get the next page.
TEST(AgentView, ListInstancesIsPagedFilteredAndSortedByActivity) {
  Env env;
  for (const std::string id : {"alpha", "bravo", "charlie", "delta", "echo"})
    env.create(id, {"-d", id == "charlie" ? "protein folding" : "misc"});
  McpSession server(env);
  json first = server.tool("list_instances", {{"limit", 2}, {"sort", "id"}});
  EXPECT_EQ(first["count"], 2) << first.dump();
  EXPECT_EQ(first["total"], 5) << first.dump();
  EXPECT_EQ(ids_of(first), (std::set<std::string>{"alpha", "bravo"}));
  ASSERT_TRUE(first.contains("next_cursor")) << first.dump();
  json second = server.tool("list_instances", {{"limit", 2}, {"sort", "id"}, {"cursor", first["next_cursor"]}});
  EXPECT_EQ(ids_of(second), (std::set<std::string>{"charlie", "delta"}));
  json last = server.tool("list_instances", {{"limit", 2}, {"sort", "id"}, {"offset", 4}});
  EXPECT_EQ(ids_of(last), (std::set<std::string>{"echo"}));
  EXPECT_FALSE(last.contains("next_cursor")) << last.dump();

  json response = server.call_and_wait("list_instances", {{"filter", "PROTEIN"}});
  EXPECT_TRUE(has(result_text(response), "1 instance(s) matching 'PROTEIN'")) << result_text(response);
  json filtered = response["result"]["structuredContent"];
  EXPECT_EQ(ids_of(filtered), (std::set<std::string>{"charlie"}));
  json none = server.call_and_wait("list_instances", {{"filter", "nothing-like-it"}});
  EXPECT_TRUE(has(result_text(none), "No instance matches 'nothing-like-it'")) << result_text(none);

  // Activity moves an instance to the front (written in a batch, off the command's path).
  ASSERT_EQ(server.tool("terminal_execute", {{"instance_id", "bravo"}, {"command", "true"}})["exit_code"], 0);
  EXPECT_TRUE(eventually(
      [&] { return server.tool("list_instances", {{"limit", 1}})["instances"][0]["id"] == "bravo"; },
      std::chrono::seconds(10)));
  json page = server.call_and_wait("list_instances", {{"limit", 1}});
  EXPECT_TRUE(has(result_text(page), "4 more: call list_instances with cursor \"1\"")) << result_text(page);
}

// The index follows changes made by other processes (the CLI) and by hand, and is rebuilt when its
// database is damaged or missing.
TEST(AgentView, ListingFollowsOtherProcessesAndSurvivesADamagedIndex) {
  Env env;
  const fs::path state = env.root() / "state";
  std::ofstream(env.config_file(), std::ios::app) << "[server]\nstate_dir = \"" << state.string() << "\"\n";
  env.create("first");
  McpSession server(env);
  EXPECT_EQ(server.tool("list_instances", json::object())["total"], 1);
  env.create("second");  // another process
  EXPECT_EQ(ids_of(server.tool("list_instances", json::object())), (std::set<std::string>{"first", "second"}));
  ASSERT_EQ(env.run({"instance", "delete", "-f", "first"}).exit_code, 0);
  EXPECT_EQ(ids_of(server.tool("list_instances", json::object())), (std::set<std::string>{"second"}));
  // By hand, behind every ns-hpc process's back (as an older release would).
  fs::create_directories(env.instances() / "handmade" / "workspace");
  std::ofstream(env.instances() / "handmade" / "metadata.json")
      << json{{"id", "handmade"}, {"created_at", "2026-01-01T00:00:00+00:00"}, {"description", "by hand"}}.dump();
  EXPECT_EQ(ids_of(server.tool("list_instances", json::object())), (std::set<std::string>{"handmade", "second"}));

  // The index lives in the local state folder, not among the instances; damaged, it is rebuilt.
  EXPECT_FALSE(fs::exists(env.instances() / "index"));
  int damaged = 0;
  for (const auto& entry : fs::directory_iterator(state / "index")) {
    if (entry.path().extension() != ".sqlite") continue;
    std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << "this is not a database";
    ::unlink((entry.path().string() + "-wal").c_str());
    ::unlink((entry.path().string() + "-shm").c_str());
    ++damaged;
  }
  EXPECT_EQ(damaged, 1);
  env.create("third");
  McpSession again(env);
  EXPECT_EQ(ids_of(again.tool("list_instances", json::object())), (std::set<std::string>{"handmade", "second", "third"}));
}

// resources/list pages from the index: every instance reachable through the cursors, once; each
// guide has a description of its own.
TEST(AgentView, ResourcesListPagesAndGuidesHaveTheirOwnDescriptions) {
  Env env("[mcp]\npage_size = 3\n");
  for (int i = 0; i < 5; ++i) env.create("inst" + std::to_string(i));
  McpSession server(env);
  std::set<std::string> uris, descriptions;
  std::set<std::string> guide_descriptions;
  json params = json::object();
  for (int pages = 0; pages < 10; ++pages) {
    json page = server.wait_for(server.request("resources/list", params));
    ASSERT_TRUE(page.contains("result")) << page.dump();
    EXPECT_LE(page["result"]["resources"].size(), 3u);
    for (const auto& r : page["result"]["resources"]) {
      EXPECT_TRUE(uris.insert(r["uri"].get<std::string>()).second) << "listed twice: " << r["uri"];
      if (has(r["uri"].get<std::string>(), "/context/")) guide_descriptions.insert(r["description"].get<std::string>());
    }
    if (!page["result"].contains("nextCursor")) break;
    params = {{"cursor", page["result"]["nextCursor"]}};
  }
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(uris.count("resource://ns-hpc/instances/inst" + std::to_string(i))) << i;
  for (const std::string guide : {"ns-hpc.md", "jobs.md", "sandbox.md", "slurm.md"})
    EXPECT_TRUE(uris.count("resource://ns-hpc/context/" + guide)) << guide;
  EXPECT_EQ(guide_descriptions.size(), 4u) << "the guides share a description";
  EXPECT_TRUE(uris.count("ui://ns-hpc/dashboard")) << "the dashboard's MCP App is on a page";
  EXPECT_EQ(uris.size(), 1u + 4u + 5u) << "the App, the guides, the instances";
}

// An archived id says so, and how to bring it back, on every call; create says when an archive of
// that id exists; restore_instance brings the files back, to the old id or a new one.
TEST(AgentView, ArchivedInstancesSaySoAndComeBack) {
  Env env;
  env.create("lab");
  ASSERT_EQ(env.run({"bwrap", "lab", "--", "/bin/sh", "-c", "echo kept > notes.txt"}).exit_code, 0);
  McpSession server(env);
  json archived = server.tool("archive_instance", {{"instance_id", "lab"}});
  const std::string name = archived["archive_name"];
  for (const std::string tool : {"terminal_execute", "describe_instance"}) {
    json args = {{"instance_id", "lab"}};
    if (tool == "terminal_execute") args["command"] = "true";
    json response = server.call_and_wait(tool, args);
    EXPECT_TRUE(is_error(response)) << response.dump();
    const std::string text = result_text(response);
    EXPECT_TRUE(has(text, "instance 'lab' was archived as " + name + " on 20")) << text;
    EXPECT_TRUE(has(text, "restore_instance brings it back")) << text;
    EXPECT_FALSE(has(text, "ns-hpc instance")) << "a tool error names a CLI command: " << text;
  }
  Result cli = env.run({"instance", "describe", "lab"});
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_TRUE(has(cli.err, "'ns-hpc instance restore " + name + "' brings it back")) << cli.err;
  EXPECT_FALSE(has(cli.err, "restore_instance")) << "a CLI error names a tool: " << cli.err;

  // A new instance of that id: create says an archive exists.
  json created = server.call_and_wait("create_instance", {{"instance_id", "lab"}});
  EXPECT_TRUE(has(result_text(created), "an archive of 'lab' exists (" + name)) << result_text(created);
  // Its old id is taken now: the archive comes back as lab-restored, with its files.
  json restored = server.tool("restore_instance", {{"archive_name", name}});
  EXPECT_EQ(restored["id"], "lab-restored") << restored.dump();
  EXPECT_EQ(restored["restored_from"], name);
  json cat = server.tool("terminal_execute", {{"instance_id", "lab-restored"}, {"command", "cat notes.txt"}});
  EXPECT_EQ(cat["stdout"], "kept\n") << cat.dump();

  // Through the CLI, by id (its newest archive), to a chosen id.
  ASSERT_EQ(env.run({"instance", "archive", "-f", "lab-restored"}).exit_code, 0);
  Result back = env.run({"instance", "restore", "lab-restored", "--as", "lab2"});
  EXPECT_EQ(back.exit_code, 0) << back.err;
  EXPECT_TRUE(has(back.out, "as instance 'lab2'")) << back.out;
  EXPECT_EQ(env.run({"bwrap", "lab2", "--", "cat", "notes.txt"}).out, "kept\n");
}

// Tool errors name tools and CLI errors name commands; a near miss gets "did you mean".
TEST(AgentView, NotFoundNamesTheFrontEndsOwnWayAndTheNearMiss) {
  Env env;
  env.create("protein-analysis");
  McpSession server(env);
  json response = server.call_and_wait("describe_instance", {{"instance_id", "protein-analysys"}});
  const std::string text = result_text(response);
  EXPECT_TRUE(is_error(response));
  EXPECT_TRUE(has(text, "instance 'protein-analysys' not found; did you mean 'protein-analysis'? list_instances"))
      << text;
  EXPECT_FALSE(has(text, "ns-hpc instance")) << text;

  Result cli = env.run({"instance", "describe", "protein-analysys"});
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_TRUE(has(cli.err, "did you mean 'protein-analysis'? 'ns-hpc instance list' lists the active ones")) << cli.err;
  EXPECT_FALSE(has(cli.err, "list_instances")) << cli.err;

  // An unknown tool lists the tools there are, with the near miss.
  json unknown = server.call_and_wait("list_instance", json::object());
  ASSERT_TRUE(unknown.contains("error")) << unknown.dump();
  const std::string message = unknown["error"]["message"];
  EXPECT_TRUE(has(message, "unknown tool 'list_instance'; did you mean 'list_instances'?")) << message;
  EXPECT_TRUE(has(message, "terminal_execute")) << message;
  EXPECT_TRUE(has(message, "restore_instance")) << message;
}

// terminal_execute's result carries the network mode, and its description says what each allows;
// a program that is not there is exit 127 with the message in stderr, as `args` and as `command`.
TEST(AgentView, TerminalResultsCarryTheNetworkAndAMissingProgramIs127) {
  Env env;
  env.create("offline", {"--network", "off"});
  McpSession server(env);
  json result = server.tool("terminal_execute", {{"instance_id", "offline"}, {"command", "true"}});
  EXPECT_EQ(result["network"], "off") << result.dump();
  json response = server.call_and_wait("terminal_execute", {{"instance_id", "offline"}, {"command", "true"}});
  EXPECT_TRUE(has(result_text(response), "network off")) << result_text(response);

  json tools = server.wait_for(server.request("tools/list", json::object()));
  std::string description;
  for (const auto& t : tools["result"]["tools"])
    if (t["name"] == "terminal_execute") description = t["description"];
  EXPECT_TRUE(has(description, "/workspace")) << description;
  std::string network;
  for (const auto& t : tools["result"]["tools"])
    if (t["name"] == "create_instance") network = t["inputSchema"]["properties"]["network"]["description"];
  EXPECT_TRUE(has(network, "Default here: '")) << network;

  json by_args = server.tool("terminal_execute", {{"instance_id", "offline"}, {"args", {"nosuchprog"}}});
  EXPECT_EQ(by_args["exit_code"], 127) << by_args.dump();
  EXPECT_TRUE(has(by_args["stderr"], "nosuchprog")) << by_args.dump();
  json by_command = server.tool("terminal_execute", {{"instance_id", "offline"}, {"command", "nosuchprog"}});
  EXPECT_EQ(by_command["exit_code"], 127) << by_command.dump();
  EXPECT_TRUE(has(by_command["stderr"], "nosuchprog")) << by_command.dump();
}

// mode "slurm" is offered only where sbatch is there; a cluster that does not answer is said in
// words, pointing to doctor.
TEST(AgentView, SlurmIsOfferedOnlyWhereConfiguredAndAFailureSaysWhatToDo) {
  auto submit_modes = [](McpSession& server) {
    json tools = server.wait_for(server.request("tools/list", json::object()));
    for (const auto& t : tools["result"]["tools"])
      if (t["name"] == "submit_job") return t["inputSchema"]["properties"]["mode"]["enum"];
    return json();
  };
  {
    Env env("[jobs.slurm]\nsbatch_command = [\"/nonexistent/sbatch\", \"--parsable\"]\n");
    McpSession server(env);
    EXPECT_EQ(submit_modes(server), json::array({"local"}));
  }
  Env env;
  const fs::path fake = env.root() / "fake-sbatch";
  std::ofstream(fake) << "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Unable to contact slurm "
                         "controller (connect failure)' >&2\nexit 1\n";
  ::chmod(fake.c_str(), 0755);
  std::ofstream(env.config_file(), std::ios::app) << "[jobs.slurm]\nsbatch_command = [\"" << fake.string()
                                                  << "\", \"--parsable\"]\n";
  env.create("hpc");
  McpSession server(env);
  EXPECT_EQ(submit_modes(server), json::array({"local", "slurm"}));
  json response = server.call_and_wait("submit_job", {{"instance_id", "hpc"}, {"command", "true"}, {"mode", "slurm"}});
  EXPECT_TRUE(is_error(response)) << response.dump();
  const std::string text = result_text(response);
  EXPECT_TRUE(has(text, "the Slurm cluster did not take the job")) << text;
  EXPECT_TRUE(has(text, "Unable to contact slurm controller")) << text;
  EXPECT_TRUE(has(text, "ns-hpc doctor")) << text;
}

// describe_instance of a running persistent instance counts its processes once, in agreement with
// what runs in its sandbox; with no [namespace] limits nothing is counted against them (the
// instance's group then holds its commands and jobs only, not its sandbox's own processes).
TEST(AgentView, DescribeCountsARunningInstancesProcessesOnce) {
  Env env;
  env.create("liv", {"--persistent", "--network", "off"});
  McpSession server(env);
  json started = server.tool("terminal_execute", {{"instance_id", "liv"}, {"command", "sleep 120 & echo bg"}});
  ASSERT_EQ(started["stdout"], "bg\n") << started.dump();
  json response = server.call_and_wait("describe_instance", {{"instance_id", "liv"}});
  const std::string text = result_text(response);
  const json described = response["result"]["structuredContent"];
  const std::regex count("([0-9]+) process");
  std::vector<std::string> counts;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), count); it != std::sregex_iterator(); ++it)
    counts.push_back((*it)[1]);
  ASSERT_EQ(counts.size(), 1u) << text;
  EXPECT_EQ(counts[0], std::to_string(described["processes"].get<int>())) << text;
  EXPECT_FALSE(described["limits"].contains("usage")) << described.dump();
  server.tool("stop_instance", {{"instance_id", "liv"}});
}

// The guide served as ns-hpc.md has every tool of this server in its table.
TEST(AgentView, TheGuideNamesEveryTool) {
  Env env;
  McpSession server(env);
  json tools = server.wait_for(server.request("tools/list", json::object()));
  json read = server.wait_for(server.request("resources/read", {{"uri", "resource://ns-hpc/context/ns-hpc.md"}}));
  const std::string guide = read["result"]["contents"][0]["text"];
  ASSERT_GT(tools["result"]["tools"].size(), 25u);
  for (const auto& t : tools["result"]["tools"])
    EXPECT_TRUE(has(guide, "`" + t["name"].get<std::string>() + "`")) << t["name"] << " is not in the guide";
}
