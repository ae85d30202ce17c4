#include "base/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace nshpc::log {

void init(spdlog::level::level_enum level) {
  auto logger = spdlog::stderr_logger_st("ns-hpc");
  logger->set_pattern("ns-hpc: %l: %v");
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
  spdlog::set_level(level);
}

}  // namespace nshpc::log
