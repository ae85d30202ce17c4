// The dashboard's JSON API (docs/api.md): one StreamRoute for /api (uploads streamed, downloads
// sent with sendfile), the live streams (live.hpp) and the activity (activity.hpp). Every
// operation goes through the instances service as the MCP tools do; this file only reads the
// request, calls it and words the answer for HTTP.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "dashboard/activity.hpp"
#include "dashboard/assets.hpp"
#include "dashboard/dashboard.hpp"
#include "dashboard/live.hpp"
#include "dashboard/relays.hpp"
#include "files/resolver.hpp"
#include "instances/desktops.hpp"
#include "instances/snapshots.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/cgroups.hpp"

namespace nshpc::dashboard {

namespace {

using json = nlohmann::json;

constexpr std::size_t kMaxJsonBody = 1 << 20;
constexpr std::size_t kMaxListEntries = 10000;
constexpr auto kJobsStale = std::chrono::seconds(5);
constexpr auto kDiskStale = std::chrono::seconds(60);
constexpr std::size_t kMaxQueued = 4096;
const char* const kCsp = "default-src 'none'; frame-ancestors 'none'";

// An answer other than 2xx, said to the caller as {"error": message}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string allow = {})
      : std::runtime_error(std::move(message)), status(status), allow(std::move(allow)) {}
  int status;
  std::string allow;  // 405: the methods allowed
};

// ---- Requests ----------------------------------------------------------------------------------

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding of a URL part ('+' is a space in a query); a NUL or a broken escape is refused.
std::string url_decode(std::string_view s, bool query) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) throw ApiError(400, "a %-escape in the URL is cut short");
      const int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
      if (hi < 0 || lo < 0) throw ApiError(400, "the URL has a malformed %-escape");
      const char c = static_cast<char>(hi * 16 + lo);
      if (c == '\0') throw ApiError(400, "the URL holds a NUL byte");
      out += c;
      i += 2;
    } else {
      out += query && s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

struct Request {
  const transport::HttpRequest& http;
  transport::BodyReader& body;
  std::vector<std::string> segs;  // the path after /api, decoded
  std::map<std::string, std::string> query;
  std::string actor;

  std::string q(const std::string& name, std::string fallback = {}) const {
    auto it = query.find(name);
    return it == query.end() ? fallback : it->second;
  }
  std::size_t q_number(const std::string& name, std::size_t fallback, std::size_t max) const {
    auto it = query.find(name);
    if (it == query.end() || it->second.empty()) return fallback;
    std::size_t v = 0;
    auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
    if (ec != std::errc() || end != it->second.data() + it->second.size())
      throw ApiError(400, fmt::format("{} must be a whole number, not {:?}", name, text::truncate_utf8(it->second, 40)));
    return std::min(v, max);
  }
};

Request parse_request(const transport::HttpRequest& http, transport::BodyReader& body) {
  Request r{http, body, {}, {}, "dashboard (" + http.peer + ")"};
  std::string_view target = http.target;
  std::string_view query;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    query = target.substr(q + 1);
    target = target.substr(0, q);
  }
  for (std::string_view part : text::split(target, '/'))
    if (!part.empty()) r.segs.push_back(url_decode(part, false));
  if (!r.segs.empty() && r.segs.front() == "api") r.segs.erase(r.segs.begin());
  for (std::string_view pair : text::split(query, '&')) {
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    r.query[url_decode(pair.substr(0, eq), true)] = eq == std::string_view::npos ? "" : url_decode(pair.substr(eq + 1), true);
  }
  return r;
}

// The request's JSON object, with only the `allowed` members; an empty body is {}.
json json_body(Request& r, std::initializer_list<const char*> allowed) {
  std::string text;
  char buf[16384];
  for (;;) {
    const std::size_t n = r.body.read(buf, sizeof buf);
    if (n == 0) break;
    text.append(buf, n);
    if (text.size() > kMaxJsonBody) throw ApiError(413, fmt::format("the request body is over {} bytes", kMaxJsonBody));
  }
  if (text::trim(text).empty()) return json::object();
  json body = parse_json_or_discarded(text);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON; send a JSON object");
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it)
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; }) == allowed.end()) {
      std::string names;
      for (const char* a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
      throw ApiError(400, fmt::format("unknown field {:?}; this request takes: {}", text::truncate_utf8(it.key(), 60),
                                      names.empty() ? "no fields" : names));
    }
  return body;
}

template <class T>
std::optional<T> member(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) throw ApiError(400, fmt::format("{} must be a string", name));
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) throw ApiError(400, fmt::format("{} must be true or false", name));
  } else {
    if (!it->is_number_integer()) throw ApiError(400, fmt::format("{} must be a whole number", name));
  }
  return it->get<T>();
}

// ---- Answers -----------------------------------------------------------------------------------

transport::StreamResponse answer(int status, const json& body) {
  transport::StreamResponse res;
  res.status = status;
  res.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  res.headers.emplace_back("Content-Type", "application/json");
  return res;
}

transport::StreamResponse error_answer(int status, std::string_view message, const std::string& allow = {}) {
  transport::StreamResponse res = answer(status, json{{"error", text::sanitize_utf8(message)}});
  if (!allow.empty()) res.headers.emplace_back("Allow", allow);
  return res;
}

// A file operation's errno in the words of the API.
[[noreturn]] void file_failure(const SysError& e, const std::string& shown) {
  switch (e.code()) {
    case ENOENT: throw ApiError(404, fmt::format("{} does not exist", shown));
    case ENOTDIR: throw ApiError(409, fmt::format("a part of {} is not a folder", shown));
    case EISDIR: throw ApiError(409, fmt::format("{} is a folder", shown));
    case EEXIST: throw ApiError(409, fmt::format("{} already exists", shown));
    case ENOTEMPTY: throw ApiError(409, fmt::format("{} is a folder that is not empty", shown));
    case ELOOP:
    case EXDEV: throw ApiError(403, fmt::format("{} leads outside the instance's files (a link); refused", shown));
    case EPERM:
    case EACCES: throw ApiError(403, fmt::format("{}: permission denied (the instance's own user may not do this)", shown));
    case EROFS: throw ApiError(403, fmt::format("{} is read-only", shown));
    case EBUSY: throw ApiError(403, fmt::format("{} is a mount point of the sandbox and cannot be removed", shown));
    case ENXIO: throw ApiError(409, fmt::format("{} is not a regular file or folder", shown));
    case ENOSPC:
    case EDQUOT: throw ApiError(507, fmt::format("{}: no space left on the server's disk", shown));
    case ENAMETOOLONG: throw ApiError(400, fmt::format("{}: a name is too long", shown));
    default: throw ApiError(500, e.what());
  }
}

// ---- Measurements kept between requests -------------------------------------------------------

// cpu_percent needs the last look at each instance's group; disk use and running jobs are
// measured by one background worker (a tree walk is slow) and kept with their time.
class Measures {
 public:
  struct Counted {
    std::optional<std::uint64_t> disk_bytes;
    std::chrono::steady_clock::time_point disk_at{};
    std::optional<std::size_t> jobs_running;
    std::chrono::steady_clock::time_point jobs_at{};
  };

  explicit Measures(instances::Service& service) : service_(service) {}
  ~Measures() {
    worker_.request_stop();
    wake_.notify_all();
  }

  std::optional<double> cpu(const std::string& id, std::uint64_t usec) {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mutex_);
    auto [it, fresh] = cpu_.try_emplace(id, Look{usec, now});
    if (fresh) return std::nullopt;
    std::optional<double> pct = cpu_percent(it->second.usec, it->second.at, usec, now);
    // A look a moment after the last says little: kept until a later one spans more time.
    if (now - it->second.at >= std::chrono::milliseconds(500) || !pct) it->second = Look{usec, now};
    return pct;
  }

  // What is known of `id`, and a new measurement asked for when it is stale.
  Counted counted(const std::string& id) {
    std::lock_guard lock(mutex_);
    Counted c = counted_[id];
    const auto now = std::chrono::steady_clock::now();
    if ((!c.jobs_running || now - c.jobs_at > kJobsStale || !c.disk_bytes || now - c.disk_at > kDiskStale) &&
        queued_.size() < kMaxQueued && queued_.insert(id).second) {
      queue_.push_back(id);
      if (!worker_.joinable()) worker_ = std::jthread([this](std::stop_token stop) { run(stop); });
      wake_.notify_all();
    }
    return c;
  }

  void note(const std::string& id, std::optional<std::uint64_t> disk, std::optional<std::size_t> jobs_running) {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    Counted& c = counted_[id];
    if (disk) c.disk_bytes = disk, c.disk_at = now;
    if (jobs_running) c.jobs_running = jobs_running, c.jobs_at = now;
  }

  void forget(const std::string& id) {
    std::lock_guard lock(mutex_);
    counted_.erase(id);
    cpu_.erase(id);
  }

 private:
  struct Look {
    std::uint64_t usec;
    std::chrono::steady_clock::time_point at;
  };
  void run(std::stop_token stop) {
    std::unique_lock lock(mutex_);
    while (!stop.stop_requested()) {
      if (queue_.empty()) {
        wake_.wait(lock, stop, [this] { return !queue_.empty(); });
        continue;
      }
      const std::string id = queue_.front();
      queue_.pop_front();
      queued_.erase(id);
      const Counted before = counted_[id];
      lock.unlock();
      const auto now = std::chrono::steady_clock::now();
      try {
        const store::Instance inst = service_.store().get(id);
        const std::size_t jobs_running = service_.jobs().active_jobs(inst.base);
        std::optional<std::uint64_t> disk;
        if (!before.disk_bytes || now - before.disk_at > kDiskStale) {
          const instances::Service::DiskUse use = service_.disk_use(inst);
          disk = use.workspace_bytes + use.output_bytes + use.layer_bytes + use.snapshots_bytes;
        }
        note(id, disk, jobs_running);
      } catch (const std::exception& e) {
        log::debug("dashboard: {} not measured: {}", id, e.what());
      }
      lock.lock();
    }
  }

  instances::Service& service_;
  std::mutex mutex_;
  std::map<std::string, Look> cpu_;
  std::map<std::string, Counted> counted_;
  std::deque<std::string> queue_;
  std::set<std::string> queued_;
  std::condition_variable_any wake_;
  std::jthread worker_;  // last
};

// ---- The API -----------------------------------------------------------------------------------

class Api {
 public:
  Api(instances::Service& service, Settings settings)
      : service_(service),
        config_(service.config()),
        settings_(std::move(settings)),
        activity_(Activity::Options{.root = service.store().root(), .token = settings_.token}),
        live_(service, activity_),
        trash_(std::make_shared<instances::Trash>(/*finish_on_exit=*/false)),
        measures_(service),
        started_at_(timeutil::iso_utc()) {}

  transport::StreamResponse handle(const transport::HttpRequest& http, transport::BodyReader& body) {
    transport::StreamResponse res;
    try {
      Request r = parse_request(http, body);
      res = route(r);
    } catch (const ApiError& e) {
      res = error_answer(e.status, e.what(), e.allow);
    } catch (const NotFound& e) {
      res = error_answer(404, e.what());
    } catch (const NeedsAction& e) {
      res = error_answer(409, e.what());
    } catch (const UsageError& e) {
      res = error_answer(400, e.what());
    } catch (const SysError& e) {
      res = error_answer(body.too_large() ? 413 : 500, e.what());
    } catch (const std::exception& e) {
      res = error_answer(body.too_large() ? 413 : 500, e.what());
    }
    // Never kept by a cache, never framed, nothing loaded from anywhere: it is data.
    res.headers.emplace_back("Cache-Control", "no-store");
    res.headers.emplace_back("Content-Security-Policy", kCsp);
    res.head = http.method == "HEAD";
    return res;
  }

  transport::HttpResponse open_events(const transport::HttpRequest& http, std::shared_ptr<transport::EventSink> sink) {
    return stream_answer(http, [&](Request& r) {
      if (r.segs != std::vector<std::string>{"events"}) throw ApiError(404, "not found");
      const std::string instance = r.q("instance");
      if (!instance.empty()) service_.store().get(instance);  // 404 for an unknown one
      std::optional<std::uint64_t> after;
      if (auto it = http.headers.find("last-event-id"); it != http.headers.end()) {
        std::uint64_t v = 0;
        auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
        if (ec == std::errc() && end == it->second.data() + it->second.size()) after = v;
      }
      live_.watch(std::move(sink), instance, after);
    });
  }

  transport::HttpResponse open_job_output(const transport::HttpRequest& http, std::shared_ptr<transport::EventSink> sink) {
    return stream_answer(http, [&](Request& r) {
      // /api/jobs/{instance}/{job}/output
      if (r.segs.size() != 4 || r.segs[0] != "jobs" || r.segs[3] != "output")
        throw ApiError(404, "not found; a job's output is /api/jobs/{instance}/{job}/output");
      const store::Instance inst = service_.store().get(r.segs[1]);
      if (!jobs::valid_job_id(r.segs[2])) throw ApiError(404, fmt::format("no job {:?}", text::truncate_utf8(r.segs[2], 40)));
      const jobs::View v = service_.jobs().view(inst.id, r.segs[2], {0, 0});
      std::uint64_t from[2] = {0, 0};
      if (auto it = http.headers.find("last-event-id"); it != http.headers.end()) {
        // "<stdout offset>:<stderr offset>", as each output event's id says.
        const auto parts = text::split(it->second, ':');
        if (parts.size() == 2)
          for (int i = 0; i < 2; ++i) std::from_chars(parts[i].data(), parts[i].data() + parts[i].size(), from[i]);
      }
      live_.follow_job(std::move(sink), inst, v.record, from[0], from[1]);
    });
  }

 private:
  // An event stream's opening: 200 once `open` has taken the sink, else the error as JSON.
  template <class F>
  transport::HttpResponse stream_answer(const transport::HttpRequest& http, F&& open) {
    transport::HttpResponse res;
    struct NoBody : transport::BodyReader {
      std::size_t read(char*, std::size_t) override { return 0; }
      bool too_large() const override { return false; }
    } none;
    int status = 200;
    std::string message;
    try {
      Request r = parse_request(http, none);
      open(r);
    } catch (const ApiError& e) {
      status = e.status, message = e.what();
    } catch (const NotFound& e) {
      status = 404, message = e.what();
    } catch (const UsageError& e) {
      status = 400, message = e.what();
    } catch (const std::exception& e) {
      status = 500, message = e.what();
    }
    res.status = status;
    res.headers["Cache-Control"] = "no-store";
    res.headers["Content-Security-Policy"] = kCsp;
    if (status != 200) {
      res.headers["Content-Type"] = "application/json";
      res.body = json{{"error", text::sanitize_utf8(message)}}.dump();
    }
    return res;
  }

  static void method(const Request& r, std::initializer_list<const char*> allowed) {
    for (const char* m : allowed)
      if (r.http.method == m || (std::string_view(m) == "GET" && r.http.method == "HEAD")) return;
    std::string allow;
    for (const char* m : allowed) allow += (allow.empty() ? "" : ", ") + std::string(m);
    throw ApiError(405, fmt::format("{} is not allowed here; allowed: {}", text::truncate_utf8(r.http.method, 20), allow), allow);
  }

  transport::StreamResponse route(Request& r) {
    const auto& s = r.segs;
    if (s.empty()) throw ApiError(404, "not found; the API is described in docs/api.md (/api/server, /api/instances, ...)");
    if (s[0] == "server" && s.size() == 1) return method(r, {"GET"}), answer(200, server());
    if (s[0] == "server" && s.size() == 2 && s[1] == "doctor") return method(r, {"POST"}), doctor(r);
    if (s[0] == "activity" && s.size() == 1) return method(r, {"GET"}), activity(r);
    if (s[0] == "instances") {
      if (s.size() == 1) {
        method(r, {"GET", "POST"});
        return r.http.method == "POST" ? create(r) : answer(200, list(r));
      }
      const store::Instance inst = instance(s[1]);
      if (s.size() == 2) {
        method(r, {"GET", "DELETE"});
        if (r.http.method == "DELETE") {
          service_.remove(inst.id, r.actor);
          measures_.forget(inst.id);
          return answer(200, json{{"deleted", inst.id}});
        }
        return answer(200, detail(inst));
      }
      return instance_route(r, inst);
    }
    throw ApiError(404, fmt::format("not found: /api/{}", text::truncate_utf8(s[0], 60)));
  }

  transport::StreamResponse instance_route(Request& r, const store::Instance& inst) {
    const auto& s = r.segs;
    const std::string& what = s[2];
    if (s.size() == 3 && (what == "start" || what == "stop" || what == "restart")) {
      method(r, {"POST"});
      json_body(r, {});
      if (!inst.persistent)
        throw ApiError(409, fmt::format("instance '{}' is not persistent: each command runs in a fresh sandbox, so "
                                        "there is no living sandbox to {} (make it persistent first)",
                                        inst.id, what));
      json out = json::object();
      if (what == "start") {
        out = instances::state_json(service_.start(inst, r.actor));
      } else {
        const instances::Ended ended = what == "stop" ? service_.stop(inst, r.actor) : service_.restart(inst, r.actor);
        out = instances::state_json(ended.status);
        out["was_running"] = ended.was_running;
        json jobs_ended = json::array();
        for (const jobs::Record& j : ended.jobs) jobs_ended.push_back(jobs::record_summary_json(j));
        out["jobs_ended"] = std::move(jobs_ended);
        out["problems"] = ended.problems;
      }
      out["instance_id"] = inst.id;
      return answer(200, out);
    }
    if (s.size() == 3 && what == "network") {
      method(r, {"PUT"});
      const json body = json_body(r, {"mode", "allow"});
      const auto mode = member<std::string>(body, "mode");
      if (!mode) throw ApiError(400, "give mode: \"off\", \"nat\", \"filtered\" or \"host\"");
      store::UpdateOptions options;
      options.network = config::parse_network(*mode);
      if (!options.network || *mode == "auto")
        throw ApiError(400, fmt::format("unknown network mode {:?}; use off, nat, filtered or host", text::truncate_utf8(*mode, 40)));
      if (auto it = body.find("allow"); it != body.end()) {
        if (!it->is_array()) throw ApiError(400, "allow must be a list of host names");
        std::vector<std::string> allow;
        for (const json& e : *it) {
          if (!e.is_string()) throw ApiError(400, "allow must be a list of host names");
          allow.push_back(e.get<std::string>());
        }
        options.network_allow = std::move(allow);
      }
      const store::Instance after = service_.update(inst.id, options, r.actor);
      const auto applied = service_.apply_network(after, r.actor);
      json out = instance_view(after);
      out["applied"] = applied == instances::Service::NetworkChange::applied     ? "applied"
                       : applied == instances::Service::NetworkChange::restarted ? "restarted"
                                                                                 : "not_running";
      return answer(200, out);
    }
    if (s.size() == 3 && what == "desktop") {
      method(r, {"PUT"});
      const json body = json_body(r, {"enabled"});
      const auto on = member<bool>(body, "enabled");
      if (!on) throw ApiError(400, "give enabled: true or false");
      return in_state([&] { return answer(200, instance_view(service_.desktops().set(inst, *on, r.actor))); });
    }
    if (s.size() == 3 && what == "reset") {
      method(r, {"POST"});
      const json body = json_body(r, {"include_workspace"});
      const bool workspace = member<bool>(body, "include_workspace").value_or(false);
      if (!inst.image && !workspace)
        throw ApiError(409, fmt::format("instance '{}' runs on the host's root (read-only): it has no root of its own to "
                                        "reset; include_workspace: true empties its workspace",
                                        inst.id));
      return in_state([&] {
        instances::Snapshots snapshots(service_, *trash_);
        const instances::LayerChange change = snapshots.reset(inst, workspace, r.actor);
        return answer(200, json{{"instance_id", inst.id}, {"layer_reset", change.layer},
                                {"workspace_emptied", change.workspace}, {"restarted", change.restarted}});
      });
    }
    if (s.size() == 3 && what == "archive") {
      method(r, {"POST"});
      json_body(r, {});
      return in_state([&] {
        const store::ArchivedInstance a = service_.archive(inst.id, r.actor);
        measures_.forget(inst.id);
        return answer(200, json{{"instance_id", inst.id}, {"archive_name", a.name}, {"archived_at", a.meta.archived_at()}});
      });
    }
    if (what == "snapshots") return snapshots_route(r, inst);
    if (what == "ports") return ports_route(r, inst);
    if (what == "jobs") return jobs_route(r, inst);
    if (what == "files") return files_route(r, inst);
    throw ApiError(404, fmt::format("not found: /api/instances/{}/{}", inst.id, text::truncate_utf8(what, 60)));
  }

  // A refusal of the service on an instance that exists, for input already checked, is about the
  // instance's state (jobs still running, a command in it, a name taken): 409. NotFound stays 404.
  template <class F>
  static auto in_state(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const NotFound&) {
      throw;
    } catch (const UsageError& e) {
      throw ApiError(409, e.what());
    }
  }

  // ---- Server ----------------------------------------------------------------------------------

  json server() {
    json out = {{"version", settings_.version},
                {"entry_point", settings_.entry_point},
                {"mcp_url", settings_.http ? settings_.http->get().url : std::string()},
                {"started_at", started_at_},
                {"pid", ::getpid()},
                {"instances_dir", config_.ns.instances_dir.string()},
                {"default_image", config_.ns.default_image},
                {"doctor", static_cast<bool>(settings_.doctor)},
                {"jobs", {{"watched", service_.jobs().tracked()}}},
                {"event_streams", live_.streams()}};
    if (settings_.http) {
      const transport::HttpStatus st = settings_.http->get();
      json peers = json::array();
      for (const auto& p : st.peers)
        peers.push_back({{"peer", p.peer}, {"connections", p.connections}, {"sessions", p.sessions}, {"requests", p.requests}});
      json caps = json::object();
      for (const auto& [key, use] : st.caps) caps[key] = {use.first, use.second};
      out["http"] = {{"url", st.url},
                     {"connections", st.connections},
                     {"sessions", st.sessions},
                     {"requests", st.requests},
                     {"event_streams", st.event_streams},
                     {"browser_sessions", st.browser_sessions},
                     {"bytes_held", st.bytes_held},
                     {"peers", std::move(peers)},
                     {"caps", std::move(caps)}};
    }
    return out;
  }

  transport::StreamResponse doctor(Request& r) {
    json_body(r, {});
    if (!settings_.doctor) throw ApiError(404, "doctor is not offered by this server");
    return answer(200, settings_.doctor());
  }

  transport::StreamResponse activity(Request& r) {
    ActivityQuery q;
    q.instance = r.q("instance");
    q.session = r.q("session");
    q.kind = r.q("kind");
    if (r.query.contains("before")) q.before = r.q_number("before", 0, UINT64_MAX);
    q.limit = r.q_number("limit", 100, 500);
    if (q.limit == 0) throw ApiError(400, "limit must be 1 to 500");
    return answer(200, activity_.query(q));
  }

  // ---- Instances -------------------------------------------------------------------------------

  store::Instance instance(const std::string& id) {
    try {
      store::validate_id(id);
    } catch (const UsageError&) {
      throw ApiError(404, fmt::format("no instance {:?} (not a valid instance id)", text::truncate_utf8(id, 70)));
    }
    return service_.store().get(id);
  }

  // An Instance of docs/api.md: what the service says now, with the measurements kept here.
  json instance_view(const store::Instance& inst) {
    json out = instances::instance_json(config_, inst);
    bool running = false;
    std::optional<sandbox::LivingStatus> living;
    if (!inst.persistent) {
      out["state"] = "ephemeral";
    } else {
      try {
        living = service_.living_status(inst);
        out.update(instances::state_json(*living));
        running = living->running;
      } catch (const std::exception& e) {
        out["state"] = "unknown";
        out["state_error"] = e.what();
      }
    }
    const Measures::Counted counted = measures_.counted(inst.id);
    out["jobs_running"] = counted.jobs_running ? json(*counted.jobs_running) : json();
    out["disk_bytes"] = counted.disk_bytes ? json(*counted.disk_bytes) : json();
    out["usage"] = nullptr;
    // The instance's group exists while something of it runs (its living sandbox, its commands and jobs).
    if (running || counted.jobs_running.value_or(0) > 0) {
      try {
        if (auto u = sandbox::Cgroup::usage(service_.store().cgroup_folder(inst.id))) {
          json usage = json::object();
          if (u->memory_bytes) usage["memory_bytes"] = *u->memory_bytes;
          if (u->pids) usage["pids"] = *u->pids;
          usage["cpu_percent"] = nullptr;
          if (u->cpu_usec)
            if (auto pct = measures_.cpu(inst.id, *u->cpu_usec)) usage["cpu_percent"] = std::round(*pct * 10) / 10;
          usage["source"] = "cgroup";
          out["usage"] = std::move(usage);
        }
      } catch (const std::exception& e) {
        log::debug("dashboard: usage of {}: {}", inst.id, e.what());
      }
    }
    // Without [namespace] limits a living sandbox has no group of its own: what its processes hold
    // (their resident memory, as the living state counts it) is what there is to show.
    if (out["usage"].is_null() && living && living->running)
      out["usage"] = {{"memory_bytes", living->memory_bytes}, {"pids", living->processes}, {"cpu_percent", nullptr},
                      {"source", "processes"}};
    return out;
  }

  json list(const Request& r) {
    store::ListQuery query;
    query.filter = r.q("filter");
    const std::string sort = r.q("sort", "last_activity");
    if (sort != "last_activity" && sort != "id") throw ApiError(400, "sort must be last_activity or id");
    query.sort = sort == "id" ? store::SortBy::id : store::SortBy::last_activity;
    query.offset = r.q_number("offset", 0, SIZE_MAX);
    query.limit = r.q_number("limit", 100, 500);
    if (query.limit == 0) throw ApiError(400, "limit must be 1 to 500");
    const store::Page page = service_.store().list_page(query);
    json items = json::array();
    for (const store::Instance& inst : page.instances) items.push_back(instance_view(inst));
    json out = {{"instances", std::move(items)}, {"total", page.total}, {"offset", query.offset}, {"limit", query.limit}};
    if (!page.corrupt.empty()) {
      json skipped = json::array();
      for (const auto& bad : page.corrupt) skipped.push_back({{"id", bad.id}, {"problem", bad.problem}});
      out["skipped"] = std::move(skipped);
    }
    return out;
  }

  transport::StreamResponse create(Request& r) {
    const json body = json_body(r, {"id", "description", "network", "allow", "persistent", "image", "desktop"});
    store::CreateOptions options;
    options.description = member<std::string>(body, "description").value_or("");
    if (auto mode = member<std::string>(body, "network")) {
      options.network = config::parse_network(*mode);
      if (!options.network || *mode == "auto")
        throw ApiError(400, fmt::format("unknown network mode {:?}; use off, nat, filtered or host", text::truncate_utf8(*mode, 40)));
    }
    if (auto it = body.find("allow"); it != body.end()) {
      if (!it->is_array()) throw ApiError(400, "allow must be a list of host names");
      for (const json& e : *it) {
        if (!e.is_string()) throw ApiError(400, "allow must be a list of host names");
        options.network_allow.push_back(e.get<std::string>());
      }
    }
    options.persistent = member<bool>(body, "persistent");
    options.desktop = member<bool>(body, "desktop").value_or(false);
    if (auto image = member<std::string>(body, "image")) {
      options.image = image->empty() ? config_.ns.default_image : *image;
      if (options.image.empty()) throw ApiError(400, "image \"\" means the default image, and none is configured");
    } else if (options.desktop) {
      options.image = config_.desktop.image;  // as create_instance: a desktop comes on the desktop image
    }
    const std::string id = member<std::string>(body, "id").value_or("");
    if (!id.empty()) store::validate_id(id);
    const store::Instance inst = service_.create(id, options, r.actor);
    return answer(201, instance_view(inst));
  }

  json detail(const store::Instance& inst) {
    json out = instance_view(inst);
    out["limits"] = service_.limits(inst);
    const instances::Service::DiskUse use = service_.disk_use(inst);
    out["disk"] = {{"workspace_bytes", use.workspace_bytes}, {"output_bytes", use.output_bytes}, {"files", use.files},
                   {"layer_bytes", use.layer_bytes}, {"snapshots_bytes", use.snapshots_bytes}};
    const std::size_t running_jobs = service_.jobs().active_jobs(inst.base);
    measures_.note(inst.id, use.workspace_bytes + use.output_bytes + use.layer_bytes + use.snapshots_bytes, running_jobs);
    out["disk_bytes"] = use.workspace_bytes + use.output_bytes + use.layer_bytes + use.snapshots_bytes;
    out["jobs_running"] = running_jobs;
    if (inst.network == config::Network::filtered) {
      std::vector<std::string> allow = config_.network.allow;
      allow.insert(allow.end(), inst.network_allow.begin(), inst.network_allow.end());
      out["network_allow"] = allow;
    }
    out["ports"] = ports(inst);
    json snaps = json::array();
    instances::Snapshots snapshots(service_, *trash_);
    for (const auto& sn : snapshots.list(inst)) snaps.push_back(instances::to_json(sn));
    out["snapshots"] = std::move(snaps);
    out["executions"] = service_.executions_of(inst.id);
    json procs = json::array();
    if (out.value("state", "") == "running") {
      try {
        for (const sandbox::LivingProcess& p : service_.processes(inst))
          procs.push_back({{"pid", p.pid}, {"ppid", p.ppid}, {"command", text::sanitize_utf8(text::truncate_utf8(p.command, 500))},
                           {"rss_bytes", p.rss_bytes}, {"age_s", p.age.count()}});
      } catch (const std::exception& e) {
        out["processes_error"] = e.what();
      }
    }
    out["process_list"] = std::move(procs);
    return out;
  }

  json ports(const store::Instance& inst) {
    json list = json::array();
    for (const sandbox::ExposedPort& p : service_.exposed_ports(inst))
      list.push_back({{"port", p.port}, {"host_port", p.host_port}, {"forwarding", p.forwarding},
                      {"url", fmt::format("http://127.0.0.1:{}/", p.host_port)}});
    return list;
  }

  // ---- Snapshots and ports ---------------------------------------------------------------------

  transport::StreamResponse snapshots_route(Request& r, const store::Instance& inst) {
    const auto& s = r.segs;
    instances::Snapshots snapshots(service_, *trash_);
    if (s.size() == 3) {
      method(r, {"GET", "POST"});
      if (r.http.method == "POST") {
        const json body = json_body(r, {"name"});
        const std::string name = member<std::string>(body, "name").value_or("snap-" + timeutil::compact_utc().substr(0, 15));
        instances::validate_snapshot_name(name);
        return in_state([&] {
          const instances::LayerChange change = snapshots.take(inst, name, r.actor);
          return answer(201, json{{"instance_id", inst.id}, {"snapshot", instances::to_json(*change.snapshot)},
                                  {"restarted", change.restarted}});
        });
      }
      json items = json::array();
      for (const auto& sn : snapshots.list(inst)) items.push_back(instances::to_json(sn));
      return answer(200, json{{"snapshots", std::move(items)}});
    }
    const std::string& name = s[3];
    const auto all = snapshots.list(inst);
    if (std::none_of(all.begin(), all.end(), [&](const instances::SnapshotInfo& sn) { return sn.name == name; }))
      throw ApiError(404, fmt::format("instance '{}' has no snapshot {:?}", inst.id, text::truncate_utf8(name, 70)));
    if (s.size() == 4) {
      method(r, {"DELETE"});
      const instances::SnapshotInfo gone = in_state([&] { return snapshots.remove(inst, name, r.actor); });
      return answer(200, json{{"instance_id", inst.id}, {"deleted", gone.name}});
    }
    if (s.size() == 5 && s[4] == "restore") {
      method(r, {"POST"});
      json_body(r, {});
      const instances::LayerChange change = in_state([&] { return snapshots.restore(inst, name, r.actor); });
      return answer(200, json{{"instance_id", inst.id}, {"snapshot", instances::to_json(*change.snapshot)},
                              {"restarted", change.restarted}});
    }
    throw ApiError(404, "not found");
  }

  transport::StreamResponse ports_route(Request& r, const store::Instance& inst) {
    const auto& s = r.segs;
    if (s.size() == 3) {
      method(r, {"GET", "POST"});
      if (r.http.method == "GET") return answer(200, json{{"ports", ports(inst)}});
      const json body = json_body(r, {"port", "host_port"});
      const auto port = member<std::int64_t>(body, "port");
      const auto host_port = member<std::int64_t>(body, "host_port").value_or(0);
      if (!port || *port < 1 || *port > 65535) throw ApiError(400, "port must be 1 to 65535");
      if (host_port < 0 || host_port > 65535) throw ApiError(400, "host_port must be 0 (any free one) to 65535");
      const sandbox::ExposedPort e = in_state([&] {
        return service_.expose_port(inst, static_cast<std::uint16_t>(*port), static_cast<std::uint16_t>(host_port), r.actor);
      });
      return answer(201, json{{"port", e.port}, {"host_port", e.host_port}, {"url", fmt::format("http://127.0.0.1:{}/", e.host_port)}});
    }
    if (s.size() == 4) {
      method(r, {"DELETE"});
      std::uint16_t port = 0;
      auto [end, ec] = std::from_chars(s[3].data(), s[3].data() + s[3].size(), port);
      if (ec != std::errc() || end != s[3].data() + s[3].size() || port == 0) throw ApiError(404, "no such port");
      if (!service_.unexpose_port(inst, port, r.actor))
        throw ApiError(404, fmt::format("port {} of instance '{}' is not exposed", port, inst.id));
      return answer(200, json{{"closed", port}});
    }
    throw ApiError(404, "not found");
  }

  // ---- Jobs ------------------------------------------------------------------------------------

  transport::StreamResponse jobs_route(Request& r, const store::Instance& inst) {
    const auto& s = r.segs;
    jobs::Engine& engine = service_.jobs();
    if (s.size() == 3) {
      method(r, {"GET", "POST"});
      if (r.http.method == "GET") {
        const std::size_t limit = r.q_number("limit", 50, 500);
        json items = json::array();
        for (const jobs::Record& rec : engine.list(inst.id)) {
          if (items.size() >= limit) break;
          items.push_back(jobs::record_summary_json(rec));
        }
        return answer(200, json{{"jobs", std::move(items)}});
      }
      const json body = json_body(r, {"command", "workdir", "timeout", "mode"});
      const auto command = member<std::string>(body, "command");
      if (!command || text::trim(*command).empty()) throw ApiError(400, "give command: the shell command to run");
      jobs::SubmitRequest req = jobs::shell_job(inst.id, *command, config_.terminal.shell);
      req.cwd = member<std::string>(body, "workdir").value_or("");
      const std::string mode = member<std::string>(body, "mode").value_or("local");
      if (auto parsed = jobs::parse_mode(mode))
        req.mode = *parsed;
      else
        throw ApiError(400, fmt::format("unknown mode {:?}; use \"local\" or \"slurm\"", text::truncate_utf8(mode, 40)));
      if (auto timeout = member<std::int64_t>(body, "timeout")) {
        if (*timeout < 1) throw ApiError(400, "timeout must be at least 1 second");
        if (req.mode == jobs::Mode::slurm) throw ApiError(400, "timeout is a limit of local jobs");
        req.limits.values["time"] = *timeout;
      }
      const jobs::Record rec = engine.submit(req, r.actor);
      measures_.note(inst.id, std::nullopt, engine.active_jobs(inst.base));
      return answer(201, jobs::record_summary_json(rec));
    }
    const std::string& job = s[3];
    if (!jobs::valid_job_id(job)) throw ApiError(404, fmt::format("no job {:?} (not a job id)", text::truncate_utf8(job, 40)));
    if (s.size() == 4) {
      method(r, {"GET"});
      return answer(200, jobs::view_json(engine.view(inst.id, job, {1000, 64 * 1024})));
    }
    if (s.size() == 5 && s[4] == "cancel") {
      method(r, {"POST"});
      json_body(r, {});
      engine.cancel(inst.id, job, r.actor);
      return answer(200, jobs::view_json(engine.view(inst.id, job, {50, 16 * 1024})));
    }
    throw ApiError(404, "not found");
  }

  // ---- Files -----------------------------------------------------------------------------------

  // A path as the sandbox sees it (the query's `path`, or a body's); refused outright when it climbs ("..").
  static std::string checked_path(const std::string& path) {
    if (path.empty()) throw ApiError(400, "give path: the path inside the sandbox, e.g. /workspace/notes.txt");
    if (path.size() > files::kMaxPathBytes) throw ApiError(400, "path is longer than 4096 bytes");
    for (std::string_view part : text::split(path, '/'))
      if (part == "..") throw ApiError(400, fmt::format("path {:?} climbs with '..'; give the path itself", text::truncate_utf8(path, 200)));
    return path;
  }

  void audit_file(const store::Instance& inst, const Request& r, const char* operation, const std::string& path) {
    try {
      service_.store().audit(inst, "dashboard.files", r.actor, {{"operation", operation}, {"path", path}});
    } catch (const std::exception& e) {
      log::warn("dashboard: audit of {} {} failed: {}", operation, path, e.what());
    }
  }

  transport::StreamResponse files_route(Request& r, const store::Instance& inst) {
    const auto& s = r.segs;
    const std::string sub = s.size() >= 4 ? s[3] : "";
    if (s.size() > 4 || (s.size() == 4 && sub != "content" && sub != "folder")) throw ApiError(404, "not found");
    if (s.size() == 3) method(r, {"GET", "DELETE"});
    if (sub == "content") method(r, {"GET", "PUT"});
    if (sub == "folder") method(r, {"POST"});
    const std::string path =
        checked_path(sub == "folder" ? member<std::string>(json_body(r, {"path"}), "path").value_or("") : r.q("path"));
    // The file tools' resolver and identity (files/resolver.hpp), as WebDAV's.
    const files::InstanceFiles files(service_.file_view(inst));
    const bool reading = r.http.method == "GET" || r.http.method == "HEAD";
    const files::Location at = files.resolve(path, reading ? files::InstanceFiles::Follow::last : files::InstanceFiles::Follow::not_last);
    const std::string shown = at.shown();
    try {
      if (s.size() == 3 && reading) {
        json entries = json::array();
        const std::vector<files::Entry> listed = files::list_dir(at, kMaxListEntries + 1);
        const bool truncated = listed.size() > kMaxListEntries;  // one more than shown: there are more
        for (const files::Entry& e : listed) {
          if (entries.size() == kMaxListEntries) break;
          entries.push_back({{"name", text::sanitize_utf8(e.name)},
                             {"type", e.type == files::EntryType::directory ? "dir"
                                      : e.type == files::EntryType::file    ? "file"
                                      : e.type == files::EntryType::symlink ? "link"
                                                                            : "other"},
                             {"size", e.size},
                             {"modified", timeutil::iso_utc(timeutil::Clock::time_point(
                                              std::chrono::duration_cast<timeutil::Clock::duration>(std::chrono::nanoseconds(e.mtime_ns))))}});
        }
        std::sort(entries.begin(), entries.end(), [](const json& a, const json& b) { return a["name"] < b["name"]; });
        return answer(200, json{{"path", path}, {"entries", std::move(entries)}, {"truncated", truncated}});
      }
      if (s.size() == 3) {  // DELETE
        files::remove(at, true);
        audit_file(inst, r, "delete", path);
        return answer(200, json{{"deleted", path}});
      }
      if (sub == "folder") {
        files::make_dir(at, false);
        audit_file(inst, r, "mkdir", path);
        return answer(201, json{{"created", path}});
      }
      if (reading) {
        files::Opened opened = files::open_read(at);
        if (opened.is_dir()) throw ApiError(409, fmt::format("{} is a folder; list it with /files?path=", shown));
        transport::StreamResponse res;
        res.headers.emplace_back("Content-Type", "application/octet-stream");
        res.headers.emplace_back("Content-Disposition", attachment(path));
        res.file_length = static_cast<std::uint64_t>(opened.st.st_size);
        res.file = std::move(opened.fd);
        return res;
      }
      // PUT: the body streamed into a temporary beside the file, renamed over it when whole.
      bool existed = true;
      try {
        files::stat_at(at, false);
      } catch (const SysError&) {
        existed = false;
      }
      auto pending = files::begin_write(at, {});
      std::vector<char> buf(256 * 1024);
      std::uint64_t total = 0;
      for (;;) {
        const std::size_t n = r.body.read(buf.data(), buf.size());
        if (n == 0) break;
        pending->write(std::string_view(buf.data(), n));
        total += n;
      }
      pending->commit();
      audit_file(inst, r, "write", path);
      return answer(existed ? 200 : 201, json{{"path", path}, {"bytes", total}, {"created", !existed}});
    } catch (const SysError& e) {
      if (r.body.too_large()) throw;
      file_failure(e, shown);
    }
  }

  // Content-Disposition for a download: the name as an ASCII fallback and in UTF-8 (RFC 6266).
  static std::string attachment(const std::string& path) {
    std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    std::string ascii, encoded;
    for (unsigned char c : name) {
      ascii += (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? static_cast<char>(c) : '_';
      if (std::isalnum(c) || c == '.' || c == '-' || c == '_')
        encoded += static_cast<char>(c);
      else
        encoded += fmt::format("%{:02X}", c);
    }
    return fmt::format("attachment; filename=\"{}\"; filename*=UTF-8''{}", ascii, encoded);
  }

  instances::Service& service_;
  const config::Config& config_;
  Settings settings_;
  Activity activity_;
  Live live_;  // after activity_, which it reads
  std::shared_ptr<instances::Trash> trash_;
  Measures measures_;
  std::string started_at_;
};

}  // namespace

void add_routes(transport::HttpOptions& options, instances::Service& service, Settings settings) {
  auto api = std::make_shared<Api>(service, std::move(settings));
  transport::StreamRoute route;
  route.prefix = "/api";
  route.browser = true;
  route.max_body_bytes = static_cast<std::uint64_t>(service.config().dav.max_upload_bytes);
  route.handler = [api](const transport::HttpRequest& request, transport::BodyReader& body) { return api->handle(request, body); };
  options.stream_routes.push_back(std::move(route));

  transport::EventRoute events;
  events.prefix = "/api/events";
  events.exact = true;
  events.browser = true;
  events.open = [api](const transport::HttpRequest& request, std::shared_ptr<transport::EventSink> sink) {
    return api->open_events(request, std::move(sink));
  };
  options.event_routes.push_back(std::move(events));

  transport::EventRoute output;
  output.prefix = "/api/jobs/";
  output.browser = true;
  output.open = [api](const transport::HttpRequest& request, std::shared_ptr<transport::EventSink> sink) {
    return api->open_job_output(request, std::move(sink));
  };
  options.event_routes.push_back(std::move(output));

  for (transport::HttpRoute& asset : asset_routes()) options.routes.push_back(std::move(asset));
  for (transport::WebSocketRoute& relay : relay_routes(service)) options.websocket_routes.push_back(std::move(relay));
  options.login.enabled = true;
}

}  // namespace nshpc::dashboard
