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
}  // namespace

void init(Level level) {
  // Always stderr (stdout may carry MCP), and thread-safe: the servers log from many threads.
  spdlog::drop("ns-hpc");
  auto logger = spdlog::stderr_logger_mt("ns-hpc");
  logger->set_pattern("ns-hpc: %l: %v");
  logger->set_level(to_spdlog(level));
  spdlog::set_default_logger(std::move(logger));
}

void write(Level level, std::string_view message) {
  // A program that never called init() (tests, fixtures) still logs to stderr, never to
  // spdlog's default stdout logger.
  static const bool ready = [] {
    if (!spdlog::get("ns-hpc")) init(Level::warning);
    return true;
  }();
  (void)ready;
  spdlog::log(to_spdlog(level), "{}", message);
}

}  // namespace nshpc::log
