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

// The computer's agent is pointed at the computer's own tools or at the operator: never at a tool
// this entry point does not offer, nor at a command to run.
TEST(ComputerTerminal, WhatNeedsAnActionNamesTheComputersOwnTools) {
  using Action = NeedsAction::Action;
  const NeedsAction reset(Action::reset_instance, "layer changed"), network(Action::choose_network, "no nat");
  EXPECT_EQ(action_advice(reset, true).rfind("computer_factory_reset", 0), 0u);
  EXPECT_EQ(action_advice(network, true).rfind("set_network_access", 0), 0u);
  // Without the lifecycle tools the agent has neither: the operator does it.
  EXPECT_EQ(action_advice(reset, false), "ask the server's operator to factory reset the computer");
  EXPECT_EQ(action_advice(network, false).rfind("ask the server's operator", 0), 0u);
  for (bool lifecycle : {true, false}) {
    for (Action a : {Action::choose_network, Action::reset_instance, Action::build_image, Action::check_id_ranges,
                     Action::check_host}) {
      const std::string said = action_advice(NeedsAction(a, "facts"), lifecycle);
      for (const char* other : {"_instance", "restore_snapshot", "ns-hpc instance", "ns-hpc image", "without an image"})
        EXPECT_EQ(said.find(other), std::string::npos) << said;
      if (!lifecycle) EXPECT_EQ(said.find("computer_"), std::string::npos) << said;
      if (const auto named = said.find("ns-hpc "); named != std::string::npos)
        EXPECT_LT(said.find("the server's operator"), named) << said;
    }
  }
}

}  // namespace
}  // namespace nshpc::tools::computer
