// The HTTP transports on Boost.Beast/Asio, one code path for TCP and a Unix socket:
//  - streamable HTTP (MCP 2025-03-26 .. 2025-11-25) at `path` (default /mcp): POST answered with
//    JSON or an SSE stream (priming event first), GET stream for server-initiated messages,
//    DELETE ends the session, Mcp-Session-Id, MCP-Protocol-Version checked, resumable streams
//    (event ids per stream, GET + Last-Event-ID);
//  - the legacy HTTP+SSE transport (2024-11-05): GET opens the stream, whose first event names
//    the POST endpoint (/messages/?session_id=…); every answer comes on the stream.
//  - WebSocket routes (WebSocketRoute), upgraded on the same connection after the same checks.
// Every route but /healthz needs the bearer token (when one is set), or for a `browser` route the
// dashboard's session cookie (HttpOptions::Login: /login, /logout); Host and Origin are checked
// on every request but /healthz (DNS-rebinding protection; /healthz says only {"status":"ok"}).
// Every response says X-Content-Type-Options: nosniff and Referrer-Policy: no-referrer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fd.hpp"
#include "mcp/server.hpp"

namespace nshpc::transport {

// A plain request/response route served next to MCP (the dashboard's assets).
// It is always behind the token (or, for a `browser` route, the dashboard's cookie) and the
// Host/Origin checks.
struct HttpRequest {
  std::string method;  // GET, POST, …
  std::string target;  // path and query as sent
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string peer;    // who sent it, for people and the audit: "uid 1000", "192.0.2.7"
  bool by_cookie = false;  // authenticated by the dashboard's cookie (a browser), not the token
};
struct HttpResponse {
  int status = 200;
  std::map<std::string, std::string> headers;
  std::string body;
};
struct HttpRoute {
  std::string prefix;  // e.g. "/ui/"; matched against the path
  bool exact = false;  // the path must equal `prefix` (e.g. "/")
  // A browser may use it with the dashboard's session cookie instead of the token (see
  // HttpOptions::Login). An unauthenticated GET that accepts text/html then gets the login page
  // (status 401).
  bool browser = false;
  std::function<HttpResponse(const HttpRequest&)> handler;  // runs on a worker thread
};

// The request body of a streaming route, read as the handler asks for it (never buffered whole).
// `Expect: 100-continue` is answered when the handler first reads, so a request refused
// without reading its body is never sent.
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // Up to `n` bytes of the body (chunked bodies arrive decoded); 0 at its end. Blocks the
  // handler's worker thread. Throws Error when the body cannot be read: the client went away or
  // was too slow, the body is malformed, or it is larger than the route's limit (then
  // `too_large()` is true).
  virtual std::size_t read(char* into, std::size_t n) = 0;
  virtual bool too_large() const = 0;
};

// The answer of a streaming route: a body in memory, or a file region sent with sendfile(2).
struct StreamResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // repeated names allowed
  std::string body;
  UniqueFd file;                   // valid: `file_length` bytes from `file_offset` are the body
  std::uint64_t file_offset = 0;
  std::uint64_t file_length = 0;
  bool head = false;  // HEAD: Content-Length of the body that a GET would get, and no body
};

// A route with streaming request bodies and responses (WebDAV). Matched on `prefix` itself and
// everything under `prefix` + "/". Behind the token and the Host/Origin checks like every route;
// the token may also come as the password of Basic auth (any user name), which is what WebDAV
// clients send.
struct StreamRoute {
  std::string prefix;  // e.g. "/dav"
  bool browser = false;  // as HttpRoute::browser
  std::uint64_t max_body_bytes = 8ull * 1024 * 1024;  // larger bodies: 413
  // Also answers `OPTIONS /` — without the token, as Windows' WebDAV client asks before it
  // authenticates (the handler sees the request and must reveal nothing but capabilities).
  bool answers_root_options = false;
  // Runs on a worker thread; may block (file I/O, reading the body).
  std::function<StreamResponse(const HttpRequest& request, BodyReader& body)> handler;
};

// Server-sent events to one client (a live view of the dashboard). Every member may be called
// from any thread.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Queues one event ("event: <event>\ndata: <data>\n\n"; a multi-line `data` is sent as
  // several data lines; `id`, when given, as "id: <id>"). False when the stream has ended: the
  // client went away, the server is stopping, or the client did not read and more than the
  // route's `buffer_bytes` waited unsent (then the stream is cut; a browser's EventSource
  // reconnects with Last-Event-ID). Nothing sent after that goes anywhere.
  virtual bool send(std::string_view event, std::string_view data, std::string_view id = {}) = 0;
  // Ends the stream once what was sent is written (a finished job's output): the response ends
  // properly, so a client like curl returns. A browser's EventSource would reconnect: the page
  // closes it on the event that says the end.
  virtual void end() = 0;
  virtual bool closed() const = 0;
};

// A route answered with a long-lived text/event-stream (GET only; comments keep it alive every
// `sse_keepalive`). Behind the token, or the cookie for a `browser` route, like every route.
struct EventRoute {
  std::string prefix;  // matched as HttpRoute::prefix
  bool exact = false;
  bool browser = false;
  std::size_t buffer_bytes = 4 * 1024 * 1024;
  // Runs on a worker thread when a client opens the stream. A response with status 200 starts
  // the stream (its headers are added to the stream's; its body is ignored): the handler keeps
  // the sink and sends from any thread until send() returns false. Any other status is sent as
  // the answer instead (a 404 for an unknown instance), and the sink is closed.
  std::function<HttpResponse(const HttpRequest&, std::shared_ptr<EventSink>)> open;
};

// One WebSocket connection of a WebSocketRoute, for its handler. Every member may be called from
// any thread.
class WebSocketPeer {
 public:
  virtual ~WebSocketPeer() = default;
  // Queues one whole message. False when the connection has ended, or when more than the route's
  // buffer_bytes would wait unsent: then the connection is cut (a close 1008 when it can still be
  // written, else the socket is closed), so a slow browser cannot grow the server's memory.
  virtual bool send(std::string data, bool binary = true) = 0;
  // A normal close (1000) after what is queued; `reason` is cut to the 123 bytes a close frame holds.
  virtual void close(std::string_view reason = {}) = 0;
  virtual bool closed() const = 0;
};
// What a route does with one connection. Called on a worker thread, one call at a time, in order
// (never on the I/O thread: a call may block, but while it does no other call of this connection
// runs, and reading pauses once buffer_bytes of messages wait for it). A call that blocks should
// wait with a timeout and give up once the peer is closed(): on_close cannot run before it
// returns, and the server's shutdown waits for calls in progress.
class WebSocketHandler {
 public:
  virtual ~WebSocketHandler() = default;
  virtual void on_message(std::string data, bool binary) = 0;  // one whole message
  // Once, last: the client closed or went, the server stops, the connection was cut, or the
  // upgrade failed after `open` gave this handler.
  virtual void on_close() = 0;
};
struct WebSocketOpen {
  std::shared_ptr<WebSocketHandler> handler;  // null: refused with `refusal`
  HttpResponse refusal;                       // e.g. 404 for an instance with no desktop
  std::string subprotocol;  // chosen of those the client offered ("binary" for noVNC), or ""
};
// A route upgraded to a WebSocket (RFC 6455, no permessage-deflate). Behind the token, or the
// cookie for a `browser` route, and the Host/Origin checks like every route. Anything but a GET
// with `Upgrade: websocket` gets 426. The server pings after `sse_keepalive` without data from
// the client and closes the connection when nothing comes for another `sse_keepalive`; at
// shutdown every WebSocket is closed with 1001.
struct WebSocketRoute {
  std::string prefix;
  bool exact = false;
  bool browser = false;  // the dashboard's cookie counts, as for the other browser routes
  std::size_t max_message_bytes = 1024 * 1024;  // larger: closed with 1009
  std::size_t buffer_bytes = 8 * 1024 * 1024;   // unsent bytes per connection (see WebSocketPeer::send)
  std::size_t max_per_peer = 8;      // open connections of this route per peer (beyond: 429 before the upgrade)
  std::size_t max_connections = 64;  // of this route in all (beyond: 503)
  // Runs on a worker when a client asks to upgrade, after the token or cookie, Host and Origin
  // checks. A cookie-authenticated upgrade must carry this server's own Origin (a browser always
  // sends one): cross-site WebSocket hijacking is refused with 403 before `open` runs. The peer
  // may be kept and sent to from any thread; what is sent before the upgrade completes waits.
  std::function<WebSocketOpen(const HttpRequest&, std::shared_ptr<WebSocketPeer>)> open;
};

// What the HTTP server holds now, for the dashboard's server view. Written by the transport
// (about once a second and when sessions come and go), read from any thread.
struct HttpStatus {
  struct PeerUse {
    std::string peer;  // "uid 1000", "192.0.2.7"
    std::size_t connections = 0;
    std::size_t sessions = 0;
    std::size_t requests = 0;  // running or queued
  };
  std::string url;  // what on_listening was given
  std::size_t connections = 0;
  std::size_t sessions = 0;
  std::size_t requests = 0;       // running or queued
  // 2026-07-28 requests being served, each by a session of its own that ends with its response
  // (subscriptions/listen streams included); not counted in `sessions`.
  std::size_t stateless_requests = 0;
  std::size_t event_streams = 0;  // EventRoute streams open
  std::size_t websockets = 0;     // WebSocketRoute connections open
  std::size_t bytes_held = 0;     // held for clients (HttpOptions::max_buffer_bytes)
  std::size_t browser_sessions = 0;  // logged-in browsers (HttpOptions::Login)
  std::vector<PeerUse> peers;
  // Each cap with its config key: "server.max_connections" → {in use, limit}.
  std::map<std::string, std::pair<std::size_t, std::size_t>> caps;
};
class HttpStatusBoard {
 public:
  HttpStatus get() const {
    std::lock_guard lock(mutex_);
    return status_;
  }
  void set(HttpStatus status) {
    std::lock_guard lock(mutex_);
    status_ = std::move(status);
  }

 private:
  mutable std::mutex mutex_;
  HttpStatus status_;
};

struct HttpOptions {
  enum class Protocol { streamable, legacy_sse };
  // streamable: `path` speaks streamable HTTP, and the legacy transport is also offered at
  // /sse + /messages/. legacy_sse: `path` is the legacy SSE endpoint (as the original
  // `--transport sse`), POSTs go to /messages/.
  Protocol protocol = Protocol::streamable;
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;  // 0: any free port (the chosen one is reported to on_listening)
  std::string uds;            // when set: listen on this Unix socket (mode 0600) instead
  std::string path = "/mcp";

  std::string token;  // bearer token; empty: no authentication (the caller decided to allow it)
  // Host header values accepted besides localhost, 127.0.0.1, [::1] and the bind address (any
  // port). "*" accepts any Host. Not checked on a Unix socket.
  std::vector<std::string> allowed_hosts;
  // Origin values accepted besides http(s)://<an accepted host>[:port]. "*" accepts any.
  std::vector<std::string> allowed_origins;

  std::chrono::milliseconds session_idle_timeout{std::chrono::seconds(300)};
  std::size_t max_sessions = 256;
  std::size_t max_body_bytes = 8 * 1024 * 1024;  // larger bodies: 413
  std::size_t max_header_bytes = 16 * 1024;      // larger header blocks: 431
  // A request's header block must arrive within header_timeout of the moment the server starts
  // waiting for it (a new connection, or the end of the previous exchange on a kept-alive one);
  // its body, and every stalled write, within read_timeout.
  std::chrono::milliseconds header_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds read_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(5)};

  // Who a peer is: the remote address for TCP, except on loopback, where it is the uid that owns
  // the client's socket (sock_diag); for a Unix socket, the client's uid (SO_PEERCRED).
  // Connections at once, and per peer (clamped below the open-file limit). At a cap, the
  // connection that has waited longest for its request header (of that peer, for the per-peer
  // cap) is closed to let the new one in; when none is waiting, the new one gets 503.
  std::size_t max_connections = 1024;
  std::size_t max_connections_per_peer = 256;
  std::size_t max_sessions_per_peer = 32;     // of max_sessions
  // Requests running or queued (ping is never refused): per session and per peer.
  std::size_t max_requests_per_session = 16;
  std::size_t max_requests_per_peer = 128;

  // Unsent bytes one SSE stream may hold for a slow reader. Above it, notifications to that
  // stream are dropped (responses never are).
  std::size_t sse_buffer_bytes = 8 * 1024 * 1024;
  // Bytes held for clients (unsent, or kept for a resume with Last-Event-ID) per session and in
  // the whole server. Over a budget: what was kept for a resume goes first, notifications are
  // dropped, a session that already holds unread bytes gets its new requests refused and further
  // responses replaced by an error saying so (a session with nothing unread always gets its
  // response, however big).
  std::size_t max_session_buffer_bytes = 32 * 1024 * 1024;
  std::size_t max_buffer_bytes = 256 * 1024 * 1024;
  std::chrono::milliseconds sse_keepalive{std::chrono::seconds(15)};
  std::chrono::milliseconds sse_retry{std::chrono::seconds(1)};  // `retry:` in priming events
  std::size_t worker_threads = 512;

  std::vector<HttpRoute> routes;
  std::vector<StreamRoute> stream_routes;
  std::vector<EventRoute> event_routes;
  std::vector<WebSocketRoute> websocket_routes;

  // The dashboard's login, for `browser` routes (off when `enabled` is false: they then take the
  // token only). GET /login?code=<code> with the one-time `code` (good once, for
  // `code_lifetime`), or POST /login with the form field `token`, opens a browser session: an
  // HttpOnly, SameSite=Strict cookie (Secure when served over TLS), then a 303 to `landing`.
  // GET /login otherwise shows the form (401); POST /logout ends the session. A request that a
  // cookie authenticates and that may change something (any method but GET, HEAD and OPTIONS)
  // must come from the page itself: its Origin (or, without one, Sec-Fetch-Site: same-origin)
  // must name this server, else 403. Sessions are kept in memory (a restart logs browsers out).
  struct Login {
    bool enabled = false;
    std::string code;
    std::chrono::seconds code_lifetime{std::chrono::hours(24)};
    std::string landing = "/";
    std::chrono::seconds session_lifetime{std::chrono::hours(12)};  // since the last request
    std::size_t max_sessions = 256;  // beyond: the least recently used one ends
  } login;
  // Filled by the server while it runs (null: not kept).
  std::shared_ptr<HttpStatusBoard> status_board;
  // Called once the listener is ready, with the URL clients use (http://host:port/path, or
  // unix:<socket>:<path> for a Unix socket).
  std::function<void(const std::string& url)> on_listening;
};

// True for 127.0.0.1 (any 127/8), ::1 and localhost.
bool is_loopback_host(const std::string& host);

// Serves until SIGTERM/SIGINT: then stops accepting, lets requests in flight finish for
// `shutdown_grace` (running jobs are not touched), closes every stream and session, and returns
// 0. Throws Error when the listener cannot be set up (address in use, socket path taken, …).
int serve_http(mcp::Server& server, const HttpOptions& options);

namespace testing {
// Feeds `bytes` to one connection of a fresh server (no listener, no signals) as a client would
// and returns everything the server wrote until it closed the connection or `budget` passed.
// For the fuzzer and unit tests.
std::string exchange(mcp::Server& server, const HttpOptions& options, const std::string& bytes,
                     std::chrono::milliseconds budget = std::chrono::milliseconds(2000));
}  // namespace testing

}  // namespace nshpc::transport
