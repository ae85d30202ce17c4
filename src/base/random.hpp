// The one source of randomness: the kernel's (getrandom(2)), for ids, names, tokens and
// temporary-file suffixes alike. Nothing here is seeded or kept, so it is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace nshpc::random {

// Fills `out` from getrandom(2). Throws SysError when the kernel's source fails.
void fill(std::span<std::byte> out);

// `bytes` random bytes as 2*bytes lower-case hex characters.
std::string hex(std::size_t bytes);

// A uniform value in [0, bound) (bound > 0), without modulo bias.
std::uint64_t below(std::uint64_t bound);

}  // namespace nshpc::random
