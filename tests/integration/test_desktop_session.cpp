// The desktop session in a living sandbox, started and stopped with the commands the instances
// service runs (desktop/session.hpp) through the real binary and bwrap, and the accessibility
// helper (desktop/atspi.hpp) against a real Mousepad: on the host's root (its packages: make deps'
// DEPS_DESKTOP) as root and as a normal user, and as root on the desktop image 'test-desktop'
// (scripts/test-image.sh). Everything is checked from inside the sandbox.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "desktop/atspi.hpp"
#include "desktop/session.hpp"
#include "harness.hpp"

using namespace nshpc::test;
namespace desktop = nshpc::desktop;

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr desktop::Geometry kGeometry{1024, 768, 24};

// The Xauthority file the server gives the start command: one FamilyWild entry (any host) for
// display 0 with a MIT-MAGIC-COOKIE-1.
std::string xauthority(const std::string& cookie) {
  auto field = [](const std::string& s) {
    return std::string{static_cast<char>(s.size() >> 8), static_cast<char>(s.size() & 0xff)} + s;
  };
  return std::string("\xff\xff", 2) + field("") + field("0") + field("MIT-MAGIC-COOKIE-1") + field(cookie);
}

const std::string kCookie = "0123456789abcdef";

long long ms_since(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - since).count();
}

class DesktopSession : public ::testing::Test {
 protected:
  explicit DesktopSession(const std::string& toml = "") : env_(toml) {}

  // `argv` in the instance's living sandbox with the session's environment.
  Result in(const std::string& id, const std::vector<std::string>& argv, const std::string& input = "",
            seconds timeout = seconds(90)) {
    std::vector<std::string> args{"bwrap", id, "--", "env"};
    for (const auto& [name, value] : desktop::session_env()) args.push_back(name + "=" + value);
    args.insert(args.end(), argv.begin(), argv.end());
    return env_.run(args, input, timeout);
  }
  Result sh(const std::string& id, const std::string& script) { return in(id, {"/bin/sh", "-c", script}); }
  Result start(const std::string& id) { return in(id, desktop::start_command(kGeometry), xauthority(kCookie)); }
  Result stop(const std::string& id) { return in(id, desktop::stop_command()); }
  std::string ps(const std::string& id) { return env_.run({"instance", "ps", id}).out; }
  // The host pid of the instance's process whose command starts with `command`; 0 when none runs.
  // (Read from the host: a command of a living instance may have a pid namespace of its own, and
  // then sees no other command's processes.)
  pid_t host_pid(const std::string& id, const std::string& command) {
    std::istringstream lines(ps(id));
    std::string line;
    std::getline(lines, line);  // the header
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      pid_t pid = 0;
      std::string ppid, rss, age, cmd;
      if (fields >> pid >> ppid >> rss >> age >> cmd && cmd == command) return pid;
    }
    return 0;
  }

  desktop::Snapshot snapshot(const std::string& id) {
    const Result r = in(id, desktop::atspi_command(), R"({"op": "snapshot"})");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return desktop::parse_snapshot(r.out);
  }

  // What a host-root desktop needs from the host; "" when it has everything.
  std::string missing_on_host(const std::string& id) {
    for (std::string program : desktop::required_programs())
      if (!nshpc::fs::find_program(program)) return program;
    for (const char* program : {"mousepad", "xdpyinfo"})
      if (!nshpc::fs::find_program(program)) return program;
    if (sh(id, "python3 -c 'import gi; gi.require_version(\"Atspi\", \"2.0\"); import pyatspi'").exit_code != 0)
      return "python3's pyatspi (python3-pyatspi, gir1.2-atspi-2.0)";
    return "";
  }

  Env env_;
};

const std::vector<std::string> kSessionProcesses = {"Xvfb",        "xfwm4",        "xfce4-panel", "xfdesktop",
                                                    "xfsettingsd", "dbus-daemon",  "at-spi",      "session.sh",
                                                    "xfconfd",     "wrapper-2.0"};

// The first node of `snap` at or below `ref` ("": anywhere) with this role and name ("": any).
const desktop::Node* find(const desktop::Snapshot& snap, const std::string& ref, const std::string& role,
                          const std::string& name = "") {
  for (const auto& n : snap.nodes)
    if ((ref.empty() || n.ref == ref || n.ref.starts_with(ref + "/")) && n.role == role && (name.empty() || n.name == name))
      return &n;
  return nullptr;
}

}  // namespace

TEST_F(DesktopSession, StartsAnswersOnlyOnItsSocketReadsMousepadAndStopsEveryProcess) {
  env_.create("desk", {"--persistent", "--network", "off"});
  if (const std::string missing = missing_on_host("desk"); !missing.empty())
    GTEST_SKIP() << "the host lacks " << missing << " (make deps installs DEPS_DESKTOP)";

  const auto cold = std::chrono::steady_clock::now();
  Result started = start("desk");
  std::printf("desktop session: first start %lld ms\n", ms_since(cold));
  ASSERT_EQ(started.exit_code, 0) << started.err;
  EXPECT_EQ(started.out, "started\n");

  // The display answers with the cookie, at the size asked, and refuses a client without it.
  Result info = in("desk", {"xdpyinfo"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("dimensions:    1024x768 pixels"), std::string::npos) << info.out;
  EXPECT_NE(sh("desk", "XAUTHORITY=/dev/null xdpyinfo >/dev/null 2>&1").exit_code, 0) << "a client without the cookie";

  // Nothing listens but the socket files: no TCP port, no abstract socket (the sandbox's own
  // network namespace holds only its own sockets).
  Result unix_sockets = sh("desk", "cat /proc/net/unix");
  ASSERT_EQ(unix_sockets.exit_code, 0);
  EXPECT_NE(unix_sockets.out.find(" /tmp/.X11-unix/X0\n"), std::string::npos) << unix_sockets.out;
  EXPECT_NE(unix_sockets.out.find(" /tmp/.ns-hpc-desktop/bus\n"), std::string::npos) << unix_sockets.out;
  EXPECT_EQ(unix_sockets.out.find(" @"), std::string::npos) << "an abstract socket:\n" << unix_sockets.out;
  Result tcp = sh("desk", "cat /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6 | awk 'NR > 1 && $4 != \"st\"'");
  ASSERT_EQ(tcp.exit_code, 0);
  EXPECT_EQ(tcp.out, "") << "an IP socket";

  // A second start finds it running (the cookie given then is not used).
  Result again = in("desk", desktop::start_command(kGeometry), xauthority("fedcba9876543210"));
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "running\n");
  EXPECT_EQ(in("desk", {"xdpyinfo"}).exit_code, 0) << "the first cookie still works";

  // Mousepad on the display, through the accessibility helper: its menu and text area named, with
  // bounds; its File menu opened by the menu's own action.
  ASSERT_EQ(sh("desk", "mousepad >/dev/null 2>&1 &").exit_code, 0);
  desktop::Snapshot snap;
  const desktop::Node* app = nullptr;
  ASSERT_TRUE(eventually(
      [&] {
        snap = snapshot("desk");
        app = find(snap, "", "application", "mousepad");
        return app && find(snap, app->ref, "menu", "File") && find(snap, app->ref, "text");
      },
      seconds(30)))
      << desktop::snapshot_text(snap);
  const desktop::Node file = *find(snap, app->ref, "menu", "File");
  ASSERT_TRUE(file.bounds) << file.ref;
  EXPECT_GT(file.bounds->width, 0);
  EXPECT_EQ(file.actions, std::vector<std::string>{"click"});
  EXPECT_NE(desktop::snapshot_text(snap).find("- menu \"File\" [ref=" + file.ref + " bounds="), std::string::npos);
  const std::string app_ref = app->ref;

  Result element = in("desk", desktop::atspi_command(), R"({"op": "element", "ref": ")" + file.ref + R"("})");
  ASSERT_EQ(element.exit_code, 0) << element.err;
  EXPECT_EQ(desktop::parse_element(element.out).name, "File");

  Result pressed = in("desk", desktop::atspi_command(), R"({"op": "action", "ref": ")" + file.ref + R"(", "name": "click"})");
  ASSERT_EQ(pressed.exit_code, 0) << pressed.err;
  EXPECT_NO_THROW(desktop::parse_action(pressed.out));
  EXPECT_TRUE(eventually(
      [&] {
        snap = snapshot("desk");
        const desktop::Node* quit = find(snap, file.ref, "menu item", "Quit");
        return quit && quit->bounds;
      },
      seconds(10)))
      << "the File menu did not open:\n" << desktop::snapshot_text(snap);
  Result refused =
      in("desk", desktop::atspi_command(), R"({"op": "action", "ref": ")" + file.ref + R"(", "name": "explode"})");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("has no action 'explode'; its actions: click"), std::string::npos) << refused.err;
  Result gone = in("desk", desktop::atspi_command(), R"({"op": "element", "ref": ")" + app_ref + R"(/99"})");
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THROW(desktop::parse_element(gone.out), nshpc::Error);

  // The supervisor starts a killed X server again, and the session with it; and a killed window
  // manager.
  const pid_t x = host_pid("desk", "Xvfb"), wm = host_pid("desk", "xfwm4");
  ASSERT_GT(x, 0) << ps("desk");
  ASSERT_GT(wm, 0) << ps("desk");
  ASSERT_EQ(::kill(x, SIGKILL), 0);
  EXPECT_TRUE(eventually(
      [&] {
        const pid_t again = host_pid("desk", "Xvfb"), wm_again = host_pid("desk", "xfwm4");
        return again > 0 && again != x && wm_again > 0 && wm_again != wm && in("desk", {"xdpyinfo"}).exit_code == 0;
      },
      seconds(20)))
      << ps("desk");
  const pid_t wm2 = host_pid("desk", "xfwm4");
  ASSERT_EQ(::kill(wm2, SIGKILL), 0);
  EXPECT_TRUE(eventually([&] { return host_pid("desk", "xfwm4") > 0 && host_pid("desk", "xfwm4") != wm2; }, seconds(10)))
      << ps("desk");

  // Stop ends every process of the session and the applications on its display.
  Result stopped = stop("desk");
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(stopped.out, "stopped\n");
  std::string left;
  EXPECT_TRUE(eventually(
      [&] {
        left = ps("desk");
        for (const auto& name : kSessionProcesses)
          if (left.find(name) != std::string::npos) return false;
        return left.find("mousepad") == std::string::npos;
      },
      seconds(5)))
      << left;
  EXPECT_EQ(stop("desk").out, "not running\n");
  // The accessibility helper without a desktop says so (AT-SPI itself would abort).
  Result off = in("desk", desktop::atspi_command(), R"({"op": "snapshot"})");
  EXPECT_EQ(off.exit_code, 1);
  EXPECT_NE(off.err.find("the desktop's accessibility bus does not answer (is the desktop on?)"), std::string::npos)
      << off.err;

  // Warm: a start again in the same sandbox.
  const auto warm = std::chrono::steady_clock::now();
  started = start("desk");
  std::printf("desktop session: start in a running sandbox %lld ms\n", ms_since(warm));
  EXPECT_EQ(started.out, "started\n") << started.err;
  EXPECT_EQ(stop("desk").out, "stopped\n");
}

// On the host's network a socket in the abstract namespace would reach every user of the host:
// none of the session's sockets is one, nor an IP socket. Checked from the host, which shares the
// sandbox's network namespace here: the sockets each process of the instance holds, looked up in
// the namespace's tables.
TEST_F(DesktopSession, OnTheHostsNetworkNoProcessOfItListensBeyondItsSocketFiles) {
  env_.create("desk-host", {"--persistent", "--network", "host"});
  if (const std::string missing = missing_on_host("desk-host"); !missing.empty())
    GTEST_SKIP() << "the host lacks " << missing << " (make deps installs DEPS_DESKTOP)";
  Result started = start("desk-host");
  ASSERT_EQ(started.exit_code, 0) << started.err;
  ASSERT_EQ(sh("desk-host", "mousepad >/dev/null 2>&1 &").exit_code, 0);
  ASSERT_TRUE(eventually([&] { return host_pid("desk-host", "mousepad") > 0; }, seconds(10))) << ps("desk-host");

  std::set<std::string> inodes;  // "socket:[N]" -> N
  std::istringstream lines(ps("desk-host"));
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    const std::string pid = line.substr(0, line.find(' '));
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + pid + "/fd", ec)) {
      const std::string target = fs::read_symlink(fd.path(), ec).string();
      if (!ec && target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  ASSERT_FALSE(inodes.empty()) << "no socket of the instance's processes could be read";
  std::string ours;
  // /proc/net/unix: Num RefCount Protocol Flags Type St Inode [Path]
  std::istringstream unix_table(read_text("/proc/net/unix"));
  std::getline(unix_table, line);
  while (std::getline(unix_table, line)) {
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    f >> num >> refs >> proto >> flags >> type >> st >> inode >> path;
    if (inodes.contains(inode)) ours += path + "\n";
  }
  EXPECT_NE(ours.find("/tmp/.X11-unix/X0\n"), std::string::npos) << ours;
  EXPECT_EQ(ours.find('@'), std::string::npos) << "an abstract socket:\n" << ours;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"}) {
    std::istringstream ip(read_text(table));
    std::getline(ip, line);
    while (std::getline(ip, line)) {
      std::istringstream f(line);
      std::string field;
      for (int i = 0; i < 10; ++i) f >> field;  // the tenth column: the inode
      EXPECT_FALSE(inodes.contains(field)) << table << ": " << line;
    }
  }
  EXPECT_EQ(stop("desk-host").exit_code, 0);
}

namespace {

const fs::path kCache = test_image_cache();

class DesktopImageSession : public DesktopSession {
 protected:
  DesktopImageSession() : DesktopSession("images_dir = \"" + (kCache / "images").string() + "\"\n") {}
};

}  // namespace

// The desktop image as the integrator's desktop computers get it: Xfce's panel runs and its
// accessibility tree is read with the image's own pyatspi.
TEST_F(DesktopImageSession, XfcesPanelRunsOnTheDesktopImage) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root's cache has the desktop image (scripts/test-image.sh builds it as root)";
  if (!fs::exists(kCache / "images/test-desktop/current"))
    GTEST_SKIP() << "no image 'test-desktop' in " << kCache << " (scripts/test-image.sh, run by make test, builds it)";
  env_.create("desk-img", {"--image", "test-desktop", "--network", "off"});
  Result started = start("desk-img");
  ASSERT_EQ(started.exit_code, 0) << started.err;
  EXPECT_EQ(started.out, "started\n");
  std::string processes;
  EXPECT_TRUE(eventually(
      [&] {
        processes = ps("desk-img");
        return processes.find("xfce4-panel") != std::string::npos && processes.find("xfwm4") != std::string::npos;
      },
      seconds(10)))
      << processes;
  desktop::Snapshot snap;
  EXPECT_TRUE(eventually(
      [&] {
        snap = snapshot("desk-img");
        return find(snap, "", "application", "xfce4-panel") != nullptr;
      },
      seconds(20)))
      << desktop::snapshot_text(snap);
  const Result wm = in("desk-img", {"xprop", "-root", "_NET_SUPPORTING_WM_CHECK"});
  EXPECT_NE(wm.out.find("window id #"), std::string::npos) << "no window manager: " << wm.out << wm.err;
  EXPECT_EQ(stop("desk-img").out, "stopped\n");
}
