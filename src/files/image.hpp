// Images for a model to look at: PNG, JPEG, GIF (first frame) and WebP, scaled down past a size
// limit. The file was written by the sandbox and image decoders are a classic attack surface, so
// decoding never happens in the server: each image is decoded by a process of its own, the ns-hpc
// binary executed afresh as
//   ns-hpc __image-preview MIME MAX_SIDE MAX_BYTES MAX_PIXELS
// (a fresh address space: nothing of the server's memory, such as its token, for a subverted
// decoder to send back as "the image"). It gets the image on stdin (a sealed memfd) and answers
// on stdout (a pipe); its address space (RLIMIT_AS) and CPU time are limited before it starts,
// so its memory limit means the same whatever the server does; it refuses an image whose header
// declares more than MAX_PIXELS before decoding anything, then confines itself with a seccomp
// filter that allows little more than read, write, memory and exit, and is killed when it takes
// too long. At most kConcurrentDecodes run at once; more calls wait their turn, for a bounded
// time.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace nshpc::files {

// argv[1] that makes ns-hpc an image decoder (dispatched in main() before anything else is set up).
inline constexpr std::string_view kImagePreviewCommand = "__image-preview";

// Decoders running at once in this server; further previews wait for one to end.
inline constexpr int kConcurrentDecodes = 2;

struct ImageLimits {
  int max_side = 1568;                  // pixels, longest side
  std::size_t max_bytes = 1536 * 1024;  // of the encoded result
  // Refused from the header, before decoding (a decompression bomb): 25 megapixels takes a 24 MP
  // camera photo (6000x4000), a 4096x4096 image and a 5K or 6K screenshot; 7000x7000 (49) is refused.
  std::size_t max_pixels = 25'000'000;
  // The decoder process's address space (RLIMIT_AS), binary and libraries included. Measured at
  // 25 megapixels: a baseline JPEG needs ~180 MiB, a progressive one ~330, an 8-bit RGBA PNG
  // ~215, a 16-bit RGBA PNG ~405 and an interlaced one, the worst, ~690.
  std::size_t max_memory = std::size_t{768} << 20;
  std::chrono::milliseconds timeout{10000};     // of one decode, killed after
  std::chrono::milliseconds queue_wait{30000};  // for a free decoder, refused after
  // The ns-hpc binary that decodes; empty: this program (/proc/self/exe). A test program that is
  // not ns-hpc names it.
  std::string program;
};

struct Thumbnail {
  std::string data;  // encoded image
  std::string mime;  // image/png, image/jpeg, or the original's
  int width = 0, height = 0;                    // of `data`
  int original_width = 0, original_height = 0;  // of the file
  bool scaled = false;                          // false: `data` is the file itself
};

// Decodes `encoded` (of type `mime`: image/png, image/jpeg, image/gif, image/webp) in a decoder
// process. The file itself comes back when it is small enough in bytes and pixels; else a scaled
// copy (PNG when it has transparency, else JPEG). Throws Error saying why the image could not be
// shown: more pixels than max_pixels (naming its size and the limit), corrupt, more memory than
// max_memory, the decoder killed or timed out, or no decoder free within queue_wait.
Thumbnail make_thumbnail(std::string_view encoded, std::string_view mime, const ImageLimits& limits = {});

// The decoder process (argv as above); its exit status is 0 whenever it could answer.
int image_preview_main(int argc, char** argv);

}  // namespace nshpc::files
