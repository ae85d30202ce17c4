// WebDAV figures, each beside its reference measured in the same run (make bench):
//  - GET of a 1 GiB file through /dav vs the same curl against a minimal sendfile(2) server that
//    this program starts itself (goal: >= 0.8x);
//  - PROPFIND Depth: 1 of a folder of 1,000 files (Apache mod_dav: 27 ms on this kind of machine).
// Both with curl on loopback, warm page cache, median of the runs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/loopback.hpp"

namespace stdfs = std::filesystem;

namespace {

using nshpc::tests::free_port;


constexpr const char* kToken = "bench-dav-token-0123456789abcdef";

std::string run(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// The reference: reads a request header, answers 200 with the whole file by sendfile(2), one
// connection at a time, keep-alive off. Nothing else (what a minimal static server does).
class SendfileServer {
 public:
  SendfileServer(const stdfs::path& file) : file_(file) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listener_, 16);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~SendfileServer() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    thread_.join();
  }
  std::uint16_t port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        head.append(buf, static_cast<std::size_t>(n));
      }
      const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      ::fstat(fd, &st);
      const std::string header = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " +
                                 std::to_string(st.st_size) + "\r\nConnection: close\r\n\r\n";
      [[maybe_unused]] ssize_t w = ::write(c, header.data(), header.size());
      off_t off = 0;
      while (off < st.st_size)
        if (::sendfile(c, fd, &off, static_cast<std::size_t>(st.st_size - off)) <= 0) break;
      ::close(fd);
      ::close(c);
    }
  }
  stdfs::path file_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string binary = argc > 1 ? argv[1] : NSHPC_BINARY;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  char tmpl[] = "/tmp/nshpc-bench-dav-XXXXXX";
  const stdfs::path root = ::mkdtemp(tmpl);
  const stdfs::path config = root / "config.toml";
  std::ofstream(config) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "instances").string() << "\"\n[server]\nauth_token = \""
                        << kToken << "\"\nstate_dir = \"" << (root / "state").string() << "\"\n[dav]\nenabled = true\n";
  const std::string cli = binary + " --config " + config.string();
  run(cli + " instance create bench-dav >/dev/null 2>&1");
  const stdfs::path ws = root / "instances/bench-dav/workspace";
  // A 1 GiB file, and a folder of 1,000 small files.
  run("head -c 1073741824 /dev/zero > " + (ws / "big.bin").string());
  stdfs::create_directories(ws / "many");
  for (int i = 0; i < 1000; ++i) std::ofstream(ws / "many" / ("file-" + std::to_string(i) + ".txt")) << i;
  if (::geteuid() == 0) run("chown -R 65534:65534 " + ws.string());
  run("cat " + (ws / "big.bin").string() + " > /dev/null");  // warm cache

  const std::uint16_t port = free_port();
  const pid_t server = ::fork();
  if (server == 0) {
    const std::string p = std::to_string(port);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 2);  // its start-up banner
    ::execl(binary.c_str(), binary.c_str(), "--config", config.c_str(), "run", "-t", "http", "--port", p.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  for (int i = 0; i < 100 && run("curl -s -o /dev/null -w '%{http_code}' " + base + "/healthz") != "200"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));

  SendfileServer reference(ws / "big.bin");
  const std::string ref_url = "http://127.0.0.1:" + std::to_string(reference.port()) + "/big.bin";
  const std::string dav_url = base + "/dav/instances/bench-dav/workspace/big.bin";
  std::vector<double> dav_speed, ref_speed;
  for (int i = 0; i < runs; ++i) {
    // Alternated, so that both see the same machine load.
    ref_speed.push_back(std::atof(run("curl -s -o /dev/null -w '%{speed_download}' " + ref_url).c_str()));
    dav_speed.push_back(
        std::atof(run("curl -s -o /dev/null -u bench:" + std::string(kToken) + " -w '%{speed_download}' " + dav_url).c_str()));
  }
  const double dav = median(dav_speed) / 1e9, ref = median(ref_speed) / 1e9;
  std::printf("WebDAV GET 1 GiB          /dav %.2f GB/s   minimal sendfile server %.2f GB/s   ratio %.2f (goal >= 0.80)\n", dav,
              ref, ref > 0 ? dav / ref : 0.0);

  std::vector<double> propfind_ms;
  std::string size;
  for (int i = 0; i < std::max(runs, 5); ++i) {
    const std::string out = run("curl -s -o /dev/null -u bench:" + std::string(kToken) +
                                " -X PROPFIND -H 'Depth: 1' -w '%{time_total} %{size_download}' " + base +
                                "/dav/instances/bench-dav/workspace/many/");
    propfind_ms.push_back(std::atof(out.c_str()) * 1000);
    size = out.substr(out.find(' ') + 1);
  }
  std::printf("WebDAV PROPFIND Depth 1   1,000 entries %.1f ms (%s bytes)   Apache mod_dav reference 27 ms (goal <= 30 ms)\n",
              median(propfind_ms), size.c_str());

  ::kill(server, SIGTERM);
  ::waitpid(server, nullptr, 0);
  stdfs::remove_all(root);
  return 0;
}
