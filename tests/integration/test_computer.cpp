// The mcp-virtual-computer entry point's command line through the binary: every start-up check of
// the seed's validate_config with its message word for word (prefix "mcp-virtual-computer:
// error:", exit 1), usage errors (exit 2), the environment's booleans, the Docker flags, the help,
// and the binary invoked as mcp-virtual-computer. None of these starts a server or a sandbox.
#include <unistd.h>

#include <string>
#include <vector>

#include "base/process.hpp"
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
