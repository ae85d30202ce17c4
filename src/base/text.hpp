#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nshpc::text {

// Quotes one argument for a POSIX shell only when it needs it (for showing commands to people).
std::string shell_quote(std::string_view arg);
std::string shell_join(const std::vector<std::string>& argv);

// Replaces every byte sequence that is not valid UTF-8 with U+FFFD (so it can be put in JSON).
std::string sanitize_utf8(std::string_view s);

// Cuts `s` to at most `max_bytes` on a UTF-8 boundary, appending "…" when cut.
std::string truncate_utf8(std::string_view s, size_t max_bytes);

}  // namespace nshpc::text
