// Internals of the HTTP transports shared by http.cpp (Beast connections) and http_session.cpp
// (sessions and their SSE streams). Everything here lives on the one I/O thread, except the
// mcp::Session's send callback, which posts to it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "mcp/server.hpp"
#include "transport/http.hpp"
#include "transport/workers.hpp"

namespace nshpc::transport::http_detail {

namespace asio = boost::asio;
using mcp::json;
using Clock = std::chrono::steady_clock;

// One SSE event, already formatted ("id: …\nevent: message\ndata: …\n\n").
struct Event {
  std::uint64_t seq = 0;
  std::string text;
};

// One SSE stream of a session: the stream of a POST request (its progress, logs, requests to
// the client and finally its response), or the session's standalone stream (GET; for the legacy
// transport, every message). Events are kept after they are written so that a client that lost
// the connection can resume with Last-Event-ID; the memory is bounded by sse_buffer_bytes.
class Stream {
 public:
  Stream(asio::io_context& io, std::uint64_t id, bool standalone, std::size_t buffer_bytes);

  // Appends a message. A notification is dropped (and counted) when the unsent backlog is over
  // the buffer limit; a response or a request to the client never is. Returns false if dropped.
  bool push(const json& message, bool legacy_format);
  // Adds a comment/priming block that is not kept for replay (e.g. the legacy endpoint event).
  void push_raw(std::string text);

  // Events with seq > after, concatenated up to about `max_bytes`; sets `last` to the last seq
  // taken (unchanged when nothing is pending).
  std::string take(std::uint64_t after, std::uint64_t& last, std::size_t max_bytes = 256 * 1024) const;
  // The writer wrote everything up to `seq`: the backlog shrinks and old events may go.
  void delivered(std::uint64_t seq);
  bool has_after(std::uint64_t seq) const { return !events_.empty() && events_.back().seq > seq; }
  // True when `seq` is older than what is still kept (a resume from it would miss events).
  bool evicted_before(std::uint64_t seq) const { return seq + 1 < first_kept_; }

  // POST stream: the response (`response_json`, as sent) is in; the writer ends after it.
  void finish(std::string response_json);
  const std::string& response_json() const { return response_json_; }
  void close();   // session over or stream abandoned: the writer ends now
  void wake() { wake_.cancel(); }

  std::uint64_t id() const { return id_; }
  bool standalone() const { return standalone_; }
  bool finished() const { return finished_; }
  bool closed() const { return closed_; }
  std::uint64_t last_seq() const { return next_seq_ - 1; }
  std::uint64_t delivered_seq() const { return delivered_; }
  std::size_t dropped() const { return dropped_; }
  std::size_t unsent_bytes() const { return unsent_bytes_; }
  asio::steady_timer& timer() { return wake_; }

  bool attached = false;  // a connection is writing this stream
  std::string event_prefix;  // "<session-stream-id>_" part of event ids

 private:
  void trim();

  std::uint64_t id_;
  bool standalone_;
  std::size_t buffer_bytes_;
  std::deque<Event> events_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t first_kept_ = 1;
  std::uint64_t delivered_ = 0;
  std::size_t kept_bytes_ = 0;
  std::size_t unsent_bytes_ = 0;
  std::size_t dropped_ = 0;
  bool finished_ = false;
  bool closed_ = false;
  std::string response_json_;
  asio::steady_timer wake_;
};

class Hub;

// One MCP session over HTTP.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(Hub& hub, std::string id, bool legacy);
  ~HttpSession();

  void start();  // creates the mcp::Session (after make_shared, for the weak callback)
  const std::string& id() const { return id_; }
  bool legacy() const { return legacy_; }
  bool closed() const { return closed_; }

  // A POST request with `request_id`: its stream, registered before the message goes in.
  std::shared_ptr<Stream> open_request_stream(const json& request_id);
  // Forgets a request stream that was answered as plain JSON.
  void drop_request_stream(const std::shared_ptr<Stream>& stream);
  std::shared_ptr<Stream> standalone();
  // The stream a Last-Event-ID names, if still kept.
  std::shared_ptr<Stream> find_stream(std::uint64_t id) const;
  void receive(json message);
  std::string protocol_version() const;
  std::size_t in_flight() const;

  // Routes a message the mcp::Session sent (on the I/O thread).
  void route(const json& message, const json& related);

  void touch() { last_active_ = Clock::now(); }
  Clock::time_point last_active() const { return last_active_; }
  int connections = 0;  // requests or streams of this session being served now

  // Answers every request still running with a JSON-RPC error saying `why` (shutdown).
  void answer_unfinished(const std::string& why);

  // Closes every stream and hands the mcp::Session to a worker thread to be cancelled and
  // destroyed (that may wait for handlers).
  void close();

 private:
  void retire(std::uint64_t stream_id);  // keeps a few finished streams for resumption

  Hub& hub_;
  std::string id_;
  bool legacy_;
  bool closed_ = false;
  std::unique_ptr<mcp::Session> mcp_;
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

  // nullptr when the cap is reached.
  std::shared_ptr<HttpSession> create_session(bool legacy);
  std::shared_ptr<HttpSession> find(std::string_view id) const;
  void remove(const std::string& id);
  std::size_t session_count() const { return sessions_.size(); }
  std::size_t total_in_flight() const;
  int post_writers = 0;  // POST streams being written now (shutdown waits for them)
  void close_all();
  void answer_unfinished(const std::string& why);

  // Starts the idle sweeper (every second).
  void start_sweeper();
  void stop_sweeper();

 private:
  void sweep();

  std::map<std::string, std::shared_ptr<HttpSession>, std::less<>> sessions_;
  asio::steady_timer sweeper_;
  bool sweeping_ = false;
};

// 128 random bits as 32 lower-case hex characters (getrandom). Throws when the kernel's random
// source fails.
std::string random_hex(std::size_t bytes = 16);
// Compares in time that depends only on `expected`'s length.
bool same_secret(std::string_view given, std::string_view expected);
// "host" of a Host header value ("[::1]:8000" → "::1", "a.b:80" → "a.b"), lower-case.
std::string host_of(std::string_view host_header);

}  // namespace nshpc::transport::http_detail
