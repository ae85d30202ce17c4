// The dashboard as an MCP App (the io.modelcontextprotocol/ui extension as
// @modelcontextprotocol/ext-apps 2.0.4 defines it): the resource ui://ns-hpc/dashboard, one
// self-contained HTML document (dashboard/app/dashboard-app.html, embedded at build time) that a
// host renders in a sandboxed frame and that reads the instances through the host's tools/call
// bridge; the _meta a tool carries to open it; and the dashboard's address for people.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "mcp/server.hpp"
#include "store/store.hpp"
#include "tools/tools.hpp"

namespace nshpc::tools::app {

inline constexpr std::string_view kUri = "ui://ns-hpc/dashboard";
inline constexpr std::string_view kMimeType = "text/html;profile=mcp-app";
inline constexpr std::string_view kExtension = "io.modelcontextprotocol/ui";

// The App's HTML as built in.
std::string_view html();

// `inner`'s resources with the App listed first and read by its URI.
std::shared_ptr<mcp::ResourceProvider> with_app(std::shared_ptr<mcp::ResourceProvider> inner);

// capabilities.extensions for initialize: the UI extension with the App's mime type.
mcp::json extensions();

// A tool's _meta that makes a host open the App with its result: {"ui": {"resourceUri": ...}}.
mcp::json tool_meta();

// The dashboard's base URL ("http://127.0.0.1:8000") while the server serves it over HTTP;
// nullopt on stdio, over a Unix socket, without the dashboard, or before it listens.
std::optional<std::string> dashboard_base(const Services& services);

// Where a person watches `inst`'s live desktop: <dashboard base>/#/instances/<id>/desktop while its
// desktop is on and the dashboard is served over HTTP; else nullopt (JSON null).
std::optional<std::string> desktop_url(const Services& services, const store::Instance& inst);
mcp::json desktop_url_json(const Services& services, const store::Instance& inst);

}  // namespace nshpc::tools::app
