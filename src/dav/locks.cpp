// WebDAV locks (see locks.hpp).
#include "dav/locks.hpp"

#include <charconv>

#include <fmt/format.h>

#include "base/random.hpp"

namespace nshpc::dav {

bool LockManager::is_below(const std::string& path, const std::string& root) {
  if (path == root) return true;
  return path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
         (path[root.size()] == '/' || (!root.empty() && root.back() == '/'));
}

void LockManager::expire() const {
  const auto now = now_();
  for (auto it = locks_.begin(); it != locks_.end();) {
    if (it->second.expires <= now) it = locks_.erase(it);
    else ++it;
  }
}

std::vector<Lock> LockManager::covering(const std::string& path, bool below) const {
  std::lock_guard lock(mutex_);
  expire();
  std::vector<Lock> out;
  for (const auto& [token, l] : locks_) {
    const bool on_it = l.root == path || (l.infinite && is_below(path, l.root));
    const bool under = below && is_below(l.root, path);
    if (on_it || under) out.push_back(l);
  }
  return out;
}

bool LockManager::covers(const std::string& token, const std::string& path) const {
  std::lock_guard lock(mutex_);
  expire();
  auto it = locks_.find(token);
  if (it == locks_.end()) return false;
  return it->second.root == path || (it->second.infinite && is_below(path, it->second.root));
}

std::optional<Lock> LockManager::acquire(const std::string& path, bool exclusive, bool infinite, std::string owner_xml,
                                         std::chrono::seconds timeout) {
  std::lock_guard lock(mutex_);
  expire();
  if (locks_.size() >= max_locks_) return std::nullopt;
  for (const auto& [token, l] : locks_) {
    const bool overlaps = l.root == path || (l.infinite && is_below(path, l.root)) || (infinite && is_below(l.root, path));
    if (overlaps && (exclusive || l.exclusive)) return std::nullopt;
  }
  Lock l;
  const std::string r = random::hex(16);
  l.token = fmt::format("opaquelocktoken:{}-{}-4{}-a{}-{}", r.substr(0, 8), r.substr(8, 4), r.substr(13, 3), r.substr(17, 3),
                        r.substr(20, 12));
  l.root = path;
  l.exclusive = exclusive;
  l.infinite = infinite;
  l.owner_xml = std::move(owner_xml);
  l.timeout = timeout;
  l.expires = now_() + timeout;
  locks_[l.token] = l;
  return l;
}

std::optional<Lock> LockManager::refresh(const std::string& token, const std::string& path, std::chrono::seconds timeout) {
  std::lock_guard lock(mutex_);
  expire();
  auto it = locks_.find(token);
  if (it == locks_.end()) return std::nullopt;
  Lock& l = it->second;
  if (!(l.root == path || (l.infinite && is_below(path, l.root)))) return std::nullopt;
  l.timeout = timeout;
  l.expires = now_() + timeout;
  return l;
}

bool LockManager::release(const std::string& token, const std::string& path) {
  std::lock_guard lock(mutex_);
  expire();
  auto it = locks_.find(token);
  if (it == locks_.end()) return false;
  const Lock& l = it->second;
  if (!(l.root == path || (l.infinite && is_below(path, l.root)))) return false;
  locks_.erase(it);
  return true;
}

void LockManager::remove_below(const std::string& path) {
  std::lock_guard lock(mutex_);
  for (auto it = locks_.begin(); it != locks_.end();) {
    if (is_below(it->second.root, path)) it = locks_.erase(it);
    else ++it;
  }
}

std::size_t LockManager::size() const {
  std::lock_guard lock(mutex_);
  expire();
  return locks_.size();
}

std::chrono::seconds parse_timeout(const std::string& header, std::chrono::seconds fallback, std::chrono::seconds max) {
  std::string_view rest = header;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item == "Infinite") return max;
    if (item.rfind("Second-", 0) == 0) {
      std::uint64_t n = 0;
      const auto digits = item.substr(7);
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
      if (ec == std::errc() && p == digits.data() + digits.size() && n > 0)
        return std::chrono::seconds(std::min<std::uint64_t>(n, static_cast<std::uint64_t>(max.count())));
    }
  }
  return fallback;
}

}  // namespace nshpc::dav
