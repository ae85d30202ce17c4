// A person's terminal in an instance's sandbox for a face that relays it (instances/terminal.hpp),
// against real bwrap. There is no face for it yet (the dashboard's WebSocket comes next), so the
// test links the instances module and drives a real Service on the Env's config, as that face
// will; instances are made and living sandboxes started by the ns-hpc binary, as elsewhere.
// Runs as root and again as the unprivileged nshpc-test user (scripts/test-as-user.sh).
#include "instances/terminal.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "config/config.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using namespace std::chrono_literals;
namespace inst = nshpc::instances;

namespace {

constexpr const char* kActor = "dashboard (uid 0)";

// A real Service on the Env's config file, as the server would make it.
struct Served {
  explicit Served(const Env& env) : loaded(load(env)), service(loaded.config) {}
  static nshpc::config::Loaded load(const Env& env) {
    nshpc::config::LoadOptions options;
    options.explicit_path = env.config_file();
    options.read_user_file = false;  // as the binary the Env runs, whose XDG folder is empty
    return nshpc::config::load(options);
  }
  nshpc::config::Loaded loaded;
  inst::Service service;
};

// What the terminal showed, read from its master as a relay would.
class Screen {
 public:
  explicit Screen(inst::Terminal& t) : t_(t) {}

  void type(const std::string& text) {
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(t_.fd(), text.data() + done, text.size() - done);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EINTR)) << "write to the terminal: " << std::strerror(errno);
      pollfd p{t_.fd(), POLLOUT, 0};
      ::poll(&p, 1, 1000);
    }
  }

  // Reads until `wanted` has appeared after what earlier waits consumed; false at the limit.
  bool wait_for(const std::string& wanted, std::chrono::milliseconds limit = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto at = all_.find(wanted, consumed_);
      if (at != std::string::npos) {
        consumed_ = at + wanted.size();
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{t_.fd(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(t_.fd(), buf, sizeof buf);
      if (n > 0) all_.append(buf, static_cast<std::size_t>(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) return all_.find(wanted, consumed_) != std::string::npos;
    }
  }

  // Waits for `line` printed on a line of its own: after a line's end or a carriage return
  // (bash ends a read line with one, after its bracketed-paste switch).
  bool wait_for_line(const std::string& line, std::chrono::milliseconds limit = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (wait_for(line + "\r\n", std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()))) {
      const std::size_t at = consumed_ - line.size() - 2;
      if (at > 0 && (all_[at - 1] == '\r' || all_[at - 1] == '\n')) return true;
    }
    return false;
  }

  // What was printed between two marker lines (typed as `echo M""1` so that the echo of the
  // typed line never matches), without the last line's end.
  std::string between(const std::string& begin, const std::string& end) {
    if (!wait_for_line(begin)) return "<no " + begin + "> in " + all_;
    const std::size_t from = consumed_;
    if (!wait_for_line(end)) return "<no " + end + "> in " + all_;
    const std::size_t to = consumed_ - end.size() - 2;
    // The line before `end` ends with \r\n; `end` itself may follow a bare \r.
    std::string text = all_.substr(from, to - from);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
  }

  const std::string& all() const { return all_; }

 private:
  inst::Terminal& t_;
  std::string all_;
  std::size_t consumed_ = 0;
};

std::vector<nlohmann::json> audit_lines(const Env& env, const std::string& id, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(env.instances() / id / "audit.log");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nshpc::parse_json_or_discarded(line);
    if (j.is_object() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

// A field of /proc/<pid>/status ("Uid", "PPid"), its first word; empty when the process is gone.
std::string proc_status(pid_t pid, const std::string& field) {
  std::istringstream in(read_text("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream words(line.substr(field.size() + 1));
    std::string first;
    words >> first;
    return first;
  }
  return {};
}

bool alive(pid_t pid) { return !proc_status(pid, "PPid").empty() && proc_status(pid, "State").find('Z') == std::string::npos; }

std::string bwrap_id_u(const Env& env, const std::string& id) {
  Result r = env.run({"bwrap", id, "--", "id", "-u"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out.substr(0, r.out.find('\n'));
}

}  // namespace

// A fresh sandbox per terminal for an instance that is not persistent: typed input is echoed and
// run, the window size follows a resize (with SIGWINCH), the identity is the sandbox's, the
// audit line names the actor, and closing the terminal leaves no process of it running —
// background, setsid'd and hang-up-ignoring ones included.
TEST(LiveTerminal, EphemeralEchoesResizesAndEndsEverythingWhenClosed) {
  Env env("default_network = \"off\"\n");
  env.create("term-eph");
  const std::string sandbox_uid = bwrap_id_u(env, "term-eph");
  Served s(env);
  const auto instance = s.service.store().get("term-eph");

  auto terminal = s.service.open_terminal(instance, inst::TerminalRequest{{}, 24, 80}, kActor);
  ASSERT_TRUE(terminal);
  EXPECT_EQ(s.service.executions_of("term-eph"), std::vector<std::string>{"a terminal (dashboard (uid 0))"});
  Screen screen(*terminal);

  screen.type("echo hi\n");
  EXPECT_TRUE(screen.wait_for("echo hi")) << "the typed line was not echoed: " << screen.all();
  EXPECT_TRUE(screen.wait_for_line("hi")) << "no 'hi' on its own line: " << screen.all();

  screen.type("echo S\"\"1; echo $TERM; stty size; id -u; echo S\"\"2\n");
  EXPECT_EQ(screen.between("S1", "S2"), "xterm-256color\r\n24 80\r\n" + sandbox_uid);

  // A program waiting for SIGWINCH gets it when the window changes; then the size is the new one.
  screen.type(
      "python3 -c 'import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH}); "
      "print(\"WAIT\" + \"ING\", flush=True); signal.sigwait({signal.SIGWINCH}); print(\"GOT\" + \"WINCH\")'; "
      "echo R\"\"1; stty size; echo R\"\"2\n");
  ASSERT_TRUE(screen.wait_for_line("WAITING")) << screen.all();
  terminal->resize(40, 132);
  EXPECT_TRUE(screen.wait_for_line("GOTWINCH", 10s)) << "no SIGWINCH after the resize: " << screen.all();
  EXPECT_EQ(screen.between("R1", "R2"), "40 132");

  // Processes that outlive a closed terminal unless their tree is killed; the shell is the
  // background sleep's parent.
  screen.type(
      "sleep 7771.25 & setsid sh -c 'trap \"\" HUP TERM; exec sleep 7771.5' >/dev/null 2>&1 & "
      "nohup sleep 7771.75 >/dev/null 2>&1 & echo B\"\"2\n");
  ASSERT_TRUE(screen.wait_for_line("B2")) << screen.all();
  ASSERT_TRUE(eventually([] { return processes_with("7771.").size() == 3; }, 10s))
      << processes_with("7771.").size() << " of the 3 background processes seen";
  const std::vector<pid_t> sleeps = processes_with("7771.25");
  ASSERT_EQ(sleeps.size(), 1u);
  const pid_t shell = static_cast<pid_t>(std::stol(proc_status(sleeps[0], "PPid")));
  ASSERT_TRUE(alive(shell));
  EXPECT_NE(read_text("/proc/" + std::to_string(shell) + "/cmdline").find("bash"), std::string::npos);
  // Not root on the host, whoever runs the test.
  EXPECT_NE(proc_status(shell, "Uid"), "0") << "the terminal's shell runs as root on the host";
  EXPECT_FALSE(terminal->ended());

  const auto closing = std::chrono::steady_clock::now();
  terminal.reset();
  const auto took = std::chrono::steady_clock::now() - closing;
  // The hang-up ends a shell at its prompt at once: no wait for the grace.
  EXPECT_LT(took, 1s) << "closing waited " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms: the hang-up did not end the shell";
  // Killed processes of a pid namespace may take a moment to be torn down by the kernel.
  EXPECT_TRUE(eventually([&] { return !alive(shell); }, 2s))
      << "the shell is still running after the terminal was closed: " << proc_status(shell, "State");
  EXPECT_TRUE(eventually([] { return processes_with("7771.").empty(); }, 2s))
      << "a background process of the terminal survived it";
  EXPECT_TRUE(s.service.executions_of("term-eph").empty());

  const auto lines = audit_lines(env, "term-eph", "sandbox.enter");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].value("actor", ""), kActor) << lines[0].dump();
  EXPECT_EQ(lines[0]["command"], nlohmann::json::array({"/bin/bash", "-i"})) << lines[0].dump();
  EXPECT_EQ(lines[0]["instance_id"], "term-eph");
  EXPECT_EQ(lines[0]["closed_while_running"], true) << lines[0].dump();
}

// A persistent instance's terminal joins its living sandbox: a file another command left in its
// /tmp is there, and the process it started is visible where commands share its pids; the terminal's shell is the sandbox's identity; closing the terminal ends
// its own processes and leaves the living sandbox's alone. A command that ends by itself gives its
// exit status to wait().
TEST(LiveTerminal, PersistentJoinsTheLivingSandbox) {
  Env env("persistent = true\nidle_stop = 120\ndefault_network = \"off\"\n");
  env.create("term-live");
  Result bg = env.run({"bwrap", "term-live", "--", "/bin/sh", "-c", "echo living-7772 > /tmp/marker; setsid sleep 7772.5 >/dev/null 2>&1 & echo ok"});
  ASSERT_EQ(bg.exit_code, 0) << bg.err;
  ASSERT_TRUE(eventually([] { return processes_with("7772.5").size() == 1; }, 10s));
  const std::string sandbox_uid = bwrap_id_u(env, "term-live");
  Served s(env);
  const auto instance = s.service.store().get("term-live");

  auto terminal = s.service.open_terminal(instance, inst::TerminalRequest{{}, 30, 100}, kActor);
  Screen screen(*terminal);
  // The living sandbox's own /tmp; its process in /proc where its commands share its pid
  // namespace (else, with no cgroup to kill a command's tree by, a person's command has a pid
  // namespace of its own: Service::commands_share_pids). [s]leep: grep does not find itself.
  screen.type(
      "echo P\"\"1; cat /tmp/marker; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | "
      "grep -c '[s]leep 7772.5'; stty size; id -u; echo P\"\"2\n");
  const std::string seen = s.service.commands_share_pids() ? "1" : "0";
  EXPECT_EQ(screen.between("P1", "P2"), "living-7772\r\n" + seen + "\r\n30 100\r\n" + sandbox_uid) << screen.all();
  screen.type("sleep 7772.75 & echo Q\"\"2\n");
  ASSERT_TRUE(screen.wait_for_line("Q2")) << screen.all();
  ASSERT_TRUE(eventually([] { return processes_with("7772.75").size() == 1; }, 10s));
  const pid_t shell = static_cast<pid_t>(std::stol(proc_status(processes_with("7772.75")[0], "PPid")));
  terminal.reset();
  EXPECT_TRUE(eventually([&] { return !alive(shell); }, 2s))
      << "the shell is still running after the terminal was closed: " << proc_status(shell, "State");
  EXPECT_TRUE(eventually([] { return processes_with("7772.75").empty(); }, 2s))
      << "the terminal's background process survived it";
  EXPECT_EQ(processes_with("7772.5").size(), 1u) << "closing a terminal killed the living sandbox's process";

  auto exits = s.service.open_terminal(instance, inst::TerminalRequest{{"/bin/sh", "-c", "exit 7"}, 24, 80}, kActor);
  EXPECT_EQ(exits->wait().exit_code, 7);
  EXPECT_TRUE(exits->ended());
  exits.reset();
  const auto lines = audit_lines(env, "term-live", "sandbox.enter");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1].value("actor", ""), kActor);
  EXPECT_EQ(lines[1]["exit_code"], 7) << lines[1].dump();
  EXPECT_FALSE(lines[1].contains("closed_while_running")) << lines[1].dump();
}

// A stop of the instance finds its open terminal (registered as one of its executions) and ends
// it; the terminals of one instance are bounded, and a closed one frees its place.
TEST(LiveTerminal, StoppedWithItsInstanceAndBounded) {
  Env env("default_network = \"off\"\n");
  env.create("term-bound");
  Served s(env);
  const auto instance = s.service.store().get("term-bound");
  const inst::TerminalRequest cat{{"/bin/cat"}, 24, 80};

  std::vector<std::unique_ptr<inst::Terminal>> open;
  for (std::size_t i = 0; i < inst::kMaxTerminalsPerInstance; ++i)
    open.push_back(s.service.open_terminal(instance, cat, kActor));
  EXPECT_EQ(s.service.executions_of("term-bound").size(), inst::kMaxTerminalsPerInstance);
  try {
    s.service.open_terminal(instance, cat, kActor);
    ADD_FAILURE() << "a terminal beyond the bound was opened";
  } catch (const nshpc::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("close one first"), std::string::npos) << e.what();
  }
  open.pop_back();
  open.push_back(s.service.open_terminal(instance, cat, kActor));  // its place was given back

  Screen screen(*open[0]);
  screen.type("still here\n");
  ASSERT_TRUE(screen.wait_for("still here\r\nstill here\r\n")) << screen.all();  // echoed, then cat's copy
  s.service.stop(instance, "test");
  for (auto& t : open) {
    pollfd p{t->wait_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 10000), 1) << "a terminal still runs after its instance was stopped";
    EXPECT_NE(t->wait().exit_code, 0);
  }
}
