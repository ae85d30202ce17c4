// Shared pieces of the tool adapters.
#pragma once

#include <functional>
#include <string>

#include "mcp/server.hpp"
#include "tools/tools.hpp"

namespace nshpc::tools {

struct ToolContext {
  Services services;
};

// Who acts, for the audit log: "mcp:<client name/version>@<session>".
std::string actor(const mcp::RequestContext& rc);

// An instance as tools and resources show it (sandbox paths, not host paths).
mcp::json agent_instance_json(const ToolContext& ctx, const store::Instance& inst);
std::string instance_uri(const std::string& id);  // resource://ns-hpc/instances/<id>

// The instance a call names, or [mcp] default_instance; UsageError when there is neither.
std::string instance_arg(const ToolContext& ctx, const mcp::json& args);
// Schema text for instance_id, saying whether it may be left out.
mcp::json instance_id_schema(const ToolContext& ctx, const std::string& what);

void add_instance_tools(mcp::Server& server, const ToolContext& ctx);
void add_prompts(mcp::Server& server, const ToolContext& ctx);
void add_terminal_tool(mcp::Server& server, const ToolContext& ctx);  // terminal_execute
void add_job_tools(mcp::Server& server, const ToolContext& ctx);      // submit/poll/list/cancel_job
std::shared_ptr<mcp::ResourceProvider> make_resources(const ToolContext& ctx);

}  // namespace nshpc::tools
