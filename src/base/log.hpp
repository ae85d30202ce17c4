// Logging to stderr only (stdout belongs to command output and, later, to MCP messages).
// A thin facade over spdlog, so only log.cpp compiles spdlog itself.
#pragma once

#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace nshpc::log {

enum class Level { debug, info, warning, error, off };

// Sets up the process-wide stderr logger: "ns-hpc: warning: ..." lines.
void init(Level level = Level::warning);
void write(Level level, std::string_view message);

template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::warning, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  write(Level::error, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace nshpc::log
