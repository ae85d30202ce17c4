// WebDAV locks (RFC 4918 §6-7): exclusive and shared write locks of depth 0 or infinity on URL
// paths, with timeouts. Held in memory by the server (a restart releases every lock; clients
// then lock again, as after a lock's timeout).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace nshpc::dav {

struct Lock {
  std::string token;  // opaquelocktoken:<uuid>
  std::string root;   // the decoded URL path that was locked (no trailing slash)
  bool exclusive = true;
  bool infinite = false;  // depth infinity: covers everything below root
  std::string owner_xml;  // the client's <owner> content, returned as sent
  std::chrono::seconds timeout{0};
  std::chrono::steady_clock::time_point expires;
};

class LockManager {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LockManager(std::size_t max_locks = 10000, std::function<Clock::time_point()> now = Clock::now)
      : max_locks_(max_locks), now_(std::move(now)) {}

  // Locks on `path` or on an ancestor with depth infinity; with `below`, also locks on paths
  // under `path` (what a depth-infinity operation on it touches).
  std::vector<Lock> covering(const std::string& path, bool below = false) const;
  // Whether the lock `token` covers `path`.
  bool covers(const std::string& token, const std::string& path) const;

  // A new lock, or nullopt when an existing lock conflicts (an exclusive one, or any lock
  // for a new exclusive one) or too many locks are held.
  std::optional<Lock> acquire(const std::string& path, bool exclusive, bool infinite, std::string owner_xml,
                              std::chrono::seconds timeout);
  // A lock that covers `path` gets a fresh timeout; nullopt when `token` covers no such lock.
  std::optional<Lock> refresh(const std::string& token, const std::string& path, std::chrono::seconds timeout);
  // Releases `token` if it covers `path`; false otherwise.
  bool release(const std::string& token, const std::string& path);
  // Forgets every lock on `path` and below (the resources were deleted or moved away).
  void remove_below(const std::string& path);

  std::size_t size() const;

 private:
  void expire() const;
  static bool is_below(const std::string& path, const std::string& root);  // path == root or under it

  mutable std::mutex mutex_;
  mutable std::map<std::string, Lock> locks_;  // by token
  std::size_t max_locks_;
  std::function<Clock::time_point()> now_;
};

// The timeout a client asked for in a Timeout header ("Second-N", "Infinite", a list): at most
// `max`; `fallback` when absent or unreadable.
std::chrono::seconds parse_timeout(const std::string& header, std::chrono::seconds fallback, std::chrono::seconds max);

}  // namespace nshpc::dav
