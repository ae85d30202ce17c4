#include "audit/audit.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/json.hpp"
#include "base/text.hpp"
#include "base/time.hpp"

namespace nshpc::audit {

namespace {

constexpr size_t kMaxStringField = 8192;
constexpr size_t kCutFieldBytes = 2048;  // what is kept of a field that makes the line too long

std::string sha256_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) != 1) return "unavailable";
  std::string hex;
  hex.reserve(size * 2);
  for (unsigned int i = 0; i < size; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

// The beginning of `whole` (valid UTF-8) and a marker naming the size and hash of all of it.
std::string cut(std::string_view whole, size_t keep) {
  std::string head = text::truncate_utf8(text::sanitize_utf8(whole.substr(0, keep + 4)), keep);
  if (head.ends_with("…")) head.resize(head.size() - std::string_view("…").size());
  return fmt::format("{}…[cut: {} bytes, sha256 {}]", head, whole.size(), sha256_hex(whole));
}

void cap_strings(nlohmann::json& value) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s.size() > kMaxStringField) value = cut(s, kMaxStringField);
  } else if (value.is_structured()) {
    for (auto& item : value) cap_strings(item);
  }
}

std::string dump(const nlohmann::json& value) {
  // Invalid UTF-8 (a command line is arbitrary bytes) is replaced, never a throw.
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Rotates `path` (whose descriptor `fd` holds the exclusive lock): .N-1 → .N, …, path → .1.
void rotate(const std::filesystem::path& path, int keep) {
  for (int i = keep - 1; i >= 1; --i) {
    const std::string from = fmt::format("{}.{}", path.string(), i);
    const std::string to = fmt::format("{}.{}", path.string(), i + 1);
    if (::rename(from.c_str(), to.c_str()) < 0 && errno != ENOENT) throw SysError(errno, "rotate audit log", from);
  }
  const std::string first = path.string() + ".1";
  if (::rename(path.c_str(), first.c_str()) < 0 && errno != ENOENT) throw SysError(errno, "rotate audit log", path.string());
}

// The log's descriptor, locked and still the file at `path` (not rotated away meanwhile).
UniqueFd open_locked(const std::filesystem::path& path, int lock) {
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) throw SysError(errno, "open audit log", path.string());
    while (::flock(fd.get(), lock) < 0) {
      if (errno != EINTR) throw SysError(errno, "lock audit log", path.string());
    }
    struct stat open_st, path_st;
    if (::fstat(fd.get(), &open_st) < 0) throw SysError(errno, "stat audit log", path.string());
    if (::stat(path.c_str(), &path_st) == 0 && path_st.st_ino == open_st.st_ino && path_st.st_dev == open_st.st_dev)
      return fd;
    // Rotated between our open and our lock: open the new file.
  }
}

// One line in a single write(2).
void write_line(int fd, const std::string& line, const std::filesystem::path& log_file) {
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) throw SysError(errno, "write audit log", log_file.string());
  if (static_cast<size_t>(n) != line.size())
    throw Error("short write to audit log " + log_file.string() + "; the disk may be full");
}

}  // namespace

std::string format_line(std::string_view event, std::string_view actor, nlohmann::json fields) {
  nlohmann::json line = nlohmann::json::object();
  line["event"] = event;
  line["timestamp"] = timeutil::iso_utc();
  line["actor"] = text::truncate_utf8(text::sanitize_utf8(actor), 256);
  if (fields.is_object()) {
    cap_strings(fields);
    for (auto& [key, value] : fields.items()) {
      if (!line.contains(key)) line[key] = std::move(value);
    }
  }
  std::string text = dump(line);
  // Still too long (a huge argv of short strings, many fields): cut the largest fields until
  // the line fits.
  while (text.size() + 1 > kMaxLineBytes) {
    std::string largest;
    size_t largest_size = 0;
    for (auto& [key, value] : line.items()) {
      if (key == "event" || key == "timestamp" || key == "actor") continue;
      const size_t size = dump(value).size();
      if (size > largest_size) {
        largest_size = size;
        largest = key;
      }
    }
    if (largest.empty() || largest_size <= kCutFieldBytes + 128) {
      // Only many small fields are left: keep the event and say what was dropped.
      nlohmann::json small = {{"event", line["event"]}, {"timestamp", line["timestamp"]}, {"actor", line["actor"]},
                              {"cut", cut(text, kCutFieldBytes)}};
      text = dump(small);
      break;
    }
    const nlohmann::json& value = line[largest];
    line[largest] = cut(value.is_string() ? value.get<std::string>() : dump(value), kCutFieldBytes);
    text = dump(line);
  }
  return text + "\n";
}

void append(const std::filesystem::path& log_file, std::string_view event, std::string_view actor,
            nlohmann::json fields, const Rotation& rotation) {
  const std::string line = format_line(event, actor, std::move(fields));
  // One writer at a time (lines are small; the lock is held for one fstat and one write), so the
  // size check and the write cannot be split by another writer or by a rotation.
  UniqueFd fd = open_locked(log_file, LOCK_EX);
  struct stat st;
  if (rotation.max_bytes > 0 && rotation.keep > 0 && ::fstat(fd.get(), &st) == 0 && st.st_size > 0 &&
      static_cast<std::uint64_t>(st.st_size) + line.size() > rotation.max_bytes) {
    rotate(log_file, rotation.keep);
    UniqueFd rotated = std::move(fd);  // held until the line is written: waiting writers then reopen
    fd = open_locked(log_file, LOCK_EX);
  }
  write_line(fd.get(), line, log_file);
}

void append_to(int log_fd, const std::filesystem::path& log_file, std::string_view event, std::string_view actor,
               nlohmann::json fields) {
  const std::string line = format_line(event, actor, std::move(fields));
  while (::flock(log_fd, LOCK_EX) < 0)
    if (errno != EINTR) throw SysError(errno, "lock audit log", log_file.string());
  try {
    write_line(log_fd, line, log_file);
  } catch (...) {
    ::flock(log_fd, LOCK_UN);
    throw;
  }
  ::flock(log_fd, LOCK_UN);
}

std::string rotation_argument(const Rotation& rotation) {
  return fmt::format("{},{}", rotation.max_bytes, rotation.keep);
}

std::optional<Rotation> parse_rotation_argument(std::string_view text) {
  const auto comma = text.find(',');
  if (comma == std::string_view::npos) return std::nullopt;
  Rotation r;
  const std::string_view bytes = text.substr(0, comma), keep = text.substr(comma + 1);
  const auto [b_end, b_ec] = std::from_chars(bytes.data(), bytes.data() + bytes.size(), r.max_bytes);
  const auto [k_end, k_ec] = std::from_chars(keep.data(), keep.data() + keep.size(), r.keep);
  if (bytes.empty() || keep.empty() || b_ec != std::errc() || k_ec != std::errc() ||
      b_end != bytes.data() + bytes.size() || k_end != keep.data() + keep.size() || r.keep < 0)
    return std::nullopt;
  return r;
}

}  // namespace nshpc::audit
