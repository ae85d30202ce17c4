// The command line as a user meets it: lifecycle, JSON output, and every kind of bad input.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/json.hpp"
#include "harness.hpp"
#include "network/netns.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

// One line on stderr, starting with "ns-hpc: error:".
void expect_one_error_line(const Result& r, const std::string& contains) {
  EXPECT_EQ(r.err.rfind("ns-hpc: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(contains), std::string::npos) << r.err;
}

}  // namespace

// A state folder the server makes itself (its listing index, its token) does not shut out the
// sandbox from an instances folder inside it, as root's defaults have it (/var/lib/ns-hpc and
// /var/lib/ns-hpc/instances): on a fresh machine the first listing made it 0700, and every
// sandbox then failed to reach its workspace.
TEST(Cli, AStateFolderTheServerMakesKeepsTheInstancesInsideItReachable) {
  Env env;
  const fs::path state = env.root() / "state";
  std::ofstream(env.config_file()) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (state / "instances").string()
                                   << "\"\n[server]\nstate_dir = \"" << state.string() << "\"\n";
  ASSERT_EQ(env.run({"instance", "list"}).exit_code, 0);  // the index comes first, and makes the state folder
  ASSERT_TRUE(fs::exists(state / "index"));
  env.create("reach");
  Result r = env.run({"bwrap", "reach", "--", "/bin/sh", "-c", "echo made > /workspace/f && cat /workspace/f"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "made\n");
  EXPECT_EQ(fs::status(state).permissions() & fs::perms::others_all, fs::perms::others_exec);
}

// `instance list` pages and filters through the store's index, as list_instances does.
TEST(Cli, InstanceListPagesFiltersAndSorts) {
  Env env;
  for (const char* id : {"delta", "alpha", "charlie", "bravo"})
    ASSERT_EQ(env.run({"instance", "create", id, "-d", std::string("about ") + id}).exit_code, 0);
  ASSERT_EQ(env.run({"bwrap", "bravo", "--", "true"}).exit_code, 0);  // the most recently active
  auto ids = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"instance", "list", "--json"});
    Result r = env.run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> out;
    for (const auto& i : nshpc::parse_json(r.out)) out.push_back(i["id"]);
    return out;
  };
  EXPECT_EQ(ids({}), (std::vector<std::string>{"alpha", "bravo", "charlie", "delta"}));
  EXPECT_EQ(ids({"--limit", "2", "--offset", "1"}), (std::vector<std::string>{"bravo", "charlie"}));
  EXPECT_EQ(ids({"--filter", "ABOUT CH"}), (std::vector<std::string>{"charlie"}));
  EXPECT_EQ(ids({"--sort", "activity", "--limit", "1"}), (std::vector<std::string>{"bravo"}));
  Result page = env.run({"instance", "list", "--limit", "3"});
  EXPECT_NE(page.out.find("1 more: --offset 3"), std::string::npos) << page.out;
  Result past = env.run({"instance", "list", "--offset", "9"});
  EXPECT_NE(past.out.find("No instances from position 9 on (4 in all)."), std::string::npos) << past.out;
  Result bad = env.run({"instance", "list", "--sort", "size"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("ns-hpc: error: --sort: size not in {id,activity}"), std::string::npos) << bad.err;
}

TEST(Cli, InstanceLifecycleWithJson) {
  Env env;
  Result created = env.run({"instance", "create", "proj", "-d", "analysis", "--json"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  json inst = nshpc::parse_json(created.out);
  EXPECT_EQ(inst["id"], "proj");
  EXPECT_EQ(inst["description"], "analysis");
  // [namespace] default_network = "auto": nat where it works, else filtered.
  EXPECT_EQ(inst["network"], nshpc::network::nat_unavailable() ? "filtered" : "nat");

  json list = nshpc::parse_json(env.run({"instance", "list", "--json"}).out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["id"], "proj");

  Result text = env.run({"instance", "list"});
  EXPECT_NE(text.out.find("proj"), std::string::npos);
  EXPECT_NE(text.out.find("analysis"), std::string::npos);

  Result updated = env.run({"instance", "update", "proj", "-d", "new", "--network", "off", "--json"});
  ASSERT_EQ(updated.exit_code, 0) << updated.err;
  json desc = nshpc::parse_json(env.run({"instance", "describe", "proj", "--json"}).out);
  EXPECT_EQ(desc["description"], "new");
  EXPECT_EQ(desc["network"], "off");
  EXPECT_NE(env.run({"instance", "describe", "proj"}).out.find("Network:       off"), std::string::npos);

  EXPECT_EQ(env.run({"instance", "archive", "proj", "--force"}).exit_code, 0);
  EXPECT_EQ(nshpc::parse_json(env.run({"instance", "list", "--json"}).out).size(), 0u);
  json archived = nshpc::parse_json(env.run({"instance", "list-archived", "--json"}).out);
  ASSERT_EQ(archived.size(), 1u);
  EXPECT_EQ(archived[0]["id"], "proj");

  Result purge = env.run({"instance", "delete", "--archived", archived[0]["name"], "--force"});
  EXPECT_EQ(purge.exit_code, 0) << purge.err;
  EXPECT_EQ(nshpc::parse_json(env.run({"instance", "list-archived", "--json"}).out).size(), 0u);
}

TEST(Cli, CreateWithoutIdGeneratesAReadableOne) {
  Env env;
  json inst = nshpc::parse_json(env.run({"instance", "create", "--json"}).out);
  const std::string id = inst["id"];
  EXPECT_EQ(std::count(id.begin(), id.end(), '-'), 2) << id;
  EXPECT_TRUE(fs::exists(env.instances() / id / "metadata.json"));
}

TEST(Cli, DeletePurgesAnActiveInstance) {
  Env env;
  env.create("tmp1");
  Result r = env.run({"instance", "delete", "tmp1", "--force"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(env.instances() / "tmp1"));
  EXPECT_FALSE(fs::exists(env.instances() / "output/tmp1"));
}

TEST(Cli, QuestionsWithoutATerminalAbortSafely) {
  Env env;
  env.create("keep");
  Result r = env.run({"instance", "delete", "keep"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--force"), std::string::npos);
  EXPECT_TRUE(fs::exists(env.instances() / "keep/metadata.json"));
}

TEST(Cli, InvalidAndReservedIdsAreClearErrors) {
  Env env;
  for (const char* bad : {"../evil", "output", ".hidden", "has space"}) {
    Result r = env.run({"instance", "create", bad});
    EXPECT_EQ(r.exit_code, 1) << bad;
    expect_one_error_line(r, "id");
  }
  EXPECT_FALSE(fs::exists(env.instances() / "output/../evil"));
  EXPECT_EQ(nshpc::parse_json(env.run({"instance", "list", "--json"}).out).size(), 0u);
}

TEST(Cli, UnknownInstanceIsAnErrorNamingIt) {
  Env env;
  for (auto args : std::vector<std::vector<std::string>>{{"instance", "describe", "ghost"},
                                                         {"bwrap", "ghost", "--", "true"},
                                                         {"instance", "archive", "ghost", "-f"},
                                                         {"instance", "update", "ghost", "-d", "x"}}) {
    Result r = env.run(args);
    EXPECT_EQ(r.exit_code, 1) << args[1];
    expect_one_error_line(r, "instance 'ghost' not found");
  }
}

TEST(Cli, UsageErrorsExitTwo) {
  Env env;
  EXPECT_EQ(env.run({"instance", "frobnicate"}).exit_code, 2);
  EXPECT_EQ(env.run({"bwrap"}).exit_code, 2);
  EXPECT_EQ(env.run({"clean", "--days", "banana"}).exit_code, 2);
  Result no_cmd = env.run({"bwrap", "x", "--"});
  EXPECT_EQ(no_cmd.exit_code, 2);
  EXPECT_NE(no_cmd.err.find("no command given"), std::string::npos) << no_cmd.err;
}

TEST(Cli, CorruptMetadataIsReportedByIdAndSkipped) {
  Env env;
  env.create("good");
  env.create("bad");
  std::ofstream(env.instances() / "bad/metadata.json", std::ios::trunc) << "{\"id\": ";
  Result list = env.run({"instance", "list", "--json"});
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_EQ(nshpc::parse_json(list.out).size(), 1u);
  EXPECT_NE(list.err.find("instance 'bad' skipped"), std::string::npos) << list.err;
  Result describe = env.run({"instance", "describe", "bad"});
  EXPECT_EQ(describe.exit_code, 1);
  expect_one_error_line(describe, "corrupt metadata.json");
  // A broken instance can still be cleared away.
  Result removed = env.run({"instance", "delete", "bad", "--force"});
  EXPECT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_FALSE(fs::exists(env.instances() / "bad"));
  EXPECT_EQ(env.run({"instance", "describe", "good"}).exit_code, 0);
}

TEST(Cli, InvalidConfigIsRefusedWithFileLineAndKey) {
  Env env("[mcp]\nresult_type = \"json\"\n");
  Result r = env.run({"instance", "list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(env.config_file().string() + ":"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("mcp.result_type"), std::string::npos) << r.err;
  Result check = env.run({"config", "check", env.config_file().string()});
  EXPECT_EQ(check.exit_code, 1);
  EXPECT_NE(check.err.find("mcp.result_type"), std::string::npos) << check.err;
}

TEST(Cli, MissingOrUnreadableConfigIsAnError) {
  Env env;
  Result r = env.run({"--config", "/nonexistent/ns-hpc.toml", "instance", "list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/ns-hpc.toml"), std::string::npos) << r.err;
}

TEST(Cli, ConfigShowReflectsTheLayers) {
  Env env("[jobs]\nmax_timeout = 120\n");
  json cfg = nshpc::parse_json(env.run({"config", "show", "--json"}).out);
  EXPECT_EQ(cfg["jobs"]["max_timeout"], 120);
  EXPECT_EQ(cfg["namespace"]["instances_dir"], env.instances().string());
  Result toml = env.run({"config", "show"});
  EXPECT_EQ(toml.exit_code, 0);
  EXPECT_NE(toml.out.find("max_timeout = 120"), std::string::npos) << toml.out;
}

TEST(Cli, MissingBwrapIsAClearErrorAndLeavesNothingRunning) {
  Env env("bwrap_command = [\"/nonexistent/bwrap\", \"--unshare-all\"]\n");
  env.create("x");
  Result r = env.run({"bwrap", "x", "--", "true"});
  EXPECT_EQ(r.exit_code, 1);
  expect_one_error_line(r, "/nonexistent/bwrap");
  Result doctor = env.run({"doctor", "--json"});
  EXPECT_EQ(doctor.exit_code, 1);
  json report = nshpc::parse_json(doctor.out);
  EXPECT_FALSE(report["ok"]);
  EXPECT_EQ(report["checks"][1]["name"], "bwrap found");
  EXPECT_FALSE(report["checks"][1]["ok"]);
  EXPECT_NE(report["checks"][1]["fix"].get<std::string>().find("apt-get install bubblewrap"), std::string::npos);
}

TEST(Cli, HardeningOffStillRunsACustomBaseCommand) {
  Env env("hardening = false\nbwrap_command = [\"bwrap\", \"--unshare-all\", \"--share-net\", "
          "\"--ro-bind\", \"/usr\", \"/usr\", \"--ro-bind\", \"/bin\", \"/bin\", \"--ro-bind\", "
          "\"/lib\", \"/lib\", \"--ro-bind\", \"/lib64\", \"/lib64\", \"--ro-bind\", \"/etc\", \"/etc\", "
          "\"--proc\", \"/proc\", \"--dev\", \"/dev\", \"--tmpfs\", \"/tmp\"]\n");
  env.create("plain");
  Result r = env.run({"bwrap", "plain", "--", "/bin/sh", "-c", "echo ok > /workspace/f; exit 42"});
  EXPECT_EQ(r.exit_code, 42) << r.err;
  EXPECT_EQ(read_text(env.instances() / "plain/workspace/f"), "ok\n");
  // The environment stays clean even without the hardening flags.
  Result envr = env.run({"bwrap", "plain", "--", "/usr/bin/env"});
  EXPECT_EQ(envr.out.find(kSecret), std::string::npos) << envr.out;
}

TEST(Cli, DoctorChecksTheRealSandbox) {
  Env env;
  Result r = env.run({"doctor", "--json"});
  json report = nshpc::parse_json(r.out);
  std::map<std::string, json> by_name;
  for (const auto& c : report["checks"]) by_name[c["name"]] = c;
  for (const char* required : {"config is valid", "bwrap found", "user namespaces", "seccomp filter loads",
                               "sandbox identity", "sandbox smoke run (configured bwrap_command)",
                               "instances dir writable"}) {
    ASSERT_TRUE(by_name.count(required)) << required;
    EXPECT_TRUE(by_name[required]["ok"]) << required << ": " << by_name[required]["detail"];
    EXPECT_TRUE(by_name[required]["required"]);
  }
  ASSERT_TRUE(by_name.count("Slurm tools"));
  EXPECT_FALSE(by_name["Slurm tools"]["required"]);  // Slurm is optional
  // Optional features name what they need (make test installs ripgrep).
  ASSERT_TRUE(by_name.count("file search (ripgrep)"));
  EXPECT_FALSE(by_name["file search (ripgrep)"]["required"]);
  EXPECT_TRUE(by_name["file search (ripgrep)"]["ok"]) << by_name["file search (ripgrep)"].dump();
  EXPECT_EQ(r.exit_code, report["ok"] ? 0 : 1);
  EXPECT_TRUE(report["ok"]) << r.out;
  Result text = env.run({"doctor"});
  EXPECT_NE(text.out.find("✓ bwrap found"), std::string::npos) << text.out;
}

TEST(Cli, CleanDryRunListsIdleInstancesWithoutTouchingThem) {
  Env env;
  env.create("idle");
  env.create("fresh");
  struct timespec old[2] = {{::time(nullptr) - 40 * 86400, 0}, {::time(nullptr) - 40 * 86400, 0}};
  for (const char* f : {"metadata.json", "audit.log"})
    ::utimensat(AT_FDCWD, (env.instances() / "idle" / f).c_str(), old, 0);
  // created_at is now, so only last activity can make it idle: rewrite it old.
  auto meta = nshpc::parse_json(read_text(env.instances() / "idle/metadata.json"));
  meta["created_at"] = "2020-01-01T00:00:00+00:00";
  std::ofstream(env.instances() / "idle/metadata.json", std::ios::trunc) << meta.dump();
  ::utimensat(AT_FDCWD, (env.instances() / "idle/metadata.json").c_str(), old, 0);
  json report = nshpc::parse_json(env.run({"clean", "--days", "30", "--dry-run", "--json"}).out);
  ASSERT_EQ(report["candidates"].size(), 1u);
  EXPECT_EQ(report["candidates"][0]["id"], "idle");
  EXPECT_TRUE(fs::exists(env.instances() / "idle/metadata.json"));
  Result real = env.run({"clean", "--days", "30", "--force"});
  EXPECT_EQ(real.exit_code, 0) << real.err;
  EXPECT_FALSE(fs::exists(env.instances() / "idle"));
  EXPECT_TRUE(fs::exists(env.instances() / "fresh/metadata.json"));
}

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The stderr lines of one log level ("ns-hpc: debug: ...").
std::vector<std::string> log_lines(const std::string& err, const std::string& level) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < err.size()) {
    std::size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    std::string line = err.substr(start, end - start);
    if (line.rfind("ns-hpc: " + level + ": ", 0) == 0) lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

}  // namespace

TEST(Cli, DebugLogGoesToStderrAndNeverToStdout) {
  Env env;
  env.create("x");
  struct Way {
    std::vector<std::string> args;
    std::vector<std::string> env;
  };
  for (const Way& way : std::vector<Way>{{{"-vv", "bwrap", "x", "--", "echo", "hi"}, {}},
                                         {{"bwrap", "x", "-vv", "--", "echo", "hi"}, {}},
                                         {{"--log-level", "debug", "bwrap", "x", "--", "echo", "hi"}, {}},
                                         {{"bwrap", "x", "--", "echo", "hi"}, {"NS_HPC_LOG=debug"}}}) {
    const std::string what = fmt::format("{} {}", fmt::join(way.args, " "), fmt::join(way.env, " "));
    Result r = env.run(way.args, "", std::chrono::seconds(60), way.env);
    EXPECT_EQ(r.exit_code, 0) << what << ": " << r.err;
    EXPECT_EQ(r.out, "hi\n") << what;  // the command's output and nothing else
    const auto debug = log_lines(r.err, "debug");
    // The sandbox's full argv before it starts, and the config files looked for.
    EXPECT_TRUE(std::any_of(debug.begin(), debug.end(), [](const std::string& line) {
      return has(line, "sandbox x: starting ") && has(line, "bwrap ") && has(line, " echo hi");
    })) << what << ": " << r.err;
    EXPECT_TRUE(std::any_of(debug.begin(), debug.end(), [&](const std::string& line) {
      return has(line, "config: ") && has(line, env.config_file().string());
    })) << what << ": " << r.err;
  }
  // Without asking, or asking for less, or the flag over the environment: no debug line.
  for (const Way& way : std::vector<Way>{{{"bwrap", "x", "--", "echo", "hi"}, {}},
                                         {{"-v", "bwrap", "x", "--", "echo", "hi"}, {}},
                                         {{"--log-level", "warning", "bwrap", "x", "--", "echo", "hi"},
                                          {"NS_HPC_LOG=debug"}}}) {
    Result r = env.run(way.args, "", std::chrono::seconds(60), way.env);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "hi\n");
    EXPECT_TRUE(log_lines(r.err, "debug").empty()) << fmt::format("{}", fmt::join(way.args, " ")) << ": " << r.err;
  }
}

TEST(Cli, DebugLogOfTheStdioServerStaysOffItsMcpChannel) {
  Env env;
  env.create("x");
  const std::string input =
      json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"},
           {"params", {{"protocolVersion", "2025-06-18"}, {"capabilities", json::object()},
                       {"clientInfo", {{"name", "test"}, {"version", "1"}}}}}}.dump() + "\n" +
      json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump() + "\n" +
      json{{"jsonrpc", "2.0"}, {"id", 2}, {"method", "tools/call"},
           {"params", {{"name", "terminal_execute"}, {"arguments", {{"instance_id", "x"}, {"command", "echo ran"}}}}}}
          .dump() + "\n";
  Result r = env.run({"run"}, input, std::chrono::seconds(60), {"NS_HPC_LOG=debug"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  int answers = 0;
  std::size_t start = 0;
  while (start < r.out.size()) {
    std::size_t end = r.out.find('\n', start);
    ASSERT_NE(end, std::string::npos) << r.out;
    json message = nshpc::parse_json_or_discarded(r.out.substr(start, end - start));
    ASSERT_FALSE(message.is_discarded()) << "not an MCP message on stdout: " << r.out.substr(start, end - start);
    EXPECT_EQ(message["jsonrpc"], "2.0");
    if (message.contains("id")) ++answers;
    start = end + 1;
  }
  EXPECT_EQ(answers, 2) << r.out;
  EXPECT_TRUE(has(r.out, "ran")) << r.out;
  const auto debug = log_lines(r.err, "debug");
  EXPECT_TRUE(std::any_of(debug.begin(), debug.end(),
                          [](const std::string& line) { return has(line, "sandbox x: starting "); }))
      << r.err;
}

TEST(Cli, BadLogLevelIsRefusedNamingTheAllowedOnes) {
  Env env;
  Result flag = env.run({"--log-level", "loud", "instance", "list"});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_TRUE(has(flag.err, "--log-level: loud not in {error,warning,info,debug}")) << flag.err;
  Result from_env = env.run({"instance", "list"}, "", std::chrono::seconds(60), {"NS_HPC_LOG=loud"});
  EXPECT_EQ(from_env.exit_code, 2);
  EXPECT_TRUE(has(from_env.err, "NS_HPC_LOG: loud not in {error,warning,info,debug}")) << from_env.err;
  EXPECT_TRUE(from_env.out.empty()) << from_env.out;
  Result both = env.run({"-v", "--log-level", "debug", "instance", "list"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_TRUE(has(both.err, "excludes")) << both.err;
}

TEST(Cli, ModeRulesNameTheOptionAndWhatToDo) {
  Env env;
  env.create("x");
  struct Refused {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Refused& refused : std::vector<Refused>{
           {{"run", "--host", "0.0.0.0"},
            "--host: only valid with an HTTP transport (--transport streamable-http or sse)"},
           {{"run", "-t", "stdio", "--session-timeout", "5"}, "--session-timeout: only valid with an HTTP transport"},
           {{"run", "--allow-unauthenticated-http"}, "--allow-unauthenticated-http: only valid with an HTTP transport"},
           {{"run", "-t", "websocket"}, "--transport: websocket not in {stdio,streamable-http,http,sse}"},
           {{"instance", "run", "x", "--slurm", "-l", "memory=100", "--", "true"}, "--slurm excludes --limit"},
           {{"instance", "run", "x", "-r", "cpus=2", "--", "true"}, "--resource requires --slurm"},
           {{"instance", "jobs", "x", "--status", "done"}, "--status: done not in {pending,running,completed,"},
           {{"instance", "create", "y", "--network", "wifi"}, "--network: wifi not in {off,nat,filtered,host}"},
           {{"instance", "update", "x", "--network", "wifi"}, "--network: wifi not in {off,nat,filtered,host}"}}) {
    Result r = env.run(refused.args);
    const std::string what = fmt::format("{}", fmt::join(refused.args, " "));
    EXPECT_EQ(r.exit_code, 2) << what << ": " << r.err;
    EXPECT_EQ(r.err.rfind("ns-hpc: error: ", 0), 0u) << what << ": " << r.err;
    EXPECT_TRUE(has(r.err, refused.message)) << what << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << what << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(env.instances() / "y"));
  EXPECT_EQ(nshpc::parse_json(env.run({"instance", "describe", "x", "--json"}).out)["network"],
            nshpc::network::nat_unavailable() ? "filtered" : "nat");
  // A state by its name is still taken.
  Result jobs = env.run({"instance", "jobs", "x", "--status", "completed", "--json"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
}

// The living-instance commands on what needs no living sandbox: the flag, the STATE column, and
// the refusal for an instance that is not persistent (a running one is tested with the backend).
TEST(Cli, PersistentFlagStateColumnAndRefusals) {
  Env env;
  Result created = env.run({"instance", "create", "eph", "--json"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  EXPECT_EQ(nshpc::parse_json(created.out)["persistent"], false);
  Result living = env.run({"instance", "create", "liv", "--persistent", "--json"});
  ASSERT_EQ(living.exit_code, 0) << living.err;
  EXPECT_EQ(nshpc::parse_json(living.out)["persistent"], true);

  Result list = env.run({"instance", "list"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find("STATE"), std::string::npos) << list.out;

  for (const char* verb : {"start", "stop", "restart", "ps"}) {
    Result refused = env.run({"instance", verb, "eph"});
    EXPECT_EQ(refused.exit_code, 1) << verb;
    EXPECT_NE(refused.err.find("is not persistent"), std::string::npos) << refused.err;
    Result missing = env.run({"instance", verb, "ghost"});
    EXPECT_EQ(missing.exit_code, 1) << verb;
    EXPECT_NE(missing.err.find("'ghost' not found; 'ns-hpc instance list'"), std::string::npos) << missing.err;
  }

  Result updated = env.run({"instance", "update", "eph", "--persistent", "--json"});
  ASSERT_EQ(updated.exit_code, 0) << updated.err;
  EXPECT_EQ(nshpc::parse_json(updated.out)["persistent"], true);
  EXPECT_EQ(env.run({"instance", "update", "eph"}).exit_code, 1);  // nothing to update
}

// With the log at debug a person sees each step of a launch and how long it took: a fresh
// sandbox's, and in a living instance its start and each command's join.
TEST(Cli, AtDebugEveryLaunchStepIsALineWithItsTime) {
  Env env("default_network = \"off\"\n");
  env.create("steps");
  Result fresh = env.run({"--log-level", "debug", "bwrap", "steps", "--", "true"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  for (const char* step : {"command line", "open folders", "descriptors", "spawn"})
    EXPECT_NE(fresh.err.find(fmt::format("fresh steps: step {} ", step)), std::string::npos) << step << "\n" << fresh.err;
  EXPECT_NE(fresh.err.find("fresh steps: total "), std::string::npos) << fresh.err;

  env.create("alive", {"--persistent"});
  Result living = env.run({"--log-level", "debug", "bwrap", "alive", "--", "true"});
  ASSERT_EQ(living.exit_code, 0) << living.err;
  for (const char* line : {"living alive: step start sandbox ", "living alive: step wait until ready ",
                           "join alive: step find sandbox ", "join alive: step join "})
    EXPECT_NE(living.err.find(line), std::string::npos) << line << "\n" << living.err;
  env.run({"instance", "stop", "alive"});
}
