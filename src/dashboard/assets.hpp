// The dashboard's page (dashboard/ui/), embedded in the binary at build time by
// src/dashboard/assets.cmake (gzip -9n, .incbin), and the routes that serve it:
//  - "/" (exact): index.html, `Cache-Control: no-cache` and an ETag (it names this build's bundle);
//  - "/ui/<bundle>/<path>": every other asset, cached for a year (`immutable`): a new build has
//    a new bundle hash, so an older hash answers 404.
// Both are browser routes (the dashboard's cookie, or the token), with a strict CSP, ETag and
// If-None-Match (304), and gzip for clients that accept it (raw bytes otherwise).
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "transport/http.hpp"

namespace nshpc::dashboard {

struct Asset {
  std::string_view path;  // relative to dashboard/ui: "index.html", "views/instances.js"
  std::string_view mime;  // Content-Type, with a charset for text
  std::string_view sha256;  // hex SHA-256 of `raw`
  std::string_view gzip;    // the bytes gzipped (gzip -9n)
  std::string_view raw;
};

// Every embedded asset, index.html first (its {{BUNDLE}} placeholders already replaced).
std::span<const Asset> assets();
// The asset at `path` (relative, as Asset::path), or null.
const Asset* find_asset(std::string_view path);
// The hash that names this build's assets: /ui/<bundle_hash()>/<path>.
std::string_view bundle_hash();

// The routes serving the assets (all `browser`); add_routes adds them.
std::vector<transport::HttpRoute> asset_routes();

// The Content-Security-Policy sent with every asset. Scripts only from this server, no eval.
// Styles may be inline because xterm.js (the live terminal) writes its own at run time: <style>
// elements for its cell size and theme, and style attributes for true-colour cells. An inline
// style runs no code, and the page never turns data into markup, so nothing of a sandbox's can
// place one. connect-src 'self' covers the live views' ws:// and wss:// of this same host.
inline constexpr std::string_view kContentSecurityPolicy =
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

namespace detail {
// What the generated unit (dashboard_assets.cpp) holds: offsets into one blob of every asset,
// gzipped then raw.
struct AssetEntry {
  const char* path;
  const char* mime;
  const char* sha256;
  std::size_t gzip_offset, gzip_size, raw_offset, raw_size;
};
extern const char kBundle[];
extern const AssetEntry kAssetEntries[];
extern const std::size_t kAssetEntryCount;
extern const std::size_t kAssetBlobSize;
}  // namespace detail

}  // namespace nshpc::dashboard
