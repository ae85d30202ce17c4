#include "tools/computer_contract.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "base/text.hpp"
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

json error_object(std::string_view tool, std::string_view computer_id, std::string_view message) {
  const bool lifecycle = tool.rfind("computer_", 0) == 0 || tool == "set_network_access" ||
                         tool == "set_desktop_environment";
  if (lifecycle) return {{"error", message}};
  return {{"operation", tool},
          {"computer_id", computer_id},
          {"desktop_environment", false},
          {"error", message}};
}

std::size_t result_bytes(const json& object) {
  const std::string text = object.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() + json(text).dump().size();
}

std::size_t output_chars_within(const json& result, std::size_t start, std::size_t cap) {
  const std::string out = result.value("stdout", ""), err = result.value("stderr", "");
  const std::size_t lo = text::utf8_length(out), le = text::utf8_length(err);
  // bound_output's marker names a file of /workspace/.ns_hpc_output, about 60 characters; the
  // real cut keeps what a shorter name leaves room for, at most 13 bytes a character once escaped
  // twice: the slack below covers a name up to 96 characters shorter.
  const auto marker = [](std::size_t cut) {
    return fmt::format("[ns-hpc: {} characters cut here; the whole output is in {:96}]", cut, "");
  };
  constexpr std::size_t kSlack = 2 * 96 * 13;
  cap = cap > 2 * kSlack ? cap - kSlack : cap / 2;
  json trial = result;
  std::size_t budget = std::min(start, lo + le);
  for (;;) {
    const auto [go, ge] = split_budget(lo, le, budget);
    trial["stdout"] = text::cut_middle(out, go, marker).text;
    trial["stderr"] = text::cut_middle(err, ge, marker).text;
    const std::size_t size = result_bytes(trial);
    if (size <= cap || budget <= 256) return budget;
    // Shrink in proportion, and by a tenth at least.
    budget = std::min(budget * 9 / 10, static_cast<std::size_t>(static_cast<double>(budget) * cap / size));
  }
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
