// libFuzzer target: arbitrary bytes through the stdio framing into an MCP session (parser and
// dispatcher), with a synchronous executor. Every message the session sends must be a
// well-formed JSON-RPC object that serialises.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_server.hpp"
#include "mcp/server.hpp"
#include "transport/framing.hpp"

namespace mcp = nshpc::mcp;
using mcp::json;

namespace {

mcp::Server& fuzz_server() {
  static mcp::Server server = nshpc::fuzz::make_server("fuzz");
  static bool registered = [] {
    for (const char* name : {"a", "b", "c"}) {
      mcp::Tool tool;
      tool.name = name;
      tool.description = "echo";
      tool.accept_input_wrapper = true;
      tool.input_schema = {{"type", "object"},
                           {"properties",
                            {{"s", {{"type", "string"}, {"maxLength", 8}}},
                             {"n", {{"type", "integer"}, {"minimum", 0}}},
                             {"e", {{"enum", {"x", "y"}}}},
                             {"l", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
                           {"required", {"s"}},
                           {"additionalProperties", false}};
      tool.handler = nshpc::fuzz::echo;
      server.add_tool(std::move(tool));
    }
    mcp::Prompt prompt;
    prompt.name = "p";
    prompt.arguments = {{"x", "", true}};
    prompt.handler = [](const json& args) { return json{{"messages", json::array()}, {"description", args.dump()}}; };
    server.add_prompt(std::move(prompt));
    return true;
  }();
  (void)registered;
  return server;
}

void check(const json& message) {
  if (!message.is_object() || message.value("jsonrpc", "") != "2.0") std::abort();
  (void)message.dump();  // throws (and so aborts) on a string that is not UTF-8
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  mcp::Server& server = fuzz_server();
  mcp::Session session(server, "fuzz", check, [](std::function<void()> work) { work(); });
  nshpc::transport::LineFramer framer(4096);
  auto feed = [&](const nshpc::transport::Frame& frame) {
    if (frame.kind == nshpc::transport::Frame::Kind::message) session.receive(std::string_view(frame.text));
  };
  for (const auto& frame : framer.feed(std::string_view(reinterpret_cast<const char*>(data), size))) feed(frame);
  if (auto last = framer.finish()) feed(*last);
  session.close();
  return 0;
}
