// The hardened sandbox, checked from inside with the real bwrap. The same suite runs as root
// (bwrap dropped to the sandbox uid) and as an unprivileged user (the HPC case), and each test
// twice: in an ephemeral instance (a fresh sandbox per command) and in a living one (every
// command joins the instance's long-lived sandbox: the same restrictions must hold).
#include <netinet/in.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;

namespace {

bool is_root() { return ::geteuid() == 0; }

class Sandbox : public ::testing::TestWithParam<bool> {
 protected:
  Sandbox() : env_(GetParam() ? "persistent = true\nidle_stop = 120\n" : "") {}
  void SetUp() override {
    env_.create("alpha");
    env_.install_probe("alpha");
  }
  Result in_alpha(const std::vector<std::string>& command) {
    std::vector<std::string> args{"bwrap", "alpha", "--"};
    args.insert(args.end(), command.begin(), command.end());
    return env_.run(args);
  }
  Result probe(const std::string& cmd, const std::string& arg = "") {
    std::vector<std::string> command{"/workspace/probe", cmd};
    if (!arg.empty()) command.push_back(arg);
    return in_alpha(command);
  }
  Env env_;
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Kinds, Sandbox, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Living" : "Ephemeral"; });

TEST_P(Sandbox, HostReadOnlyPathsCannotBeWrittenEvenAfterRemount) {
  for (const char* dir : {"/etc", "/usr"}) {
    Result r = probe("remount-write", dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("remount: blocked"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("write: blocked"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(fs::path(dir) / "nshpc-probe-escape")) << "host " << dir << " was written";
  }
  Result tmpfs = probe("mount-tmpfs", "/tmp");
  EXPECT_NE(tmpfs.out.find("mount: blocked"), std::string::npos) << tmpfs.out;
}

TEST_P(Sandbox, ProcSysIsNotWritable) {
  for (const char* knob : {"/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"}) {
    Result r = probe("open-write", knob);
    EXPECT_NE(r.out.find("open-write: blocked"), std::string::npos) << knob << ": " << r.out;
  }
}

TEST_P(Sandbox, NoCapabilitiesAndTheCommandRunsAsTheUnprivilegedUid) {
  Result caps = in_alpha({"/bin/sh", "-c", "grep CapEff /proc/self/status"});
  EXPECT_NE(caps.out.find("0000000000000000"), std::string::npos) << caps.out;
  Result ids = probe("ids");
  const unsigned expected = is_root() ? 65534u : ::getuid();
  EXPECT_NE(ids.out.find("uid " + std::to_string(expected) + " "), std::string::npos) << ids.out;
  // The host sees files made in the sandbox as owned by that uid, never root.
  ASSERT_EQ(in_alpha({"/bin/sh", "-c", "echo x > made-inside"}).exit_code, 0);
  struct stat st;
  ASSERT_EQ(::stat((env_.instances() / "alpha/workspace/made-inside").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, expected);
  // And host secrets readable only by root stay unreadable.
  if (fs::exists("/etc/shadow")) {
    Result shadow = probe("cat", "/etc/shadow");
    EXPECT_NE(shadow.out.find("cannot read /etc/shadow"), std::string::npos) << shadow.out;
  }
}

TEST_P(Sandbox, NoHostProcessesAreVisible) {
  Result r = probe("pids");
  int count = std::stoi(r.out.substr(r.out.find(':') + 1));
  // the sandbox init and the probe; in a living instance also its main command and the
  // command's own init
  EXPECT_LE(count, GetParam() ? 4 : 3) << r.out;
}

TEST_P(Sandbox, AnotherInstancesWorkspaceIsUnreachable) {
  env_.create("beta");
  std::ofstream(env_.instances() / "beta/workspace/beta-secret.txt") << "beta's data";
  const std::string beta_path = (env_.instances() / "beta").string();
  Result r = in_alpha({"/bin/sh", "-c",
                       "cat " + beta_path + "/workspace/beta-secret.txt; ls /workspace /output; "
                       "ls /shared-output; cat /proc/self/mountinfo"});
  EXPECT_EQ(r.out.find("beta's data"), std::string::npos);
  EXPECT_EQ(r.out.find("beta-secret"), std::string::npos);
  EXPECT_EQ(r.out.find(beta_path), std::string::npos) << "beta's folder is mounted: " << r.out;
  EXPECT_NE(r.err.find("/shared-output"), std::string::npos) << "shared output must be opt-in";
}

TEST_P(Sandbox, ServerEnvironmentSecretsDoNotLeak) {
  Result r = in_alpha({"/bin/sh", "-c", "env; echo; cat /proc/1/environ | tr '\\0' '\\n'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(kSecret), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("HOME=/workspace"), std::string::npos);
  EXPECT_NE(r.out.find("NS_HPC_INSTANCE=alpha"), std::string::npos);
  Result init_env = probe("cat", "/proc/1/environ");
  EXPECT_EQ(init_env.out.find(kSecret), std::string::npos) << init_env.out;
}

TEST_P(Sandbox, ExitCodesAndDeathBySignalPassThrough) {
  EXPECT_EQ(in_alpha({"true"}).exit_code, 0);
  EXPECT_EQ(in_alpha({"/bin/sh", "-c", "exit 42"}).exit_code, 42);
  EXPECT_EQ(in_alpha({"/bin/sh", "-c", "kill -KILL $$"}).exit_code, 137);
  EXPECT_EQ(in_alpha({"/bin/sh", "-c", "kill -TERM $$"}).exit_code, 143);
  Result missing = in_alpha({"/no/such/program"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/no/such/program"), std::string::npos) << missing.err;
}

TEST_P(Sandbox, ArgumentsAndStdioArePassedExactly) {
  Result r = env_.run({"bwrap", "alpha", "--", "/bin/sh", "-c", "printf '[%s]' \"$@\"; cat", "sh", "a b",
                       "", "--flag", "$HOME"},
                      "from stdin");
  EXPECT_EQ(r.out, "[a b][][--flag][$HOME]from stdin");
}

TEST_P(Sandbox, SeccompAndNoNewUserNamespaces) {
  EXPECT_NE(probe("unshare-user").out.find("unshare: blocked"), std::string::npos);
  EXPECT_NE(probe("ptrace-child").out.find("ptrace: blocked"), std::string::npos);
  Result r = in_alpha({"/bin/sh", "-c", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status"});
  EXPECT_NE(r.out.find("Seccomp:\t2"), std::string::npos) << r.out;
}

TEST_P(Sandbox, OnlyStdioDescriptorsReachTheCommand) {
  Result r = probe("fds");
  EXPECT_EQ(r.out, "fd 0\nfd 1\nfd 2\n");
}

TEST_P(Sandbox, WorkspaceAndOutputPersistAcrossCommands) {
  ASSERT_EQ(in_alpha({"/bin/sh", "-c", "echo kept > notes.txt && echo out > /output/r.txt"}).exit_code, 0);
  EXPECT_EQ(in_alpha({"cat", "notes.txt", "/output/r.txt"}).out, "kept\nout\n");
  EXPECT_EQ(read_text(env_.instances() / "output/alpha/r.txt"), "out\n");
}

TEST_P(Sandbox, NetworkOffCannotReachHostLoopback) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(listener, 16);
  const std::string connect = "exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(ntohs(addr.sin_port));
  env_.create("offline", {"--network", "off"});
  env_.create("shared", {"--network", "host"});
  EXPECT_EQ(env_.run({"bwrap", "shared", "--", "/bin/bash", "-c", connect}).exit_code, 0)
      << "network=host reaches loopback";
  Result off = env_.run({"bwrap", "offline", "--", "/bin/bash", "-c", connect});
  EXPECT_NE(off.exit_code, 0);
  Result lo = env_.run({"bwrap", "offline", "--", "/bin/sh", "-c", "cat /proc/net/dev"});
  EXPECT_EQ(lo.out.find("eth"), std::string::npos) << lo.out;
  ::close(listener);
}

TEST_P(Sandbox, EachRunIsAudited) {
  in_alpha({"/bin/sh", "-c", "exit 3"});
  std::ifstream in(env_.instances() / "alpha/audit.log");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  auto event = nshpc::parse_json(last);
  EXPECT_EQ(event["event"], "sandbox.exec");
  EXPECT_EQ(event["exit_code"], 3);
  EXPECT_EQ(event["command"], nlohmann::json({"/bin/sh", "-c", "exit 3"}));
  EXPECT_TRUE(event["duration_ms"].is_number());
  EXPECT_EQ(event["actor"].get<std::string>().rfind("cli:", 0), 0u);
}

namespace {
// A setsid'd daemon that ignores SIGTERM, plus a foreground child that ignores it too. The
// sleep argument is computed by the shell so only the sandboxed processes carry the marker
// "<n>.5"/"<n>.6" (each test has its own n, as tests run in parallel).
std::vector<std::string> stubborn_tree(int n) {
  return {"bwrap", "alpha", "--", "/bin/sh", "-c",
          "setsid sh -c 'trap \"\" TERM; exec sleep $((" + std::to_string(n - 1) +
              "+1)).5' & trap '' TERM; sleep $((" + std::to_string(n - 1) + "+1)).6"};
}
}  // namespace

TEST_P(Sandbox, SigtermToTheCliKillsTheWholeTree) {
  // Each kind its own marker: ctest runs the two at once, and each must see only its own tree.
  const int n = GetParam() ? 53217 : 43217;
  const std::string kMarker = std::to_string(n) + ".";
  pid_t cli = env_.start(stubborn_tree(n));
  ASSERT_TRUE(eventually([&] { return processes_with(kMarker).size() >= 2; }, std::chrono::seconds(10)));
  ::kill(cli, SIGTERM);
  EXPECT_EQ(wait_child(cli, std::chrono::seconds(10)), 128 + SIGTERM);
  EXPECT_TRUE(eventually([&] { return processes_with(kMarker).empty(); }, std::chrono::seconds(5)))
      << processes_with(kMarker).size() << " survivors";
  auto log = read_text(env_.instances() / "alpha/audit.log");
  EXPECT_NE(log.find("\"stopped_by_signal\":15"), std::string::npos) << log;
}

TEST_P(Sandbox, SigkillOfTheCliStillTakesTheTree) {
  // Each kind its own marker: ctest runs the two at once, and each must see only its own tree.
  const int n = GetParam() ? 53218 : 43218;
  const std::string kMarker = std::to_string(n) + ".";
  pid_t cli = env_.start(stubborn_tree(n));
  ASSERT_TRUE(eventually([&] { return processes_with(kMarker).size() >= 2; }, std::chrono::seconds(10)));
  ::kill(cli, SIGKILL);
  wait_child(cli, std::chrono::seconds(10));
  EXPECT_TRUE(eventually([&] { return processes_with(kMarker).empty(); }, std::chrono::seconds(5)))
      << processes_with(kMarker).size() << " survivors";
}

// `bwrap --timeout`: at the limit the whole tree goes, setsid'd and SIGTERM-ignoring processes
// included (in a living instance too, where nothing else of the sandbox is touched), the output
// printed so far is passed through, and the exit code is 124 as timeout(1)'s.
TEST_P(Sandbox, TimeoutKillsTheWholeTreeAndExits124) {
  // Each kind its own marker: ctest runs the two at once, and each must see only its own tree.
  const int n = GetParam() ? 53219 : 43219;
  const std::string kMarker = std::to_string(n) + ".";
  std::vector<std::string> args = stubborn_tree(n);
  args[2] = "--timeout";
  args.insert(args.begin() + 3, {"1.5", "--"});
  args[args.size() - 1] = "echo before-the-limit; " + args.back();
  const auto started = std::chrono::steady_clock::now();
  Result r = env_.run(args);
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_EQ(r.out, "before-the-limit\n");
  EXPECT_NE(r.err.find("timed out after 1.5 s"), std::string::npos) << r.err;
  EXPECT_GE(took, std::chrono::milliseconds(1500));
  EXPECT_LT(took, std::chrono::seconds(20));
  EXPECT_TRUE(eventually([&] { return processes_with(kMarker).empty(); }, std::chrono::seconds(5)))
      << processes_with(kMarker).size() << " survivors";
  auto log = read_text(env_.instances() / "alpha/audit.log");
  EXPECT_NE(log.find("\"timed_out\":true"), std::string::npos) << log;
  if (GetParam()) {
    // The living sandbox itself runs on: the next command joins it.
    Result next = in_alpha({"/bin/echo", "still-here"});
    EXPECT_EQ(next.exit_code, 0) << next.err;
    EXPECT_EQ(next.out, "still-here\n");
  }
}

TEST_P(Sandbox, TimeoutPassesStdinOutputAndTheExitCodeOfACommandThatEndsInTime) {
  Result r = env_.run({"bwrap", "alpha", "--timeout", "30", "--", "/bin/sh", "-c", "tr a-z A-Z; echo err >&2; exit 5"},
                      "hello\n");
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_EQ(r.out, "HELLO\n");
  EXPECT_EQ(r.err, "err\n");
  Result bad = env_.run({"bwrap", "alpha", "--timeout", "0", "--", "true"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
}

TEST_P(Sandbox, EnterGivesAnInteractiveBashWithARealTerminal) {
  auto argv = env_.argv_for({"instance", "enter", "alpha"});
  auto envp = env_.env_for({"TERM=xterm"});
  int master = -1;
  pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : envp) e.push_back(s.data());
    e.push_back(nullptr);
    ::execve(a[0], a.data(), e.data());
    ::_exit(127);
  }
  const std::string script =
      "tty; [[ -t 0 ]] && echo STDIN-IS-TTY; set -o | grep -E '^monitor' ; echo $((6*7))-done; exit 5\n";
  ASSERT_EQ(::write(master, script.data(), script.size()), static_cast<ssize_t>(script.size()));
  std::string screen;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    screen.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  EXPECT_EQ(wait_child(pid, std::chrono::seconds(20)), 5) << screen;
  // bwrap shows the terminal as /dev/console; a command joining a living sandbox gets one of the
  // sandbox's own /dev/pts. Either way `tty` names a terminal device.
  EXPECT_TRUE(screen.find("/dev/console") != std::string::npos || screen.find("/dev/pts/") != std::string::npos)
      << screen;
  EXPECT_EQ(screen.find("not a tty"), std::string::npos) << screen;
  EXPECT_NE(screen.find("STDIN-IS-TTY"), std::string::npos) << screen;
  EXPECT_NE(screen.find("monitor        \ton"), std::string::npos) << screen;  // job control
  EXPECT_NE(screen.find("42-done"), std::string::npos) << screen;
  EXPECT_EQ(screen.find("no job control"), std::string::npos) << screen;
}

TEST(SandboxCli, EnterWithoutATerminalSaysWhatToDoInstead) {
  Env env;
  env.create("alpha");
  Result r = env.run({"instance", "enter", "alpha"}, "echo hi\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("needs a terminal"), std::string::npos) << r.err;
}
