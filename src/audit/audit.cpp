#include "audit/audit.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/text.hpp"
#include "base/time.hpp"

namespace nshpc::audit {

namespace {

constexpr size_t kMaxStringField = 8192;

void cap_strings(nlohmann::json& value) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s.size() > kMaxStringField) value = text::truncate_utf8(s, kMaxStringField);
  } else if (value.is_structured()) {
    for (auto& item : value) cap_strings(item);
  }
}

}  // namespace

std::string format_line(std::string_view event, std::string_view actor, nlohmann::json fields) {
  nlohmann::json line = nlohmann::json::object();
  line["event"] = event;
  line["timestamp"] = timeutil::iso_utc();
  line["actor"] = actor;
  if (fields.is_object()) {
    cap_strings(fields);
    for (auto& [key, value] : fields.items()) {
      if (!line.contains(key)) line[key] = std::move(value);
    }
  }
  // Invalid UTF-8 (a command line is arbitrary bytes) is replaced, never a throw.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void append(const std::filesystem::path& log_file, std::string_view event, std::string_view actor,
            nlohmann::json fields) {
  const std::string line = format_line(event, actor, std::move(fields));
  UniqueFd fd(::open(log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw SysError(errno, "open audit log", log_file.string());
  ssize_t n;
  do {
    n = ::write(fd.get(), line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) throw SysError(errno, "write audit log", log_file.string());
  if (static_cast<size_t>(n) != line.size())
    throw Error("short write to audit log " + log_file.string() + "; the disk may be full");
}

}  // namespace nshpc::audit
