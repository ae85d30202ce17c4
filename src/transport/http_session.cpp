// Sessions of the HTTP transports and their SSE streams (see http_internal.hpp).
#include <malloc.h>

#include <algorithm>
#include <cerrno>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "transport/http_internal.hpp"

namespace nshpc::transport::http_detail {

namespace {

// Finished streams whose last events never reached the client, kept for resumption.
constexpr std::size_t kKeptFinishedStreams = 32;
// Memory is handed back to the system (malloc_trim) once this much was released, at most once
// per kTrimInterval (a session closing trims at once after kTrimNowBytes).
constexpr std::size_t kTrimAfterBytes = 16 * 1024 * 1024;
constexpr std::size_t kTrimNowBytes = 1024 * 1024;
constexpr auto kTrimInterval = std::chrono::seconds(1);

std::string mib(std::size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Byte accounts

void ByteAccount::hold(std::size_t n) {
  held += n;
  unsent += n;
  if (parent) parent->hold(n);
}

void ByteAccount::written(std::size_t n) {
  unsent -= std::min(unsent, n);
  if (parent) parent->written(n);
}

void ByteAccount::release(std::size_t held_n, std::size_t unsent_n) {
  held -= std::min(held, held_n);
  unsent -= std::min(unsent, unsent_n);
  freed += held_n;
  if (parent) parent->release(held_n, unsent_n);
}

HeldBytes::HeldBytes(std::shared_ptr<ByteAccount> account, std::size_t bytes)
    : account_(std::move(account)), bytes_(bytes) {
  if (account_) account_->hold(bytes_);
}

HeldBytes::~HeldBytes() {
  if (account_) account_->release(bytes_, bytes_);
}

Outbound Outbound::of(const json& message, const json& related) {
  Outbound out;
  out.related = related;
  if (!related.is_null()) out.related_key = related.dump();
  const bool has_method = message.is_object() && message.contains("method");
  if (has_method)
    out.kind = message.contains("id") ? Kind::request : Kind::notification;
  else
    out.kind = message.is_object() && message.contains("id") && !related.is_null() && message["id"] == related
                   ? Kind::response
                   : Kind::request;  // an error about unreadable input: routed like a request
  out.text = message.dump(-1, ' ', false, json::error_handler_t::replace);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stream

Stream::Stream(asio::io_context& io, std::uint64_t id, bool standalone, std::size_t buffer_bytes,
               std::shared_ptr<ByteAccount> account)
    : id_(id), standalone_(standalone), buffer_bytes_(buffer_bytes), account_(std::move(account)), wake_(io) {
  event_prefix = fmt::format("{}_", id);
}

Stream::~Stream() { discard(); }

void Stream::append(Event event) {
  event.bytes = event.head.size() + event.data.size() + (event.framed ? 2 : 0);
  const std::size_t size = event.bytes;
  kept_bytes_ += size;
  unsent_bytes_ += size;
  if (account_) account_->hold(size);
  events_.push_back(std::move(event));
}

void Stream::pop_front() {
  const Event& e = events_.front();
  const std::size_t size = e.bytes;
  const std::size_t unsent = e.seq > delivered_ ? size : 0;
  kept_bytes_ -= std::min(kept_bytes_, size);
  unsent_bytes_ -= std::min(unsent_bytes_, unsent);
  if (account_) account_->release(size, unsent);
  events_.pop_front();
  first_kept_ = events_.empty() ? next_seq_ : events_.front().seq;
}

bool Stream::push(std::string json_text, Outbound::Kind kind, bool legacy_format) {
  if (closed_) return false;
  if (kind == Outbound::Kind::notification && unsent_bytes_ > buffer_bytes_) {
    ++dropped_;
    if (dropped_ == 1 || dropped_ % 1000 == 0)
      log::warn("http: a client reads its SSE stream too slowly; {} notification(s) dropped so far "
                "(backlog {} bytes, limit {}: [server] sse_buffer_bytes)",
                dropped_, unsent_bytes_, buffer_bytes_);
    return false;
  }
  Event event;
  event.seq = next_seq_++;
  event.head = legacy_format ? std::string("event: message\ndata: ")
                             : fmt::format("id: {}{}\nevent: message\ndata: ", event_prefix, event.seq);
  event.data = std::move(json_text);
  append(std::move(event));
  trim();
  wake();
  return true;
}

void Stream::push_raw(std::string text) {
  if (closed_) return;
  Event event;
  event.seq = next_seq_++;
  event.head = std::move(text);
  event.framed = false;
  append(std::move(event));
  wake();
}

std::vector<asio::const_buffer> Stream::take(std::uint64_t after, std::uint64_t& last, std::size_t max_bytes) const {
  static constexpr char kBlankLine[] = "\n\n";
  std::vector<asio::const_buffer> out;
  if (events_.empty() || events_.back().seq <= after) return out;
  std::size_t index = after + 1 >= first_kept_ ? static_cast<std::size_t>(after + 1 - first_kept_) : 0;
  std::size_t taken = 0;
  for (; index < events_.size(); ++index) {
    const Event& e = events_[index];
    if (taken > 0 && taken + e.bytes > max_bytes) break;
    out.emplace_back(e.head.data(), e.head.size());
    if (!e.data.empty()) out.emplace_back(e.data.data(), e.data.size());
    if (e.framed) out.emplace_back(kBlankLine, 2);
    taken += e.bytes;
    last = e.seq;
  }
  return out;
}

void Stream::delivered(std::uint64_t seq) {
  if (seq <= delivered_) return;
  std::size_t written = 0;
  for (const Event& e : events_) {
    if (e.seq <= delivered_) continue;
    if (e.seq > seq) break;
    written += e.bytes;
  }
  unsent_bytes_ -= std::min(unsent_bytes_, written);
  if (account_) account_->written(written);
  delivered_ = seq;
  trim();
}

bool Stream::may_drop_front() const {
  if (events_.empty()) return false;
  const std::uint64_t seq = events_.front().seq;
  return seq <= delivered_ && (!writing_after_ || seq <= *writing_after_);
}

void Stream::trim() {
  // Only events the client already has may go; what is unsent stays (bounded by push).
  while (kept_bytes_ > buffer_bytes_ && may_drop_front()) pop_front();
}

std::size_t Stream::drop_replay() {
  const std::size_t before = kept_bytes_;
  while (may_drop_front()) pop_front();
  return before - kept_bytes_;
}

std::size_t Stream::discard() {
  if (writing_after_) return 0;  // never under a write (callers skip attached streams)
  const std::size_t before = kept_bytes_;
  while (!events_.empty()) pop_front();
  return before;
}

void Stream::finish() {
  finished_ = true;
  wake();
}

std::string Stream::release_response() {
  std::string text;
  if (!events_.empty()) text = std::move(events_.back().data);
  discard();
  return text;
}

void Stream::close() {
  closed_ = true;
  // A write stuck on a client that does not read would keep the events for read_timeout.
  if (writing() && cut_writer) cut_writer();
  if (!attached) discard();
  wake();
}

// ---------------------------------------------------------------------------------------------
// HttpSession

HttpSession::HttpSession(Hub& hub, std::string id, bool legacy, Peer peer, bool ephemeral)
    : hub_(hub),
      id_(std::move(id)),
      legacy_(legacy),
      ephemeral_(ephemeral),
      peer_(std::move(peer)),
      account_(std::make_shared<ByteAccount>()) {
  account_->parent = hub_.account();
}

HttpSession::~HttpSession() {
  if (!closed_) close();
}

void HttpSession::start() {
  std::weak_ptr<HttpSession> weak = weak_from_this();
  asio::io_context& io = hub_.io;
  Workers& workers = hub_.workers;
  mcp_ = std::make_shared<mcp::Session>(
      hub_.server, id_,
      mcp::Session::RoutedSend([weak, &io](const json& message, const json& related) {
        // Serialised here, on the sending thread: the I/O thread only moves the text along.
        asio::post(io, [weak, out = Outbound::of(message, related)]() mutable {
          if (auto self = weak.lock()) self->route(std::move(out));
        });
      }),
      [&workers](std::function<void()> work) { workers.post(std::move(work)); },
      [weak, &io](const json& request_id) {
        asio::post(io, [weak, key = request_id.dump()] {
          if (auto self = weak.lock()) self->unanswered(key);
        });
      });
}

std::shared_ptr<Stream> HttpSession::open_request_stream(const json& request_id) {
  auto stream = std::make_shared<Stream>(hub_.io, next_stream_++, false, hub_.options.sse_buffer_bytes, account_);
  streams_[stream->id()] = stream;
  by_request_[request_id.dump()] = stream;
  return stream;
}

void HttpSession::drop_request_stream(const std::shared_ptr<Stream>& stream) {
  for (auto it = by_request_.begin(); it != by_request_.end(); ++it)
    if (it->second == stream) {
      by_request_.erase(it);
      break;
    }
  streams_.erase(stream->id());
  retired_.erase(std::remove(retired_.begin(), retired_.end(), stream->id()), retired_.end());
  stream->close();
}

void HttpSession::unanswered(const std::string& request_key) {
  auto it = by_request_.find(request_key);
  if (it == by_request_.end()) return;
  std::shared_ptr<Stream> stream = std::move(it->second);
  by_request_.erase(it);
  if (stream->attached)
    stream->abandoned = true;  // dropped when its writer detaches
  else
    drop_request_stream(stream);
}

std::shared_ptr<Stream> HttpSession::standalone() {
  if (!standalone_) {
    standalone_ = std::make_shared<Stream>(hub_.io, next_stream_++, true, hub_.options.sse_buffer_bytes, account_);
    streams_[standalone_->id()] = standalone_;
  }
  return standalone_;
}

std::shared_ptr<Stream> HttpSession::find_stream(std::uint64_t id) const {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

void HttpSession::receive(json message) {
  if (closed_ || !mcp_) return;
  touch();
  mcp_->receive(std::move(message));
}

std::string HttpSession::protocol_version() const { return mcp_ ? mcp_->protocol_version() : std::string(); }

std::size_t HttpSession::in_flight() const { return mcp_ ? mcp_->in_flight() : 0; }

std::size_t HttpSession::shed(std::size_t target) {
  std::size_t freed = 0;
  for (auto& [id, stream] : streams_) {
    if (account_->held <= target) return freed;
    freed += stream->drop_replay();
  }
  // Then whole finished streams that nobody reads (kept for a resume), oldest first.
  for (auto it = streams_.begin(); it != streams_.end() && account_->held > target;) {
    const std::shared_ptr<Stream>& stream = it->second;
    if (stream->standalone() || !stream->finished() || stream->attached) {
      ++it;
      continue;
    }
    const std::size_t n = stream->discard();
    if (n > 0)
      log::warn("http: session {}: an unread response of {} kept for a resume was dropped (the session held {}, limit {}: "
                "[server] max_session_buffer_bytes; the server held {}, limit {}: [server] max_buffer_bytes)",
                id_.substr(0, 8), mib(n), mib(account_->held + n), mib(hub_.options.max_session_buffer_bytes),
                mib(hub_.account()->held + n), mib(hub_.options.max_buffer_bytes));
    freed += n;
    retired_.erase(std::remove(retired_.begin(), retired_.end(), it->first), retired_.end());
    it = streams_.erase(it);
  }
  return freed;
}

std::optional<Refusal> HttpSession::over_budget(const Outbound& response) {
  const std::size_t size = response.text.size();
  const std::size_t session_limit = hub_.options.max_session_buffer_bytes;
  const std::size_t server_limit = hub_.options.max_buffer_bytes;
  auto fits = [&] {
    return account_->held + size <= session_limit && hub_.account()->held + size <= server_limit;
  };
  if (fits()) return std::nullopt;
  shed(session_limit > size ? session_limit - size : 0);
  if (!fits()) hub_.shed(server_limit > size ? server_limit - size : 0);
  // A session with nothing unread always gets its response, however big.
  if (fits() || account_->unsent == 0) return std::nullopt;
  if (account_->held + size > session_limit)
    return Refusal{200,
                   fmt::format("the response ({}) was dropped: this session already holds {} of responses that its client "
                               "has not read, and the limit is {} ([server] max_session_buffer_bytes). Read the pending "
                               "responses (or resume their streams with GET and Last-Event-ID), then repeat the request",
                               mib(size), mib(account_->unsent), mib(session_limit)),
                   json{{"limit", "server.max_session_buffer_bytes"}, {"value", session_limit}}};
  return Refusal{200,
                 fmt::format("the response ({}) was dropped: the server holds {} that clients have not read (the limit is {}, "
                             "[server] max_buffer_bytes), {} of it for this session. Read the pending responses, then repeat "
                             "the request",
                             mib(size), mib(hub_.account()->held), mib(server_limit), mib(account_->unsent)),
                 json{{"limit", "server.max_buffer_bytes"}, {"value", server_limit}}};
}

void HttpSession::route(Outbound message) {
  if (closed_) return;
  std::shared_ptr<Stream> stream;
  bool by_request = false;
  if (legacy_) {
    stream = standalone();
  } else if (!message.related.is_null()) {
    if (auto it = by_request_.find(message.related_key); it != by_request_.end()) {
      stream = it->second;
      by_request = true;
    }
  }
  // An ephemeral session has no stream but its request's: whatever belongs to no request (a
  // broadcast; a late message after the response) has no reader.
  if (!stream && ephemeral_) return;
  if (!stream) stream = standalone();
  const auto& opt = hub_.options;
  if (message.kind == Outbound::Kind::notification &&
      (account_->held + message.text.size() > opt.max_session_buffer_bytes ||
       hub_.account()->held + message.text.size() > opt.max_buffer_bytes)) {
    shed(opt.max_session_buffer_bytes > message.text.size() ? opt.max_session_buffer_bytes - message.text.size() : 0);
    const bool fits = account_->held + message.text.size() <= opt.max_session_buffer_bytes &&
                      hub_.account()->held + message.text.size() <= opt.max_buffer_bytes;
    if (!fits && account_->unsent > 0) {  // progress and logs are the first to go
      stream->count_dropped();
      return;
    }
  }
  if (message.kind == Outbound::Kind::response) {
    if (auto why = over_budget(message)) {
      log::warn("http: session {}: {}", id_.substr(0, 8), why->message);
      account_->dropping = true;
      hub_.account()->freed += message.text.size();  // made on a worker, freed here: worth a trim
      message.text = mcp::make_error(message.related, -32000, why->message, why->data)
                         .dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }
  // Ephemeral streams carry no event ids: 2026-07-28 streams are not resumable.
  stream->push(std::move(message.text), message.kind, legacy_ || ephemeral_);
  if (by_request && message.kind == Outbound::Kind::response) {
    stream->finish();
    by_request_.erase(message.related_key);
    retire(stream->id());
  }
}

void HttpSession::answer_unfinished(const std::string& why) {
  auto pending = std::move(by_request_);
  by_request_.clear();
  for (auto& [key, stream] : pending) {
    const json id = parse_json_or_discarded(key);
    stream->push(mcp::make_error(id, -32000, why).dump(-1, ' ', false, json::error_handler_t::replace),
                 Outbound::Kind::response, legacy_ || ephemeral_);
    stream->finish();
    retire(stream->id());
  }
}

void HttpSession::retire(std::uint64_t stream_id) {
  retired_.push_back(stream_id);
  while (retired_.size() > kKeptFinishedStreams) {
    auto it = streams_.find(retired_.front());
    if (it != streams_.end() && !it->second->attached) streams_.erase(it);
    retired_.pop_front();
  }
}

void HttpSession::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& [id, stream] : streams_) stream->close();
  if (standalone_) standalone_->close();
  streams_.clear();
  by_request_.clear();
  retired_.clear();
  standalone_.reset();
  if (mcp_) {
    // Closing cancels what is still running and waits for it: never on the I/O thread.
    std::shared_ptr<mcp::Session> session = std::move(mcp_);
    try {
      hub_.workers.post([session]() mutable { session.reset(); });
    } catch (...) {
      // No worker can take it (shutting down): close here; handlers were told to stop.
      session->close();
    }
  }
}

bool HttpSession::end_requests() {
  if (closed_ || !mcp_) return false;
  try {
    hub_.workers.post([session = mcp_] { session->close(); });
    return true;
  } catch (...) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Hub

Hub::Hub(mcp::Server& srv, const HttpOptions& opts, asio::io_context& ctx)
    : server(srv), options(opts), io(ctx), workers(opts.worker_threads), logins(opts.login, Clock::now()), sweeper_(ctx) {}

Hub::~Hub() {
  close_all();
  workers.join();  // sessions being closed finish before the I/O context goes
}

std::shared_ptr<HttpSession> Hub::create_session(bool legacy, const Peer& peer, Refusal& refusal) {
  if (draining) {
    refusal = {503, "the server is shutting down", nullptr};
    return nullptr;
  }
  if (sessions_.size() >= options.max_sessions) {
    refusal = {503,
               fmt::format("too many sessions: {} open, the limit is {} ([server] max_sessions); close unused ones "
                           "(DELETE) or wait for idle ones to time out",
                           sessions_.size(), options.max_sessions),
               json{{"limit", "server.max_sessions"}, {"value", options.max_sessions}}};
    return nullptr;
  }
  auto per_peer = sessions_per_peer_.find(peer.key);
  if (per_peer != sessions_per_peer_.end() && per_peer->second >= options.max_sessions_per_peer) {
    refusal = {429,
               fmt::format("too many sessions for {}: {} open, the limit per peer is {} ([server] max_sessions_per_peer); "
                           "close unused ones (DELETE) or wait for idle ones to time out",
                           peer.shown, per_peer->second, options.max_sessions_per_peer),
               json{{"limit", "server.max_sessions_per_peer"}, {"value", options.max_sessions_per_peer}}};
    return nullptr;
  }
  std::string id = random::hex(16);
  auto session = std::make_shared<HttpSession>(*this, id, legacy, peer);
  session->start();
  sessions_.emplace(std::move(id), session);
  ++sessions_per_peer_[peer.key];
  publish_status();
  return session;
}

std::optional<Refusal> Hub::admit(HttpSession& session, std::string_view method) {
  if (method == "ping") return std::nullopt;
  const std::size_t own = session.in_flight();
  if (own >= options.max_requests_per_session)
    return Refusal{429,
                   fmt::format("too many requests in flight in this session: {} (the limit is {}, [server] "
                               "max_requests_per_session); wait for some to finish or cancel them",
                               own, options.max_requests_per_session),
                   json{{"limit", "server.max_requests_per_session"}, {"value", options.max_requests_per_session}}};
  std::size_t peer_total = 0;
  for (const auto& [id, s] : sessions_)
    if (s->peer().key == session.peer().key) peer_total += s->in_flight();
  for (const auto& [id, s] : ephemeral_)
    if (s->peer().key == session.peer().key) peer_total += s->in_flight();
  if (peer_total >= options.max_requests_per_peer)
    return Refusal{429,
                   fmt::format("too many requests in flight from {}: {} in all its sessions (the limit is {}, [server] "
                               "max_requests_per_peer); wait for some to finish or cancel them",
                               session.peer().shown, peer_total, options.max_requests_per_peer),
                   json{{"limit", "server.max_requests_per_peer"}, {"value", options.max_requests_per_peer}}};
  // Backpressure: a client that does not read its responses gets no new work.
  if (session.account().held > options.max_session_buffer_bytes) session.shed(options.max_session_buffer_bytes);
  ByteAccount& account = *session.account_ptr();
  if (account.dropping && account.unsent <= options.max_session_buffer_bytes / 2) account.dropping = false;
  if (account.unsent > options.max_session_buffer_bytes || account.dropping)
    return Refusal{429,
                   fmt::format("this session's client is not reading its responses: {} are unread (the limit is {}, "
                               "[server] max_session_buffer_bytes{}); read them (or resume their streams with GET and "
                               "Last-Event-ID) before sending more requests",
                               mib(account.unsent), mib(options.max_session_buffer_bytes),
                               account.dropping ? ", and answers beyond it were dropped" : ""),
                   json{{"limit", "server.max_session_buffer_bytes"}, {"value", options.max_session_buffer_bytes}}};
  if (account_->held > options.max_buffer_bytes) shed(options.max_buffer_bytes);
  if (account_->held > options.max_buffer_bytes && session.account().unsent > 0)
    return Refusal{503,
                   fmt::format("the server holds {} that clients have not read (the limit is {}, [server] max_buffer_bytes), "
                               "{} of it for this session; read your pending responses before sending more requests",
                               mib(account_->held), mib(options.max_buffer_bytes), mib(session.account().unsent)),
                   json{{"limit", "server.max_buffer_bytes"}, {"value", options.max_buffer_bytes}}};
  return std::nullopt;
}

std::shared_ptr<HttpSession> Hub::find(std::string_view id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

void Hub::remove(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  auto session = it->second;
  sessions_.erase(it);
  if (auto peer = sessions_per_peer_.find(session->peer().key); peer != sessions_per_peer_.end() && --peer->second == 0)
    sessions_per_peer_.erase(peer);
  session->close();
  trim_memory(true);
  publish_status();
}

std::size_t Hub::total_in_flight() const {
  std::size_t n = 0;
  for (const auto& [id, session] : sessions_) n += session->in_flight();
  for (const auto& [id, session] : ephemeral_) n += session->in_flight();
  return n;
}

void Hub::answer_unfinished(const std::string& why) {
  for (auto& [id, session] : sessions_) session->answer_unfinished(why);
  for (auto& [id, session] : ephemeral_) session->answer_unfinished(why);
}

std::shared_ptr<HttpSession> Hub::open_ephemeral(const Peer& peer) {
  // The id only names the request's session in logs and audit records (never sent).
  std::string id = random::hex(16);
  auto session = std::make_shared<HttpSession>(*this, id, false, peer, true);
  session->start();
  ephemeral_.emplace(std::move(id), session);
  return session;
}

void Hub::end_ephemeral(const std::string& id) {
  auto it = ephemeral_.find(id);
  if (it == ephemeral_.end()) return;
  auto session = std::move(it->second);
  ephemeral_.erase(it);
  session->close();  // cancels what still runs, on a worker
  trim_memory();
}

void Hub::end_listens(const std::string& why) {
  // The core ends a listen it closes with a final result (a graceful end for the client).
  for (auto& [id, session] : ephemeral_)
    if (session->listening && !session->end_requests()) session->answer_unfinished(why);
}

void Hub::close_all() {
  // Event streams first: nothing waits for them (their connections are closed by the caller).
  auto channels = std::move(channels_);
  channels_.clear();
  for (auto& [key, weak] : channels)
    if (auto channel = weak.lock()) channel->close();
  auto sessions = std::move(sessions_);
  sessions_.clear();
  sessions_per_peer_.clear();
  for (auto& [id, session] : sessions) session->close();
  auto ephemeral = std::move(ephemeral_);
  ephemeral_.clear();
  for (auto& [id, session] : ephemeral) session->close();
}

void Hub::shed(std::size_t target) {
  for (auto& [id, session] : sessions_) {
    if (account_->held <= target) return;
    session->shed(0);
  }
}

void Hub::trim_memory(bool now) {
  if (account_->freed < (now ? kTrimNowBytes : kTrimAfterBytes)) return;
  if (!now && Clock::now() - last_trim_ < kTrimInterval) return;
  if (trimming_->exchange(true)) return;
  account_->freed = 0;
  last_trim_ = Clock::now();
  // The large buffers of responses (made on worker threads, freed here) stay in malloc's arenas
  // otherwise; trimming walks every arena, so not on the I/O thread.
  try {
    workers.post([flag = trimming_] {
      ::malloc_trim(0);
      flag->store(false);
    });
  } catch (...) {
    trimming_->store(false);
  }
}

void Hub::start_sweeper() {
  sweeping_ = true;
  sweeper_.expires_after(std::chrono::seconds(1));
  sweeper_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !sweeping_) return;
    sweep();
    start_sweeper();
  });
}

void Hub::stop_sweeper() {
  sweeping_ = false;
  sweeper_.cancel();
}

void Hub::sweep() {
  const auto now = Clock::now();
  std::vector<std::string> idle;
  for (const auto& [id, session] : sessions_)
    if (session->connections == 0 && now - session->last_active() > options.session_idle_timeout)
      idle.push_back(id);
  for (const std::string& id : idle) {
    log::info("http: session {} idle for more than {} s: closed", id.substr(0, 8),
              std::chrono::duration_cast<std::chrono::seconds>(options.session_idle_timeout).count());
    remove(id);
  }
  logins.expire(now);
  trim_memory();
  publish_status();
}

void Hub::add_channel(const std::shared_ptr<EventChannel>& channel) { channels_[channel.get()] = channel; }

void Hub::remove_channel(const EventChannel* channel) { channels_.erase(channel); }

std::optional<Refusal> Hub::take_websocket(const WebSocketRoute& route, const Peer& peer) {
  WebSocketUse& use = websockets_[&route];
  // Per peer first: a peer at its own cap learns that it is its own doing.
  auto it = use.per_peer.find(peer.key);
  if (it != use.per_peer.end() && it->second >= route.max_per_peer)
    return Refusal{429,
                   fmt::format("too many WebSocket connections to {} from {}: {} open, the limit per peer is {}; close "
                               "one (another tab) and try again",
                               route.prefix, peer.shown, it->second, route.max_per_peer),
                   nullptr};
  if (use.open >= route.max_connections)
    return Refusal{503,
                   fmt::format("too many WebSocket connections to {}: {} open, the limit is {}; close one (another tab) "
                               "or try again later",
                               route.prefix, use.open, route.max_connections),
                   nullptr};
  ++use.open;
  ++use.per_peer[peer.key];
  ++websocket_total_;
  publish_status();
  return std::nullopt;
}

void Hub::release_websocket(const WebSocketRoute& route, const Peer& peer) {
  auto use = websockets_.find(&route);
  if (use == websockets_.end() || use->second.open == 0) return;
  --use->second.open;
  --websocket_total_;
  if (auto it = use->second.per_peer.find(peer.key); it != use->second.per_peer.end() && --it->second == 0)
    use->second.per_peer.erase(it);
  publish_status();
}

void Hub::publish_status() {
  if (!options.status_board) return;
  HttpStatus status;
  status.url = url;
  status.sessions = sessions_.size();
  status.event_streams = channels_.size();
  status.websockets = websocket_total_;
  status.bytes_held = account_->held;
  status.browser_sessions = logins.count();
  std::map<std::string, HttpStatus::PeerUse> peers;  // by peer key
  std::size_t busiest_session = 0, largest_session = 0;
  for (const auto& [id, session] : sessions_) {
    HttpStatus::PeerUse& use = peers[session->peer().key];
    use.peer = session->peer().shown;
    ++use.sessions;
    const std::size_t running = session->in_flight();
    use.requests += running;
    status.requests += running;
    busiest_session = std::max(busiest_session, running);
    largest_session = std::max(largest_session, session->account().held);
  }
  status.stateless_requests = ephemeral_.size();
  for (const auto& [id, session] : ephemeral_) {
    HttpStatus::PeerUse& use = peers[session->peer().key];
    use.peer = session->peer().shown;
    const std::size_t running = session->in_flight();
    use.requests += running;
    status.requests += running;
  }
  std::size_t connections_limit = options.max_connections, per_peer_limit = options.max_connections_per_peer;
  if (connection_status) connection_status(status, peers);
  if (auto it = status.caps.find("server.max_connections"); it != status.caps.end()) connections_limit = it->second.second;
  if (auto it = status.caps.find("server.max_connections_per_peer"); it != status.caps.end())
    per_peer_limit = it->second.second;
  std::size_t most_connections = 0, most_sessions = 0, most_requests = 0;
  for (auto& [key, use] : peers) {
    most_connections = std::max(most_connections, use.connections);
    most_sessions = std::max(most_sessions, use.sessions);
    most_requests = std::max(most_requests, use.requests);
    status.peers.push_back(std::move(use));
  }
  // In use (for the per-peer caps: by the busiest peer or session) and the limit.
  status.caps["server.max_connections"] = {status.connections, connections_limit};
  status.caps["server.max_connections_per_peer"] = {most_connections, per_peer_limit};
  status.caps["server.max_sessions"] = {status.sessions, options.max_sessions};
  status.caps["server.max_sessions_per_peer"] = {most_sessions, options.max_sessions_per_peer};
  status.caps["server.max_requests_per_session"] = {busiest_session, options.max_requests_per_session};
  status.caps["server.max_requests_per_peer"] = {most_requests, options.max_requests_per_peer};
  status.caps["server.max_session_buffer_bytes"] = {largest_session, options.max_session_buffer_bytes};
  status.caps["server.max_buffer_bytes"] = {status.bytes_held, options.max_buffer_bytes};
  options.status_board->set(std::move(status));
}

// ---------------------------------------------------------------------------------------------
// BrowserLogins

BrowserLogins::BrowserLogins(const HttpOptions::Login& login, Clock::time_point now)
    : login_(login), code_expires_(now + login.code_lifetime) {}

BrowserLogins::Code BrowserLogins::redeem(std::string_view code, Clock::time_point now) {
  if (login_.code.empty() || !same_secret(code, login_.code)) return Code::wrong;
  if (code_used_) return Code::used;
  if (now >= code_expires_) return Code::expired;
  code_used_ = true;
  return Code::good;
}

std::string BrowserLogins::open(const Peer& peer, Clock::time_point now) {
  expire(now);
  while (!sessions_.empty() && sessions_.size() >= std::max<std::size_t>(login_.max_sessions, 1)) {
    auto oldest = std::min_element(sessions_.begin(), sessions_.end(),
                                   [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
    sessions_.erase(oldest);
    log::info("http: a dashboard login made room: the least recently used browser session ended ({} at most: "
              "HttpOptions::Login::max_sessions)",
              login_.max_sessions);
  }
  Entry entry{random::hex(32), now};
  log::info("http: {} logged in to the dashboard ({} browser session(s))", peer.shown, sessions_.size() + 1);
  sessions_.push_back(entry);
  return entry.secret;
}

bool BrowserLogins::valid(std::string_view cookie, Clock::time_point now) {
  if (cookie.size() != 64) return false;
  // Every session is compared, whichever matches: the time says nothing about the secrets.
  Entry* found = nullptr;
  for (Entry& entry : sessions_)
    if (same_secret(cookie, entry.secret)) found = &entry;
  if (!found || now - found->last_used > login_.session_lifetime) return false;
  found->last_used = now;
  return true;
}

void BrowserLogins::close(std::string_view cookie) {
  std::erase_if(sessions_, [&](const Entry& entry) { return same_secret(cookie, entry.secret); });
}

std::optional<std::chrono::seconds> BrowserLogins::must_wait(const std::string& peer_key, Clock::time_point now) {
  auto it = failures_.find(peer_key);
  if (it == failures_.end()) return std::nullopt;
  auto& times = it->second;
  while (!times.empty() && now - times.front() >= kFailureWindow) times.pop_front();
  if (times.size() < kMaxFailures) return std::nullopt;
  const auto left = std::chrono::ceil<std::chrono::seconds>(times.front() + kFailureWindow - now);
  return std::max(left, std::chrono::seconds(1));
}

void BrowserLogins::failed(const std::string& peer_key, Clock::time_point now) {
  auto& times = failures_[peer_key];
  times.push_back(now);
  while (times.size() > kMaxFailures) times.pop_front();
}

void BrowserLogins::expire(Clock::time_point now) {
  std::erase_if(sessions_, [&](const Entry& entry) { return now - entry.last_used > login_.session_lifetime; });
  std::erase_if(failures_, [&](const auto& item) { return item.second.empty() || now - item.second.back() >= kFailureWindow; });
}

// ---------------------------------------------------------------------------------------------
// EventChannel

namespace {
// A field value on one line: CR and LF would start another field.
void append_field(std::string& out, std::string_view name, std::string_view value) {
  out += name;
  out += ": ";
  for (char c : value) out.push_back(c == '\r' || c == '\n' ? ' ' : c);
  out.push_back('\n');
}
}  // namespace

bool EventChannel::send(std::string_view event, std::string_view data, std::string_view id) {
  std::string text;
  text.reserve(event.size() + data.size() + id.size() + 32);
  if (!id.empty()) append_field(text, "id", id);
  if (!event.empty()) append_field(text, "event", event);
  // Each line of the data its own data field (CR LF, LF and CR all end a line in SSE).
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = data.find_first_of("\r\n", start);
    append_field(text, "data", data.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + (data[end] == '\r' && end + 1 < data.size() && data[end + 1] == '\n' ? 2 : 1);
  }
  text.push_back('\n');
  std::lock_guard lock(mutex_);
  if (closed_) return false;
  if (unsent_ + text.size() > buffer_bytes_) {
    // The client does not read: cut the stream (a browser reconnects with Last-Event-ID).
    cut_ = true;
    closed_ = true;
    queued_.clear();
    if (wake_) wake_();
    wake_ = nullptr;
    return false;
  }
  unsent_ += text.size();
  queued_ += text;
  if (!wake_pending_ && wake_) {
    wake_pending_ = true;
    wake_();
  }
  return true;
}

void EventChannel::end() {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  closed_ = true;
  ended_ = true;
  if (wake_) wake_();  // what is queued is still written
  wake_ = nullptr;
}

bool EventChannel::ended() const {
  std::lock_guard lock(mutex_);
  return ended_;
}

bool EventChannel::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

bool EventChannel::cut() const {
  std::lock_guard lock(mutex_);
  return cut_;
}

void EventChannel::on_ready(std::function<void()> wake) {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  wake_ = std::move(wake);
  if (!queued_.empty()) {
    wake_pending_ = true;
    wake_();
  }
}

std::string EventChannel::take() {
  std::lock_guard lock(mutex_);
  wake_pending_ = false;
  return std::exchange(queued_, std::string());
}

void EventChannel::written(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  unsent_ -= std::min(unsent_, bytes);
}

void EventChannel::close() {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  closed_ = true;
  queued_.clear();
  if (wake_) wake_();
  wake_ = nullptr;
}

// ---------------------------------------------------------------------------------------------
// WebSocketChannel and WebSocketCalls

namespace {
// A close frame's reason holds at most 123 bytes (RFC 6455 5.5: 125 with the code).
std::string close_reason(std::string_view reason) { return std::string(reason.substr(0, 123)); }
}  // namespace

bool WebSocketChannel::send(std::string data, bool binary) {
  std::lock_guard lock(mutex_);
  if (finished_ || ending_) return false;
  if (unsent_ + data.size() > buffer_bytes_) {
    // The client does not read: cut it (1008), whatever is still queued goes.
    cut_ = true;
    ending_ = Ending{1008, fmt::format("the client did not read: more than {} bytes waited", buffer_bytes_)};
    queued_.clear();
    if (wake_) wake_();
    return false;
  }
  unsent_ += data.size();
  queued_.push_back({std::move(data), binary});
  if (!wake_pending_ && wake_) {
    wake_pending_ = true;
    wake_();
  }
  return true;
}

void WebSocketChannel::close(std::string_view reason) { end(1000, reason); }

void WebSocketChannel::end(std::uint16_t code, std::string_view reason) {
  std::lock_guard lock(mutex_);
  if (finished_ || ending_) return;
  ending_ = Ending{code, close_reason(reason)};
  if (wake_) wake_();  // what is queued is still written
}

bool WebSocketChannel::closed() const {
  std::lock_guard lock(mutex_);
  return finished_ || ending_.has_value();
}

void WebSocketChannel::on_ready(std::function<void()> wake) {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  wake_ = std::move(wake);
  if (!queued_.empty() || ending_) {
    wake_pending_ = true;
    wake_();
  }
}

std::optional<WebSocketChannel::Message> WebSocketChannel::next() {
  std::lock_guard lock(mutex_);
  wake_pending_ = false;
  if (queued_.empty()) return std::nullopt;
  Message message = std::move(queued_.front());
  queued_.pop_front();
  return message;
}

void WebSocketChannel::written(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  unsent_ -= std::min(unsent_, bytes);
}

std::optional<WebSocketChannel::Ending> WebSocketChannel::ending() const {
  std::lock_guard lock(mutex_);
  return ending_;
}

bool WebSocketChannel::cut() const {
  std::lock_guard lock(mutex_);
  return cut_;
}

void WebSocketChannel::finish() {
  std::lock_guard lock(mutex_);
  finished_ = true;
  queued_.clear();
  wake_ = nullptr;
}

void WebSocketCalls::message(std::string data, bool binary) { push({std::move(data), binary, false}); }

void WebSocketCalls::closed() { push({{}, true, true}); }

bool WebSocketCalls::full() const {
  std::lock_guard lock(mutex_);
  return bytes_ > limit_;
}

void WebSocketCalls::on_room(std::function<void()> wake) {
  std::lock_guard lock(mutex_);
  room_ = std::move(wake);
}

void WebSocketCalls::push(Call call) {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  closed_ = call.close;
  bytes_ += call.data.size();
  queue_.push_back(std::move(call));
  if (running_) return;
  running_ = true;
  // One worker runs the calls queued so far, then lets go: calls never overlap.
  workers_.post([self = shared_from_this()] { self->drain(); });
}

void WebSocketCalls::drain() {
  std::unique_lock lock(mutex_);
  while (!queue_.empty()) {
    Call call = std::move(queue_.front());
    queue_.pop_front();
    const std::size_t size = call.data.size();
    lock.unlock();
    try {
      if (call.close) handler_->on_close();
      else handler_->on_message(std::move(call.data), call.binary);
    } catch (const std::exception& e) {
      log::warn("http: a WebSocket handler failed: {}", e.what());
      channel_->end(1011, "the server's handler failed");
    }
    lock.lock();
    const bool was_full = bytes_ > limit_;
    bytes_ -= size;
    if (was_full && bytes_ <= limit_ && room_) room_();
    if (call.close) {
      handler_.reset();  // the route's state goes now, not with the last reference to this queue
      room_ = nullptr;
    }
  }
  running_ = false;
}

// ---------------------------------------------------------------------------------------------
// Helpers

bool same_secret(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

std::string host_of(std::string_view value) {
  std::string_view host = value;
  if (!host.empty() && host.front() == '[') {
    const auto close = host.find(']');
    host = close == std::string_view::npos ? host.substr(1) : host.substr(1, close - 1);
  } else if (const auto colon = host.rfind(':'); colon != std::string_view::npos &&
                                                 host.find(':') == colon) {
    host = host.substr(0, colon);
  }
  std::string out(host);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  while (!out.empty() && out.back() == '.') out.pop_back();  // "localhost." is localhost
  return out;
}

}  // namespace nshpc::transport::http_detail
