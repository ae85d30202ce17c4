// The live views' WebSockets (relays.hpp): each connection a handler of the transport's, with one
// thread of its own that reads what the sandbox sends (the VNC server's or the terminal's bytes)
// and passes it on; what the browser sends arrives on the transport's workers, one message at a
// time. Everything from the sandbox is passed through as bytes, never parsed here; what the
// browser sends to a desktop is framed and filtered first (desktop/rfb.hpp).
#include "dashboard/relays.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "desktop/rfb.hpp"
#include "instances/desktops.hpp"
#include "instances/terminal.hpp"

namespace nshpc::dashboard {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr std::size_t kReadChunk = 64 * 1024;
// A sandbox that stops reading what the browser sends is given this long per write.
constexpr int kWriteWaitMs = 5000;
// Input passed to a desktop is audited in batches at most this often (and when the view closes).
constexpr auto kInputAuditEvery = 2s;

transport::HttpResponse refusal(int status, const std::string& message) {
  transport::HttpResponse r;
  r.status = status;
  r.headers["Content-Type"] = "application/json";
  r.headers["Cache-Control"] = "no-store";
  r.body = json{{"error", message}}.dump();
  return r;
}

// "/desktop/<id>/vnc" → <id> when the path has that shape (ids are plain names), else "".
std::string instance_of(const std::string& target, std::string_view head, std::string_view tail) {
  const std::string path = target.substr(0, target.find('?'));
  if (!path.starts_with(head) || !path.ends_with(tail) || path.size() <= head.size() + tail.size()) return {};
  std::string id = path.substr(head.size(), path.size() - head.size() - tail.size());
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return {};
  return id;
}

// A query parameter's number, or `fallback`.
unsigned short query_number(const std::string& target, std::string_view name, unsigned short fallback) {
  const std::size_t q = target.find('?');
  if (q == std::string::npos) return fallback;
  const std::string query = "&" + target.substr(q + 1);
  const std::string key = "&" + std::string(name) + "=";
  const std::size_t at = query.find(key);
  if (at == std::string::npos) return fallback;
  unsigned value = 0;
  std::size_t i = at + key.size();
  for (; i < query.size() && std::isdigit(static_cast<unsigned char>(query[i])) && value <= 10000; ++i)
    value = value * 10 + static_cast<unsigned>(query[i] - '0');
  return value >= 2 && value <= 1000 ? static_cast<unsigned short>(value) : fallback;
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) throw SysError(errno, "fcntl O_NONBLOCK");
}

// Writes all of `data` to the non-blocking `fd`, waiting at most kWriteWaitMs for each part; false
// when the other side does not take it in time or is gone.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, kWriteWaitMs) <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// The page's control messages are small JSON objects; anything else is ignored.
json control_message(const std::string& data) {
  if (data.size() > 4096) return json();
  json j = json::parse(data, nullptr, false);
  return j.is_object() ? j : json();
}

// ---- The desktop -------------------------------------------------------------------------------

class VncRelay final : public transport::WebSocketHandler {
 public:
  VncRelay(instances::Service& service, store::Instance inst, std::string actor, UniqueFd sock,
           std::shared_ptr<transport::WebSocketPeer> peer)
      : service_(service), inst_(std::move(inst)), actor_(std::move(actor)), sock_(std::move(sock)), peer_(std::move(peer)) {
    set_nonblocking(sock_.get());
    reader_ = std::jthread([this](std::stop_token stop) { pump(stop); });
  }
  ~VncRelay() override { finish(); }

  void on_message(std::string data, bool binary) override {
    if (!binary) {
      const json m = control_message(data);
      if (m.contains("control") && m["control"].is_boolean()) set_control(m["control"].get<bool>());
      return;
    }
    std::string out;
    {
      std::lock_guard lock(mutex_);
      try {
        out = filter_.feed(data);
      } catch (const desktop::RfbError& e) {
        log::info("dashboard: live desktop of '{}' ({}): {}", inst_.id, actor_, e.what());
        peer_->close(std::string("not a VNC client's message: ") + e.what());
        return;
      }
    }
    if (!out.empty() && !write_all(sock_.get(), out)) {
      peer_->close("the desktop's VNC server does not take input");
      return;
    }
    audit_input(false);
  }

  void on_close() override { finish(); }

 private:
  // Reads what the VNC server sends and passes it to the browser as it comes.
  void pump(std::stop_token stop) {
    std::string buf(kReadChunk, '\0');
    while (!stop.stop_requested()) {
      pollfd p{sock_.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, 200);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        if (peer_->closed()) return;
        continue;
      }
      const ssize_t n = ::read(sock_.get(), buf.data(), buf.size());
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        peer_->close("the desktop's VNC server ended the connection (was the desktop switched off?)");
        return;
      }
      if (!peer_->send(buf.substr(0, static_cast<std::size_t>(n)), true)) return;  // gone or too slow: cut
    }
  }

  void set_control(bool on) {
    bool changed = false;
    {
      std::lock_guard lock(mutex_);
      changed = filter_.view_only() == on;
      filter_.set_view_only(!on);
    }
    if (changed) {
      audit_input(true);  // what was passed before belongs to the earlier mode
      audit("desktop.control", {{"enabled", on}});
    }
    peer_->send(json{{"control", on}}.dump(), false);
  }

  // Audits the input passed since the last line: at most every kInputAuditEvery, or now.
  void audit_input(bool now) {
    json fields;
    {
      std::lock_guard lock(mutex_);
      const desktop::RfbClientFilter::Counts c = filter_.counts();
      if (c == audited_) return;
      const auto t = std::chrono::steady_clock::now();
      if (!now && t - last_audit_ < kInputAuditEvery) return;
      fields = {{"keys", c.keys - audited_.keys},
                {"pointer", c.pointer - audited_.pointer},
                {"clipboard", c.clipboard - audited_.clipboard}};
      audited_ = c;
      last_audit_ = t;
    }
    audit("desktop.input", std::move(fields));
  }

  void audit(std::string_view event, json fields) {
    try {
      service_.store().audit(inst_, event, actor_, std::move(fields));
    } catch (const std::exception& e) {
      log::warn("dashboard: audit of {} for '{}' failed: {}", event, inst_.id, e.what());
    }
  }

  void finish() {
    std::call_once(finished_, [this] {
      reader_.request_stop();
      if (reader_.joinable()) reader_.join();
      audit_input(true);
      audit("desktop.view_closed", json::object());
    });
  }

  instances::Service& service_;
  store::Instance inst_;
  std::string actor_;
  UniqueFd sock_;
  std::shared_ptr<transport::WebSocketPeer> peer_;
  std::mutex mutex_;  // the filter and the audit counts
  desktop::RfbClientFilter filter_{true};
  desktop::RfbClientFilter::Counts audited_;
  std::chrono::steady_clock::time_point last_audit_{};
  std::once_flag finished_;
  std::jthread reader_;  // last: it goes first
};

transport::WebSocketOpen open_desktop(instances::Service& service, const transport::HttpRequest& request,
                                      const std::shared_ptr<transport::WebSocketPeer>& peer) {
  transport::WebSocketOpen open;
  const std::string id = instance_of(request.target, "/desktop/", "/vnc");
  if (id.empty()) {
    open.refusal = refusal(404, "not found: the live desktop is at /desktop/<instance>/vnc");
    return open;
  }
  const std::string actor = "dashboard (" + request.peer + ")";
  try {
    const store::Instance inst = service.store().get(id);
    UniqueFd sock = service.desktops().connect_vnc(inst, actor);
    service.store().audit(inst, "desktop.view_opened", actor, {{"view_only", true}});
    open.handler = std::make_shared<VncRelay>(service, inst, actor, std::move(sock), peer);
  } catch (const NotFound& e) {
    open.refusal = refusal(404, e.what());
  } catch (const UsageError& e) {
    open.refusal = refusal(409, e.what());  // its desktop is off, or cannot be on
  } catch (const std::exception& e) {
    open.refusal = refusal(503, fmt::format("the live desktop of '{}' cannot be reached: {}", id, e.what()));
  }
  // noVNC asks for the "binary" subprotocol.
  const auto offered = request.headers.find("sec-websocket-protocol");
  if (open.handler && offered != request.headers.end() && offered->second.find("binary") != std::string::npos)
    open.subprotocol = "binary";
  return open;
}

// ---- The terminal ------------------------------------------------------------------------------

class TerminalRelay final : public transport::WebSocketHandler {
 public:
  TerminalRelay(std::unique_ptr<instances::Terminal> terminal, std::shared_ptr<transport::WebSocketPeer> peer)
      : terminal_(std::move(terminal)), peer_(std::move(peer)) {
    reader_ = std::jthread([this](std::stop_token stop) { pump(stop); });
  }
  ~TerminalRelay() override { finish(); }

  void on_message(std::string data, bool binary) override {
    if (binary) {
      if (!write_all(terminal_->fd(), data)) peer_->close("the terminal does not take input");
      return;
    }
    const json m = control_message(data);
    if (m.contains("resize") && m["resize"].is_array() && m["resize"].size() == 2 && m["resize"][0].is_number_unsigned() &&
        m["resize"][1].is_number_unsigned()) {
      const auto rows = m["resize"][0].get<unsigned>(), cols = m["resize"][1].get<unsigned>();
      if (rows >= 2 && rows <= 1000 && cols >= 2 && cols <= 1000) {
        try {
          terminal_->resize(static_cast<unsigned short>(rows), static_cast<unsigned short>(cols));
        } catch (const std::exception& e) {
          log::debug("dashboard: terminal resize: {}", e.what());
        }
      }
    }
  }

  void on_close() override { finish(); }

 private:
  void pump(std::stop_token stop) {
    std::string buf(kReadChunk, '\0');
    while (!stop.stop_requested()) {
      pollfd p[2] = {{terminal_->fd(), POLLIN, 0}, {terminal_->wait_fd(), POLLIN, 0}};
      const int ready = ::poll(p, 2, 200);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        if (peer_->closed()) return;
        continue;
      }
      if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::read(terminal_->fd(), buf.data(), buf.size());
        if (n > 0) {
          if (!peer_->send(buf.substr(0, static_cast<std::size_t>(n)), true)) return;
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        // EIO: nothing holds the terminal any more.
      } else if (!(p[1].revents & POLLIN)) {
        continue;
      }
      const sandbox::ExitStatus status = terminal_->wait();
      peer_->send(json{{"exit", status.exit_code}}.dump(), false);
      peer_->close("the command ended");
      return;
    }
  }

  void finish() {
    std::call_once(finished_, [this] {
      reader_.request_stop();
      if (reader_.joinable()) reader_.join();
      terminal_.reset();  // ends what still runs of it, and audits
    });
  }

  std::unique_ptr<instances::Terminal> terminal_;
  std::shared_ptr<transport::WebSocketPeer> peer_;
  std::once_flag finished_;
  std::jthread reader_;
};

transport::WebSocketOpen open_terminal(instances::Service& service, const transport::HttpRequest& request,
                                       const std::shared_ptr<transport::WebSocketPeer>& peer) {
  transport::WebSocketOpen open;
  const std::string id = instance_of(request.target, "/terminal/", "");
  if (id.empty()) {
    open.refusal = refusal(404, "not found: a live terminal is at /terminal/<instance>");
    return open;
  }
  try {
    const store::Instance inst = service.store().get(id);
    instances::TerminalRequest want;
    want.rows = query_number(request.target, "rows", 24);
    want.cols = query_number(request.target, "cols", 80);
    open.handler = std::make_shared<TerminalRelay>(
        service.open_terminal(inst, want, "dashboard (" + request.peer + ")"), peer);
  } catch (const NotFound& e) {
    open.refusal = refusal(404, e.what());
  } catch (const UsageError& e) {
    open.refusal = refusal(409, e.what());  // e.g. too many terminals open
  } catch (const std::exception& e) {
    open.refusal = refusal(503, fmt::format("a terminal in '{}' cannot be opened: {}", id, e.what()));
  }
  return open;
}

}  // namespace

std::vector<transport::WebSocketRoute> relay_routes(instances::Service& service) {
  std::vector<transport::WebSocketRoute> routes;
  transport::WebSocketRoute desktop;
  desktop.prefix = "/desktop/";
  desktop.browser = true;
  desktop.max_message_bytes = desktop::kMaxCutText + 64 * 1024;  // a clipboard send is the largest
  desktop.max_per_peer = 8;
  desktop.max_connections = 64;
  desktop.open = [&service](const transport::HttpRequest& r, std::shared_ptr<transport::WebSocketPeer> peer) {
    return open_desktop(service, r, peer);
  };
  routes.push_back(std::move(desktop));
  transport::WebSocketRoute terminal;
  terminal.prefix = "/terminal/";
  terminal.browser = true;
  terminal.max_message_bytes = 64 * 1024;
  terminal.max_per_peer = 8;
  terminal.max_connections = 32;
  terminal.open = [&service](const transport::HttpRequest& r, std::shared_ptr<transport::WebSocketPeer> peer) {
    return open_terminal(service, r, peer);
  };
  routes.push_back(std::move(terminal));
  return routes;
}

}  // namespace nshpc::dashboard
