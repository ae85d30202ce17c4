// The mcp-virtual-computer 0.2.3 contract of terminal_execute, kept exactly where ns-hpc's own
// differs (reference/virtual-computer.md §1.1–1.2): its result object, its timeout and
// output-limit results, and its tool description rules. Pure: the computer entry point's tools
// use it. The input rules and messages are already the seed's in ns-hpc's own terminal_execute
// (tools/terminal.cpp), which the computer's shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "base/json.hpp"

namespace nshpc::tools::computer {

// Who answers: the fields every result of the computer carries.
struct ComputerFacts {
  std::string computer_id;
  bool desktop_environment = false;
  bool network_access = true;
  std::optional<std::string> desktop_url;
};

// The result object, as text and as structuredContent: computer_id, operation,
// desktop_environment, network_access, desktop_url, stdout, stderr, exit_code, exec_duration_ms.
nlohmann::json exec_result(const ComputerFacts& facts, std::string_view stdout_text, std::string_view stderr_text,
                           int exit_code, std::int64_t duration_ms);

// A command that ran out of time: no output kept, exit 124, this on stderr.
std::string timeout_message(std::int64_t seconds);
// A command whose stdout and stderr together passed --output-limit: stopped, no output, exit 1.
std::string output_limit_message(std::int64_t limit);

// The tool's description: the override when given; else ours (shell basename, timeout filled in)
// with "\n\n" + extended when given.
std::string terminal_description(std::string_view shell, std::int64_t timeout,
                                 const std::optional<std::string>& override_text,
                                 const std::optional<std::string>& extended);

// The seed's error object: {"error"} for the lifecycle tools (computer_list, computer_create,
// computer_restart, computer_factory_reset, computer_delete, set_network_access), else
// {operation, computer_id, desktop_environment, error}. Argument refusals of the input schema
// take it too.
nlohmann::json error_object(std::string_view tool, std::string_view computer_id, std::string_view message);

// set_desktop_environment true on a computer whose root has no desktop (the seed's words).
inline constexpr std::string_view kNoDesktopInPlace =
    "This existing computer was created from a headless or custom image and cannot start Xfce in place. Its data was "
    "left untouched; use factory_reset_computer only if replacing it is intentional.";

// What a result's text and structuredContent may take together (bytes): 64 KiB less room for the
// message around them.
inline constexpr std::size_t kResultBytes = 60000;
// Bytes `object` takes in a result shaped as the seed's: its JSON as the text (escaped once more
// in the message) and as structuredContent.
std::size_t result_bytes(const nlohmann::json& object);
// The characters of output, at most `start`, that keep terminal_execute's `result` (its whole
// stdout and stderr) within `cap` bytes once both are cut to it as bound_output cuts them: shared
// by split_budget, each cut in the middle with a marker line naming the file with the whole.
std::size_t output_chars_within(const nlohmann::json& result, std::size_t start, std::size_t cap = kResultBytes);

// What the computer's agent does about a NeedsAction: the computer's own tool that does it (it has
// no update_instance or factory_reset_instance) when `lifecycle_tools` are offered, else what to
// ask of the server's operator.
std::string action_advice(const NeedsAction& e, bool lifecycle_tools);

}  // namespace nshpc::tools::computer
