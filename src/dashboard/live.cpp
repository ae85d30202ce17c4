// The dashboard's live events (live.hpp).
#include "dashboard/live.hpp"

#include <unistd.h>

#include <algorithm>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "jobs/jobs.hpp"

namespace nshpc::dashboard {

namespace {

constexpr auto kTick = std::chrono::milliseconds(250);
constexpr auto kActivityEvery = std::chrono::seconds(1);
constexpr auto kSweepEvery = std::chrono::seconds(3);
constexpr auto kJobStateEvery = std::chrono::seconds(1);
constexpr std::size_t kOutputChunk = 64 * 1024;  // per stream and tick: a chatty job cannot hog the thread
constexpr std::size_t kBatch = 5000;             // activity events sent per look

// Which instance an audit event changed as the instances view shows it, or "".
std::string changed_instance(const nlohmann::json& ev) {
  const std::string kind = ev.value("kind", "");
  for (const char* prefix : {"instance.", "network.", "desktop.", "job."})
    if (kind.starts_with(prefix)) return ev.value("instance", "");
  return "";
}

}  // namespace

std::size_t utf8_whole_prefix(std::string_view bytes) {
  // Back over at most 3 continuation bytes to the last lead byte; keep it only when its sequence is whole.
  std::size_t i = bytes.size();
  for (std::size_t back = 0; back < 4 && i > 0; ++back) {
    const auto c = static_cast<unsigned char>(bytes[i - 1]);
    if ((c & 0xC0) != 0x80) {  // ASCII or a lead byte
      const std::size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
      return back + 1 >= need ? bytes.size() : i - 1;
    }
    --i;
  }
  return bytes.size();  // not UTF-8 at its end: sent as it is (sanitized)
}

Live::Live(instances::Service& service, Activity& activity) : service_(service), activity_(activity) {}

Live::~Live() {
  thread_.request_stop();
  wake_.notify_all();
}

std::size_t Live::streams() const {
  std::lock_guard lock(mutex_);
  return watchers_.size() + jobs_.size();
}

void Live::start_locked() {
  if (running_) return;
  if (thread_.joinable()) thread_ = std::jthread();  // the last one has returned (or is returning): joined
  running_ = true;
  thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
}

void Live::watch(std::shared_ptr<transport::EventSink> sink, std::string instance, std::optional<std::uint64_t> after) {
  activity_.poll();  // the history is loaded before the stream begins: it gets only what follows
  auto w = std::make_shared<Watcher>(Watcher{std::move(sink), std::move(instance), activity_.newest()});
  if (after) {
    for (const nlohmann::json& ev : activity_.after(*after, 1000))
      if (w->instance.empty() || ev.value("instance", "") == w->instance)
        if (!w->sink->send("activity", ev.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                           std::to_string(ev["id"].get<std::uint64_t>())))
          return;
  }
  std::lock_guard lock(mutex_);
  watchers_.push_back(std::move(w));
  start_locked();
  wake_.notify_all();
}

void Live::follow_job(std::shared_ptr<transport::EventSink> sink, const store::Instance& inst, const jobs::Record& job,
                      std::uint64_t stdout_from, std::uint64_t stderr_from) {
  auto js = std::make_shared<JobStream>();
  js->sink = std::move(sink);
  js->inst = inst;
  js->job_id = job.id;
  const std::string ws = inst.workspace.string() + "/";
  const std::string paths[2] = {job.stdout_path, job.stderr_path};
  const std::uint64_t from[2] = {stdout_from, stderr_from};
  for (int i = 0; i < 2; ++i) {
    js->out[i].name = i == 0 ? "stdout" : "stderr";
    if (paths[i].starts_with(ws)) js->out[i].relative = paths[i].substr(ws.size());
    js->out[i].offset = from[i];
  }
  std::lock_guard lock(mutex_);
  jobs_.push_back(std::move(js));
  start_locked();
  wake_.notify_all();
}

bool Live::pump(JobStream& s) {
  if (s.sink->closed()) return false;
  const bool was_ended = s.ended;
  bool read_any = false;
  for (auto& o : s.out) {
    if (o.relative.empty()) continue;
    if (!o.fd) {
      // The job's own file beneath the workspace, which its sandbox can write: opened as the job
      // engine opens it (no link followed, a regular file of the sandbox's uid).
      try {
        o.fd = service_.store().open_workspace_file(s.inst, o.relative, store::Store::WorkspaceOpen::read);
      } catch (const std::exception&) {
        o.fd = UniqueFd();
      }
      if (!o.fd) continue;
    }
    std::string buf(kOutputChunk, '\0');
    const ssize_t n = ::pread(o.fd.get(), buf.data(), buf.size(), static_cast<off_t>(o.offset));
    if (n <= 0) continue;
    read_any = true;
    o.offset += static_cast<std::uint64_t>(n);
    o.pending.append(buf.data(), static_cast<std::size_t>(n));
    const std::size_t whole = utf8_whole_prefix(o.pending);
    const std::string text = text::sanitize_utf8(std::string_view(o.pending).substr(0, whole));
    o.pending.erase(0, whole);
    const std::string id = fmt::format("{}:{}", s.out[0].offset - s.out[0].pending.size(),
                                       s.out[1].offset - s.out[1].pending.size());
    if (!s.sink->send("output", nlohmann::json{{"stream", o.name}, {"text", text}}.dump(), id)) return false;
  }
  if (was_ended && !read_any) {
    nlohmann::json end = {{"state", "unknown"}};
    try {
      const jobs::View v = service_.jobs().view(s.inst.id, s.job_id, {0, 0});
      end = {{"state", jobs::to_string(v.record.state)}, {"exit_code", v.record.exit_code ? nlohmann::json(*v.record.exit_code) : nlohmann::json()}};
      if (!v.record.reason.empty()) end["reason"] = v.record.reason;
    } catch (const std::exception& e) {
      end["error"] = e.what();
    }
    s.sink->send("end", end.dump());
    s.sink->end();  // the response ends: a script reading it returns
    return false;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!s.ended && now - s.last_state >= kJobStateEvery) {
    s.last_state = now;
    try {
      s.ended = jobs::is_final(service_.jobs().view(s.inst.id, s.job_id, {0, 0}).record.state);
    } catch (const std::exception& e) {
      log::debug("dashboard: job {} of {}: {}", s.job_id, s.inst.id, e.what());
      s.ended = true;  // gone (its instance deleted): what was written is sent, then the end
    }
  }
  return true;
}

void Live::send_activity(const std::vector<std::shared_ptr<Watcher>>& watchers) {
  if (watchers.empty()) return;
  std::uint64_t from = UINT64_MAX;
  for (const auto& w : watchers) from = std::min(from, w->seen);
  const std::vector<nlohmann::json> events = activity_.after(from, kBatch);
  for (const auto& w : watchers) {
    std::set<std::string> changed;
    for (const nlohmann::json& ev : events) {
      const std::uint64_t id = ev["id"].get<std::uint64_t>();
      if (id <= w->seen) continue;
      w->seen = id;
      const std::string instance = ev.value("instance", "");
      if (!w->instance.empty() && instance != w->instance) continue;
      w->sink->send("activity", ev.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), std::to_string(id));
      if (const std::string c = changed_instance(ev); !c.empty()) changed.insert(c);
      const std::string kind = ev.value("kind", "");
      if (kind.starts_with("job.") && ev["fields"].contains("job_id"))
        w->sink->send("jobs", nlohmann::json{{"instance_id", instance}, {"job_id", ev["fields"]["job_id"]},
                                             {"state", kind.substr(4)}}.dump());
    }
    // The store-level log says when an instance went: deleted (instance_id in its fields).
    if (!changed.empty()) w->sink->send("instances", nlohmann::json{{"ids", changed}}.dump());
  }
}

void Live::sweep(const std::vector<std::shared_ptr<Watcher>>& watchers) {
  std::map<std::string, std::string> now;
  try {
    store::ListQuery all;
    all.sort = store::SortBy::id;
    all.limit = 0;
    for (const store::Instance& inst : service_.store().list_page(all).instances) {
      if (!inst.persistent) continue;
      try {
        now[inst.id] = service_.living_status(inst).running ? "running" : "stopped";
      } catch (const std::exception&) {
        now[inst.id] = "unknown";
      }
    }
  } catch (const std::exception& e) {
    log::debug("dashboard: sweep of the instances failed: {}", e.what());
    return;
  }
  std::set<std::string> changed;
  if (swept_) {
    for (const auto& [id, state] : now)
      if (auto it = states_.find(id); it == states_.end() || it->second != state) changed.insert(id);
    for (const auto& [id, state] : states_)
      if (!now.contains(id)) changed.insert(id);
  }
  states_ = std::move(now);
  swept_ = true;
  if (changed.empty()) return;
  for (const auto& w : watchers) {
    if (!w->instance.empty() && !changed.contains(w->instance)) continue;
    nlohmann::json ids = w->instance.empty() ? nlohmann::json(changed) : nlohmann::json::array({w->instance});
    w->sink->send("instances", nlohmann::json{{"ids", ids}}.dump());
  }
}

void Live::run(std::stop_token stop) {
  auto last_activity = std::chrono::steady_clock::time_point{};
  auto last_sweep = std::chrono::steady_clock::now();  // the first sweep only notes the states
  swept_ = false;
  bool first = true;
  while (!stop.stop_requested()) {
    std::vector<std::shared_ptr<Watcher>> watchers;
    std::vector<std::shared_ptr<JobStream>> streams;
    {
      std::lock_guard lock(mutex_);
      std::erase_if(watchers_, [](const auto& w) { return w->sink->closed(); });
      std::erase_if(jobs_, [](const auto& j) { return j->sink->closed(); });
      if (watchers_.empty() && jobs_.empty()) {
        running_ = false;
        return;
      }
      watchers = watchers_;
      streams = jobs_;
    }
    const auto now = std::chrono::steady_clock::now();
    try {
      if (!watchers.empty() && now - last_activity >= kActivityEvery) {
        last_activity = now;
        activity_.poll();
        send_activity(watchers);
      }
      if (!watchers.empty() && (first || now - last_sweep >= kSweepEvery)) {
        last_sweep = now;
        first = false;
        sweep(watchers);
      }
    } catch (const std::exception& e) {
      log::warn("dashboard: live events: {}", e.what());
    }
    std::vector<std::shared_ptr<JobStream>> done;
    for (const auto& s : streams) {
      bool more = false;
      try {
        more = pump(*s);
      } catch (const std::exception& e) {
        log::warn("dashboard: job output of {}: {}", s->job_id, e.what());
      }
      if (!more) done.push_back(s);
    }
    std::unique_lock lock(mutex_);
    std::erase_if(jobs_, [&](const auto& j) { return std::find(done.begin(), done.end(), j) != done.end(); });
    wake_.wait_for(lock, stop, kTick, [] { return false; });
  }
  std::lock_guard lock(mutex_);
  running_ = false;
}

}  // namespace nshpc::dashboard
