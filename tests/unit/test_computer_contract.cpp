// terminal_execute as mcp-virtual-computer 0.2.3 has it: input rules and messages word for word,
// the result object, the timeout and output-limit results, the description rules.
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "tools/computer_contract.hpp"

namespace nshpc::tools::computer {
namespace {

using json = nlohmann::json;

std::string refusal(const json& arguments) {
  try {
    parse_exec_request(arguments, 120);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ComputerTerminal, TheSeedsRefusalsWordForWord) {
  EXPECT_EQ(refusal({{"command", "ls"}, {"args", {"ls"}}}),
            "Cannot provide both 'command' and 'args'. Use 'command' for shell commands or 'args' for direct "
            "execution.");
  EXPECT_EQ(refusal(json::object()), "Must provide either 'command' or 'args'.");
  EXPECT_EQ(refusal({{"command", ""}, {"args", json::array()}}), "Must provide either 'command' or 'args'.");
  EXPECT_EQ(refusal({{"command", "ls"}, {"working_directory", "tmp"}}),
            "working_directory must be an absolute path, got: tmp");
  EXPECT_EQ(refusal({{"command", "ls"}, {"timeout", 0}}), "timeout must be at least 1 second.");
  EXPECT_EQ(refusal({{"command", "cat"}, {"stdin", std::string(kMaxStdinBytes + 1, 'x')}}),
            "stdin content exceeds the 2 MiB limit (2097153 bytes). Split into smaller chunks or use a different "
            "approach.");
  EXPECT_EQ(refusal({{"command", "cat"}, {"stdin", std::string(kMaxStdinBytes, 'x')}}), "(accepted)");
}

TEST(ComputerTerminal, EmptyValuesAreAbsentAndTheTimeoutDefaults) {
  const ExecRequest r =
      parse_exec_request({{"command", "ls"}, {"args", json::array()}, {"stdin", ""}, {"working_directory", ""}}, 120);
  EXPECT_EQ(r.command, "ls");
  EXPECT_FALSE(r.args);
  EXPECT_FALSE(r.stdin_text);
  EXPECT_FALSE(r.working_directory);
  EXPECT_EQ(r.timeout, 120);
  const ExecRequest a = parse_exec_request({{"args", {"echo", "a b"}}, {"timeout", 5}, {"working_directory", "/w"}}, 120);
  EXPECT_EQ(a.args, (std::vector<std::string>{"echo", "a b"}));
  EXPECT_EQ(a.timeout, 5);
  EXPECT_EQ(a.working_directory, "/w");
}

TEST(ComputerTerminal, WrongTypesAreRefusedNotCrashedOn) {
  EXPECT_NE(refusal({{"command", 5}}), "(accepted)");
  EXPECT_NE(refusal({{"args", "ls"}}), "(accepted)");
  EXPECT_NE(refusal({{"args", {1, 2}}}), "(accepted)");
  EXPECT_NE(refusal({{"command", "ls"}, {"timeout", "5"}}), "(accepted)");
  EXPECT_NE(refusal(json::array()), "(accepted)");
}

TEST(ComputerTerminal, TheResultHasTheSeedsFields) {
  const json r = exec_result({"agent-workstation", false, true, std::nullopt}, "out", "err", 3, 12);
  EXPECT_EQ(r, json::parse(R"({"computer_id": "agent-workstation", "operation": "terminal_execute",
      "desktop_environment": false, "network_access": true, "desktop_url": null,
      "stdout": "out", "stderr": "err", "exit_code": 3, "exec_duration_ms": 12})"));
}

TEST(ComputerTerminal, TimeoutAndOutputLimitMessages) {
  EXPECT_EQ(timeout_message(120), "[kilntainers: command timed out after 120s]");
  EXPECT_EQ(output_limit_message(2097152),
            "[kilntainers: output limit exceeded (2097152 bytes). Command terminated. No output returned. Re-run with "
            "head, tail, or grep to manage output size.]");
}

TEST(ComputerTerminal, DescriptionOverrideAndExtension) {
  const std::string plain = terminal_description("/usr/bin/zsh", 30, std::nullopt, std::nullopt);
  EXPECT_NE(plain.find("Commands run in zsh."), std::string::npos) << plain;
  EXPECT_NE(plain.find("after 30 seconds"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("Docker"), std::string::npos) << plain;
  EXPECT_EQ(terminal_description("/bin/bash", 120, std::nullopt, std::string("Use uv.")), 
            terminal_description("/bin/bash", 120, std::nullopt, std::nullopt) + "\n\nUse uv.");
  EXPECT_EQ(terminal_description("/bin/bash", 120, std::string("Just this."), std::nullopt), "Just this.");
}

}  // namespace
}  // namespace nshpc::tools::computer
