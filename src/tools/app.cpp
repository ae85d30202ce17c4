// The dashboard as an MCP App (app.hpp).
#include "tools/app.hpp"

#include <utility>

namespace nshpc::tools {
// Generated at build time from dashboard/app/dashboard-app.html (src/CMakeLists.txt).
extern const std::string_view kDashboardAppHtml;
}  // namespace nshpc::tools

namespace nshpc::tools::app {

namespace {

using mcp::json;

// Everything is inline: the App asks the host for no origin at all (connectDomains and
// resourceDomains empty: the ext-apps default, no network), and it reads the server only through
// the host's tools/call. A visible border: it is a panel of text, not a picture.
json resource_meta() {
  return {{"ui", {{"csp", {{"connectDomains", json::array()}, {"resourceDomains", json::array()}}},
                  {"prefersBorder", true}}}};
}

class WithApp final : public mcp::ResourceProvider {
 public:
  explicit WithApp(std::shared_ptr<mcp::ResourceProvider> inner) : inner_(std::move(inner)) {}

  std::vector<mcp::Resource> list() override {
    std::vector<mcp::Resource> out{entry()};
    for (auto& r : inner_->list()) out.push_back(std::move(r));
    return out;
  }

  std::vector<mcp::Resource> list_range(std::size_t start, std::size_t count, std::size_t& total) override {
    std::vector<mcp::Resource> out;
    if (start == 0) out.push_back(entry());
    const std::size_t inner_start = start == 0 ? 0 : start - 1;
    std::size_t inner_total = 0;
    if (count == 0 || count > out.size()) {
      for (auto& r : inner_->list_range(inner_start, count == 0 ? 0 : count - out.size(), inner_total))
        out.push_back(std::move(r));
    } else {
      inner_->list_range(inner_start, 1, inner_total);  // only its total
    }
    total = inner_total + 1;
    return out;
  }

  std::vector<mcp::ResourceTemplate> templates() override { return inner_->templates(); }

  std::optional<std::vector<mcp::ResourceContents>> read(const std::string& uri) override {
    if (uri != kUri) return inner_->read(uri);
    return std::vector<mcp::ResourceContents>{
        {std::string(kUri), std::string(kMimeType), std::string(html()), std::nullopt, resource_meta()}};
  }

 private:
  static mcp::Resource entry() {
    return {.uri = std::string(kUri),
            .name = "dashboard",
            .title = "ns-hpc dashboard",
            .description = "The instances and their recent activity, read-only (an MCP App for hosts that render them)",
            .mime_type = std::string(kMimeType),
            .size = static_cast<std::int64_t>(html().size()),
            .meta = resource_meta()};
  }

  std::shared_ptr<mcp::ResourceProvider> inner_;
};

}  // namespace

std::string_view html() { return kDashboardAppHtml; }

std::shared_ptr<mcp::ResourceProvider> with_app(std::shared_ptr<mcp::ResourceProvider> inner) {
  return std::make_shared<WithApp>(std::move(inner));
}

json extensions() { return {{std::string(kExtension), {{"mimeTypes", {std::string(kMimeType)}}}}}; }

json tool_meta() { return {{"ui", {{"resourceUri", std::string(kUri)}}}}; }

std::optional<std::string> dashboard_base(const Services& services) {
  if (!services.dashboard_base) return std::nullopt;
  return services.dashboard_base();
}

std::optional<std::string> desktop_url(const Services& services, const store::Instance& inst) {
  if (!inst.meta.desktop()) return std::nullopt;
  const auto base = dashboard_base(services);
  if (!base) return std::nullopt;
  return *base + "/#/instances/" + inst.id + "/desktop";
}

json desktop_url_json(const Services& services, const store::Instance& inst) {
  const auto url = desktop_url(services, inst);
  return url ? json(*url) : json(nullptr);
}

}  // namespace nshpc::tools::app
