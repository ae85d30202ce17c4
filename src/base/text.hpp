#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::text {

// Quotes one argument for a POSIX shell only when it needs it (for showing commands to people).
std::string shell_quote(std::string_view arg);
std::string shell_join(const std::vector<std::string>& argv);

// The pieces of `s` between each `sep` (n separators give n + 1 pieces, empty ones included).
// The views point into `s`.
std::vector<std::string_view> split(std::string_view s, char sep);

// `s` without leading and trailing characters from `chars` (blanks, tabs and line ends by default).
std::string_view trim(std::string_view s, std::string_view chars = " \t\r\n");

// Byte offset of the first ill-formed UTF-8 sequence (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF), or nullopt when `s` is valid UTF-8.
std::optional<std::size_t> find_invalid_utf8(std::string_view s);

// Number of code points; each ill-formed byte counts as one.
std::size_t utf8_length(std::string_view s);

// `s` with every ill-formed byte replaced by U+FFFD (so it can be put in JSON).
std::string sanitize_utf8(std::string_view s);

// Byte length of the first `chars` code points of `s` (each ill-formed byte counts as one).
std::size_t utf8_prefix_bytes(std::string_view s, std::size_t chars);

// `s` cut in the middle to at most `max_chars` code points: its head (about 2/5) and its tail
// (the rest), with `marker(cut)` between them on a line of its own, where `cut` is how many code
// points were left out; the marker counts towards `max_chars` (it must be shorter). `s` itself
// when it is short enough. Head and tail end and start at a line break where one is near.
struct MiddleCut {
  std::string text;
  std::size_t cut_chars = 0;  // 0: nothing was cut
};
MiddleCut cut_middle(std::string_view s, std::size_t max_chars, const std::function<std::string(std::size_t cut)>& marker);

// Where `needle` (not empty) occurs in `hay`, left to right, without overlaps.
std::vector<std::size_t> find_all(std::string_view hay, std::string_view needle);
// `s` with the `old_size` bytes at each of `positions` (find_all's) replaced by `with`.
std::string replace_at(std::string_view s, const std::vector<std::size_t>& positions, std::size_t old_size,
                       std::string_view with);

// Cuts `s` to at most `max_bytes` on a UTF-8 boundary, appending "…" when cut.
std::string truncate_utf8(std::string_view s, size_t max_bytes);

// 64-bit FNV-1a of `s`: a short name that stays the same across runs and builds (not for security).
std::uint64_t fnv1a(std::string_view s);

// The candidate closest to `word` by edit distance (Levenshtein) when it is close enough to be a
// likely typo (at most a third of the word's length, and at most 3 edits); nullopt otherwise.
std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace nshpc::text
