// The MCP tool surface: thin adapters from tool calls, resources and prompts to the modules
// below (store, sandbox, audit). The only module that knows both MCP and instances.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "mcp/server.hpp"
#include "sandbox/images.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::tools {

struct Services {
  const config::Config& config;
  store::Store& store;
  sandbox::Backend& backend;
  jobs::Engine* jobs = nullptr;  // the job tools are registered when set
  // Where a missing default image is built in the background (create_instance); null: it is not.
  sandbox::BackgroundBuilds* image_builds = nullptr;
};

// Server metadata (name, version, instructions for the agent).
mcp::ServerInfo server_info();
// Options from the config, with every tool call audited ("mcp.tool_call": tool, arguments,
// outcome, duration; in the instance's log when the call names an existing instance, else in
// the store-level log).
mcp::ServerOptions server_options(const config::Config& config, Services services);

// Registers the instance tools, the context and instance resources, and the prompts.
void register_all(mcp::Server& server, Services services);

// While it exists, watches the living state of every persistent instance whose resource a
// session subscribes to, and sends notifications/resources/updated when it changes (started on
// first use, stopped for idleness or by another process). Checks every `interval`.
class LivingStateWatch {
 public:
  LivingStateWatch(mcp::Server& server, Services services,
                   std::chrono::milliseconds interval = std::chrono::seconds(2));
  ~LivingStateWatch();
  LivingStateWatch(const LivingStateWatch&) = delete;
  LivingStateWatch& operator=(const LivingStateWatch&) = delete;

 private:
  void run(std::stop_token stop);
  mcp::Server& server_;
  Services services_;
  std::chrono::milliseconds interval_;
  std::map<std::string, std::string> last_;  // uri -> "running since ..." / "stopped"
  std::jthread thread_;
};

}  // namespace nshpc::tools
