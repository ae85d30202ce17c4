// Images for a model to look at: PNG, JPEG, GIF (first frame) and WebP, scaled down past a size
// limit. The file was written by the sandbox and image decoders are a classic attack surface, so
// decoding never happens in the server: a forked child with no descriptors but one pipe, memory
// and CPU limits, and a seccomp filter that allows little more than read, write, memory and exit
// does it, and is killed when it takes too long.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace nshpc::files {

struct ImageLimits {
  int max_side = 1568;                  // pixels, longest side
  std::size_t max_bytes = 1536 * 1024;  // of the encoded result
  std::size_t max_pixels = 50'000'000;  // refused above (a decompression bomb)
  std::chrono::milliseconds timeout{10000};
};

struct Thumbnail {
  std::string data;  // encoded image
  std::string mime;  // image/png, image/jpeg, or the original's
  int width = 0, height = 0;                    // of `data`
  int original_width = 0, original_height = 0;  // of the file
  bool scaled = false;                          // false: `data` is the file itself
};

// Decodes `encoded` (of type `mime`: image/png, image/jpeg, image/gif, image/webp) in a sandboxed
// child. The file itself comes back when it is small enough in bytes and pixels; else a scaled
// copy (PNG when it has transparency, else JPEG). Throws Error saying why the image could not
// be decoded (corrupt, too large, the decoder was killed or timed out).
Thumbnail make_thumbnail(std::string_view encoded, std::string_view mime, const ImageLimits& limits = {});

}  // namespace nshpc::files
