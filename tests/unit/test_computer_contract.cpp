// terminal_execute as mcp-virtual-computer 0.2.3 has it: the result object, the timeout and output-limit results, the description rules.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "base/text.hpp"
#include "tools/computer_contract.hpp"
#include "tools/internal.hpp"

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

// Every error of the computer, argument refusals included, is the seed's JSON object: the
// lifecycle tools' {"error"}, the others' {operation, computer_id, desktop_environment, error}.
TEST(ComputerErrors, TheSeedsObjectPerTool) {
  EXPECT_EQ(error_object("terminal_execute", "ws", "unknown argument 'x'"),
            nshpc::parse_json(R"({"operation": "terminal_execute", "computer_id": "ws",
                                  "desktop_environment": false, "error": "unknown argument 'x'"})"));
  EXPECT_EQ(error_object("poll_job", "ws", "e")["operation"], "poll_job");
  for (const char* lifecycle : {"computer_list", "computer_create", "computer_restart", "computer_factory_reset",
                                "computer_delete", "set_network_access"})
    EXPECT_EQ(error_object(lifecycle, "ws", "missing required argument 'enabled'"),
              json({{"error", "missing required argument 'enabled'"}}))
        << lifecycle;
}

// What a result takes on the wire: its JSON as structuredContent, and as the text, escaped again.
TEST(ComputerResults, ResultBytesCountsBothCopiesWithTheirEscaping) {
  const json object = {{"stdout", "a\"b\\c\n\x01"}};
  const std::string once = object.dump();
  EXPECT_EQ(result_bytes(object), once.size() + json(once).dump().size());
  EXPECT_GT(result_bytes(object), 2 * once.size());
}

namespace {

// terminal_execute's result cut as bound_output cuts it to `chars`: its marker names a file of
// /workspace/.ns_hpc_output.
json cut_to(json result, std::size_t chars) {
  const std::string out = result["stdout"], err = result["stderr"];
  const auto [go, ge] = split_budget(text::utf8_length(out), text::utf8_length(err), chars);
  const auto marker = [](std::size_t n) {
    return fmt::format("[ns-hpc: {} characters cut here; the whole output is in "
                       "/workspace/.ns_hpc_output/term-20261207T144839.541091-4292dc.out]",
                       n);
  };
  result["stdout"] = text::cut_middle(out, go, marker).text;
  result["stderr"] = text::cut_middle(err, ge, marker).text;
  return result;
}

json output_of(std::string out, std::string err = "") {
  return exec_result({"agent-workstation", false, true, std::nullopt}, out, err, 0, 12);
}

}  // namespace

// `seq 1 300000` returned 4.9 MB; now any output, however it escapes, fits the bound once cut.
TEST(ComputerResults, AnyOutputCutToTheChosenCharactersFitsTheBound) {
  std::string seq;
  for (int i = 1; i <= 300000; ++i) seq += std::to_string(i) + "\n";
  std::string emoji;
  for (int i = 0; i < 100000; ++i) emoji += "\xF0\x9F\x98\x80";
  const std::vector<json> outputs = {
      output_of(seq),
      output_of(std::string(2000000, '\x01')),
      output_of(std::string(500000, '\n'), std::string(500000, '"')),
      output_of(emoji, std::string(30000, '\\')),
      output_of("", std::string(100000, '\x1b')),
      output_of(std::string(29000, '\x01')),  // few characters, many bytes once escaped
  };
  for (const json& whole : outputs) {
    for (std::size_t start : {std::size_t{14700}, std::size_t{1000000}}) {
      const std::size_t chars = output_chars_within(whole, start);
      EXPECT_LE(chars, start);
      EXPECT_GT(chars, 1000u);  // still a useful head and tail
      EXPECT_LE(result_bytes(cut_to(whole, chars)), kResultBytes) << whole.dump().substr(0, 120);
    }
  }
}

TEST(ComputerResults, AnOutputThatFitsIsLeftWhole) {
  const json small = output_of("hello\n", "warning\n");
  EXPECT_EQ(output_chars_within(small, 14700), 14u);  // its own length: nothing to cut
  std::string seq;
  for (int i = 1; i <= 2000; ++i) seq += std::to_string(i) + "\n";  // 8,893 characters
  EXPECT_EQ(output_chars_within(output_of(seq), 14700), text::utf8_length(seq));
}

}  // namespace
}  // namespace nshpc::tools::computer
