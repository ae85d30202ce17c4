// What is in a file: its kind from the first bytes (text, an image, which binary), a streaming
// SHA-256, base64, and image thumbnails made in a sandboxed child (files/image.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace nshpc::files {

// The kind of a file, guessed from its first bytes (8 KiB are enough).
struct Kind {
  enum class Class { text, image, binary, empty };
  Class cls = Class::binary;
  std::string mime;         // "text/plain", "image/png", "application/x-executable", ...
  std::string description;  // "PNG image", "ELF executable", "UTF-8 text", "binary data"
};
// `head`: the first bytes; `name`: the file name (a hint for text types only).
Kind sniff(std::string_view head, std::string_view name = {});

// Streaming SHA-256 (libcrypto).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view data);
  std::string hex();  // finishes
 private:
  void* ctx_;
};
std::string sha256_hex(std::string_view data);

std::string base64_encode(std::string_view data);
// nullopt when `text` is not valid base64 (whitespace is ignored).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace nshpc::files
