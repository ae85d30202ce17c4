// Host-side audit log: JSON Lines, one event per line, never mounted in any sandbox.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace nshpc::audit {

// When a log is rotated: at `max_bytes` it becomes <log>.1 (<log>.1 becomes <log>.2, …, up to
// <log>.<keep>; the oldest goes). 0 = never rotated.
struct Rotation {
  std::uint64_t max_bytes = 64ull * 1024 * 1024;
  int keep = 3;
};

// A Rotation as one command-line value, "MAX_BYTES,KEEP" (how the server hands its [audit]
// settings to the helpers that write an instance's log), and back; nullopt when malformed.
std::string rotation_argument(const Rotation& rotation);
std::optional<Rotation> parse_rotation_argument(std::string_view text);

// Every line is at most this long (a long argv or output is cut, never the line).
inline constexpr std::size_t kMaxLineBytes = 64 * 1024;

// Appends one event to `log_file`: {"event", "timestamp", "actor", ...fields}.
// The line is written with O_APPEND in a single write(2) under an flock of the log, so concurrent
// writers (several CLI processes and a server) never
// interleave, and across a rotation no line is lost or written twice. Throws SysError when the
// log cannot be written.
void append(const std::filesystem::path& log_file, std::string_view event, std::string_view actor,
            nlohmann::json fields, const Rotation& rotation = {});

// Appends one event through `log_fd`: a descriptor of the log opened (O_WRONLY | O_APPEND) by a
// helper that cannot open it by name any more, having given up its uid (a port forwarder). The
// same line under the same lock as append(), but never rotated by it: once the log has been
// rotated, the lines go to the rotated file the descriptor still names (<log>.1, ...).
// `log_file` names it in messages. Throws SysError when the line cannot be written.
void append_to(int log_fd, const std::filesystem::path& log_file, std::string_view event, std::string_view actor,
               nlohmann::json fields);

// Builds the line that append() writes (exposed for tests): at most kMaxLineBytes. A string
// longer than 8 KiB, and a field whose JSON does not fit, is replaced by its beginning and a
// marker "…[cut: N bytes, sha256 HEX]" (the hash of the whole value as JSON/text).
std::string format_line(std::string_view event, std::string_view actor, nlohmann::json fields);

}  // namespace nshpc::audit
