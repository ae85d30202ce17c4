// The dashboard's embedded assets (src/dashboard/assets.hpp): the table the build made from
// dashboard/ui, the page's references and imports against it, and the routes that serve it
// (status, caching, ETag and If-None-Match, gzip or raw, CSP), called as the transport calls them.
#include <gtest/gtest.h>

#include <zlib.h>

#include <regex>
#include <set>
#include <string>
#include <string_view>

#include "dashboard/assets.hpp"

namespace dashboard = nshpc::dashboard;
namespace transport = nshpc::transport;

namespace {

std::string gunzip(std::string_view in) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 16 + MAX_WBITS), Z_OK);  // 16: a gzip header, not zlib's
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  std::string out;
  char buf[16384];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
  }
  inflateEnd(&z);
  EXPECT_EQ(rc, Z_STREAM_END) << "the gzip body is not one whole gzip stream";
  return out;
}

const transport::HttpRoute& route(const std::vector<transport::HttpRoute>& routes, std::string_view prefix) {
  for (const auto& r : routes)
    if (r.prefix == prefix) return r;
  throw std::runtime_error("no route " + std::string(prefix));
}

transport::HttpResponse get(const std::string& target, std::map<std::string, std::string> headers = {},
                            std::string method = "GET") {
  static const std::vector<transport::HttpRoute> routes = dashboard::asset_routes();
  transport::HttpRequest request;
  request.method = std::move(method);
  request.target = target;
  request.headers = std::move(headers);
  request.by_cookie = true;
  return route(routes, target == "/" ? "/" : "/ui/").handler(request);
}

std::string ui(std::string_view path) { return "/ui/" + std::string(dashboard::bundle_hash()) + "/" + std::string(path); }

// "views/../api.js" → "api.js"; "" when it leaves the folder.
std::string normalize(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t slash = std::min(path.find('/', start), path.size());
    const std::string part = path.substr(start, slash - start);
    if (part == "..") {
      if (parts.empty()) return "";
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = slash + 1;
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
  return out;
}

}  // namespace

TEST(DashboardAssets, TableHasThePageAndItsModules) {
  const auto table = dashboard::assets();
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(table[0].path, "index.html");
  for (const char* path : {"index.html", "main.js", "api.js", "events.js", "dom.js", "dialog.js", "style.css",
                           "views/instances.js", "views/instance.js", "views/activity.js", "views/server.js"})
    EXPECT_NE(dashboard::find_asset(path), nullptr) << path;
  EXPECT_EQ(dashboard::find_asset("nope.js"), nullptr);
  EXPECT_EQ(dashboard::bundle_hash().size(), 16u);
  const auto* index = dashboard::find_asset("index.html");
  EXPECT_EQ(index->raw.find("{{BUNDLE}}"), std::string_view::npos) << "the bundle placeholder is replaced at build time";
  EXPECT_EQ(dashboard::find_asset("main.js")->mime, "text/javascript; charset=utf-8");
  EXPECT_EQ(dashboard::find_asset("style.css")->mime, "text/css; charset=utf-8");
  EXPECT_EQ(index->mime, "text/html; charset=utf-8");
}

TEST(DashboardAssets, EveryReferenceAndImportExists) {
  const std::string index(dashboard::find_asset("index.html")->raw);
  const std::regex ref(R"((?:src|href)="([^"#]+)\")");
  std::size_t refs = 0;
  for (std::sregex_iterator it(index.begin(), index.end(), ref), end; it != end; ++it) {
    const std::string target = (*it)[1];
    const std::string prefix = "/ui/" + std::string(dashboard::bundle_hash()) + "/";
    ASSERT_EQ(target.rfind(prefix, 0), 0u) << "index.html names " << target << ", not an asset of this bundle";
    EXPECT_NE(dashboard::find_asset(target.substr(prefix.size())), nullptr) << target;
    ++refs;
  }
  EXPECT_GE(refs, 3u);  // the style sheet, the main module, the icon
  const std::regex import_line(R"(^\s*(?:import|export)\b[^'"]*?\bfrom\s+'([^']+)')", std::regex::multiline);
  std::size_t imports = 0;
  for (const auto& asset : dashboard::assets()) {
    if (!asset.path.ends_with(".js")) continue;
    const std::string text(asset.raw);
    const std::string dir = asset.path.find('/') == std::string_view::npos
                                ? std::string()
                                : std::string(asset.path.substr(0, asset.path.rfind('/') + 1));
    for (std::sregex_iterator it(text.begin(), text.end(), import_line), end; it != end; ++it) {
      const std::string spec = (*it)[1];
      ASSERT_TRUE(spec.starts_with("./") || spec.starts_with("../")) << asset.path << " imports " << spec << ": only relative modules";
      const std::string target = normalize(dir + spec);
      EXPECT_NE(dashboard::find_asset(target), nullptr) << asset.path << " imports " << spec << " (" << target << ")";
      ++imports;
    }
  }
  EXPECT_GE(imports, 10u);
}

// The page never turns data into markup and loads nothing from elsewhere (the CSP would refuse it,
// as an error in the console). The vendored libraries (vendor/: noVNC, xterm.js, as npm ships
// them) name URLs in comments and are not ours to hold to the markup rule; no code may use eval.
TEST(DashboardAssets, NoMarkupFromDataNoInlineCodeNoExternalUrls) {
  for (const auto& asset : dashboard::assets()) {
    const std::string_view text = asset.raw;
    for (const char* sink : {"eval(", "new Function"})
      EXPECT_EQ(text.find(sink), std::string_view::npos) << asset.path << " uses " << sink;
    if (asset.path.starts_with("vendor/")) continue;
    for (const char* sink : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"})
      EXPECT_EQ(text.find(sink), std::string_view::npos) << asset.path << " uses " << sink;
    std::string rest(text);
    for (const char* allowed : {"http://www.w3.org/2000/svg"})
      for (std::size_t at; (at = rest.find(allowed)) != std::string::npos;) rest.erase(at, std::string_view(allowed).size());
    EXPECT_EQ(rest.find("http://"), std::string::npos) << asset.path;
    EXPECT_EQ(rest.find("https://"), std::string::npos) << asset.path;
  }
  const std::string index(dashboard::find_asset("index.html")->raw);
  EXPECT_FALSE(std::regex_search(index, std::regex(R"(<script(?![^>]*\bsrc=)[^>]*>)"))) << "inline script";
  EXPECT_EQ(index.find("<style"), std::string::npos);
  EXPECT_EQ(index.find("style="), std::string::npos);
  EXPECT_FALSE(std::regex_search(index, std::regex(R"(\son[a-z]+=)"))) << "inline event handler";
}

// vendor/live.json says which live views this build embeds, and each one it names is there with
// its licence; the page loads them only when their tab opens (views/instance.js).
TEST(DashboardAssets, LiveViewsAreEmbeddedAsLiveJsonSays) {
  const auto* live = dashboard::find_asset("vendor/live.json");
  ASSERT_NE(live, nullptr);
  const std::string text(live->raw);
  if (text.find("\"desktop\": true") != std::string::npos) {
    for (const char* path : {"live/desktop.js", "vendor/novnc/core/rfb.js", "vendor/novnc/vendor/pako/lib/zlib/inflate.js",
                             "vendor/novnc/LICENSE.txt", "vendor/novnc/vendor/pako/LICENSE.txt"})
      EXPECT_NE(dashboard::find_asset(path), nullptr) << path;
  } else {
    EXPECT_NE(text.find("\"desktop\": false"), std::string::npos) << text;
  }
  if (text.find("\"terminal\": true") != std::string::npos) {
    for (const char* path : {"live/terminal.js", "vendor/xterm/xterm.mjs", "vendor/xterm/xterm.css", "vendor/xterm/LICENSE.txt",
                             "vendor/xterm/addon-fit.mjs"})
      EXPECT_NE(dashboard::find_asset(path), nullptr) << path;
    EXPECT_EQ(dashboard::find_asset("vendor/xterm/xterm.mjs")->mime, "text/javascript; charset=utf-8");
  } else {
    EXPECT_NE(text.find("\"terminal\": false"), std::string::npos) << text;
  }
  // Nothing the first load fetches imports them statically.
  for (const char* path : {"main.js", "views/instance.js", "views/instances.js"})
    EXPECT_EQ(std::string(dashboard::find_asset(path)->raw).find("from '../vendor/"), std::string::npos) << path;
}

TEST(DashboardAssets, EtagsDifferWhenContentDiffers) {
  std::set<std::string_view> hashes;
  std::set<std::string_view> contents;
  for (const auto& asset : dashboard::assets()) {
    hashes.insert(asset.sha256);
    contents.insert(asset.raw);
    EXPECT_EQ(asset.sha256.size(), 64u);
  }
  EXPECT_EQ(hashes.size(), contents.size());
  const auto a = get(ui("main.js"), {{"accept-encoding", "gzip"}});
  const auto b = get(ui("api.js"), {{"accept-encoding", "gzip"}});
  const auto raw = get(ui("main.js"));
  ASSERT_EQ(a.status, 200);
  EXPECT_NE(a.headers.at("ETag"), b.headers.at("ETag"));
  EXPECT_NE(a.headers.at("ETag"), raw.headers.at("ETag")) << "the gzip and the raw representation have ETags of their own";
  EXPECT_EQ(a.headers.at("ETag"), get(ui("main.js"), {{"accept-encoding", "gzip"}}).headers.at("ETag"));
}

TEST(DashboardAssets, GzipBodiesGunzipToTheRawBytes) {
  for (const auto& asset : dashboard::assets()) {
    const std::string out = gunzip(asset.gzip);
    EXPECT_EQ(out.size(), asset.raw.size()) << asset.path;
    EXPECT_TRUE(out == asset.raw) << asset.path;
  }
}

TEST(DashboardAssets, IndexIsServedAtTheRootWithoutLongCache) {
  const auto routes = dashboard::asset_routes();
  for (const auto& r : routes) EXPECT_TRUE(r.browser) << r.prefix;
  EXPECT_TRUE(route(routes, "/").exact);
  EXPECT_FALSE(route(routes, "/ui/").exact);

  const auto r = get("/", {{"accept-encoding", "gzip, deflate, br"}, {"accept", "text/html"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(r.headers.at("Cache-Control"), "no-cache");
  EXPECT_EQ(r.headers.at("Content-Encoding"), "gzip");
  EXPECT_EQ(r.headers.at("Content-Security-Policy"), dashboard::kContentSecurityPolicy);
  EXPECT_EQ(r.headers.at("X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(gunzip(r.body), dashboard::find_asset("index.html")->raw);
  EXPECT_NE(gunzip(r.body).find(ui("main.js")), std::string::npos) << "index.html names this bundle's modules";

  // A client that does not take gzip (or refuses it with q=0) gets the raw bytes.
  for (const char* ae : {"", "identity", "gzip;q=0, identity", "br"}) {
    const auto plain = get("/", {{"accept-encoding", ae}});
    EXPECT_EQ(plain.status, 200) << ae;
    EXPECT_EQ(plain.headers.count("Content-Encoding"), 0u) << ae;
    EXPECT_EQ(plain.body, dashboard::find_asset("index.html")->raw) << ae;
  }
}

TEST(DashboardAssets, IfNoneMatchAnswers304) {
  const auto first = get(ui("style.css"), {{"accept-encoding", "gzip"}});
  ASSERT_EQ(first.status, 200);
  const std::string etag = first.headers.at("ETag");
  for (const std::string& inm : {etag, "\"x\", " + etag, "W/" + etag, std::string("*")}) {
    const auto again = get(ui("style.css"), {{"accept-encoding", "gzip"}, {"if-none-match", inm}});
    EXPECT_EQ(again.status, 304) << inm;
    EXPECT_TRUE(again.body.empty());
    EXPECT_EQ(again.headers.at("ETag"), etag);
  }
  EXPECT_EQ(get(ui("style.css"), {{"accept-encoding", "gzip"}, {"if-none-match", "\"other\""}}).status, 200);
  const auto root = get("/", {{"accept-encoding", "gzip"}});
  EXPECT_EQ(get("/", {{"accept-encoding", "gzip"}, {"if-none-match", root.headers.at("ETag")}}).status, 304);
}

TEST(DashboardAssets, BundledAssetsAreImmutableAndOtherBundlesAre404) {
  const auto r = get(ui("views/instances.js") + "?v=1", {{"accept-encoding", "gzip"}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("Cache-Control"), "public, max-age=31536000, immutable");
  EXPECT_EQ(r.headers.at("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(r.headers.at("Vary"), "Accept-Encoding");
  EXPECT_EQ(r.headers.at("Content-Security-Policy"), dashboard::kContentSecurityPolicy);
  EXPECT_EQ(gunzip(r.body), dashboard::find_asset("views/instances.js")->raw);

  EXPECT_EQ(get("/ui/0123456789abcdef/main.js").status, 404) << "an older build's bundle";
  EXPECT_EQ(get("/ui/main.js").status, 404);
  EXPECT_EQ(get(ui("nope.js")).status, 404);
  EXPECT_EQ(get(ui("../main.js")).status, 404);
  EXPECT_EQ(get(ui("index.html")).status, 404) << "the page itself is only at /";
  const auto post = get(ui("main.js"), {}, "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers.at("Allow"), "GET, HEAD");
  const auto head = get(ui("main.js"), {{"accept-encoding", "gzip"}}, "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
}
