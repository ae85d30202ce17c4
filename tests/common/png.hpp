// PNG files made by tests, byte by byte: an honest image of any size, or a header that declares
// a size its data does not have (what a hostile sandbox writes to make a preview decode a bomb).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace nshpc::tests {

inline std::uint32_t crc32_of(const std::string& data) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xffffffffu;
}

inline std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// zlib of `raw` in stored (uncompressed) deflate blocks.
inline std::string zlib_stored(const std::string& raw) {
  std::string z = "\x78\x01";
  for (std::size_t at = 0; at == 0 || at < raw.size(); at += 65535) {
    const std::size_t n = std::min<std::size_t>(65535, raw.size() - at);
    z += static_cast<char>(at + n == raw.size() ? 1 : 0);
    z += {static_cast<char>(n & 0xff), static_cast<char>(n >> 8), static_cast<char>(~n & 0xff),
          static_cast<char>((~n >> 8) & 0xff)};
    z += raw.substr(at, n);
  }
  std::uint32_t a = 1, b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  return z + be32((b << 16) | a);
}

// An 8-bit RGB PNG whose header says w x h and whose one IDAT holds `raw` (filter bytes included).
inline std::string png_with(std::uint32_t w, std::uint32_t h, const std::string& raw) {
  auto chunk = [](const std::string& type, const std::string& data) {
    return be32(static_cast<std::uint32_t>(data.size())) + type + data + be32(crc32_of(type + data));
  };
  const std::string ihdr = be32(w) + be32(h) + std::string("\x08\x02\0\0\0", 5);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", zlib_stored(raw)) +
         chunk("IEND", "");
}

// A real w x h RGB PNG (a colour pattern).
inline std::string make_png(std::uint32_t w, std::uint32_t h) {
  std::string raw;
  raw.reserve(static_cast<std::size_t>(h) * (1 + 3 * static_cast<std::size_t>(w)));
  for (std::uint32_t y = 0; y < h; ++y) {
    raw += '\0';
    for (std::uint32_t x = 0; x < w; ++x) raw += {static_cast<char>(x), static_cast<char>(y), static_cast<char>(x ^ y)};
  }
  return png_with(w, h, raw);
}

// A PNG of a few hundred bytes whose header declares w x h: decoding it would allocate for every
// declared pixel before finding the data short.
inline std::string declared_png(std::uint32_t w, std::uint32_t h) { return png_with(w, h, std::string(256, '\0')); }

}  // namespace nshpc::tests
