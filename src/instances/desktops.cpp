// The desktops of living instances: the setting, the session at each start, and the display
// agent each instance's screen is read and driven through.
#include "instances/desktops.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "base/text.hpp"
#include "desktop/atspi.hpp"
#include "desktop/client.hpp"
#include "desktop/session.hpp"
#include "instances/instances.hpp"
#include "sandbox/images.hpp"

namespace nshpc::instances {

namespace stdfs = std::filesystem;

namespace {

constexpr std::string_view kCookieFile = "desktop.cookie";  // in the instance's host-only state folder
constexpr std::size_t kCookieBytes = 16;
constexpr std::chrono::seconds kVncWait{10};  // for x11vnc's socket, once the session runs

// `path` (absolute inside the sandbox) beneath the sandbox's root, opened O_PATH without following
// any link: a link the sandbox planted never leads this process to a host file. -1 with errno set.
int open_beneath(int root, std::string_view path) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC | O_NOFOLLOW;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const std::string relative(path.substr(1));
  return static_cast<int>(::syscall(SYS_openat2, root, relative.c_str(), &how, sizeof how));
}

bool exists_beneath(int root, std::string_view path) { return UniqueFd(open_beneath(root, path)).get() >= 0; }

// A socket of the sandbox (`what`: "the display", "the live view") beneath its root, checked to be a
// socket of the sandbox's uid, then connected through /proc/self/fd: the path the kernel resolves
// is that very inode. Within 5 s; the socket is returned blocking.
UniqueFd connect_beneath(int root, uid_t owner, std::string_view path, std::string_view what,
                         const std::string& instance) {
  UniqueFd found(open_beneath(root, path));
  if (!found) {
    const int err = errno;
    if (err == ENOENT) throw SysError(err, fmt::format("find {} of instance '{}'", what, instance), std::string(path));
    throw SysError(err, fmt::format("open {} of instance '{}' ({}: something other than its socket is in its place)",
                                    what, instance, path));
  }
  struct stat st {};
  if (::fstat(found.get(), &st) < 0) throw SysError(errno, "stat", std::string(path));
  if (!S_ISSOCK(st.st_mode) || st.st_uid != owner)
    throw Error(fmt::format("instance '{}': {} is not the socket of {} (not a socket of the sandbox's user); "
                            "switch the desktop off and on again",
                            instance, path, what));
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock) throw SysError(errno, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string proc = fmt::format("/proc/self/fd/{}", found.get());
  std::memcpy(addr.sun_path, proc.c_str(), proc.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) < 0) {
    if (errno != EINPROGRESS && errno != EAGAIN)
      throw SysError(errno, fmt::format("connect to {} of instance '{}'", what, instance));
    pollfd p{sock.get(), POLLOUT, 0};
    if (::poll(&p, 1, 5000) <= 0)
      throw Error(fmt::format("instance '{}': {} accepts no connection (5 s)", instance, what));
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) throw SysError(err, fmt::format("connect to {} of instance '{}'", what, instance));
  }
  const int flags = ::fcntl(sock.get(), F_GETFL);
  ::fcntl(sock.get(), F_SETFL, flags & ~O_NONBLOCK);
  return sock;
}

// An Xauthority file of one entry: any address (FamilyWild), display 0, MIT-MAGIC-COOKIE-1.
std::string xauthority_entry(std::string_view cookie) {
  std::string out;
  auto field = [&out](std::string_view bytes) {
    out.push_back(static_cast<char>((bytes.size() >> 8) & 0xff));
    out.push_back(static_cast<char>(bytes.size() & 0xff));
    out.append(bytes);
  };
  out.push_back(static_cast<char>(0xff));
  out.push_back(static_cast<char>(0xff));
  field("");
  field(desktop::kDisplay.substr(1));
  field("MIT-MAGIC-COOKIE-1");
  field(cookie);
  return out;
}

// A session that has just started shows a black screen until its window manager, panel and desktop
// have mapped their windows: what a new agent is asked first waits for them (at most 10 s; a
// session without windows is served after that), and for their first paint.
void await_windows(desktop::Agent& agent) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (bool waited = false;; waited = true) {
    const desktop::Frame windows = agent.call({{"op", "windows"}}, std::chrono::seconds(5));
    const auto list = windows.header.find("windows");
    if (list != windows.header.end() && list->is_array() && !list->empty()) {
      if (waited) std::this_thread::sleep_for(std::chrono::milliseconds(700));
      return;
    }
    if (std::chrono::steady_clock::now() > until) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Whether the agent's X server still answers (after a request failed).
bool display_answers(desktop::Agent& agent) {
  try {
    agent.call({{"op", "info"}}, std::chrono::seconds(2));
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool read_only(const nlohmann::json& request) {
  const std::string op = request.value("op", "");
  return op == "info" || op == "capture" || op == "windows" || op == "clipboard_get";
}

}  // namespace

Desktops::Desktops(Service& service) : service_(service) {}
Desktops::~Desktops() = default;

int Desktops::width() const { return static_cast<int>(service_.config().desktop.width); }
int Desktops::height() const { return static_cast<int>(service_.config().desktop.height); }

std::optional<DesktopUnavailable> Desktops::unavailable(const store::Instance& inst) const {
  using Why = DesktopUnavailable::Why;
  if (!inst.persistent)
    return DesktopUnavailable(Why::ephemeral,
                              fmt::format("instance '{}' is not persistent: each command gets a fresh sandbox, so a "
                                          "desktop has nowhere to live (update_instance persistent=true, or create "
                                          "one with desktop=true)",
                                          inst.id));
  if (inst.image) {
    const std::string& image = inst.image->image;  // name@version
    const auto at = image.find('@');
    const sandbox::ImageStore images(service_.config().ns.images_dir);
    const auto version = images.find(image.substr(0, at), at == std::string::npos ? "" : image.substr(at + 1));
    if (version && version->desktop) return std::nullopt;
    return DesktopUnavailable(Why::root, fmt::format("instance '{}' runs on image {}, which has no desktop (built "
                                                     "without --desktop)",
                                                     inst.id, image));
  }
  if (service_.config().desktop.host_root) return std::nullopt;
  return DesktopUnavailable(Why::root, fmt::format("instance '{}' runs on the host's root, which runs no desktop "
                                                   "([desktop] host_root is off)",
                                                   inst.id));
}

std::string Desktops::xauthority(const store::Instance& inst) const {
  const stdfs::path file = inst.state_dir() / kCookieFile;
  if (auto cookie = fs::read_file(file); cookie && cookie->size() == kCookieBytes) return xauthority_entry(*cookie);
  // Made once, by whichever process gets there first (link() never replaces one another made).
  fs::make_dirs(inst.state_dir(), 0700);
  const stdfs::path temporary = inst.state_dir() / fmt::format(".{}.{}", kCookieFile, random::hex(8));
  std::string fresh(kCookieBytes, '\0');
  random::fill(std::as_writable_bytes(std::span<char>(fresh)));
  fs::atomic_write(temporary, fresh, 0600);
  if (::link(temporary.c_str(), file.c_str()) < 0 && errno != EEXIST) {
    const int err = errno;
    ::unlink(temporary.c_str());
    throw SysError(err, "link", file.string());
  }
  ::unlink(temporary.c_str());
  auto cookie = fs::read_file(file);
  if (!cookie || cookie->size() != kCookieBytes)
    throw Error(fmt::format("{} is not a desktop cookie of {} bytes; remove it (a new one is made)", file.string(),
                            kCookieBytes));
  return xauthority_entry(*cookie);
}

void Desktops::decorate(const store::Instance& inst, sandbox::Target& target) const {
  if (!inst.meta.desktop() || unavailable(inst)) return;
  target.env = desktop::session_env();
  target.on_start = sandbox::Target::OnStart{desktop::start_command({width(), height(), 24}), xauthority(inst),
                                             std::chrono::seconds(60)};
}

void Desktops::start_session(const store::Instance& inst) {
  sandbox::ExecSpec spec =
      service_.command(inst, Service::Command::person, desktop::start_command({width(), height(), 24}));
  sandbox::CaptureOptions options;
  options.input = xauthority(inst);
  options.timeout = std::chrono::seconds(60);
  options.output_cap = 64 * 1024;
  const sandbox::CaptureResult result = service_.run_captured(inst, std::move(spec), options, "the desktop's start");
  if (result.ending == sandbox::Ending::timed_out)
    throw Error(fmt::format("the desktop of instance '{}' did not start within 60 s", inst.id));
  if (result.status.exit_code != 0) {
    const std::string why = text::truncate_utf8(text::sanitize_utf8(text::trim(result.err)), 500);
    throw Error(fmt::format("the desktop of instance '{}' did not start: {}", inst.id,
                            why.empty() ? fmt::format("exit {}", result.status.exit_code) : why));
  }
}

void Desktops::ensure_running(const store::Instance& inst, std::string_view actor) {
  if (!inst.meta.desktop())
    throw DesktopOff(fmt::format("the desktop of instance '{}' is off", inst.id));
  if (auto why = unavailable(inst)) throw *why;
  if (!service_.running(inst)) service_.start(inst, actor);  // its start runs the session
  start_session(inst);  // idempotent: says "running" when the start did it
}

store::Instance Desktops::set(const store::Instance& inst, bool on, std::string_view actor) {
  if (on) {
    if (auto why = unavailable(inst)) throw *why;
  }
  store::UpdateOptions update;
  update.desktop = on;
  const bool changed = inst.meta.desktop() != on;
  store::Instance now = changed ? service_.update(inst.id, update, actor) : inst;
  {
    std::lock_guard lock(mutex_);
    agents_.erase(inst.id);
  }
  if (on) {
    ensure_running(now, actor);
  } else if (service_.running(now)) {
    sandbox::ExecSpec spec = service_.command(now, Service::Command::person, desktop::stop_command());
    sandbox::CaptureOptions options;
    options.timeout = std::chrono::seconds(30);
    options.output_cap = 64 * 1024;
    service_.run_captured(now, std::move(spec), options, "the desktop's stop");
  }
  if (changed) service_.store().audit(now, on ? "desktop.on" : "desktop.off", actor, {{"instance_id", now.id}});
  return now;
}

std::shared_ptr<desktop::Agent> Desktops::connect(const store::Instance& inst, std::string_view actor) {
  const sandbox::Target target = service_.target(inst);
  const std::optional<users::Identity> identity = service_.backend().runs_as(target);
  const uid_t owner = identity ? identity->uid : ::geteuid();
  for (int attempt = 0;; ++attempt) {
    UniqueFd socket;
    {
      // Held only while the socket is found: the gate (no snapshot meanwhile), activity.
      sandbox::LivingRoot held = service_.backend().living_root(target);
      if (held.started) service_.store().audit(inst, "instance.started", actor, {{"instance_id", inst.id}});
      try {
        socket = connect_beneath(held.root.get(), owner, desktop::kXSocket, "the display", inst.id);
      } catch (const SysError& e) {
        if (e.code() != ENOENT || attempt > 0) throw;
      }
    }
    if (!socket) {
      start_session(inst);  // the session did not run in this sandbox (its start failed, or it ended)
      continue;
    }
    const std::string auth = xauthority(inst);
    desktop::AgentOptions options;
    options.identity = identity;
    return desktop::Agent::start(std::move(socket), auth.substr(auth.size() - kCookieBytes), options,
                                 std::chrono::seconds(5));
  }
}

desktop::Frame Desktops::call(const store::Instance& inst, const nlohmann::json& request, std::string_view actor,
                              std::chrono::milliseconds deadline) {
  if (!inst.meta.desktop())
    throw DesktopOff(fmt::format("the desktop of instance '{}' is off", inst.id));
  if (auto why = unavailable(inst)) throw *why;
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<desktop::Agent> agent;
    {
      std::lock_guard lock(mutex_);
      auto it = agents_.find(inst.id);
      if (it != agents_.end() && it->second->alive()) agent = it->second;
    }
    if (!agent) {
      agent = connect(inst, actor);
      await_windows(*agent);
      std::lock_guard lock(mutex_);
      agents_[inst.id] = agent;
    }
    try {
      return agent->call(request, deadline);
    } catch (const Error&) {
      // An agent whose X server went away (its sandbox stopped or restarted: what it sends goes
      // nowhere) is replaced and the request sent once more; a refused request, or a desktop
      // that does not answer, is the caller's answer.
      if (attempt > 0 || (agent->alive() && display_answers(*agent))) throw;
      if (!agent->alive() && !read_only(request)) throw;
      std::lock_guard lock(mutex_);
      agents_.erase(inst.id);
    }
  }
}

UniqueFd Desktops::connect_vnc(const store::Instance& inst, std::string_view actor) {
  if (!inst.meta.desktop())
    throw DesktopOff(fmt::format("the desktop of instance '{}' is off", inst.id));
  if (auto why = unavailable(inst)) throw *why;
  const sandbox::Target target = service_.target(inst);
  const std::optional<users::Identity> identity = service_.backend().runs_as(target);
  const uid_t owner = identity ? identity->uid : ::geteuid();
  // x11vnc makes its socket a moment after the session is ready, and again when the supervisor
  // restarts it: a missing or refusing socket is waited for, within a bound.
  const auto until = std::chrono::steady_clock::now() + kVncWait;
  bool session_started = false;
  for (;;) {
    bool start = false;
    {
      sandbox::LivingRoot held = service_.backend().living_root(target);
      if (held.started) service_.store().audit(inst, "instance.started", actor, {{"instance_id", inst.id}});
      const int root = held.root.get();
      try {
        return connect_beneath(root, owner, desktop::kVncSocket, "the live view", inst.id);
      } catch (const SysError& e) {
        if (e.code() != ENOENT && e.code() != ECONNREFUSED) throw;
        if (exists_beneath(root, desktop::kVncMissing))
          throw Error(fmt::format("the live view of instance '{}' is not available: its root has no x11vnc (Debian "
                                  "package x11vnc; image build --desktop installs it); the desktop works without it",
                                  inst.id));
        if (std::chrono::steady_clock::now() > until)
          throw Error(fmt::format("the live view of instance '{}' did not answer within {} s ({}); its log is {}/log/"
                                  "vnc.log in the instance; switch the desktop off and on again",
                                  inst.id, kVncWait.count(), e.what(), desktop::kRuntimeDir));
        // No X server: the session does not run in this sandbox (its start failed, or it ended).
        start = !session_started && !exists_beneath(root, desktop::kXSocket);
      }
    }
    if (start) {
      start_session(inst);
      session_started = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

std::string Desktops::accessibility(const store::Instance& inst, const nlohmann::json& request, std::string_view actor) {
  ensure_running(inst, actor);
  sandbox::ExecSpec spec = service_.command(inst, Service::Command::person, desktop::atspi_command());
  sandbox::CaptureOptions options;
  options.input = request.dump();
  options.timeout = std::chrono::seconds(30);
  options.output_cap = 4 << 20;
  const sandbox::CaptureResult result = service_.run_captured(inst, std::move(spec), options, "an accessibility read");
  if (result.ending == sandbox::Ending::timed_out)
    throw Error("the accessibility tree did not come within 30 s (an application is not answering); try again");
  if (result.ending == sandbox::Ending::output_limit)
    throw Error("the accessibility tree is larger than 4 MiB; close some windows");
  if (result.status.exit_code != 0) {
    const std::string why = text::truncate_utf8(text::sanitize_utf8(text::trim(result.err)), 500);
    throw Error(fmt::format("the accessibility tree could not be read: {}",
                            why.empty() ? fmt::format("exit {}", result.status.exit_code) : why));
  }
  return result.out;
}

void Desktops::open(const store::Instance& inst, const std::string& what, std::string_view actor) {
  ensure_running(inst, actor);
  // Detached: the program it opens (a browser) lives on after this command.
  sandbox::ExecSpec spec = service_.command(
      inst, Service::Command::person,
      {"/bin/sh", "-c", fmt::format("exec setsid -f xdg-open \"$1\" >>{}/open.log 2>&1 </dev/null", desktop::kRuntimeDir),
       "sh", what});
  sandbox::CaptureOptions options;
  options.timeout = std::chrono::seconds(20);
  options.output_cap = 64 * 1024;
  const sandbox::CaptureResult result = service_.run_captured(inst, std::move(spec), options, "an open on the desktop");
  if (result.status.exit_code != 0)
    throw Error(fmt::format("xdg-open could not be started on the desktop (exit {}); is xdg-utils installed in the "
                            "instance?",
                            result.status.exit_code));
}

}  // namespace nshpc::instances
