#include "desktop/wire.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.hpp"

namespace nshpc::desktop {

namespace {

void put_u32(char* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

std::uint32_t get_u32(const char* in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

void write_all(int fd, const char* data, std::size_t size,
               std::optional<std::chrono::steady_clock::time_point> deadline) {
  while (size > 0) {
    // send, not write: a peer gone is EPIPE, never a SIGPIPE that ends the writer.
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      int wait_ms = -1;
      if (deadline) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) throw Error("the frame was not taken in time");
        wait_ms = static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1 << 30));
      }
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, wait_ms) < 0 && errno != EINTR) throw SysError(errno, "poll");
      continue;
    }
    if (n < 0) throw SysError(errno, "send", "a display agent frame");
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Reads exactly `size` bytes before `deadline`.
void read_exactly(int fd, char* out, std::size_t size, std::chrono::steady_clock::time_point deadline) {
  while (size > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw Error("no answer in time");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw SysError(errno, "poll");
    if (r == 0) continue;  // the deadline check above ends it
    const ssize_t n = ::read(fd, out, size);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) throw SysError(errno, "read");
    if (n == 0) throw Error("the connection was closed");
    out += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

void write_frame(int fd, const nlohmann::json& header, std::string_view payload,
                 std::optional<std::chrono::steady_clock::time_point> deadline) {
  const std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  char head[4];
  char tail[4];
  put_u32(head, static_cast<std::uint32_t>(text.size()));
  put_u32(tail, static_cast<std::uint32_t>(payload.size()));
  std::string frame;
  frame.reserve(8 + text.size() + payload.size());
  frame.append(head, 4).append(text).append(tail, 4).append(payload);
  write_all(fd, frame.data(), frame.size(), deadline);
}

Frame read_frame(int fd, std::chrono::steady_clock::time_point deadline, std::size_t max_header,
                 std::size_t max_payload) {
  char size[4];
  read_exactly(fd, size, 4, deadline);
  const std::uint32_t header_size = get_u32(size);
  if (header_size > max_header) throw Error(fmt::format("a header of {} bytes (at most {})", header_size, max_header));
  std::string text(header_size, '\0');
  read_exactly(fd, text.data(), text.size(), deadline);
  Frame frame;
  frame.header = nlohmann::json::parse(text, nullptr, false);
  if (!frame.header.is_object()) throw Error("a header that is not a JSON object");
  read_exactly(fd, size, 4, deadline);
  const std::uint32_t payload_size = get_u32(size);
  if (payload_size > max_payload)
    throw Error(fmt::format("a payload of {} bytes (at most {})", payload_size, max_payload));
  frame.payload.resize(payload_size);
  read_exactly(fd, frame.payload.data(), frame.payload.size(), deadline);
  return frame;
}

}  // namespace nshpc::desktop
