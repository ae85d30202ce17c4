// Host-side audit log: JSON Lines, one event per line, never mounted in any sandbox.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace nshpc::audit {

// Appends one event to `log_file`: {"event", "timestamp", "actor", ...fields}.
// The line is written with O_APPEND in a single write(2), so concurrent writers (several CLI
// processes and a server) never interleave. Oversized string fields are cut so a line stays
// below 64 KiB. Throws SysError when the log cannot be written.
void append(const std::filesystem::path& log_file, std::string_view event, std::string_view actor,
            nlohmann::json fields = nlohmann::json::object());

// Builds the line that append() writes (exposed for tests).
std::string format_line(std::string_view event, std::string_view actor, nlohmann::json fields);

}  // namespace nshpc::audit
