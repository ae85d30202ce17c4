// ns-hpc computer (and this binary invoked as mcp-virtual-computer): mcp-virtual-computer 0.2.3's
// command line, environment and start-up checks, serving one persistent computer named by
// COMPUTER_ID over stdio or HTTP (reference/virtual-computer.md §2.2, §5, §6).
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "cli/app.hpp"
#include "cli/computer_config.hpp"
#include "cli/serve.hpp"
#include "instances/computers.hpp"
#include "transport/stdio.hpp"

namespace nshpc::cli {

namespace {

constexpr std::string_view kUsage =
    "usage: mcp-virtual-computer [-h] [--transport {stdio,http}] [--host HOST] [--port PORT] [--timeout TIMEOUT]\n"
    "                            [--output-limit OUTPUT_LIMIT] [--session-timeout SESSION_TIMEOUT]\n"
    "                            [--auth-token AUTH_TOKEN] [--allow-unauthenticated-http] [--shell SHELL]\n"
    "                            [--network | --no-network] [--tool-instruction-override TEXT |\n"
    "                            --extended-tool-instruction TEXT] [--cpu CPU] [--memory MEMORY]\n"
    "                            [--whole-output]\n";

int fail(std::string_view message, int code) {
  std::fprintf(stderr, "%s: error: %.*s\n", std::string(kComputerProgram).c_str(), static_cast<int>(message.size()),
               message.data());
  return code;
}

ServerParts computer_parts(const ComputerConfig& c, const std::string& id, bool expose) {
  ServerParts parts;
  parts.info = tools::server_info();
  parts.info.name = std::string(kComputerProgram);
  parts.info.title = "mcp-virtual-computer (ns-hpc)";
  parts.info.instructions = fmt::format(
      "You have one persistent Debian Linux computer, '{}': terminal_execute runs commands in it (you are root; "
      "apt-get install persists), read_file/write_file/edit_file work on its files (/workspace is the working "
      "folder), submit_job runs long work in the background, expose_port opens a server in it to the user.{}",
      id, expose ? " computer_restart and computer_factory_reset repair it; computer_create makes more." : "");
  tools::ComputerSettings settings;
  settings.computer_id = id;
  settings.timeout = c.timeout;
  settings.output_limit = c.output_limit;
  settings.shell = c.shell;
  settings.tool_instruction_override = c.tool_instruction_override;
  settings.extended_tool_instruction = c.extended_tool_instruction;
  settings.network_access = c.network_access;
  settings.desktop_environment = c.desktop_environment;
  settings.expose_lifecycle_tools = expose;
  settings.whole_output = c.whole_output;
  settings.lease = std::chrono::seconds(c.session_timeout);  // a sessionless (2026-07-28) temporary computer's hold
  parts.options = [id](const tools::Services& services) {
    return tools::computer_server_options(services.config, services, id);
  };
  parts.register_tools = [settings](mcp::Server& server, const tools::Services& services) {
    tools::register_computer(server, services, settings);
  };
  parts.watch_living = false;
  return parts;
}

// GET / (behind the token): what the seed's answers, with the computer as it is now.
transport::HttpResponse root_page(Invocation& inv, const ComputerConfig& c, const std::string& id, bool expose,
                                  const transport::HttpRequest& request) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  transport::HttpResponse res;
  res.headers["Content-Type"] = "application/json";
  res.headers["Cache-Control"] = "no-store";
  if (path != "/") {
    res.status = 404;
    res.body = nlohmann::json{{"error", fmt::format("not found: {} (the MCP endpoint is /mcp)", path)}}.dump();
    return res;
  }
  if (request.method != "GET" && request.method != "HEAD") {
    res.status = 405;
    res.headers["Allow"] = "GET, HEAD";
    res.body = nlohmann::json{{"error", "method not allowed here; allowed: GET, HEAD"}}.dump();
    return res;
  }
  bool network = c.network_access;
  bool desktop = c.desktop_environment;
  try {
    if (inv.store().exists(id)) {
      const store::Instance inst = inv.store().get(id);
      network = inst.network != config::Network::off;
      desktop = inst.meta.desktop();
    }
  } catch (const std::exception& e) {
    log::warn("computer '{}': {}", id, e.what());
  }
  res.body = nlohmann::json{{"name", std::string(kComputerProgram)},
                            {"mcp_endpoint", "/mcp"},
                            {"health", "/healthz"},
                            {"computer_id", id},
                            {"desktop_environment", desktop},
                            {"network_access", network},
                            {"app_resource", nullptr},
                            {"lifecycle_tools_exposed", expose},
                            {"lifecycle_tools_model_visible", expose}}
                 .dump();
  if (request.method == "HEAD") res.body.clear();
  return res;
}

int serve_computer(Invocation& inv, const ComputerConfig& c, const std::string& id) {
  const config::Config& cfg = inv.config();
  const bool expose = cfg.computer.expose_lifecycle_tools;
  const ServerParts parts = computer_parts(c, id, expose);
  if (c.transport == "stdio") {
    transport::StdioOptions options;
    options.max_message_bytes = static_cast<std::size_t>(cfg.mcp.max_message_bytes);
    log::info("serving the computer '{}' on stdio", id);
    return serve(inv, parts, [&](mcp::Server& server) { return transport::serve_stdio(server, options); });
  }
  raise_open_file_limit();
  transport::HttpOptions options = http_options(cfg);
  options.host = c.host;
  options.port = static_cast<std::uint16_t>(c.port);
  options.uds.clear();
  options.path = "/mcp";
  options.session_idle_timeout = std::chrono::seconds(c.session_timeout);
  options.token = c.auth_token.value_or(std::string());
  const bool loopback = transport::is_loopback_host(options.host);
  // A non-loopback listener (behind its token) is reached by any name the machine has.
  if (!loopback) options.allowed_hosts.push_back("*");
  const std::string login_path = add_dashboard(inv, options, "ns-hpc computer");
  // GET / answers what the seed's does; a browser (Accept: text/html) gets the dashboard there.
  std::function<transport::HttpResponse(const transport::HttpRequest&)> dashboard_page;
  std::erase_if(options.routes, [&](const transport::HttpRoute& route) {
    if (!route.exact || route.prefix != "/") return false;
    dashboard_page = route.handler;
    return true;
  });
  options.routes.push_back({.prefix = "/",
                            .exact = true,
                            .browser = static_cast<bool>(dashboard_page),
                            .handler = [&inv, c, id, expose, dashboard_page](const transport::HttpRequest& request) {
                              const auto accept = request.headers.find("accept");
                              if (dashboard_page && accept != request.headers.end() &&
                                  accept->second.find("text/html") != std::string::npos)
                                return dashboard_page(request);
                              return root_page(inv, c, id, expose, request);
                            }});
  options.on_listening = [&options, id, login_path](const std::string& url) {
    std::string text = dashboard_line(options, url.substr(0, url.size() - options.path.size()), login_path);
    text += fmt::format("{}: computer '{}': MCP (streamable HTTP) listening on {}\n", kComputerProgram, id, url);
    if (options.token.empty())
      text += fmt::format(
          "{}: warning: no token (--auth-token or KILNTAINERS_AUTH_TOKEN): every local user and process that can "
          "reach {} can run commands in the computer\n",
          kComputerProgram, url);
    nlohmann::json entry = {{"type", "http"}, {"url", url}};
    if (!options.token.empty()) entry["headers"] = {{"Authorization", "Bearer <your token>"}};
    text += fmt::format("{}: MCP client configuration:\n{}\n", kComputerProgram,
                        nlohmann::json{{"mcpServers", {{"virtual-computer", entry}}}}.dump());
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  };
  ServerParts served = parts;
  served.dashboard_base = dashboard_base(options);
  return serve(inv, served, [&](mcp::Server& server) { return transport::serve_http(server, options); });
}

}  // namespace

int computer_main(Invocation& inv, const std::vector<std::string>& args) {
  ComputerStart start;
  try {
    start = parse_computer_args(args, [](const char* name) { return std::getenv(name); });
  } catch (const ComputerArgumentError& e) {
    std::fputs(std::string(kUsage).c_str(), stderr);
    return fail(e.what(), 2);
  } catch (const UsageError& e) {
    return fail(e.what(), 1);
  }
  if (start.help) {
    std::fputs(start.help->c_str(), stdout);
    return 0;
  }
  const ComputerConfig& c = start.config;
  if (auto problem = startup_problem(c)) return fail(*problem, 1);
  try {
    const std::string id = instances::validate_computer_id(c.computer_id);
    // Docker's --cpus and --memory: the computer's [namespace] limits (every process of it together).
    inv.adjust_config([&c](config::Config& cfg) {
      if (c.cpus) cfg.ns.limits["cpus"] = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(*c.cpus)));
      if (c.memory_mib) cfg.ns.limits["memory"] = std::max<std::int64_t>(16, *c.memory_mib);
    });
    return serve_computer(inv, c, id);
  } catch (const config::ConfigError& e) {
    for (const auto& problem : e.problems()) fail(problem, 1);
    return 1;
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  }
}

void add_computer_command(CLI::App& app, Invocation& inv) {
  auto* cmd = app.add_subcommand(
      "computer",
      "Serve one persistent computer over MCP as mcp-virtual-computer 0.2.3 does (its flags and environment: "
      "COMPUTER_ID=agent-workstation ns-hpc computer [--transport http]). 'ns-hpc computer --help' lists them; the "
      "binary invoked as mcp-virtual-computer is the same.");
  // Only listed here: main() hands `computer` and what follows it to computer_main.
  cmd->allow_extras();
  cmd->callback([&inv, cmd] { inv.exit_code = computer_main(inv, cmd->remaining()); });
}

}  // namespace nshpc::cli
