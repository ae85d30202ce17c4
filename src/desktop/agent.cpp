#include "desktop/agent.hpp"

#include <fcntl.h>
#include <poll.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/json.hpp"
#include "desktop/keys.hpp"
#include "desktop/wire.hpp"
#include "desktop/x11.hpp"

namespace nshpc::desktop {

namespace {

using nlohmann::json;

// A request the server sends arrives whole at once; this bounds a stalled one.
constexpr std::chrono::seconds kRequestRead{10};
// Bounds of a request: `input` events, the time one request may sleep, typed characters.
constexpr std::size_t kMaxEvents = 10000;
constexpr int kMaxSleepMs = 300000;
constexpr std::size_t kMaxTyped = 100000;

bool parse_fd(std::string_view text, int& fd) {
  return !text.empty() && std::from_chars(text.data(), text.data() + text.size(), fd).ec == std::errc() && fd > 2;
}

// Closes every descriptor but `a` and `b`.
void close_all_but(int a, int b) {
  const int lo = std::min(a, b), hi = std::max(a, b);
  if (lo > 0) ::close_range(0, static_cast<unsigned>(lo - 1), 0);
  if (hi > lo + 1) ::close_range(static_cast<unsigned>(lo + 1), static_cast<unsigned>(hi - 1), 0);
  ::close_range(static_cast<unsigned>(hi + 1), ~0u, 0);
}

// The agent's filter, the system calls it was seen to make under its tests (strace) and no
// more: reads and writes on the descriptors it has (xcb reads with recv and recvmsg and writes
// with writev; the wire sends with send, xcb's refusal goes to standard error with write), poll,
// memory that is never executable, futex, the clock, close, exit. xcb sets its socket
// non-blocking with fcntl, and shuts it down when a connection attempt fails. restart_syscall
// and rt_sigreturn are the kernel's own (a poll resumed after a stop). Anything else kills the
// process: no open, no socket, no connect, no exec, no new thread.
bool confine() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
  if (!ctx) return false;
  bool ok = true;
  for (int nr : {SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(writev), SCMP_SYS(recvfrom), SCMP_SYS(recvmsg),
                 SCMP_SYS(sendto), SCMP_SYS(poll), SCMP_SYS(brk), SCMP_SYS(munmap), SCMP_SYS(mremap), SCMP_SYS(madvise),
                 SCMP_SYS(futex), SCMP_SYS(clock_gettime), SCMP_SYS(close), SCMP_SYS(shutdown), SCMP_SYS(exit),
                 SCMP_SYS(exit_group), SCMP_SYS(rt_sigreturn), SCMP_SYS(restart_syscall)})
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) == 0;
  for (int cmd : {F_GETFL, F_SETFL, F_GETFD, F_SETFD})
    ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(fcntl), 1,
                                SCMP_A1(SCMP_CMP_EQ, static_cast<scmp_datum_t>(cmd))) == 0;
  ok = ok && seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1, SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0)) == 0;
  ok = ok && seccomp_load(ctx) == 0;
  seccomp_release(ctx);
  return ok;
}

// ---- request fields

[[noreturn]] void bad(std::string_view op, std::string message) { throw Error(fmt::format("{}: {}", op, message)); }

int integer(std::string_view op, const json& h, const char* key, int lo, int hi, std::optional<int> fallback = {}) {
  const auto it = h.find(key);
  if (it == h.end() || it->is_null()) {
    if (fallback) return *fallback;
    bad(op, fmt::format("'{}' is missing", key));
  }
  if (!it->is_number_integer() || it->get<long long>() < lo || it->get<long long>() > hi)
    bad(op, fmt::format("'{}' must be an integer from {} to {}", key, lo, hi));
  return static_cast<int>(it->get<long long>());
}

std::string string_field(std::string_view op, const json& h, const char* key) {
  const auto it = h.find(key);
  if (it == h.end() || !it->is_string()) bad(op, fmt::format("'{}' must be a string", key));
  return it->get<std::string>();
}

std::string window_id(std::uint32_t id) { return fmt::format("0x{:x}", id); }

json window_json(const x11::WindowInfo& w) {
  json desktop = nullptr;
  if (w.desktop == 0xFFFFFFFFL)
    desktop = -1;  // on every desktop
  else if (w.desktop >= 0)
    desktop = w.desktop;
  return {{"id", window_id(w.id)}, {"title", w.title},   {"wm_class", w.wm_class},
          {"desktop", desktop},    {"x", w.x},           {"y", w.y},
          {"width", w.width},      {"height", w.height}, {"active", w.active},
          {"states", w.states}};
}

// ---- the session

class Session {
 public:
  Session(int x_fd, int refusal_fd) : x_fd_(x_fd), refusal_fd_(refusal_fd) {}

  bool connected() const { return display_ != nullptr; }
  int x_fd() const { return display_ ? display_->fd() : -1; }
  void serve_events() {
    if (display_) display_->serve_events();
  }

  // One request; the reply header (and payload).
  json handle(const json& request, std::string& payload) {
    const auto op_it = request.find("op");
    if (op_it == request.end() || !op_it->is_string()) throw Error("a request without an 'op'");
    const std::string op = op_it->get<std::string>();
    if (op == "hello") return hello(request);
    if (!display_) throw Error(fmt::format("{}: the agent is not connected to X yet (hello first)", op));
    if (op == "info") return info();
    if (op == "capture") return capture(request, payload);
    if (op == "input") return input(request);
    if (op == "type") return type(request);
    if (op == "windows") {
      json list = json::array();
      for (const auto& w : display_->windows()) list.push_back(window_json(w));
      return {{"windows", std::move(list)}};
    }
    if (op == "window") return window(request);
    if (op == "clipboard_get") return {{"text", display_->clipboard_get()}};
    if (op == "clipboard_set") {
      display_->clipboard_set(string_field(op, request, "text"));
      return json::object();
    }
    throw Error(fmt::format("'{}' is not a request of the display agent", op));
  }

 private:
  json hello(const json& request) {
    if (display_ || x_fd_ < 0) throw Error("hello: the X connection was tried already");
    const std::string hex = string_field("hello", request, "cookie");
    if (hex.size() != 32) bad("hello", "'cookie' must be 32 hexadecimal digits");
    std::string cookie;
    for (std::size_t i = 0; i < 32; i += 2) {
      unsigned value = 0;
      if (std::from_chars(hex.data() + i, hex.data() + i + 2, value, 16).ec != std::errc())
        bad("hello", "'cookie' must be 32 hexadecimal digits");
      cookie += static_cast<char>(value);
    }
    const int fd = x_fd_;
    x_fd_ = -1;  // the Display's from here, whatever happens
    display_ = x11::Display::connect(fd, cookie, refusal_fd_);
    return {{"width", display_->width()}, {"height", display_->height()}, {"depth", display_->depth()}};
  }

  json info() {
    const auto pointer = display_->pointer();
    const auto focused = display_->focused();
    json f = nullptr;
    if (focused) f = {{"id", window_id(focused->id)}, {"title", focused->title}, {"wm_class", focused->wm_class}};
    return {{"width", display_->width()},
            {"height", display_->height()},
            {"cursor", {pointer.x, pointer.y}},
            {"focused", std::move(f)}};
  }

  json capture(const json& r, std::string& payload) {
    constexpr std::string_view op = "capture";
    x11::CaptureRequest c;
    const auto format = r.find("format");
    if (format != r.end() && !format->is_null()) {
      if (*format == "png")
        c.png = true;
      else if (*format != "jpeg")
        bad(op, "'format' must be \"jpeg\" or \"png\"");
    }
    c.quality = integer(op, r, "quality", 1, 100, 75);
    const int sw = display_->width(), sh = display_->height();
    c.x1 = sw;
    c.y1 = sh;
    if (const auto region = r.find("region"); region != r.end() && !region->is_null()) {
      if (!region->is_array() || region->size() != 4 ||
          !std::all_of(region->begin(), region->end(), [](const json& v) { return v.is_number_integer(); }))
        bad(op, "'region' must be [x0, y0, x1, y1] (integers)");
      const auto v = [&](std::size_t i) { return std::clamp<long long>((*region)[i].get<long long>(), -1, 1 << 20); };
      c.x0 = static_cast<int>(v(0));
      c.y0 = static_cast<int>(v(1));
      c.x1 = static_cast<int>(v(2));
      c.y1 = static_cast<int>(v(3));
      if (c.x0 < 0 || c.y0 < 0 || c.x0 >= c.x1 || c.y0 >= c.y1 || c.x1 > sw || c.y1 > sh)
        bad(op, fmt::format("'region' [{}, {}, {}, {}] is not inside the {}x{} screen (0 <= x0 < x1 <= {}, 0 <= y0 < "
                            "y1 <= {})",
                            c.x0, c.y0, c.x1, c.y1, sw, sh, sw, sh));
    }
    const int rw = c.x1 - c.x0, rh = c.y1 - c.y0;
    const auto width = r.find("width"), height = r.find("height");
    const bool has_w = width != r.end() && !width->is_null(), has_h = height != r.end() && !height->is_null();
    c.width = has_w ? integer(op, r, "width", 1, x11::kMaxSide) : rw;
    c.height = has_h ? integer(op, r, "height", 1, x11::kMaxSide) : rh;
    // One side given: the other keeps the region's proportions.
    if (has_w && !has_h)
      c.height = std::clamp(static_cast<int>((static_cast<long long>(rh) * c.width + rw / 2) / rw), 1, x11::kMaxSide);
    if (has_h && !has_w)
      c.width = std::clamp(static_cast<int>((static_cast<long long>(rw) * c.height + rh / 2) / rh), 1, x11::kMaxSide);
    payload = display_->capture(c);
    return {{"format", c.png ? "png" : "jpeg"}, {"width", c.width}, {"height", c.height}};
  }

  json input(const json& r) {
    constexpr std::string_view op = "input";
    const auto events = r.find("events");
    if (events == r.end() || !events->is_array()) bad(op, "'events' must be an array");
    if (events->size() > kMaxEvents)
      bad(op, fmt::format("{} events; at most {} a request", events->size(), kMaxEvents));
    std::vector<x11::InputEvent> out;
    long long slept = 0;
    for (std::size_t i = 0; i < events->size(); ++i) {
      const json& e = (*events)[i];
      const std::string at = fmt::format("input: event {}", i);
      if (!e.is_object() || e.size() < 1) bad(at, "an event is an object");
      x11::InputEvent ev;
      const auto down = [&] {
        const auto d = e.find("down");
        if (d == e.end() || !d->is_boolean()) bad(at, "'down' must be true or false");
        return d->get<bool>();
      };
      if (const auto move = e.find("move"); move != e.end()) {
        if (!move->is_array() || move->size() != 2 || !(*move)[0].is_number_integer() ||
            !(*move)[1].is_number_integer())
          bad(at, "'move' must be [x, y] (integers)");
        const long long x = (*move)[0].get<long long>(), y = (*move)[1].get<long long>();
        if (x < 0 || y < 0 || x >= display_->width() || y >= display_->height())
          bad(at, fmt::format("({}, {}) is off the {}x{} screen", x, y, display_->width(), display_->height()));
        ev.kind = x11::InputEvent::Kind::move;
        ev.x = static_cast<int>(x);
        ev.y = static_cast<int>(y);
      } else if (e.contains("button")) {
        ev.kind = x11::InputEvent::Kind::button;
        ev.button = integer(at, e, "button", 1, 7);
        ev.down = down();
      } else if (const auto key = e.find("key"); key != e.end()) {
        if (!key->is_number_integer() || key->get<long long>() < 1 || key->get<long long>() > 0x1fffffff)
          bad(at, "'key' must be a keysym (an integer from 1 to 0x1fffffff)");
        ev.kind = x11::InputEvent::Kind::key;
        ev.keysym = key->get<std::uint32_t>();
        ev.down = down();
      } else if (e.contains("sleep_ms")) {
        ev.kind = x11::InputEvent::Kind::sleep;
        ev.sleep_ms = integer(at, e, "sleep_ms", 0, kMaxSleepMs);
        slept += ev.sleep_ms;
        if (slept > kMaxSleepMs) bad(op, fmt::format("the events sleep more than {} ms in all", kMaxSleepMs));
      } else {
        bad(at,
            "an event is {\"move\": [x, y]}, {\"button\": N, \"down\": B}, {\"key\": KEYSYM, \"down\": B} or "
            "{\"sleep_ms\": N}");
      }
      out.push_back(ev);
    }
    const auto release = r.find("release");
    if (release != r.end() && !release->is_boolean()) bad(op, "'release' must be true or false");
    display_->input(out, release != r.end() && !release->get<bool>());
    return json::object();
  }

  json type(const json& r) {
    constexpr std::string_view op = "type";
    const std::string text = string_field(op, r, "text");
    const int delay = integer(op, r, "delay_ms", 0, 100, 0);
    auto cps = code_points(text);
    if (!cps) bad(op, "'text' is not valid UTF-8");
    // "\r\n" is one line break; a lone "\r" one too.
    std::u32string typed;
    for (std::size_t i = 0; i < cps->size(); ++i) {
      const char32_t cp = (*cps)[i];
      if (cp == U'\r') {
        if (i + 1 < cps->size() && (*cps)[i + 1] == U'\n') continue;
        typed += U'\n';
        continue;
      }
      if ((cp < 0x20 && cp != U'\n' && cp != U'\t') || (cp >= 0x7f && cp < 0xa0))
        bad(op, fmt::format("character {} is the control character U+{:04X}; only newline and tab are typed", i + 1,
                            static_cast<std::uint32_t>(cp)));
      typed += cp;
    }
    if (typed.size() > kMaxTyped) bad(op, fmt::format("{} characters; at most {} a request", typed.size(), kMaxTyped));
    display_->type(typed, std::chrono::milliseconds(delay));
    return {{"characters", typed.size()}};
  }

  json window(const json& r) {
    constexpr std::string_view op = "window";
    const std::string id_text = string_field(op, r, "id");
    std::uint32_t id = 0;
    if (id_text.size() < 3 || id_text.size() > 10 || !id_text.starts_with("0x") ||
        std::from_chars(id_text.data() + 2, id_text.data() + id_text.size(), id, 16).ptr !=
            id_text.data() + id_text.size())
      bad(op, fmt::format("'id' must be a window id such as \"0x1e00003\" (windows lists them), not \"{}\"", id_text));
    const std::string action = string_field(op, r, "action");
    static constexpr std::pair<std::string_view, x11::WindowAction> kActions[] = {
        {"activate", x11::WindowAction::activate}, {"maximize", x11::WindowAction::maximize},
        {"minimize", x11::WindowAction::minimize}, {"restore", x11::WindowAction::restore},
        {"close", x11::WindowAction::close},       {"move", x11::WindowAction::move}};
    const auto found =
        std::find_if(std::begin(kActions), std::end(kActions), [&](const auto& a) { return a.first == action; });
    if (found == std::end(kActions))
      bad(op, fmt::format("'action' is one of activate, maximize, minimize, restore, close, move; not \"{}\"", action));
    x11::MoveTo move;
    if (found->second == x11::WindowAction::move) {
      move.x = integer(op, r, "x", -x11::kMaxSide, x11::kMaxSide);
      move.y = integer(op, r, "y", -x11::kMaxSide, x11::kMaxSide);
      if (r.contains("width") && !r["width"].is_null()) move.width = integer(op, r, "width", 1, x11::kMaxSide);
      if (r.contains("height") && !r["height"].is_null()) move.height = integer(op, r, "height", 1, x11::kMaxSide);
    }
    display_->window_action(id, found->second, move);
    return json::object();
  }

  int x_fd_;
  int refusal_fd_;
  std::unique_ptr<x11::Display> display_;
};

}  // namespace

int agent_main(int argc, char** argv) {
  int x_fd = -1, control_fd = -1;
  if (argc != 6 || std::string_view(argv[2]) != "--x-fd" || !parse_fd(argv[3], x_fd) ||
      std::string_view(argv[4]) != "--control-fd" || !parse_fd(argv[5], control_fd) || x_fd == control_fd) {
    std::fprintf(stderr, "usage: ns-hpc %s --x-fd N --control-fd M (N, M > 2; started by the server)\n",
                 std::string(kAgentCommand).c_str());
    return 2;
  }
  // No core, no new privileges, nothing but the two sockets; then a pipe on descriptors 0 and 1,
  // its writing end also standard error, where xcb writes an X server's refusal; then no
  // descriptor can be made at all, not even one an X server passes in a message: a new one would
  // need a number below RLIMIT_NOFILE, 2 (poll needs that many), and 0 and 1 stay taken. Then the
  // filter, before X is spoken to.
  ::prctl(PR_SET_DUMPABLE, 0);
  const bool no_new_privs = ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
  close_all_but(x_fd, control_fd);
  int refusal[2] = {-1, -1};
  if (::pipe2(refusal, O_NONBLOCK | O_CLOEXEC) == 0) ::dup2(refusal[1], STDERR_FILENO);
  const rlimit two{2, 2}, none{0, 0};
  ::setrlimit(RLIMIT_NOFILE, &two);
  ::setrlimit(RLIMIT_CORE, &none);
  const bool confined = no_new_privs && confine();

  Session session(x_fd, refusal[0]);
  for (;;) {
    try {
      session.serve_events();
    } catch (const std::exception&) {
      // A broken connection: said in the reply to the next request.
    }
    pollfd fds[2] = {{control_fd, POLLIN, 0}, {session.x_fd(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (fds[0].revents & POLLNVAL) return 1;  // no control socket at all
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Frame request;
    try {
      request = read_frame(control_fd, std::chrono::steady_clock::now() + kRequestRead);
    } catch (const std::exception&) {
      return 0;  // the server closed the control socket (or broke the framing): done
    }
    json reply;
    std::string payload;
    try {
      if (!confined) throw Error("the display agent could not confine itself (no_new_privs and a seccomp filter)");
      reply = session.handle(request.header, payload);
      reply["ok"] = true;
    } catch (const std::bad_alloc&) {
      payload.clear();
      reply = {{"ok", false}, {"error", "the display agent ran out of memory"}};
    } catch (const std::exception& e) {
      payload.clear();
      reply = {{"ok", false}, {"error", e.what()}};
    }
    try {
      write_frame(control_fd, reply, payload);
    } catch (const std::exception&) {
      return 0;
    }
    if (!confined) return 1;
  }
}

}  // namespace nshpc::desktop
