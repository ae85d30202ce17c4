#include "mcp/protocol.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <vector>

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

namespace nshpc::mcp {

bool is_modern_version(std::string_view version) {
  return std::find(kModernVersions.begin(), kModernVersions.end(), version) != kModernVersions.end();
}

json supported_versions() {
  json out = json::array();
  for (auto v : kModernVersions) out.push_back(v);
  for (auto v : kProtocolVersions) out.push_back(v);
  return out;
}

namespace {

bool all_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// W3C Trace Context: version 00 is "00-<trace-id 32 hex>-<parent-id 16 hex>-<flags 2 hex>", lowercase,
// neither id all zeros; a later version may append fields after the flags ("-…"), version ff is invalid.
bool valid_traceparent(std::string_view v) {
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
  const std::string_view version = v.substr(0, 2), trace = v.substr(3, 32), parent = v.substr(36, 16),
                         flags = v.substr(53, 2);
  if (!all_hex(version) || version == "ff" || !all_hex(trace) || !all_hex(parent) || !all_hex(flags)) return false;
  if (trace.find_first_not_of('0') == std::string_view::npos || parent.find_first_not_of('0') == std::string_view::npos)
    return false;
  if (version == "00") return v.size() == 55;
  return v.size() == 55 || v[55] == '-';
}

// tracestate: a list of key=value members; kept whole when it is printable ASCII of a sane size.
bool valid_tracestate(std::string_view v) {
  return !v.empty() && v.size() <= 512 &&
         std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

std::string field_name(std::string_view key) { return fmt::format("params._meta[\"{}\"]", key); }

}  // namespace

Envelope read_envelope(const json& message) {
  Envelope env;
  if (!message.is_object()) return env;
  auto params = message.find("params");
  if (params == message.end() || !params->is_object()) return env;
  auto meta_it = params->find("_meta");
  if (meta_it == params->end() || !meta_it->is_object()) return env;
  const json& meta = *meta_it;
  if (auto tp = meta.find("traceparent"); tp != meta.end() && tp->is_string() && valid_traceparent(tp->get_ref<const std::string&>())) {
    env.traceparent = tp->get<std::string>();
    if (auto ts = meta.find("tracestate"); ts != meta.end() && ts->is_string() && valid_tracestate(ts->get_ref<const std::string&>()))
      env.tracestate = ts->get<std::string>();
  }
  auto version = meta.find(kMetaProtocolVersion);
  if (version == meta.end()) return env;  // legacy

  env.era = Era::modern;
  if (!version->is_string())
    throw ProtocolError(kInvalidParams, fmt::format("{}: expected a version string like \"{}\", got {}",
                                                    field_name(kMetaProtocolVersion), kModernVersions.front(),
                                                    detail::describe_type(*version)));
  const std::string& requested = version->get_ref<const std::string&>();
  if (!is_modern_version(requested)) {
    // A legacy version in a modern envelope is not served either: that era opens with initialize.
    std::string supported;
    for (const auto& v : supported_versions()) supported += (supported.empty() ? "" : ", ") + v.get<std::string>();
    throw ProtocolError(
        kUnsupportedProtocolVersion,
        is_supported_version(requested)
            ? fmt::format("Unsupported protocol version: '{}' is served only through an initialize handshake; "
                          "per-request _meta takes one of: {}",
                          text::truncate_utf8(requested, 40),
                          fmt::join(std::vector<std::string_view>(kModernVersions.begin(), kModernVersions.end()), ", "))
            : fmt::format("Unsupported protocol version: '{}'; this server supports {}", text::truncate_utf8(requested, 40),
                          supported),
        json{{"supported", supported_versions()}, {"requested", requested}});
  }
  env.protocol_version = requested;

  auto caps = meta.find(kMetaClientCapabilities);
  if (caps == meta.end())
    throw ProtocolError(kInvalidParams, fmt::format("{}: missing; a {} request declares the client's capabilities in "
                                                    "every request ({{}} when it has none)",
                                                    field_name(kMetaClientCapabilities), requested));
  if (!caps->is_object())
    throw ProtocolError(kInvalidParams, fmt::format("{}: expected an object, got {}", field_name(kMetaClientCapabilities),
                                                    detail::describe_type(*caps)));
  env.client_capabilities = *caps;

  if (auto info = meta.find(kMetaClientInfo); info != meta.end() && !info->is_null()) {
    if (!info->is_object() || !info->contains("name") || !(*info)["name"].is_string())
      throw ProtocolError(kInvalidParams, fmt::format("{}: expected an object {{\"name\": …, \"version\": …}}, got {}",
                                                      field_name(kMetaClientInfo), detail::describe_type(*info)));
    env.client_name = text::truncate_utf8((*info)["name"].get<std::string>(), 100);
    if (auto v = info->find("version"); v != info->end() && v->is_string() && !v->get_ref<const std::string&>().empty())
      env.client_name += "/" + text::truncate_utf8(v->get<std::string>(), 50);
  }
  if (auto level = meta.find(kMetaLogLevel); level != meta.end() && !level->is_null()) {
    std::optional<LogLevel> parsed;
    if (level->is_string()) parsed = parse_log_level(level->get<std::string>());
    if (!parsed) {
      std::string names;
      for (auto n : kLogLevelNames) names += (names.empty() ? "" : ", ") + std::string(n);
      throw ProtocolError(kInvalidParams, fmt::format("{}: got {}; expected one of {}", field_name(kMetaLogLevel),
                                                      text::truncate_utf8(level->dump(), 40), names));
    }
    env.log_level = parsed;
  }
  return env;
}

bool is_method(std::string_view method, Era era) {
  static constexpr std::array<std::string_view, 10> kShared = {
      "tools/list",     "tools/call",     "prompts/list",             "prompts/get",
      "resources/list", "resources/read", "resources/templates/list", "completion/complete",
      "tasks/get",      "tasks/cancel"};  // both task wires
  static constexpr std::array<std::string_view, 7> kLegacy = {
      "initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe",
      "tasks/result", "tasks/list"};  // 2025-11-25's experimental tasks
  static constexpr std::array<std::string_view, 3> kModern = {"server/discover", "subscriptions/listen",
                                                              "tasks/update"};  // the Tasks extension
  auto in = [&](const auto& list) { return std::find(list.begin(), list.end(), method) != list.end(); };
  if (in(kShared)) return true;
  return era == Era::legacy ? in(kLegacy) : in(kModern);
}

}  // namespace nshpc::mcp
