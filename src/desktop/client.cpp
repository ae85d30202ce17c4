#include "desktop/client.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/pidfd.hpp"
#include "base/text.hpp"

namespace nshpc::desktop {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// An agent error as the caller may show it: valid UTF-8, no control characters, 300 characters.
std::string clean_error(std::string_view error) {
  std::string text = text::sanitize_utf8(error);
  std::erase_if(text, [](char c) { return (c >= 0 && c < 0x20) || c == 0x7f; });
  const std::size_t cut = text::utf8_prefix_bytes(text, 300);
  if (cut < text.size()) text = text.substr(0, cut) + "…";
  if (text.empty()) text = "the display agent failed without saying why";
  return text;
}

// "5 s", "1.5 s", "200 ms".
std::string duration_text(std::chrono::milliseconds d) {
  if (d.count() < 1000) return fmt::format("{} ms", d.count());
  if (d.count() % 1000 == 0) return fmt::format("{} s", d.count() / 1000);
  return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
}

std::string ended_how(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (!WIFSIGNALED(status)) return "stopped";
  const int sig = WTERMSIG(status);
  return fmt::format("killed by signal {}{}", sig,
                     sig == SIGSYS    ? ", a system call its seccomp filter forbids"
                     : sig == SIGKILL ? ", perhaps at its memory limit"
                                      : "");
}

bool integer_in(const json& h, const char* key, long long lo, long long hi) {
  const auto it = h.find(key);
  return it != h.end() && it->is_number_integer() && it->get<long long>() >= lo && it->get<long long>() <= hi;
}

bool string_in(const json& h, const char* key) {
  const auto it = h.find(key);
  return it != h.end() && it->is_string();
}

constexpr long long kMaxSide = 8192;  // as the agent's (desktop/x11.hpp)
constexpr long long kMaxCoordinate = 1 << 20;

// What is wrong with a reply to `request`, or nullopt: the shape each op promises (wire.hpp).
std::optional<std::string> shape_problem(std::string_view op, const json& request, const Frame& reply) {
  const json& h = reply.header;
  const auto ok = h.find("ok");
  if (ok == h.end() || !ok->is_boolean()) return "no boolean 'ok'";
  if (!ok->get<bool>()) {
    if (!string_in(h, "error")) return "an error without its text";
    if (!reply.payload.empty()) return "an error with a payload";
    return std::nullopt;
  }
  if (op != "capture" && !reply.payload.empty()) return "a payload where none belongs";
  if (op == "hello") {
    if (!integer_in(h, "width", 1, kMaxSide) || !integer_in(h, "height", 1, kMaxSide) || !integer_in(h, "depth", 1, 32))
      return "no screen size";
  } else if (op == "capture") {
    const std::string asked =
        request.contains("format") && request["format"].is_string() ? request["format"].get<std::string>() : "jpeg";
    if (!string_in(h, "format") || h["format"] != asked) return "not the format asked for";
    if (!integer_in(h, "width", 1, kMaxSide) || !integer_in(h, "height", 1, kMaxSide)) return "no image size";
    for (const char* side : {"width", "height"})
      if (request.contains(side) && request[side].is_number_integer() && request[side] != h[side])
        return "not the size asked for";
    const std::string_view magic =
        asked == "png" ? std::string_view("\x89PNG\r\n\x1a\n", 8) : std::string_view("\xff\xd8\xff", 3);
    if (!reply.payload.starts_with(magic)) return fmt::format("a payload that is not a {} image", asked);
  } else if (op == "info") {
    if (!integer_in(h, "width", 1, kMaxSide) || !integer_in(h, "height", 1, kMaxSide)) return "no screen size";
    const auto cursor = h.find("cursor");
    if (cursor == h.end() || !cursor->is_array() || cursor->size() != 2 || !(*cursor)[0].is_number_integer() ||
        !(*cursor)[1].is_number_integer())
      return "no cursor position";
    const auto focused = h.find("focused");
    if (focused == h.end() ||
        (!focused->is_null() && !(focused->is_object() && string_in(*focused, "id") && string_in(*focused, "title") &&
                                  string_in(*focused, "wm_class"))))
      return "no focused window (or null)";
  } else if (op == "type") {
    if (!integer_in(h, "characters", 0, 1 << 30)) return "no count of characters";
  } else if (op == "windows") {
    const auto list = h.find("windows");
    if (list == h.end() || !list->is_array() || list->size() > 4096) return "no list of windows";
    for (const json& w : *list) {
      if (!w.is_object() || !string_in(w, "id") || !string_in(w, "title") || !string_in(w, "wm_class"))
        return "a window without id, title or class";
      for (const char* key : {"x", "y", "width", "height"})
        if (!integer_in(w, key, -kMaxCoordinate, kMaxCoordinate)) return "a window without its geometry";
      const auto desktop = w.find("desktop");
      if (desktop == w.end() || !(desktop->is_null() || desktop->is_number_integer()))
        return "a window without its desktop";
      const auto active = w.find("active");
      const auto states = w.find("states");
      if (active == w.end() || !active->is_boolean() || states == w.end() || !states->is_array() ||
          !std::all_of(states->begin(), states->end(), [](const json& s) { return s.is_string(); }))
        return "a window without its state";
    }
  } else if (op == "clipboard_get") {
    if (!string_in(h, "text")) return "no text";
  }
  return std::nullopt;
}

}  // namespace

std::unique_ptr<Agent> Agent::start(UniqueFd x_socket, std::string_view cookie, const AgentOptions& options,
                                    std::chrono::milliseconds deadline) {
  const auto until = Clock::now() + deadline;
  if (cookie.size() != 16) throw Error("the desktop's X cookie must be 16 bytes (MIT-MAGIC-COOKIE-1)");
  if (!x_socket) throw Error("no connection to the desktop's X server to start its display agent on");
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
    throw SysError(errno, "socketpair", "the display agent's control socket");
  UniqueFd ours(pair[0]), theirs(pair[1]);
  // Non-blocking on this side: every read and write waits in poll, bounded by a deadline.
  if (::fcntl(ours.get(), F_SETFL, O_NONBLOCK) < 0)
    throw SysError(errno, "fcntl(O_NONBLOCK)", "the display agent's control socket");
  UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!devnull) throw SysError(errno, "open", "/dev/null (the display agent's standard streams)");

  SpawnSpec spec;
  spec.program = options.program.empty() ? fs::self_program("the display agent") : options.program;
  spec.argv = {spec.program, std::string(kAgentCommand), "--x-fd", "3", "--control-fd", "4"};
  spec.envp = std::vector<std::string>{};
  spec.fds = {{devnull.get(), 0}, {devnull.get(), 1}, {devnull.get(), 2}, {x_socket.get(), 3}, {theirs.get(), 4}};
  spec.rlimits = {{RLIMIT_AS, static_cast<rlim_t>(options.max_memory)}, {RLIMIT_CORE, 0}};
  spec.drop_to = options.identity;
  spec.die_with_parent = SIGKILL;

  std::unique_ptr<Agent> agent(new Agent);
  agent->child_ = spawn(spec);
  agent->control_ = std::move(ours);
  agent->alive_ = true;
  agent->pid_ = agent->child_.pid();
  theirs.reset();
  x_socket.reset();

  std::string hex;
  for (unsigned char c : cookie) hex += fmt::format("{:02x}", c);
  Frame hello;
  try {
    hello = agent->exchange({{"op", "hello"}, {"cookie", hex}}, until, deadline);
  } catch (const Error&) {
    if (Clock::now() >= until)
      throw Error(fmt::format("the desktop's X server did not answer within {} (its display agent was stopped)",
                              duration_text(deadline)));
    throw;
  }
  agent->width_ = hello.header["width"].get<int>();
  agent->height_ = hello.header["height"].get<int>();
  return agent;
}

Agent::~Agent() { stop(); }

void Agent::stop(std::string* why) {
  alive_ = false;
  pid_ = -1;
  // Whether it ended on its own is asked before its socket closes (which would end it).
  if (why && child_.pidfd() >= 0 && wait_pidfd(child_.pidfd(), std::chrono::milliseconds(100))) {
    try {
      *why = ended_how(child_.wait("the display agent"));
    } catch (const Error&) {
    }
  }
  control_.reset();
  child_ = SpawnedChild{};  // kills and reaps it, unless it was reaped above
}

Frame Agent::exchange(const json& request, Clock::time_point until, std::chrono::milliseconds deadline) {
  const std::string op = request.contains("op") && request["op"].is_string() ? request["op"].get<std::string>() : "?";
  Frame reply;
  try {
    write_frame(control_.get(), request, {}, until);
    reply = read_frame(control_.get(), until);
  } catch (const Error& e) {
    const bool late = Clock::now() >= until;
    std::string how;
    stop(late ? nullptr : &how);
    if (late)
      throw Error(
          fmt::format("the display agent did not answer '{}' within {} and was stopped (the desktop's X "
                      "server may be stuck)",
                      op, duration_text(deadline)));
    if (!how.empty()) throw Error(fmt::format("the display agent ended during '{}' ({})", op, how));
    throw Error(fmt::format("the display agent broke the wire answering '{}' ({}) and was stopped", op, e.what()));
  }
  if (const auto problem = shape_problem(op, request, reply)) {
    stop();
    throw Error(fmt::format("the display agent sent a malformed reply to '{}' ({}) and was stopped", op, *problem));
  }
  if (!reply.header["ok"].get<bool>()) throw Error(clean_error(reply.header["error"].get<std::string>()));
  return reply;
}

Frame Agent::call(const json& request, std::chrono::milliseconds deadline) {
  const auto until = Clock::now() + deadline;
  std::unique_lock lock(mutex_, std::defer_lock);
  if (!lock.try_lock_until(until))
    throw Error(fmt::format("the desktop's display agent was busy with another request for {}; try again",
                            duration_text(deadline)));
  if (!alive_) throw Error("the desktop's display agent was stopped after an earlier failure; restart the desktop");
  if (!request.is_object()) throw Error("a display agent request is a JSON object");
  return exchange(request, until, deadline);
}

}  // namespace nshpc::desktop
