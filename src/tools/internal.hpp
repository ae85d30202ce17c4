// Shared pieces of the tool adapters.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "mcp/server.hpp"
#include "tools/tools.hpp"

namespace nshpc::tools {

struct ToolContext {
  Services services;
};

// ---------------------------------------------------------------------------------------------
// Declaring a tool: one spec, one call. Every tool accepts the legacy {"input": {...}} wrapper.

// MCP's behaviour hints. readOnlyHint and openWorldHint are always published; destructiveHint
// and idempotentHint only when set (a read-only tool leaves them out).
struct Hints {
  bool read_only = false;
  std::optional<bool> destructive;
  std::optional<bool> idempotent;
  bool open_world = false;
};
mcp::json annotations(const Hints& hints);

using ToolHandler = std::function<mcp::ToolResult(const mcp::json& args, mcp::RequestContext& rc)>;

struct ToolSpec {
  std::string name;
  std::string title;
  std::string description;
  mcp::json input;   // input_object(...) or instance_input(...)
  mcp::json output;  // output_object(...)
  Hints hints;
  ToolHandler handler;
};
void add_tool(mcp::Server& server, ToolSpec spec);
// What an agent does about something not found, naming tools: "restore_instance brings it back
// (archive_name 'x__...')", "did you mean 'x'? list_instances lists the active ones".
std::string not_found_advice(const NotFound& e);

// ---------------------------------------------------------------------------------------------
// Schema fragments.

mcp::json of_type(const char* type);  // {"type": type}
// The arguments object: these properties, no others; "required" left out when empty.
mcp::json input_object(mcp::json properties, std::vector<std::string> required = {});
// The arguments of a tool working in one instance: instance_id (described as `what`, with the
// [mcp] default_instance when there is one and then not required) and `properties`.
mcp::json instance_input(const config::Config& cfg, const std::string& what, mcp::json properties,
                         std::vector<std::string> required = {});
// A result object (structuredContent or an item of it): these properties, these required.
mcp::json output_object(mcp::json properties, std::vector<std::string> required);

// ---------------------------------------------------------------------------------------------
// Arguments. The input schema has been checked before a handler runs, so these only read.

// A string argument; "" when absent (or not a string).
std::string string_arg(const mcp::json& args, const char* name);

// Who acts, for the audit log: "mcp:<client name/version>@<session>".
std::string actor(const mcp::RequestContext& rc);

// An instance as tools and resources show it (sandbox paths, not host paths).
mcp::json agent_instance_json(const ToolContext& ctx, const store::Instance& inst);
std::string instance_uri(const std::string& id);  // resource://ns-hpc/instances/<id>

// A persistent instance's living state (lifecycle::state_json), added to `out`; "unknown" with
// state_error when the backend cannot tell (one instance never fails a listing). Returns the
// status when there is one; nullopt for an instance that is not persistent (nothing is asked).
std::optional<sandbox::LivingStatus> add_living_state(const ToolContext& ctx, const store::Instance& inst,
                                                      mcp::json& out);
// "running since 2026-06-12 10:31:02Z, 3 processes, 12.5 MiB" / "stopped (last: idle for 900 s)"
std::string living_summary(const mcp::json& state);

// The instance a call names, or [mcp] default_instance; UsageError when there is neither.
std::string instance_arg(const ToolContext& ctx, const mcp::json& args);

void add_instance_tools(mcp::Server& server, const ToolContext& ctx);
void add_prompts(mcp::Server& server, const ToolContext& ctx);
void add_terminal_tool(mcp::Server& server, const ToolContext& ctx);  // terminal_execute
void add_job_tools(mcp::Server& server, const ToolContext& ctx);      // submit/poll/list/cancel_job
std::shared_ptr<mcp::ResourceProvider> make_resources(const ToolContext& ctx);

}  // namespace nshpc::tools
