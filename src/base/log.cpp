#include "base/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace nshpc::log {

namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warning: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// The "ns-hpc" logger. A program that never called init() (tests, fixtures) still logs to
// stderr at warning, never to spdlog's default stdout logger.
spdlog::logger& logger() {
  static const bool ready = [] {
    if (!spdlog::get("ns-hpc")) init(Level::warning);
    return true;
  }();
  (void)ready;
  return *spdlog::default_logger_raw();
}

}  // namespace

const std::vector<std::pair<std::string, Level>>& level_names() {
  static const std::vector<std::pair<std::string, Level>> names = {
      {"error", Level::error}, {"warning", Level::warning}, {"info", Level::info}, {"debug", Level::debug}};
  return names;
}

std::optional<Level> parse_level(std::string_view name) {
  for (const auto& [n, level] : level_names())
    if (n == name) return level;
  return std::nullopt;
}

void init(Level level) {
  // Always stderr (stdout may carry MCP), and thread-safe: the servers log from many threads.
  spdlog::drop("ns-hpc");
  auto logger = spdlog::stderr_logger_mt("ns-hpc");
  logger->set_pattern("ns-hpc: %l: %v");
  logger->set_level(to_spdlog(level));
  spdlog::set_default_logger(std::move(logger));
}

void set_level(Level level) { logger().set_level(to_spdlog(level)); }

bool enabled(Level level) { return logger().should_log(to_spdlog(level)); }

void write(Level level, std::string_view message) { logger().log(to_spdlog(level), "{}", message); }

}  // namespace nshpc::log
