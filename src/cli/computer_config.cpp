#include "cli/computer_config.hpp"

#include <algorithm>
#include <array>
#include <random>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::cli {

namespace {

constexpr std::array<std::string_view, 12> kAdjectives = {"amber", "brisk", "calm",  "clever", "coral",  "crisp",
                                                          "gentle", "lucky", "quiet", "rapid",  "silver", "steady"};
constexpr std::array<std::string_view, 12> kNouns = {"badger", "comet", "falcon", "gecko", "heron", "lynx",
                                                     "otter",  "panda", "raven",  "tiger", "whale", "wolf"};

// Python's str.strip(): ASCII whitespace at both ends.
std::string_view strip(std::string_view s) {
  constexpr std::string_view space = " \t\n\r\v\f";
  const auto first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

bool slug_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

bool is_slug(std::string_view id) {
  return !id.empty() && id.size() <= 63 && std::all_of(id.begin(), id.end(), slug_char) && id.front() != '-' &&
         id.back() != '-';
}

constexpr std::string_view kIdRule =
    "computer_id must be 1-63 lowercase letters, numbers, or hyphens; it must start and end with a letter or number.";

}  // namespace

std::optional<bool> parse_flag(std::string_view text) {
  std::string value(strip(text));
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (value == "true" || value == "1" || value == "yes" || value == "on") return true;
  if (value == "false" || value == "0" || value == "no" || value == "off") return false;
  return std::nullopt;
}

bool env_flag(std::string_view name, const char* value, bool fallback) {
  if (value == nullptr) return fallback;
  if (const auto flag = parse_flag(value)) return *flag;
  throw UsageError(fmt::format("{} must be true or false (also 1/0, yes/no, on/off), not \"{}\".", name, value));
}

std::string validate_computer_id(std::string_view id) {
  const std::string_view value = strip(id);
  if (!is_slug(value)) throw UsageError(std::string(kIdRule));
  return std::string(value);
}

std::optional<std::string> startup_problem(const ComputerConfig& c) {
  if (c.transport == "stdio") {
    if (c.host != "127.0.0.1")
      return "--host is only valid with --transport http. In stdio mode, there is no HTTP server to bind.";
    if (c.port != 8435)
      return "--port is only valid with --transport http. In stdio mode, there is no HTTP server to bind.";
    if (c.session_timeout != 300)
      return "--session-timeout is only valid with --transport http. In stdio mode, the session lives as long as "
             "the process.";
  }
  if (c.tool_instruction_override && c.extended_tool_instruction)
    return "Cannot use both --tool-instruction-override and --extended-tool-instruction. Use override to replace the "
           "description entirely, or extended to append to the backend default.";
  if (c.timeout < 1) return "--timeout must be at least 1 second.";
  if (c.output_limit < 1) return "--output-limit must be at least 1 byte.";
  if (c.computer_id.empty()) return "COMPUTER_ID is required (example: COMPUTER_ID=agent-workstation).";
  if (!is_slug(strip(c.computer_id))) {
    std::string message(kIdRule);
    message.replace(0, std::string_view("computer_id").size(), "COMPUTER_ID");
    return message;
  }
  if (c.transport == "http" && c.host != "127.0.0.1" && c.host != "localhost" && c.host != "::1" &&
      (!c.auth_token || c.auth_token->empty()) && !c.allow_unauthenticated_http)
    return "A non-loopback HTTP listener can execute arbitrary sandbox commands. Set KILNTAINERS_AUTH_TOKEN/"
           "--auth-token, or explicitly pass --allow-unauthenticated-http behind a trusted private network.";
  return std::nullopt;
}

std::string random_computer_id() {
  std::random_device source;
  std::uniform_int_distribution<std::size_t> word(0, kAdjectives.size() - 1);
  std::uniform_int_distribution<unsigned> hex(0, 0xffff);
  return fmt::format("{}-{}-{:04x}", kAdjectives[word(source)], kNouns[word(source)], hex(source));
}

}  // namespace nshpc::cli
