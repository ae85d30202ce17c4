#include "files/image.hpp"

#include <fcntl.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/spawn.hpp"

namespace nshpc::files {
namespace {
// The decoders' allocations, so that running out of memory is told as such: stb_image does not
// always say so (a failed first allocation of its inflater leaves the reason of an earlier
// format test, "no SOI", as the issue saw).
bool allocation_failed = false;
void* decoder_malloc(std::size_t size) {
  void* p = std::malloc(size);
  if (!p && size > 0) allocation_failed = true;
  return p;
}
void* decoder_realloc(void* old, std::size_t size) {
  void* p = std::realloc(old, size);
  if (!p && size > 0) allocation_failed = true;
  return p;
}
}  // namespace
}  // namespace nshpc::files

// The decoders, compiled into this file only, with no file I/O of their own.
#define STBI_MALLOC(size) nshpc::files::decoder_malloc(size)
#define STBI_REALLOC(p, size) nshpc::files::decoder_realloc(p, size)
#define STBI_FREE(p) std::free(p)
#define STBIR_MALLOC(size, context) ((void)(context), nshpc::files::decoder_malloc(size))
#define STBIR_FREE(p, context) ((void)(context), std::free(p))
#define STBIW_MALLOC(size) nshpc::files::decoder_malloc(size)
#define STBIW_REALLOC(p, size) nshpc::files::decoder_realloc(p, size)
#define STBIW_FREE(p) std::free(p)
#define STBI_NO_STDIO
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_GIF
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wcast-qual"
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wuseless-cast"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop
#include <webp/decode.h>

namespace nshpc::files {

namespace {

// What the decoder sends back: this header, then `length` bytes (the image, or a message).
struct Reply {
  std::int32_t status = 0;  // 0 failed (message follows), 1 keep the original, 2 scaled image follows
  std::int32_t original_width = 0, original_height = 0, width = 0, height = 0;
  std::int32_t png = 0;  // the scaled image is PNG (else JPEG)
  std::uint64_t length = 0;
};

// What the server tells the decoder (its argv after kImagePreviewCommand).
struct DecodeRequest {
  std::string mime;
  int max_side = 0;
  std::size_t max_bytes = 0, max_pixels = 0;
};

// "49 megapixels", "16.8 megapixels", "20000 pixels": a count of pixels as a person says it.
std::string pixel_count(std::size_t pixels) {
  if (pixels < 1'000'000) return fmt::format("{} pixels", pixels);
  std::string text = fmt::format("{:.1f}", static_cast<double>(pixels) / 1e6);
  if (text.ends_with(".0")) text.resize(text.size() - 2);
  return text + " megapixels";
}

// ---------------------------------------------------------------------------------------------
// The decoder process

void write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::_exit(3);
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

constexpr int kReplyFd = STDOUT_FILENO;

[[noreturn]] void reply_failure(const std::string& message) {
  Reply r;
  r.length = message.size();
  write_all(kReplyFd, &r, sizeof r);
  write_all(kReplyFd, message.data(), message.size());
  ::_exit(0);
}

// The decoder's filter: memory management, read/write on what it has, exit. Anything else kills
// it. mmap/mprotect may not make memory executable.
bool confine() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
  if (!ctx) return false;
  bool ok = true;
  for (int nr : {SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(exit), SCMP_SYS(exit_group), SCMP_SYS(brk),
                 SCMP_SYS(munmap), SCMP_SYS(mremap), SCMP_SYS(madvise), SCMP_SYS(rt_sigreturn), SCMP_SYS(futex),
                 SCMP_SYS(getrandom), SCMP_SYS(rt_sigprocmask)})
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) == 0;
  ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1, SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0)) == 0;
  ok = ok &&
       seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 1, SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0)) == 0;
  ok = ok && seccomp_load(ctx) == 0;
  seccomp_release(ctx);
  return ok;
}

// Decoded RGBA pixels, in the decoder's own buffer (no copy: the largest allocation of a preview).
struct Pixels {
  std::unique_ptr<unsigned char, void (*)(void*)> rgba{nullptr, ::free};
  int w = 0, h = 0;
  std::size_t size() const { return static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 4; }
};

void stbi_free(void* p) { stbi_image_free(p); }
void webp_free(void* p) { WebPFree(p); }

// The decoder's address space limit, read before the filter forbids asking (RLIM_INFINITY: none).
rlim_t memory_limit = RLIM_INFINITY;

std::string out_of_memory() {
  return memory_limit == RLIM_INFINITY
             ? std::string("decoding it needs more memory than there is")
             : fmt::format("decoding it needs more than the {} MiB the image decoder may use", memory_limit >> 20);
}

// The declared size against the limit, from the header alone: nothing is decoded yet.
void check_size(int w, int h, const DecodeRequest& req) {
  const std::size_t pixels = static_cast<std::size_t>(w) * static_cast<std::size_t>(h);
  if (pixels > req.max_pixels)
    reply_failure(fmt::format("the image is {}×{} ({}); previews are made of images up to {}", w, h,
                           pixel_count(pixels), pixel_count(req.max_pixels)));
}

// Decode, scale, encode, reply. Never returns.
[[noreturn]] void decode(std::string_view encoded, const DecodeRequest& req) {
  Pixels px;
  if (req.mime == "image/webp") {
    const auto* bytes = reinterpret_cast<const uint8_t*>(encoded.data());
    if (!WebPGetInfo(bytes, encoded.size(), &px.w, &px.h)) reply_failure("not a valid WebP image");
    check_size(px.w, px.h, req);
    px.rgba = {WebPDecodeRGBA(bytes, encoded.size(), &px.w, &px.h), webp_free};
    if (!px.rgba) reply_failure("the WebP image could not be decoded (corrupt?)");
  } else {
    int channels = 0;
    const auto* bytes = reinterpret_cast<const stbi_uc*>(encoded.data());
    const int len = static_cast<int>(std::min<std::size_t>(encoded.size(), INT32_MAX));
    if (!stbi_info_from_memory(bytes, len, &px.w, &px.h, &channels))
      reply_failure(std::string("the image could not be decoded: ") + stbi_failure_reason());
    check_size(px.w, px.h, req);
    px.rgba = {stbi_load_from_memory(bytes, len, &px.w, &px.h, &channels, 4), stbi_free};
    if (!px.rgba)
      reply_failure(allocation_failed ? out_of_memory()
                                      : std::string("the image could not be decoded: ") + stbi_failure_reason());
  }
  Reply r;
  r.original_width = px.w;
  r.original_height = px.h;
  if (std::max(px.w, px.h) <= req.max_side && encoded.size() <= req.max_bytes) {
    r.status = 1;
    r.width = px.w;
    r.height = px.h;
    write_all(kReplyFd, &r, sizeof r);
    ::_exit(0);
  }
  const unsigned char* rgba = px.rgba.get();
  bool alpha = false;
  for (std::size_t i = 3; i < px.size(); i += 4)
    if (rgba[i] != 255) {
      alpha = true;
      break;
    }
  double scale = std::min(1.0, static_cast<double>(req.max_side) / std::max(px.w, px.h));
  std::vector<unsigned char> out;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int w = std::max(1, static_cast<int>(std::lround(px.w * scale)));
    const int h = std::max(1, static_cast<int>(std::lround(px.h * scale)));
    std::vector<unsigned char> small(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 4);
    if (!stbir_resize_uint8(rgba, px.w, px.h, 0, small.data(), w, h, 0, 4))
      reply_failure(allocation_failed ? out_of_memory() : "the image could not be scaled");
    out.clear();
    auto sink = [](void* context, void* data, int size) {
      auto* v = static_cast<std::vector<unsigned char>*>(context);
      v->insert(v->end(), static_cast<unsigned char*>(data), static_cast<unsigned char*>(data) + size);
    };
    const int ok = alpha ? stbi_write_png_to_func(sink, &out, w, h, 4, small.data(), w * 4)
                         : stbi_write_jpg_to_func(sink, &out, w, h, 4, small.data(), 85);
    if (!ok) reply_failure(allocation_failed ? out_of_memory() : "the scaled image could not be encoded");
    r.width = w;
    r.height = h;
    if (out.size() <= req.max_bytes) break;
    scale *= 0.7;
  }
  if (out.size() > req.max_bytes) reply_failure("the image stays too large even scaled down");
  r.status = 2;
  r.png = alpha ? 1 : 0;
  r.length = out.size();
  write_all(kReplyFd, &r, sizeof r);
  write_all(kReplyFd, out.data(), out.size());
  ::_exit(0);
}

template <typename T>
bool parse_number(std::string_view text, T& value) {
  return !text.empty() && std::from_chars(text.data(), text.data() + text.size(), value).ec == std::errc() && value > 0;
}

// ---------------------------------------------------------------------------------------------
// The server's side

// At most kConcurrentDecodes decoders at once; a call waits its turn up to a bound.
class DecodeSlot {
 public:
  explicit DecodeSlot(std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    if (!freed_.wait_for(lock, wait, [] { return running_ < kConcurrentDecodes; }))
      throw Error(fmt::format("{} other image previews are being made and none ended within {} s; try again",
                              kConcurrentDecodes, wait.count() / 1000));
    ++running_;
  }
  ~DecodeSlot() {
    {
      std::lock_guard lock(mutex_);
      --running_;
    }
    freed_.notify_one();
  }
  DecodeSlot(const DecodeSlot&) = delete;
  DecodeSlot& operator=(const DecodeSlot&) = delete;

 private:
  static inline std::mutex mutex_;
  static inline std::condition_variable freed_;
  static inline int running_ = 0;
};

// `data` in a sealed memory file at offset 0: the decoder's stdin, which nobody can change.
UniqueFd sealed_copy(std::string_view data) {
  UniqueFd fd(::memfd_create("ns-hpc-image", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw SysError(errno, "memfd_create", "the image for its decoder");
  for (std::size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SysError(errno, "write", "the image for its decoder");
    done += static_cast<std::size_t>(n);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
    throw SysError(errno, "seal", "the image for its decoder");
  if (::lseek(fd.get(), 0, SEEK_SET) < 0) throw SysError(errno, "lseek", "the image for its decoder");
  return fd;
}

}  // namespace

int image_preview_main(int argc, char** argv) {
  // ns-hpc __image-preview MIME MAX_SIDE MAX_BYTES MAX_PIXELS; the image on stdin, the reply on stdout.
  DecodeRequest req;
  if (argc != 6 || !parse_number(argv[3], req.max_side) || !parse_number(argv[4], req.max_bytes) ||
      !parse_number(argv[5], req.max_pixels)) {
    std::fprintf(stderr, "usage: ns-hpc %s MIME MAX_SIDE MAX_BYTES MAX_PIXELS (started by the server)\n",
                 std::string(kImagePreviewCommand).c_str());
    return 2;
  }
  req.mime = argv[2];
  // No descriptor beyond stdin, stdout and stderr, no core, no new privileges, then the filter.
  ::prctl(PR_SET_DUMPABLE, 0);
  const rlimit none{0, 0};
  ::setrlimit(RLIMIT_NOFILE, &none);
  ::setrlimit(RLIMIT_CORE, &none);
  if (rlimit as{}; ::getrlimit(RLIMIT_AS, &as) == 0) memory_limit = as.rlim_cur;
  struct stat input{};
  const bool sized = ::fstat(STDIN_FILENO, &input) == 0 && S_ISREG(input.st_mode);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || !confine())
    reply_failure("the image decoder could not confine itself (no_new_privs and a seccomp filter)");
  try {
    std::string encoded;
    if (sized) encoded.reserve(static_cast<std::size_t>(input.st_size));  // not twice its size when grown
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) reply_failure(fmt::format("the image could not be read: {}", std::strerror(errno)));
      if (n == 0) break;
      encoded.append(buf, static_cast<std::size_t>(n));
    }
    decode(encoded, req);
  } catch (const std::bad_alloc&) {
    reply_failure(out_of_memory());
  }
}

Thumbnail make_thumbnail(std::string_view encoded, std::string_view mime, const ImageLimits& limits) {
  if (mime != "image/webp" && mime != "image/png" && mime != "image/jpeg" && mime != "image/gif")
    throw Error(fmt::format("{} images are not decoded (only PNG, JPEG, GIF and WebP)", mime));
  const DecodeSlot slot(limits.queue_wait);
  UniqueFd input = sealed_copy(encoded);
  Pipe pipe = make_pipe();
  UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull) throw SysError(errno, "open", "/dev/null (the image decoder's stderr)");
  SpawnSpec spec;
  spec.program = limits.program.empty() ? fs::self_program("the image decoder") : limits.program;
  spec.argv = {spec.program,
               std::string(kImagePreviewCommand),
               std::string(mime),
               std::to_string(limits.max_side),
               std::to_string(limits.max_bytes),
               std::to_string(limits.max_pixels)};
  spec.envp = std::vector<std::string>{};
  // stdout may be the MCP stream: the decoder's is the reply pipe, its stderr goes nowhere.
  spec.fds = {{input.get(), STDIN_FILENO}, {pipe.write.get(), STDOUT_FILENO}, {devnull.get(), STDERR_FILENO}};
  const auto cpu_seconds = static_cast<rlim_t>(std::max<std::int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(limits.timeout).count() + 1));
  spec.rlimits = {{RLIMIT_AS, static_cast<rlim_t>(limits.max_memory)}, {RLIMIT_CPU, cpu_seconds}};
  spec.die_with_parent = SIGKILL;
  SpawnedChild child = spawn(spec);  // killed and reaped on every way out
  pipe.write.reset();
  input.reset();
  std::string reply;
  const auto deadline = std::chrono::steady_clock::now() + limits.timeout;
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw Error(fmt::format("the image decoder took longer than {} ms and was killed",
                                                   limits.timeout.count()));
    pollfd p{pipe.read.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = ::read(pipe.read.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "read", "the image decoder's reply");
    }
    if (n == 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
    if (reply.size() > limits.max_bytes + sizeof(Reply) + 65536) throw Error("the image decoder sent too much");
  }
  const int status = child.wait("the image decoder");
  if (WIFSIGNALED(status))
    throw Error(fmt::format("the image decoder was killed by signal {}{} (a corrupt or hostile image?)",
                            WTERMSIG(status),
                            WTERMSIG(status) == SIGSYS   ? ", a forbidden system call"
                            : WTERMSIG(status) == SIGXCPU ? ", out of CPU time"
                                                          : ""));
  Reply r;
  if (reply.size() < sizeof r) throw Error(fmt::format("the image decoder failed (exit status {})", WEXITSTATUS(status)));
  std::memcpy(&r, reply.data(), sizeof r);
  std::string payload = reply.substr(sizeof r);
  if (payload.size() != r.length) throw Error("the image decoder's reply was cut short");
  if (r.status == 0) throw Error(payload);
  Thumbnail t;
  t.original_width = r.original_width;
  t.original_height = r.original_height;
  t.width = r.width;
  t.height = r.height;
  if (r.status == 1) {
    t.data = std::string(encoded);
    t.mime = std::string(mime);
  } else {
    t.data = std::move(payload);
    t.mime = r.png ? "image/png" : "image/jpeg";
    t.scaled = true;
  }
  return t;
}

}  // namespace nshpc::files
