// JSON-RPC 2.0 and the MCP vocabulary shared by the server side: versions, error codes,
// message parsing with limits. Transport-independent; knows nothing about sandboxes.
#pragma once

#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/json.hpp"

namespace nshpc::mcp {

using json = nlohmann::json;

// Two eras of MCP are served side by side (on the same endpoints):
// - legacy (2024-11-05 … 2025-11-25): an `initialize` handshake opens a session that fixes the
//   version, the client's capabilities and the logging level;
// - modern (2026-07-28): no handshake; every request carries its version, client info and
//   capabilities in params._meta, and is served by itself.
enum class Era { legacy, modern };

// Legacy versions, newest first; initialize echoes the client's version when it is one of these,
// else the first.
inline constexpr std::array<std::string_view, 4> kProtocolVersions = {"2025-11-25", "2025-06-18",
                                                                      "2025-03-26", "2024-11-05"};
// Modern versions, newest first.
inline constexpr std::array<std::string_view, 1> kModernVersions = {"2026-07-28"};
bool is_supported_version(std::string_view version);  // a legacy version initialize accepts
bool is_modern_version(std::string_view version);
// Every version served, modern first (server/discover's supportedVersions, -32022's data).
json supported_versions();

// The reserved _meta keys of a 2026-07-28 request (and of results and notifications).
inline constexpr std::string_view kMetaProtocolVersion = "io.modelcontextprotocol/protocolVersion";
inline constexpr std::string_view kMetaClientInfo = "io.modelcontextprotocol/clientInfo";
inline constexpr std::string_view kMetaClientCapabilities = "io.modelcontextprotocol/clientCapabilities";
inline constexpr std::string_view kMetaLogLevel = "io.modelcontextprotocol/logLevel";
inline constexpr std::string_view kMetaServerInfo = "io.modelcontextprotocol/serverInfo";
inline constexpr std::string_view kMetaSubscriptionId = "io.modelcontextprotocol/subscriptionId";

enum ErrorCode : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
  kResourceNotFound = -32002,  // legacy era only; the modern era answers -32602
  // 2026-07-28: the HTTP headers disagree with the body, or a required one is missing/malformed.
  kHeaderMismatch = -32020,
  // 2026-07-28: the request needs a client capability its _meta did not declare
  // (data.requiredCapabilities).
  kMissingRequiredClientCapability = -32021,
  // 2026-07-28: the request's protocol version is not served (data {supported, requested}).
  kUnsupportedProtocolVersion = -32022,
};

// A protocol-level failure of a request; becomes a JSON-RPC error response.
class ProtocolError : public std::runtime_error {
 public:
  ProtocolError(int code, std::string message, json data = nullptr)
      : std::runtime_error(std::move(message)), code_(code), data_(std::move(data)) {}
  int code() const noexcept { return code_; }
  const json& data() const noexcept { return data_; }

 private:
  int code_;
  json data_;
};

struct ParseLimits {
  std::size_t max_depth = 64;  // nesting of objects/arrays
};

// Parses one message. Throws ProtocolError(kParseError) for malformed JSON or invalid UTF-8
// (the message says which), and for nesting deeper than the limit.
json parse_message(std::string_view text, const ParseLimits& limits = {});

// JSON-RPC envelopes.
json make_response(const json& id, json result);
json make_error(const json& id, int code, std::string_view message, const json& data = nullptr);
json make_notification(std::string_view method, json params = json::object());

// Valid JSON-RPC request ids are strings or integers (null is not allowed for requests).
bool is_valid_id(const json& id);

enum class LogLevel { debug, info, notice, warning, error, critical, alert, emergency };
std::optional<LogLevel> parse_log_level(std::string_view name);
std::string_view to_string(LogLevel level);

// What a request says about itself, read from its params._meta.
struct Envelope {
  // modern: params._meta carries io.modelcontextprotocol/protocolVersion.
  Era era = Era::legacy;
  std::string protocol_version;  // modern: the request's version (empty for legacy)
  std::string client_name;       // modern: "name/version" from clientInfo, "" when not sent
  json client_capabilities = json::object();  // modern: clientCapabilities
  std::optional<LogLevel> log_level;          // modern: logLevel (absent: no log messages)
  // W3C trace context (both eras), each kept only when well-formed (else empty): traceparent
  // "00-<32 hex>-<16 hex>-<2 hex>" (ids not all zero), tracestate printable ASCII of at most 512
  // bytes.
  std::string traceparent;
  std::string tracestate;
};

// Reads the envelope of a JSON-RPC request or notification object. A message whose
// params._meta carries io.modelcontextprotocol/protocolVersion is modern: a version not served
// throws ProtocolError(kUnsupportedProtocolVersion) with data {supported, requested}; a missing
// or malformed clientCapabilities, or a malformed version, clientInfo or logLevel, throws
// ProtocolError(kInvalidParams) naming the field. Anything else is legacy (its trace context is
// still read). Never throws for a legacy message.
Envelope read_envelope(const json& message);

// The request methods of an era (tools/call, …; initialize and ping are legacy only,
// server/discover and subscriptions/listen modern only).
bool is_method(std::string_view method, Era era);

}  // namespace nshpc::mcp
