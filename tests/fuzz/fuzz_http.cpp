// libFuzzer target: arbitrary bytes as one client connection of the HTTP transports
// (transport::testing::exchange: Beast's parser, the Host/Origin/token checks, the limits, the MCP
// and legacy endpoints, sessions and SSE streams) with ASan and UBSan. The server has a token, a
// small body limit and one echo tool; whatever it writes back must be HTTP responses.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string out =
      transport::testing::exchange(fuzz_server(), fuzz_options(), bytes, std::chrono::milliseconds(50));
  // Whatever the server said must be HTTP.
  if (!out.empty() && out.rfind("HTTP/1.", 0) != 0) std::abort();
  return 0;
}
