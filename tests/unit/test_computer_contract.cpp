// terminal_execute as mcp-virtual-computer 0.2.3 has it: the result object, the timeout and output-limit results, the description rules.
#include <gtest/gtest.h>

#include "tools/computer_contract.hpp"

namespace nshpc::tools::computer {
namespace {

using json = nlohmann::json;

TEST(ComputerTerminal, TheResultHasTheSeedsFields) {
  const json r = exec_result({"agent-workstation", false, true, std::nullopt}, "out", "err", 3, 12);
  EXPECT_EQ(r, nshpc::parse_json(R"({"computer_id": "agent-workstation", "operation": "terminal_execute",
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
