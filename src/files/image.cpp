#include "files/image.hpp"

#include <fcntl.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"

// The decoders, compiled into this file only, with no file I/O of their own.
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

// What the child sends back: this header, then `length` bytes (the image, or a message).
struct Reply {
  std::int32_t status = 0;  // 0 failed (message follows), 1 keep the original, 2 scaled image follows
  std::int32_t original_width = 0, original_height = 0, width = 0, height = 0;
  std::int32_t png = 0;  // the scaled image is PNG (else JPEG)
  std::uint64_t length = 0;
};

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

[[noreturn]] void child_fail(int fd, const std::string& message) {
  Reply r;
  r.length = message.size();
  write_all(fd, &r, sizeof r);
  write_all(fd, message.data(), message.size());
  ::_exit(0);
}

// The decoder child's filter: memory management, read/write on what it has, exit. Anything else
// kills it. mmap/mprotect may not make memory executable.
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

struct Pixels {
  std::vector<unsigned char> rgba;
  int w = 0, h = 0;
};

// Runs in the child (confined): decode, scale, encode, reply. Never returns.
[[noreturn]] void decode_child(int fd, std::string_view encoded, bool webp, const ImageLimits& limits) {
  Pixels px;
  if (webp) {
    if (!WebPGetInfo(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size(), &px.w, &px.h))
      child_fail(fd, "not a valid WebP image");
    if (static_cast<std::size_t>(px.w) * static_cast<std::size_t>(px.h) > limits.max_pixels)
      child_fail(fd, fmt::format("{}x{} pixels is more than the {} this server decodes", px.w, px.h, limits.max_pixels));
    uint8_t* data = WebPDecodeRGBA(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size(), &px.w, &px.h);
    if (!data) child_fail(fd, "the WebP image could not be decoded (corrupt?)");
    px.rgba.assign(data, data + static_cast<std::size_t>(px.w) * static_cast<std::size_t>(px.h) * 4);
    WebPFree(data);
  } else {
    int channels = 0;
    const auto* bytes = reinterpret_cast<const stbi_uc*>(encoded.data());
    const int len = static_cast<int>(std::min<std::size_t>(encoded.size(), INT32_MAX));
    if (!stbi_info_from_memory(bytes, len, &px.w, &px.h, &channels))
      child_fail(fd, std::string("the image could not be decoded: ") + stbi_failure_reason());
    if (static_cast<std::size_t>(px.w) * static_cast<std::size_t>(px.h) > limits.max_pixels)
      child_fail(fd, fmt::format("{}x{} pixels is more than the {} this server decodes", px.w, px.h, limits.max_pixels));
    stbi_uc* data = stbi_load_from_memory(bytes, len, &px.w, &px.h, &channels, 4);
    if (!data) child_fail(fd, std::string("the image could not be decoded: ") + stbi_failure_reason());
    px.rgba.assign(data, data + static_cast<std::size_t>(px.w) * static_cast<std::size_t>(px.h) * 4);
    stbi_image_free(data);
  }
  Reply r;
  r.original_width = px.w;
  r.original_height = px.h;
  if (std::max(px.w, px.h) <= limits.max_side && encoded.size() <= limits.max_bytes) {
    r.status = 1;
    r.width = px.w;
    r.height = px.h;
    write_all(fd, &r, sizeof r);
    ::_exit(0);
  }
  bool alpha = false;
  for (std::size_t i = 3; i < px.rgba.size(); i += 4)
    if (px.rgba[i] != 255) {
      alpha = true;
      break;
    }
  double scale = std::min(1.0, static_cast<double>(limits.max_side) / std::max(px.w, px.h));
  std::vector<unsigned char> out;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int w = std::max(1, static_cast<int>(std::lround(px.w * scale)));
    const int h = std::max(1, static_cast<int>(std::lround(px.h * scale)));
    std::vector<unsigned char> small(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 4);
    if (!stbir_resize_uint8(px.rgba.data(), px.w, px.h, 0, small.data(), w, h, 0, 4))
      child_fail(fd, "the image could not be scaled");
    out.clear();
    auto sink = [](void* context, void* data, int size) {
      auto* v = static_cast<std::vector<unsigned char>*>(context);
      v->insert(v->end(), static_cast<unsigned char*>(data), static_cast<unsigned char*>(data) + size);
    };
    const int ok = alpha ? stbi_write_png_to_func(sink, &out, w, h, 4, small.data(), w * 4)
                         : stbi_write_jpg_to_func(sink, &out, w, h, 4, small.data(), 85);
    if (!ok) child_fail(fd, "the scaled image could not be encoded");
    r.width = w;
    r.height = h;
    if (out.size() <= limits.max_bytes) break;
    scale *= 0.7;
  }
  if (out.size() > limits.max_bytes) child_fail(fd, "the image stays too large even scaled down");
  r.status = 2;
  r.png = alpha ? 1 : 0;
  r.length = out.size();
  write_all(fd, &r, sizeof r);
  write_all(fd, out.data(), out.size());
  ::_exit(0);
}

// A forked child: killed and reaped when this goes out of scope unless already reaped.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_;
};

}  // namespace

Thumbnail make_thumbnail(std::string_view encoded, std::string_view mime, const ImageLimits& limits) {
  const bool webp = mime == "image/webp";
  if (!webp && mime != "image/png" && mime != "image/jpeg" && mime != "image/gif")
    throw Error(fmt::format("{} images are not decoded (only PNG, JPEG, GIF and WebP)", mime));
  Pipe pipe = make_pipe();
  // Everything the child needs exists before fork. glibc's fork keeps malloc usable in the child
  // of a threaded process, which the decoders need.
  UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  const pid_t pid = ::fork();
  if (pid < 0) throw SysError(errno, "fork", "the image decoder");
  if (pid == 0) {
    // Only the reply pipe stays open (as fd 3); stdio goes to /dev/null (stdout may be the MCP
    // stream). Then limits, no new privileges, the filter.
    int out = pipe.write.get();
    if (out != 3) {
      if (::dup2(out, 3) < 0) ::_exit(2);
      out = 3;
    }
    if (devnull) {
      ::dup2(devnull.get(), 0);
      ::dup2(devnull.get(), 1);
      ::dup2(devnull.get(), 2);
    }
    ::close_range(4, ~0U, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const rlimit mem{1024UL << 20, 1024UL << 20};
    ::setrlimit(RLIMIT_AS, &mem);
    const rlimit cpu{10, 10};
    ::setrlimit(RLIMIT_CPU, &cpu);
    const rlimit files{0, 0};
    ::setrlimit(RLIMIT_NOFILE, &files);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || !confine()) ::_exit(4);
    decode_child(out, encoded, webp, limits);
  }
  Child child(pid);
  pipe.write.reset();
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
  const int status = child.wait();
  if (WIFSIGNALED(status))
    throw Error(fmt::format("the image decoder was killed by signal {}{} (a corrupt or hostile image?)",
                            WTERMSIG(status), WTERMSIG(status) == SIGSYS ? ", a forbidden system call" : ""));
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
