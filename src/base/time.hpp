#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace nshpc::timeutil {

using Clock = std::chrono::system_clock;

// ISO-8601 UTC with microseconds and an explicit offset, as the Python original wrote:
// 2026-06-12T00:00:00.123456+00:00
std::string iso_utc(Clock::time_point t = Clock::now());

// Compact form for archive folder names: 20260612T000000.123456
std::string compact_utc(Clock::time_point t = Clock::now());

// Parses the ISO forms we and the original wrote (with or without fraction/offset, 'Z' ok).
std::optional<Clock::time_point> parse_iso(std::string_view text);

}  // namespace nshpc::timeutil
