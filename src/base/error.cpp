#include "base/error.hpp"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace nshpc {

namespace {
std::string describe(int err, std::string_view operation, std::string_view subject) {
  if (subject.empty()) return fmt::format("{}: {}", operation, std::strerror(err));
  return fmt::format("{} {}: {}", operation, subject, std::strerror(err));
}
}  // namespace

SysError::SysError(int err, std::string_view operation, std::string_view subject)
    : Error(describe(err, operation, subject)), code_(err) {}

SysError SysError::wrapped(std::string_view context) const {
  return SysError(Message{}, code_, fmt::format("{}: {}", context, what()));
}

long check_sys(long rc, std::string_view operation, std::string_view subject) {
  if (rc < 0) throw SysError(errno, operation, subject);
  return rc;
}

}  // namespace nshpc
