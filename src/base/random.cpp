#include "base/random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <limits>

#include "base/error.hpp"

namespace nshpc::random {

void fill(std::span<std::byte> out) {
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "getrandom", "random bytes for an id, name or token");
    }
    got += static_cast<std::size_t>(n);
  }
}

std::string hex(std::size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string raw(bytes, '\0');
  fill(std::as_writable_bytes(std::span(raw)));
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::uint64_t below(std::uint64_t bound) {
  // Reject the values of the last, incomplete run of `bound` so that every result is as likely.
  const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() -
                              std::numeric_limits<std::uint64_t>::max() % bound;
  for (;;) {
    std::uint64_t v = 0;
    fill(std::as_writable_bytes(std::span(&v, 1)));
    if (v < limit) return v % bound;
  }
}

}  // namespace nshpc::random
