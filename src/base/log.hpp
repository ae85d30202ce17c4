// Logging to stderr only (stdout belongs to command output and, later, to MCP messages).
#pragma once

#include <spdlog/spdlog.h>

namespace nshpc::log {

// Sets up the process-wide stderr logger once: "ns-hpc: warning: ..." lines.
void init(spdlog::level::level_enum level = spdlog::level::warn);

}  // namespace nshpc::log
