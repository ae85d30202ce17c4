// What the fuzz targets' servers share: paged lists (page size 2) and echo tools that exercise
// progress and logging before they answer.
#pragma once

#include "mcp/server.hpp"

namespace nshpc::fuzz {

// An MCP server named `name` whose lists come in pages of two.
inline mcp::Server make_server(const char* name) {
  mcp::ServerOptions options;
  options.page_size = 2;
  return mcp::Server(mcp::ServerInfo{name, "", "0", ""}, options);
}

// The echo tools' handler: a progress report and a log message, then the arguments back as text
// and as structured content.
inline mcp::ToolResult echo(const mcp::json& args, mcp::RequestContext& rc) {
  rc.progress(1, 2);
  rc.log(mcp::LogLevel::info, args);
  return mcp::ToolResult::text(args.dump(), std::optional<mcp::json>(std::in_place, args));
}

}  // namespace nshpc::fuzz
