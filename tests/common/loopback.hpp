// A test's side of a TCP connection to a server on 127.0.0.1, shared by the HTTP unit tests and
// the HTTP attack tests: connect, send everything, read with a deadline, wait for the close.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace nshpc::tests {

// A free TCP port on 127.0.0.1 (bound and released; a server started right after takes it).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A connected socket to 127.0.0.1:`port` (close-on-exec; SO_RCVBUF set first when
// `receive_buffer` > 0), or -1 when the connection is refused.
inline int connect_loopback(std::uint16_t port, int receive_buffer = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (receive_buffer > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends all of `bytes` (no SIGPIPE); false when the peer stopped taking them.
inline bool send_all(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Appends what arrives on `fd` to `out` until `enough(out)` says so, the peer closes, `out` holds
// `limit` bytes or `wait` passed.
inline void read_into(int fd, std::string& out, std::chrono::milliseconds wait,
                      const std::function<bool(const std::string&)>& enough = nullptr,
                      std::size_t limit = std::string::npos) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char buf[16384];
  while (fd >= 0 && !(enough && enough(out)) && out.size() < limit) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, limit - out.size()), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

// What arrives on `fd` within `wait` (see read_into).
inline std::string read_some(int fd, std::chrono::milliseconds wait,
                             const std::function<bool(const std::string&)>& enough = nullptr,
                             std::size_t limit = std::string::npos) {
  std::string out;
  read_into(fd, out, wait, enough, limit);
  return out;
}

// True once the peer closed `fd` (EOF or reset) within `wait`; what it sent first is dropped.
inline bool closed_within(int fd, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
}

}  // namespace nshpc::tests
