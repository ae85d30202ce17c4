// The display agent (ns-hpc __display) against a real Xvfb the test starts, and against fake X
// servers that lie: what a user of the desktop sees (pixels, a click, keys, typed text in an
// editor, windows, the clipboard), and what the server sees when the X server is hostile (an
// Error within the deadline, never a hang). Runs as root and as a normal user.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xcb/xcb.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"
#include "base/text.hpp"
#include "desktop/client.hpp"
#include "desktop/keys.hpp"
#include "harness.hpp"

#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STB_IMAGE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using nshpc::UniqueFd;
using nshpc::desktop::Agent;
using nshpc::desktop::AgentOptions;
using Clock = std::chrono::steady_clock;

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  std::ifstream("/dev/urandom", std::ios::binary).read(out.data(), static_cast<std::streamsize>(n));
  return out;
}

fs::path make_temp_dir() {
  char tmpl[] = "/tmp/nshpc-display-XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (!dir) throw std::runtime_error("mkdtemp");
  return dir;
}

UniqueFd connect_unix(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (!fd || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw nshpc::SysError(errno, "connect", path);
  return fd;
}

// A process of the test's (an X client, a window manager), in a process group of its own so
// that what it starts (a D-Bus daemon, xfconfd) ends with it.
class Program {
 public:
  Program() = default;
  Program(const std::vector<std::string>& argv, const std::vector<std::string>& env, const fs::path& log) {
    UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
    UniqueFd out(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    nshpc::SpawnSpec spec;
    spec.program = argv[0];
    spec.argv = argv;
    spec.envp = env;
    spec.fds = {{devnull.get(), 0}, {out.get(), 1}, {out.get(), 2}};
    spec.new_session = true;
    spec.die_with_parent = SIGKILL;
    child_ = nshpc::spawn(spec);
  }
  Program(Program&&) = default;
  Program& operator=(Program&& other) noexcept {
    stop();
    child_ = std::move(other.child_);
    return *this;
  }
  ~Program() { stop(); }
  pid_t pid() const { return child_.pid(); }
  bool ended_within(std::chrono::milliseconds wait) const {
    return child_.pidfd() >= 0 && nshpc::wait_pidfd(child_.pidfd(), wait);
  }
  // Ends the whole group: what it started too (xfconfd writes its files as it ends, and must be
  // done before the test's folder is removed).
  void stop() {
    if (child_.pid() <= 0) return;
    const pid_t group = child_.pid();
    ::kill(-group, SIGTERM);
    if (!ended_within(3s)) ::kill(-group, SIGKILL);
    child_ = nshpc::SpawnedChild{};  // reaps it
    if (!nshpc::test::eventually([&] { return ::kill(-group, 0) != 0; }, 3s)) ::kill(-group, SIGKILL);
  }

 private:
  nshpc::SpawnedChild child_;
};

// An Xvfb of the test's own: display :50 or the first free one above, a cookie only the test
// knows (-auth), no TCP; stopped with SIGTERM so it removes its socket and lock file.
class TestDisplay {
 public:
  explicit TestDisplay(int width = 1280, int height = 800) : dir_(make_temp_dir()), cookie_(random_bytes(16)) {
    ::chmod(dir_.c_str(), 0755);
    write_auth();
    for (int n = 50; n < 200 && number_ < 0; ++n) {
      if (fs::exists(fmt::format("/tmp/.X11-unix/X{}", n)) || fs::exists(fmt::format("/tmp/.X{}-lock", n))) continue;
      try_start(n, width, height);
    }
    if (number_ < 0)
      throw std::runtime_error("no Xvfb could be started on displays :50 to :199 (see " + dir_.string() + ")");
  }
  ~TestDisplay() {
    if (server_.pid() > 0) {
      ::kill(server_.pid(), SIGTERM);
      nshpc::wait_pidfd(server_.pidfd(), 5s);
      server_ = nshpc::SpawnedChild{};
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  TestDisplay(const TestDisplay&) = delete;
  TestDisplay& operator=(const TestDisplay&) = delete;

  std::string name() const { return fmt::format(":{}", number_); }
  std::string socket() const { return fmt::format("/tmp/.X11-unix/X{}", number_); }
  const std::string& cookie() const { return cookie_; }
  const fs::path& dir() const { return dir_; }
  UniqueFd connect() const { return connect_unix(socket()); }

  // The environment of an X client on this display, with a home of its own.
  std::vector<std::string> client_env() const {
    const fs::path home = dir_ / "home";
    fs::create_directories(home);
    return {"DISPLAY=" + name(), "XAUTHORITY=" + (dir_ / "auth").string(), "HOME=" + home.string(),
            "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "NO_AT_BRIDGE=1", "GSETTINGS_BACKEND=memory",
            "XDG_RUNTIME_DIR=" + home.string(),
            // No D-Bus session for GTK: it runs on its own (a window manager gets one of its own).
            "DBUS_SESSION_BUS_ADDRESS=unix:path=" + (dir_ / "no-bus").string()};
  }

  // Starts an X client on this display; its output goes to DIR/NAME.log.
  Program run(const std::vector<std::string>& argv, const std::string& log) const {
    return Program(argv, client_env(), dir_ / (log + ".log"));
  }

  std::unique_ptr<Agent> agent(AgentOptions options = {}) const {
    options.program = nshpc::test::binary();
    return Agent::start(connect(), cookie_, options, 10s);
  }

 private:
  // An Xauthority file: the cookie for this host's display (FamilyLocal) and for any (FamilyWild).
  void write_auth() const {
    const auto field = [](std::string_view s) {
      std::string out{static_cast<char>(s.size() >> 8), static_cast<char>(s.size() & 0xff)};
      return out.append(s);
    };
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string entries;
    for (const auto& [family, address] : {std::pair<int, std::string>{256, host}, {0xffff, ""}})
      entries += std::string{static_cast<char>(family >> 8), static_cast<char>(family & 0xff)} + field(address) +
                 field("") + field("MIT-MAGIC-COOKIE-1") + field(cookie_);
    std::ofstream(dir_ / "auth", std::ios::binary) << entries;
  }

  void try_start(int n, int width, int height) {
    nshpc::Pipe ready = nshpc::make_pipe();
    UniqueFd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
    UniqueFd log(::open((dir_ / "xvfb.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    nshpc::SpawnSpec spec;
    spec.program = "Xvfb";
    spec.argv = {"Xvfb",
                 fmt::format(":{}", n),
                 "-screen",
                 "0",
                 fmt::format("{}x{}x24", width, height),
                 "-nolisten",
                 "tcp",
                 "-auth",
                 (dir_ / "auth").string(),
                 "-displayfd",
                 "3",
                 "-noreset"};
    spec.fds = {{devnull.get(), 0}, {log.get(), 1}, {log.get(), 2}, {ready.write.get(), 3}};
    spec.die_with_parent = SIGKILL;
    nshpc::SpawnedChild server = nshpc::spawn(spec);
    ready.write.reset();
    // Xvfb writes its display number once it listens; EOF: it ended (the display was taken).
    std::string said;
    const auto until = Clock::now() + 20s;
    while (Clock::now() < until && said.find('\n') == std::string::npos) {
      pollfd p{ready.read.get(), POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[32];
      const ssize_t got = ::read(ready.read.get(), buf, sizeof buf);
      if (got <= 0) break;
      said.append(buf, static_cast<std::size_t>(got));
    }
    if (said.find('\n') == std::string::npos) return;  // `server` is killed and reaped here
    number_ = n;
    server_ = std::move(server);
  }

  fs::path dir_;
  std::string cookie_;
  int number_ = -1;
  nshpc::SpawnedChild server_;
};

template <typename T>
struct FreeDeleter {
  void operator()(T* p) const { std::free(p); }
};
template <typename T>
using XPtr = std::unique_ptr<T, FreeDeleter<T>>;

// The test's own X client: it makes the windows the agent must see and act on, and watches the
// events they get.
class XClient {
 public:
  explicit XClient(const TestDisplay& d) {
    UniqueFd fd = d.connect();
    std::string name = "MIT-MAGIC-COOKIE-1";
    std::string data = d.cookie();
    xcb_auth_info_t auth{static_cast<int>(name.size()), name.data(), static_cast<int>(data.size()), data.data()};
    c_ = xcb_connect_to_fd(fd.release(), &auth);
    if (xcb_connection_has_error(c_)) throw std::runtime_error("the test could not connect to its Xvfb");
    screen_ = xcb_setup_roots_iterator(xcb_get_setup(c_)).data;
  }
  ~XClient() { xcb_disconnect(c_); }
  XClient(const XClient&) = delete;
  XClient& operator=(const XClient&) = delete;

  xcb_connection_t* c() const { return c_; }
  xcb_window_t root() const { return screen_->root; }

  xcb_atom_t atom(const char* name) {
    XPtr<xcb_intern_atom_reply_t> r(xcb_intern_atom_reply(
        c_, xcb_intern_atom(c_, 0, static_cast<std::uint16_t>(std::strlen(name)), name), nullptr));
    return r ? r->atom : XCB_NONE;
  }

  // A mapped window filled with `rgb`; override-redirect ones are placed exactly where asked
  // (no window manager moves them).
  xcb_window_t window(int x, int y, int w, int h, std::uint32_t rgb, bool override_redirect, std::uint32_t events,
                      const std::string& title = "", const std::string& wm_class = "") {
    const xcb_window_t win = xcb_generate_id(c_);
    const std::array<std::uint32_t, 3> values{rgb, override_redirect ? 1u : 0u,
                                              events | XCB_EVENT_MASK_EXPOSURE | XCB_EVENT_MASK_STRUCTURE_NOTIFY};
    xcb_create_window(c_, XCB_COPY_FROM_PARENT, win, root(), static_cast<std::int16_t>(x), static_cast<std::int16_t>(y),
                      static_cast<std::uint16_t>(w), static_cast<std::uint16_t>(h), 0, XCB_WINDOW_CLASS_INPUT_OUTPUT,
                      screen_->root_visual, XCB_CW_BACK_PIXEL | XCB_CW_OVERRIDE_REDIRECT | XCB_CW_EVENT_MASK,
                      values.data());
    if (!title.empty()) {
      xcb_change_property(c_, XCB_PROP_MODE_REPLACE, win, XCB_ATOM_WM_NAME, XCB_ATOM_STRING, 8,
                          static_cast<std::uint32_t>(title.size()), title.data());
      xcb_change_property(c_, XCB_PROP_MODE_REPLACE, win, atom("_NET_WM_NAME"), atom("UTF8_STRING"), 8,
                          static_cast<std::uint32_t>(title.size()), title.data());
    }
    if (!wm_class.empty())
      xcb_change_property(c_, XCB_PROP_MODE_REPLACE, win, XCB_ATOM_WM_CLASS, XCB_ATOM_STRING, 8,
                          static_cast<std::uint32_t>(wm_class.size()), wm_class.data());
    // A window manager closes politely (WM_DELETE_WINDOW), instead of killing this connection.
    const xcb_atom_t del = atom("WM_DELETE_WINDOW");
    xcb_change_property(c_, XCB_PROP_MODE_REPLACE, win, atom("WM_PROTOCOLS"), XCB_ATOM_ATOM, 32, 1, &del);
    xcb_map_window(c_, win);
    xcb_flush(c_);
    const auto mapped = wait([&](const xcb_generic_event_t& e) {
      return (e.response_type & 0x7f) == XCB_EXPOSE && reinterpret_cast<const xcb_expose_event_t&>(e).window == win;
    });
    if (!mapped) throw std::runtime_error("the test's window was never exposed");
    return win;
  }

  // The first event `want` takes within `limit` (others are dropped); null when none came.
  XPtr<xcb_generic_event_t> wait(const std::function<bool(const xcb_generic_event_t&)>& want,
                                 std::chrono::milliseconds limit = 5s) {
    const auto until = Clock::now() + limit;
    for (;;) {
      while (XPtr<xcb_generic_event_t> ev{xcb_poll_for_event(c_)})
        if (want(*ev)) return ev;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0 || xcb_connection_has_error(c_)) return nullptr;
      pollfd p{xcb_get_file_descriptor(c_), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(left));
    }
  }

  // Every event that comes within `limit`.
  std::vector<XPtr<xcb_generic_event_t>> events(std::chrono::milliseconds limit) {
    std::vector<XPtr<xcb_generic_event_t>> out;
    wait(
        [&](const xcb_generic_event_t& e) {
          auto* copy = static_cast<xcb_generic_event_t*>(std::malloc(sizeof(xcb_generic_event_t) + 4));
          std::memcpy(copy, &e, 32);
          out.emplace_back(copy);
          return false;
        },
        limit);
    return out;
  }

  // The keysym of a keycode at a level, as the keyboard map says now.
  std::uint32_t keysym(std::uint8_t keycode, int level = 0) {
    XPtr<xcb_get_keyboard_mapping_reply_t> r(
        xcb_get_keyboard_mapping_reply(c_, xcb_get_keyboard_mapping(c_, keycode, 1), nullptr));
    if (!r || level >= r->keysyms_per_keycode) return 0;
    return xcb_get_keyboard_mapping_keysyms(r.get())[level];
  }

  std::uint32_t selection_owner(const char* selection) {
    XPtr<xcb_get_selection_owner_reply_t> r(
        xcb_get_selection_owner_reply(c_, xcb_get_selection_owner(c_, atom(selection)), nullptr));
    return r ? r->owner : XCB_NONE;
  }

 private:
  xcb_connection_t* c_ = nullptr;
  xcb_screen_t* screen_ = nullptr;
};

// A decoded capture: RGB pixels.
struct Image {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;
  std::array<int, 3> at(int x, int y) const {
    const std::size_t i =
        (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x)) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

Image decode(const std::string& encoded) {
  Image img;
  int channels = 0;
  unsigned char* px = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(encoded.data()),
                                            static_cast<int>(encoded.size()), &img.width, &img.height, &channels, 3);
  if (!px) throw std::runtime_error(std::string("the capture does not decode: ") + stbi_failure_reason());
  img.rgb.assign(px, px + static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3);
  stbi_image_free(px);
  return img;
}

bool near(const std::array<int, 3>& got, const std::array<int, 3>& want, int tolerance) {
  for (int i = 0; i < 3; ++i)
    if (std::abs(got[static_cast<std::size_t>(i)] - want[static_cast<std::size_t>(i)]) > tolerance) return false;
  return true;
}

std::string show(const std::array<int, 3>& c) { return fmt::format("({}, {}, {})", c[0], c[1], c[2]); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const nshpc::Error& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr std::array<int, 3> kRed{255, 0, 0}, kBlue{0, 0, 255};

json press(std::uint32_t keysym, bool down) { return {{"key", keysym}, {"down", down}}; }

// A chord as the tools will send it: every key down in order, then up in reverse.
json chord_events(std::string_view chord) {
  json events = json::array();
  const auto syms = nshpc::desktop::parse_chord(chord);
  for (auto s : syms) events.push_back(press(s, true));
  for (auto it = syms.rbegin(); it != syms.rend(); ++it) events.push_back(press(*it, false));
  return events;
}

Image capture(Agent& agent, json request) {
  request["op"] = "capture";
  const auto frame = agent.call(request, 10s);
  Image img = decode(frame.payload);
  EXPECT_EQ(frame.header["width"], img.width);
  EXPECT_EQ(frame.header["height"], img.height);
  return img;
}

// ---------------------------------------------------------------------------------------------

// The tests on a real X server: skipped where Xvfb is not installed (make deps' desktop group).
class DisplayAgent : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nshpc::fs::find_program("Xvfb")) GTEST_SKIP() << "Xvfb is not installed: the display agent is not checked";
  }
};

TEST_F(DisplayAgent, CapturesWhatIsOnTheScreenAsPngAndJpeg) {
  TestDisplay display;
  XClient x(display);
  x.window(100, 50, 200, 120, 0xff0000, true, 0);
  x.window(700, 400, 64, 32, 0x0000ff, true, 0);
  auto agent = display.agent();
  EXPECT_EQ(agent->width(), 1280);
  EXPECT_EQ(agent->height(), 800);

  const Image png = capture(*agent, {{"format", "png"}});
  ASSERT_EQ(png.width, 1280);
  ASSERT_EQ(png.height, 800);
  // Exactly the window's pixels: every corner inside, and just outside is something else.
  for (auto [x0, y0] : {std::pair{100, 50}, {299, 50}, {100, 169}, {299, 169}, {200, 110}})
    EXPECT_EQ(png.at(x0, y0), kRed) << x0 << "," << y0;
  for (auto [x0, y0] : {std::pair{99, 50}, {300, 50}, {100, 49}, {100, 170}})
    EXPECT_NE(png.at(x0, y0), kRed) << x0 << "," << y0;
  EXPECT_EQ(png.at(700, 400), kBlue);
  EXPECT_EQ(png.at(763, 431), kBlue);
  EXPECT_NE(png.at(764, 431), kBlue);

  const Image jpeg = capture(*agent, {{"format", "jpeg"}, {"quality", 80}});
  ASSERT_EQ(jpeg.width, 1280);
  ASSERT_EQ(jpeg.height, 800);
  EXPECT_TRUE(near(jpeg.at(200, 110), kRed, 24)) << show(jpeg.at(200, 110));
  EXPECT_TRUE(near(jpeg.at(732, 416), kBlue, 24)) << show(jpeg.at(732, 416));
  EXPECT_FALSE(near(jpeg.at(50, 300), kRed, 60)) << show(jpeg.at(50, 300));
}

TEST_F(DisplayAgent, CapturesARegionAtItsOwnSizeScaledDownOrZoomed) {
  TestDisplay display;
  XClient x(display);
  x.window(100, 50, 200, 120, 0xff0000, true, 0);
  x.window(300, 50, 200, 120, 0x0000ff, true, 0);
  auto agent = display.agent();

  // The region itself: red left half, blue right half.
  const Image region = capture(*agent, {{"format", "png"}, {"region", {100, 50, 500, 170}}});
  ASSERT_EQ(region.width, 400);
  ASSERT_EQ(region.height, 120);
  EXPECT_EQ(region.at(0, 0), kRed);
  EXPECT_EQ(region.at(199, 119), kRed);
  EXPECT_EQ(region.at(200, 0), kBlue);
  EXPECT_EQ(region.at(399, 119), kBlue);

  // Scaled down to a quarter: still red then blue, the boundary averaged in one column at most.
  const Image small =
      capture(*agent, {{"format", "png"}, {"region", {100, 50, 500, 170}}, {"width", 100}, {"height", 30}});
  ASSERT_EQ(small.width, 100);
  ASSERT_EQ(small.height, 30);
  EXPECT_EQ(small.at(10, 15), kRed);
  EXPECT_EQ(small.at(48, 29), kRed);
  EXPECT_EQ(small.at(51, 0), kBlue);
  EXPECT_EQ(small.at(99, 29), kBlue);

  // One side given: the other keeps the proportions (the whole screen to 640 wide: 400 high).
  const Image half = capture(*agent, {{"format", "jpeg"}, {"width", 640}});
  EXPECT_EQ(half.width, 640);
  EXPECT_EQ(half.height, 400);
  EXPECT_TRUE(near(half.at(100, 55), kRed, 24)) << show(half.at(100, 55));

  // A zoom: 20x10 pixels across the boundary to 400x200, red on the left, blue on the right.
  const Image zoom =
      capture(*agent, {{"format", "png"}, {"region", {290, 100, 310, 110}}, {"width", 400}, {"height", 200}});
  ASSERT_EQ(zoom.width, 400);
  ASSERT_EQ(zoom.height, 200);
  EXPECT_EQ(zoom.at(20, 100), kRed);
  EXPECT_EQ(zoom.at(180, 100), kRed);
  EXPECT_EQ(zoom.at(220, 100), kBlue);
  EXPECT_EQ(zoom.at(380, 100), kBlue);

  // Wrong regions and sizes are refused, and the agent goes on.
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "capture"}, {"region", {0, 0, 1281, 10}}}, 5s);
            }).find("not inside the 1280x800 screen"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "capture"}, {"region", {10, 10, 10, 20}}}, 5s);
            }).find("region"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "capture"}, {"width", 100000}}, 5s);
            }).find("'width' must be an integer from 1 to 8192"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "capture"}, {"format", "gif"}}, 5s);
            }).find("'format'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "teleport"}}, 5s);
            }).find("'teleport' is not a request"),
            std::string::npos);
  EXPECT_TRUE(agent->alive());
  EXPECT_EQ(capture(*agent, {{"format", "png"}, {"region", {150, 60, 160, 70}}}).at(5, 5), kRed);
}

TEST_F(DisplayAgent, AClickLandsOnTheWindowAtItsCoordinates) {
  TestDisplay display;
  XClient x(display);
  const xcb_window_t target =
      x.window(400, 300, 100, 100, 0x00ff00, true, XCB_EVENT_MASK_BUTTON_PRESS | XCB_EVENT_MASK_BUTTON_RELEASE);
  auto agent = display.agent();
  agent->call({{"op", "input"},
               {"events", {{{"move", {450, 320}}}, {{"button", 1}, {"down", true}}, {{"button", 1}, {"down", false}}}}},
              5s);
  const auto pressed =
      x.wait([](const xcb_generic_event_t& e) { return (e.response_type & 0x7f) == XCB_BUTTON_PRESS; });
  ASSERT_TRUE(pressed);
  const auto& p = *reinterpret_cast<const xcb_button_press_event_t*>(pressed.get());
  EXPECT_EQ(p.event, target);
  EXPECT_EQ(p.detail, 1);
  EXPECT_EQ(p.event_x, 50);
  EXPECT_EQ(p.event_y, 20);
  EXPECT_EQ(p.root_x, 450);
  EXPECT_EQ(p.root_y, 320);
  EXPECT_TRUE(x.wait([](const xcb_generic_event_t& e) { return (e.response_type & 0x7f) == XCB_BUTTON_RELEASE; }));

  // A right button pressed and never released: the agent releases it before it answers.
  agent->call({{"op", "input"}, {"events", {{{"move", {401, 301}}}, {{"button", 3}, {"down", true}}}}}, 5s);
  const auto released =
      x.wait([](const xcb_generic_event_t& e) { return (e.response_type & 0x7f) == XCB_BUTTON_RELEASE; });
  ASSERT_TRUE(released);
  EXPECT_EQ(reinterpret_cast<const xcb_button_release_event_t*>(released.get())->detail, 3);

  const auto info = agent->call({{"op", "info"}}, 5s).header;
  EXPECT_EQ(info["cursor"], json({401, 301}));
  EXPECT_EQ(info["width"], 1280);

  // Off the screen is refused, not clamped.
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "input"}, {"events", {{{"move", {1280, 5}}}}}}, 5s);
            }).find("off the 1280x800 screen"),
            std::string::npos);
}

TEST_F(DisplayAgent, AKeyChordArrivesAsItsKeysymsWithItsModifiers) {
  TestDisplay display;
  XClient x(display);
  const xcb_window_t target =
      x.window(10, 10, 300, 200, 0x808080, true, XCB_EVENT_MASK_KEY_PRESS | XCB_EVENT_MASK_KEY_RELEASE);
  xcb_set_input_focus(x.c(), XCB_INPUT_FOCUS_POINTER_ROOT, target, XCB_CURRENT_TIME);
  xcb_flush(x.c());
  auto agent = display.agent();
  const auto keys_pressed = [&](std::string_view chord) {
    agent->call({{"op", "input"}, {"events", chord_events(chord)}}, 5s);
    std::vector<std::pair<std::uint32_t, std::uint16_t>> presses;  // keysym at level 0, state
    int releases = 0;
    for (const auto& e : x.events(400ms)) {
      if ((e->response_type & 0x7f) == XCB_KEY_PRESS) {
        const auto& k = *reinterpret_cast<const xcb_key_press_event_t*>(e.get());
        presses.emplace_back(x.keysym(k.detail), k.state);
      }
      releases += (e->response_type & 0x7f) == XCB_KEY_RELEASE;
    }
    EXPECT_EQ(releases, static_cast<int>(presses.size())) << chord;
    return presses;
  };
  const auto ctrl_shift_t = keys_pressed("ctrl+shift+t");
  ASSERT_EQ(ctrl_shift_t.size(), 3u);
  EXPECT_EQ(ctrl_shift_t[0].first, 0xffe3u);  // Control_L
  EXPECT_EQ(ctrl_shift_t[1].first, 0xffe1u);  // Shift_L
  EXPECT_EQ(ctrl_shift_t[2].first, std::uint32_t{'t'});
  EXPECT_EQ(ctrl_shift_t[2].second & (XCB_MOD_MASK_CONTROL | XCB_MOD_MASK_SHIFT),
            XCB_MOD_MASK_CONTROL | XCB_MOD_MASK_SHIFT);

  // A keysym on the Shift level gets Shift: "alt+A" is Alt, Shift, a.
  const auto alt_a = keys_pressed("alt+A");
  ASSERT_EQ(alt_a.size(), 3u);
  EXPECT_EQ(alt_a[0].first, 0xffe9u);  // Alt_L
  EXPECT_EQ(alt_a[1].first, 0xffe1u);  // Shift_L
  EXPECT_EQ(alt_a[2].first, std::uint32_t{'a'});
  EXPECT_TRUE(alt_a[2].second & XCB_MOD_MASK_SHIFT);

  // Shift held by the chord itself: no second Shift.
  const auto shift_a = keys_pressed("shift+A");
  ASSERT_EQ(shift_a.size(), 2u);
  EXPECT_EQ(shift_a[0].first, 0xffe1u);
  EXPECT_EQ(shift_a[1].first, std::uint32_t{'a'});
  EXPECT_TRUE(shift_a[1].second & XCB_MOD_MASK_SHIFT);

  const auto enter = keys_pressed("Return");
  ASSERT_EQ(enter.size(), 1u);
  EXPECT_EQ(enter[0].first, 0xff0du);

  // A key left down is released when the request ends.
  agent->call({{"op", "input"}, {"events", {press('q', true)}}}, 5s);
  EXPECT_TRUE(x.wait([](const xcb_generic_event_t& e) { return (e.response_type & 0x7f) == XCB_KEY_RELEASE; }));

  // A keysym the keyboard lacks arrives through a spare keycode mapped to it while it is typed,
  // and the keyboard map is as before afterwards.
  std::vector<std::uint32_t> before;
  for (int kc = 8; kc < 256; ++kc) before.push_back(x.keysym(static_cast<std::uint8_t>(kc)));
  agent->call({{"op", "input"}, {"events", chord_events("€")}}, 5s);
  const auto euro = x.wait([](const xcb_generic_event_t& e) { return (e.response_type & 0x7f) == XCB_KEY_PRESS; });
  ASSERT_TRUE(euro);
  const auto euro_keycode = reinterpret_cast<const xcb_key_press_event_t*>(euro.get())->detail;
  EXPECT_EQ(before[static_cast<std::size_t>(euro_keycode - 8)], 0u) << "a spare keycode";
  std::vector<std::uint32_t> after;
  for (int kc = 8; kc < 256; ++kc) after.push_back(x.keysym(static_cast<std::uint8_t>(kc)));
  EXPECT_EQ(after, before);
}

TEST_F(DisplayAgent, TypesUnicodeIntoAnEditorExactly) {
  if (!nshpc::fs::find_program("mousepad")) GTEST_SKIP() << "mousepad is not installed";
  TestDisplay display;
  const fs::path file = display.dir() / "typed.txt";
  std::ofstream(file).close();
  ::chmod(display.dir().c_str(), 0777);
  Program editor = display.run({"mousepad", file.string()}, "mousepad");
  auto agent = display.agent();
  // Its window (no window manager here: the agent gives it the focus itself).
  std::string id;
  ASSERT_TRUE(nshpc::test::eventually(
      [&] {
        const json windows = agent->call({{"op", "windows"}}, 5s).header["windows"];
        for (const auto& w : windows)
          if (w["wm_class"] == "Mousepad" && w["title"].get<std::string>().find("typed.txt") != std::string::npos)
            id = w["id"].get<std::string>();
        return !id.empty();
      },
      30s))
      << nshpc::test::read_text(display.dir() / "mousepad.log") << agent->call({{"op", "windows"}}, 5s).header.dump();
  agent->call({{"op", "window"}, {"id", id}, {"action", "activate"}}, 5s);
  std::this_thread::sleep_for(500ms);  // the editor takes the focus it was given
  const std::string text = "Hello äöü€😀 日本";
  const auto typed = agent->call({{"op", "type"}, {"text", text}}, 20s).header;
  EXPECT_EQ(typed["characters"], 14);
  agent->call({{"op", "input"}, {"events", chord_events("ctrl+s")}}, 5s);
  std::string saved;
  EXPECT_TRUE(nshpc::test::eventually(
      [&] {
        saved = nshpc::test::read_text(file);
        return !saved.empty();
      },
      15s));
  EXPECT_EQ(saved, text);
  EXPECT_TRUE(nshpc::test::eventually(
      [&] {
        return agent->call({{"op", "info"}}, 5s).header["focused"]["id"] == id;
      },
      5s));

  // More characters the keyboard lacks than it has spare keycodes (Xvfb's map has 19): typed in
  // runs, each through its own remap; a line break and a tab on the way.
  const std::string more = "\nΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ\tαβγδεζηθικλμνξοπρστυφχψω ĉĝĥĵŝŭ 中文字符测试";
  EXPECT_EQ(agent->call({{"op", "type"}, {"text", more}}, 30s).header["characters"], 64);
  agent->call({{"op", "input"}, {"events", chord_events("ctrl+s")}}, 5s);
  EXPECT_TRUE(nshpc::test::eventually([&] { return (saved = nshpc::test::read_text(file)) == text + more; }, 15s))
      << saved;
}

TEST_F(DisplayAgent, WindowsAreListedAndTheWindowManagerActsOnThem) {
  if (!nshpc::fs::find_program("xfwm4") || !nshpc::fs::find_program("dbus-run-session"))
    GTEST_SKIP() << "xfwm4 (with dbus-run-session) is not installed: the EWMH window actions are not checked";
  TestDisplay display;
  XClient x(display);
  Program wm = display.run({"dbus-run-session", "--", "xfwm4", "--compositor=off"}, "xfwm4");
  const xcb_atom_t check = x.atom("_NET_SUPPORTING_WM_CHECK");
  ASSERT_TRUE(nshpc::test::eventually(
      [&] {
        XPtr<xcb_get_property_reply_t> r(
            xcb_get_property_reply(x.c(), xcb_get_property(x.c(), 0, x.root(), check, XCB_ATOM_WINDOW, 0, 1), nullptr));
        return r && xcb_get_property_value_length(r.get()) == 4;
      },
      30s))
      << nshpc::test::read_text(display.dir() / "xfwm4.log");
  const xcb_window_t win = x.window(50, 60, 320, 200, 0x00ffff, false, 0, "ns-hpc test window äö",
                                    std::string("nshpc-test\0NsHpcTest\0", 21));
  const std::string id = fmt::format("0x{:x}", win);
  auto agent = display.agent();
  const auto listed = [&]() -> json {
    const json windows = agent->call({{"op", "windows"}}, 5s).header["windows"];
    for (const auto& w : windows)
      if (w["id"] == id) return w;
    return nullptr;
  };
  json w;
  ASSERT_TRUE(nshpc::test::eventually([&] { return !(w = listed()).is_null(); }, 15s))
      << agent->call({{"op", "windows"}}, 5s).header.dump();
  EXPECT_EQ(w["title"], "ns-hpc test window äö");
  EXPECT_EQ(w["wm_class"], "NsHpcTest");
  // Its size with the window manager's frame around the 320x200 of the client.
  EXPECT_GE(w["width"].get<int>(), 320);
  EXPECT_GE(w["height"].get<int>(), 200);
  EXPECT_LT(w["width"].get<int>(), 320 + 100);
  EXPECT_TRUE(w["desktop"].is_number_integer());

  agent->call(
      {{"op", "window"}, {"id", id}, {"action", "move"}, {"x", 200}, {"y", 150}, {"width", 500}, {"height", 300}}, 5s);
  EXPECT_TRUE(nshpc::test::eventually(
      [&] {
        w = listed();
        return w["x"] == 200 && w["y"] == 150 && w["width"] == 500 && w["height"] == 300;
      },
      10s))
      << w.dump();

  agent->call({{"op", "window"}, {"id", id}, {"action", "maximize"}}, 5s);
  const auto has = [&](const char* state) {
    w = listed();
    const auto& s = w["states"];
    return std::find(s.begin(), s.end(), state) != s.end();
  };
  EXPECT_TRUE(nshpc::test::eventually([&] { return has("maximized_vert") && has("maximized_horz"); }, 10s)) << w.dump();
  agent->call({{"op", "window"}, {"id", id}, {"action", "minimize"}}, 5s);
  EXPECT_TRUE(nshpc::test::eventually([&] { return has("hidden"); }, 10s)) << w.dump();
  agent->call({{"op", "window"}, {"id", id}, {"action", "restore"}}, 5s);
  EXPECT_TRUE(nshpc::test::eventually([&] { return !has("hidden") && !has("maximized_vert"); }, 10s)) << w.dump();
  agent->call({{"op", "window"}, {"id", id}, {"action", "activate"}}, 5s);
  EXPECT_TRUE(nshpc::test::eventually([&] { return listed()["active"] == true; }, 10s));
  EXPECT_TRUE(nshpc::test::eventually(
      [&] {
        return agent->call({{"op", "info"}}, 5s).header["focused"]["id"] == id;
      },
      10s));

  // Close: the window manager asks the window to go (WM_DELETE_WINDOW).
  const xcb_atom_t protocols = x.atom("WM_PROTOCOLS"), del = x.atom("WM_DELETE_WINDOW");
  agent->call({{"op", "window"}, {"id", id}, {"action", "close"}}, 5s);
  EXPECT_TRUE(x.wait(
      [&](const xcb_generic_event_t& e) {
        if ((e.response_type & 0x7f) != XCB_CLIENT_MESSAGE) return false;
        const auto& m = reinterpret_cast<const xcb_client_message_event_t&>(e);
        return m.window == win && m.type == protocols && m.data.data32[0] == del;
      },
      10s));

  EXPECT_NE(error_of([&] {
              agent->call({{"op", "window"}, {"id", "0x1"}, {"action", "close"}}, 5s);
            }).find("no window 0x1"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "window"}, {"id", id}, {"action", "explode"}}, 5s);
            }).find("'action'"),
            std::string::npos);
}

TEST_F(DisplayAgent, TheClipboardRoundTripsAndOtherApplicationsPasteIt) {
  TestDisplay display;
  XClient x(display);
  auto agent = display.agent();
  EXPECT_EQ(agent->call({{"op", "clipboard_get"}}, 5s).header["text"], "");  // nobody owns it
  const std::string text = "äöü€😀";
  agent->call({{"op", "clipboard_set"}, {"text", text}}, 5s);
  EXPECT_EQ(agent->call({{"op", "clipboard_get"}}, 5s).header["text"], text);
  EXPECT_NE(x.selection_owner("CLIPBOARD"), static_cast<std::uint32_t>(XCB_NONE));
  if (!nshpc::fs::find_program("xclip"))
    GTEST_SKIP() << "xclip is not installed: pastes into other applications are not checked";

  // Another application pastes it while the agent waits between requests.
  Program paste =
      display.run({"sh", "-c", "xclip -selection clipboard -o > " + (display.dir() / "pasted").string()}, "xclip-out");
  EXPECT_TRUE(paste.ended_within(10s));
  EXPECT_EQ(nshpc::test::read_text(display.dir() / "pasted"), text);

  // And the agent reads what another application copied.
  std::ofstream(display.dir() / "copied") << "from xclip ✓\nline two";
  Program copy = display.run(
      {"sh", "-c", "exec xclip -selection clipboard -i -quiet -loops 1 < " + (display.dir() / "copied").string()},
      "xclip-in");
  const std::uint32_t agents = x.selection_owner("CLIPBOARD");
  ASSERT_TRUE(nshpc::test::eventually([&] { return x.selection_owner("CLIPBOARD") != agents; }, 10s));
  EXPECT_EQ(agent->call({{"op", "clipboard_get"}}, 5s).header["text"], "from xclip ✓\nline two");
  EXPECT_TRUE(copy.ended_within(5s));
}

TEST_F(DisplayAgent, AWrongCookieIsRefusedWithTheServersReason) {
  TestDisplay display;
  AgentOptions options;
  options.program = nshpc::test::binary();
  const auto started = Clock::now();
  const std::string e = error_of([&] { Agent::start(display.connect(), random_bytes(16), options, 10s); });
  EXPECT_NE(e.find("refused the connection"), std::string::npos) << e;
  EXPECT_LT(Clock::now() - started, 5s);
  EXPECT_NE(error_of([&] { Agent::start(display.connect(), "short", options, 10s); }).find("16 bytes"),
            std::string::npos);
}

std::string proc_status(pid_t pid, const std::string& field) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(field + ":")) return std::string(nshpc::text::trim(line.substr(field.size() + 1)));
  return "";
}

TEST_F(DisplayAgent, RunsConfinedAsTheIdentityItIsGiven) {
  TestDisplay display;
  AgentOptions options;
  const bool root = ::geteuid() == 0;
  if (root) options.identity = nshpc::users::Identity{65534, 65534};
  auto agent = display.agent(options);
  const pid_t pid = agent->pid();
  ASSERT_GT(pid, 0);
  const std::string uid = root ? "65534" : std::to_string(::getuid());
  EXPECT_EQ(proc_status(pid, "Uid"), fmt::format("{}\t{}\t{}\t{}", uid, uid, uid, uid));
  EXPECT_EQ(proc_status(pid, "Seccomp"), "2");
  EXPECT_EQ(proc_status(pid, "NoNewPrivs"), "1");
  // Its address space is limited (512 MiB by default).
  std::string limits = nshpc::test::read_text(fmt::format("/proc/{}/limits", pid));
  EXPECT_NE(limits.find("Max address space         536870912            536870912"), std::string::npos) << limits;
  // Its descriptors: the X connection and the control socket, and the pipe that holds 0, 1 and 2
  // (standard error catches xcb's messages); no file, nothing else.
  std::vector<std::string> fds;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fmt::format("/proc/{}/fd", pid), ec))
    fds.push_back(entry.path().filename().string() + " " + fs::read_symlink(entry.path(), ec).string().substr(0, 6));
  if (!ec) {  // a normal user may not look (the agent is not dumpable)
    std::sort(fds.begin(), fds.end());
    EXPECT_EQ(fds, (std::vector<std::string>{"0 pipe:[", "1 pipe:[", "2 pipe:[", "3 socket", "4 socket"}));
  }
  // And it works confined: a capture, a click, the clipboard.
  EXPECT_EQ(capture(*agent, {{"format", "png"}, {"region", {0, 0, 8, 8}}}).width, 8);
  agent->call({{"op", "input"}, {"events", {{{"move", {5, 5}}}, {{"button", 1}, {"down", true}}}}}, 5s);
  agent->call({{"op", "clipboard_set"}, {"text", "x"}}, 5s);
  EXPECT_EQ(agent->call({{"op", "clipboard_get"}}, 5s).header["text"], "x");
  EXPECT_TRUE(agent->alive());
  EXPECT_EQ(proc_status(pid, "Seccomp"), "2");
}

TEST_F(DisplayAgent, AnAgentThatDiesIsAnErrorAndStaysStopped) {
  TestDisplay display;
  auto agent = display.agent();
  const pid_t pid = agent->pid();
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto started = Clock::now();
  const std::string e = error_of([&] { agent->call({{"op", "info"}}, 5s); });
  EXPECT_NE(e.find("the display agent ended during 'info' (killed by signal 9"), std::string::npos) << e;
  EXPECT_LT(Clock::now() - started, 3s);
  EXPECT_FALSE(agent->alive());
  EXPECT_EQ(agent->pid(), -1);
  EXPECT_NE(error_of([&] { agent->call({{"op", "info"}}, 5s); }).find("was stopped"), std::string::npos);
}

// ---- hostile X servers: the test listens on a Unix socket and plays the X server

// The bytes of a connection setup reply: one 24-bit TrueColor screen of width x height; a liar
// may claim more depths than it describes, or a shorter length than it sends.
std::string setup_reply(int width, int height, unsigned depths = 1, std::uint16_t claimed_words = 0) {
  std::string body;
  const auto u8 = [&](unsigned v) { body += static_cast<char>(v & 0xff); };
  const auto u16 = [&](unsigned v) { u8(v), u8(v >> 8); };
  const auto u32 = [&](unsigned v) { u16(v & 0xffff), u16(v >> 16); };
  u32(1);           // release
  u32(0x00200000);  // resource id base
  u32(0x001fffff);  // resource id mask
  u32(256);         // motion buffer
  u16(4);           // vendor length
  u16(0xffff);      // maximum request length
  u8(1);            // screens
  u8(1);            // pixmap formats
  u8(0), u8(0), u8(32), u8(32), u8(8), u8(255), u32(0);
  body += "Fake";
  u8(24), u8(32), u8(32), body.append(5, '\0');          // format: depth 24, 32 bits a pixel, pad 32
  u32(0x100), u32(0x20), u32(0xffffff), u32(0), u32(0);  // root, colormap, white, black, input masks
  u16(static_cast<unsigned>(width)), u16(static_cast<unsigned>(height)), u16(300), u16(200), u16(1), u16(1);
  u32(0x21), u8(0), u8(0), u8(24), u8(depths);  // root visual, backing, save unders, depth, depths
  u8(24), u8(0), u16(1), u32(0);                // depth 24, one visual
  u32(0x21), u8(4), u8(8), u16(256), u32(0xff0000), u32(0xff00), u32(0xff), u32(0);  // TrueColor
  std::string head{1, 0, 11, 0, 0, 0};
  const std::uint16_t words = claimed_words ? claimed_words : static_cast<std::uint16_t>(body.size() / 4);
  head += static_cast<char>(words & 0xff);
  head += static_cast<char>(words >> 8);
  return head + body;
}

// A fake X server on a Unix socket of its own: `play` gets each accepted connection.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> play) : dir_(make_temp_dir()) {
    ::chmod(dir_.c_str(), 0755);
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, (dir_ / "X").c_str(), sizeof addr.sun_path - 1);
    if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener_.get(), 4) != 0)
      throw std::runtime_error("the fake X server could not listen");
    thread_ = std::thread([this, play = std::move(play)] {
      pollfd p{listener_.get(), POLLIN, 0};
      while (!stop_) {
        if (::poll(&p, 1, 100) <= 0) continue;
        UniqueFd client(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!client) continue;
        play(client.get());
        served_++;
      }
    });
  }
  ~FakeServer() {
    stop_ = true;
    thread_.join();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  UniqueFd connect() const { return connect_unix((dir_ / "X").string()); }
  int served() const { return served_; }

 private:
  fs::path dir_;
  UniqueFd listener_;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

// Reads what the client sends for up to `limit` (at most `max` bytes).
std::string take(int fd, std::chrono::milliseconds limit, std::size_t max = 1 << 16) {
  std::string got;
  const auto until = Clock::now() + limit;
  while (got.size() < max && Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, max - got.size()));
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

void give(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

// Starts an agent on `server` with `deadline`; the error, and how long it took.
std::pair<std::string, std::chrono::milliseconds> start_against(const FakeServer& server,
                                                                std::chrono::milliseconds deadline) {
  AgentOptions options;
  options.program = nshpc::test::binary();
  const auto started = Clock::now();
  std::string e = error_of([&] {
    auto agent = Agent::start(server.connect(), random_bytes(16), options, deadline);
    // Connected after all: a request must fail then, not hang.
    agent->call({{"op", "capture"}}, deadline);
  });
  return {e, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started)};
}

TEST(DisplayAgentHostileServer, GarbageIsAnError) {
  // Seeds 1 and 2 say "success, 100 words follow" and send random words: refused as they are
  // read. The others are random from the first byte: refused, or waited for until the deadline.
  for (unsigned seed = 1; seed <= 4; ++seed) {
    FakeServer server([seed](int fd) {
      take(fd, 300ms, 48);
      std::mt19937 random(seed);
      std::string garbage(8192, '\0');
      for (char& c : garbage) c = static_cast<char>(random());
      if (seed <= 2) garbage[0] = 1, garbage[6] = 100, garbage[7] = 0;
      give(fd, garbage);
      take(fd, 3s);
    });
    const auto [error, took] = start_against(server, 2s);
    EXPECT_NE(error, "(no error)") << seed;
    if (seed <= 2) {
      EXPECT_NE(error.find("the desktop's X server"), std::string::npos) << seed << ": " << error;
      EXPECT_EQ(error.find("did not answer"), std::string::npos) << seed << ": " << error;
    }
    EXPECT_LT(took, 3s) << seed << ": " << error;
  }
}

TEST(DisplayAgentHostileServer, AServerThatNeverAnswersTimesOut) {
  FakeServer server([](int fd) { take(fd, 4s); });
  const auto [error, took] = start_against(server, 1500ms);
  EXPECT_NE(error.find("the desktop's X server did not answer within 1.5 s"), std::string::npos) << error;
  EXPECT_GE(took, 1400ms);
  EXPECT_LT(took, 3s);
}

TEST(DisplayAgentHostileServer, AGiganticScreenIsRefused) {
  FakeServer server([](int fd) {
    take(fd, 300ms, 48);
    give(fd, setup_reply(65535, 65535));
    take(fd, 3s);
  });
  const auto [error, took] = start_against(server, 5s);
  EXPECT_NE(error.find("a screen of 65535x65535"), std::string::npos) << error;
  EXPECT_LT(took, 4s);
}

TEST(DisplayAgentHostileServer, ASetupWhoseCountsLieIsRefused) {
  // Five depths claimed, one described; then a length that ends before the screen.
  for (const auto& reply : {setup_reply(640, 480, 5), setup_reply(640, 480, 1, 12)}) {
    FakeServer server([reply](int fd) {
      take(fd, 300ms, 48);
      give(fd, reply);
      take(fd, 3s);
    });
    const auto [error, took] = start_against(server, 5s);
    EXPECT_NE(error.find("broken connection setup"), std::string::npos) << error;
    EXPECT_LT(took, 4s);
  }
}

TEST(DisplayAgentHostileServer, AReplyClaimingAGiganticLengthIsAnError) {
  // A good setup, then a reply to the first request that claims 1 GiB follows it.
  FakeServer server([](int fd) {
    take(fd, 300ms, 48);
    give(fd, setup_reply(640, 480));
    take(fd, 300ms);
    std::string reply(32, '\0');
    reply[0] = 1;                                               // a reply
    reply[2] = 1;                                               // to request 1
    reply[4] = 0, reply[5] = 0, reply[6] = 0, reply[7] = 0x10;  // 0x10000000 words
    give(fd, reply);
    take(fd, 3s);
  });
  const auto [error, took] = start_against(server, 5s);
  EXPECT_NE(error, "(no error)");
  EXPECT_LT(took, 6s) << error;
}

TEST(DisplayAgentHostileServer, AServerThatGoesSilentAfterTheSetupTimesOut) {
  FakeServer server([](int fd) {
    take(fd, 300ms, 48);
    give(fd, setup_reply(640, 480));
    take(fd, 4s);
  });
  const auto [error, took] = start_against(server, 1500ms);
  EXPECT_NE(error.find("did not answer within 1.5 s"), std::string::npos) << error;
  EXPECT_LT(took, 3s);
}

// ---- a hostile agent: what the server does with the replies of a subverted display agent
// (a script in its place that says hello properly, then answers the next request badly)

std::unique_ptr<Agent> start_fake_agent(const fs::path& dir, const std::string& answer) {
  const fs::path script = dir / "agent.py";
  std::ofstream(script) << R"(#!/usr/bin/python3
import json, os, struct, sys, time
def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(4, n - len(data))
        if not chunk: sys.exit(0)
        data += chunk
    return data
def frame():
    header = json.loads(read(struct.unpack("<I", read(4))[0]))
    read(struct.unpack("<I", read(4))[0])
    return header
def send(raw, payload=b""):
    os.write(4, struct.pack("<I", len(raw)) + raw + struct.pack("<I", len(payload)) + payload)
frame()
send(json.dumps({"ok": True, "width": 640, "height": 480, "depth": 24}).encode())
while True:
    request = frame()
)" << answer << "\n";
  ::chmod(script.c_str(), 0755);
  AgentOptions options;
  options.program = script.string();
  int pair[2];
  ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair);
  ::close(pair[1]);
  return Agent::start(UniqueFd(pair[0]), random_bytes(16), options, 5s);
}

TEST(DisplayAgentHostileAgent, RepliesOfTheWrongShapeStopIt) {
  if (!nshpc::fs::find_program("python3")) GTEST_SKIP() << "python3 plays the subverted agent";
  const fs::path dir = make_temp_dir();
  ::chmod(dir.c_str(), 0755);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"    send(b'{\"ok\": \"yes\"}')", "no boolean 'ok'"},
      {"    send(b'{\"ok\": true, \"width\": \"wide\", \"height\": 1, \"cursor\": [0, 0], \"focused\": null}')",
       "no screen size"},
      {"    send(b'{\"ok\": true, \"width\": 640, \"height\": 480, \"cursor\": [0], \"focused\": null}')",
       "no cursor position"},
      {"    send(b'{\"ok\": true}', b'payload')", "a payload where none belongs"},
      {"    send(b'[1, 2, 3]')", "broke the wire"},
      {"    os.write(4, struct.pack('<I', 0xffffffff))", "broke the wire"},
      {"    time.sleep(30)", "did not answer 'info' within 1 s"},
      {"    sys.exit(3)", "ended during 'info' (exit status 3)"},
  };
  for (const auto& [answer, expected] : cases) {
    auto agent = start_fake_agent(dir, answer);
    const auto started = Clock::now();
    const std::string e = error_of([&] { agent->call({{"op", "info"}}, 1s); });
    EXPECT_NE(e.find(expected), std::string::npos) << answer << ": " << e;
    EXPECT_LT(Clock::now() - started, 2500ms) << answer;
    EXPECT_FALSE(agent->alive()) << answer;
  }
  // A capture whose payload is not the image asked for.
  auto agent =
      start_fake_agent(dir, "    send(b'{\"ok\": true, \"format\": \"png\", \"width\": 2, \"height\": 2}', b'GIF89a')");
  EXPECT_NE(error_of([&] {
              agent->call({{"op", "capture"}, {"format", "png"}}, 2s);
            }).find("not a png image"),
            std::string::npos);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(DisplayAgentHostileAgent, ItsErrorsAreCleanedAndItLivesOn) {
  if (!nshpc::fs::find_program("python3")) GTEST_SKIP() << "python3 plays the subverted agent";
  const fs::path dir = make_temp_dir();
  ::chmod(dir.c_str(), 0755);
  auto agent = start_fake_agent(
      dir, "    send(json.dumps({'ok': False, 'error': 'bad\\x1b[31m\\nthing ' + 'x' * 1000}).encode())");
  const std::string e = error_of([&] { agent->call({{"op", "info"}}, 2s); });
  EXPECT_TRUE(e.starts_with("bad[31mthing xxx")) << e;
  EXPECT_EQ(nshpc::text::utf8_length(e), 301u) << e;  // 300 and the ellipsis
  EXPECT_EQ(e.find('\x1b'), std::string::npos);
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_TRUE(agent->alive());
  EXPECT_NE(error_of([&] { agent->call({{"op", "info"}}, 2s); }), "(no error)");
  EXPECT_TRUE(agent->alive());
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
