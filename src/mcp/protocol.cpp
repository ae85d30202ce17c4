#include "mcp/protocol.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "base/text.hpp"
#include "mcp/validate.hpp"

namespace nshpc::mcp {

namespace {

constexpr std::array<std::string_view, 8> kLogLevelNames = {
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"};

struct TooDeep {};

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest is for people.
std::string without_prefix(std::string_view what) {
  if (!what.empty() && what.front() == '[')
    if (auto end = what.find("] "); end != std::string_view::npos) what.remove_prefix(end + 2);
  return text::sanitize_utf8(what);
}

}  // namespace

bool is_supported_version(std::string_view version) {
  return std::find(kProtocolVersions.begin(), kProtocolVersions.end(), version) !=
         kProtocolVersions.end();
}

json parse_message(std::string_view text, const ParseLimits& limits) {
  // nlohmann only checks UTF-8 inside strings; checking the whole text first also catches stray
  // bytes between tokens and gives one clear message for both.
  if (auto bad = text::find_invalid_utf8(text))
    throw ProtocolError(kParseError,
                        fmt::format("parse error: invalid UTF-8 at byte {} of the message", *bad));

  const int max_depth = static_cast<int>(std::min<std::size_t>(limits.max_depth, INT_MAX));
  // The callback sees each container start with the number of containers around it; throwing
  // stops the parser before it builds anything deeper.
  auto limit = [max_depth](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_depth)
      throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit);
  } catch (const TooDeep&) {
    throw ProtocolError(kParseError,
                        fmt::format("parse error: the message nests objects/arrays deeper than "
                                    "the limit of {} levels",
                                    limits.max_depth));
  } catch (const json::parse_error& e) {
    // Never about UTF-8: the whole text was checked above.
    throw ProtocolError(kParseError, without_prefix(e.what()));
  } catch (const json::exception& e) {  // e.g. out_of_range for a number too large
    throw ProtocolError(kParseError, "parse error: " + without_prefix(e.what()));
  }
}

json make_response(const json& id, json result) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json make_error(const json& id, int code, std::string_view message, const json& data) {
  json error = {{"code", code}, {"message", text::sanitize_utf8(message)}};
  if (!data.is_null()) error["data"] = data;
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"error", std::move(error)}};
}

json make_notification(std::string_view method, json params) {
  json message = {{"jsonrpc", "2.0"}, {"method", method}};
  // Parameterless notifications (list_changed, initialized) carry no params member.
  if (!params.is_null() && !(params.is_object() && params.empty()))
    message["params"] = std::move(params);
  return message;
}

bool is_valid_id(const json& id) { return id.is_string() || id.is_number_integer(); }

std::optional<LogLevel> parse_log_level(std::string_view name) {
  for (std::size_t i = 0; i < kLogLevelNames.size(); ++i)
    if (kLogLevelNames[i] == name) return static_cast<LogLevel>(i);
  return std::nullopt;
}

std::string_view to_string(LogLevel level) {
  const auto i = static_cast<std::size_t>(level);
  return i < kLogLevelNames.size() ? kLogLevelNames[i] : "info";
}

}  // namespace nshpc::mcp
