// ns-hpc run: the MCP server.
#include <sys/prctl.h>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "cli/app.hpp"
#include "tools/tools.hpp"
#include "transport/stdio.hpp"

namespace nshpc::cli {

void add_run_command(CLI::App& app, Context& ctx) {
  struct Args {
    std::string transport = "stdio";
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string uds;
    std::string path = "/mcp";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "run",
      "Start the MCP server (stdio by default: point an MCP client's command at 'ns-hpc run').\n"
      "stdout carries only MCP messages; logs go to stderr.");
  cmd->add_option("-t,--transport", a->transport, "stdio (default), streamable-http or sse");
  cmd->add_option("-H,--host", a->host, "HTTP listen address (default 127.0.0.1)");
  cmd->add_option("-p,--port", a->port, "HTTP port (default 8000)")->check(CLI::Range(0, 65535));
  cmd->add_option("-u,--uds", a->uds, "Unix socket path for HTTP (instead of host/port)");
  cmd->add_option("--path", a->path, "HTTP endpoint path (default /mcp)");
  cmd->callback([&ctx, a] {
    if (a->transport != "stdio" && a->transport != "streamable-http" && a->transport != "sse")
      throw CLI::ValidationError(
          "--transport", fmt::format("Unknown transport: '{}'. Must be one of: stdio, streamable-http, sse",
                                     a->transport));
    if (a->transport != "stdio")
      throw Error(fmt::format(
          "the {} transport is not available in this version of ns-hpc yet; use --transport stdio "
          "(MCP clients start 'ns-hpc run' as a command)",
          a->transport));
    const config::Config& cfg = ctx.config();
    // Sandbox processes orphaned by bwrap come to us, not to pid 1 (which in containers may
    // never reap them); the job engine and the sandbox backend reap them.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    jobs::Engine& engine = ctx.jobs();
    engine.recover();  // jobs left running by an earlier server are watched again
    const tools::Services services{cfg, ctx.store(), ctx.backend(), &engine};
    mcp::Server server(tools::server_info(), tools::server_options(cfg, services));
    tools::register_all(server, services);
    transport::StdioOptions options;
    options.max_message_bytes = static_cast<std::size_t>(cfg.mcp.max_message_bytes);
    log::info("serving MCP on stdio");
    ctx.exit_code = transport::serve_stdio(server, options);
  });
}

}  // namespace nshpc::cli
