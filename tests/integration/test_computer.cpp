// The mcp-virtual-computer entry point's command line through the binary: every start-up check of
// the seed's validate_config with its message word for word (prefix "mcp-virtual-computer:
// error:", exit 1), usage errors (exit 2), the environment's booleans, the Docker flags, the help,
// and the binary invoked as mcp-virtual-computer. None of these starts a sandbox; one starts a
// server, to see which temporary computers it deletes when it starts.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"
#include "base/process.hpp"
#include "base/spawn.hpp"
#include "harness.hpp"

using namespace nshpc::test;

namespace {

struct Case {
  std::vector<std::string> args;
  std::vector<std::string> env;  // NAME=value
  std::string message;           // what follows "mcp-virtual-computer: error: "
};

const std::string kId = "COMPUTER_ID=agent-workstation";

// `program` alone with this environment (no --config: a client configuration's command line).
nshpc::CommandResult run_program(const std::vector<std::string>& argv, const std::vector<std::string>& vars,
                                 const fs::path& home) {
  std::vector<std::string> full = {"env", "-i", "PATH=/usr/bin:/bin", "HOME=" + home.string(),
                                   "XDG_CONFIG_HOME=" + (home / "xdg").string()};
  full.insert(full.end(), vars.begin(), vars.end());
  full.insert(full.end(), argv.begin(), argv.end());
  return nshpc::run_command(full);
}

void expect_refusal(const Env& env, const Case& c, int exit_code) {
  std::vector<std::string> args = {"computer"};
  args.insert(args.end(), c.args.begin(), c.args.end());
  const Result r = env.run(args, "", std::chrono::seconds(30), c.env);
  EXPECT_EQ(r.exit_code, exit_code) << c.message << "\n" << r.err;
  EXPECT_NE(r.err.find("mcp-virtual-computer: error: " + c.message + "\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace

TEST(ComputerCli, EveryStartUpCheckOfTheSeedWithItsMessage) {
  Env env;
  const std::vector<Case> cases = {
      {{"--host", "0.0.0.0"}, {kId},
       "--host is only valid with --transport http. In stdio mode, there is no HTTP server to bind."},
      {{"--port", "9000"}, {kId},
       "--port is only valid with --transport http. In stdio mode, there is no HTTP server to bind."},
      {{"--session-timeout", "60"}, {kId},
       "--session-timeout is only valid with --transport http. In stdio mode, the session lives as long as the "
       "process."},
      {{"--tool-instruction-override", "a", "--extended-tool-instruction", "b"}, {kId},
       "Cannot use both --tool-instruction-override and --extended-tool-instruction. Use override to replace the "
       "description entirely, or extended to append to the backend default."},
      {{"--timeout", "0"}, {kId}, "--timeout must be at least 1 second."},
      {{"--output-limit", "0"}, {kId}, "--output-limit must be at least 1 byte."},
      {{}, {}, "COMPUTER_ID is required (example: COMPUTER_ID=agent-workstation)."},
      {{}, {"COMPUTER_ID="}, "COMPUTER_ID is required (example: COMPUTER_ID=agent-workstation)."},
      {{}, {"COMPUTER_ID=Agent_Workstation"},
       "COMPUTER_ID must be 1-63 lowercase letters, numbers, or hyphens; it must start and end with a letter or "
       "number."},
      {{"--transport", "http", "--host", "0.0.0.0"}, {kId},
       "A non-loopback HTTP listener can execute arbitrary sandbox commands. Set KILNTAINERS_AUTH_TOKEN/--auth-token, "
       "or explicitly pass --allow-unauthenticated-http behind a trusted private network."},
      // Not the seed's: its env_flag ended in a traceback.
      {{}, {kId, "NETWORK_ACCESS=maybe"}, "NETWORK_ACCESS must be true or false (also 1/0, yes/no, on/off), not \"maybe\"."},
      {{}, {kId, "DESKTOP_ENVIRONMENT=2"},
       "DESKTOP_ENVIRONMENT must be true or false (also 1/0, yes/no, on/off), not \"2\"."},
  };
  for (const Case& c : cases) expect_refusal(env, c, 1);
}

TEST(ComputerCli, UsageErrorsExitTwoAndDockerFlagsSayWhatToUse) {
  Env env;
  const std::vector<Case> cases = {
      {{"--transport", "sse"}, {kId}, "--transport: sse not in {stdio,http}"},
      {{"--engine", "docker"}, {kId},
       "--engine is a Docker option; ns-hpc runs the computer in a bubblewrap sandbox without Docker. Drop it "
       "(limits: --cpu and --memory; isolation is always on)"},
      {{"--image", "debian:bookworm-slim"}, {kId},
       "--image names a Docker image; ns-hpc's computers use its own Debian image ([namespace] default_image, built "
       "by `ns-hpc image build`). Drop --image"},
      {{"--memory", "lots"}, {kId},
       "--memory \"lots\" is not a size such as 512m or 2g (a whole number with b, k, m or g; at least 6m)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"computer"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const Result r = env.run(args, "", std::chrono::seconds(30), c.env);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("usage: mcp-virtual-computer", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("mcp-virtual-computer: error: "), std::string::npos) << r.err;
    if (c.args.front() != "--transport") EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  const Result unknown = env.run({"computer", "--no-such-flag"}, "", std::chrono::seconds(30), {kId});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("--no-such-flag"), std::string::npos) << unknown.err;
}

TEST(ComputerCli, HelpListsTheSeedsFlagsAndTheMainHelpListsTheCommand) {
  Env env;
  const Result help = env.run({"computer", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  for (const char* flag : {"--transport", "--host", "--port", "--timeout", "--output-limit", "--session-timeout",
                           "--auth-token", "--allow-unauthenticated-http", "--shell", "--network", "--no-network",
                           "--tool-instruction-override", "--extended-tool-instruction", "--cpu", "--memory",
                           "COMPUTER_ID"})
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag << "\n" << help.out;
  const Result main_help = env.run({"--help"});
  EXPECT_NE(main_help.out.find("computer"), std::string::npos) << main_help.out;
}

TEST(ComputerCli, TheBinaryInvokedAsMcpVirtualComputerIsTheSame) {
  Env env;
  const fs::path link = env.root() / "mcp-virtual-computer";
  fs::create_symlink(fs::absolute(binary()), link);
  // Run directly (no --config: the seed's command line only), as a client configuration would.
  nshpc::CommandResult r = run_program({link.string()}, {"COMPUTER_ID=Bad"}, env.root());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "mcp-virtual-computer: error: COMPUTER_ID must be 1-63 lowercase letters, numbers, or hyphens; it must "
            "start and end with a letter or number.\n");
  r = run_program({link.string(), "--help"}, {}, env.root());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("MCP server providing one persistent local computer", 0), 0u) << r.out;
}

namespace {

// An instance made a temporary computer on record, held by the process `holder` (its pid and
// start time, as a server records its sessions).
void make_held_computer(const Env& env, const std::string& id, const nshpc::SpawnedChild& holder) {
  env.create(id);
  const fs::path base = env.instances() / id;
  nlohmann::json meta = nshpc::parse_json(read_text(base / "metadata.json"));
  meta["computer"] = {{"temporary", true}};
  std::ofstream(base / "metadata.json") << meta.dump(2);
  const std::optional<nshpc::proc::Stat> stat = nshpc::proc::read_stat(holder.pid());
  ASSERT_TRUE(stat);
  fs::create_directory(base / "owners");
  std::ofstream(base / "owners" / fmt::format("{}.{}.session", holder.pid(), stat->start_time));
}

nshpc::SpawnedChild sleeper() {
  nshpc::SpawnSpec spec;
  spec.program = "sleep";
  spec.argv = {"sleep", "1000"};
  return nshpc::spawn(spec);  // killed and reaped when the test ends, however it ends
}

}  // namespace

// A server that crashed and was never reaped (an init that reaps nothing, a container without
// --init) is a zombie that keeps its pid and start time: the temporary computers only it held go
// when the next server starts; one that a running process holds stays.
TEST(ComputerHolders, AZombieServersTemporaryComputersGoWhenTheNextServerStarts) {
  Env env;
  nshpc::SpawnedChild crashed = sleeper();
  nshpc::SpawnedChild running = sleeper();
  make_held_computer(env, "orphan", crashed);
  make_held_computer(env, "held", running);
  nshpc::signal_pidfd(crashed.pidfd(), SIGKILL);
  ASSERT_TRUE(nshpc::wait_pidfd(crashed.pidfd(), std::chrono::seconds(30)));  // ended, not reaped
  ASSERT_EQ(nshpc::proc::read_stat(crashed.pid()).value_or(nshpc::proc::Stat{}).state, 'Z');
  // The next server (stdio, no client: it starts, sweeps, and ends with its input).
  const Result r = env.run({"computer"}, "", std::chrono::seconds(60), {kId});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(env.instances() / "orphan")) << "the zombie holds nothing\n" << r.err;
  EXPECT_TRUE(fs::exists(env.instances() / "held" / "metadata.json")) << "a running holder keeps it\n" << r.err;
}

namespace {

// `ns-hpc computer` spoken to over stdio: initialize, then `requests` (each {"method", "params"},
// numbered from 2); the answers by id. Nothing here needs a computer to exist.
std::map<int, nlohmann::json> ask_computer(const Env& env, const std::vector<nlohmann::json>& requests,
                                           std::map<int, std::string>* lines = nullptr) {
  std::string input =
      R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},)"
      R"("clientInfo":{"name":"computer-test","version":"1"}}})"
      "\n"
      R"({"jsonrpc":"2.0","method":"notifications/initialized"})"
      "\n";
  int id = 2;
  for (const nlohmann::json& r : requests) {
    nlohmann::json message = {{"jsonrpc", "2.0"}, {"id", id++}, {"method", r["method"]}, {"params", r["params"]}};
    input += message.dump() + "\n";
  }
  const Result r = env.run({"computer"}, input, std::chrono::seconds(60), {kId});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<int, nlohmann::json> answers;
  std::size_t from = 0;
  for (std::size_t end = r.out.find('\n'); end != std::string::npos; from = end + 1, end = r.out.find('\n', from)) {
    const std::string line = r.out.substr(from, end - from);
    const nlohmann::json message = nshpc::parse_json(line);
    if (!message.contains("id") || !message["id"].is_number_integer()) continue;
    answers[message["id"].get<int>()] = message;
    if (lines) (*lines)[message["id"].get<int>()] = line;
  }
  return answers;
}

nlohmann::json call(const std::string& tool, nlohmann::json args) {
  return {{"method", "tools/call"}, {"params", {{"name", tool}, {"arguments", std::move(args)}}}};
}

// A tool error's JSON object (the seed answers errors as JSON text).
nlohmann::json error_of(const nlohmann::json& answer) {
  EXPECT_TRUE(answer["result"].value("isError", false)) << answer.dump();
  return nshpc::parse_json(answer["result"]["content"][0]["text"].get<std::string>());
}

}  // namespace

// A model reads tools/list on every turn: at most 8.5 KiB for the computer (it was 12.6 KiB), with
// the seed's tools, terminal_execute's description the seed's, and what `ns-hpc run` adds. It was
// 8 KiB until computer_ui (the seed's tool that opens the dashboard as an MCP App: 342 bytes with
// its _meta) came in at 8,122 bytes.
TEST(ComputerTools, TheToolListFitsItsBudget) {
  Env env;
  std::map<int, std::string> lines;
  auto answers = ask_computer(env, {{{"method", "tools/list"}, {"params", nlohmann::json::object()}}}, &lines);
  ASSERT_TRUE(answers.count(2)) << "no answer to tools/list";
  EXPECT_LE(lines[2].size(), 8704u) << lines[2];
  std::vector<std::string> names;
  for (const auto& tool : answers[2]["result"]["tools"]) names.push_back(tool["name"]);
  for (const char* name : {"terminal_execute", "read_file", "write_file", "edit_file", "expose_port", "submit_job", "computer_ui",
                           "poll_job", "computer_list", "computer_create", "computer_restart", "computer_factory_reset",
                           "computer_delete", "set_network_access"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  // Kilntainers' old name is answered (below) but not listed.
  EXPECT_EQ(std::find(names.begin(), names.end(), "sandbox_exec"), names.end());
  const auto& terminal = *std::find_if(answers[2]["result"]["tools"].begin(), answers[2]["result"]["tools"].end(),
                                       [](const nlohmann::json& t) { return t["name"] == "terminal_execute"; });
  EXPECT_EQ(terminal["description"].get<std::string>().rfind(
                "Execute a shell command in one persistent Debian Linux computer. Commands run in bash. Each call is "
                "independent",
                0),
            0u);
  EXPECT_EQ(terminal["inputSchema"]["properties"]["command"]["description"],
            "Shell command string (mutually exclusive with args).");
}

// A session that made no computer, on a server whose store does not exist yet, ends quietly (it
// warned that the computers' lock file could not be opened).
TEST(ComputerTools, ASessionThatMadeNothingEndsWithoutAWarning) {
  Env env;
  ASSERT_FALSE(fs::exists(env.instances()));
  const Result r = env.run(
      {"computer"},
      R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},)"
      R"("clientInfo":{"name":"computer-test","version":"1"}}})"
      "\n",
      std::chrono::seconds(60), {kId});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// sandbox_exec, Kilntainers' name for terminal_execute, is the same tool when called.
TEST(ComputerTools, SandboxExecIsAnsweredAsTerminalExecute) {
  Env env;
  auto answers = ask_computer(env, {call("sandbox_exec", {{"command", "true"}, {"args", {"true"}}})});
  const nlohmann::json refused = error_of(answers[2]);
  EXPECT_EQ(refused["operation"], "terminal_execute") << refused.dump();
  EXPECT_EQ(refused["error"],
            "Cannot provide both 'command' and 'args'. Use 'command' for shell commands or 'args' for direct execution.");
}

// Arguments the input schema refuses come back as the seed's JSON error object of the tool, as
// every other error of it does (they were plain text).
TEST(ComputerTools, RefusedArgumentsAreTheSeedsJsonErrors) {
  Env env;
  auto answers = ask_computer(env, {call("terminal_execute", {{"command", "true"}, {"bogus", 1}}),
                                    call("set_network_access", nlohmann::json::object()),
                                    call("poll_job", {{"job_id", 7}, {"computer_id", "other-box"}})});
  const nlohmann::json unknown = error_of(answers[2]);
  EXPECT_EQ(unknown["operation"], "terminal_execute");
  EXPECT_EQ(unknown["computer_id"], "agent-workstation");
  EXPECT_EQ(unknown["desktop_environment"], false);
  EXPECT_EQ(unknown["error"].get<std::string>().rfind("unknown argument 'bogus'", 0), 0u) << unknown;
  EXPECT_EQ(error_of(answers[3]), nlohmann::json({{"error", "missing required argument 'enabled'"}}));
  const nlohmann::json typed = error_of(answers[4]);
  EXPECT_EQ(typed["operation"], "poll_job");
  EXPECT_EQ(typed["computer_id"], "other-box");
  EXPECT_NE(typed["error"].get<std::string>().find("job_id"), std::string::npos) << typed;
}

// The seed's "Computer 'x' was not found." and where to look: computer_list, or (lifecycle tools
// hidden) this server's own computer.
TEST(ComputerTools, AComputerNotFoundSaysWhereToLook) {
  Env env;
  auto answers = ask_computer(env, {call("terminal_execute", {{"command", "true"}, {"computer_id", "nope"}}),
                                    call("computer_restart", {{"computer_id", "nope"}})});
  EXPECT_EQ(error_of(answers[2])["error"], "Computer 'nope' was not found. computer_list lists the computers.");
  EXPECT_EQ(error_of(answers[3]), nlohmann::json({{"error", "Computer 'nope' was not found. computer_list lists "
                                                            "the computers."}}));
  Env quiet("[computer]\nexpose_lifecycle_tools = false\n");
  answers = ask_computer(quiet, {call("read_file", {{"path", "/etc/hostname"}, {"computer_id", "nope"}})});
  EXPECT_EQ(error_of(answers[2])["error"],
            "Computer 'nope' was not found. Leave computer_id out to use this server's computer 'agent-workstation'.");
}

// Nothing is provisioned before the first tools/call (issue 36): a client may start a server only
// to probe it (an MCP client in {mode: 'auto'} over stdio starts a throw-away one for
// server/discover), and that must cost no image build (minutes of CPU), computer, desktop or
// instance. The default image's place cannot be made here (its parent is a file), so an attempt
// to build it is seen in the log, never reaches the mirror.
TEST(NothingBeforeTheFirstToolCall, NeitherEntryPointBuildsOrCreatesAnythingForAProbe) {
  Env env("default_image = \"debian\"\n");
  const fs::path blocker = env.root() / "blocker";
  std::ofstream(blocker) << "a file, not a folder";
  std::ofstream(env.config_file(), std::ios::app) << "images_dir = \"" << (blocker / "images").string() << "\"\n";
  const std::string init =
      R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},)"
      R"("clientInfo":{"name":"probe","version":"1"}}})"
      "\n"
      R"({"jsonrpc":"2.0","method":"notifications/initialized"})"
      "\n";
  std::string probe = init;
  int id = 2;
  for (const char* method : {"tools/list", "resources/list", "prompts/list", "resources/templates/list"})
    probe += nlohmann::json{{"jsonrpc", "2.0"}, {"id", id++}, {"method", method}, {"params", nlohmann::json::object()}}
                 .dump() + "\n";
  const std::string attempt = "the default image 'debian' cannot be built in the background";
  const auto instances = [&env] {
    std::vector<std::string> ids;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(env.instances(), ec))
      if (e.is_directory() && e.path().filename().string().front() != '.') ids.push_back(e.path().filename());
    return ids;
  };
  for (const std::vector<std::string>& vars : {std::vector<std::string>{}, {kId, "DESKTOP_ENVIRONMENT=true"}}) {
    const std::vector<std::string> args = {vars.empty() ? "run" : "computer"};
    const Result r = env.run(args, probe, std::chrono::seconds(60), vars);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"id\":5"), std::string::npos) << "every probe answered:\n" << r.out;
    EXPECT_EQ(r.err.find("default image"), std::string::npos) << args[0] << ":\n" << r.err;
    EXPECT_TRUE(instances().empty()) << args[0] << " made " << instances().front();
  }
  // The first tools/call is what starts it (here: tries to, and says why it cannot).
  const std::string call =
      init + R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_instances","arguments":{}}})" "\n";
  const Result r = env.run({"run"}, call, std::chrono::seconds(60));
  EXPECT_NE(r.err.find(attempt), std::string::npos) << r.err;
}
