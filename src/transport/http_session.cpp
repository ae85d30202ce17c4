// Sessions of the HTTP transports and their SSE streams (see http_internal.hpp).
#include <sys/random.h>

#include <algorithm>
#include <cerrno>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "transport/http_internal.hpp"

namespace nshpc::transport::http_detail {

namespace {

// Finished streams whose last events never reached the client, kept for resumption.
constexpr std::size_t kKeptFinishedStreams = 32;

bool is_notification(const json& message) {
  return message.is_object() && message.contains("method") && !message.contains("id");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Stream

Stream::Stream(asio::io_context& io, std::uint64_t id, bool standalone, std::size_t buffer_bytes)
    : id_(id), standalone_(standalone), buffer_bytes_(buffer_bytes), wake_(io) {
  event_prefix = fmt::format("{}_", id);
}

bool Stream::push(const json& message, bool legacy_format) {
  if (closed_) return false;
  if (is_notification(message) && unsent_bytes_ > buffer_bytes_) {
    ++dropped_;
    if (dropped_ == 1 || dropped_ % 1000 == 0)
      log::warn("http: a client reads its SSE stream too slowly; {} notification(s) dropped so far "
                "(backlog {} bytes, limit {})",
                dropped_, unsent_bytes_, buffer_bytes_);
    return false;
  }
  const std::string data = message.dump(-1, ' ', false, json::error_handler_t::replace);
  Event event;
  event.seq = next_seq_++;
  if (legacy_format)
    event.text = fmt::format("event: message\ndata: {}\n\n", data);
  else
    event.text = fmt::format("id: {}{}\nevent: message\ndata: {}\n\n", event_prefix, event.seq, data);
  kept_bytes_ += event.text.size();
  unsent_bytes_ += event.text.size();
  events_.push_back(std::move(event));
  trim();
  wake();
  return true;
}

void Stream::push_raw(std::string text) {
  if (closed_) return;
  Event event;
  event.seq = next_seq_++;
  event.text = std::move(text);
  kept_bytes_ += event.text.size();
  unsent_bytes_ += event.text.size();
  events_.push_back(std::move(event));
  wake();
}

std::string Stream::take(std::uint64_t after, std::uint64_t& last, std::size_t max_bytes) const {
  std::string out;
  if (events_.empty() || events_.back().seq <= after) return out;
  std::size_t index = after + 1 >= first_kept_ ? static_cast<std::size_t>(after + 1 - first_kept_) : 0;
  for (; index < events_.size(); ++index) {
    const Event& e = events_[index];
    if (!out.empty() && out.size() + e.text.size() > max_bytes) break;
    out += e.text;
    last = e.seq;
  }
  return out;
}

void Stream::delivered(std::uint64_t seq) {
  if (seq <= delivered_) return;
  for (const Event& e : events_) {
    if (e.seq <= delivered_) continue;
    if (e.seq > seq) break;
    unsent_bytes_ -= std::min(unsent_bytes_, e.text.size());
  }
  delivered_ = seq;
  trim();
}

void Stream::trim() {
  // Only events the client already has may go; what is unsent stays (bounded by push).
  while (kept_bytes_ > buffer_bytes_ && !events_.empty() && events_.front().seq <= delivered_) {
    kept_bytes_ -= events_.front().text.size();
    events_.pop_front();
    first_kept_ = events_.empty() ? next_seq_ : events_.front().seq;
  }
}

void Stream::finish(std::string response_json) {
  finished_ = true;
  response_json_ = std::move(response_json);
  wake();
}

void Stream::close() {
  closed_ = true;
  wake();
}

// ---------------------------------------------------------------------------------------------
// HttpSession

HttpSession::HttpSession(Hub& hub, std::string id, bool legacy)
    : hub_(hub), id_(std::move(id)), legacy_(legacy) {}

HttpSession::~HttpSession() {
  if (!closed_) close();
}

void HttpSession::start() {
  std::weak_ptr<HttpSession> weak = weak_from_this();
  asio::io_context& io = hub_.io;
  Workers& workers = hub_.workers;
  mcp_ = std::make_unique<mcp::Session>(
      hub_.server, id_,
      mcp::Session::RoutedSend([weak, &io](const json& message, const json& related) {
        asio::post(io, [weak, message, related] {
          if (auto self = weak.lock()) self->route(message, related);
        });
      }),
      [&workers](std::function<void()> work) { workers.post(std::move(work)); });
}

std::shared_ptr<Stream> HttpSession::open_request_stream(const json& request_id) {
  auto stream = std::make_shared<Stream>(hub_.io, next_stream_++, false, hub_.options.sse_buffer_bytes);
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

std::shared_ptr<Stream> HttpSession::standalone() {
  if (!standalone_) {
    standalone_ = std::make_shared<Stream>(hub_.io, next_stream_++, true, hub_.options.sse_buffer_bytes);
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

void HttpSession::route(const json& message, const json& related) {
  if (closed_) return;
  if (legacy_) {
    standalone()->push(message, true);
    return;
  }
  if (!related.is_null()) {
    auto it = by_request_.find(related.dump());
    if (it != by_request_.end()) {
      std::shared_ptr<Stream> stream = it->second;
      stream->push(message, false);
      const bool response = message.is_object() && !message.contains("method") &&
                            message.contains("id") && message["id"] == related;
      if (response) {
        stream->finish(message.dump(-1, ' ', false, json::error_handler_t::replace));
        by_request_.erase(it);
        retire(stream->id());
      }
      return;
    }
  }
  standalone()->push(message, false);
}

void HttpSession::answer_unfinished(const std::string& why) {
  auto pending = std::move(by_request_);
  by_request_.clear();
  for (auto& [key, stream] : pending) {
    const json id = json::parse(key, nullptr, false);
    const json error = mcp::make_error(id, -32000, why);
    stream->push(error, false);
    stream->finish(error.dump(-1, ' ', false, json::error_handler_t::replace));
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
    std::shared_ptr<mcp::Session> session(std::move(mcp_));
    try {
      hub_.workers.post([session]() mutable { session.reset(); });
    } catch (...) {
      // No worker can take it (shutting down): close here; handlers were told to stop.
      session->close();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Hub

Hub::Hub(mcp::Server& srv, const HttpOptions& opts, asio::io_context& ctx)
    : server(srv), options(opts), io(ctx), workers(opts.worker_threads), sweeper_(ctx) {}

Hub::~Hub() {
  close_all();
  workers.join();  // sessions being closed finish before the I/O context goes
}

std::shared_ptr<HttpSession> Hub::create_session(bool legacy) {
  if (draining || sessions_.size() >= options.max_sessions) return nullptr;
  std::string id = random_hex(16);
  auto session = std::make_shared<HttpSession>(*this, id, legacy);
  session->start();
  sessions_.emplace(std::move(id), session);
  return session;
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
  session->close();
}

std::size_t Hub::total_in_flight() const {
  std::size_t n = 0;
  for (const auto& [id, session] : sessions_) n += session->in_flight();
  return n;
}

void Hub::answer_unfinished(const std::string& why) {
  for (auto& [id, session] : sessions_) session->answer_unfinished(why);
}

void Hub::close_all() {
  auto sessions = std::move(sessions_);
  sessions_.clear();
  for (auto& [id, session] : sessions) session->close();
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
}

// ---------------------------------------------------------------------------------------------
// Helpers

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "getrandom", "random bytes for a session id or token");
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

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
