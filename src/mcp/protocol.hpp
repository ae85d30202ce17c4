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

// Newest first; initialize echoes the client's version when it is one of these, else the first.
inline constexpr std::array<std::string_view, 4> kProtocolVersions = {"2025-11-25", "2025-06-18",
                                                                      "2025-03-26", "2024-11-05"};
bool is_supported_version(std::string_view version);

enum ErrorCode : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
  kResourceNotFound = -32002,
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

}  // namespace nshpc::mcp
