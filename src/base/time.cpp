#include "base/time.hpp"

#include <cctype>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>

namespace nshpc::timeutil {

namespace {
struct Parts {
  std::tm tm{};
  long micros = 0;
};
Parts split(Clock::time_point t) {
  Parts p;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  p.micros = static_cast<long>(us % 1000000);
  if (p.micros < 0) {
    p.micros += 1000000;
    --secs;
  }
  gmtime_r(&secs, &p.tm);
  return p;
}
}  // namespace

std::string iso_utc(Clock::time_point t) {
  Parts p = split(t);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00", p.tm.tm_year + 1900,
                     p.tm.tm_mon + 1, p.tm.tm_mday, p.tm.tm_hour, p.tm.tm_min, p.tm.tm_sec, p.micros);
}

std::string compact_utc(Clock::time_point t) {
  Parts p = split(t);
  return fmt::format("{:04}{:02}{:02}T{:02}{:02}{:02}.{:06}", p.tm.tm_year + 1900, p.tm.tm_mon + 1,
                     p.tm.tm_mday, p.tm.tm_hour, p.tm.tm_min, p.tm.tm_sec, p.micros);
}

std::optional<Clock::time_point> parse_iso(std::string_view text) {
  std::tm tm{};
  int year, mon, day, hour, min, sec;
  int consumed = 0;
  std::string s(text);
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &mon, &day, &hour, &min, &sec,
                  &consumed) != 6)
    return std::nullopt;
  if (mon < 1 || mon > 12 || day < 1 || day > 31 || hour > 23 || min > 59 || sec > 60)
    return std::nullopt;
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  std::time_t base = timegm(&tm);
  std::string_view rest = text.substr(static_cast<size_t>(consumed));
  long micros = 0;
  if (!rest.empty() && rest[0] == '.') {
    rest.remove_prefix(1);
    int digits = 0;
    while (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest[0]))) {
      if (digits < 6) micros = micros * 10 + (rest[0] - '0');
      ++digits;
      rest.remove_prefix(1);
    }
    for (; digits < 6; ++digits) micros *= 10;
  }
  long offset = 0;
  if (!rest.empty() && (rest[0] == '+' || rest[0] == '-')) {
    int oh = 0, om = 0;
    if (std::sscanf(std::string(rest.substr(1)).c_str(), "%2d:%2d", &oh, &om) < 1) return std::nullopt;
    offset = (oh * 3600 + om * 60) * (rest[0] == '+' ? 1 : -1);
  } else if (!rest.empty() && rest[0] != 'Z') {
    return std::nullopt;
  }
  auto tp = Clock::from_time_t(base - offset) + std::chrono::microseconds(micros);
  return tp;
}

}  // namespace nshpc::timeutil
