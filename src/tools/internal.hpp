// Shared pieces of the tool adapters.
#pragma once

#include <functional>
#include <string>

#include "mcp/server.hpp"
#include "tools/tools.hpp"

namespace nshpc::tools {

struct Context {
  Services services;
};

using Handler = std::function<mcp::ToolResult(const mcp::json& arguments, mcp::RequestContext& rc)>;

// Who acts, for the audit log: "mcp:<client name/version>@<session>".
std::string actor(const mcp::RequestContext& rc);

// Wraps a handler so every call lands in the audit log ("mcp.tool_call": tool, arguments,
// outcome, duration): in the instance's log when the call names an existing instance, else in
// the store-level log. Errors thrown by the handler become isError results (and are audited).
Handler audited(const Context& ctx, std::string tool, Handler handler);

// An instance as tools and resources show it (sandbox paths, not host paths).
mcp::json instance_json(const Context& ctx, const store::Instance& inst);
std::string instance_uri(const std::string& id);  // resource://ns-hpc/instances/<id>

void add_instance_tools(mcp::Server& server, const Context& ctx);
void add_prompts(mcp::Server& server, const Context& ctx);
std::shared_ptr<mcp::ResourceProvider> make_resources(const Context& ctx);

}  // namespace nshpc::tools
