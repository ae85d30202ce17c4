// Serving the embedded assets: "/" (index.html) and "/ui/<bundle>/<path>".
#include <string>
#include <string_view>

#include "base/text.hpp"
#include "dashboard/assets.hpp"

namespace nshpc::dashboard {

namespace {

using transport::HttpRequest;
using transport::HttpResponse;

constexpr std::string_view kUiPrefix = "/ui/";

std::string_view header(const HttpRequest& request, const char* name) {
  const auto it = request.headers.find(name);
  return it == request.headers.end() ? std::string_view() : std::string_view(it->second);
}

// Accept-Encoding names gzip (or *) with a q-value above 0.
bool accepts_gzip(const HttpRequest& request) {
  for (std::string_view item : text::split(header(request, "accept-encoding"), ',')) {
    const std::vector<std::string_view> parts = text::split(item, ';');
    const std::string_view coding = text::trim(parts.empty() ? item : parts[0]);
    if (coding != "gzip" && coding != "x-gzip" && coding != "*") continue;
    bool refused = false;
    for (std::size_t i = 1; i < parts.size(); ++i) {
      const std::string_view p = text::trim(parts[i]);
      if (p.substr(0, 2) == "q=") refused = text::trim(p.substr(2)).find_first_not_of("0.") == std::string_view::npos;
    }
    return !refused;
  }
  return false;
}

// If-None-Match lists `etag` (weak comparison, as RFC 9110 asks for it) or is "*".
bool not_modified(const HttpRequest& request, std::string_view etag) {
  for (std::string_view item : text::split(header(request, "if-none-match"), ',')) {
    std::string_view tag = text::trim(item);
    if (tag == "*") return true;
    if (tag.substr(0, 2) == "W/") tag.remove_prefix(2);
    if (tag == etag) return true;
  }
  return false;
}

void common_headers(HttpResponse& response) {
  response.headers["Content-Security-Policy"] = std::string(kContentSecurityPolicy);
  response.headers["X-Content-Type-Options"] = "nosniff";
  response.headers["Referrer-Policy"] = "no-referrer";
  response.headers["X-Frame-Options"] = "DENY";
}

HttpResponse refusal(int status, std::string message) {
  HttpResponse response;
  response.status = status;
  common_headers(response);
  response.headers["Content-Type"] = "text/plain; charset=utf-8";
  response.headers["Cache-Control"] = "no-store";
  response.body = std::move(message) + "\n";
  return response;
}

HttpResponse serve(const HttpRequest& request, const Asset& asset, std::string_view cache_control) {
  if (request.method != "GET" && request.method != "HEAD") {
    HttpResponse response = refusal(405, "method not allowed: the dashboard's pages answer GET and HEAD");
    response.headers["Allow"] = "GET, HEAD";
    return response;
  }
  const bool gzip = accepts_gzip(request);
  // A strong validator names one representation: the raw bytes get an ETag of their own.
  const std::string etag = "\"" + std::string(asset.sha256.substr(0, 32)) + (gzip ? "\"" : "-identity\"");
  HttpResponse response;
  common_headers(response);
  response.headers["ETag"] = etag;
  response.headers["Cache-Control"] = std::string(cache_control);
  response.headers["Vary"] = "Accept-Encoding";
  if (not_modified(request, etag)) {
    response.status = 304;
    return response;
  }
  response.headers["Content-Type"] = std::string(asset.mime);
  if (gzip) response.headers["Content-Encoding"] = "gzip";
  if (request.method == "GET") response.body = std::string(gzip ? asset.gzip : asset.raw);
  return response;
}

std::string_view path_of(const HttpRequest& request) {
  std::string_view path = request.target;
  return path.substr(0, path.find_first_of("?#"));
}

}  // namespace

std::vector<transport::HttpRoute> asset_routes() {
  std::vector<transport::HttpRoute> routes;
  routes.push_back({.prefix = "/", .exact = true, .browser = true, .handler = [](const HttpRequest& request) {
                      return serve(request, *find_asset("index.html"), "no-cache");
                    }});
  routes.push_back({.prefix = std::string(kUiPrefix), .browser = true, .handler = [](const HttpRequest& request) {
                      std::string_view rest = path_of(request).substr(kUiPrefix.size());
                      const std::size_t slash = rest.find('/');
                      if (slash == std::string_view::npos || rest.substr(0, slash) != bundle_hash())
                        return refusal(404, "not found: this page belongs to another build of ns-hpc; reload the dashboard at /");
                      const Asset* asset = find_asset(rest.substr(slash + 1));
                      if (asset == nullptr || asset->path == "index.html")
                        return refusal(404, "not found: the dashboard has no such file; reload the dashboard at /");
                      return serve(request, *asset, "public, max-age=31536000, immutable");
                    }});
  return routes;
}

}  // namespace nshpc::dashboard
