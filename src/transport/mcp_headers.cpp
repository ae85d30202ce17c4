#include "transport/mcp_headers.hpp"

#include <array>
#include <cstdint>

#include <fmt/format.h>

namespace nshpc::transport {

namespace {

constexpr std::string_view kSentinelStart = "=?base64?";
constexpr std::string_view kSentinelEnd = "?=";
// Values are quoted in messages up to this many bytes (a header may be kilobytes long).
constexpr std::size_t kQuotedBytes = 64;

// RFC 9110 field-value characters (obs-text excluded, as the MCP spec says: visible ASCII,
// space, horizontal tab).
bool header_safe(std::string_view value) {
  for (unsigned char c : value)
    if (!(c == '\t' || (c >= 0x20 && c <= 0x7e))) return false;
  return true;
}

// Standard base64 (RFC 4648 §4) with optional padding; nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view in) {
  static constexpr auto kTable = [] {
    std::array<std::int8_t, 256> table{};
    table.fill(-1);
    constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (std::size_t i = 0; i < alphabet.size(); ++i) table[static_cast<unsigned char>(alphabet[i])] = static_cast<std::int8_t>(i);
    return table;
  }();
  std::size_t end = in.size();
  std::size_t padding = 0;
  while (end > 0 && in[end - 1] == '=' && padding < 2) {
    --end;
    ++padding;
  }
  if (padding > 0 && (end + padding) % 4 != 0) return std::nullopt;
  if (end % 4 == 1) return std::nullopt;  // 6 bits cannot end a byte
  std::string out;
  out.reserve(end * 3 / 4);
  std::uint32_t bits = 0;
  int count = 0;
  for (std::size_t i = 0; i < end; ++i) {
    const std::int8_t v = kTable[static_cast<unsigned char>(in[i])];
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xff));
    }
  }
  // Leftover bits must be zero (a canonical encoding), else two headers could mean one value.
  if (count > 0 && (bits & ((1u << count) - 1)) != 0) return std::nullopt;
  return out;
}

// A value as quoted in a message: at most kQuotedBytes, anything unprintable as '?'.
std::string shown_value(std::string_view value) {
  std::string out;
  for (unsigned char c : value.substr(0, kQuotedBytes)) out.push_back(c >= 0x20 && c <= 0x7e ? static_cast<char>(c) : '?');
  if (value.size() > kQuotedBytes) out += "...";
  return out;
}

mcp::ProtocolError mismatch(std::string message) { return mcp::ProtocolError(mcp::kHeaderMismatch, std::move(message)); }

// Where Mcp-Name's value lives in the body of `method` (nullptr: the method names nothing).
const char* name_field(std::string_view method) {
  if (method == "tools/call" || method == "prompts/get") return "name";
  if (method == "resources/read") return "uri";
  if (method == "tasks/get" || method == "tasks/update" || method == "tasks/cancel") return "taskId";
  return nullptr;
}

// One header against its body value. `sentinel`: the header may be base64-encoded.
std::optional<mcp::ProtocolError> compare(const HeaderLookup& header, std::string_view name, std::string_view lower_name,
                                          std::string_view body_value, std::string_view body_field, bool sentinel) {
  const std::optional<std::string> raw = header(lower_name);
  if (!raw)
    return mismatch(fmt::format("Header mismatch: the {} header is missing; a 2026-07-28 request must carry it, equal to "
                                "the body's {} ('{}')",
                                name, body_field, shown_value(body_value)));
  std::optional<std::string> value;
  if (sentinel) {
    value = decode_header_value(*raw);
  } else if (header_safe(*raw)) {
    value = *raw;
  }
  if (!value)
    return mismatch(fmt::format("Header mismatch: the {} header value '{}' is malformed ({}); send the body's {} ('{}'){}",
                                name, shown_value(*raw),
                                header_safe(*raw) ? "its =?base64?...?= payload is not valid base64"
                                                  : "it has characters a header value may not carry",
                                body_field, shown_value(body_value),
                                sentinel ? ", base64-encoded as =?base64?...?= when it is not plain ASCII" : ""));
  if (*value != body_value)
    return mismatch(fmt::format("Header mismatch: {} header value '{}' does not match body value '{}'", name, shown_value(*value),
                                shown_value(body_value)));
  return std::nullopt;
}

}  // namespace

std::optional<std::string> decode_header_value(std::string_view value) {
  if (!header_safe(value)) return std::nullopt;
  if (value.size() >= kSentinelStart.size() + kSentinelEnd.size() && value.starts_with(kSentinelStart) &&
      value.ends_with(kSentinelEnd))
    return base64_decode(value.substr(kSentinelStart.size(), value.size() - kSentinelStart.size() - kSentinelEnd.size()));
  return std::string(value);
}

std::optional<mcp::ProtocolError> check_request_headers(const HeaderLookup& header, const mcp::json& message,
                                                        const mcp::Envelope& envelope) {
  if (envelope.era != mcp::Era::modern || !message.is_object() || !message.contains("id")) return std::nullopt;
  if (auto problem = compare(header, "MCP-Protocol-Version", "mcp-protocol-version", envelope.protocol_version,
                             "_meta io.modelcontextprotocol/protocolVersion", false))
    return problem;
  const auto method_it = message.find("method");
  const std::string method = method_it != message.end() && method_it->is_string() ? method_it->get<std::string>() : "";
  if (auto problem = compare(header, "Mcp-Method", "mcp-method", method, "method", false)) return problem;
  const char* field = name_field(method);
  if (!field) return std::nullopt;
  std::string body_value;
  const auto params = message.find("params");
  if (params != message.end() && params->is_object()) {
    const auto it = params->find(field);
    if (it != params->end() && it->is_string()) body_value = it->get<std::string>();
  }
  return compare(header, "Mcp-Name", "mcp-name", body_value, fmt::format("params.{}", field), true);
}

}  // namespace nshpc::transport
