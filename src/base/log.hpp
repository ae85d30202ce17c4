// Logging to stderr only (stdout belongs to command output and to MCP messages on stdio).
// A thin facade over spdlog, so only log.cpp compiles spdlog itself.
//
// The level is warning until the CLI sets the one a person asked for (--log-level, -v/-vv,
// NS_HPC_LOG). debug: the decisions worth seeing when something goes wrong (the sandbox argv,
// cgroups made, scheduler commands, config files read); info: what a server does on its own.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace nshpc::log {

enum class Level { debug, info, warning, error, off };

// The levels a person can choose, by name, most severe first: error, warning, info, debug.
const std::vector<std::pair<std::string, Level>>& level_names();
std::optional<Level> parse_level(std::string_view name);

// Sets up the process-wide stderr logger: "ns-hpc: warning: ..." lines.
void init(Level level = Level::warning);
void set_level(Level level);
// Whether a message of `level` would be written (callers skip building costly messages).
bool enabled(Level level);
void write(Level level, std::string_view message);

template <typename... Args>
void log_at(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(level)) write(level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  log_at(Level::debug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  log_at(Level::info, format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  log_at(Level::warning, format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  log_at(Level::error, format, std::forward<Args>(args)...);
}

}  // namespace nshpc::log
