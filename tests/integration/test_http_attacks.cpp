// The HTTP server under attack by a token holder, a sandbox or another local user (issue 10:
// unread responses that grew memory, half-open connections that locked everyone out, one session
// that held every worker). The real ns-hpc binary on 127.0.0.1; every loop is bounded in count
// and time, and every bound asserted is generous: the outcome matters, not the speed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/json.hpp"
#include "common/loopback.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nshpc::tests::closed_within;
using nshpc::tests::free_port;
using nshpc::tests::read_some;
using nshpc::tests::send_all;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr const char* kToken = "attack-test-token-0123456789abcdef0123";
constexpr std::uint32_t kNobody = 65534;  // the sandbox uid of a root-run server

// A socket, closed on scope exit.
struct Socket {
  int fd = -1;
  Socket() = default;
  explicit Socket(int f) : fd(f) {}
  Socket(Socket&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Socket() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

Socket connect_to(std::uint16_t port, int receive_buffer = 0) {
  return Socket(nshpc::tests::connect_loopback(port, receive_buffer));
}

bool has_header_block(const std::string& s) { return s.find("\r\n\r\n") != std::string::npos; }

std::string post_bytes(const json& message, const std::string& session = "", bool close = true) {
  const std::string body = message.dump();
  std::string s = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + std::string(kToken) +
                  "\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                  "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (!session.empty()) s += "Mcp-Session-Id: " + session + "\r\nMCP-Protocol-Version: 2025-11-25\r\n";
  if (close) s += "Connection: close\r\n";
  return s + "\r\n" + body;
}

json request(int id, const std::string& method, json params = json::object()) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}};
}

json initialize_message() {
  return request(1, "initialize",
                 {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()}, {"clientInfo", {{"name", "attack-test"}, {"version", "1"}}}});
}

json tool_call(int id, const std::string& tool, json arguments) {
  return request(id, "tools/call", {{"name", tool}, {"arguments", std::move(arguments)}});
}

struct Answer {
  int status = 0;
  std::string session;  // Mcp-Session-Id
  std::string raw;
  json rpc;  // the JSON-RPC message answering the request (plain JSON or the SSE event)
};

Answer parse_answer(const std::string& raw) {
  Answer a;
  a.raw = raw;
  const auto head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) return a;
  a.status = std::atoi(raw.c_str() + 9);
  std::string head = raw.substr(0, head_end);
  std::string lower = head;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (auto at = lower.find("mcp-session-id:"); at != std::string::npos) {
    auto value = head.substr(at + 15, head.find("\r\n", at) - at - 15);
    value.erase(0, value.find_first_not_of(' '));
    a.session = value;
  }
  // Every JSON object in the body that answers a request (SSE "data:" lines or a plain body).
  const std::string body = raw.substr(head_end + 4);
  for (std::size_t pos = 0; (pos = body.find("{\"", pos)) != std::string::npos; ++pos) {
    const auto end = body.find('\n', pos);
    json j = nshpc::parse_json_or_discarded(body.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (j.is_object() && j.contains("id") && (j.contains("result") || j.contains("error"))) {
      a.rpc = j;
      break;
    }
    if (end == std::string::npos) break;
    pos = end;
  }
  return a;
}

// One request on its own connection (Connection: close): its whole answer.
Answer roundtrip(std::uint16_t port, const json& message, const std::string& session = "",
                std::chrono::milliseconds wait = 30s) {
  Socket s = connect_to(port);
  if (s.fd < 0) return {};
  if (!send_all(s.fd, post_bytes(message, session))) return {};
  return parse_answer(read_some(s.fd, wait, nullptr, 64 << 20));
}

// The server, started with `ns-hpc run -t http` on a free port; stopped with SIGTERM.
class Server {
 public:
  explicit Server(const Env& env) : port_(free_port()) {
    pid_ = env.start({"run", "-t", "http", "--port", std::to_string(port_)});
    ready_ = eventually(
        [&] {
          Socket s = connect_to(port_);
          if (s.fd < 0) return false;
          send_all(s.fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
          return read_some(s.fd, 2s, nullptr).find("200 OK") != std::string::npos;
        },
        20s);
  }
  ~Server() { stop(); }
  int stop() {
    if (pid_ <= 0) return rc_;
    ::kill(pid_, SIGTERM);
    rc_ = wait_child(pid_, 30s);
    pid_ = -1;
    return rc_;
  }
  bool ready() const { return ready_; }
  std::uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }

  // VmRSS of the server, in MiB (-1 when it cannot be read).
  long rss_mib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6) / 1024;
    return -1;
  }

  // initialize + notifications/initialized; the session id ("" when refused).
  std::string open_session() const {
    const Answer init = roundtrip(port_, initialize_message());
    if (init.status != 200 || init.session.empty()) return {};
    Socket s = connect_to(port_);
    send_all(s.fd, post_bytes(json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}, init.session));
    read_some(s.fd, 5s, nullptr);
    return init.session;
  }
  void end_session(const std::string& id) const {
    Socket s = connect_to(port_);
    send_all(s.fd, "DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + std::string(kToken) +
                       "\r\nMcp-Session-Id: " + id + "\r\nConnection: close\r\n\r\n");
    read_some(s.fd, 10s, nullptr);
  }

 private:
  std::uint16_t port_;
  pid_t pid_ = -1;
  int rc_ = -1;
  bool ready_ = false;
};

std::string server_config(const std::string& extra = "") {
  return "[server]\nauth_token = \"" + std::string(kToken) + "\"\n" + extra;
}

// A well-behaved client: a session, tools/list, and a tool call that answers at once.
void expect_a_client_is_served(const Server& server, std::chrono::seconds bound) {
  const auto start = std::chrono::steady_clock::now();
  const std::string sid = server.open_session();
  ASSERT_FALSE(sid.empty()) << "initialize failed";
  const Answer tools = roundtrip(server.port(), request(2, "tools/list"), sid);
  ASSERT_EQ(tools.status, 200) << tools.raw.substr(0, 500);
  EXPECT_TRUE(tools.rpc["result"]["tools"].is_array()) << tools.raw.substr(0, 500);
  EXPECT_LT(std::chrono::steady_clock::now() - start, bound);
  server.end_session(sid);
}

void raise_own_fd_limit() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
}

}  // namespace

// Item 5: sessions whose clients never read the ~4 MB answers of terminal_execute (2 MB printed,
// sent as text and as structuredContent). Before: 2 × 32 such calls took the server from 33 MiB
// to 5.6 GiB, and 4 GiB stayed. Now what is held per session and in all is capped, the rest of
// the work is refused, and the memory goes back once the sessions end. Results are cut to
// [mcp] max_result_chars (30,000 by default), so this raises it to its maximum: the answers are
// as large as an operator can make them, and the caps must still hold.
TEST(HttpAttacks, UnreadLargeResponsesDoNotGrowTheServer) {
  Env env(server_config() + "[mcp]\nmax_result_chars = 10000000\n");
  env.create("mem");
  Server server(env);
  ASSERT_TRUE(server.ready());
  std::vector<std::string> sessions;
  for (int i = 0; i < 3; ++i) sessions.push_back(server.open_session());
  for (const auto& s : sessions) ASSERT_FALSE(s.empty());

  const json print_2mb = {{"instance_id", "mem"}, {"command", "head -c 2000000 /dev/zero | tr '\\0' x"}};
  std::vector<Socket> unread;
  long peak = 0;
  for (int call = 0; call < 20; ++call)
    for (const auto& sid : sessions) {
      Socket s = connect_to(server.port(), 4096);  // a small window: the answer stays with the server
      ASSERT_GE(s.fd, 0);
      ASSERT_TRUE(send_all(s.fd, post_bytes(tool_call(100 + call, "terminal_execute", print_2mb), sid, false)));
      unread.push_back(std::move(s));
      peak = std::max(peak, server.rss_mib());
    }
  // While the commands run and their answers pile up, unread.
  const auto until = std::chrono::steady_clock::now() + 15s;
  while (std::chrono::steady_clock::now() < until) {
    peak = std::max(peak, server.rss_mib());
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_GT(peak, 0);
  EXPECT_LT(peak, 600) << "MiB while attacked";
  // The server said why it did not take more: a cap or a byte budget, by its config key.
  int refusals = 0;
  for (const Socket& s : unread) {
    char buf[4096];
    const ssize_t n = ::recv(s.fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 && std::string(buf, static_cast<std::size_t>(n)).find("\"limit\":\"server.max_") != std::string::npos) ++refusals;
  }
  EXPECT_GT(refusals, 0);

  // The connections close and the sessions end: the memory goes back.
  unread.clear();
  for (const auto& sid : sessions) server.end_session(sid);
  long after = -1;
  EXPECT_TRUE(eventually(
      [&] {
        after = server.rss_mib();
        return after >= 0 && after < 150;
      },
      20s))
      << "RSS " << after << " MiB after the sessions ended (peak " << peak << " MiB)";
  std::cout << "[  NOTE    ] server RSS: peak " << peak << " MiB while attacked, " << after << " MiB after\n";
  expect_a_client_is_served(server, 30s);
  EXPECT_EQ(server.stop(), 0);
}

// Item 7: ~1,200 half-open requests (a slowloris from a sandbox or another local user, here
// from this test's own uid, the hardest case: the attacker looks like the client). Before: with
// the fd limit at 1024 the server was unreachable for ~25 s per wave. Now a new client always
// gets in (the connection that waited longest for its header makes room) and the header timeout
// closes the attackers' connections.
TEST(HttpAttacks, HalfOpenConnectionsDoNotLockOutAClient) {
  raise_own_fd_limit();
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const std::size_t count = std::min<std::size_t>(1200, rl.rlim_cur > 300 ? rl.rlim_cur - 200 : 100);
  Env env(server_config("header_timeout = 3\n"));
  Server server(env);
  ASSERT_TRUE(server.ready());

  std::vector<Socket> attack;
  const auto started = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < count && std::chrono::steady_clock::now() - started < 60s; ++i) {
    Socket s = connect_to(server.port());
    if (s.fd < 0) break;
    send_all(s.fd, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + std::string(kToken) + "\r\n");
    attack.push_back(std::move(s));
  }
  EXPECT_GE(attack.size(), std::min<std::size_t>(count, 1000)) << "could not open the attack's connections";
  // Under attack, a client is served.
  expect_a_client_is_served(server, 20s);
  // The header timeout (3 s here) ends every half-open connection.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  std::size_t still_open = 0;
  for (const Socket& s : attack) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    still_open += closed_within(s.fd, left) ? 0 : 1;
  }
  EXPECT_EQ(still_open, 0u);
  expect_a_client_is_served(server, 20s);
  EXPECT_EQ(server.stop(), 0);
}

// Item 8: one session fills its cap of requests in flight with long waits; its next request
// gets an error naming the cap and its key, and another session's quick call is served at once
// (before: 512+ waits held the shared workers and list_instances waited 28 s). Sessions beyond
// the per-peer cap are refused, while another peer (as root: uid 65534, as a sandbox would be)
// still opens one.
TEST(HttpAttacks, OneSessionAtItsCapDoesNotStarveOthers) {
  Env env(server_config("max_sessions_per_peer = 3\n"));
  env.create("waits");
  Server server(env);
  ASSERT_TRUE(server.ready());
  const std::string busy = server.open_session();
  ASSERT_FALSE(busy.empty());
  const std::string marker = "61.77";  // in the sleep's argv (words are NUL-separated there)
  const json long_wait = {{"instance_id", "waits"}, {"command", "sleep " + marker}, {"timeout", 120}};
  // The session's 16 long waits ([server] max_requests_per_session): each is accepted (its SSE
  // stream opens) before the next is sent.
  std::vector<Socket> waiting;
  for (int i = 0; i < 16; ++i) {
    Socket s = connect_to(server.port());
    ASSERT_TRUE(send_all(s.fd, post_bytes(tool_call(10 + i, "terminal_execute", long_wait), busy, false)));
    const std::string head = read_some(s.fd, 20s, has_header_block);
    ASSERT_NE(head.find("text/event-stream"), std::string::npos) << "call " << i << ": " << head.substr(0, 600);
    waiting.push_back(std::move(s));
  }
  const Answer refused = roundtrip(server.port(), tool_call(40, "list_instances", json::object()), busy, 20s);
  EXPECT_EQ(refused.status, 200) << refused.raw.substr(0, 500);
  EXPECT_EQ(refused.rpc["id"], 40);
  EXPECT_NE(refused.rpc["error"].value("message", "").find("[server] max_requests_per_session"), std::string::npos)
      << refused.raw.substr(0, 800);
  EXPECT_EQ(refused.rpc["error"]["data"]["limit"], "server.max_requests_per_session");

  // Another session is served promptly.
  const std::string quick = server.open_session();
  ASSERT_FALSE(quick.empty());
  const auto start = std::chrono::steady_clock::now();
  const Answer listed = roundtrip(server.port(), tool_call(2, "list_instances", json::object()), quick, 20s);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(listed.status, 200);
  EXPECT_NE(listed.raw.find("waits"), std::string::npos) << listed.raw.substr(0, 800);
  EXPECT_LT(took, 10s);

  // The third session of this peer is its last (max_sessions_per_peer = 3 here).
  EXPECT_FALSE(server.open_session().empty());
  const Answer fourth = roundtrip(server.port(), initialize_message());
  EXPECT_EQ(fourth.status, 429) << fourth.raw.substr(0, 500);
  EXPECT_NE(fourth.raw.find("[server] max_sessions_per_peer"), std::string::npos) << fourth.raw.substr(0, 500);
  EXPECT_NE(fourth.raw.find("uid " + std::to_string(::geteuid())), std::string::npos)
      << "a loopback client is known by its uid: " << fourth.raw.substr(0, 500);

  if (::geteuid() == 0) {
    // Another local user (here the sandboxes' uid) still gets a session of its own.
    const pid_t child = ::fork();
    if (child == 0) {
      if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(3);
      const Answer a = roundtrip(server.port(), initialize_message(), "", 20s);
      ::_exit(a.status == 200 && !a.session.empty() ? 0 : 1);
    }
    EXPECT_EQ(wait_child(child, 30s), 0) << "uid 65534 could not open a session";
  } else {
    std::cout << "[  NOTE    ] another peer's session: needs root to connect as another uid; checked as root\n";
  }

  // Ending the busy session cancels its waits: the sandboxes go.
  EXPECT_TRUE(eventually([&] { return !processes_with(marker).empty(); }, 20s)) << "the waits never ran";
  waiting.clear();
  server.end_session(busy);
  EXPECT_TRUE(eventually([&] { return processes_with(marker).empty(); }, 20s)) << "the waits' sandboxes are still running";
  EXPECT_EQ(server.stop(), 0);
}
