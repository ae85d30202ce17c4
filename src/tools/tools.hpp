// The MCP tool surface: thin adapters from tool calls, resources and prompts to the instances
// service (src/instances/). The only module that knows both MCP and instances.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "config/config.hpp"
#include "instances/instances.hpp"
#include "mcp/server.hpp"
#include "sandbox/images.hpp"

namespace nshpc::tools {

class ConfirmStates;  // tools/confirm.hpp
// The signer of one server's confirmation states (tools/confirm.cpp), its key loaded on first use
// and its used nonces kept for the server's life: every copy of the server's Services shares it.
struct ConfirmSigner {
  ConfirmSigner();
  ~ConfirmSigner();
  ConfirmSigner(const ConfirmSigner&) = delete;
  ConfirmSigner& operator=(const ConfirmSigner&) = delete;
  std::mutex mutex;
  std::unique_ptr<ConfirmStates> states;
};

struct Services {
  const config::Config& config;
  instances::Service& instances;  // everything a tool does to an instance goes through it
  // Where a missing default image is built in the background (create_instance); null: it is not.
  sandbox::BackgroundBuilds* image_builds = nullptr;
  bool job_tools = true;  // the job tools are registered
  // The dashboard's base URL ("http://127.0.0.1:8000") once the server serves it over HTTP, for
  // desktop_url and computer_ui; unset or nullopt: none a browser can reach (stdio, a Unix socket,
  // the dashboard off). Set by the CLI from the HTTP transport's status board.
  std::function<std::optional<std::string>()> dashboard_base;
  // Called as each tools/call ends, before it is audited: the server provisions nothing before
  // its first tool call (a client may start a server only to ask server/discover), so what it
  // prepares ahead (the default image's build) starts here, once; unset: nothing.
  std::function<void()> tool_called;
  std::shared_ptr<ConfirmSigner> confirmations = std::make_shared<ConfirmSigner>();
};

// Server metadata (name, version, instructions for the agent).
mcp::ServerInfo server_info();
// Options from the config, with every tool call audited ("mcp.tool_call": tool, arguments,
// outcome, duration; in the instance's log when the call names an existing instance, else in
// the store-level log).
mcp::ServerOptions server_options(const config::Config& config, Services services);

// Registers the instance tools, the context and instance resources, and the prompts.
void register_all(mcp::Server& server, Services services);

// The mcp-virtual-computer entry point (`ns-hpc computer`; tools/computer_tools.cpp).
struct ComputerSettings {
  std::string computer_id;       // COMPUTER_ID: the computer every call works in unless it names another
  std::int64_t timeout = 120;    // a command's default timeout (--timeout)
  std::int64_t output_limit = 2097152;  // stdout + stderr bytes of one command (--output-limit)
  std::string shell = "/bin/bash";
  std::optional<std::string> tool_instruction_override;
  std::optional<std::string> extended_tool_instruction;
  bool network_access = true;    // the network of computers made here (on: the safest on-mode)
  bool desktop_environment = false;  // DESKTOP_ENVIRONMENT: COMPUTER_ID's made on [desktop] image, its desktop on
  bool expose_lifecycle_tools = true;  // [computer] expose_lifecycle_tools
  bool whole_output = false;     // --whole-output: a command's whole output in its result, as the seed
  // How long a temporary computer made by a request without a session (MCP 2026-07-28) is kept
  // after the last call that named it (--session-timeout).
  std::chrono::seconds lease{300};
};
// The server's options for it: results shaped as the seed's (JSON text and structuredContent),
// every call audited in the computer's log.
mcp::ServerOptions computer_server_options(const config::Config& config, Services services,
                                           std::string default_computer);
// Registers its tools: terminal_execute, read_file, write_file, edit_file,
// expose_port, the job tools (when Services::job_tools), computer_ui (the dashboard as an MCP
// App, tools/app.hpp), and unless hidden the lifecycle tools.
// Temporary computers are released when their sessions close (the server's session-closed hook
// is taken), and those left by ended servers deleted now. One made by a request without a
// session is held by this process's lease (ComputerSettings::lease, renewed by every call that
// names it) and deleted when that runs out or the process ends.
void register_computer(mcp::Server& server, Services services, ComputerSettings settings);

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
