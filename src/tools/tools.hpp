// The MCP tool surface: thin adapters from tool calls, resources and prompts to the modules
// below (store, sandbox, audit). The only module that knows both MCP and instances.
#pragma once

#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "mcp/server.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::tools {

struct Services {
  const config::Config& config;
  store::Store& store;
  sandbox::Backend& backend;
  jobs::Engine* jobs = nullptr;  // the job tools are registered when set
};

// Server metadata (name, version, instructions for the agent).
mcp::ServerInfo server_info();
// Options from the config, with every tool call audited ("mcp.tool_call": tool, arguments,
// outcome, duration; in the instance's log when the call names an existing instance, else in
// the store-level log).
mcp::ServerOptions server_options(const config::Config& config, Services services);

// Registers the instance tools, the context and instance resources, and the prompts.
void register_all(mcp::Server& server, Services services);

}  // namespace nshpc::tools
