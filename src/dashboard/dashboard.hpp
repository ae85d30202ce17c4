// The web dashboard: its assets, embedded in the binary at build time (assets.hpp), and its JSON
// API under /api/ (docs/api.md), the same operations as the MCP tools and the CLI through the
// instances service. Served by the HTTP transports of both entry points; routes only, no Beast.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "instances/instances.hpp"
#include "transport/http.hpp"

namespace nshpc::dashboard {

struct Settings {
  std::string version;          // the server's version, shown on the server view
  std::string entry_point;      // "ns-hpc run" or "ns-hpc computer"
  std::string token;            // never shown: redacted wherever it would appear (activity)
  // Runs `ns-hpc doctor --json` and returns its output (null: not offered).
  std::function<nlohmann::json()> doctor;
  // The transport's live figures (sessions, peers, caps in use) and the MCP URL.
  std::shared_ptr<transport::HttpStatusBoard> http;
};

// Adds the dashboard's routes to `options`: "/" and "/ui/…" (assets; browser routes), "/api/"
// (a browser StreamRoute) and "/api/events" (server-sent events), and turns its login on.
// `service` must outlive the server.
void add_routes(transport::HttpOptions& options, instances::Service& service, Settings settings);

}  // namespace nshpc::dashboard
