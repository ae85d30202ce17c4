#include "tools/computer_contract.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::tools::computer {

namespace {

using json = nlohmann::json;

// A string argument; null, absent and "" are all absent. Anything else not a string is refused.
std::optional<std::string> optional_string(const json& arguments, const char* name) {
  const auto it = arguments.find(name);
  if (it == arguments.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw UsageError(fmt::format("{} must be a string.", name));
  std::string value = it->get<std::string>();
  if (value.empty()) return std::nullopt;
  return value;
}

}  // namespace

ExecRequest parse_exec_request(const json& arguments, std::int64_t default_timeout) {
  if (!arguments.is_object()) throw UsageError("The arguments must be an object.");
  ExecRequest r;
  r.command = optional_string(arguments, "command");
  if (const auto it = arguments.find("args"); it != arguments.end() && !it->is_null()) {
    if (!it->is_array()) throw UsageError("args must be a list of strings.");
    std::vector<std::string> args;
    for (const json& a : *it) {
      if (!a.is_string()) throw UsageError("args must be a list of strings.");
      args.push_back(a.get<std::string>());
    }
    if (!args.empty()) r.args = std::move(args);
  }
  r.stdin_text = optional_string(arguments, "stdin");
  r.working_directory = optional_string(arguments, "working_directory");
  r.timeout = default_timeout;
  if (const auto it = arguments.find("timeout"); it != arguments.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw UsageError("timeout must be a whole number of seconds.");
    r.timeout = it->get<std::int64_t>();
  }
  if (r.command && r.args)
    throw UsageError(
        "Cannot provide both 'command' and 'args'. Use 'command' for shell commands or 'args' for direct execution.");
  if (!r.command && !r.args) throw UsageError("Must provide either 'command' or 'args'.");
  if (r.working_directory && r.working_directory->front() != '/')
    throw UsageError(fmt::format("working_directory must be an absolute path, got: {}", *r.working_directory));
  if (r.timeout < 1) throw UsageError("timeout must be at least 1 second.");
  if (r.stdin_text && r.stdin_text->size() > kMaxStdinBytes)
    throw UsageError(fmt::format(
        "stdin content exceeds the 2 MiB limit ({} bytes). Split into smaller chunks or use a different approach.",
        r.stdin_text->size()));
  return r;
}

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

}  // namespace nshpc::tools::computer
