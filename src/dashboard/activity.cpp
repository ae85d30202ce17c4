// The activity of an instances folder, from its audit logs (activity.hpp).
#include "dashboard/activity.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>

#include "base/fd.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "store/store.hpp"

namespace nshpc::dashboard {

namespace {

constexpr std::string_view kRedacted = "[redacted]";

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

void replace_all(std::string& s, std::string_view what, std::string_view with) {
  if (what.empty()) return;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size()))
    s.replace(at, what.size(), with);
}

// The end of the JSON string that starts at `open` (the index after its closing quote), or npos
// when it does not end (a cut line).
std::size_t string_end(std::string_view text, std::size_t open) {
  for (std::size_t i = open + 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace

bool secret_key(std::string_view key) {
  const std::string k = lower(key);
  for (const char* word : {"token", "secret", "password", "passwd", "authorization", "cookie"})
    if (k.find(word) != std::string::npos) return true;
  return k.ends_with("key");
}

std::string redact_text(std::string_view text, std::string_view token) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '"') {
      out += text[i++];
      continue;
    }
    const std::size_t end = string_end(text, i);
    if (end == std::string_view::npos) {  // a cut string: kept as it is (the token is replaced below)
      out.append(text.substr(i));
      break;
    }
    const std::string_view quoted = text.substr(i, end - i);
    out.append(quoted);
    i = end;
    // "key" : "value" with a secret key: the value's content goes.
    std::size_t j = i;
    while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j >= text.size() || text[j] != ':') continue;
    ++j;
    while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j >= text.size() || text[j] != '"' || !secret_key(quoted.substr(1, quoted.size() - 2))) continue;
    out.append(text.substr(i, j - i));
    const std::size_t value_end = string_end(text, j);
    out += '"';
    out.append(kRedacted);
    out += '"';
    if (value_end == std::string_view::npos) return out;  // cut inside the secret: nothing more of it
    i = value_end;
  }
  replace_all(out, token, kRedacted);
  return out;
}

nlohmann::json redact(nlohmann::json value, std::string_view token) {
  if (value.is_string()) {
    std::string s = value.get<std::string>();
    replace_all(s, token, kRedacted);
    return s;
  }
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it)
      it.value() = secret_key(it.key()) && !it.value().is_null() ? nlohmann::json(kRedacted) : redact(std::move(it.value()), token);
    return value;
  }
  if (value.is_array())
    for (auto& item : value) item = redact(std::move(item), token);
  return value;
}

std::optional<nlohmann::json> parse_audit_line(std::string_view line, std::string_view instance, std::string_view token) {
  nlohmann::json raw = parse_json_or_discarded(line);
  if (!raw.is_object()) return std::nullopt;
  auto text_of = [&raw](const char* key) -> std::string {
    auto it = raw.find(key);
    return it != raw.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string kind = text_of("event");
  if (kind.empty()) return std::nullopt;
  nlohmann::json ev = {{"timestamp", text_of("timestamp")}, {"kind", kind}};
  const std::string actor = text_of("actor");
  ev["actor"] = text::sanitize_utf8(redact_text(actor, token));
  // An MCP caller is "mcp:<client>@<session>": the session is what ties its calls together.
  if (actor.starts_with("mcp:"))
    if (const auto at = actor.rfind('@'); at != std::string::npos) ev["session"] = actor.substr(at + 1);
  std::string where(instance);
  if (where.empty()) where = text_of("instance_id");
  if (!where.empty()) ev["instance"] = where;
  if (auto it = raw.find("tool"); it != raw.end() && it->is_string()) ev["tool"] = *it;
  if (auto it = raw.find("arguments"); it != raw.end()) {
    // The audit keeps a tool's arguments as JSON text, cut at 4 KiB: parsed when whole, else redacted as text.
    nlohmann::json args = it->is_string() ? parse_json_or_discarded(it->get<std::string>()) : *it;
    ev["arguments"] = args.is_discarded() ? nlohmann::json(redact_text(it->get<std::string>(), token))
                                          : redact(std::move(args), token);
  }
  if (auto it = raw.find("is_error"); it != raw.end() && it->is_boolean())
    ev["outcome"] = it->get<bool>() ? "error" : "ok";
  if (auto it = raw.find("duration_ms"); it != raw.end() && it->is_number()) ev["duration_ms"] = *it;
  nlohmann::json fields = nlohmann::json::object();
  for (auto it = raw.begin(); it != raw.end(); ++it) {
    static constexpr std::array kTaken{"event", "timestamp", "actor", "tool", "arguments", "is_error", "duration_ms"};
    if (std::find(kTaken.begin(), kTaken.end(), it.key()) == kTaken.end()) fields[it.key()] = it.value();
  }
  if (fields.contains("error")) ev["error"] = fields["error"];
  ev["fields"] = std::move(fields);
  // A line damaged on disk may hold invalid UTF-8 in a string: every answer is dumped with the
  // replacing error handler.
  return redact(std::move(ev), token);
}

std::optional<double> cpu_percent(std::uint64_t usec_before, std::chrono::steady_clock::time_point before,
                                  std::uint64_t usec_now, std::chrono::steady_clock::time_point now) {
  const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(now - before).count();
  if (elapsed <= 0 || usec_now < usec_before) return std::nullopt;
  return 100.0 * static_cast<double>(usec_now - usec_before) / static_cast<double>(elapsed);
}

// ---- LogTail ----------------------------------------------------------------------------------

namespace {

// The log opened for reading: never through a link, never blocking (a FIFO planted there), a
// regular file only. Invalid when it is not there or not such a file.
UniqueFd open_log(const std::filesystem::path& path, struct stat& st) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd || ::fstat(fd.get(), &st) < 0 || !S_ISREG(st.st_mode)) return UniqueFd();
  return fd;
}

}  // namespace

LogTail::LogTail(std::filesystem::path path, std::uint64_t history_bytes)
    : path_(std::move(path)), history_(history_bytes) {}

std::size_t LogTail::read_from(int fd, std::size_t budget, std::size_t max_line, std::vector<std::string>& lines) {
  std::size_t total = 0;
  std::string chunk(64 * 1024, '\0');
  while (total < budget) {
    const ssize_t n = ::pread(fd, chunk.data(), std::min(chunk.size(), budget - total), static_cast<off_t>(offset_));
    if (n <= 0) break;  // the end (or an error: tried again next time)
    offset_ += static_cast<std::uint64_t>(n);
    total += static_cast<std::size_t>(n);
    std::string_view data(chunk.data(), static_cast<std::size_t>(n));
    while (!data.empty()) {
      const auto nl = data.find('\n');
      const std::string_view piece = data.substr(0, nl);
      if (!skipping_) {
        if (partial_.size() + piece.size() > max_line) {
          partial_.clear();
          skipping_ = true;  // too long to be an audit line: dropped to its end
        } else {
          partial_.append(piece);
        }
      }
      if (nl == std::string_view::npos) break;
      if (!skipping_ && !partial_.empty()) lines.push_back(std::move(partial_));
      partial_.clear();
      skipping_ = false;
      data.remove_prefix(nl + 1);
    }
  }
  return total;
}

std::vector<std::string> LogTail::poll(std::size_t max_bytes, std::size_t max_line) {
  std::vector<std::string> lines;
  struct stat now {};
  // A look that finds nothing new costs one lstat.
  if (::lstat(path_.c_str(), &now) < 0) {
    if (started_ && errno == ENOENT) {
      // Rotated and not written to since: the rest of the old file is at <log>.1.
      struct stat old {};
      if (UniqueFd fd = open_log(path_.string() + ".1", old); fd && old.st_ino == ino_ && old.st_dev == dev_)
        read_from(fd.get(), max_bytes, max_line, lines);
    }
    return lines;
  }
  if (started_ && now.st_ino == ino_ && now.st_dev == dev_ && static_cast<std::uint64_t>(now.st_size) == offset_)
    return lines;
  struct stat st {};
  UniqueFd fd = open_log(path_, st);
  if (!fd) return lines;
  std::size_t budget = max_bytes;
  if (!started_) {
    started_ = true;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    offset_ = size > history_ ? size - history_ : 0;
    // The history starts at a line's start: inside a line, the rest of it is dropped.
    char before = '\n';
    if (offset_ > 0 && ::pread(fd.get(), &before, 1, static_cast<off_t>(offset_ - 1)) != 1) before = 'x';
    skipping_ = before != '\n';
  } else if (st.st_ino != ino_ || st.st_dev != dev_) {
    // Rotated: what was added to the old file before it became <log>.1 first.
    struct stat old {};
    if (UniqueFd previous = open_log(path_.string() + ".1", old); previous && old.st_ino == ino_ && old.st_dev == dev_)
      budget -= std::min(budget, read_from(previous.get(), budget, max_line, lines));
    offset_ = 0;
    partial_.clear();
    skipping_ = false;
  } else if (static_cast<std::uint64_t>(st.st_size) < offset_) {
    offset_ = 0;  // shrunk (truncated or replaced in place): read again from its start
    partial_.clear();
    skipping_ = false;
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  read_from(fd.get(), budget, max_line, lines);
  return lines;
}

// ---- Activity ----------------------------------------------------------------------------------

Activity::Activity(Options options) : options_(std::move(options)) {}

std::vector<std::pair<std::string, std::filesystem::path>> Activity::logs() const {
  std::vector<std::pair<std::string, std::filesystem::path>> out;
  out.emplace_back("", options_.root / ".audit.log");
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(options_.root.c_str()), ::closedir);
  if (!dir) return out;
  while (const dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || name == "output") continue;
    if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
    try {
      store::validate_id(name);
    } catch (const std::exception&) {
      continue;
    }
    if (out.size() >= options_.max_logs) break;
    out.emplace_back(name, options_.root / name / "audit.log");
  }
  return out;
}

std::vector<nlohmann::json> Activity::poll() {
  std::lock_guard poll_lock(poll_mutex_);
  const auto found = logs();
  // The first look reads the end of every log, within one budget for all of them.
  const std::uint64_t history =
      std::min<std::uint64_t>(options_.history_bytes, std::max<std::uint64_t>(16 * 1024, options_.history_total / found.size()));
  std::vector<nlohmann::json> events;
  std::map<std::filesystem::path, LogTail> kept;
  for (const auto& [instance, path] : found) {
    auto it = tails_.find(path);
    if (it == tails_.end())
      // At the first look, the recent history of every log; a log that appears later is new: all of it.
      it = tails_.emplace(path, LogTail(path, loaded_ ? UINT64_MAX : history)).first;
    for (const std::string& line : it->second.poll()) {
      if (auto ev = parse_audit_line(line, instance, options_.token)) events.push_back(std::move(*ev));
    }
    kept.insert(tails_.extract(it));
  }
  tails_ = std::move(kept);  // the logs of instances that are gone are no longer followed
  loaded_ = true;
  // Events of several logs in time order (ISO 8601 UTC texts of one format sort as times).
  std::stable_sort(events.begin(), events.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["timestamp"].get_ref<const std::string&>() < b["timestamp"].get_ref<const std::string&>();
  });
  std::lock_guard lock(ring_mutex_);
  for (nlohmann::json& ev : events) {
    ev["id"] = next_id_++;
    ring_.push_back(ev);
    if (ring_.size() > options_.ring) ring_.pop_front();
  }
  return events;
}

std::vector<nlohmann::json> Activity::after(std::uint64_t id, std::size_t max) const {
  std::lock_guard lock(ring_mutex_);
  auto it = std::find_if(ring_.begin(), ring_.end(), [id](const nlohmann::json& ev) { return ev["id"].get<std::uint64_t>() > id; });
  if (static_cast<std::size_t>(ring_.end() - it) > max) it = ring_.end() - static_cast<std::ptrdiff_t>(max);
  return {it, ring_.end()};
}

std::uint64_t Activity::newest() const {
  std::lock_guard lock(ring_mutex_);
  return next_id_ - 1;
}

nlohmann::json Activity::query(const ActivityQuery& q) {
  poll();
  const std::size_t limit = std::clamp<std::size_t>(q.limit, 1, 500);
  nlohmann::json out = nlohmann::json::array();
  std::optional<std::uint64_t> next_before;
  std::lock_guard lock(ring_mutex_);
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it) {
    const nlohmann::json& ev = *it;
    const std::uint64_t id = ev["id"].get<std::uint64_t>();
    if (q.before && id >= *q.before) continue;
    if (!q.instance.empty() && ev.value("instance", "") != q.instance) continue;
    if (!q.session.empty() && ev.value("session", "") != q.session) continue;
    if (!q.kind.empty()) {
      const std::string kind = ev.value("kind", "");
      if (q.kind.ends_with('.') ? !kind.starts_with(q.kind) : kind != q.kind) continue;
    }
    if (out.size() == limit) {
      next_before = out.back()["id"].get<std::uint64_t>();
      break;
    }
    out.push_back(ev);
  }
  nlohmann::json answer = {{"events", std::move(out)}};
  if (next_before) answer["next_before"] = *next_before;
  return answer;
}

}  // namespace nshpc::dashboard
