// Internals of the HTTP transports shared by http.cpp (Beast connections) and http_session.cpp
// (sessions and their SSE streams). Everything here lives on the one I/O thread, except the
// mcp::Session's send callback, which posts to it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "mcp/server.hpp"
#include "transport/http.hpp"
#include "transport/workers.hpp"

namespace nshpc::transport::http_detail {

namespace asio = boost::asio;
using mcp::json;
using Clock = std::chrono::steady_clock;

// Bytes the server holds for clients: unsent, or already written and kept for a resume with
// Last-Event-ID. One account per session, whose parent is the server's. I/O thread only.
struct ByteAccount {
  std::size_t held = 0;    // unsent + kept for replay
  std::size_t unsent = 0;  // not yet written to the client
  std::size_t freed = 0;   // released since the last malloc_trim (server account only)
  // A response had to be dropped for being over a budget: new requests are refused until the
  // client has read its backlog down to half the budget (session accounts).
  bool dropping = false;
  std::shared_ptr<ByteAccount> parent;

  void hold(std::size_t n);            // new unsent bytes
  void written(std::size_t n);         // unsent → kept for replay
  void release(std::size_t held_n, std::size_t unsent_n);  // gone (unsent_n of them unsent)
};

// Holds `bytes` on an account for as long as it lives (a response body being written).
class HeldBytes {
 public:
  HeldBytes(std::shared_ptr<ByteAccount> account, std::size_t bytes);
  ~HeldBytes();
  HeldBytes(const HeldBytes&) = delete;
  HeldBytes& operator=(const HeldBytes&) = delete;

 private:
  std::shared_ptr<ByteAccount> account_;
  std::size_t bytes_;
};

// A message the mcp::Session sent, serialised on the thread that sent it (never on the I/O
// thread) and classified for routing.
struct Outbound {
  enum class Kind { notification, response, request };
  Kind kind = Kind::notification;
  std::string text;     // the JSON
  json related;         // id of the client request it belongs to (null: none)
  std::string related_key;  // related.dump()

  static Outbound of(const json& message, const json& related);
};

// One SSE event: "id: …\nevent: message\ndata: " + the JSON + "\n\n" (or a raw block). Kept as
// parts so that the JSON is never copied.
struct Event {
  std::uint64_t seq = 0;
  std::string head;
  std::string data;
  bool framed = true;  // followed by a blank line
  std::size_t bytes = 0;  // on the wire (counted when appended)
};

// One SSE stream of a session: the stream of a POST request (its progress, logs, requests to
// the client and finally its response), or the session's standalone stream (GET; for the legacy
// transport, every message). Events are kept after they are written so that a client that lost
// the connection can resume with Last-Event-ID; what is kept counts on the session's account.
class Stream {
 public:
  Stream(asio::io_context& io, std::uint64_t id, bool standalone, std::size_t buffer_bytes,
         std::shared_ptr<ByteAccount> account);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Appends a message. A notification is dropped (and counted) when the unsent backlog is over
  // the buffer limit; a response or a request to the client never is. Returns false if dropped.
  bool push(std::string json_text, Outbound::Kind kind, bool legacy_format);
  // Adds a block that carries no message (e.g. the legacy endpoint event).
  void push_raw(std::string text);
  // Counts a notification the session dropped for this stream.
  void count_dropped() { ++dropped_; }

  // The events with seq > after, up to about `max_bytes` (at least one), as buffers into the
  // kept events: valid until delivered() is called past them or the stream is destroyed. Sets
  // `last` to the last seq taken (unchanged when nothing is pending).
  std::vector<asio::const_buffer> take(std::uint64_t after, std::uint64_t& last,
                                       std::size_t max_bytes = 1024 * 1024) const;
  // The writer wrote everything up to `seq`: the backlog shrinks and old events may go.
  void delivered(std::uint64_t seq);
  bool has_after(std::uint64_t seq) const { return !events_.empty() && events_.back().seq > seq; }
  // True when `seq` is older than what is still kept (a resume from it would miss events).
  bool evicted_before(std::uint64_t seq) const { return seq + 1 < first_kept_; }
  // Forgets every event the client already has; returns the bytes freed.
  std::size_t drop_replay();
  // Forgets everything (nobody can read it any more); returns the bytes freed.
  std::size_t discard();

  // POST stream: the response is in; the writer ends after it.
  void finish();
  // The response, moved out, for a request answered with plain JSON (the stream is then empty).
  std::string release_response();
  // Session over or stream abandoned: the writer ends now (a write in progress is cut off).
  void close();
  void wake() { wake_.cancel(); }

  std::uint64_t id() const { return id_; }
  bool standalone() const { return standalone_; }
  bool finished() const { return finished_; }
  bool closed() const { return closed_; }
  std::uint64_t last_seq() const { return next_seq_ - 1; }
  std::uint64_t delivered_seq() const { return delivered_; }
  std::size_t dropped() const { return dropped_; }
  std::size_t unsent_bytes() const { return unsent_bytes_; }
  std::size_t kept_bytes() const { return kept_bytes_; }
  asio::steady_timer& timer() { return wake_; }

  // A write of the events after `after` (as taken) is in progress: they stay until it ends,
  // even those already delivered once (a resume re-sends them).
  void begin_write(std::uint64_t after) { writing_after_ = after; }
  void end_write() { writing_after_.reset(); }
  bool writing() const { return writing_after_.has_value(); }

  bool attached = false;  // a connection is writing this stream
  // Its request was cancelled: nothing more comes, and the stream goes once no connection
  // writes it (until then a client still reading it sees it open, as before the cancellation).
  bool abandoned = false;
  std::function<void()> cut_writer;  // set while attached: closes that connection
  std::string event_prefix;  // "<session-stream-id>_" part of event ids

 private:
  void append(Event event);
  void pop_front();
  bool may_drop_front() const;  // delivered, and not part of a write in progress
  void trim();

  std::uint64_t id_;
  bool standalone_;
  std::size_t buffer_bytes_;
  std::shared_ptr<ByteAccount> account_;
  std::deque<Event> events_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t first_kept_ = 1;
  std::uint64_t delivered_ = 0;
  std::size_t kept_bytes_ = 0;
  std::size_t unsent_bytes_ = 0;
  std::size_t dropped_ = 0;
  bool finished_ = false;
  bool closed_ = false;
  std::optional<std::uint64_t> writing_after_;
  asio::steady_timer wake_;
};

// Who is on the other end of a connection, for the per-peer caps.
struct Peer {
  std::string key;    // "uid:1000", "ip:192.0.2.7"
  std::string shown;  // for messages: "uid 1000", "192.0.2.7"
};

// Why a request is not taken (see Hub::admit); the message names the cap and its config key.
struct Refusal {
  int http_status = 429;
  std::string message;
  json data;  // {"limit": "server.<key>", "value": N}
};

class Hub;

// The dashboard's browser sessions (HttpOptions::Login): the one-time code, the sessions its
// cookie names, and the failed attempts per peer. I/O thread only; `now` is passed in so that
// expiry can be tested without waiting.
class BrowserLogins {
 public:
  static constexpr std::string_view kCookie = "nshpc_session";
  // Failed codes or tokens a peer may send in kFailureWindow before it must wait.
  static constexpr std::size_t kMaxFailures = 5;
  static constexpr auto kFailureWindow = std::chrono::seconds(60);

  BrowserLogins(const HttpOptions::Login& login, Clock::time_point now);

  enum class Code { good, wrong, used, expired };
  // Checks the one-time code (in constant time); a good one is used up.
  Code redeem(std::string_view code, Clock::time_point now);
  // A new session for `peer`: its cookie value (256 random bits, hex). The least recently used
  // session ends when max_sessions are open.
  std::string open(const Peer& peer, Clock::time_point now);
  // Whether `cookie` names a live session (compared in constant time); a live one is touched.
  bool valid(std::string_view cookie, Clock::time_point now);
  void close(std::string_view cookie);
  std::size_t count() const { return sessions_.size(); }

  // How long `peer_key` must wait before its next attempt (nullopt: it may try now).
  std::optional<std::chrono::seconds> must_wait(const std::string& peer_key, Clock::time_point now);
  void failed(const std::string& peer_key, Clock::time_point now);
  // Forgets expired sessions and old failures (the sweeper).
  void expire(Clock::time_point now);

 private:
  struct Entry {
    std::string secret;
    Clock::time_point last_used;
  };
  const HttpOptions::Login& login_;
  Clock::time_point code_expires_;
  bool code_used_ = false;
  std::vector<Entry> sessions_;
  std::map<std::string, std::deque<Clock::time_point>> failures_;
};

// The sink of one EventRoute stream, between the handler (any thread, send) and the connection
// writing it (I/O thread, take/written). The queue is bounded by the route's buffer_bytes: over
// it the stream is cut.
class EventChannel final : public EventSink {
 public:
  explicit EventChannel(std::size_t buffer_bytes) : buffer_bytes_(buffer_bytes) {}
  bool send(std::string_view event, std::string_view data, std::string_view id = {}) override;
  void end() override;
  bool closed() const override;
  // The handler ended it (end()): the writer ends the response properly after the queue.
  bool ended() const;

  // Called (under the channel's lock, from the sending thread) when events wait or the stream
  // was cut: it must only post to the I/O thread. Dropped when the channel closes.
  void on_ready(std::function<void()> wake);
  // Everything queued (it counts as unsent until written() says so).
  std::string take();
  void written(std::size_t bytes);
  bool cut() const;
  // The stream ended (client gone, server stopping, cut): send() returns false from now on.
  void close();

 private:
  mutable std::mutex mutex_;
  std::string queued_;
  std::size_t unsent_ = 0;  // queued + being written
  std::size_t buffer_bytes_;
  bool closed_ = false;
  bool cut_ = false;
  bool ended_ = false;
  bool wake_pending_ = false;
  std::function<void()> wake_;
};

// The peer of one WebSocket connection, between the handler (any thread: send, close) and the
// connection writing it (I/O thread). The queue is bounded by the route's buffer_bytes: over it
// the connection is cut.
class WebSocketChannel final : public WebSocketPeer {
 public:
  struct Message {
    std::string data;
    bool binary = true;
  };
  // What the writer should do once the queue is empty (or at once, for a cut).
  struct Ending {
    std::uint16_t code = 1000;  // a close frame's status code
    std::string reason;
  };
  explicit WebSocketChannel(std::size_t buffer_bytes) : buffer_bytes_(buffer_bytes) {}
  bool send(std::string data, bool binary = true) override;
  void close(std::string_view reason = {}) override;
  bool closed() const override;

  // Called (under the channel's lock, from the calling thread) when messages wait or an ending
  // was asked for: it must only post to the I/O thread. Dropped when the connection ends.
  void on_ready(std::function<void()> wake);
  // The next message to write (it counts as unsent until written() says so).
  std::optional<Message> next();
  void written(std::size_t bytes);
  // The server ends the connection with `code` (1001 at shutdown, 1011 when the handler failed),
  // after what is queued; the first ending asked for wins.
  void end(std::uint16_t code, std::string_view reason);
  // An ending was asked for (by close(), end() or a cut): what to send.
  std::optional<Ending> ending() const;
  bool cut() const;
  // The connection is over: send() returns false from now on and the queue is dropped.
  void finish();

 private:
  mutable std::mutex mutex_;
  std::deque<Message> queued_;
  std::size_t unsent_ = 0;  // queued + being written
  std::size_t buffer_bytes_;
  bool finished_ = false;
  bool cut_ = false;
  bool wake_pending_ = false;
  std::optional<Ending> ending_;
  std::function<void()> wake_;
};

// The calls to one WebSocket connection's handler, run one at a time and in order on the worker
// pool (a call may block; the I/O thread never waits for one). The reader pauses while more than
// `limit` bytes of messages wait for the handler.
class WebSocketCalls : public std::enable_shared_from_this<WebSocketCalls> {
 public:
  WebSocketCalls(Workers& workers, std::shared_ptr<WebSocketHandler> handler, std::shared_ptr<WebSocketChannel> channel,
                 std::size_t limit)
      : workers_(workers), handler_(std::move(handler)), channel_(std::move(channel)), limit_(limit) {}
  // I/O thread.
  void message(std::string data, bool binary);
  void closed();  // the last call (on_close); nothing is queued after it
  bool full() const;
  // Called (from a worker, must only post) when the waiting bytes drop to the limit again.
  void on_room(std::function<void()> wake);

 private:
  struct Call {
    std::string data;
    bool binary = true;
    bool close = false;
  };
  void push(Call call);
  void drain();

  Workers& workers_;
  std::shared_ptr<WebSocketHandler> handler_;
  std::shared_ptr<WebSocketChannel> channel_;
  std::size_t limit_;
  mutable std::mutex mutex_;
  std::deque<Call> queue_;
  std::size_t bytes_ = 0;
  bool running_ = false;
  bool closed_ = false;
  std::function<void()> room_;
};

// One MCP session over HTTP: a 2025-era session (streamable HTTP, or `legacy`: the 2024-11-05
// HTTP+SSE transport), or the `ephemeral` session that serves one 2026-07-28 request by itself
// and ends with its response (no session id goes to the client, nothing is kept for a resume).
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(Hub& hub, std::string id, bool legacy, Peer peer, bool ephemeral = false);
  ~HttpSession();

  void start();  // creates the mcp::Session (after make_shared, for the weak callback)
  const std::string& id() const { return id_; }
  bool legacy() const { return legacy_; }
  bool ephemeral() const { return ephemeral_; }
  // Ephemeral: its request is a subscriptions/listen (a stream that stays open until the client
  // closes it or the server stops).
  bool listening = false;
  bool closed() const { return closed_; }
  const Peer& peer() const { return peer_; }
  const ByteAccount& account() const { return *account_; }
  const std::shared_ptr<ByteAccount>& account_ptr() const { return account_; }

  // A POST request with `request_id`: its stream, registered before the message goes in.
  std::shared_ptr<Stream> open_request_stream(const json& request_id);
  // Forgets a request stream that was answered as plain JSON, or abandoned.
  void drop_request_stream(const std::shared_ptr<Stream>& stream);
  // The request (id dumped) was cancelled and gets no response: its stream is abandoned.
  void unanswered(const std::string& request_key);
  std::shared_ptr<Stream> standalone();
  // The stream a Last-Event-ID names, if still kept.
  std::shared_ptr<Stream> find_stream(std::uint64_t id) const;
  void receive(json message);
  std::string protocol_version() const;
  std::size_t in_flight() const;

  // Routes a message the mcp::Session sent (on the I/O thread), within the byte budgets.
  void route(Outbound message);
  // Frees what this session keeps for resumption until it holds at most `target` bytes: every
  // event already written first, then the oldest finished streams nobody is reading. Returns
  // the bytes freed.
  std::size_t shed(std::size_t target);

  void touch() { last_active_ = Clock::now(); }
  Clock::time_point last_active() const { return last_active_; }
  int connections = 0;  // requests or streams of this session being served now

  // Answers every request still running with a JSON-RPC error saying `why` (shutdown).
  void answer_unfinished(const std::string& why);

  // Closes every stream and hands the mcp::Session to a worker thread to be cancelled and
  // destroyed (that may wait for handlers).
  void close();
  // Closes the mcp::Session on a worker but keeps the streams: what it sends as it closes (a
  // subscriptions/listen's final result) still reaches the client. False when no worker took it.
  bool end_requests();

 private:
  void retire(std::uint64_t stream_id);  // keeps a few finished streams for resumption
  // A response that would take the session or the server over its budget while the session
  // already holds unread bytes: the error that replaces it, else nullopt.
  std::optional<Refusal> over_budget(const Outbound& response);

  Hub& hub_;
  std::string id_;
  bool legacy_;
  bool ephemeral_;
  Peer peer_;
  std::shared_ptr<ByteAccount> account_;
  bool closed_ = false;
  std::shared_ptr<mcp::Session> mcp_;  // shared only to be closed on a worker
  std::map<std::string, std::shared_ptr<Stream>> by_request_;  // request id (dumped) → stream
  std::map<std::uint64_t, std::shared_ptr<Stream>> streams_;   // every stream still kept
  std::deque<std::uint64_t> retired_;                          // finished streams, oldest first
  std::shared_ptr<Stream> standalone_;
  std::uint64_t next_stream_ = 1;
  Clock::time_point last_active_ = Clock::now();
};

// What all connections share: the MCP server, the options, the session table, the workers.
class Hub {
 public:
  Hub(mcp::Server& server, const HttpOptions& options, asio::io_context& io);
  ~Hub();

  mcp::Server& server;
  const HttpOptions& options;
  asio::io_context& io;
  Workers workers;
  bool draining = false;  // shutting down: no new sessions

  // nullptr (and why in `refusal`) when a cap is reached.
  std::shared_ptr<HttpSession> create_session(bool legacy, const Peer& peer, Refusal& refusal);
  // Whether `session` may start the request `method` now: the in-flight caps of the session and
  // its peer, and the byte budgets (a session whose client does not read its responses gets no
  // new work). ping is always taken.
  std::optional<Refusal> admit(HttpSession& session, std::string_view method);
  std::shared_ptr<HttpSession> find(std::string_view id) const;
  void remove(const std::string& id);
  std::size_t session_count() const { return sessions_.size(); }
  std::size_t total_in_flight() const;

  // The session of one 2026-07-28 request (see HttpSession): not a session to the caps
  // (max_sessions), but its request counts in flight for max_requests_per_peer. It stays until
  // end_ephemeral, which the connection serving it calls once the response is written or the
  // client went away (closing it cancels what still runs).
  std::shared_ptr<HttpSession> open_ephemeral(const Peer& peer);
  void end_ephemeral(const std::string& id);
  std::size_t ephemeral_count() const { return ephemeral_.size(); }
  // Shutdown: every subscriptions/listen stream gets its final message (`why`) and its request is
  // cancelled, so that the drain does not wait for streams that only end when the client goes.
  void end_listens(const std::string& why);
  int post_writers = 0;  // POST streams being written now (shutdown waits for them)

  // Bytes held for all clients.
  const std::shared_ptr<ByteAccount>& account() const { return account_; }
  // Frees kept events across sessions until the server holds at most `target` bytes.
  void shed(std::size_t target);
  // Returns freed memory to the system (malloc_trim on a worker) once enough was released.
  void trim_memory(bool now = false);
  void close_all();
  void answer_unfinished(const std::string& why);

  // Starts the idle sweeper (every second).
  void start_sweeper();
  void stop_sweeper();

  // The dashboard's browser sessions (used when options.login.enabled).
  BrowserLogins logins;

  // Open EventRoute streams: closed by close_all (shutdown does not wait for them).
  void add_channel(const std::shared_ptr<EventChannel>& channel);
  void remove_channel(const EventChannel* channel);
  std::size_t channel_count() const { return channels_.size(); }

  // WebSocket connections per route, in all and per peer (WebSocketRoute's caps): a slot is
  // taken before the route's `open` runs and given back when the connection ends.
  std::optional<Refusal> take_websocket(const WebSocketRoute& route, const Peer& peer);
  void release_websocket(const WebSocketRoute& route, const Peer& peer);
  std::size_t websocket_count() const { return websocket_total_; }

  // options.status_board: refreshed by the sweeper and when sessions come and go. The listener
  // adds its connections through `connection_status`.
  std::string url;
  std::function<void(HttpStatus&, std::map<std::string, HttpStatus::PeerUse>&)> connection_status;
  void publish_status();

 private:
  void sweep();

  std::map<std::string, std::shared_ptr<HttpSession>, std::less<>> sessions_;
  std::map<std::string, std::size_t, std::less<>> sessions_per_peer_;
  std::map<std::string, std::shared_ptr<HttpSession>, std::less<>> ephemeral_;  // by their (log-only) id
  std::shared_ptr<ByteAccount> account_ = std::make_shared<ByteAccount>();
  std::shared_ptr<std::atomic<bool>> trimming_ = std::make_shared<std::atomic<bool>>(false);
  Clock::time_point last_trim_{};
  asio::steady_timer sweeper_;
  bool sweeping_ = false;
  std::map<const EventChannel*, std::weak_ptr<EventChannel>> channels_;
  struct WebSocketUse {
    std::size_t open = 0;
    std::map<std::string, std::size_t, std::less<>> per_peer;
  };
  std::map<const WebSocketRoute*, WebSocketUse> websockets_;
  std::size_t websocket_total_ = 0;
};

// Compares in time that depends only on `expected`'s length.
bool same_secret(std::string_view given, std::string_view expected);
// "host" of a Host header value ("[::1]:8000" → "::1", "a.b:80" → "a.b"), lower-case.
std::string host_of(std::string_view host_header);

}  // namespace nshpc::transport::http_detail
