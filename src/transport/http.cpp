// The HTTP transports: listener, connections (Beast on Asio coroutines, one class for TCP and
// Unix sockets), request checks (Host, Origin, token, limits) and the MCP endpoints. Sessions
// and streams are in http_session.cpp.
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <csignal>
#include <cstring>
#include <set>
#include <filesystem>
#include <list>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "base/text.hpp"
#include "transport/http_internal.hpp"
#include "transport/mcp_headers.hpp"

namespace nshpc::transport {

namespace http_detail {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;
using asio::awaitable;
using tcp = asio::ip::tcp;
using unix_socket = asio::local::stream_protocol;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

using Request = bhttp::request<bhttp::string_body>;
using Response = bhttp::response<bhttp::string_body>;

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The value of `name` in a query string, percent-decoding not needed for our hex ids.
std::optional<std::string> query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) == name)
      return std::string(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1));
  }
  return std::nullopt;
}

bool accepts(std::string_view accept, std::string_view type) {
  if (accept.empty()) return true;  // no Accept header: anything
  const std::string a = lower(accept);
  if (a.find(type) != std::string::npos || a.find("*/*") != std::string::npos) return true;
  const std::string major = std::string(type.substr(0, type.find('/'))) + "/*";
  return a.find(major) != std::string::npos;
}

// The allowed Host names, lower-case; "*" in the set accepts any.
struct HostRules {
  std::set<std::string, std::less<>> hosts;
  std::set<std::string, std::less<>> origins;  // exact Origin values
  bool any_host = false;
  bool any_origin = false;

  static HostRules from(const HttpOptions& o) {
    HostRules r;
    r.hosts = {"localhost", "127.0.0.1", "::1"};
    const std::string bind = lower(o.host);
    if (bind == "0.0.0.0" || bind == "::" || bind.empty()) {
      char name[256] = {};
      if (::gethostname(name, sizeof name - 1) == 0 && name[0]) {
        std::string h = lower(name);
        r.hosts.insert(h);
        r.hosts.insert(h.substr(0, h.find('.')));
      }
    } else {
      r.hosts.insert(host_of(bind.find(':') != std::string::npos && bind.front() != '[' ? "[" + bind + "]" : bind));
    }
    for (const std::string& h : o.allowed_hosts) {
      if (h == "*") r.any_host = true;
      else r.hosts.insert(host_of(h));
    }
    for (const std::string& origin : o.allowed_origins) {
      if (origin == "*") r.any_origin = true;
      else r.origins.insert(lower(origin));
    }
    return r;
  }

  bool host_ok(std::string_view header) const {
    if (any_host || header.empty()) return true;  // no Host (HTTP/1.0): nothing to rebind
    const std::string h = host_of(header);
    return hosts.count(h) > 0 || is_loopback_host(h);
  }

  bool origin_ok(std::string_view origin) const {
    if (origin.empty() || any_origin) return true;
    const std::string o = lower(text::trim(origin));
    if (origins.count(o)) return true;
    for (std::string_view scheme : {"http://", "https://"}) {
      if (o.rfind(scheme, 0) == 0) {
        std::string_view authority = std::string_view(o).substr(scheme.size());
        authority = authority.substr(0, authority.find('/'));
        if (authority.empty()) return false;
        const std::string h = host_of(authority);
        return hosts.count(h) > 0 || is_loopback_host(h);
      }
    }
    return false;  // "null" and anything else
  }
};

// ---------------------------------------------------------------------------------------------
// The listener: open connections and the caps on them.

// The connections the server may hold at once: max_connections, kept below the open-file limit
// with room for what else the server opens (sandboxes' pipes, job files, the store).
std::size_t connection_cap(std::size_t wanted) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
  const std::size_t soft = static_cast<std::size_t>(rl.rlim_cur);
  const std::size_t room = soft > 512 ? soft - std::max<std::size_t>(256, soft / 4) : std::max<std::size_t>(soft / 2, 1);
  if (room >= wanted) return wanted;
  log::info("http: the open-file limit is {}: at most {} connections at once ([server] max_connections is {})", soft, room,
            wanted);
  return room;
}

// One open connection, as the listener sees it.
struct ConnectionEntry {
  std::function<void()> close;
  std::string peer;
  std::string shown;  // the peer, for people
  bool waiting_for_header = true;  // no request in progress: waiting for (the rest of) a header
  Clock::time_point since = Clock::now();
};

// What the listener and its connections share: the hub, the Host/Origin rules, and the table of
// open connections with their count per peer (for the connection caps).
struct Listener {
  Listener(Hub& h, const HttpOptions& o)
      : hub(h), options(o), rules(HostRules::from(o)), max_connections(connection_cap(o.max_connections)),
        max_per_peer(std::min(o.max_connections_per_peer, max_connections)) {
    hub.connection_status = [this](HttpStatus& status, std::map<std::string, HttpStatus::PeerUse>& peers) {
      status.connections = connections.size();
      for (const auto& [id, entry] : connections) {
        HttpStatus::PeerUse& use = peers[entry.peer];
        use.peer = entry.shown;
        ++use.connections;
      }
      status.caps["server.max_connections"] = {connections.size(), max_connections};
      status.caps["server.max_connections_per_peer"] = {0, max_per_peer};
    };
  }
  ~Listener() { hub.connection_status = nullptr; }
  Hub& hub;
  const HttpOptions& options;
  HostRules rules;
  const std::size_t max_connections;
  const std::size_t max_per_peer;
  UniqueFd diag;  // sock_diag, for the owner of a loopback client's socket (opened on first use)
  bool diag_tried = false;
  std::map<std::uint64_t, ConnectionEntry> connections;  // open ones, by id (oldest first)
  std::map<std::string, std::size_t, std::less<>> per_peer;
  std::uint64_t next_connection = 0;
  std::size_t evicted = 0;

  void add(std::uint64_t id, ConnectionEntry entry) {
    ++per_peer[entry.peer];
    connections.emplace(id, std::move(entry));
  }
  void forget(std::uint64_t id) {
    auto it = connections.find(id);
    if (it == connections.end()) return;
    if (auto p = per_peer.find(it->second.peer); p != per_peer.end() && --p->second == 0) per_peer.erase(p);
    connections.erase(it);
  }
  void waiting(std::uint64_t id, bool yes) {
    if (auto it = connections.find(id); it != connections.end()) {
      it->second.waiting_for_header = yes;
      it->second.since = Clock::now();
    }
  }
  int diag_fd() {
    if (!diag_tried) {
      diag_tried = true;
      diag = UniqueFd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
      if (!diag) log::info("http: no sock_diag ({}): loopback clients are told apart by address only", std::strerror(errno));
    }
    return diag.get();
  }
  std::size_t of_peer(std::string_view peer) const {
    auto it = per_peer.find(peer);
    return it == per_peer.end() ? 0 : it->second;
  }
  // Closes the connection that has waited longest for a request header (of `peer` when given):
  // a slow or idle client makes room for a new one. False when none is waiting.
  bool evict_waiting(const std::string* peer) {
    auto oldest = connections.end();
    for (auto it = connections.begin(); it != connections.end(); ++it)
      if (it->second.waiting_for_header && (!peer || it->second.peer == *peer) &&
          (oldest == connections.end() || it->second.since < oldest->second.since))
        oldest = it;
    if (oldest == connections.end()) return false;
    auto close = std::move(oldest->second.close);
    forget(oldest->first);
    if (close) close();
    if (++evicted == 1 || evicted % 1000 == 0)
      log::warn("http: at a connection cap ({} open, [server] max_connections {}, max_connections_per_peer {}): closed the "
                "connection that waited longest for its request header ({} so far)",
                connections.size(), max_connections, max_per_peer, evicted);
    return true;
  }
  // Room for one more connection of `peer`; else the refusal to send it.
  std::optional<std::string> make_room(const Peer& peer) {
    if (of_peer(peer.key) >= max_per_peer && !evict_waiting(&peer.key))
      return fmt::format("too many connections from {}: {} open, all busy, the limit per peer is {} ([server] "
                         "max_connections_per_peer)",
                         peer.shown, of_peer(peer.key), max_per_peer);
    if (connections.size() >= max_connections && !evict_waiting(nullptr))
      return fmt::format("too many connections: {} open, all busy, the limit is {} ([server] max_connections)",
                         connections.size(), max_connections);
    return std::nullopt;
  }
};

// ---------------------------------------------------------------------------------------------
// Peers: who is on the other end, for the per-peer caps.

// The uid that owns the client's end of a loopback TCP connection, asked of the kernel with one
// sock_diag query for exactly that socket (what `ss -e` shows). nullopt when it cannot tell.
std::optional<uid_t> loopback_owner(int diag_fd, const tcp::endpoint& client, const tcp::endpoint& server) {
  static std::atomic<std::uint32_t> sequence{0};
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;
  message.header.nlmsg_seq = ++sequence;
  message.request.sdiag_family = client.address().is_v4() ? AF_INET : AF_INET6;
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0U;
  message.request.id.idiag_sport = htons(client.port());
  message.request.id.idiag_dport = htons(server.port());
  auto put = [](__be32* into, const asio::ip::address& a) {
    if (a.is_v4()) {
      const auto bytes = a.to_v4().to_bytes();
      std::memcpy(into, bytes.data(), bytes.size());
    } else {
      const auto bytes = a.to_v6().to_bytes();
      std::memcpy(into, bytes.data(), bytes.size());
    }
  };
  put(message.request.id.idiag_src, client.address());
  put(message.request.id.idiag_dst, server.address());
  message.request.id.idiag_cookie[0] = message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(diag_fd, &message, sizeof message, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return std::nullopt;
  // The kernel answers a single-socket query before sendto returns: nothing to wait for.
  alignas(nlmsghdr) char reply[8192];
  for (;;) {
    const ssize_t n = ::recv(diag_fd, reply, sizeof reply, MSG_DONTWAIT);
    if (n <= 0) return std::nullopt;
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(reply); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_seq != message.header.nlmsg_seq) continue;  // a late answer to an earlier query
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg)))
        return std::nullopt;  // NLMSG_ERROR: no such socket (it went away), or not allowed
      return static_cast<uid_t>(reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid);
    }
  }
}

Peer uid_peer(uid_t uid) { return {fmt::format("uid:{}", uid), fmt::format("uid {}", uid)}; }

// TCP: the remote address; on loopback, where every local client is 127.0.0.1 or ::1, the uid
// owning the client's socket instead (a sandbox of a root-run server is uid 65534, other local
// users their own uid), so one local user cannot use up another's share.
Peer peer_of(tcp::socket& socket, Listener& listener) {
  boost::system::error_code ec1, ec2;
  tcp::endpoint remote = socket.remote_endpoint(ec1);
  tcp::endpoint local = socket.local_endpoint(ec2);
  if (ec1 || ec2) return {"unknown", "an unknown peer"};
  auto plain = [](tcp::endpoint e) {
    if (e.address().is_v6() && e.address().to_v6().is_v4_mapped())
      e.address(asio::ip::make_address_v4(asio::ip::v4_mapped, e.address().to_v6()));
    return e;
  };
  remote = plain(remote);
  local = plain(local);
  if (remote.address().is_loopback())
    if (const int diag = listener.diag_fd(); diag >= 0)
      if (auto uid = loopback_owner(diag, remote, local)) return uid_peer(*uid);
  const std::string a = remote.address().to_string();
  return {"ip:" + a, a};
}

// A Unix socket: the client's uid (SO_PEERCRED).
Peer peer_of(unix_socket::socket& socket, Listener&) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) return uid_peer(cred.uid);
  return {"unknown", "an unknown peer"};
}

// Answers a connection the server will not take (at a cap) with 503 and closes it, without
// waiting: the answer is small and the socket new, so it fits in the send buffer.
void refuse_connection(int fd, const std::string& why) {
  const std::string body =
      mcp::make_error(nullptr, -32000, why + "; try again later").dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string text = fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                       "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"
                                       "Retry-After: 5\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
                                       body.size(), body);
  [[maybe_unused]] const ssize_t n = ::send(fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
}

Response json_response(unsigned version, int status, const json& body) {
  Response res{static_cast<bhttp::status>(status), version};
  res.set(bhttp::field::content_type, "application/json");
  res.set(bhttp::field::cache_control, "no-store");
  res.body() = body.dump(-1, ' ', false, json::error_handler_t::replace);
  res.prepare_payload();
  return res;
}

// An HTTP-level refusal with a JSON-RPC error body (id null), as MCP clients expect.
Response error_response(unsigned version, int status, std::string_view message, int code = -32000) {
  return json_response(version, status, mcp::make_error(nullptr, code, message));
}

// A cap's refusal: JSON-RPC error -32000 for request `id` (null: none), naming the cap.
Response refusal_response(unsigned version, const Refusal& refusal, const json& id = nullptr) {
  return json_response(version, refusal.http_status, mcp::make_error(id, -32000, refusal.message, refusal.data));
}

// Headers every response carries: no content sniffing (a text/plain answer never runs as a
// page) and no Referer (the one-time login code in /login?code= must not leak to a link's site).
template <class Message>
void add_common_headers(Message& message) {
  message.set("X-Content-Type-Options", "nosniff");
  message.set("Referrer-Policy", "no-referrer");
}

// The value of a cookie in a Cookie header ("a=1; nshpc_session=…"); "" when absent.
std::string_view cookie_value(std::string_view header, std::string_view name) {
  for (std::string_view part : text::split(header, ';')) {
    part = text::trim(part);
    const auto eq = part.find('=');
    if (eq != std::string_view::npos && part.substr(0, eq) == name) return text::trim(part.substr(eq + 1), " \"");
  }
  return {};
}

// A field of an application/x-www-form-urlencoded body, decoded ('+' is a space, %XX a byte).
std::optional<std::string> form_value(std::string_view body, std::string_view name) {
  for (std::string_view pair : text::split(body, '&')) {
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) != name) continue;
    std::string out;
    const std::string_view raw = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '+') {
        out.push_back(' ');
      } else if (unsigned byte = 0; raw[i] == '%' && i + 2 < raw.size() &&
                 std::from_chars(raw.data() + i + 1, raw.data() + i + 3, byte, 16).ptr == raw.data() + i + 3) {
        out.push_back(static_cast<char>(byte));
        i += 2;
      } else {
        out.push_back(raw[i]);
      }
    }
    return out;
  }
  return std::nullopt;
}

// The dashboard's login page: a form and, when there is one, why the last attempt failed. No
// script; its one style block is allowed by a nonce in the page's own CSP.
Response login_page(unsigned version, int status, std::string_view problem) {
  const std::string nonce = random::hex(16);
  Response res{static_cast<bhttp::status>(status), version};
  res.set(bhttp::field::content_type, "text/html; charset=utf-8");
  res.set(bhttp::field::cache_control, "no-store");
  res.set("Content-Security-Policy",
          fmt::format("default-src 'none'; style-src 'nonce-{}'; form-action 'self'; frame-ancestors 'none'; "
                      "base-uri 'none'",
                      nonce));
  // `problem` is one of this file's fixed sentences (never anything a client sent).
  res.body() = fmt::format(
      R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>ns-hpc: log in</title>
<style nonce="{}">
body {{ font: 16px/1.5 system-ui, sans-serif; margin: 0; display: grid; place-items: center; min-height: 100vh; background: #f4f5f7; color: #1d2330; }}
main {{ background: #fff; padding: 2rem; border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.15); max-width: 26rem; }}
h1 {{ font-size: 1.3rem; margin: 0 0 1rem; }}
label {{ display: block; margin-bottom: .5rem; }}
input {{ width: 100%; box-sizing: border-box; padding: .5rem; font: inherit; margin-top: .25rem; }}
button {{ margin-top: 1rem; padding: .5rem 1.2rem; font: inherit; }}
.problem {{ color: #a40000; }}
</style></head>
<body><main>
<h1>ns-hpc dashboard</h1>
{}<form method="post" action="/login">
<label>Token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button type="submit">Log in</button>
</form>
<p>Use the one-time link ns-hpc printed when it started, or its token.</p>
</main></body></html>
)",
      nonce, problem.empty() ? std::string() : fmt::format("<p class=\"problem\">{}</p>\n", problem));
  res.prepare_payload();
  return res;
}

// The password of a Basic credential ("user:password" in base64); "" when it is not one.
std::string basic_password(std::string_view encoded) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string decoded;
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : encoded) {
    if (c == '=') break;
    const auto at = kAlphabet.find(c);
    if (at == std::string_view::npos) return {};
    bits = (bits << 6) | static_cast<std::uint32_t>(at);
    count += 6;
    if (count >= 8) {
      count -= 8;
      decoded.push_back(static_cast<char>((bits >> count) & 0xff));
    }
  }
  const auto colon = decoded.find(':');
  return colon == std::string::npos ? std::string() : decoded.substr(colon + 1);
}

// A streaming route's request body between the connection (I/O thread, which reads the socket
// when the handler wants data) and the handler (a worker thread, which blocks until it comes).
struct BodyPipe {
  static constexpr std::size_t kAheadBytes = 4 * 1024 * 1024;  // read ahead of the handler at most
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<std::string> chunks;
  std::size_t front_used = 0;
  std::size_t queued = 0;
  bool want = false;      // the handler waits for data
  bool ended = false;     // the whole body is in `chunks`
  bool done = false;      // the handler returned: nothing more is read for it
  bool too_large = false;
  std::string error;      // the body cannot be read: why
  std::function<void()> wake_io;

  // I/O thread: whether to read more of the body now.
  bool needs_data() {
    std::lock_guard lock(mutex);
    return want && !done && !ended && error.empty() && queued < kAheadBytes;
  }
  void push(std::string data, bool end) {
    std::lock_guard lock(mutex);
    queued += data.size();
    if (!data.empty()) chunks.push_back(std::move(data));
    ended = ended || end;
    arrived.notify_all();
  }
  void fail(std::string why, bool over_limit) {
    std::lock_guard lock(mutex);
    error = std::move(why);
    too_large = over_limit;
    arrived.notify_all();
  }
  void finished_handler() {
    std::lock_guard lock(mutex);
    done = true;
    want = false;
  }
};

class PipeReader final : public BodyReader {
 public:
  explicit PipeReader(BodyPipe& pipe) : pipe_(pipe) {}
  std::size_t read(char* into, std::size_t n) override {
    std::unique_lock lock(pipe_.mutex);
    while (pipe_.chunks.empty() && !pipe_.ended && pipe_.error.empty()) {
      pipe_.want = true;
      pipe_.wake_io();
      pipe_.arrived.wait(lock);
    }
    if (!pipe_.error.empty()) throw Error(pipe_.error);
    if (pipe_.chunks.empty()) return 0;
    std::string& front = pipe_.chunks.front();
    const std::size_t take = std::min(n, front.size() - pipe_.front_used);
    std::memcpy(into, front.data() + pipe_.front_used, take);
    pipe_.front_used += take;
    const std::size_t before = pipe_.queued;
    pipe_.queued -= take;
    if (pipe_.front_used == front.size()) {
      pipe_.chunks.pop_front();
      pipe_.front_used = 0;
    }
    // Keep the socket read ahead of the handler, below kAheadBytes.
    if (!pipe_.ended && before >= BodyPipe::kAheadBytes / 2 && pipe_.queued < BodyPipe::kAheadBytes / 2) {
      pipe_.want = true;
      pipe_.wake_io();
    }
    return take;
  }
  bool too_large() const override {
    std::lock_guard lock(pipe_.mutex);
    return pipe_.too_large;
  }

 private:
  BodyPipe& pipe_;
};

// One connection, TCP or Unix socket alike (a generic stream socket: this class is compiled once).
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Socket = asio::generic::stream_protocol::socket;

  Connection(Listener& listener, Socket socket, bool local_socket, Peer peer)
      : listener_(listener), hub_(listener.hub), opt_(listener.options), socket_(std::move(socket)),
        local_(local_socket), peer_(std::move(peer)), deadline_(socket_.get_executor()) {}

  void start() {
    auto self = shared_from_this();
    id_ = listener_.next_connection++;
    ConnectionEntry entry;
    entry.peer = peer_.key;
    entry.shown = peer_.shown;
    entry.close = [weak = std::weak_ptr<Connection>(self)] {
      if (auto c = weak.lock()) c->stop();
    };
    listener_.add(id_, std::move(entry));
    asio::co_spawn(socket_.get_executor(), watchdog(self), asio::detached);
    asio::co_spawn(socket_.get_executor(), run(self), asio::detached);
  }

  void abort() {
    boost::system::error_code ignored;
    socket_.close(ignored);
    if (ws_) beast::get_lowest_layer(*ws_).close(ignored);
  }

  // Closed from outside (a cap makes room, the server stops): an open WebSocket gets a close 1001
  // after what is queued (and at most a second more); any other connection is closed now.
  void stop() {
    if (!ws_channel_) {
      abort();
      return;
    }
    shutting_down_ = true;
    ws_channel_->end(1001, "the server is shutting down");
    arm(kWebSocketCloseTime);
  }

 private:
  // Closes the socket when the deadline passes; every phase sets its own deadline.
  static awaitable<void> watchdog(std::shared_ptr<Connection> self) {
    while (!self->done_) {
      auto [ec] = co_await self->deadline_.async_wait(kTuple);
      if (self->done_) break;
      if (!ec && self->deadline_.expiry() <= Clock::now()) {
        self->abort();
        break;
      }
    }
  }

  void arm(std::chrono::milliseconds d) { deadline_.expires_after(d); }
  void disarm() { deadline_.expires_at(Clock::time_point::max()); }

  static awaitable<void> run(std::shared_ptr<Connection> self) {
    try {
      co_await self->serve();
    } catch (const std::exception& e) {
      log::warn("http: connection ended: {}", e.what());
    }
    self->done_ = true;
    self->deadline_.cancel();
    boost::system::error_code ignored;
    self->socket_.shutdown(Socket::shutdown_both, ignored);
    self->abort();
    self->listener_.forget(self->id_);
  }

  awaitable<void> serve() {
    beast::flat_buffer buffer;
    for (;;) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(opt_.max_header_bytes));
      // Beast checks a Content-Length against the limit as soon as the header is in: the
      // largest limit of any route here, the route's own once it is known (and check() says
      // which limit a declared length is over).
      parser.body_limit(largest_body_limit());
      // Until the header is in, this connection may be closed to make room (see make_room).
      listener_.waiting(id_, true);
      arm(opt_.header_timeout);
      auto [ec, n] = co_await bhttp::async_read_header(socket_, buffer, parser, kTuple);
      listener_.waiting(id_, false);
      if (ec) {
        co_await refuse_broken(ec, 11);
        co_return;
      }
      arm(opt_.read_timeout);
      const auto& header = parser.get();
      if (auto refusal = check(header)) {
        // Refused before the body is read: the connection cannot be reused.
        refusal->keep_alive(false);
        co_await write(*refusal);
        co_await linger();
        co_return;
      }
      if (target_.kind == Target::Kind::stream) {
        const bool keep = co_await stream_exchange(*target_.stream, parser, buffer);
        if (!keep) co_return;
        continue;
      }
      parser.body_limit(opt_.max_body_bytes);
      if (lower(header[bhttp::field::expect]) == "100-continue") {
        bhttp::response<bhttp::empty_body> go{bhttp::status::continue_, header.version()};
        auto [wec, wn] = co_await bhttp::async_write(socket_, go, kTuple);
        if (wec) co_return;
      }
      if (!parser.is_done()) {
        auto [bec, bn] = co_await bhttp::async_read(socket_, buffer, parser, kTuple);
        if (bec) {
          co_await refuse_broken(bec, header.version());
          co_return;
        }
      }
      disarm();
      Request req = parser.release();
      const bool keep = co_await dispatch(req);
      if (!keep || !req.keep_alive()) co_return;
    }
  }

  // Answers a request that could not be read (when there is anything to say) and ends.
  awaitable<void> refuse_broken(const boost::system::error_code& ec, unsigned version) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::operation_aborted ||
        ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::bad_descriptor)
      co_return;
    Response res;
    if (ec == bhttp::error::body_limit)
      res = error_response(version, 413, fmt::format("request body too large: the limit is {} bytes", opt_.max_body_bytes));
    else if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
      res = error_response(version, 431, fmt::format("request header fields too large: the limit is {} bytes", opt_.max_header_bytes));
    else
      res = error_response(version, 400, fmt::format("malformed HTTP request: {}", ec.message()));
    res.keep_alive(false);
    co_await write(res);
  }

  awaitable<bool> write(Response& res) {
    // A kept-alive connection is closed after header_timeout without a new request: said, so
    // that clients stop reusing it first (instead of sending into a closing socket).
    if (res.keep_alive() && opt_.header_timeout >= std::chrono::seconds(1))
      res.set(bhttp::field::keep_alive,
              fmt::format("timeout={}", std::chrono::duration_cast<std::chrono::seconds>(opt_.header_timeout).count()));
    add_common_headers(res);
    arm(opt_.read_timeout);
    auto [ec, n] = co_await bhttp::async_write(socket_, res, kTuple);
    disarm();
    co_return !ec && res.keep_alive();
  }

  std::string_view path_of(std::string_view target) const { return target.substr(0, target.find('?')); }

  bool is_mcp_path(std::string_view path) const { return path == opt_.path; }
  bool is_legacy_get(std::string_view path) const {
    return opt_.protocol == HttpOptions::Protocol::legacy_sse ? path == opt_.path : path == "/sse";
  }
  static bool is_legacy_post(std::string_view path) { return path == "/messages/" || path == "/messages"; }

  // What a request is for, in the order requests are dispatched.
  struct Target {
    enum class Kind { none, healthz, login, logout, mcp, legacy_get, legacy_post, websocket, event, stream, plain };
    Kind kind = Kind::none;
    const EventRoute* event = nullptr;
    const StreamRoute* stream = nullptr;
    const HttpRoute* plain = nullptr;
    bool browser = false;  // the dashboard's cookie is accepted
    const WebSocketRoute* websocket = nullptr;
  };

  static bool matches(std::string_view path, const std::string& prefix, bool exact) {
    return exact ? path == prefix : path.rfind(prefix, 0) == 0;
  }

  Target target_of(bhttp::verb method, std::string_view path) const {
    using Kind = Target::Kind;
    Target t;
    if (path == "/healthz") t.kind = Kind::healthz;
    else if (opt_.login.enabled && path == "/login") t.kind = Kind::login;
    else if (opt_.login.enabled && path == "/logout") t.kind = Kind::logout;
    else if (opt_.protocol == HttpOptions::Protocol::streamable && is_mcp_path(path)) t.kind = Kind::mcp;
    else if (is_legacy_get(path)) t.kind = Kind::legacy_get;
    else if (is_legacy_post(path)) t.kind = Kind::legacy_post;
    if (t.kind != Kind::none) return t;
    for (const WebSocketRoute& route : opt_.websocket_routes)
      if (matches(path, route.prefix, route.exact)) return {Kind::websocket, nullptr, nullptr, nullptr, route.browser, &route};
    for (const EventRoute& route : opt_.event_routes)
      if (matches(path, route.prefix, route.exact)) return {Kind::event, &route, nullptr, nullptr, route.browser};
    if (const StreamRoute* route = stream_route_of(method, path)) return {Kind::stream, nullptr, route, nullptr, route->browser};
    for (const HttpRoute& route : opt_.routes)
      if (matches(path, route.prefix, route.exact)) return {Kind::plain, nullptr, nullptr, &route, route.browser};
    return t;
  }

  // The token as a bearer credential (or the password of a Basic one).
  template <class Header>
  bool has_token(const Header& h) const {
    const std::string_view auth = text::trim(h[bhttp::field::authorization]);
    if (auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ") return same_secret(text::trim(auth.substr(7)), opt_.token);
    if (auth.size() > 6 && lower(auth.substr(0, 6)) == "basic ")
      return same_secret(basic_password(text::trim(auth.substr(6))), opt_.token);
    return false;
  }

  // The dashboard's session cookie, when it names a live browser session.
  template <class Header>
  bool has_session_cookie(const Header& h) {
    const std::string_view cookie = cookie_value(h[bhttp::field::cookie], BrowserLogins::kCookie);
    return !cookie.empty() && hub_.logins.valid(cookie, Clock::now());
  }

  // A request a cookie authenticates may change something only when it comes from the page
  // itself (CSRF): its Origin is this server as the browser reached it, or, without an Origin,
  // the browser says it is same-origin. nullopt when it may go on.
  template <class Header>
  std::optional<std::string> cross_site(const Header& h) const {
    const auto m = h.method();
    if (m == bhttp::verb::get || m == bhttp::verb::head || m == bhttp::verb::options) return std::nullopt;
    const std::string origin = lower(text::trim(h[bhttp::field::origin]));
    const std::string host = lower(text::trim(h[bhttp::field::host]));
    if (!origin.empty()) {
      if (!host.empty() && origin == std::string(scheme()) + "://" + host) return std::nullopt;
      return fmt::format("forbidden: a browser request that changes something must come from this server's own page "
                         "(Origin '{}' is not {}://{}); reload the dashboard and try again",
                         origin, scheme(), host);
    }
    if (lower(text::trim(h["sec-fetch-site"])) == "same-origin") return std::nullopt;
    return std::string("forbidden: a browser request that changes something must name its Origin (or send "
                       "Sec-Fetch-Site: same-origin); use the dashboard's own page, or send the bearer token instead "
                       "of the cookie");
  }

  // A WebSocket is not bound by the same-origin policy: any page the browser shows could open one
  // with the dashboard's cookie (cross-site WebSocket hijacking). A cookie-authenticated upgrade
  // must therefore name this server as its Origin (a browser always sends one on an upgrade).
  template <class Header>
  std::optional<std::string> cross_site_websocket(const Header& h) const {
    const std::string origin = lower(text::trim(h[bhttp::field::origin]));
    const std::string host = lower(text::trim(h[bhttp::field::host]));
    if (!origin.empty() && !host.empty() && origin == std::string(scheme()) + "://" + host) return std::nullopt;
    return fmt::format("forbidden: a WebSocket opened with the dashboard's cookie must come from this server's own page "
                       "(Origin '{}' is not {}://{}); open it from the dashboard, or send the bearer token instead",
                       origin, scheme(), host);
  }

  // "http" here; a TLS listener would say "https" (and set the cookie's Secure attribute).
  std::string_view scheme() const { return over_tls_ ? "https" : "http"; }

  // Checks made on the header alone, before any body is read. Sets target_ and by_cookie_.
  template <class Header>
  std::optional<Response> check(const Header& h) {
    using Kind = Target::Kind;
    const unsigned v = h.version();
    const std::string_view path = path_of(h.target());
    target_ = target_of(h.method(), path);
    by_cookie_ = false;
    if (target_.kind == Kind::healthz) return std::nullopt;
    if (!local_) {
      if (!listener_.rules.host_ok(h[bhttp::field::host]))
        return error_response(v, 403, fmt::format("forbidden: Host '{}' is not allowed (DNS-rebinding "
                                                  "protection; allow it with [server] allowed_hosts or --allowed-host)",
                                                  std::string(h[bhttp::field::host])));
      if (!listener_.rules.origin_ok(h[bhttp::field::origin]))
        return error_response(v, 403, fmt::format("forbidden: Origin '{}' is not allowed (allow it with [server] "
                                                  "allowed_origins or --allowed-origin)",
                                                  std::string(h[bhttp::field::origin])));
    }
    const StreamRoute* route = target_.stream;
    const bool root_options = route && path == "/" && h.method() == bhttp::verb::options;
    // /login and /logout check what they are sent themselves.
    const bool login = target_.kind == Kind::login || target_.kind == Kind::logout;
    if (!opt_.token.empty() && !root_options && !login && !has_token(h)) {
      const bool browser = target_.browser && opt_.login.enabled;
      if (browser && has_session_cookie(h)) {
        by_cookie_ = true;
        if (auto why = cross_site(h)) return error_response(v, 403, *why);
        if (target_.kind == Kind::websocket)
          if (auto why = cross_site_websocket(h)) return error_response(v, 403, *why);
      } else if (browser && h.method() == bhttp::verb::get &&
                 lower(h[bhttp::field::accept]).find("text/html") != std::string::npos) {
        return login_page(v, 401, "");
      } else {
        const std::string_view auth = text::trim(h[bhttp::field::authorization]);
        Response res = error_response(v, 401,
                                      auth.empty() ? "unauthorized: this server needs 'Authorization: Bearer <token>' (ns-hpc prints the token "
                                                     "and a client configuration when it starts)"
                                                   : "unauthorized: wrong bearer token",
                                      -32001);
        res.set(bhttp::field::www_authenticate, "Bearer realm=\"ns-hpc\"");
        // WebDAV clients (Finder, rclone, davfs2, curl) send Basic: the token is the password.
        if (route) res.insert(bhttp::field::www_authenticate, "Basic realm=\"ns-hpc\", charset=\"UTF-8\"");
        return res;
      }
    }
    const std::uint64_t limit = route ? route->max_body_bytes : opt_.max_body_bytes;
    if (auto length = h.find(bhttp::field::content_length); length != h.end()) {
      std::uint64_t declared = 0;
      const auto value = length->value();
      auto [p, e] = std::from_chars(value.data(), value.data() + value.size(), declared);
      if (e == std::errc() && declared > limit)
        return error_response(v, 413, fmt::format("request body too large: {} bytes, the limit is {} bytes", declared, limit));
    }
    return std::nullopt;
  }

  awaitable<bool> dispatch(Request& req) {
    using Kind = Target::Kind;
    const unsigned v = req.version();
    const std::string_view target = req.target();
    const std::string_view path = path_of(target);
    const auto method = req.method();

    if (target_.kind == Kind::healthz) {
      if (method != bhttp::verb::get && method != bhttp::verb::head) co_return co_await not_allowed(v, "GET, HEAD");
      Response res = json_response(v, 200, json{{"status", "ok"}});
      if (method == bhttp::verb::head) res.body().clear();
      co_return co_await write(res);
    }
    if (hub_.draining && !(method == bhttp::verb::delete_)) {
      Response res = error_response(v, 503, "the server is shutting down");
      res.set(bhttp::field::retry_after, "5");
      res.keep_alive(false);
      co_return co_await write(res);
    }
    switch (target_.kind) {
      case Kind::login:
        if (method == bhttp::verb::get) co_return co_await login_get(req);
        if (method == bhttp::verb::post) co_return co_await login_post(req);
        co_return co_await not_allowed(v, "GET, POST");
      case Kind::logout:
        if (method != bhttp::verb::post) co_return co_await not_allowed(v, "POST");
        co_return co_await logout(req);
      case Kind::mcp:
        if (method == bhttp::verb::post) co_return co_await mcp_post(req);
        if (method == bhttp::verb::get) co_return co_await mcp_get(req);
        if (method == bhttp::verb::delete_) co_return co_await mcp_delete(req);
        co_return co_await not_allowed(v, "GET, POST, DELETE");
      case Kind::legacy_get:
        if (method != bhttp::verb::get) co_return co_await not_allowed(v, "GET");
        co_return co_await legacy_get(req);
      case Kind::legacy_post:
        if (method != bhttp::verb::post) co_return co_await not_allowed(v, "POST");
        co_return co_await legacy_post(req);
      case Kind::event:
        if (method != bhttp::verb::get) co_return co_await not_allowed(v, "GET");
        co_return co_await event_stream(*target_.event, req);
      case Kind::websocket:
        co_return co_await websocket_exchange(*target_.websocket, req);
      case Kind::plain:
        co_return co_await custom(*target_.plain, req);
      case Kind::healthz:
      case Kind::stream:  // served by stream_exchange before the body is read
      case Kind::none:
        break;
    }
    Response res = error_response(v, 404, fmt::format("not found: {} (the MCP endpoint is {})", std::string(path), opt_.path));
    co_return co_await write(res);
  }

  // ---- the dashboard's login (HttpOptions::Login) ----

  // Set-Cookie for a browser session (`value` empty: the cookie is removed).
  std::string session_cookie(std::string_view value) const {
    // Secure whenever served over TLS (no TLS listener exists yet: over_tls_ is false).
    return fmt::format("{}={}; HttpOnly; SameSite=Strict; Path=/{}{}", BrowserLogins::kCookie, value,
                       value.empty() ? "; Max-Age=0" : "", over_tls_ ? "; Secure" : "");
  }

  Response see_other(unsigned v, const std::string& location) const {
    Response res{bhttp::status::see_other, v};
    res.set(bhttp::field::location, location);
    res.set(bhttp::field::cache_control, "no-store");
    res.prepare_payload();
    return res;
  }

  // A new browser session, then to the landing page.
  Response logged_in(unsigned v) {
    Response res = see_other(v, opt_.login.landing);
    res.set(bhttp::field::set_cookie, session_cookie(hub_.logins.open(peer_, Clock::now())));
    hub_.publish_status();
    return res;
  }

  // A peer that failed too often within a minute waits (the form is no fast oracle).
  std::optional<Response> login_throttled(unsigned v) {
    const auto wait = hub_.logins.must_wait(peer_.key, Clock::now());
    if (!wait) return std::nullopt;
    Response res = login_page(v, 429,
                              fmt::format("Too many wrong tokens or login links from here: try again in {} s.", wait->count()));
    res.set(bhttp::field::retry_after, std::to_string(wait->count()));
    return res;
  }

  awaitable<bool> login_get(Request& req) {
    const unsigned v = req.version();
    const auto code = query_value(path_query(req.target()), "code");
    if (!code) {
      Response page = login_page(v, 401, "");
      co_return co_await write(page);
    }
    if (opt_.token.empty()) {  // nothing to log in to: every route is open
      Response res = see_other(v, opt_.login.landing);
      co_return co_await write(res);
    }
    if (auto throttled = login_throttled(v)) co_return co_await write(*throttled);
    const auto result = hub_.logins.redeem(*code, Clock::now());
    if (result == BrowserLogins::Code::good) {
      Response res = logged_in(v);
      co_return co_await write(res);
    }
    hub_.logins.failed(peer_.key, Clock::now());
    Response page = login_page(v, 401,
                               result == BrowserLogins::Code::used      ? "This login link was used already: it works once. Log in with the token."
                               : result == BrowserLogins::Code::expired ? "This login link has expired. Log in with the token."
                                                                        : "This login link is not valid. Log in with the token.");
    co_return co_await write(page);
  }

  awaitable<bool> login_post(Request& req) {
    const unsigned v = req.version();
    if (opt_.token.empty()) {
      Response res = see_other(v, opt_.login.landing);
      co_return co_await write(res);
    }
    if (lower(req[bhttp::field::content_type]).rfind("application/x-www-form-urlencoded", 0) != 0) {
      Response page = login_page(v, 415, "Send the form (application/x-www-form-urlencoded, field 'token').");
      co_return co_await write(page);
    }
    if (auto throttled = login_throttled(v)) co_return co_await write(*throttled);
    const auto token = form_value(req.body(), "token");
    if (token && same_secret(*token, opt_.token)) {
      Response res = logged_in(v);
      co_return co_await write(res);
    }
    hub_.logins.failed(peer_.key, Clock::now());
    Response page = login_page(v, 401, "Wrong token.");
    co_return co_await write(page);
  }

  awaitable<bool> logout(Request& req) {
    const unsigned v = req.version();
    const std::string_view cookie = cookie_value(req[bhttp::field::cookie], BrowserLogins::kCookie);
    if (!cookie.empty()) {
      // Another site's page must not end the session either.
      if (auto why = cross_site(req)) {
        Response res = error_response(v, 403, *why);
        co_return co_await write(res);
      }
      hub_.logins.close(cookie);
      hub_.publish_status();
    }
    Response res = see_other(v, "/login");
    res.set(bhttp::field::set_cookie, session_cookie(""));
    co_return co_await write(res);
  }

  // What a route's handler sees of a request.
  template <class Message>
  HttpRequest request_of(const Message& req) const {
    HttpRequest in;
    in.method = std::string(req.method_string());
    in.target = std::string(req.target());
    for (const auto& field : req) {
      std::string& value = in.headers[lower(field.name_string())];
      if (!value.empty()) value += ", ";  // repeated fields are one list (RFC 9110 5.3)
      value += std::string(field.value());
    }
    in.peer = peer_.shown;
    in.by_cookie = by_cookie_;
    return in;
  }

  awaitable<bool> not_allowed(unsigned v, const char* allow) {
    Response res = error_response(v, 405, fmt::format("method not allowed here; allowed: {}", allow));
    res.set(bhttp::field::allow, allow);
    co_return co_await write(res);
  }

  // The session a request names (Mcp-Session-Id), or the refusal to send.
  std::shared_ptr<HttpSession> session_of(const Request& req, std::optional<Response>& refusal) {
    const std::string_view sid = text::trim(req["mcp-session-id"]);
    if (sid.empty()) {
      refusal = error_response(req.version(), 400, "bad request: the Mcp-Session-Id header is missing (send initialize first and "
                                                   "repeat the id it returned on every later request)");
      return nullptr;
    }
    auto session = hub_.find(sid);
    if (!session || session->legacy()) {
      refusal = error_response(req.version(), 404, "session not found: it ended, timed out or never existed; initialize a new one",
                               -32001);
      return nullptr;
    }
    return session;
  }

  std::optional<Response> version_problem(const Request& req) {
    const std::string_view pv = text::trim(req["mcp-protocol-version"]);
    if (pv.empty() || mcp::is_supported_version(pv)) return std::nullopt;
    std::string supported;
    for (auto s : mcp::kProtocolVersions) supported += (supported.empty() ? "" : ", ") + std::string(s);
    return error_response(req.version(), 400, fmt::format("bad request: unsupported MCP-Protocol-Version '{}'; supported: {}",
                                                          std::string(pv), supported));
  }

  // The JSON-RPC message a POST carries, into `message`; else the 400 to answer with (a parse
  // error: malformed JSON, invalid UTF-8, nesting too deep).
  std::optional<Response> parse_body(const Request& req, json& message) const {
    try {
      message = mcp::parse_message(req.body(), hub_.server.options().limits);
      return std::nullopt;
    } catch (const mcp::ProtocolError& e) {
      return error_response(req.version(), 400, e.what(), e.code());
    }
  }

  awaitable<bool> mcp_post(Request& req) {
    const unsigned v = req.version();
    const std::string content_type = lower(req[bhttp::field::content_type]);
    if (content_type.rfind("application/json", 0) != 0) {
      Response res = error_response(v, 415, "unsupported media type: POST a JSON-RPC message with Content-Type: application/json");
      co_return co_await write(res);
    }
    if (!accepts(req[bhttp::field::accept], "application/json") && !accepts(req[bhttp::field::accept], "text/event-stream")) {
      Response res = error_response(v, 406, "not acceptable: the client must accept application/json and text/event-stream");
      co_return co_await write(res);
    }
    // The header's version is judged once the body says its era: a 2026-07-28 body is checked
    // against it (and names its own unsupported version, -32022); a legacy body gets today's
    // answers, in today's order.
    const bool modern_header = mcp::is_modern_version(text::trim(req["mcp-protocol-version"]));
    std::optional<Response> legacy_version_problem = modern_header ? std::nullopt : version_problem(req);
    json message;
    if (auto malformed = parse_body(req, message))
      co_return co_await write(legacy_version_problem ? *legacy_version_problem : *malformed);
    // The era is the body's own: params._meta names a 2026-07-28 version (read_envelope throws
    // only for such a body), or it is legacy.
    mcp::Envelope envelope;
    std::optional<Response> bad_envelope;  // (no co_await inside a handler)
    if (message.is_object()) {
      try {
        envelope = mcp::read_envelope(message);
      } catch (const mcp::ProtocolError& e) {
        const json& id = message.contains("id") && mcp::is_valid_id(message["id"]) ? message["id"] : json(nullptr);
        bad_envelope = json_response(v, 400, mcp::make_error(id, e.code(), e.what(), e.data()));
      }
    }
    const bool modern_body = bad_envelope || envelope.era == mcp::Era::modern;
    if (legacy_version_problem && !modern_body) co_return co_await write(*legacy_version_problem);
    if (message.is_array()) {
      Response res = error_response(v, 400, "invalid request: batches are not supported; send one JSON-RPC message per POST",
                                    mcp::kInvalidRequest);
      co_return co_await write(res);
    }
    if (!message.is_object()) {
      Response res = error_response(v, 400, "invalid request: expected a JSON-RPC message object", mcp::kInvalidRequest);
      co_return co_await write(res);
    }
    const bool has_method = message.contains("method");
    const bool is_request = has_method && message.contains("id");
    if (is_request && !mcp::is_valid_id(message["id"])) {
      Response res = error_response(v, 400, "invalid request: \"id\" must be a string or an integer", mcp::kInvalidRequest);
      co_return co_await write(res);
    }
    if (bad_envelope) co_return co_await write(*bad_envelope);
    if (modern_body) co_return co_await mcp_post_modern(req, std::move(message), envelope);
    if (modern_header) {
      std::string supported;
      for (auto s : mcp::kProtocolVersions) supported += (supported.empty() ? "" : ", ") + std::string(s);
      Response res = error_response(
          v, 400,
          fmt::format("Header mismatch: MCP-Protocol-Version header value '{}' does not match the body, which carries no "
                      "_meta io.modelcontextprotocol/protocolVersion: a 2026-07-28 request names its version in "
                      "params._meta; a 2025-era request sends one of {} in the header",
                      std::string(text::trim(req["mcp-protocol-version"])), supported),
          mcp::kHeaderMismatch);
      co_return co_await write(res);
    }
    const bool is_initialize = is_request && message["method"] == "initialize";

    std::shared_ptr<HttpSession> session;
    if (is_initialize) {
      Refusal refusal;
      session = hub_.create_session(false, peer_, refusal);
      if (!session) {
        Response res = refusal_response(v, refusal);
        co_return co_await write(res);
      }
    } else {
      std::optional<Response> refusal;
      session = session_of(req, refusal);
      if (!session) co_return co_await write(*refusal);
    }
    session->touch();
    ++session->connections;
    struct Release {
      std::shared_ptr<HttpSession> s;
      ~Release() {
        --s->connections;
        s->touch();
      }
    } release{session};

    if (!is_request) {
      session->receive(std::move(message));
      Response res{bhttp::status::accepted, v};
      res.prepare_payload();
      co_return co_await write(res);
    }
    const json id = message["id"];
    if (!is_initialize) {
      if (auto refusal = hub_.admit(*session, message["method"].is_string() ? message["method"].get<std::string>() : "")) {
        // The request's JSON-RPC answer (the session stays usable).
        Response res = json_response(v, 200, mcp::make_error(id, -32000, refusal->message, refusal->data));
        res.set("Mcp-Session-Id", session->id());
        co_return co_await write(res);
      }
    }
    co_return co_await answer(session, id, std::move(message), v, true, is_initialize);
  }

  // Hands the request to its session and answers it on this connection: one JSON body when its
  // response is all the session sent for it, else the request's SSE stream. A 2025-era session
  // (`named`) is named in the answer; a failed initialize opens none.
  awaitable<bool> answer(const std::shared_ptr<HttpSession>& session, const json& id, json message, unsigned v,
                         bool named, bool is_initialize) {
    auto stream = session->open_request_stream(id);
    session->receive(std::move(message));
    // Messages the session sent while handling it were posted to this thread: let them land.
    co_await asio::post(socket_.get_executor(), asio::use_awaitable);
    if (stream->finished() && stream->last_seq() == 1) {
      Response res{bhttp::status::ok, v};
      res.set(bhttp::field::content_type, "application/json");
      res.set(bhttp::field::cache_control, "no-store");
      if (named) res.set("Mcp-Session-Id", session->id());
      res.body() = stream->release_response();
      // Still held for the client until written.
      HeldBytes held(session->account_ptr(), res.body().size());
      res.prepare_payload();
      session->drop_request_stream(stream);
      // A failed initialize opens no session: it settled on no protocol version.
      if (is_initialize && session->protocol_version().empty()) hub_.remove(session->id());
      co_return co_await write(res);
    }
    co_return co_await write_stream(session, stream, 0, named, v);
  }

  // A 2026-07-28 POST: served by itself, by an ephemeral session that ends with the response
  // (or when the client goes away before it, which cancels the request). Checks in the spec's
  // order: the mirrored headers (400, -32020), a method of this era (404, -32601), no 2025-era
  // session named (400, -32600), the in-flight caps (429/503).
  awaitable<bool> mcp_post_modern(Request& req, json message, const mcp::Envelope& envelope) {
    const unsigned v = req.version();
    if (!message.contains("id")) {
      // 2026-07-28 defines no client notification over HTTP (closing a stream cancels): taken,
      // and dropped.
      Response res{bhttp::status::accepted, v};
      res.prepare_payload();
      co_return co_await write(res);
    }
    const json id = message["id"];
    const HeaderLookup header = [&req](std::string_view name) -> std::optional<std::string> {
      std::optional<std::string> value;
      for (const auto& field : req) {
        if (!beast::iequals(field.name_string(), name)) continue;
        if (value) *value += ", ";  // repeated fields are one list (RFC 9110 5.3): never a match
        else value.emplace();
        *value += std::string(field.value());
      }
      return value;
    };
    if (auto mismatch = check_request_headers(header, message, envelope)) {
      Response res = json_response(v, 400, mcp::make_error(id, mismatch->code(), mismatch->what()));
      co_return co_await write(res);
    }
    const std::string method = message["method"].is_string() ? message["method"].get<std::string>() : std::string();
    if (!mcp::is_method(method, mcp::Era::modern)) {
      const bool legacy_only = mcp::is_method(method, mcp::Era::legacy);
      Response res = json_response(
          v, 404,
          mcp::make_error(id, mcp::kMethodNotFound,
                          legacy_only ? fmt::format("Method not found: '{}' is a 2025-era method, not part of 2026-07-28 "
                                                    "(send it without _meta io.modelcontextprotocol/protocolVersion, in a "
                                                    "session opened by initialize; 2026-07-28 clients use server/discover "
                                                    "and subscriptions/listen)",
                                                    text::truncate_utf8(method, 100))
                                      : fmt::format("Method not found: '{}'", text::truncate_utf8(method, 100))));
      co_return co_await write(res);
    }
    // The spec has modern servers ignore Mcp-Session-Id; one naming a live 2025-era session,
    // though, is a client mixing the eras, which would be served without its session's state.
    if (const std::string_view sid = text::trim(req["mcp-session-id"]); !sid.empty() && hub_.find(sid)) {
      Response res = json_response(
          v, 400,
          mcp::make_error(id, mcp::kInvalidRequest,
                          "invalid request: it carries the 2026-07-28 _meta (io.modelcontextprotocol/protocolVersion) but "
                          "its Mcp-Session-Id names a 2025-era session; drop the Mcp-Session-Id header to be served "
                          "statelessly in 2026-07-28, or drop the _meta envelope to be served in that session"));
      co_return co_await write(res);
    }
    auto session = hub_.open_ephemeral(peer_);
    struct End {
      Hub& hub;
      std::string id;
      ~End() { hub.end_ephemeral(id); }  // nothing of the request stays; what still runs is cancelled
    } end{hub_, session->id()};
    if (auto refusal = hub_.admit(*session, method)) {
      Response res = refusal_response(v, *refusal, id);
      co_return co_await write(res);
    }
    session->listening = method == "subscriptions/listen";
    co_return co_await answer(session, id, std::move(message), v, false, false);
  }

  awaitable<bool> mcp_get(Request& req) {
    const unsigned v = req.version();
    if (!accepts(req[bhttp::field::accept], "text/event-stream")) {
      Response res = error_response(v, 406, "not acceptable: GET opens an SSE stream; send Accept: text/event-stream");
      co_return co_await write(res);
    }
    std::optional<Response> refusal;
    auto session = session_of(req, refusal);
    if (!session) co_return co_await write(*refusal);
    if (auto problem = version_problem(req)) co_return co_await write(*problem);
    session->touch();
    const std::string_view last = text::trim(req["last-event-id"]);
    if (!last.empty()) {
      std::uint64_t stream_id = 0, seq = 0;
      const auto sep = last.find('_');
      bool parsed = sep != std::string_view::npos;
      if (parsed) {
        auto r1 = std::from_chars(last.data(), last.data() + sep, stream_id);
        auto r2 = std::from_chars(last.data() + sep + 1, last.data() + last.size(), seq);
        parsed = r1.ec == std::errc() && r1.ptr == last.data() + sep && r2.ec == std::errc() &&
                 r2.ptr == last.data() + last.size();
      }
      if (!parsed) {
        Response res = error_response(v, 400, fmt::format("bad request: Last-Event-ID '{}' is not an event id of this server",
                                                          std::string(last)));
        co_return co_await write(res);
      }
      auto stream = session->find_stream(stream_id);
      if (!stream || stream->evicted_before(seq) || seq > stream->last_seq()) {
        Response res = error_response(v, 404, fmt::format("cannot resume after event '{}': that stream has ended and was delivered, "
                                                          "or its events are no longer kept",
                                                          std::string(last)));
        co_return co_await write(res);
      }
      if (stream->attached) {
        Response res = error_response(v, 409, "conflict: that stream is already being read on another connection");
        co_return co_await write(res);
      }
      co_return co_await write_stream(session, stream, seq, false, v);
    }
    auto stream = session->standalone();
    if (stream->attached) {
      Response res = error_response(v, 409, "conflict: this session already has a GET stream open; only one is allowed");
      co_return co_await write(res);
    }
    co_return co_await write_stream(session, stream, stream->delivered_seq(), true, v);
  }

  awaitable<bool> mcp_delete(Request& req) {
    std::optional<Response> refusal;
    auto session = session_of(req, refusal);
    if (!session) co_return co_await write(*refusal);
    hub_.remove(session->id());
    Response res{bhttp::status::ok, req.version()};
    res.prepare_payload();
    co_return co_await write(res);
  }

  awaitable<bool> legacy_get(Request& req) {
    const unsigned v = req.version();
    if (!accepts(req[bhttp::field::accept], "text/event-stream")) {
      Response res = error_response(v, 406, "not acceptable: this endpoint is an SSE stream; send Accept: text/event-stream");
      co_return co_await write(res);
    }
    Refusal refusal;
    auto session = hub_.create_session(true, peer_, refusal);
    if (!session) {
      Response res = refusal_response(v, refusal);
      co_return co_await write(res);
    }
    auto stream = session->standalone();
    stream->push_raw(fmt::format("event: endpoint\ndata: /messages/?session_id={}\n\n", session->id()));
    const bool keep = co_await write_stream(session, stream, 0, false, v);
    hub_.remove(session->id());  // a legacy session lives as long as its stream
    co_return keep;
  }

  awaitable<bool> legacy_post(Request& req) {
    const unsigned v = req.version();
    const auto sid = query_value(path_query(req.target()), "session_id");
    if (!sid || sid->empty()) {
      Response res = error_response(v, 400, "bad request: session_id is missing (use the URL the SSE stream's endpoint event gave)");
      co_return co_await write(res);
    }
    auto session = hub_.find(*sid);
    if (!session || !session->legacy()) {
      Response res = error_response(v, 404, "session not found: open the SSE stream again", -32001);
      co_return co_await write(res);
    }
    json message;
    if (auto malformed = parse_body(req, message)) co_return co_await write(*malformed);
    if (message.is_object() && message.contains("id") && message.contains("method")) {
      const json& method = message["method"];
      if (auto refusal = hub_.admit(*session, method.is_string() ? method.get<std::string>() : "")) {
        // Answers travel on the stream, which this client may not be reading: said here.
        Response res = refusal_response(v, *refusal, message["id"]);
        co_return co_await write(res);
      }
    }
    session->receive(std::move(message));
    Response res{bhttp::status::accepted, v};
    res.set(bhttp::field::content_type, "text/plain");
    res.body() = "Accepted";
    res.prepare_payload();
    co_return co_await write(res);
  }

  static std::string_view path_query(std::string_view target) {
    const auto q = target.find('?');
    return q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  }

  std::uint64_t largest_body_limit() const {
    std::uint64_t limit = opt_.max_body_bytes;
    for (const StreamRoute& route : opt_.stream_routes) limit = std::max(limit, route.max_body_bytes);
    return limit;
  }

  // The streaming route serving `path` (and `OPTIONS /` for a route that answers it), if any.
  const StreamRoute* stream_route_of(bhttp::verb method, std::string_view path) const {
    for (const StreamRoute& route : opt_.stream_routes) {
      if (path.rfind(route.prefix, 0) == 0 &&
          (path.size() == route.prefix.size() || path[route.prefix.size()] == '/'))
        return &route;
      if (route.answers_root_options && path == "/" && method == bhttp::verb::options) return &route;
    }
    return nullptr;
  }

  // A streaming route's exchange: the handler runs on a worker and pulls the body through a
  // BodyPipe that this coroutine fills as it asks (at most kPipeBytes ahead); the answer is
  // written from memory or with sendfile. Returns whether the connection can serve another
  // request (not when the body was left unread or broken).
  awaitable<bool> stream_exchange(const StreamRoute& route, bhttp::request_parser<bhttp::string_body>& header_parser,
                                  beast::flat_buffer& buffer) {
    // The handler may work for long without the client (a big COPY): only reads and writes on
    // the socket run against read_timeout below.
    disarm();
    bhttp::request_parser<bhttp::buffer_body> parser(std::move(header_parser));
    parser.body_limit(route.max_body_bytes);
    const auto& req = parser.get();
    const unsigned v = req.version();
    const bool expect100 = lower(req[bhttp::field::expect]) == "100-continue";
    HttpRequest in = request_of(req);
    const bool head = req.method() == bhttp::verb::head;

    auto pipe = std::make_shared<BodyPipe>();
    auto timer = std::make_shared<asio::steady_timer>(socket_.get_executor(), Clock::time_point::max());
    auto signaled = std::make_shared<bool>(false);  // I/O thread only
    asio::io_context& io = hub_.io;
    pipe->wake_io = [&io, timer, signaled] {
      asio::post(io, [timer, signaled] {
        *signaled = true;
        timer->cancel();
      });
    };
    auto result = std::make_shared<std::optional<StreamResponse>>();
    hub_.workers.post([pipe, result, handler = route.handler, in = std::move(in), &io, timer, signaled] {
      StreamResponse out;
      try {
        PipeReader reader(*pipe);
        out = handler(in, reader);
      } catch (const std::exception& e) {
        out = StreamResponse{};
        out.status = pipe->too_large ? 413 : 500;
        out.body = std::string(e.what()) + "\n";
        out.headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
      }
      pipe->finished_handler();
      asio::post(io, [result, out = std::move(out), timer, signaled]() mutable {
        *result = std::move(out);
        *signaled = true;
        timer->cancel();
      });
    });

    bool sent100 = false;
    bool broken = false;  // the body could not be read: the connection cannot be reused
    std::vector<char> chunk(64 * 1024);
    while (!*result) {
      if (pipe->needs_data() && !broken) {
        if (expect100 && !sent100 && !parser.is_done()) {
          sent100 = true;
          bhttp::response<bhttp::empty_body> go{bhttp::status::continue_, v};
          arm(opt_.read_timeout);
          auto [wec, wn] = co_await bhttp::async_write(socket_, go, kTuple);
          disarm();
          if (wec) {
            broken = true;
            pipe->fail("the client went away", false);
            continue;
          }
        }
        if (parser.is_done()) {
          pipe->push({}, true);
          continue;
        }
        parser.get().body().data = chunk.data();
        parser.get().body().size = chunk.size();
        arm(opt_.read_timeout);
        auto [ec, n] = co_await bhttp::async_read_some(socket_, buffer, parser, kTuple);
        disarm();
        if (ec == bhttp::error::need_buffer) ec = {};
        if (ec) {
          broken = true;
          const bool too_large = ec == bhttp::error::body_limit;
          pipe->fail(too_large ? fmt::format("request body too large: the limit is {} bytes", route.max_body_bytes)
                               : fmt::format("the request body could not be read: {}", ec.message()),
                     too_large);
          continue;
        }
        const std::size_t got = chunk.size() - parser.get().body().size;
        pipe->push(std::string(chunk.data(), got), parser.is_done());
        continue;
      }
      if (!*signaled) co_await timer->async_wait(kTuple);
      *signaled = false;
    }
    StreamResponse& out = **result;
    // A body the handler left unread: read and dropped when small, else the connection closes.
    if (!broken && !parser.is_done()) {
      std::size_t skipped = 0;
      while (!parser.is_done() && skipped < 256 * 1024 && !(expect100 && !sent100)) {
        parser.get().body().data = chunk.data();
        parser.get().body().size = chunk.size();
        arm(opt_.read_timeout);
        auto [ec, n] = co_await bhttp::async_read_some(socket_, buffer, parser, kTuple);
        disarm();
        if (ec == bhttp::error::need_buffer) ec = {};
        if (ec) break;
        skipped += chunk.size() - parser.get().body().size;
      }
    }
    const bool keep = !broken && parser.is_done() && parser.get().keep_alive() && !hub_.draining;

    bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(out.status), v};
    for (const auto& [name, value] : out.headers) res.insert(name, value);
    add_common_headers(res);
    const bool no_body = out.status == 204 || out.status == 304 || (out.status >= 100 && out.status < 200);
    if (!no_body) res.content_length(out.file ? out.file_length : out.body.size());
    res.keep_alive(keep);
    if (keep && opt_.header_timeout >= std::chrono::seconds(1))
      res.set(bhttp::field::keep_alive,
              fmt::format("timeout={}", std::chrono::duration_cast<std::chrono::seconds>(opt_.header_timeout).count()));
    bhttp::response_serializer<bhttp::empty_body> serializer{res};
    arm(opt_.read_timeout);
    auto [hec, hn] = co_await bhttp::async_write_header(socket_, serializer, kTuple);
    disarm();
    if (hec) co_return false;
    if (head || no_body) {
      if (!keep) co_await linger();
      co_return keep;
    }
    if (!keep && !out.file) {
      arm(opt_.read_timeout);
      auto [bec, bn] = co_await asio::async_write(socket_, asio::buffer(out.body), kTuple);
      disarm();
      if (!bec) co_await linger();
      co_return false;
    }
    if (out.file) co_return (co_await send_file(out.file.get(), out.file_offset, out.file_length)) && keep;
    arm(opt_.read_timeout);
    auto [bec, bn] = co_await asio::async_write(socket_, asio::buffer(out.body), kTuple);
    disarm();
    co_return !bec && keep;
  }

  // Ends the sending side and reads what the client still sends (a body the server did not
  // want), briefly: closing a socket with unread data resets the connection, and the client
  // would lose the answer it has not read yet (a lingering close, as Apache does).
  awaitable<void> linger() {
    boost::system::error_code ignored;
    socket_.shutdown(Socket::shutdown_send, ignored);
    std::vector<char> sink(64 * 1024);
    std::size_t total = 0;
    arm(std::chrono::seconds(2));
    while (total < 64 * 1024 * 1024) {
      auto [ec, n] = co_await socket_.async_read_some(asio::buffer(sink), kTuple);
      if (ec) break;
      total += n;
    }
    disarm();
  }

  // `length` bytes of `fd` from `offset` with sendfile(2) straight from the page cache, waiting
  // for the socket to drain when it is full. False when the client went away or the file shrank
  // (the promised length cannot be kept: the connection must end).
  awaitable<bool> send_file(int fd, std::uint64_t offset, std::uint64_t length) {
    boost::system::error_code ec;
    socket_.native_non_blocking(true, ec);
    if (ec) co_return false;
    off_t off = static_cast<off_t>(offset);
    std::uint64_t left = length;
    while (left > 0) {
      const ssize_t n = ::sendfile(socket_.native_handle(), fd, &off, std::min<std::uint64_t>(left, 1ull << 30));
      if (n > 0) {
        left -= static_cast<std::uint64_t>(n);
        continue;
      }
      if (n == 0) co_return false;  // the file is shorter than it was
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) co_return false;
      arm(opt_.read_timeout);
      auto [wec] = co_await socket_.async_wait(Socket::wait_write, kTuple);
      disarm();
      if (wec) co_return false;
    }
    co_return true;
  }

  awaitable<bool> custom(const HttpRoute& route, Request& req) {
    HttpRequest in = request_of(req);
    in.body = std::move(req.body());
    auto done = std::make_shared<std::optional<HttpResponse>>();
    auto timer = std::make_shared<asio::steady_timer>(socket_.get_executor(), Clock::time_point::max());
    asio::io_context& io = hub_.io;
    hub_.workers.post([&io, done, timer, handler = route.handler, in = std::move(in)] {
      HttpResponse out;
      try {
        out = handler(in);
      } catch (const std::exception& e) {
        out.status = 500;
        out.body = e.what();
      }
      asio::post(io, [done, timer, out = std::move(out)]() mutable {
        *done = std::move(out);
        timer->cancel();
      });
    });
    while (!*done) co_await timer->async_wait(kTuple);
    Response res{static_cast<bhttp::status>((*done)->status), req.version()};
    for (const auto& [k, val] : (*done)->headers) res.set(k, val);
    res.body() = std::move((*done)->body);
    res.prepare_payload();
    co_return co_await write(res);
  }

  // An EventRoute stream: `open` runs on a worker; with 200 the connection writes what the
  // handler sends (from any thread, through an EventChannel) until the client goes, the server
  // stops, or the client reads too slowly (the stream is cut). The connection ends with it.
  awaitable<bool> event_stream(const EventRoute& route, Request& req) {
    const unsigned v = req.version();
    auto channel = std::make_shared<EventChannel>(route.buffer_bytes);
    hub_.add_channel(channel);
    struct Unregister {
      Hub& hub;
      std::shared_ptr<EventChannel> channel;
      ~Unregister() {
        channel->close();
        hub.remove_channel(channel.get());
      }
    } unregister{hub_, channel};

    auto done = std::make_shared<std::optional<HttpResponse>>();
    auto wake = std::make_shared<asio::steady_timer>(socket_.get_executor(), Clock::time_point::max());
    asio::io_context& io = hub_.io;
    hub_.workers.post([&io, done, weak_wake = std::weak_ptr<asio::steady_timer>(wake), open = route.open,
                       in = request_of(req), sink = std::shared_ptr<EventSink>(channel)] {
      HttpResponse out;
      try {
        out = open(in, sink);
      } catch (const std::exception& e) {
        out = HttpResponse{};
        out.status = 500;
        out.body = e.what();
      }
      asio::post(io, [done, weak_wake, out = std::move(out)]() mutable {
        *done = std::move(out);
        if (auto timer = weak_wake.lock()) timer->cancel();
      });
    });
    while (!*done) co_await wake->async_wait(kTuple);
    HttpResponse& opened = **done;
    if (opened.status != 200) {
      channel->close();
      Response res{static_cast<bhttp::status>(opened.status), v};
      for (const auto& [k, val] : opened.headers) res.set(k, val);
      res.body() = std::move(opened.body);
      res.prepare_payload();
      co_return co_await write(res);
    }

    // Events (or a cut) wake this coroutine; a cut also closes the socket, in case a write to a
    // client that does not read is what it waits on.
    channel->on_ready([&io, weak_wake = std::weak_ptr<asio::steady_timer>(wake),
                       weak_channel = std::weak_ptr<EventChannel>(channel),
                       weak_self = std::weak_ptr<Connection>(shared_from_this())] {
      asio::post(io, [weak_wake, weak_channel, weak_self] {
        auto channel = weak_channel.lock();
        if (auto self = weak_self.lock(); self && channel && channel->cut()) self->abort();
        if (auto timer = weak_wake.lock()) timer->cancel();
      });
    });
    asio::co_spawn(socket_.get_executor(), watch_hangup(shared_from_this(), channel, wake), asio::detached);

    bhttp::response<bhttp::empty_body> res{bhttp::status::ok, v};
    for (const auto& [k, val] : opened.headers) res.set(k, val);
    res.set(bhttp::field::content_type, "text/event-stream");
    res.set(bhttp::field::cache_control, "no-store");
    res.set("X-Accel-Buffering", "no");
    add_common_headers(res);
    // HTTP/1.0 clients cannot decode chunks: the stream is sent as is and ends with the connection.
    const bool chunked = v >= 11;
    if (chunked) res.chunked(true);
    res.keep_alive(false);
    auto send = [&](const auto& buffers) {
      return chunked ? asio::async_write(socket_, bhttp::make_chunk(buffers), kTuple)
                     : asio::async_write(socket_, buffers, kTuple);
    };
    bhttp::response_serializer<bhttp::empty_body> serializer{res};
    arm(opt_.read_timeout);
    auto [hec, hn] = co_await bhttp::async_write_header(socket_, serializer, kTuple);
    disarm();
    if (hec) co_return false;
    static const std::string kKeepalive = ": keepalive\n\n";
    for (;;) {
      const std::string batch = channel->take();
      if (!batch.empty()) {
        arm(opt_.read_timeout);
        auto [ec, n] = co_await send(asio::buffer(batch));
        disarm();
        channel->written(batch.size());
        if (ec) break;  // the client went away (or the stream was cut)
        continue;
      }
      if (channel->closed()) {
        if (channel->ended() && chunked) {
          // Ended by its handler: the response ends properly (the last chunk).
          arm(opt_.read_timeout);
          co_await asio::async_write(socket_, bhttp::make_chunk_last(), kTuple);
          disarm();
        }
        break;
      }
      wake->expires_after(opt_.sse_keepalive);
      auto [ec] = co_await wake->async_wait(kTuple);
      if (!ec) {
        // Quiet for a while: a comment keeps proxies from timing out and shows whether the
        // client is still there.
        arm(opt_.read_timeout);
        auto [wec, n] = co_await send(asio::buffer(kKeepalive));
        disarm();
        if (wec) break;
      }
    }
    co_return false;  // the stream ends with its connection
  }

  // A WebSocketRoute: the upgrade is checked (method, version, key, the route's caps), `open`
  // runs on a worker and gives the handler (or the refusal to answer), then Beast takes the
  // socket. This coroutine writes what the handler sends (one message at a time, from the
  // channel) and ends with a close frame; ws_reader reads. on_close is queued once, last.
  awaitable<bool> websocket_exchange(const WebSocketRoute& route, Request& req) {
    const unsigned v = req.version();
    const std::string path(path_of(req.target()));
    if (req.method() != bhttp::verb::get || !websocket::is_upgrade(req)) {
      Response res = error_response(v, 426,
                                    fmt::format("upgrade required: {} is a WebSocket endpoint; open it with a WebSocket client "
                                                "(a GET with 'Connection: Upgrade' and 'Upgrade: websocket', HTTP/1.1)",
                                                path));
      res.set(bhttp::field::upgrade, "websocket");
      co_return co_await write(res);
    }
    if (const std::string_view version = text::trim(req[bhttp::field::sec_websocket_version]); version != "13") {
      Response res = error_response(v, 426,
                                    fmt::format("unsupported Sec-WebSocket-Version '{}': this server speaks version 13 "
                                                "(RFC 6455)",
                                                std::string(version)));
      res.set(bhttp::field::sec_websocket_version, "13");
      res.keep_alive(false);
      co_return co_await write(res);
    }
    if (text::trim(req[bhttp::field::sec_websocket_key]).size() != 24) {
      Response res = error_response(v, 400, "bad request: Sec-WebSocket-Key must be 16 random bytes in base64 (RFC 6455)");
      res.keep_alive(false);
      co_return co_await write(res);
    }
    if (auto refusal = hub_.take_websocket(route, peer_)) {
      Response res = refusal_response(v, *refusal);
      if (refusal->http_status == 503) res.set(bhttp::field::retry_after, "5");
      res.keep_alive(false);
      co_return co_await write(res);
    }
    struct Slot {
      Hub& hub;
      const WebSocketRoute& route;
      const Peer& peer;
      ~Slot() { hub.release_websocket(route, peer); }
    } slot{hub_, route, peer_};

    auto channel = std::make_shared<WebSocketChannel>(route.buffer_bytes);
    auto done = std::make_shared<std::optional<WebSocketOpen>>();
    auto wake = std::make_shared<asio::steady_timer>(socket_.get_executor(), Clock::time_point::max());
    asio::io_context& io = hub_.io;
    hub_.workers.post([&io, done, weak_wake = std::weak_ptr<asio::steady_timer>(wake), open = route.open,
                       in = request_of(req), peer = std::shared_ptr<WebSocketPeer>(channel)] {
      WebSocketOpen out;
      try {
        out = open(in, peer);
      } catch (const std::exception& e) {
        out = WebSocketOpen{};
        out.refusal.status = 500;
        out.refusal.body = e.what();
      }
      asio::post(io, [done, weak_wake, out = std::move(out)]() mutable {
        *done = std::move(out);
        if (auto timer = weak_wake.lock()) timer->cancel();
      });
    });
    while (!*done) co_await wake->async_wait(kTuple);
    WebSocketOpen& opened = **done;
    if (!opened.handler) {
      channel->finish();
      HttpResponse& refusal = opened.refusal;
      if (refusal.status < 300) {  // no handler and no refusal: the route is broken
        refusal.status = 500;
        refusal.body = "the WebSocket route gave neither a handler nor a refusal";
      }
      Response res{static_cast<bhttp::status>(refusal.status), v};
      for (const auto& [k, val] : refusal.headers) res.set(k, val);
      res.body() = std::move(refusal.body);
      res.prepare_payload();
      res.keep_alive(false);
      co_return co_await write(res);
    }

    // From here on the handler hears on_close exactly once, however the connection ends.
    auto calls = std::make_shared<WebSocketCalls>(hub_.workers, std::move(opened.handler), channel, route.buffer_bytes);
    struct CloseOnce {
      std::shared_ptr<WebSocketChannel> channel;
      std::shared_ptr<WebSocketCalls> calls;
      ~CloseOnce() {
        channel->finish();
        calls->closed();
      }
    } close_once{channel, calls};
    if (hub_.draining) {  // the server began to stop while `open` ran
      Response res = error_response(v, 503, "the server is shutting down");
      res.set(bhttp::field::retry_after, "5");
      res.keep_alive(false);
      co_return co_await write(res);
    }

    ws_ = std::make_shared<websocket::stream<Socket>>(std::move(socket_));
    ws_channel_ = channel;
    auto ws = ws_;
    websocket::permessage_deflate no_deflate;  // off: VNC data is compressed already
    no_deflate.server_enable = false;
    ws->set_option(no_deflate);
    ws->read_message_max(route.max_message_bytes);
    websocket::stream_base::timeout timeouts;
    timeouts.handshake_timeout = opt_.read_timeout;
    // Beast pings after half the idle time without data, and closes after all of it.
    timeouts.idle_timeout = 2 * opt_.sse_keepalive;
    timeouts.keep_alive_pings = true;
    ws->set_option(timeouts);
    ws->set_option(websocket::stream_base::decorator([subprotocol = opened.subprotocol](websocket::response_type& res) {
      add_common_headers(res);
      if (!subprotocol.empty()) res.set(bhttp::field::sec_websocket_protocol, subprotocol);
    }));
    disarm();
    if (auto [ec] = co_await ws->async_accept(req, kTuple); ec) co_return false;

    // The handler's sends (from any thread) wake the writer; a cut while a write to a client
    // that does not read is stuck closes the socket (the close frame could not get through).
    channel->on_ready([&io, weak_wake = std::weak_ptr<asio::steady_timer>(wake),
                       weak_self = std::weak_ptr<Connection>(shared_from_this()),
                       weak_channel = std::weak_ptr<WebSocketChannel>(channel)] {
      asio::post(io, [weak_wake, weak_self, weak_channel] {
        auto channel = weak_channel.lock();
        if (auto self = weak_self.lock(); self && channel && channel->cut() && self->ws_writing_) self->abort();
        if (auto timer = weak_wake.lock()) timer->cancel();
      });
    });
    auto reading = std::make_shared<bool>(true);
    auto room = std::make_shared<asio::steady_timer>(socket_.get_executor(), Clock::time_point::max());
    calls->on_room([&io, weak_room = std::weak_ptr<asio::steady_timer>(room)] {
      asio::post(io, [weak_room] {
        if (auto timer = weak_room.lock()) timer->cancel();
      });
    });
    asio::co_spawn(ws->get_executor(), ws_reader(shared_from_this(), ws, calls, reading, wake, room), asio::detached);

    for (;;) {
      if (!*reading) break;  // the client closed (answered by Beast), went, or broke a rule
      if (auto message = channel->next()) {
        const std::size_t size = message->data.size();
        ws->binary(message->binary);
        arm(shutting_down_ ? kWebSocketCloseTime : opt_.read_timeout);
        ws_writing_ = true;
        auto [ec, n] = co_await ws->async_write(asio::buffer(message->data), kTuple);
        ws_writing_ = false;
        if (!shutting_down_) disarm();
        channel->written(size);
        if (ec) break;
        continue;
      }
      if (auto ending = channel->ending()) {
        arm(kWebSocketCloseTime);
        ws_writing_ = true;
        co_await ws->async_close(websocket::close_reason(static_cast<websocket::close_code>(ending->code), ending->reason), kTuple);
        ws_writing_ = false;
        break;
      }
      wake->expires_at(Clock::time_point::max());
      co_await wake->async_wait(kTuple);
    }
    channel->finish();
    if (*reading) {
      // The reader ends with the closing handshake, or when the watchdog closes the socket.
      arm(kWebSocketCloseTime);
      room->cancel();
      while (*reading) {
        wake->expires_at(Clock::time_point::max());
        co_await wake->async_wait(kTuple);
      }
    }
    co_return false;  // the connection ends with its WebSocket
  }

  // Reads whole messages (at most the route's max_message_bytes: Beast closes with 1009 beyond)
  // and queues them for the handler, pausing while it is behind.
  static awaitable<void> ws_reader(std::shared_ptr<Connection> self, std::shared_ptr<websocket::stream<Socket>> ws,
                                   std::shared_ptr<WebSocketCalls> calls, std::shared_ptr<bool> reading,
                                   std::shared_ptr<asio::steady_timer> wake, std::shared_ptr<asio::steady_timer> room) {
    beast::flat_buffer buffer;
    for (;;) {
      while (calls->full() && !self->ws_channel_->closed()) {
        room->expires_at(Clock::time_point::max());
        co_await room->async_wait(kTuple);
      }
      if (self->ws_channel_->closed() && calls->full()) break;
      auto [ec, n] = co_await ws->async_read(buffer, kTuple);
      if (ec) break;
      calls->message(beast::buffers_to_string(buffer.data()), ws->got_binary());
      buffer.consume(buffer.size());
    }
    *reading = false;
    wake->cancel();
  }

  // Closes `channel` when the client goes away while its event stream is quiet (EOF or an error
  // on the socket). Whatever else the client sends is read and dropped, within a bound.
  static awaitable<void> watch_hangup(std::shared_ptr<Connection> self, std::shared_ptr<EventChannel> channel,
                                      std::shared_ptr<asio::steady_timer> wake) {
    std::size_t dropped = 0;
    for (;;) {
      auto [ec] = co_await self->socket_.async_wait(Socket::wait_read, kTuple);
      if (channel->closed()) co_return;
      bool gone = static_cast<bool>(ec);
      if (!ec) {
        char buf[4096];
        const ssize_t n = ::recv(self->socket_.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
        gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        if (n > 0) dropped += static_cast<std::size_t>(n);
        gone = gone || dropped > 64 * 1024;
      }
      if (gone) {
        channel->close();
        wake->cancel();
        co_return;
      }
    }
  }

  // Writes `stream` as an SSE response from event `after` on, until it finishes (POST), closes,
  // or the client goes away. Returns whether the connection can serve another request.
  awaitable<bool> write_stream(std::shared_ptr<HttpSession> session, std::shared_ptr<Stream> stream,
                               std::uint64_t after, bool priming, unsigned version) {
    stream->attached = true;
    ++session->connections;
    const bool post_stream = !stream->standalone();
    if (post_stream) ++hub_.post_writers;
    // The client may go away while the stream is quiet: watch the socket for EOF so that the
    // stream is free at once for a resume on a new connection.
    auto gone = std::make_shared<bool>(false);
    auto watching = std::make_shared<bool>(true);
    socket_.async_wait(Socket::wait_read, [self = shared_from_this(), gone, watching,
                                           stream](const boost::system::error_code& ec) {
      if (!*watching) return;
      bool closed = static_cast<bool>(ec);
      if (!ec) {
        char c;
        const ssize_t n = ::recv(self->socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        // Data instead: a pipelined request, read after this stream.
      }
      if (closed) {
        *gone = true;
        stream->wake();
      }
    });
    stream->cut_writer = [weak = std::weak_ptr<Connection>(shared_from_this())] {
      if (auto c = weak.lock()) c->abort();
    };
    struct Detach {
      Hub& hub;
      std::shared_ptr<HttpSession> session;
      std::shared_ptr<Stream> stream;
      bool post_stream;
      std::shared_ptr<bool> watching;
      Socket& socket;
      ~Detach() {
        stream->attached = false;
        stream->end_write();
        stream->cut_writer = nullptr;
        --session->connections;
        session->touch();
        if (post_stream) --hub.post_writers;
        if (*watching) {
          *watching = false;
          boost::system::error_code ignored;
          socket.cancel(ignored);
        }
        if (stream->abandoned) session->drop_request_stream(stream);
      }
    } detach{hub_, session, stream, post_stream, watching, socket_};

    bhttp::response<bhttp::empty_body> res{bhttp::status::ok, version};
    res.set(bhttp::field::content_type, "text/event-stream");
    res.set(bhttp::field::cache_control, "no-cache, no-transform");
    res.set("X-Accel-Buffering", "no");
    if (!session->legacy() && !session->ephemeral()) res.set("Mcp-Session-Id", session->id());
    add_common_headers(res);
    // HTTP/1.0 clients cannot decode chunks: the stream is sent as is and ends with the connection.
    const bool chunked = version >= 11;
    if (chunked)
      res.chunked(true);
    else
      res.keep_alive(false);
    auto send = [&](const auto& buffers) {
      return chunked ? asio::async_write(socket_, bhttp::make_chunk(buffers), kTuple)
                     : asio::async_write(socket_, buffers, kTuple);
    };
    bhttp::response_serializer<bhttp::empty_body> serializer{res};
    arm(opt_.read_timeout);
    if (auto [ec, n] = co_await bhttp::async_write_header(socket_, serializer, kTuple); ec) co_return false;
    std::string first;
    if (priming)
      first = fmt::format("id: {}{}\nretry: {}\ndata: \n\n", stream->event_prefix, after, opt_.sse_retry.count());
    std::uint64_t cursor = after;
    for (;;) {
      if (*gone) co_return false;  // the stream stays for a resume
      if (stream->closed() && first.empty()) break;
      if (!first.empty() || stream->has_after(cursor)) {
        std::uint64_t last = cursor;
        // The events are written from where the stream keeps them (never copied); they stay
        // until delivered() below.
        std::vector<asio::const_buffer> buffers;
        if (!first.empty()) buffers.emplace_back(first.data(), first.size());
        for (const auto& b : stream->take(cursor, last)) buffers.push_back(b);
        arm(opt_.read_timeout);
        stream->begin_write(cursor);
        auto [ec, n] = co_await send(buffers);
        stream->end_write();
        disarm();
        first.clear();
        if (ec) co_return false;  // the client went away; the stream stays for a resume
        cursor = last;
        stream->delivered(last);
        continue;
      }
      if (stream->finished()) break;
      stream->timer().expires_after(opt_.sse_keepalive);
      auto [ec] = co_await stream->timer().async_wait(kTuple);
      if (!ec) {
        // Nothing to say for a while: a comment keeps proxies from timing out and shows
        // whether the client is still there.
        static const std::string kKeepalive = ": keepalive\n\n";
        arm(opt_.read_timeout);
        auto [wec, n] = co_await send(asio::buffer(kKeepalive));
        disarm();
        if (wec) co_return false;
      }
    }
    if (chunked) {
      arm(opt_.read_timeout);
      auto [ec, n] = co_await asio::async_write(socket_, bhttp::make_chunk_last(), kTuple);
      disarm();
      if (ec) co_return false;
    }
    if (stream->finished() && cursor >= stream->last_seq()) session->drop_request_stream(stream);
    co_return chunked && !stream->standalone() && !hub_.draining;
  }

  static constexpr std::chrono::milliseconds kWebSocketCloseTime{1000};  // for the closing handshake

  Listener& listener_;
  Hub& hub_;
  const HttpOptions& opt_;
  Socket socket_;
  // A WebSocket owns the socket once upgraded (socket_ is then empty): its pending operations
  // keep it alive, never a reference into this connection.
  std::shared_ptr<websocket::stream<Socket>> ws_;
  std::shared_ptr<WebSocketChannel> ws_channel_;
  bool ws_writing_ = false;
  bool shutting_down_ = false;
  bool local_;
  Peer peer_;
  const bool over_tls_ = false;  // no TLS listener yet; one would set this (https Origin, Secure cookie)
  Target target_;                // of the request being served (set by check)
  bool by_cookie_ = false;       // it was authenticated by the dashboard's cookie
  asio::steady_timer deadline_;
  bool done_ = false;
  std::uint64_t id_ = 0;
};

template <class Acceptor>
awaitable<void> accept_loop(Listener& listener, Acceptor& acceptor, bool local) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(kTuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
        // Out of descriptors: a connection still waiting for its header makes room.
        if (listener.evict_waiting(nullptr)) continue;
        log::warn("http: accept failed: {} (every connection is busy; raise the open-file limit or lower [server] "
                  "max_connections)",
                  ec.message());
        asio::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(100));
        co_await pause.async_wait(kTuple);
        continue;
      }
      log::warn("http: accept failed: {}", ec.message());
      continue;
    }
    using SocketT = std::decay_t<decltype(socket)>;
    if constexpr (std::is_same_v<SocketT, tcp::socket>) {
      // SSE events are small writes that must leave at once (no Nagle wait for an ACK).
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
    }
    Peer peer = peer_of(socket, listener);
    if (auto refusal = listener.make_room(peer)) {
      refuse_connection(socket.native_handle(), *refusal);
      boost::system::error_code ignored;
      socket.close(ignored);
      continue;
    }
    std::make_shared<Connection>(listener, Connection::Socket(std::move(socket)), local, std::move(peer))->start();
  }
}

// A Unix socket path: refuses a path that is something else, and removes a stale socket that
// nobody listens on any more.
void prepare_socket_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISSOCK(st.st_mode))
    throw Error(fmt::format("--uds {}: the path exists and is not a socket; choose another path", path));
  asio::io_context probe_io;
  unix_socket::socket probe(probe_io);
  boost::system::error_code ec;
  probe.connect(unix_socket::endpoint(path), ec);
  if (!ec)
    throw Error(fmt::format("--uds {}: another server is listening on this socket; stop it or choose another path", path));
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace http_detail

bool is_loopback_host(const std::string& raw) {
  const std::string host = http_detail::host_of(raw);
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
  if (host.size() > 4 && host.rfind("127.", 0) == 0)
    return host.find_first_not_of("0123456789.") == std::string::npos;
  return false;
}

int serve_http(mcp::Server& server, const HttpOptions& options) {
  using namespace http_detail;
  // Answers of a few MiB are made on worker threads and freed here. With malloc's sliding mmap
  // threshold they would end up in the arenas after the first one and, freed, stay there
  // (fragmented, untrimmable); above a fixed 1 MiB each is its own mapping, given back on free.
  ::mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
  asio::io_context io(1);
  Hub hub(server, options, io);
  Listener listener(hub, options);

  std::optional<tcp::acceptor> tcp_acceptor;
  std::optional<unix_socket::acceptor> unix_acceptor;
  std::string url;
  if (!options.uds.empty()) {
    prepare_socket_path(options.uds);
    const mode_t old = ::umask(0177);  // the socket is created 0600
    try {
      unix_acceptor.emplace(io, unix_socket::endpoint(options.uds));
    } catch (const boost::system::system_error& e) {
      ::umask(old);
      throw Error(fmt::format("cannot listen on Unix socket {}: {}", options.uds, e.code().message()));
    }
    ::umask(old);
    ::chmod(options.uds.c_str(), 0600);
    url = fmt::format("unix:{}:{}", options.uds, options.path);
    asio::co_spawn(io, accept_loop(listener, *unix_acceptor, true), asio::detached);
  } else {
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    auto results = resolver.resolve(options.host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty())
      throw Error(fmt::format("cannot listen on {}:{}: cannot resolve the address: {}", options.host, options.port, ec.message()));
    const tcp::endpoint endpoint = results.begin()->endpoint();
    tcp_acceptor.emplace(io);
    tcp_acceptor->open(endpoint.protocol(), ec);
    if (!ec) tcp_acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) tcp_acceptor->bind(endpoint, ec);
    if (!ec) tcp_acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      throw Error(fmt::format("cannot listen on {}:{}: {}{}", options.host, options.port, ec.message(),
                              ec == asio::error::address_in_use ? " (another program uses the port; pick another with --port)" : ""));
    const auto local = tcp_acceptor->local_endpoint();
    const std::string shown = local.address().is_v6() ? "[" + local.address().to_string() + "]" : local.address().to_string();
    url = fmt::format("http://{}:{}{}", shown, local.port(), options.path);
    asio::co_spawn(io, accept_loop(listener, *tcp_acceptor, false), asio::detached);
  }

  hub.url = url;
  hub.publish_status();
  hub.start_sweeper();
  asio::signal_set signals(io, SIGINT, SIGTERM);
  asio::steady_timer drain(io);
  asio::steady_timer hard_stop(io);
  Clock::time_point drain_deadline;
  // Stops the loop once every connection has ended, or after 2 s whatever is left.
  Clock::time_point stop_deadline;
  std::function<void()> wait_closed = [&] {
    if (listener.connections.empty() || Clock::now() >= stop_deadline) {
      io.stop();
      return;
    }
    hard_stop.expires_after(std::chrono::milliseconds(10));
    hard_stop.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) wait_closed();
    });
  };
  std::function<void()> close_everything = [&] {
    hub.close_all();
    std::vector<std::function<void()>> closers;  // closing erases from the table
    for (const auto& [id, entry] : listener.connections) closers.push_back(entry.close);
    for (auto& close : closers) close();
    stop_deadline = Clock::now() + std::chrono::seconds(2);
    wait_closed();
  };
  // Requests still running get an error on their stream (so no client waits for an answer
  // that cannot come); then, once those are written (at most 1 s), everything closes.
  Clock::time_point flush_deadline;
  std::function<void()> wait_flushed = [&] {
    if (hub.post_writers == 0 || Clock::now() >= flush_deadline) {
      close_everything();
      return;
    }
    hard_stop.expires_after(std::chrono::milliseconds(10));
    hard_stop.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) wait_flushed();
    });
  };
  std::function<void()> finish = [&] {
    hub.answer_unfinished("the server is shutting down: this request was cancelled (jobs keep running; "
                          "poll them once the server is back)");
    flush_deadline = Clock::now() + std::chrono::seconds(1);
    wait_flushed();
  };
  std::function<void()> wait_drained = [&] {
    if ((hub.total_in_flight() == 0 && hub.post_writers == 0) || Clock::now() >= drain_deadline) {
      if (hub.total_in_flight() > 0)
        log::warn("http: {} request(s) still running after the {} ms grace period: cancelled", hub.total_in_flight(),
                  options.shutdown_grace.count());
      finish();
      return;
    }
    drain.expires_after(std::chrono::milliseconds(50));
    drain.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) wait_drained();
    });
  };
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    log::info("http: signal {} received: finishing requests in flight (up to {} ms), then stopping", signo,
              options.shutdown_grace.count());
    boost::system::error_code ignored;
    if (tcp_acceptor) tcp_acceptor->close(ignored);
    if (unix_acceptor) unix_acceptor->close(ignored);
    hub.draining = true;
    hub.stop_sweeper();
    // A subscriptions/listen stream only ends when its client goes: end it now (final message,
    // then its request is cancelled) so that the drain waits for real work only.
    hub.end_listens("the server is shutting down: this subscriptions/listen stream ends; listen again once the server "
                    "is back");
    drain_deadline = Clock::now() + options.shutdown_grace;
    wait_drained();
  });

  if (options.on_listening) options.on_listening(url);
  io.run();
  // Let the connections' last handlers (watchdogs, stream ends) finish before the hub goes.
  io.restart();
  io.run_for(std::chrono::milliseconds(200));
  if (!options.uds.empty()) ::unlink(options.uds.c_str());
  hub.close_all();
  return 0;
}

namespace testing {

std::string exchange(mcp::Server& server, const HttpOptions& options, const std::string& bytes,
                     std::chrono::milliseconds budget) {
  using namespace http_detail;
  asio::io_context io(1);
  std::string out;
  {
    Hub hub(server, options, io);
    Listener listener(hub, options);
    unix_socket::socket server_side(io), client(io);
    asio::local::connect_pair(server_side, client);
    // Treated as TCP so that the Host/Origin checks run too.
    Peer peer = peer_of(server_side, listener);
    std::make_shared<Connection>(listener, Connection::Socket(std::move(server_side)), false, std::move(peer))->start();
    asio::co_spawn(io, [&]() -> awaitable<void> {
      co_await asio::async_write(client, asio::buffer(bytes), kTuple);
      boost::system::error_code ignored;
      client.shutdown(unix_socket::socket::shutdown_send, ignored);
      char buf[16384];
      for (;;) {
        auto [ec, n] = co_await client.async_read_some(asio::buffer(buf), kTuple);
        out.append(buf, n);
        if (ec) break;
      }
    }, asio::detached);
    io.run_for(budget);
    hub.close_all();
    std::vector<std::function<void()>> closers;
    for (const auto& [id, entry] : listener.connections) closers.push_back(entry.close);
    for (auto& close : closers) close();
    boost::system::error_code ignored;
    client.close(ignored);
    io.restart();
    io.run_for(std::chrono::milliseconds(200));
  }
  return out;
}

}  // namespace testing

}  // namespace nshpc::transport
