#include "files/content.hpp"

#include <openssl/evp.h>

#include <array>
#include <cstring>

#include "base/error.hpp"
#include "base/text.hpp"

namespace nshpc::files {

using namespace std::literals;

namespace {

bool starts(std::string_view head, std::string_view magic, std::size_t at = 0) {
  return head.size() >= at + magic.size() && head.substr(at, magic.size()) == magic;
}

struct Magic {
  std::string_view bytes;
  std::size_t at;
  const char* mime;
  const char* description;
};

constexpr Magic kBinaryMagic[] = {
    {"\x7f" "ELF"sv, 0, "application/x-executable", "ELF executable or library"},
    {"%PDF-"sv, 0, "application/pdf", "PDF document"},
    {"PK\x03\x04"sv, 0, "application/zip", "ZIP archive (or docx/xlsx/jar)"},
    {"\x1f\x8b"sv, 0, "application/gzip", "gzip-compressed data"},
    {"BZh"sv, 0, "application/x-bzip2", "bzip2-compressed data"},
    {"\xfd" "7zXZ"sv, 0, "application/x-xz", "xz-compressed data"},
    {"\x28\xb5\x2f\xfd"sv, 0, "application/zstd", "zstd-compressed data"},
    {"7z\xbc\xaf\x27\x1c"sv, 0, "application/x-7z-compressed", "7-Zip archive"},
    {"ustar"sv, 257, "application/x-tar", "tar archive"},
    {"SQLite format 3"sv, 0, "application/vnd.sqlite3", "SQLite database"},
    {"\x89HDF\r\n\x1a\n"sv, 0, "application/x-hdf5", "HDF5 data"},
    {"\x93NUMPY"sv, 0, "application/x-npy", "NumPy array"},
    {"II*\0"sv, 0, "image/tiff", "TIFF image (not shown as an image)"},
    {"MM\0*"sv, 0, "image/tiff", "TIFF image (not shown as an image)"},
    {"\0asm"sv, 0, "application/wasm", "WebAssembly module"},
};

std::string text_mime(std::string_view name) {
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.substr(name.size() - s.size()) == s; };
  if (ends(".md")) return "text/markdown";
  if (ends(".json")) return "application/json";
  if (ends(".html") || ends(".htm")) return "text/html";
  if (ends(".csv")) return "text/csv";
  if (ends(".xml")) return "application/xml";
  if (ends(".svg")) return "image/svg+xml";
  return "text/plain";
}

}  // namespace

Kind sniff(std::string_view head, std::string_view name) {
  if (head.empty()) return {Kind::Class::empty, text_mime(name), "empty file"};
  if (starts(head, "\x89PNG\r\n\x1a\n"sv)) return {Kind::Class::image, "image/png", "PNG image"};
  if (starts(head, "\xff\xd8\xff")) return {Kind::Class::image, "image/jpeg", "JPEG image"};
  if (starts(head, "GIF87a") || starts(head, "GIF89a")) return {Kind::Class::image, "image/gif", "GIF image"};
  if (starts(head, "RIFF") && starts(head, "WEBP", 8)) return {Kind::Class::image, "image/webp", "WebP image"};
  for (const Magic& m : kBinaryMagic)
    if (starts(head, m.bytes, m.at)) return {Kind::Class::binary, m.mime, m.description};
  // Text: no NUL, valid UTF-8 (a sequence cut by the end of `head` is allowed).
  if (head.find('\0') == std::string_view::npos) {
    auto bad = text::find_invalid_utf8(head);
    if (!bad || *bad + 4 > head.size()) return {Kind::Class::text, text_mime(name), "UTF-8 text"};
  }
  return {Kind::Class::binary, "application/octet-stream", "binary data"};
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1)
    throw Error("sha256: libcrypto could not start a digest");
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(std::string_view data) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size());
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned size = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &size);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < size; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex();
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(std::string_view data) {
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < data.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(data[i]) << 16) | (static_cast<unsigned char>(data[i + 1]) << 8) |
                       static_cast<unsigned char>(data[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i < data.size()) {
    unsigned v = static_cast<unsigned char>(data[i]) << 16;
    if (i + 1 < data.size()) v |= static_cast<unsigned char>(data[i + 1]) << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < data.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  std::array<int, 256> value;
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<unsigned char>(kB64[i])] = i;
  value['-'] = 62;  // the URL-safe alphabet too
  value['_'] = 63;
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  std::size_t pad = 0;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad) return std::nullopt;  // data after padding
    const int v = value[static_cast<unsigned char>(c)];
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (pad > 2 || bits >= 6) return std::nullopt;
  return out;
}

}  // namespace nshpc::files
