#include "sandbox/status.hpp"

#include <system_error>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"

namespace nshpc::sandbox {

void StatusStream::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (depth_ == 0 && c != '{') continue;  // whitespace between documents
    pending_ += c;
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{') {
      ++depth_;
    } else if (c == '}') {
      if (--depth_ == 0) {
        take_document(pending_);
        pending_.clear();
      }
    }
    if (pending_.size() > 65536) {  // bwrap never writes this much: stop buffering
      malformed_ = true;
      pending_.clear();
      depth_ = 0;
    }
  }
}

void StatusStream::take_document(std::string_view doc) {
  auto json = parse_json_or_discarded(doc);
  if (!json.is_object()) {
    malformed_ = true;
    return;
  }
  if (auto it = json.find("child-pid"); it != json.end() && it->is_number_integer())
    child_pid_ = it->get<pid_t>();
  if (auto it = json.find("pid-namespace"); it != json.end() && it->is_number_unsigned())
    pid_namespace_ = it->get<std::uint64_t>();
  if (auto it = json.find(kJoinedKey); it != json.end() && it->is_boolean()) joined_ = it->get<bool>();
  if (auto it = json.find("exit-code"); it != json.end() && it->is_number_integer())
    exit_code_ = it->get<int>();
  if (auto it = json.find(kKeeperKey); it != json.end())
    keeper_pid_ = it->is_number_integer() ? it->get<pid_t>() : 0;
  const auto epoch_ms = [&](std::string_view key) -> std::optional<TimePoint> {
    auto it = json.find(key);
    if (it == json.end() || !it->is_number_integer()) return std::nullopt;
    return TimePoint(std::chrono::milliseconds(it->get<std::int64_t>()));
  };
  if (auto t = epoch_ms(kDeadlineKey)) deadline_reached_ = t;
  if (auto t = epoch_ms(kEndedKey)) ended_ = t;
  if (auto t = epoch_ms(kIdleKey)) idle_stopped_ = t;
  if (json.contains(kKeeperKey)) {
    if (auto t = epoch_ms(kStartedKey)) started_ = t;
  }
}

std::optional<ExecutionHandle> read_living_handle(const std::filesystem::path& state_dir) {
  try {
    if (const auto text = fs::read_file(state_dir / kLivingHandleFile))
      if (auto handle = ExecutionHandle::from_json(parse_json_or_discarded(*text))) return handle;
  } catch (const SysError&) {
    // Unreadable: as if it were not there.
  }
  const std::filesystem::path status = state_dir / kLivingStatusFile;
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(status, ec))) return std::nullopt;
  return ExecutionHandle::untyped({{"status_path", status.string()}});
}

void write_living_handle(const std::filesystem::path& state_dir, const ExecutionHandle& handle) {
  fs::atomic_write(state_dir / kLivingHandleFile, handle.to_json().dump() + "\n", 0600);
}

}  // namespace nshpc::sandbox
