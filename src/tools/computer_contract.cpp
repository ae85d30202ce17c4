#include "tools/computer_contract.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "tools/internal.hpp"

namespace nshpc::tools::computer {

using json = nlohmann::json;

json exec_result(const ComputerFacts& facts, std::string_view stdout_text, std::string_view stderr_text, int exit_code,
                 std::int64_t duration_ms) {
  return json{{"computer_id", facts.computer_id},
              {"operation", "terminal_execute"},
              {"desktop_environment", facts.desktop_environment},
              {"network_access", facts.network_access},
              {"desktop_url", facts.desktop_url ? json(*facts.desktop_url) : json(nullptr)},
              {"stdout", stdout_text},
              {"stderr", stderr_text},
              {"exit_code", exit_code},
              {"exec_duration_ms", duration_ms}};
}

std::string timeout_message(std::int64_t seconds) {
  return fmt::format("[kilntainers: command timed out after {}s]", seconds);
}

std::string output_limit_message(std::int64_t limit) {
  return fmt::format(
      "[kilntainers: output limit exceeded ({} bytes). Command terminated. No output returned. Re-run with head, "
      "tail, or grep to manage output size.]",
      limit);
}

std::string terminal_description(std::string_view shell, std::int64_t timeout,
                                 const std::optional<std::string>& override_text,
                                 const std::optional<std::string>& extended) {
  if (override_text) return *override_text;
  std::string text = fmt::format(
      "Execute a shell command in one persistent Debian Linux computer. Commands run in {}. Each call is "
      "independent — no state (shell variables, working directory) persists between calls (however filesystem does "
      "persist). Use the working_directory parameter or chain commands with && to control execution context. \n\nTo "
      "write files or pass data without shell escaping, use the stdin parameter (e.g., command=\"cat > file.txt\" "
      "with content in stdin). Commands time out after {} seconds by default (override with the timeout parameter "
      "for long-running operations).",
      std::filesystem::path(shell).filename().string(), timeout);
  if (extended) text += "\n\n" + *extended;
  return text;
}

std::string action_advice(const NeedsAction& e, bool lifecycle_tools) {
  switch (e.action()) {
    case NeedsAction::Action::choose_network:
      return lifecycle_tools
                 ? "set_network_access with enabled=false and then enabled=true gives it a network that works here"
                 : "ask the server's operator to give the computer a network that works here ('filtered' or 'off')";
    case NeedsAction::Action::reset_instance:
      return lifecycle_tools ? "computer_factory_reset returns it to a fresh image (its installs and /workspace go)"
                             : "ask the server's operator to factory reset the computer";
    case NeedsAction::Action::build_image:
      return "ask the server's operator to build the image as the user who runs the server";
    case NeedsAction::Action::check_id_ranges:
    case NeedsAction::Action::check_host:
      break;  // the host's to fix: worded as for any instance
  }
  return needs_action_advice(e);
}

}  // namespace nshpc::tools::computer
