// libFuzzer target: arbitrary bytes as one client connection of the HTTP transports
// (transport::testing::exchange: Beast's parser, the Host/Origin/token checks, the limits, the MCP
// and legacy endpoints, sessions and SSE streams) with ASan and UBSan. The server has a token, a
// small body limit and one echo tool; whatever it writes back must be HTTP responses.
// An input that starts with byte 0x01 is a 2026-07-28 POST built from the rest (see
// modern_post), so that mutations reach the era's checks (the envelope, the mirrored headers
// and their base64 sentinel, subscriptions/listen) instead of dying in the HTTP parser.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_server.hpp"
#include "mcp/server.hpp"
#include "transport/http.hpp"

namespace mcp = nshpc::mcp;
namespace transport = nshpc::transport;
using mcp::json;

namespace {

mcp::Server& fuzz_server() {
  static mcp::Server server = nshpc::fuzz::make_server("fuzz-http");
  static bool registered = [] {
    mcp::Tool tool;
    tool.name = "echo";
    tool.description = "echo";
    tool.input_schema = {{"type", "object"},
                         {"properties", {{"s", {{"type", "string"}, {"maxLength", 64}}}}},
                         {"additionalProperties", false}};
    tool.handler = nshpc::fuzz::echo;
    server.add_tool(std::move(tool));
    return true;
  }();
  (void)registered;
  return server;
}

const transport::HttpOptions& fuzz_options() {
  static const transport::HttpOptions options = [] {
    transport::HttpOptions o;
    o.token = "fuzz-token-0123456789";
    o.max_body_bytes = 64 * 1024;
    o.max_header_bytes = 8 * 1024;
    o.read_timeout = std::chrono::milliseconds(40);
    o.shutdown_grace = std::chrono::milliseconds(10);
    o.sse_keepalive = std::chrono::milliseconds(20);
    o.sse_buffer_bytes = 16 * 1024;
    o.max_sessions = 4;
    o.worker_threads = 4;
    // The dashboard's side: the login (code, form, cookie, CSRF) and a browser route and event
    // stream that answer at once.
    o.login.enabled = true;
    o.login.code = "0123456789abcdef0123456789abcdef";
    o.routes.push_back({.prefix = "/", .exact = true, .browser = true,
                        .handler = [](const transport::HttpRequest& r) { return transport::HttpResponse{200, {}, r.target}; }});
    o.event_routes.push_back({.prefix = "/api/events", .browser = true, .buffer_bytes = 4096,
                              .open = [](const transport::HttpRequest&, std::shared_ptr<transport::EventSink> sink) {
                                sink->send("hello", "a\nb", "1");
                                return transport::HttpResponse{};
                              }});
    return o;
  }();
  return options;
}

// Fields of the input after the 0x01, split at '\n' (missing ones empty): method, params.name
// (or params.uri for resources/read), the Mcp-Name header, the MCP-Protocol-Version header, the
// body's protocolVersion, the arguments or listen filter as JSON, and extra header lines. The
// headers are sent as given (a CR or LF in them is part of the test), the body as valid JSON.
std::string modern_post(std::string_view rest) {
  std::vector<std::string> f;
  std::size_t start = 0;
  while (f.size() < 6) {
    const auto end = rest.find('\n', start);
    f.emplace_back(rest.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  const std::string extra = f.size() == 6 && start <= rest.size() ? std::string(rest.substr(start)) : std::string();
  f.resize(6);
  json meta = {{"io.modelcontextprotocol/protocolVersion", f[4].empty() ? "2026-07-28" : f[4]},
               {"io.modelcontextprotocol/clientInfo", {{"name", "fuzz"}, {"version", "1"}}},
               {"io.modelcontextprotocol/clientCapabilities", json::object()}};
  json params = {{"_meta", meta}};
  const std::string method = f[0].empty() ? "tools/call" : f[0];
  params[method == "resources/read" ? "uri" : "name"] = f[1];
  json inner = json::parse(f[5], nullptr, false);
  if (!inner.is_discarded()) params[method == "subscriptions/listen" ? "notifications" : "arguments"] = std::move(inner);
  const std::string body = json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", method}, {"params", std::move(params)}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
  std::string out = "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer fuzz-token-0123456789\r\n"
                    "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n";
  out += "MCP-Protocol-Version: " + (f[3].empty() ? std::string("2026-07-28") : f[3]) + "\r\n";
  out += "Mcp-Method: " + method + "\r\n";
  out += "Mcp-Name: " + f[2] + "\r\n";
  out += extra;
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (!bytes.empty() && bytes.front() == '\x01') bytes = modern_post(std::string_view(bytes).substr(1));
  const std::string out =
      transport::testing::exchange(fuzz_server(), fuzz_options(), bytes, std::chrono::milliseconds(50));
  // Whatever the server said must be HTTP.
  if (!out.empty() && out.rfind("HTTP/1.", 0) != 0) std::abort();
  return 0;
}
