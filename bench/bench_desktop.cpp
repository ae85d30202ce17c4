// make bench: what a screenshot and a click cost through the display agent, side by side with
// the reference path in the same run, on a real Xfce desktop (Xvfb 1280x800x24 with xfwm4,
// xfdesktop's wallpaper, xfce4-panel and a Mousepad window of text):
//   1. capture through Agent::call end to end (request, xcb_get_image, encode, reply): JPEG q75, PNG
//   2. Anthropic's demo: `scrot FILE` then `convert FILE -resize 1280x800! FILE`, as processes
//   3. a click through Agent::call (move, press, release) against one `xdotool click 1` process
// Prints p50 and p99 of each and the ratios. No timing assertions: figures only.
// Usage: nshpc_bench_desktop [RUNS]. Skipped (exit 0) when Xvfb or the Xfce parts are missing.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"
#include "desktop/client.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Stats {
  double p50 = 0, p99 = 0;
};

Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t p99 = std::min(v.size() - 1, static_cast<std::size_t>(static_cast<double>(v.size()) * 0.99));
  return {v[v.size() / 2], v[p99]};
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

nshpc::UniqueFd devnull() { return nshpc::UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC)); }

// A process in a group of its own (what it starts ends with it).
nshpc::SpawnedChild start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  auto null = devnull();
  nshpc::SpawnSpec spec;
  spec.program = argv[0];
  spec.argv = argv;
  spec.envp = env;
  spec.fds = {{null.get(), 0}, {null.get(), 1}, {null.get(), 2}};
  spec.new_session = true;
  spec.die_with_parent = SIGKILL;
  return nshpc::spawn(spec);
}

void stop(nshpc::SpawnedChild& child) {
  if (child.pid() <= 0) return;
  ::kill(-child.pid(), SIGTERM);
  if (!nshpc::wait_pidfd(child.pidfd(), 3s)) ::kill(-child.pid(), SIGKILL);
  child = nshpc::SpawnedChild{};
}

// Runs a command to its end; its wall time in ms.
double run(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  const auto started = Clock::now();
  auto child = start(argv, env);
  const int status = child.wait(argv[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench desktop: '%s' failed (status %d)\n", argv[0].c_str(), status);
    std::exit(1);
  }
  return ms_since(started);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(10, std::atoi(argv[1])) : 100;
  for (const char* program :
       {"Xvfb", "xfwm4", "xfdesktop", "xfce4-panel", "dbus-run-session", "scrot", "convert", "xdotool"})
    if (!nshpc::fs::find_program(program)) {
      std::printf("bench desktop: skipped: %s is not installed\n", program);
      return 0;
    }
  char tmpl[] = "/tmp/nshpc-bench-display-XXXXXX";
  const fs::path dir = ::mkdtemp(tmpl);
  ::chmod(dir.c_str(), 0755);
  // Removed on every way out, after everything below (declared later) has ended.
  struct RemoveDir {
    fs::path dir;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_dir{dir};

  // Xvfb with a cookie of our own on the first free display from :60.
  std::string cookie(16, '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(cookie.data(), 16);
  {
    std::string auth{'\xff', '\xff', 0, 0, 0, 0, 0, 18};
    auth += "MIT-MAGIC-COOKIE-1";
    auth += std::string{0, 16} + cookie;
    std::ofstream(dir / "auth", std::ios::binary) << auth;
  }
  nshpc::SpawnedChild xvfb;
  int display = -1;
  for (int n = 60; n < 120 && display < 0; ++n) {
    if (fs::exists(fmt::format("/tmp/.X11-unix/X{}", n)) || fs::exists(fmt::format("/tmp/.X{}-lock", n))) continue;
    nshpc::Pipe ready = nshpc::make_pipe();
    auto null = devnull();
    nshpc::UniqueFd log(::open((dir / "xvfb.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    nshpc::SpawnSpec spec;
    spec.program = "Xvfb";
    spec.argv = {"Xvfb",  fmt::format(":{}", n),   "-screen",    "0", "1280x800x24", "-nolisten", "tcp",
                 "-auth", (dir / "auth").string(), "-displayfd", "3", "-noreset"};
    spec.fds = {{null.get(), 0}, {log.get(), 1}, {log.get(), 2}, {ready.write.get(), 3}};
    spec.die_with_parent = SIGKILL;
    auto server = nshpc::spawn(spec);
    ready.write.reset();
    pollfd p{ready.read.get(), POLLIN, 0};
    char buf[16];
    if (::poll(&p, 1, 20000) > 0 && ::read(ready.read.get(), buf, sizeof buf) > 0) {
      display = n;
      xvfb = std::move(server);
    }
  }
  if (display < 0) {
    std::fprintf(stderr, "bench desktop: no Xvfb could be started\n");
    return 1;
  }
  const fs::path home = dir / "home";
  fs::create_directories(home);
  const std::vector<std::string> env{"DISPLAY=:" + std::to_string(display),
                                     "XAUTHORITY=" + (dir / "auth").string(),
                                     "HOME=" + home.string(),
                                     "PATH=/usr/local/bin:/usr/bin:/bin",
                                     "LANG=C.UTF-8",
                                     "NO_AT_BRIDGE=1",
                                     "XDG_RUNTIME_DIR=" + home.string()};
  // A real desktop: window manager, wallpaper, panel, and an editor with text in it.
  auto session = start({"dbus-run-session", "--", "sh", "-c",
                        "xfwm4 --compositor=off & xfdesktop & xfce4-panel & "
                        "mousepad /usr/share/common-licenses/GPL-3 & wait"},
                       env);
  std::this_thread::sleep_for(8s);  // everything painted

  nshpc::desktop::AgentOptions options;
  options.program = NSHPC_BINARY;
  nshpc::UniqueFd x(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "/tmp/.X11-unix/X%d", display);
  if (::connect(x.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::fprintf(stderr, "bench desktop: connect to %s: %s; Xvfb said:\n%s\n", addr.sun_path, std::strerror(errno),
                 [&] {
                   std::ifstream in(dir / "xvfb.log");
                   return std::string(std::istreambuf_iterator<char>(in), {});
                 }()
                     .c_str());
    return 1;
  }
  auto agent = nshpc::desktop::Agent::start(std::move(x), cookie, options, 10s);

  const auto time_capture = [&](const nlohmann::json& request, std::size_t& bytes) {
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) agent->call(request, 10s);  // warm-up
    for (int i = 0; i < runs; ++i) {
      const auto started = Clock::now();
      bytes = agent->call(request, 10s).payload.size();
      ms.push_back(ms_since(started));
    }
    return summarize(ms);
  };
  std::size_t jpeg_bytes = 0, png_bytes = 0;
  const Stats jpeg = time_capture({{"op", "capture"}, {"format", "jpeg"}, {"quality", 75}}, jpeg_bytes);
  const Stats png = time_capture({{"op", "capture"}, {"format", "png"}}, png_bytes);

  const int reference_runs = std::max(10, runs / 5);
  const std::string shot = (dir / "shot.png").string();
  std::vector<double> reference_ms;
  for (int i = 0; i < reference_runs + 2; ++i) {
    fs::remove(shot);
    const auto started = Clock::now();
    run({"scrot", shot}, env);
    run({"convert", shot, "-resize", "1280x800!", shot}, env);
    if (i >= 2) reference_ms.push_back(ms_since(started));  // two warm-ups
  }
  const Stats reference = summarize(reference_ms);
  const auto reference_bytes = fs::file_size(shot);

  std::vector<double> click_ms, xdotool_ms;
  const nlohmann::json click{
      {"op", "input"},
      {"events", {{{"move", {640, 420}}}, {{"button", 1}, {"down", true}}, {{"button", 1}, {"down", false}}}}};
  for (int i = 0; i < runs + 5; ++i) {
    const auto started = Clock::now();
    agent->call(click, 5s);
    if (i >= 5) click_ms.push_back(ms_since(started));
  }
  for (int i = 0; i < reference_runs + 2; ++i) {
    const double ms = run({"xdotool", "click", "1"}, env);
    if (i >= 2) xdotool_ms.push_back(ms);
  }
  const Stats agent_click = summarize(click_ms), xdotool = summarize(xdotool_ms);

  std::printf("\nns-hpc bench: desktop, Xvfb 1280x800x24 with xfwm4, xfdesktop, xfce4-panel and Mousepad\n");
  std::printf("(agent: %d runs each; processes: %d runs each)\n\n", runs, reference_runs);
  std::printf("  %-52s %9s %9s %10s\n", "", "p50 ms", "p99 ms", "bytes");
  std::printf("  %-52s %9.2f %9.2f %10zu\n", "capture JPEG q75 through Agent::call", jpeg.p50, jpeg.p99, jpeg_bytes);
  std::printf("  %-52s %9.2f %9.2f %10zu\n", "capture PNG through Agent::call", png.p50, png.p99, png_bytes);
  std::printf("  %-52s %9.2f %9.2f %10ju\n", "scrot FILE + convert FILE -resize 1280x800! FILE", reference.p50,
              reference.p99, static_cast<std::uintmax_t>(reference_bytes));
  std::printf("  %-52s %9.3f %9.3f\n", "click (move, press, release) through Agent::call", agent_click.p50,
              agent_click.p99);
  std::printf("  %-52s %9.2f %9.2f\n", "xdotool click 1 (one process)", xdotool.p50, xdotool.p99);
  std::printf("\n  scrot+convert / agent JPEG: p50 %.1fx, p99 %.1fx\n", reference.p50 / jpeg.p50,
              reference.p99 / jpeg.p99);
  std::printf("  scrot+convert / agent PNG:  p50 %.1fx, p99 %.1fx\n", reference.p50 / png.p50, reference.p99 / png.p99);
  std::printf("  xdotool click / agent click: p50 %.1fx, p99 %.1fx\n\n", xdotool.p50 / agent_click.p50,
              xdotool.p99 / agent_click.p99);

  agent.reset();
  stop(session);
  ::kill(xvfb.pid(), SIGTERM);
  nshpc::wait_pidfd(xvfb.pidfd(), 5s);
  xvfb = nshpc::SpawnedChild{};
  return 0;
}
