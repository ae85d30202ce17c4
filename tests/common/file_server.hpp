// A static file server on 127.0.0.1 for tests: GET of a file below one folder, HTTP/1.0, one
// connection at a time, on a thread of its own. Enough for apt (a local repository of .deb files
// that an instance installs from), so that no sandbox in a test talks to anything but a server
// the test itself started on loopback.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace nshpc::tests {

class FileServer {
 public:
  explicit FileServer(std::filesystem::path root) : root_(std::move(root)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      throw std::runtime_error("the test file server cannot listen on 127.0.0.1");
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FileServer() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  FileServer(const FileServer&) = delete;
  FileServer& operator=(const FileServer&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      answer(fd);
      ::close(fd);
    }
  }

  void answer(int fd) {
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 65536) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      request.append(buf, static_cast<std::size_t>(n));
    }
    ++requests_;
    std::istringstream line(request.substr(0, request.find("\r\n")));
    std::string method, target;
    line >> method >> target;
    if (const auto q = target.find('?'); q != std::string::npos) target.resize(q);
    const std::filesystem::path file = root_ / std::filesystem::path(target).relative_path();
    std::ifstream in(file, std::ios::binary);
    const bool found = (method == "GET" || method == "HEAD") && target.find("..") == std::string::npos && in &&
                       std::filesystem::is_regular_file(file);
    std::string body;
    if (found && method == "GET") body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    const std::size_t length = found ? std::filesystem::file_size(file) : 0;
    std::string head = std::string(found ? "HTTP/1.0 200 OK" : "HTTP/1.0 404 Not Found") +
                       "\r\nContent-Length: " + std::to_string(length) + "\r\nConnection: close\r\n\r\n";
    send_all(head + body, fd);
  }

  static void send_all(const std::string& bytes, int fd) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<std::size_t>(n);
    }
  }

  std::filesystem::path root_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

}  // namespace nshpc::tests
