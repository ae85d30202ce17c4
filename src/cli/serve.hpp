// Serving MCP: what `ns-hpc run` and `ns-hpc computer` share (cli/cmd_run.cpp).
#pragma once

#include <functional>

#include "cli/app.hpp"
#include "dashboard/dashboard.hpp"
#include "mcp/server.hpp"
#include "tools/tools.hpp"
#include "transport/http.hpp"

namespace nshpc::cli {

// What a server offers: its metadata, its options and its tools, from the services.
struct ServerParts {
  mcp::ServerInfo info;
  std::function<mcp::ServerOptions(const tools::Services&)> options;
  std::function<void(mcp::Server&, const tools::Services&)> register_tools;
  bool watch_living = true;  // subscribed instance resources hear of living sandboxes starting and stopping
  // The dashboard's base URL once served over HTTP (tools::Services::dashboard_base); unset on stdio.
  std::function<std::optional<std::string>()> dashboard_base;
};

// dashboard_base for an HTTP server: its URL from the status board once it listens (without the
// MCP path); nullopt without the dashboard, before it listens, or on a Unix socket (no browser
// URL).
std::function<std::optional<std::string>()> dashboard_base(const transport::HttpOptions& options);

// Builds the services (jobs recovered, stray sandboxes ended, the default image built in the
// background when missing), the server of `parts`, and hands it to `transport`; returns its exit code.
int serve(Invocation& inv, const ServerParts& parts, const std::function<int(mcp::Server&)>& transport);

// The HTTP server's address, limits and timeouts from [server] and [mcp].
transport::HttpOptions http_options(const config::Config& cfg);

// The dashboard on `options` (when [dashboard] enabled): its routes, a one-time login code and the
// transport's status board. Returns the login link's path ("/login?code=…"), or "" when it is off.
std::string add_dashboard(Invocation& inv, transport::HttpOptions& options, std::string entry_point);

// The line that names the dashboard for people: "Dashboard: http://127.0.0.1:8000/login?code=…  (…)".
// `base` is the server's URL without a path ("http://127.0.0.1:8000").
std::string dashboard_line(const transport::HttpOptions& options, const std::string& base, const std::string& login_path);

// Up to the hard open-file limit: the connection caps, not the default 1024, decide how many
// HTTP clients fit.
void raise_open_file_limit();

}  // namespace nshpc::cli
