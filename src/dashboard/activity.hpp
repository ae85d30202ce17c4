// What agents and people did, read from the audit logs of every process on one instances folder
// (the store-level .audit.log and each instance's audit.log): the dashboard's activity view and
// its live events. The logs are polled (size and inode about once a second; the folder may be on
// NFS, where inotify sees nothing another host writes), only their new bytes are read, a rotation
// (<log> renamed to <log>.1) is followed, and every line is parsed defensively. Recent events are
// kept in a bounded ring; secrets are redacted before an event is kept.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace nshpc::dashboard {

// ---- Pure parts (unit-tested) ---------------------------------------------------------------

// Whether a value stored under `key` is a secret: names like token, secret, password, passwd,
// authorization, cookie, or ending in "key" (api_key, apikey, key).
bool secret_key(std::string_view key);
// `text` with every occurrence of `token` (when not empty) and every JSON-looking
// "secret_key": "value" pair's value replaced by "[redacted]" (an argument string the audit cut,
// which no longer parses as JSON).
std::string redact_text(std::string_view text, std::string_view token);
// `value` with the values of secret keys and every occurrence of `token` redacted, all the way down.
nlohmann::json redact(nlohmann::json value, std::string_view token);

// One audit line as the API's Event (docs/api.md), without its id: {timestamp, instance?, kind,
// actor, session?, tool?, arguments?, outcome?, error?, duration_ms?, fields}, redacted.
// `instance`: the instance whose log it came from ("" for the store-level log; an
// instance_id field then names it). nullopt for a line that is not an audit event (not JSON, not
// an object, no "event" string).
std::optional<nlohmann::json> parse_audit_line(std::string_view line, std::string_view instance, std::string_view token);

// CPU use between two looks at a group's cpu_usec: percent of one core (200 = two cores busy).
// nullopt without an earlier look, when time did not advance, or when the counter went back (a
// new group).
std::optional<double> cpu_percent(std::uint64_t usec_before, std::chrono::steady_clock::time_point before,
                                  std::uint64_t usec_now, std::chrono::steady_clock::time_point now);

// Follows one log file: the lines added since the last look. The file is opened without
// following links and without blocking; a rotation (a new inode at the path, the old one now
// <path>.1) reads what was left of the old file first; a shrunk file is read again from its start.
class LogTail {
 public:
  // The first look starts `history_bytes` before the file's end (at a line's start): 0 follows
  // only what is added from now on, UINT64_MAX reads the whole file.
  LogTail(std::filesystem::path path, std::uint64_t history_bytes);
  // The complete new lines, at most `max_bytes` read in one look (the rest comes next time). A
  // line longer than `max_line` bytes is dropped.
  std::vector<std::string> poll(std::size_t max_bytes = 1 << 20, std::size_t max_line = 128 * 1024);
  const std::filesystem::path& path() const { return path_; }

 private:
  // Reads `fd` from offset_ to at most `budget` bytes, complete lines into `lines`; bytes read.
  std::size_t read_from(int fd, std::size_t budget, std::size_t max_line, std::vector<std::string>& lines);
  std::filesystem::path path_;
  std::uint64_t history_;
  bool started_ = false;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::uint64_t offset_ = 0;
  std::string partial_;    // an unfinished last line
  bool skipping_ = false;  // inside an overlong line or a line begun before the history: dropped to its newline
};

// ---- The activity of an instances folder ----------------------------------------------------

struct ActivityQuery {
  std::string instance;  // "" = all
  std::string session;
  std::string kind;      // exact, or a prefix ending in '.' ("job.")
  std::optional<std::uint64_t> before;  // event ids below this one
  std::size_t limit = 100;
};

// The events of every log of the folder, the recent ones kept in a ring. Thread-safe; no thread
// of its own: the dashboard's watcher (events.hpp) polls it about once a second while someone
// watches, and a query polls first.
class Activity {
 public:
  struct Options {
    std::filesystem::path root;  // the instances folder
    std::string token;           // redacted wherever it appears
    std::size_t ring = 20000;    // events kept
    std::size_t history_bytes = 256 * 1024;  // of each log read at the first look, at most
    std::size_t history_total = 32 << 20;    // ... and of all of them together (at least 16 KiB each)
    std::size_t max_logs = 20000;            // logs followed (instances + the store's)
  };

  explicit Activity(Options options);
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

  // Newest first, with next_before when older events match in the ring. Reads the logs' new
  // lines first, so a request sees what was written before it.
  nlohmann::json query(const ActivityQuery& q);

  // Reads the new lines of every log (the first time: the tail of each, in time order), keeps
  // them and returns the new events, oldest first, each with its id.
  std::vector<nlohmann::json> poll();

  // The events after `id` still in the ring, oldest first, at most `max` (a stream's resume).
  std::vector<nlohmann::json> after(std::uint64_t id, std::size_t max) const;
  // The id of the newest event kept (0: none yet).
  std::uint64_t newest() const;

 private:
  std::vector<std::pair<std::string, std::filesystem::path>> logs() const;  // (instance, path)

  Options options_;
  std::mutex poll_mutex_;  // one poll at a time
  std::map<std::filesystem::path, LogTail> tails_;
  bool loaded_ = false;

  mutable std::mutex ring_mutex_;
  std::deque<nlohmann::json> ring_;
  std::uint64_t next_id_ = 1;
};

}  // namespace nshpc::dashboard
