// The live view's back end: x11vnc in a host-root instance's desktop session (started by the real
// binary, `instance desktop ID on`), on its Unix socket only, reached by this process through
// instances::Desktops::connect_vnc (a Service on the test's config, as the server's relay will use
// it), spoken to as a browser would through desktop::RfbClientFilter. Run as root and as a normal
// user (scripts/test-as-user.sh).
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "config/config.hpp"
#include "desktop/rfb.hpp"
#include "harness.hpp"
#include "instances/desktops.hpp"
#include "instances/instances.hpp"

namespace nshpc::test {
namespace {

using namespace std::chrono_literals;

bool on_path(const char* program) {
  for (const char* dir : {"/usr/bin/", "/bin/", "/usr/local/bin/"})
    if (::access((std::string(dir) + program).c_str(), X_OK) == 0) return true;
  return false;
}

// Exactly `n` bytes from `fd` within 10 s ("" when it closed or stayed silent).
std::string read_exactly(int fd, std::size_t n) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (out.size() < n && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t got = ::read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (got <= 0) return "";
    out.append(buf, static_cast<std::size_t>(got));
  }
  return out.size() == n ? out : "";
}

void write_all(int fd, const std::string& bytes) {
  std::size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    ASSERT_GT(n, 0) << "write to the VNC server";
    at += static_cast<std::size_t>(n);
  }
}

unsigned be(const std::string& s, std::size_t at, std::size_t width) {
  unsigned v = 0;
  for (std::size_t i = 0; i < width; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

class DesktopVnc : public ::testing::Test {
 protected:
  // `toml`: more of the harness's [namespace] table, then the rest of the file.
  explicit DesktopVnc(std::string toml = "") : toml_(std::move(toml)) {}
  void SetUp() override {
    for (const char* program : {"Xvfb", "xfwm4", "xfce4-panel", "dbus-daemon", "x11vnc"})
      if (!on_path(program)) GTEST_SKIP() << program << " is not installed (make deps installs the desktop group)";
    env_ = std::make_unique<Env>(toml_ + "[desktop]\nhost_root = true\n");
    env_->create("desk", {"--persistent", "--network", "off"});
    config::LoadOptions options;
    options.explicit_path = env_->config_file();
    options.read_user_file = false;
    config_ = config::load(options).config;
    service_ = std::make_unique<instances::Service>(config_);
  }
  void TearDown() override {
    service_.reset();
    if (env_) env_->run({"instance", "stop", "desk"});
  }

  std::string shell(const std::string& command) {
    return env_->run({"bwrap", "desk", "--", "bash", "-c", command}).out;
  }
  store::Instance desk() { return service_->store().get("desk"); }

  std::string toml_;
  std::unique_ptr<Env> env_;
  config::Config config_;
  std::unique_ptr<instances::Service> service_;
};

TEST_F(DesktopVnc, TheLiveViewIsAVncServerOnTheSandboxsSocketOnlyAndAnswersAsRfb) {
  EXPECT_THROW(service_->desktops().connect_vnc(desk(), "test"), instances::DesktopOff);

  const auto began = std::chrono::steady_clock::now();
  const Result on = env_->run({"instance", "desktop", "desk", "on"}, "", 120s);
  ASSERT_EQ(on.exit_code, 0) << on.out << on.err;
  std::cerr << "desktop on (session with x11vnc started): "
            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count()
            << " ms\n";

  const auto asked = std::chrono::steady_clock::now();
  UniqueFd vnc = service_->desktops().connect_vnc(desk(), "test");
  ASSERT_TRUE(vnc);
  std::cerr << "connect_vnc: "
            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - asked).count()
            << " ms\n";

  // The handshake as a browser sends it, through the relay's filter.
  desktop::RfbClientFilter filter;
  ASSERT_EQ(read_exactly(vnc.get(), 12), "RFB 003.008\n");
  write_all(vnc.get(), filter.feed("RFB 003.008\n"));
  const std::string count = read_exactly(vnc.get(), 1);
  ASSERT_EQ(count.size(), 1u);
  const std::string types = read_exactly(vnc.get(), static_cast<unsigned char>(count[0]));
  EXPECT_EQ(types, std::string(1, '\x01')) << "x11vnc -nopw offers None only";
  write_all(vnc.get(), filter.feed(std::string(1, '\x01')));
  EXPECT_EQ(read_exactly(vnc.get(), 4), std::string(4, '\0')) << "SecurityResult OK";
  write_all(vnc.get(), filter.feed(std::string(1, '\x00')));
  const std::string init = read_exactly(vnc.get(), 24);
  ASSERT_EQ(init.size(), 24u);
  EXPECT_EQ(be(init, 0, 2), 1280u);
  EXPECT_EQ(be(init, 2, 2), 800u);
  const std::string name = read_exactly(vnc.get(), be(init, 20, 4));
  EXPECT_FALSE(name.empty());

  // A whole-screen update request gets a FramebufferUpdate (type 0) with at least one rectangle.
  const std::string request{'\x03', '\x00', '\x00', '\x00', '\x00', '\x00', '\x05', '\x00', '\x03', '\x20'};
  write_all(vnc.get(), filter.feed(request));
  const std::string update = read_exactly(vnc.get(), 4);
  ASSERT_EQ(update.size(), 4u);
  EXPECT_EQ(update[0], '\0');
  EXPECT_GE(be(update, 2, 2), 1u);

  // The VNC server's Unix socket listens in the network namespace this command sees
  // (/proc/net/unix is per namespace; flags 00010000 = listening), and no TCP socket listens there
  // at all (state 0A): x11vnc's [::]:5900 is not made.
  EXPECT_NE(shell("grep -c '00010000 0001 01 .* /tmp/.ns-hpc-desktop/vnc$' /proc/net/unix"), "0\n");
  const std::string tcp = shell("cat /proc/net/tcp /proc/net/tcp6");
  EXPECT_NE(tcp.find("local_address"), std::string::npos) << tcp;
  EXPECT_EQ(tcp.find(" 0A "), std::string::npos) << "a TCP listener in the sandbox:\n" << tcp;
}

TEST_F(DesktopVnc, AStaleOrPlantedSocketIsAClearErrorInBoundedTime) {
  const Result on = env_->run({"instance", "desktop", "desk", "on"}, "", 120s);
  ASSERT_EQ(on.exit_code, 0) << on.out << on.err;
  auto refused = [&](const std::string& want) {
    const auto began = std::chrono::steady_clock::now();
    try {
      service_->desktops().connect_vnc(desk(), "test");
      ADD_FAILURE() << "connected; wanted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    return std::chrono::steady_clock::now() - began;
  };
  // A link the sandbox planted in its place (to the X socket, which would answer) is not followed:
  // the link itself is found, and it is no socket.
  shell("rm -f /tmp/.ns-hpc-desktop/vnc && ln -s /tmp/.X11-unix/X0 /tmp/.ns-hpc-desktop/vnc");
  EXPECT_LT(refused("is not the socket of the live view"), 2s);
  // A link on the way (the runtime folder replaced by a link to a copy) is refused outright.
  shell("mv /tmp/.ns-hpc-desktop /tmp/.moved && ln -s /tmp/.moved /tmp/.ns-hpc-desktop");
  EXPECT_LT(refused("something other than its socket is in its place"), 2s);
  shell("rm /tmp/.ns-hpc-desktop && mv /tmp/.moved /tmp/.ns-hpc-desktop");
  // A file that is not a socket.
  shell("rm -f /tmp/.ns-hpc-desktop/vnc && echo x > /tmp/.ns-hpc-desktop/vnc");
  EXPECT_LT(refused("is not the socket of the live view"), 2s);
  // A socket nobody listens on: waited for a while (x11vnc may be restarting), then an error.
  shell("rm -f /tmp/.ns-hpc-desktop/vnc && python3 -c 'import socket; socket.socket(socket.AF_UNIX)"
        ".bind(\"/tmp/.ns-hpc-desktop/vnc\")'");
  const auto waited = refused("did not answer within 10 s");
  EXPECT_LT(waited, 13s);
  EXPECT_GE(waited, 9s);
}

// A root without x11vnc: the host's programs, all but x11vnc, on the sandbox's PATH.
class DesktopWithoutVnc : public DesktopVnc {
 protected:
  DesktopWithoutVnc() : DesktopVnc("path = \"/workspace/bin\"\n") {}
};

TEST_F(DesktopWithoutVnc, TheDesktopRunsAndTheLiveViewSaysItIsNotAvailable) {
  const fs::path bin = env_->instances() / "desk" / "workspace" / "bin";
  fs::create_directories(bin);
  for (const auto& entry : fs::directory_iterator("/usr/bin"))
    if (entry.path().filename() != "x11vnc") fs::create_symlink(entry.path(), bin / entry.path().filename());
  ASSERT_EQ(shell("command -v x11vnc; command -v Xvfb"), "/workspace/bin/Xvfb\n");

  const Result on = env_->run({"instance", "desktop", "desk", "on"}, "", 120s);
  ASSERT_EQ(on.exit_code, 0) << on.out << on.err;
  EXPECT_EQ(shell("test -S /tmp/.X11-unix/X0 && test -e /tmp/.ns-hpc-desktop/vnc.missing && echo up"), "up\n");
  const auto began = std::chrono::steady_clock::now();
  try {
    service_->desktops().connect_vnc(desk(), "test");
    ADD_FAILURE() << "connected to a live view that cannot run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not available: its root has no x11vnc"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - began, 2s);
}

}  // namespace
}  // namespace nshpc::test
