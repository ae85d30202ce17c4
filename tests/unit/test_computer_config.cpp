// The mcp-virtual-computer entry point's start-up checks: the seed's rules and messages, one test
// per message (reference/virtual-computer.md §2.2, §6; seeds/003 validate_config).
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <regex>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"
#include "base/spawn.hpp"
#include "cli/computer_config.hpp"
#include "instances/computers.hpp"

namespace nshpc::cli {
namespace {

using instances::random_computer_id;
using instances::validate_computer_id;

ComputerConfig valid() {
  ComputerConfig c;
  c.computer_id = "agent-workstation";
  return c;
}

std::string problem(const ComputerConfig& c) { return startup_problem(c).value_or("(none)"); }

TEST(ComputerConfig, TheDefaultsWithAComputerIdStart) { EXPECT_EQ(startup_problem(valid()), std::nullopt); }

TEST(ComputerConfig, HostIsOnlyForHttp) {
  ComputerConfig c = valid();
  c.host = "0.0.0.0";
  EXPECT_EQ(problem(c), "--host is only valid with --transport http. In stdio mode, there is no HTTP server to bind.");
  c.transport = "http";
  c.auth_token = "t";
  EXPECT_EQ(startup_problem(c), std::nullopt);
}

TEST(ComputerConfig, PortIsOnlyForHttp) {
  ComputerConfig c = valid();
  c.port = 9000;
  EXPECT_EQ(problem(c), "--port is only valid with --transport http. In stdio mode, there is no HTTP server to bind.");
}

TEST(ComputerConfig, SessionTimeoutIsOnlyForHttp) {
  ComputerConfig c = valid();
  c.session_timeout = 60;
  EXPECT_EQ(problem(c),
            "--session-timeout is only valid with --transport http. In stdio mode, the session lives as long as the "
            "process.");
}

TEST(ComputerConfig, OverrideAndExtendedExcludeEachOther) {
  ComputerConfig c = valid();
  c.tool_instruction_override = "a";
  c.extended_tool_instruction = "b";
  EXPECT_EQ(problem(c),
            "Cannot use both --tool-instruction-override and --extended-tool-instruction. Use override to replace the "
            "description entirely, or extended to append to the backend default.");
}

TEST(ComputerConfig, TimeoutAtLeastOneSecond) {
  ComputerConfig c = valid();
  c.timeout = 0;
  EXPECT_EQ(problem(c), "--timeout must be at least 1 second.");
}

TEST(ComputerConfig, OutputLimitAtLeastOneByte) {
  ComputerConfig c = valid();
  c.output_limit = -5;
  EXPECT_EQ(problem(c), "--output-limit must be at least 1 byte.");
}

TEST(ComputerConfig, ComputerIdIsRequired) {
  ComputerConfig c = valid();
  c.computer_id = "";
  EXPECT_EQ(problem(c), "COMPUTER_ID is required (example: COMPUTER_ID=agent-workstation).");
}

TEST(ComputerConfig, ComputerIdFollowsTheSlugRuleNamedAsTheVariable) {
  const std::string rule =
      "COMPUTER_ID must be 1-63 lowercase letters, numbers, or hyphens; it must start and end with a letter or number.";
  for (const std::string& bad : std::vector<std::string>{"Agent", "-agent", "agent-", "agent_1", "a b", std::string(64, 'a'), "   "}) {
    ComputerConfig c = valid();
    c.computer_id = bad;
    EXPECT_EQ(problem(c), rule) << bad;
  }
  for (const std::string& good : std::vector<std::string>{"a", "7", "agent-workstation", std::string(63, 'z'), "  padded  "}) {
    ComputerConfig c = valid();
    c.computer_id = good;
    EXPECT_EQ(startup_problem(c), std::nullopt) << good;
  }
  EXPECT_EQ(validate_computer_id("  padded\n"), "padded");
  try {
    validate_computer_id("Bad");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "computer_id must be 1-63 lowercase letters, numbers, or hyphens; it must start and end with a letter "
              "or number.");
  }
}

TEST(ComputerConfig, ANonLoopbackHttpListenerNeedsATokenOrTheExplicitFlag) {
  const std::string refusal =
      "A non-loopback HTTP listener can execute arbitrary sandbox commands. Set KILNTAINERS_AUTH_TOKEN/--auth-token, "
      "or explicitly pass --allow-unauthenticated-http behind a trusted private network.";
  ComputerConfig c = valid();
  c.transport = "http";
  for (const char* loopback : {"127.0.0.1", "localhost", "::1"}) {
    c.host = loopback;
    EXPECT_EQ(startup_problem(c), std::nullopt) << loopback;
  }
  c.host = "0.0.0.0";
  EXPECT_EQ(problem(c), refusal);
  c.auth_token = "";
  EXPECT_EQ(problem(c), refusal);  // an empty token is no token
  c.auth_token = "secret";
  EXPECT_EQ(startup_problem(c), std::nullopt);
  c.auth_token.reset();
  c.allow_unauthenticated_http = true;
  EXPECT_EQ(startup_problem(c), std::nullopt);
}

TEST(ComputerConfig, EnvFlagsTakeTheSeedsValuesAndNameTheVariableOtherwise) {
  for (const char* yes : {"true", "TRUE", " True ", "1", "yes", "On", "\tyes\n"})
    EXPECT_TRUE(env_flag("NETWORK_ACCESS", yes, false)) << yes;
  for (const char* no : {"false", "0", "NO", " off "}) EXPECT_FALSE(env_flag("NETWORK_ACCESS", no, true)) << no;
  EXPECT_TRUE(env_flag("NETWORK_ACCESS", nullptr, true));
  EXPECT_FALSE(env_flag("DESKTOP_ENVIRONMENT", nullptr, false));
  for (const char* bad : {"", "maybe", "2", "y", "enabled"}) {
    try {
      env_flag("DESKTOP_ENVIRONMENT", bad, false);
      FAIL() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("DESKTOP_ENVIRONMENT"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("true or false"), std::string::npos) << e.what();
    }
  }
}

TEST(ComputerConfig, RandomIdsAreReadableSlugsFromTheSeedsWords) {
  const std::regex shape("(amber|brisk|calm|clever|coral|crisp|gentle|lucky|quiet|rapid|silver|steady)-"
                         "(badger|comet|falcon|gecko|heron|lynx|otter|panda|raven|tiger|whale|wolf)-[0-9a-f]{4}");
  std::set<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    const std::string id = random_computer_id();
    EXPECT_TRUE(std::regex_match(id, shape)) << id;
    EXPECT_EQ(validate_computer_id(id), id);
    seen.insert(id);
  }
  EXPECT_GT(seen.size(), 40u);  // 9.4 million possible ids
}

// The command line and the environment, as the seed reads them.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> lookup() const {
    return [this](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(ComputerArgs, DefaultsAreTheSeeds) {
  FakeEnv env{{{"COMPUTER_ID", "agent-workstation"}}};
  const ComputerConfig c = parse_computer_args({}, env.lookup()).config;
  EXPECT_EQ(c.transport, "stdio");
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 8435);
  EXPECT_EQ(c.timeout, 120);
  EXPECT_EQ(c.output_limit, 2097152);
  EXPECT_EQ(c.session_timeout, 300);
  EXPECT_EQ(c.shell, "/bin/bash");
  EXPECT_TRUE(c.network_access);
  EXPECT_FALSE(c.desktop_environment);
  EXPECT_FALSE(c.auth_token);
  EXPECT_EQ(c.computer_id, "agent-workstation");
  EXPECT_EQ(startup_problem(c), std::nullopt);
}

TEST(ComputerArgs, FlagsAreRead) {
  FakeEnv env;
  const ComputerConfig c =
      parse_computer_args({"--transport", "http", "--host=::1", "--port", "9001", "--timeout", "30", "--output-limit",
                           "1000", "--session-timeout", "60", "--auth-token", "tok", "--shell", "/bin/sh",
                           "--no-network", "--extended-tool-instruction", "more", "--cpu", "1.5", "--memory", "2g",
                           "--allow-unauthenticated-http"},
                          env.lookup())
          .config;
  EXPECT_EQ(c.transport, "http");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, 9001);
  EXPECT_EQ(c.timeout, 30);
  EXPECT_EQ(c.output_limit, 1000);
  EXPECT_EQ(c.session_timeout, 60);
  EXPECT_EQ(c.auth_token, "tok");
  EXPECT_EQ(c.shell, "/bin/sh");
  EXPECT_FALSE(c.network_access);
  EXPECT_EQ(c.extended_tool_instruction, "more");
  EXPECT_FALSE(c.tool_instruction_override);
  EXPECT_EQ(c.cpus, 1.5);
  EXPECT_EQ(c.memory_mib, 2048);
  EXPECT_TRUE(c.allow_unauthenticated_http);
}

TEST(ComputerArgs, TheEnvironmentFillsInAndNetworkAccessWinsOverTheFlag) {
  FakeEnv env{{{"NETWORK_ACCESS", "off"}, {"DESKTOP_ENVIRONMENT", "Yes"}, {"KILNTAINERS_AUTH_TOKEN", "from-env"}}};
  ComputerConfig c = parse_computer_args({"--network"}, env.lookup()).config;
  EXPECT_FALSE(c.network_access);
  EXPECT_TRUE(c.desktop_environment);
  EXPECT_EQ(c.auth_token, "from-env");
  c = parse_computer_args({"--auth-token", "flag"}, env.lookup()).config;
  EXPECT_EQ(c.auth_token, "flag");
  env.vars["NETWORK_ACCESS"] = "sometimes";
  EXPECT_THROW(parse_computer_args({}, env.lookup()), UsageError);
}

// Not the seed's: the whole output of a command in its result (the seed's behaviour) instead of
// head and tail with the whole in a file, asked for by flag or, winning as NETWORK_ACCESS does, by
// the environment.
TEST(ComputerArgs, WholeOutputByFlagOrEnvironment) {
  FakeEnv env;
  EXPECT_FALSE(parse_computer_args({}, env.lookup()).config.whole_output);
  EXPECT_TRUE(parse_computer_args({"--whole-output"}, env.lookup()).config.whole_output);
  env.vars["WHOLE_OUTPUT"] = "yes";
  EXPECT_TRUE(parse_computer_args({}, env.lookup()).config.whole_output);
  env.vars["WHOLE_OUTPUT"] = "false";
  EXPECT_FALSE(parse_computer_args({"--whole-output"}, env.lookup()).config.whole_output);
  env.vars["WHOLE_OUTPUT"] = "all";
  EXPECT_THROW(parse_computer_args({}, env.lookup()), UsageError);
}

TEST(ComputerArgs, UsageErrorsAreArgumentErrors) {
  FakeEnv env;
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"--transport", "sse"},
                                             {"--port", "x"},
                                             {"--timeout"},
                                             {"--bogus"},
                                             {"extra"},
                                             {"--memory", "lots"},
                                             {"--memory", "1m"},
                                             {"--cpu", "-1"}})
    EXPECT_THROW(parse_computer_args(bad, env.lookup()), ComputerArgumentError) << bad.front();
}

TEST(ComputerArgs, DockerOnlyFlagsAreRefusedSayingWhatToUse) {
  FakeEnv env;
  for (const std::vector<std::string>& docker :
       std::vector<std::vector<std::string>>{{"--engine", "podman"},
                                             {"--docker-host", "unix:///x"},
                                             {"--docker-run-flag", "--privileged"},
                                             {"--image", "debian:bookworm"}}) {
    try {
      parse_computer_args(docker, env.lookup());
      FAIL() << docker.front();
    } catch (const ComputerArgumentError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(docker.front()), std::string::npos) << message;
      EXPECT_NE(message.find("Drop"), std::string::npos) << message;
    }
  }
}

TEST(ComputerArgs, HelpNamesTheFlags) {
  FakeEnv env;
  const ComputerStart start = parse_computer_args({"--help"}, env.lookup());
  ASSERT_TRUE(start.help);
  for (const char* flag :
       {"--transport", "--output-limit", "--no-network", "--tool-instruction-override", "--whole-output", "COMPUTER_ID"})
    EXPECT_NE(start.help->find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace nshpc::cli

namespace nshpc::instances {
namespace {

// A holder of a temporary computer is this process (pid and start time) and its session; one of
// a process that is gone, or a name that is not a key, holds nothing.
TEST(ComputerHolders, AKeyNamesALiveProcessUntilItEnds) {
  const std::string key = owner_key("0123abcd");
  EXPECT_EQ(key.rfind(std::to_string(::getpid()) + ".", 0), 0u) << key;
  EXPECT_TRUE(key.ends_with(".0123abcd")) << key;
  EXPECT_TRUE(owner_alive(key));
  EXPECT_TRUE(owner_key("a/b c").ends_with(".a_b_c")) << "no path separators or spaces reach a file name";
  const std::string pid = std::to_string(::getpid());
  EXPECT_FALSE(owner_alive(pid + ".1.x")) << "same pid, another start time: a process that reused the pid";
  for (const char* bad : {"", "stdio", "12", "x.y.z", "-1.2.s", "999999999.5.s"}) EXPECT_FALSE(owner_alive(bad)) << bad;
}

// A server that crashed and was never reaped (an init that reaps nothing, a container without
// --init) is a zombie with its pid and start time still on show: it holds nothing any more.
TEST(ComputerHolders, AZombieHoldsNothing) {
  SpawnSpec spec;
  spec.program = "sleep";
  spec.argv = {"sleep", "1000"};
  SpawnedChild child = spawn(spec);  // killed and reaped however the test ends
  const std::optional<proc::Stat> stat = proc::read_stat(child.pid());
  ASSERT_TRUE(stat);
  const std::string key = fmt::format("{}.{}.session", child.pid(), stat->start_time);
  EXPECT_TRUE(owner_alive(key)) << "a running process holds its computers";
  signal_pidfd(child.pidfd(), SIGKILL);
  ASSERT_TRUE(wait_pidfd(child.pidfd(), std::chrono::seconds(30)));  // exited, not reaped: a zombie
  const std::optional<proc::Stat> zombie = proc::read_stat(child.pid());
  ASSERT_TRUE(zombie) << "an unreaped child keeps its /proc entry";
  EXPECT_EQ(zombie->state, 'Z');
  EXPECT_EQ(zombie->start_time, stat->start_time);
  EXPECT_FALSE(owner_alive(key)) << "a zombie keeps its pid and start time but runs nothing";
  child.wait();
  EXPECT_FALSE(owner_alive(key)) << "reaped: gone";
}

// The stat line is read after the last ')': a command name may hold spaces and parentheses.
TEST(ComputerHolders, TheStatLineIsReadPastAnyCommandName) {
  std::string line = "4242 (a) Z 1 (x) S 77";
  for (int field = 5; field <= 21; ++field) line += " 0";
  line += " 123456 999 1\n";
  const std::optional<proc::Stat> stat = proc::parse_stat(line);
  ASSERT_TRUE(stat);
  EXPECT_EQ(stat->state, 'S');
  EXPECT_EQ(stat->ppid, 77);
  EXPECT_EQ(stat->start_time, 123456u);
  EXPECT_FALSE(stat->ended());
  EXPECT_FALSE(proc::parse_stat("4242 (sleep) S 1 2 3"));  // cut short
  EXPECT_FALSE(proc::parse_stat("no parenthesis"));
}

}  // namespace
}  // namespace nshpc::instances
