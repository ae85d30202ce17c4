// The WebDAV handler (see handler.hpp).
#include "dav/handler.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <tuple>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <set>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "dav/if_header.hpp"
#include "dav/tree.hpp"
#include "dav/xml.hpp"

namespace nshpc::dav {

using transport::BodyReader;
using transport::HttpRequest;
using transport::StreamResponse;

namespace {

constexpr std::string_view kDav = "DAV:";
constexpr auto kDefaultLockTimeout = std::chrono::seconds(3600);
constexpr auto kMaxLockTimeout = std::chrono::seconds(7 * 24 * 3600);
constexpr const char* kAllow = "OPTIONS, GET, HEAD, PUT, DELETE, MKCOL, COPY, MOVE, PROPFIND, PROPPATCH, LOCK, UNLOCK";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One path segment, percent-decoded; refuses what could name another place.
std::string decode_segment(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '%') {
      const int hi = i + 2 < raw.size() ? hex_value(raw[i + 1]) : -1;
      const int lo = i + 2 < raw.size() ? hex_value(raw[i + 2]) : -1;
      if (hi < 0 || lo < 0) throw DavError(400, "a malformed %-escape in the path");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(raw[i]);
    }
  }
  if (out.find('/') != std::string::npos) throw DavError(403, "an encoded slash (%2F) in a path segment is refused");
  if (out.find('\0') != std::string::npos) throw DavError(403, "a NUL byte in the path is refused");
  if (out == "." || out == "..") throw DavError(403, "'.' and '..' path segments are refused");
  return out;
}

std::string encode_segment(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '!' || c == '$' || c == '\'' ||
        c == '(' || c == ')' || c == '*' || c == '+' || c == ',' || c == ';' || c == '=' || c == ':' || c == '@')
      out.push_back(static_cast<char>(c));
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// A decoded URL path ("/dav/a b/c%") as it goes on the wire ("/dav/a%20b/c%25"): decoded
// segments never hold '/', so splitting on it is exact.
std::string encode_path(std::string_view decoded) {
  std::string out;
  while (!decoded.empty()) {
    const auto slash = decoded.find('/');
    const std::string_view seg = decoded.substr(0, slash);
    decoded = slash == std::string_view::npos ? std::string_view() : decoded.substr(slash + 1);
    if (seg.empty()) continue;
    out += "/" + encode_segment(seg);
  }
  return out.empty() ? "/" : out;
}

std::string http_date(std::time_t t) {
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

std::string iso_date(std::time_t t) {
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string etag_of(const struct stat& st) {
  const std::uint64_t ns = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
  // Size and modification time (ns): what a listing and an open file both know, so a PROPFIND
  // and a GET give the same tag.
  return fmt::format("\"{:x}-{:x}\"", st.st_size, ns);
}

std::string content_type(std::string_view name) {
  static const std::map<std::string, std::string, std::less<>> kTypes = {
      {"txt", "text/plain; charset=utf-8"}, {"md", "text/markdown; charset=utf-8"}, {"csv", "text/csv; charset=utf-8"},
      {"html", "text/html; charset=utf-8"}, {"htm", "text/html; charset=utf-8"}, {"css", "text/css"},
      {"js", "text/javascript"}, {"json", "application/json"}, {"xml", "application/xml"}, {"pdf", "application/pdf"},
      {"png", "image/png"}, {"jpg", "image/jpeg"}, {"jpeg", "image/jpeg"}, {"gif", "image/gif"}, {"webp", "image/webp"},
      {"svg", "image/svg+xml"}, {"zip", "application/zip"}, {"gz", "application/gzip"}, {"tar", "application/x-tar"},
      {"py", "text/x-python; charset=utf-8"}, {"sh", "text/x-shellscript; charset=utf-8"}};
  const auto dot = name.rfind('.');
  if (dot == std::string_view::npos) return "application/octet-stream";
  std::string ext(name.substr(dot + 1));
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto it = kTypes.find(ext);
  return it == kTypes.end() ? "application/octet-stream" : it->second;
}

std::string header(const HttpRequest& req, const char* name) {
  auto it = req.headers.find(name);
  return it == req.headers.end() ? std::string() : it->second;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

StreamResponse text(int status, std::string message) {
  StreamResponse r;
  r.status = status;
  r.body = std::move(message);
  if (!r.body.empty() && r.body.back() != '\n') r.body += '\n';
  r.headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
  return r;
}

StreamResponse xml_response(int status, std::string body) {
  StreamResponse r;
  r.status = status;
  r.body = std::move(body);
  r.headers.emplace_back("Content-Type", "application/xml; charset=utf-8");
  return r;
}

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 412: return "Precondition Failed";
    case 423: return "Locked";
    case 424: return "Failed Dependency";
    case 507: return "Insufficient Storage";
    default: return "Error";
  }
}

std::string status_line(int status) { return fmt::format("HTTP/1.1 {} {}", status, reason(status)); }

constexpr const char* kXmlHead = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n";

// The live properties this server computes (never stored).
const std::set<std::string, std::less<>> kLiveProps = {"resourcetype", "getcontentlength", "getlastmodified", "creationdate",
                                                       "getetag", "getcontenttype", "supportedlock", "lockdiscovery",
                                                       "displayname"};
// What allprop returns (RFC 4918 9.1: not necessarily every live property).
const std::vector<std::string> kAllProps = {"resourcetype", "getcontentlength", "getlastmodified", "creationdate",
                                            "getetag", "getcontenttype", "supportedlock", "lockdiscovery"};

}  // namespace

// ------------------------------------------------------------------------------------------------

struct DavHandler::Impl {
  const instances::Service& instances;
  const store::Store& store;
  DavSettings settings;
  std::map<std::string, UniqueFd> extra_dirs;
  mutable PropStore props;
  mutable LockManager locks;

  Impl(const instances::Service& i, DavSettings st)
      : instances(i), store(i.store()), settings(std::move(st)), props(settings.props_file) {
    for (const auto& [name, extra] : settings.extras) {
      UniqueFd fd(::open(extra.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!fd) {
        const int err = errno;
        throw Error(fmt::format("WebDAV extra mount '{}' {}: {}; fix [dav.extras.{}] path", name,
                                err == ENOENT ? "does not exist" : err == ENOTDIR ? "is not a directory" : std::strerror(err),
                                extra.path.string(), name));
      }
      if (::faccessat(fd.get(), ".", R_OK | X_OK, AT_EACCESS) != 0)
        throw Error(fmt::format("WebDAV extra mount '{}' is not readable or traversable: {}; fix its permissions or "
                                "[dav.extras.{}] path",
                                name, extra.path.string(), name));
      extra_dirs.emplace(name, std::move(fd));
    }
  }

  // ---- where a URL leads -------------------------------------------------------------------

  struct Target {
    enum class Kind { root, instances, instance, tree } kind = Kind::root;
    std::string path;  // decoded, "/dav/..." without a trailing slash
    std::optional<store::Instance> instance;
    std::shared_ptr<Tree> tree;
    RelPath rel;
    std::string name;  // last segment
    bool virtual_collection() const { return kind != Kind::tree; }
  };

  // The path part of a request target or a Destination/If URI ("http://host/dav/x?q" → "/dav/x").
  static std::string url_path(std::string_view uri) {
    if (auto scheme = uri.find("://"); scheme != std::string_view::npos && scheme < uri.find('/')) {
      const auto slash = uri.find('/', scheme + 3);
      uri = slash == std::string_view::npos ? std::string_view("/") : uri.substr(slash);
    }
    uri = uri.substr(0, uri.find('?'));
    uri = uri.substr(0, uri.find('#'));
    return std::string(uri);
  }

  // The decoded segments after the prefix; throws 404 when the path is not under it.
  std::vector<std::string> segments_of(std::string_view raw) const {
    const std::string& prefix = settings.prefix;
    if (raw.rfind(prefix, 0) != 0 || (raw.size() > prefix.size() && raw[prefix.size()] != '/'))
      throw DavError(404, fmt::format("{} is not a WebDAV path (they start with {}/)", std::string(raw), prefix));
    std::vector<std::string> out;
    std::string_view rest = raw.substr(prefix.size());
    while (!rest.empty()) {
      const auto slash = rest.find('/');
      const std::string_view seg = rest.substr(0, slash);
      rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
      if (seg.empty()) continue;
      out.push_back(decode_segment(seg));
    }
    return out;
  }

  Target locate(std::string_view raw) const {
    Target t;
    const std::vector<std::string> segs = segments_of(raw);
    t.path = settings.prefix;
    for (const std::string& s : segs) t.path += "/" + s;
    t.name = segs.empty() ? std::string() : segs.back();
    if (segs.empty()) return t;
    if (segs[0] == "instances") {
      if (segs.size() == 1) {
        t.kind = Target::Kind::instances;
        return t;
      }
      try {
        t.instance = store.get(segs[1]);
      } catch (const UsageError&) {
        throw DavError(404, fmt::format("no instance '{}' (archived instances are not served)", segs[1]));
      }
      if (t.instance->meta.archived()) throw DavError(404, fmt::format("instance '{}' is archived", segs[1]));
      if (segs.size() == 2) {
        t.kind = Target::Kind::instance;
        return t;
      }
      const bool workspace = segs[2] == "workspace";
      if (!workspace && segs[2] != "output")
        throw DavError(404, fmt::format("{}/instances/{}/ holds only workspace/ and output/", settings.prefix, segs[1]));
      t.kind = Target::Kind::tree;
      t.tree = std::make_shared<Tree>();
      const std::filesystem::path dir = workspace ? t.instance->workspace : t.instance->output;
      // With the one identity regime of an instance's files (files/resolver.hpp), as the file tools.
      t.tree->shown = fmt::format("{}/instances/{}/{}/", settings.prefix, segs[1], segs[2]);
      auto access = instances.file_access(*t.instance);
      try {
        t.tree->root.emplace(files::Root::open(dir, t.tree->shown, access.owner, false, false, std::move(access.broker)));
      } catch (const SysError&) {
        throw DavError(404, fmt::format("instance '{}' has no {} folder", segs[1], segs[2]));
      }
      t.rel.assign(segs.begin() + 3, segs.end());
      return t;
    }
    auto extra = extra_dirs.find(segs[0]);
    if (extra == extra_dirs.end()) throw DavError(404, fmt::format("{}/{}/ does not exist (there are instances/ and the configured extras)", settings.prefix, segs[0]));
    t.kind = Target::Kind::tree;
    t.tree = std::make_shared<Tree>();
    UniqueFd dir(::fcntl(extra->second.get(), F_DUPFD_CLOEXEC, 0));
    if (!dir) fail_with_errno(errno, "dup", segs[0]);
    t.tree->read_only = settings.extras.at(segs[0]).ro;
    t.tree->shown = fmt::format("{}/{}/", settings.prefix, segs[0]);
    t.tree->root.emplace(std::move(dir), t.tree->shown, std::nullopt, t.tree->read_only);
    t.rel.assign(segs.begin() + 1, segs.end());
    return t;
  }

  std::optional<struct stat> stat_of(const Target& t) const {
    if (t.kind == Target::Kind::tree) return stat_path(*t.tree, t.rel);
    struct stat st;
    const std::filesystem::path p = t.kind == Target::Kind::instance ? t.instance->base : store.root();
    if (::stat(p.c_str(), &st) != 0) return std::nullopt;
    return st;
  }

  static void refuse_write(const Target& t, std::string_view method) {
    if (t.kind == Target::Kind::tree && t.tree->read_only)
      throw DavError(403, fmt::format("{}{} is read-only ([dav.extras] ro = true): {} refused", t.tree->shown, join(t.rel), method));
    if (t.kind == Target::Kind::instances || t.kind == Target::Kind::root)
      throw DavError(403, "instances are created and archived with the create_instance and archive_instance tools (or the CLI), not WebDAV");
    if (t.kind == Target::Kind::instance)
      throw DavError(403, "an instance folder is managed by ns-hpc; write inside its workspace/ or output/");
  }

  static std::string href(const Target& t, bool collection) { return encode_path(t.path) + (collection ? "/" : ""); }

  // ---- conditions (If, If-Match, If-None-Match) and locks -----------------------------------

  std::optional<std::string> etag_at(const std::string& path) const {
    try {
      Target t = locate(encode_path(path));
      auto st = stat_of(t);
      if (!st) return std::nullopt;
      return etag_of(*st);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  // Evaluates the If header for `t`; for a write, also that every lock on it (and below, for
  // `below`) has its token submitted. Returns the submitted tokens.
  std::vector<std::string> check_conditions(const HttpRequest& req, const Target& t, bool write, bool below) const {
    std::vector<std::string> submitted;
    const std::string raw_if = header(req, "if");
    if (!raw_if.empty()) {
      std::vector<IfList> lists;
      try {
        lists = parse_if_header(raw_if);
      } catch (const std::invalid_argument& e) {
        throw DavError(400, e.what());
      }
      submitted = submitted_tokens(lists);
      IfFacts facts;
      facts.etag = [this](const std::string& p) { return etag_at(p); };
      facts.locked_by = [this](const std::string& p, const std::string& token) { return locks.covers(token, p); };
      facts.path_of = [this](const std::string& uri) -> std::optional<std::string> {
        try {
          Target other = locate(url_path(uri));
          return other.path;
        } catch (const std::exception&) {
          return std::nullopt;
        }
      };
      if (!evaluate_if(lists, t.path, facts)) {
        // A lock token that names no lock of this resource (stale or corrupt) on a locked
        // resource: the resource is locked (423). Otherwise the conditions failed (412); so
        // too for DAV:no-lock, which by convention names no lock at all.
        const bool names_lock_tokens = std::any_of(submitted.begin(), submitted.end(), [](const std::string& token) {
          return token.rfind("opaquelocktoken:", 0) == 0;
        });
        if (write && names_lock_tokens)
          for (const Lock& l : locks.covering(t.path, below))
            if (std::find(submitted.begin(), submitted.end(), l.token) == submitted.end())
              throw DavError(423, fmt::format("{} is locked, and the If header names none of its lock tokens", t.path));
        throw DavError(412, "the If header's conditions do not hold");
      }
    }
    if (write)
      for (const Lock& l : locks.covering(t.path, below))
        if (std::find(submitted.begin(), submitted.end(), l.token) == submitted.end())
          throw DavError(423, fmt::format("{} is locked{}; submit the lock token in the If header", t.path,
                                          l.root == t.path ? "" : fmt::format(" (by a lock on {})", l.root)));
    return submitted;
  }

  // Adding or removing a member changes its collection (RFC 4918 §7.4): a lock on the parent,
  // of any depth, needs its token submitted too.
  void check_membership(const Target& t, const std::vector<std::string>& submitted) const {
    const auto slash = t.path.rfind('/');
    if (slash == std::string::npos || slash == 0) return;
    const std::string parent = t.path.substr(0, slash);
    for (const Lock& l : locks.covering(parent))
      if (std::find(submitted.begin(), submitted.end(), l.token) == submitted.end())
        throw DavError(423, fmt::format("{} is locked{}, and adding or removing its members needs the lock token in the "
                                        "If header",
                                        parent, l.root == parent ? "" : fmt::format(" (by a lock on {})", l.root)));
  }

  // If-Match / If-None-Match for a method that changes the resource.
  static void check_http_preconditions(const HttpRequest& req, const std::optional<struct stat>& st) {
    const std::string if_match = trimmed(header(req, "if-match"));
    if (!if_match.empty()) {
      if (!st) throw DavError(412, "If-Match: the resource does not exist");
      if (if_match != "*" && if_match.find(etag_of(*st)) == std::string::npos)
        throw DavError(412, "If-Match: the resource has changed (its ETag differs)");
    }
    const std::string if_none = trimmed(header(req, "if-none-match"));
    if (!if_none.empty() && st && (if_none == "*" || if_none.find(etag_of(*st)) != std::string::npos))
      throw DavError(412, "If-None-Match: the resource exists");
  }

  // ---- properties ---------------------------------------------------------------------------

  std::string lock_discovery(const std::string& path) const {
    std::string out;
    for (const Lock& l : locks.covering(path)) out += active_lock_xml(l);
    return out;
  }

  std::string active_lock_xml(const Lock& l) const {
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(l.expires - std::chrono::steady_clock::now()).count();
    const std::string root_href = encode_path(l.root);
    return fmt::format("<D:activelock><D:locktype><D:write/></D:locktype><D:lockscope><D:{}/></D:lockscope>"
                       "<D:depth>{}</D:depth>{}<D:timeout>Second-{}</D:timeout>"
                       "<D:locktoken><D:href>{}</D:href></D:locktoken><D:lockroot><D:href>{}</D:href></D:lockroot>"
                       "</D:activelock>",
                       l.exclusive ? "exclusive" : "shared", l.infinite ? "infinity" : "0",
                       l.owner_xml.empty() ? std::string() : "<D:owner>" + l.owner_xml + "</D:owner>",
                       std::max<long long>(left, 0), xml::escape(l.token), xml::escape(root_href));
  }

  // The value of a live property (nullopt: not defined for this resource).
  std::optional<std::string> live_prop(const Target& t, const struct stat& st, std::string_view name) const {
    const bool dir = S_ISDIR(st.st_mode);
    if (name == "resourcetype") return dir ? "<D:collection/>" : "";
    if (name == "getlastmodified") return http_date(st.st_mtime);
    if (name == "creationdate") return iso_date(st.st_ctime < st.st_mtime ? st.st_ctime : st.st_mtime);
    if (name == "displayname") return xml::escape(t.name.empty() ? std::string("ns-hpc") : t.name);
    if (name == "getetag") return xml::escape(etag_of(st));
    if (!dir && name == "getcontentlength") return std::to_string(st.st_size);
    if (!dir && name == "getcontenttype") return content_type(t.name);
    if (t.kind == Target::Kind::tree) {
      if (name == "supportedlock")
        return "<D:lockentry><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockentry>"
               "<D:lockentry><D:lockscope><D:shared/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockentry>";
      if (name == "lockdiscovery") return lock_discovery(t.path);
    }
    return std::nullopt;
  }

  enum class PropMode { prop, allprop, propname };

  // `dead`: the resource's dead properties when already fetched (a listing fetches them all at once).
  void propfind_response(std::string& out, const Target& t, const struct stat& st, PropMode mode,
                         const std::vector<xml::Name>& wanted, const std::vector<DeadProperty>* known = nullptr) const {
    out += "<D:response><D:href>" + xml::escape(href(t, S_ISDIR(st.st_mode))) + "</D:href>";
    std::string found, missing;
    std::vector<DeadProperty> dead;
    if (known) dead = *known;
    else if (t.kind == Target::Kind::tree) dead = props.get(t.path);
    if (mode == PropMode::propname) {
      for (const std::string& n : kAllProps)
        if (live_prop(t, st, n)) found += "<D:" + n + "/>";
      for (const DeadProperty& d : dead) found += xml::element_xml(d.name, "");
    } else if (mode == PropMode::allprop) {
      for (const std::string& n : kAllProps)
        if (auto v = live_prop(t, st, n)) found += xml::element_xml({"DAV:", n}, *v);
      for (const DeadProperty& d : dead) found += xml::element_xml(d.name, d.value_xml, d.lang);
      for (const xml::Name& n : wanted) {  // <include>
        if (n.ns == kDav)
          if (auto v = live_prop(t, st, n.local); v && std::find(kAllProps.begin(), kAllProps.end(), n.local) == kAllProps.end())
            found += xml::element_xml(n, *v);
      }
    } else {
      for (const xml::Name& n : wanted) {
        std::optional<std::string> value;
        std::string lang;
        if (n.ns == kDav) value = live_prop(t, st, n.local);
        if (!value)
          for (const DeadProperty& d : dead)
            if (d.name == n) {
              value = d.value_xml;
              lang = d.lang;
            }
        if (value) found += xml::element_xml(n, *value, lang);
        else missing += xml::element_xml(n, "");
      }
    }
    if (!found.empty() || missing.empty())
      out += "<D:propstat><D:prop>" + found + "</D:prop><D:status>" + status_line(200) + "</D:status></D:propstat>";
    if (!missing.empty())
      out += "<D:propstat><D:prop>" + missing + "</D:prop><D:status>" + status_line(404) + "</D:status></D:propstat>";
    out += "</D:response>\n";
  }

  // The children of a collection as targets with their stat.
  std::vector<std::pair<Target, struct stat>> children(const Target& t) const {
    std::vector<std::pair<Target, struct stat>> out;
    auto child = [&](const std::string& name) {
      Target c;
      c.path = t.path + "/" + name;
      c.name = name;
      return c;
    };
    if (t.kind == Target::Kind::tree) {
      bool truncated = false;
      for (DirEntry& e : list_dir(*t.tree, t.rel, settings.max_listing, truncated)) {
        Target c = child(e.name);
        c.kind = Target::Kind::tree;
        c.tree = t.tree;
        c.rel = t.rel;
        c.rel.push_back(e.name);
        out.emplace_back(std::move(c), e.st);
      }
      if (truncated)
        throw DavError(507, fmt::format("{} holds more than {} entries: too many to list in one answer", t.path, settings.max_listing));
      return out;
    }
    std::vector<std::string> names;
    if (t.kind == Target::Kind::root) {
      names.push_back("instances");
      for (const auto& [name, fd] : extra_dirs) names.push_back(name);
    } else if (t.kind == Target::Kind::instances) {
      for (const store::Instance& inst : store.list().instances)
        if (!inst.meta.archived()) names.push_back(inst.id);
    } else {
      names = {"workspace", "output"};
    }
    for (const std::string& name : names) {
      try {
        Target c = locate(encode_path(t.path + "/" + name));
        if (auto st = stat_of(c)) out.emplace_back(std::move(c), *st);
      } catch (const std::exception&) {
        // gone meanwhile, or its folder is missing: not listed
      }
    }
    return out;
  }

  // ---- methods ------------------------------------------------------------------------------

  // A read of the request body; a body that cannot be read is the client's problem (400, or 413
  // over the limit), never the server's.
  static std::size_t read_body(BodyReader& body, char* into, std::size_t n) {
    try {
      return body.read(into, n);
    } catch (const std::exception& e) {
      throw DavError(body.too_large() ? 413 : 400, e.what());
    }
  }

  std::string read_xml_body(BodyReader& body) const {
    std::string out;
    char buf[16384];
    for (;;) {
      const std::size_t n = read_body(body, buf, sizeof buf);
      if (n == 0) break;
      out.append(buf, n);
      if (out.size() > settings.max_xml_bytes)
        throw DavError(413, fmt::format("the XML body is larger than {} bytes", settings.max_xml_bytes));
    }
    return out;
  }

  static std::unique_ptr<xml::Element> parse_xml(const std::string& body) {
    try {
      return xml::parse(body);
    } catch (const std::exception& e) {
      throw DavError(400, e.what());
    }
  }

  static bool has_body(const HttpRequest& req) {
    const std::string len = header(req, "content-length");
    if (!len.empty() && len != "0") return true;
    return !header(req, "transfer-encoding").empty();
  }

  StreamResponse options(const Target*) const {
    StreamResponse r;
    r.status = 200;
    r.headers = {{"DAV", "1, 2"}, {"MS-Author-Via", "DAV"}, {"Allow", kAllow}, {"Accept-Ranges", "bytes"}};
    return r;
  }

  StreamResponse get(const HttpRequest& req, const Target& t, bool head) const {
    if (t.kind != Target::Kind::tree || t.rel.empty() || (stat_of(t) && S_ISDIR(stat_of(t)->st_mode))) {
      auto st = stat_of(t);
      if (!st) throw DavError(404, fmt::format("{} does not exist", t.path));
      if (S_ISDIR(st->st_mode)) return listing_page(t);
    }
    struct stat st;
    UniqueFd fd = open_file(*t.tree, t.rel, st);
    const std::string etag = etag_of(st);
    StreamResponse r;
    r.headers = {{"ETag", etag}, {"Last-Modified", http_date(st.st_mtime)}, {"Content-Type", content_type(t.name)},
                 {"Accept-Ranges", "bytes"}};
    const std::string if_none = trimmed(header(req, "if-none-match"));
    if (!if_none.empty() && (if_none == "*" || if_none.find(etag) != std::string::npos)) {
      r.status = 304;
      return r;
    }
    const std::string if_match = trimmed(header(req, "if-match"));
    if (!if_match.empty() && if_match != "*" && if_match.find(etag) == std::string::npos)
      throw DavError(412, "If-Match: the file has changed (its ETag differs)");
    const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
    std::uint64_t from = 0, length = size;
    r.status = 200;
    const std::string range = trimmed(header(req, "range"));
    const std::string if_range = trimmed(header(req, "if-range"));
    if (range.rfind("bytes=", 0) == 0 && range.find(',') == std::string::npos && (if_range.empty() || if_range == etag)) {
      const std::string spec = range.substr(6);
      const auto dash = spec.find('-');
      std::uint64_t a = 0, b = 0;
      bool ok = dash != std::string::npos;
      const std::string first = ok ? spec.substr(0, dash) : "", last = ok ? spec.substr(dash + 1) : "";
      auto num = [](const std::string& s, std::uint64_t& v) {
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        return !s.empty() && ec == std::errc() && p == s.data() + s.size();
      };
      if (ok && first.empty()) {  // the last N bytes
        ok = num(last, b) && b > 0;
        if (ok) {
          from = size > b ? size - b : 0;
          length = size - from;
        }
      } else if (ok) {
        ok = num(first, a) && (last.empty() || (num(last, b) && b >= a));
        if (ok) {
          if (a >= size) {
            StreamResponse bad = text(416, fmt::format("range {} is outside the file ({} bytes)", range, size));
            bad.headers.emplace_back("Content-Range", fmt::format("bytes */{}", size));
            return bad;
          }
          from = a;
          const std::uint64_t end = last.empty() ? size - 1 : std::min(b, size - 1);
          length = end - from + 1;
        }
      }
      if (ok && size > 0) {
        r.status = 206;
        r.headers.emplace_back("Content-Range", fmt::format("bytes {}-{}/{}", from, from + length - 1, size));
      } else {
        from = 0;
        length = size;
      }
    }
    r.file = std::move(fd);
    r.file_offset = from;
    r.file_length = length;
    r.head = head;
    return r;
  }

  StreamResponse listing_page(const Target& t) const {
    std::string html = fmt::format("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title></head><body><h1>{}</h1><ul>\n",
                                   xml::escape(t.path), xml::escape(t.path));
    for (const auto& [c, st] : children(t)) {
      const bool dir = S_ISDIR(st.st_mode);
      html += fmt::format("<li><a href=\"{}\">{}{}</a>{}</li>\n", xml::escape(href(c, dir)), xml::escape(c.name), dir ? "/" : "",
                          dir ? std::string() : fmt::format(" ({} bytes)", st.st_size));
    }
    html += "</ul></body></html>\n";
    StreamResponse r;
    r.status = 200;
    r.body = std::move(html);
    r.headers.emplace_back("Content-Type", "text/html; charset=utf-8");
    return r;
  }

  StreamResponse put(const HttpRequest& req, const Target& t, BodyReader& body) {
    refuse_write(t, "PUT");
    if (t.rel.empty()) throw DavError(405, fmt::format("{} is a folder; PUT writes files", t.path));
    if (!header(req, "content-range").empty()) throw DavError(400, "PUT with Content-Range (a partial write) is not supported");
    const auto st = stat_path(*t.tree, t.rel, true);
    if (st && S_ISDIR(st->st_mode)) throw DavError(405, fmt::format("{} is a folder; PUT writes files", t.path));
    check_http_preconditions(req, st);
    const auto submitted = check_conditions(req, t, true, false);
    if (!st) check_membership(t, submitted);
    const bool created = write_file(*t.tree, t.rel, [&](char* buf, std::size_t n) { return read_body(body, buf, n); });
    StreamResponse r;
    r.status = created ? 201 : 204;
    if (auto now = stat_path(*t.tree, t.rel)) r.headers.emplace_back("ETag", etag_of(*now));
    return r;
  }

  StreamResponse mkcol(const HttpRequest& req, const Target& t) {
    refuse_write(t, "MKCOL");
    if (has_body(req)) throw DavError(415, "MKCOL with a body is not supported (send none)");
    if (t.rel.empty() || stat_path(*t.tree, t.rel)) throw DavError(405, fmt::format("{} already exists", t.path));
    check_membership(t, check_conditions(req, t, true, false));
    make_dir(*t.tree, t.rel);
    props.remove_tree(t.path);
    StreamResponse r;
    r.status = 201;
    return r;
  }

  StreamResponse remove(const HttpRequest& req, const Target& t) {
    refuse_write(t, "DELETE");
    if (t.rel.empty()) throw DavError(403, fmt::format("{} is a mount point and cannot be deleted", t.path));
    const auto st = stat_path(*t.tree, t.rel);
    if (!st) throw DavError(404, fmt::format("{} does not exist", t.path));
    check_http_preconditions(req, st);
    check_membership(t, check_conditions(req, t, true, true));
    remove_path(*t.tree, t.rel);
    props.remove_tree(t.path);
    locks.remove_below(t.path);
    StreamResponse r;
    r.status = 204;
    return r;
  }

  StreamResponse copy_or_move(const HttpRequest& req, const Target& t, bool move, Target& dest_out) {
    const std::string destination = header(req, "destination");
    if (destination.empty()) throw DavError(400, "COPY and MOVE need a Destination header");
    Target dest;
    try {
      dest = locate(url_path(destination));
    } catch (const DavError& e) {
      if (e.status() == 404) throw DavError(409, fmt::format("Destination: {}", e.what()));
      throw;
    }
    dest_out = dest;
    if (move) refuse_write(t, "MOVE");
    refuse_write(dest, move ? "MOVE" : "COPY");
    if (t.kind != Target::Kind::tree) throw DavError(403, "this collection cannot be copied");
    if (t.rel.empty() && move) throw DavError(403, fmt::format("{} is a mount point and cannot be moved", t.path));
    if (dest.rel.empty()) throw DavError(403, fmt::format("{} is a mount point and cannot be replaced", dest.path));
    const auto st = stat_path(*t.tree, t.rel);
    if (!st) throw DavError(404, fmt::format("{} does not exist", t.path));
    if (dest.path == t.path) throw DavError(403, "the source and the destination are the same");
    if (dest.path.rfind(t.path + "/", 0) == 0) throw DavError(409, "the destination is inside the source");
    const std::string depth = trimmed(header(req, "depth"));
    bool recursive = true;
    if (depth == "0") recursive = false;
    else if (!depth.empty() && depth != "infinity") throw DavError(400, fmt::format("Depth '{}' is not allowed here (0 or infinity)", depth));
    if (move && !recursive && S_ISDIR(st->st_mode)) throw DavError(400, "MOVE of a collection needs Depth: infinity");
    const std::string overwrite = trimmed(header(req, "overwrite"));
    if (!overwrite.empty() && overwrite != "T" && overwrite != "F") throw DavError(400, "Overwrite must be T or F");
    const auto submitted = check_conditions(req, t, move, move);
    if (move) check_membership(t, submitted);
    const auto dst_st = stat_path(*dest.tree, dest.rel, true);
    if (dst_st) {
      if (overwrite == "F") throw DavError(412, fmt::format("{} exists and Overwrite is F", dest.path));
      check_conditions(req, dest, true, true);
      remove_path(*dest.tree, dest.rel);
      props.remove_tree(dest.path);
      locks.remove_below(dest.path);
    } else {
      check_membership(dest, check_conditions(req, dest, true, false));
    }
    if (move) {
      move_path(*t.tree, t.rel, *dest.tree, dest.rel);
      props.move_tree(t.path, dest.path);
      locks.remove_below(t.path);
    } else {
      copy_path(*t.tree, t.rel, *dest.tree, dest.rel, recursive);
      if (recursive) props.copy_tree(t.path, dest.path);
      else props.apply(dest.path, [&] {
        std::vector<PropChange> changes;
        for (DeadProperty& d : props.get(t.path)) changes.push_back({false, std::move(d)});
        return changes;
      }());
    }
    StreamResponse r;
    r.status = dst_st ? 204 : 201;
    return r;
  }

  StreamResponse propfind(const HttpRequest& req, const Target& t, BodyReader& body) {
    const std::string depth = trimmed(header(req, "depth"));
    if (depth == "infinity" || depth == "Infinity") {
      StreamResponse r = xml_response(403, std::string(kXmlHead) + "<D:error xmlns:D=\"DAV:\"><D:propfind-finite-depth/></D:error>\n");
      return r;
    }
    if (!depth.empty() && depth != "0" && depth != "1") throw DavError(400, fmt::format("Depth '{}' is not valid (0, 1)", depth));
    PropMode mode = PropMode::allprop;
    std::vector<xml::Name> wanted;
    const std::string xml_body = read_xml_body(body);
    if (!trimmed(xml_body).empty()) {
      auto doc = parse_xml(xml_body);
      if (!doc->is(kDav, "propfind")) throw DavError(400, "the PROPFIND body must be a DAV:propfind element");
      if (const xml::Element* p = doc->find(kDav, "prop")) {
        mode = PropMode::prop;
        for (const auto& c : p->children) wanted.push_back(c->name);
      } else if (doc->find(kDav, "propname")) {
        mode = PropMode::propname;
      } else if (doc->find(kDav, "allprop")) {
        if (const xml::Element* inc = doc->find(kDav, "include"))
          for (const auto& c : inc->children) wanted.push_back(c->name);
      } else {
        throw DavError(400, "the PROPFIND body names no prop, propname or allprop");
      }
    }
    const auto st = stat_of(t);
    if (!st) throw DavError(404, fmt::format("{} does not exist", t.path));
    std::string out = std::string(kXmlHead) + "<D:multistatus xmlns:D=\"DAV:\">\n";
    propfind_response(out, t, *st, mode, wanted);
    if (depth != "0" && S_ISDIR(st->st_mode)) {
      const auto members = children(t);
      std::map<std::string, std::vector<DeadProperty>> dead;
      if (t.kind == Target::Kind::tree) dead = props.get_members(t.path);
      static const std::vector<DeadProperty> kNone;
      out.reserve(out.size() + members.size() * 512);
      for (const auto& [c, cst] : members) {
        auto it = dead.find(c.path);
        propfind_response(out, c, cst, mode, wanted, it == dead.end() ? &kNone : &it->second);
      }
    }
    out += "</D:multistatus>\n";
    return xml_response(207, std::move(out));
  }

  StreamResponse proppatch(const HttpRequest& req, const Target& t, BodyReader& body) {
    refuse_write(t, "PROPPATCH");
    const auto st = stat_path(*t.tree, t.rel);
    if (!st) throw DavError(404, fmt::format("{} does not exist", t.path));
    check_conditions(req, t, true, false);
    auto doc = parse_xml(read_xml_body(body));
    if (!doc->is(kDav, "propertyupdate")) throw DavError(400, "the PROPPATCH body must be a DAV:propertyupdate element");
    std::vector<PropChange> changes;
    for (const auto& op : doc->children) {
      const bool remove = op->is(kDav, "remove");
      if (!remove && !op->is(kDav, "set")) continue;
      const xml::Element* p = op->find(kDav, "prop");
      if (!p) throw DavError(400, "a set or remove without a DAV:prop");
      for (const auto& c : p->children) {
        DeadProperty d{c->name, remove ? std::string() : xml::inner_xml(*c), c->lang};
        changes.push_back({remove, std::move(d)});
      }
    }
    bool refused = false;
    for (const PropChange& c : changes)
      if (c.property.name.ns == kDav && kLiveProps.count(c.property.name.local)) refused = true;
    std::string out = std::string(kXmlHead) + "<D:multistatus xmlns:D=\"DAV:\">\n<D:response><D:href>" +
                      xml::escape(href(t, S_ISDIR(st->st_mode))) + "</D:href>";
    for (const PropChange& c : changes) {
      const bool live = c.property.name.ns == kDav && kLiveProps.count(c.property.name.local);
      const int status = !refused ? 200 : live ? 403 : 424;
      out += "<D:propstat><D:prop>" + xml::element_xml(c.property.name, "") + "</D:prop><D:status>" + status_line(status) +
             "</D:status></D:propstat>";
    }
    out += "</D:response>\n</D:multistatus>\n";
    if (!refused) props.apply(t.path, changes);
    return xml_response(207, std::move(out));
  }

  StreamResponse lock(const HttpRequest& req, const Target& t, BodyReader& body, bool& created) {
    refuse_write(t, "LOCK");
    const auto timeout = parse_timeout(header(req, "timeout"), kDefaultLockTimeout, kMaxLockTimeout);
    const std::string xml_body = read_xml_body(body);
    if (trimmed(xml_body).empty()) {
      // A refresh: the lock named in the If header.
      const std::string raw_if = header(req, "if");
      if (raw_if.empty()) throw DavError(400, "a LOCK without a body refreshes a lock: name it in the If header");
      std::vector<IfList> lists;
      try {
        lists = parse_if_header(raw_if);
      } catch (const std::invalid_argument& e) {
        throw DavError(400, e.what());
      }
      for (const std::string& token : submitted_tokens(lists))
        if (auto l = locks.refresh(token, t.path, timeout))
          return xml_response(200, std::string(kXmlHead) + "<D:prop xmlns:D=\"DAV:\"><D:lockdiscovery>" + active_lock_xml(*l) +
                                       "</D:lockdiscovery></D:prop>\n");
      throw DavError(412, "no lock named in the If header covers this resource");
    }
    auto doc = parse_xml(xml_body);
    if (!doc->is(kDav, "lockinfo")) throw DavError(400, "the LOCK body must be a DAV:lockinfo element");
    const xml::Element* scope = doc->find(kDav, "lockscope");
    const xml::Element* type = doc->find(kDav, "locktype");
    if (!scope || !type || !type->find(kDav, "write")) throw DavError(400, "lockinfo needs a lockscope and a write locktype");
    const bool exclusive = scope->find(kDav, "exclusive") != nullptr;
    if (!exclusive && !scope->find(kDav, "shared")) throw DavError(400, "lockscope must be exclusive or shared");
    std::string owner;
    if (const xml::Element* o = doc->find(kDav, "owner")) owner = xml::inner_xml(*o);
    const std::string depth = trimmed(header(req, "depth"));
    if (!depth.empty() && depth != "0" && depth != "infinity") throw DavError(400, "Depth of a LOCK is 0 or infinity");
    const bool infinite = depth != "0";
    check_conditions(req, t, false, false);
    auto st = stat_path(*t.tree, t.rel, true);
    auto l = locks.acquire(t.path, exclusive, infinite, owner, timeout);
    if (!l) throw DavError(423, fmt::format("{} is already locked", t.path));
    if (!st) {
      try {
        created = create_empty(*t.tree, t.rel);
      } catch (...) {
        locks.release(l->token, t.path);
        throw;
      }
    }
    StreamResponse r = xml_response(created ? 201 : 200, std::string(kXmlHead) + "<D:prop xmlns:D=\"DAV:\"><D:lockdiscovery>" +
                                                             active_lock_xml(*l) + "</D:lockdiscovery></D:prop>\n");
    r.headers.emplace_back("Lock-Token", "<" + l->token + ">");
    return r;
  }

  StreamResponse unlock(const HttpRequest& req, const Target& t) {
    std::string token = trimmed(header(req, "lock-token"));
    if (token.size() < 2 || token.front() != '<' || token.back() != '>') throw DavError(400, "UNLOCK needs a Lock-Token: <token> header");
    token = token.substr(1, token.size() - 2);
    if (!locks.release(token, t.path)) throw DavError(409, "that lock token does not lock this resource");
    StreamResponse r;
    r.status = 204;
    return r;
  }

  // ---- the request --------------------------------------------------------------------------

  void audit(const Target& t, const std::string& method, int status, const Target* dest) const {
    if (!t.instance) return;
    nlohmann::json fields = {{"method", method}, {"path", t.path}, {"status", status}};
    if (dest) fields["destination"] = dest->path;
    try {
      store.audit(*t.instance, "dav.write", "dav", fields);
    } catch (const std::exception& e) {
      log::warn("dav: audit of {} {} failed: {}", method, t.path, e.what());
    }
  }

  StreamResponse handle(const HttpRequest& req, BodyReader& body) {
    const std::string& m = req.method;
    const std::string raw = url_path(req.target);
    if (m == "OPTIONS" && (raw == "/" || raw == "*")) return options(nullptr);
    if (req.target.find('#') != std::string::npos) {
      StreamResponse bad = text(400, "a fragment (#...) is not part of a request URI; encode '#' in names as %23");
      bad.head = m == "HEAD";
      return bad;
    }
    std::optional<Target> target;
    Target dest;
    bool created = false;
    const bool writes = m == "PUT" || m == "DELETE" || m == "MKCOL" || m == "COPY" || m == "MOVE" || m == "PROPPATCH";
    StreamResponse r;
    try {
      target = locate(raw);
      const Target& t = *target;
      if (m == "OPTIONS") r = options(&t);
      else if (m == "GET" || m == "HEAD") r = get(req, t, m == "HEAD");
      else if (m == "PUT") r = put(req, t, body);
      else if (m == "MKCOL") r = mkcol(req, t);
      else if (m == "DELETE") r = remove(req, t);
      else if (m == "COPY") r = copy_or_move(req, t, false, dest);
      else if (m == "MOVE") r = copy_or_move(req, t, true, dest);
      else if (m == "PROPFIND") r = propfind(req, t, body);
      else if (m == "PROPPATCH") r = proppatch(req, t, body);
      else if (m == "LOCK") r = lock(req, t, body, created);
      else if (m == "UNLOCK") r = unlock(req, t);
      else {
        r = text(405, fmt::format("method {} is not supported by WebDAV here; allowed: {}", m, kAllow));
        r.headers.emplace_back("Allow", kAllow);
      }
    } catch (const DavError& e) {
      r = text(e.status(), e.what());
      if (e.status() == 405) r.headers.emplace_back("Allow", kAllow);
    } catch (const std::exception& e) {
      r = text(body.too_large() ? 413 : 500, e.what());
    }
    if (target && (writes || created)) audit(*target, m, r.status, dest.path.empty() ? nullptr : &dest);
    if (target && dest.instance && (!target->instance || dest.instance->id != target->instance->id))
      audit(dest, m, r.status, &dest);
    r.head = r.head || m == "HEAD";
    return r;
  }
};

DavHandler::DavHandler(const instances::Service& instances, DavSettings settings)
    : impl_(std::make_unique<Impl>(instances, std::move(settings))) {}

DavHandler::~DavHandler() = default;

StreamResponse DavHandler::handle(const HttpRequest& request, BodyReader& body) { return impl_->handle(request, body); }

DavSettings DavHandler::settings_from(const config::Config& config) {
  DavSettings s;
  s.extras = config.dav.extras;
  s.props_file = config.server.state_dir / "dav-properties.sqlite";
  return s;
}

transport::StreamRoute make_route(std::shared_ptr<DavHandler> handler, std::uint64_t max_upload_bytes) {
  transport::StreamRoute route;
  route.prefix = "/dav";
  route.max_body_bytes = max_upload_bytes;
  route.answers_root_options = true;
  route.handler = [handler](const HttpRequest& request, BodyReader& body) { return handler->handle(request, body); };
  return route;
}

}  // namespace nshpc::dav
