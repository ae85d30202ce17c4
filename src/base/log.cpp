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
  auto logger = spdlog::stderr_logger_st("ns-hpc");
  logger->set_pattern("ns-hpc: %l: %v");
  logger->set_level(to_spdlog(level));
  spdlog::set_default_logger(std::move(logger));
}

void write(Level level, std::string_view message) { spdlog::log(to_spdlog(level), "{}", message); }

}  // namespace nshpc::log
