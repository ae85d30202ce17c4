// The desktop as an agent uses it, through `ns-hpc run` on stdio: a host-root living instance
// with [desktop] host_root (Xvfb, Xfce and the test's GTK app from the host's packages), real X,
// real pixels. Run as root and as a normal user (scripts/test-as-user.sh).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "files/content.hpp"
#include "harness.hpp"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wcast-qual"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace nshpc::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A window of one solid colour above a button; each press of the button appends a line to the file
// named by its argument. GTK through python3-gi, as the host has it.
constexpr const char* kApp = R"PY(
import sys, gi
gi.require_version("Gtk", "3.0")
from gi.repository import Gdk, Gtk
out = sys.argv[1]
css = Gtk.CssProvider()
css.load_from_data(b"#colour { background-color: #d01030; }")
Gtk.StyleContext.add_provider_for_screen(Gdk.Screen.get_default(), css, Gtk.STYLE_PROVIDER_PRIORITY_APPLICATION)
win = Gtk.Window(title="nshpc test app")
win.set_default_size(320, 280)
box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL)
area = Gtk.Box()
area.set_name("colour")
area.set_size_request(320, 200)
button = Gtk.Button(label="Press me")
def pressed(_):
    with open(out, "a") as f:
        f.write("pressed\n")
button.connect("clicked", pressed)
box.pack_start(area, True, True, 0)
box.pack_start(button, False, False, 0)
win.add(box)
win.connect("destroy", Gtk.main_quit)
win.show_all()
win.move(100, 100)
Gtk.main()
)PY";

bool on_path(const char* program) {
  for (const char* dir : {"/usr/bin/", "/bin/", "/usr/local/bin/"})
    if (::access((std::string(dir) + program).c_str(), X_OK) == 0) return true;
  return false;
}

struct Pixels {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;
  std::array<int, 3> at(int x, int y) const {
    const std::size_t i = (static_cast<std::size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

// The image content of a tools/call response, decoded.
Pixels image_of(const json& response) {
  Pixels p;
  for (const json& c : response["result"]["content"]) {
    if (c.value("type", "") != "image") continue;
    const auto bytes = files::base64_decode(c["data"].get<std::string>());
    if (!bytes) break;
    int n = 0;
    unsigned char* data = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(bytes->data()),
                                                static_cast<int>(bytes->size()), &p.width, &p.height, &n, 3);
    if (!data) break;
    p.rgb.assign(data, data + static_cast<std::size_t>(p.width) * p.height * 3);
    stbi_image_free(data);
  }
  return p;
}

// The image of a response kept where a person can look at it when a check about it fails.
std::string kept(const json& response, const std::string& name) {
  for (const json& c : response["result"]["content"]) {
    if (c.value("type", "") != "image") continue;
    const auto bytes = files::base64_decode(c["data"].get<std::string>());
    const std::string file = "/tmp/nshpc-desktop-" + name + (c.value("mimeType", "") == "image/png" ? ".png" : ".jpg");
    if (bytes) std::ofstream(file, std::ios::binary) << *bytes;
    return "the screenshot is " + file;
  }
  return "no image";
}

bool near(const std::array<int, 3>& got, const std::array<int, 3>& want, int slack) {
  for (int i = 0; i < 3; ++i)
    if (std::abs(got[i] - want[i]) > slack) return false;
  return true;
}

bool is_error(const json& response) {
  return response.is_object() && response.contains("result") && response["result"].value("isError", false);
}

std::vector<std::string> tool_names(McpSession& mcp) {
  std::vector<std::string> names;
  const json list = mcp.wait_for(mcp.request("tools/list", json::object()));
  for (const json& t : list["result"]["tools"]) names.push_back(t["name"].get<std::string>());
  return names;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

class Desktop : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {"Xvfb", "xfwm4", "xfce4-panel", "mousepad", "dbus-daemon"})
      if (!on_path(program)) GTEST_SKIP() << program << " is not installed (make deps installs the desktop group)";
    if (std::system("/usr/bin/python3 -c 'import gi; gi.require_version(\"Gtk\", \"3.0\")' 2>/dev/null") != 0)
      GTEST_SKIP() << "python3-gi with GTK 3 (gir1.2-gtk-3.0) is not installed";
    env_ = std::make_unique<Env>("[desktop]\nhost_root = true\n");
    env_->create("desk", {"--persistent", "--network", "off"});
    mcp_ = std::make_unique<McpSession>(*env_);
  }
  void TearDown() override {
    mcp_.reset();
    if (env_) env_->run({"instance", "stop", "desk"});
  }

  json on() {
    return mcp_->tool("set_desktop_environment", {{"instance_id", "desk"}, {"enabled", true}});
  }
  json call(const std::string& tool, json args, std::chrono::seconds timeout = 60s) {
    args["instance_id"] = "desk";
    return mcp_->call_and_wait(tool, args, timeout);
  }
  std::string shell(const std::string& command, const std::string& input = "") {
    json args = {{"instance_id", "desk"}, {"command", command}};
    if (!input.empty()) args["stdin"] = input;
    const json r = mcp_->tool("terminal_execute", args);
    return r.value("stdout", "");
  }
  // The window whose title contains `title`, once it is on the desktop (null after 20 s).
  json window(const std::string& title) {
    json found;
    eventually(
        [&] {
          const json r = call("list_windows", json::object());
          if (!r.is_object() || !r.contains("result") || !r["result"].contains("structuredContent")) {
            ADD_FAILURE() << "list_windows: " << r.dump().substr(0, 600);
            return true;
          }
          for (const json& w : r["result"]["structuredContent"]["windows"])
            if (w.value("title", "").find(title) != std::string::npos) found = w;
          return found.is_object();
        },
        20s);
    return found;
  }
  std::string read_workspace(const std::string& name) { return read_text(env_->instances() / "desk" / "workspace" / name); }

  std::unique_ptr<Env> env_;
  std::unique_ptr<McpSession> mcp_;
};

TEST_F(Desktop, ScreenToolsAreListedWhileTheDesktopIsOnAndSayHowToTurnItOn) {
  EXPECT_FALSE(has(tool_names(*mcp_), "computer"));
  EXPECT_TRUE(has(tool_names(*mcp_), "set_desktop_environment"));
  const json off = call("computer", {{"action", "screenshot"}});
  ASSERT_TRUE(is_error(off)) << off.dump();
  EXPECT_NE(result_text(off).find("set_desktop_environment"), std::string::npos) << result_text(off);

  const json r = on();
  EXPECT_TRUE(r.value("desktop_environment", false)) << r.dump();
  EXPECT_TRUE(mcp_->notified("notifications/tools/list_changed"));
  const auto names = tool_names(*mcp_);
  for (const char* tool : {"computer", "look_at_screen", "click", "type", "scroll", "list_windows", "switch_window",
                           "maximize_window", "restore_window", "minimize_window", "close_window", "move_window",
                           "clipboard", "open"})
    EXPECT_TRUE(has(names, tool)) << tool;
  // Commands get the display.
  EXPECT_NE(shell("echo $DISPLAY; xdpyinfo | grep dimensions").find("1280x800"), std::string::npos);

  mcp_->tool("set_desktop_environment", {{"instance_id", "desk"}, {"enabled", false}});
  EXPECT_TRUE(mcp_->notified("notifications/tools/list_changed"));
  EXPECT_FALSE(has(tool_names(*mcp_), "computer"));
  EXPECT_EQ(shell("echo \"[$DISPLAY]\"; ls /tmp/.X11-unix 2>/dev/null | wc -l"), "[]\n0\n");
}

TEST_F(Desktop, PixelsClicksAndTheAccessibilityTreeOfARealApplication) {
  on();
  shell("cat > /workspace/app.py", kApp);
  shell("setsid python3 /workspace/app.py /workspace/pressed.txt >/workspace/app.log 2>&1 < /dev/null &");
  ASSERT_TRUE(window("nshpc test app").is_object()) << shell("cat /workspace/app.log");

  // Its colour, where the window manager put it (once it has painted it), in PNG and in JPEG.
  json w;
  json png_shot;
  Pixels png;
  int cx = 0, cy = 0;
  const bool painted = eventually(
      [&] {
        w = window("nshpc test app");
        cx = w["x"].get<int>() + 160;
        cy = w["y"].get<int>() + 100;
        png_shot = call("computer", {{"action", "screenshot"}, {"format", "png"}});
        png = image_of(png_shot);
        return png.width == 1280 && png.height == 800 && near(png.at(cx, cy), {208, 16, 48}, 0);
      },
      10s);
  ASSERT_EQ(png.width, 1280);
  ASSERT_EQ(png.height, 800);
  EXPECT_TRUE(painted) << png.at(cx, cy)[0] << "," << png.at(cx, cy)[1] << " at " << cx << "," << cy << "; " << w.dump()
                       << "; " << kept(png_shot, "app");
  const Pixels jpeg = image_of(call("computer", {{"action", "screenshot"}}));
  EXPECT_TRUE(near(jpeg.at(cx, cy), {208, 16, 48}, 24));

  // A click on the button (below the colour) presses it.
  const json click = call("computer", {{"action", "left_click"},
                                       {"coordinate", {cx, w["y"].get<int>() + w["height"].get<int>() - 20}}});
  ASSERT_FALSE(is_error(click)) << result_text(click);
  EXPECT_TRUE(eventually([&] { return read_workspace("pressed.txt") == "pressed\n"; }, 5s)) << read_workspace("pressed.txt");

  // The accessibility tree names it; click on its ref presses it again.
  const json look = call("look_at_screen", json::object());
  ASSERT_FALSE(is_error(look)) << result_text(look);
  std::string ref;
  for (const json& node : look["result"]["structuredContent"]["accessibility"]["elements"])
    if (node.value("name", "") == "Press me" && node.value("role", "").find("button") != std::string::npos)
      ref = node.value("ref", "");
  ASSERT_FALSE(ref.empty()) << result_text(look).substr(0, 3000);
  EXPECT_NE(result_text(look).find("Press me"), std::string::npos);
  const json by_ref = call("click", {{"element", ref}});
  ASSERT_FALSE(is_error(by_ref)) << result_text(by_ref);
  EXPECT_TRUE(eventually([&] { return read_workspace("pressed.txt") == "pressed\npressed\n"; }, 5s));
}

TEST_F(Desktop, TypingAnyScriptIntoMousepadSavesExactlyThoseBytes) {
  on();
  shell("setsid mousepad /workspace/typed.txt >/dev/null 2>&1 < /dev/null &");
  // As an agent does: once its window is listed, brought to the front, a click into its text.
  ASSERT_TRUE(window("typed.txt").is_object());
  const json front = call("switch_window", {{"window", "typed.txt"}});
  ASSERT_FALSE(is_error(front)) << result_text(front);
  const json editor = window("typed.txt");
  ASSERT_FALSE(is_error(call("computer", {{"action", "left_click"},
                                          {"coordinate", {editor["x"].get<int>() + editor["width"].get<int>() / 2,
                                                          editor["y"].get<int>() + editor["height"].get<int>() / 2}}})));
  ASSERT_TRUE(eventually([&] { return window("typed.txt").value("active", false); }, 10s)) << window("typed.txt").dump();
  const std::string text = "Grüße äöü €😀 日本語";
  const json typed = call("type", {{"text", text}});
  ASSERT_FALSE(is_error(typed)) << result_text(typed);
  const json saved = call("computer", {{"action", "key"}, {"text", "ctrl+s"}});
  ASSERT_FALSE(is_error(saved)) << result_text(saved);
  EXPECT_TRUE(eventually([&] { return read_workspace("typed.txt") == text; }, 10s))
      << "typed.txt holds '" << read_workspace("typed.txt") << "'; "
      << kept(call("computer", {{"action", "screenshot"}, {"format", "png"}}), "mousepad");
}

TEST_F(Desktop, WindowToolsMoveAndCloseAKnownWindow) {
  on();
  shell("cat > /workspace/app.py", kApp);
  shell("setsid python3 /workspace/app.py /workspace/pressed.txt >/dev/null 2>&1 < /dev/null &");
  ASSERT_TRUE(window("nshpc test app").is_object());
  const json moved = call("move_window", {{"window", "nshpc test"}, {"x", 400}, {"y", 300}});
  ASSERT_FALSE(is_error(moved)) << result_text(moved);
  EXPECT_TRUE(eventually(
      [&] {
        const json w = window("nshpc test app");
        return w.is_object() && std::abs(w["x"].get<int>() - 400) <= 12 && std::abs(w["y"].get<int>() - 300) <= 40;
      },
      5s))
      << window("nshpc test app").dump();
  // The button held down across calls, as left_mouse_down and left_mouse_up are: a drag of its
  // title bar moves it.
  const json at = window("nshpc test app");
  const int tx = at["x"].get<int>() + 60, ty = at["y"].get<int>() + 12;
  ASSERT_FALSE(is_error(call("computer", {{"action", "left_mouse_down"}, {"coordinate", {tx, ty}}})));
  ASSERT_FALSE(is_error(call("computer", {{"action", "mouse_move"}, {"coordinate", {tx + 150, ty + 100}}})));
  ASSERT_FALSE(is_error(call("computer", {{"action", "left_mouse_up"}})));
  EXPECT_TRUE(eventually(
      [&] {
        const json w = window("nshpc test app");
        return w.is_object() && std::abs(w["x"].get<int>() - (at["x"].get<int>() + 150)) <= 12;
      },
      5s))
      << at.dump() << " -> " << window("nshpc test app").dump();
  const json ambiguous = call("close_window", {{"window", "zzz-no-such-window"}});
  EXPECT_TRUE(is_error(ambiguous));
  const json closed = call("close_window", {{"window", "nshpc test app"}});
  ASSERT_FALSE(is_error(closed)) << result_text(closed);
  EXPECT_TRUE(eventually([&] { return shell("pgrep -f app.py || true").empty(); }, 10s));
}

TEST_F(Desktop, ABatchStopsAtTheFirstFailureAndBoundsAreRefusedWithTheBound) {
  on();
  const json batch = call("computer", {{"actions",
                                        {{{"action", "mouse_move"}, {"coordinate", {10, 10}}},
                                         {{"action", "left_click"}, {"coordinate", {5000, 5}}},
                                         {{"action", "type"}, {"text", "never"}}}}});
  ASSERT_TRUE(is_error(batch)) << batch.dump();
  const std::string text = result_text(batch);
  EXPECT_NE(text.find("1. mouse_move: mouse moved"), std::string::npos) << text;
  EXPECT_NE(text.find("outside the screen"), std::string::npos) << text;
  EXPECT_NE(text.find("3. type: error: Not executed: an earlier computer action in this turn failed."), std::string::npos)
      << text;
  const json cursor = call("computer", {{"action", "cursor_position"}});
  EXPECT_EQ(cursor["result"]["structuredContent"]["cursor"], json::array({10, 10})) << cursor.dump();

  const json wait = call("computer", {{"action", "wait"}, {"duration", 101}});
  EXPECT_TRUE(is_error(wait));
  EXPECT_NE(result_text(wait).find("0 to 100 seconds"), std::string::npos) << result_text(wait);
  const json hold = call("computer", {{"action", "hold_key"}, {"text", "shift"}, {"duration", 1000}});
  EXPECT_NE(result_text(hold).find("0 to 100 seconds"), std::string::npos) << result_text(hold);
  const json unknown = call("computer", {{"actions", {{{"action", "teleport"}}}}});
  EXPECT_NE(result_text(unknown).find("left_click_drag"), std::string::npos) << result_text(unknown);
  const json key = call("computer", {{"action", "key"}, {"text", "ctrl+nosuchkey"}});
  EXPECT_TRUE(is_error(key));
  EXPECT_NE(result_text(key).find("nosuchkey"), std::string::npos) << result_text(key);
}

TEST_F(Desktop, ClipboardRoundTripsAndTheDesktopComesBackWithARestart) {
  on();
  const json set = call("clipboard", {{"action", "set"}, {"text", "äöü€😀 clip"}});
  ASSERT_FALSE(is_error(set)) << result_text(set);
  const json got = call("clipboard", {{"action", "get"}});
  EXPECT_EQ(got["result"]["structuredContent"].value("text", ""), "äöü€😀 clip") << got.dump();
  // Another program on the display sees it too.
  EXPECT_EQ(shell("xclip -o -selection clipboard"), "äöü€😀 clip");

  mcp_->tool("restart_instance", {{"instance_id", "desk"}});
  const json shot = call("computer", {{"action", "screenshot"}});
  ASSERT_FALSE(is_error(shot)) << shot.dump().substr(0, 800);
  EXPECT_EQ(image_of(shot).width, 1280);
  const json described = mcp_->tool("describe_instance", {{"instance_id", "desk"}});
  EXPECT_TRUE(described.value("desktop", false)) << described.dump();
}

TEST_F(Desktop, AHostileDisplayGivesAnErrorNotAHangAndNeverAHostSocket) {
  on();
  ASSERT_FALSE(is_error(call("computer", {{"action", "cursor_position"}})));
  // The sandbox ends its X server and puts a link to a host path in place of the socket.
  shell("pkill -f .ns-hpc-desktop/session.sh; pkill -x Xvfb; sleep 0.5; rm -f /tmp/.X11-unix/X0; "
        "ln -s /run/dbus/system_bus_socket /tmp/.X11-unix/X0");
  mcp_->tool("restart_instance", {{"instance_id", "desk"}});  // the agent's connection ends
  shell("pkill -f .ns-hpc-desktop/session.sh; pkill -x Xvfb; sleep 0.5; rm -f /tmp/.X11-unix/X0; "
        "ln -s /run/dbus/system_bus_socket /tmp/.X11-unix/X0");
  const auto start = std::chrono::steady_clock::now();
  const json linked = call("computer", {{"action", "screenshot"}}, 30s);
  ASSERT_TRUE(linked.is_object()) << "no answer";
  EXPECT_TRUE(is_error(linked)) << linked.dump().substr(0, 500);
  EXPECT_NE(result_text(linked).find("X0"), std::string::npos) << result_text(linked);
  // A fake X server that answers garbage.
  shell("rm -f /tmp/.X11-unix/X0; setsid python3 -c '"
        "import socket,os\n"
        "s=socket.socket(socket.AF_UNIX); s.bind(\"/tmp/.X11-unix/X0\"); s.listen(8)\n"
        "while True:\n"
        "  c,_=s.accept(); c.recv(4096); c.send(os.urandom(65536))\n"
        "' >/dev/null 2>&1 </dev/null &");
  const json garbage = call("computer", {{"action", "screenshot"}}, 30s);
  ASSERT_TRUE(garbage.is_object()) << "no answer";
  EXPECT_TRUE(is_error(garbage)) << garbage.dump().substr(0, 500);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 40s);
  // The server still serves.
  EXPECT_FALSE(is_error(mcp_->call_and_wait("list_instances", json::object())));
}

}  // namespace
}  // namespace nshpc::test

namespace nshpc::test {
namespace {

// Another instance, even one on the host's network (where an abstract X socket would be shared),
// finds no display of the first: its socket is on that sandbox's own /tmp, Xvfb listens on
// nothing else, and the cookie is the instance's.
TEST_F(Desktop, AnotherInstanceCannotUseItsDisplay) {
  env_->run({"instance", "update", "desk", "--network", "host"});
  env_->create("other", {"--persistent", "--network", "host"});
  on();
  EXPECT_NE(shell("xdpyinfo >/dev/null && echo answers"), "");
  const Result other = env_->run({"bwrap", "other", "--", "sh", "-c",
                                  "ls -A /tmp/.X11-unix 2>/dev/null | wc -l; grep -c '@/tmp/.X11-unix/X0' /proc/net/unix; "
                                  "DISPLAY=:0 xdpyinfo >/dev/null 2>&1 && echo reached || echo refused"});
  EXPECT_EQ(other.out, "0\n0\nrefused\n") << other.err;
  env_->run({"instance", "stop", "other"});
}

}  // namespace
}  // namespace nshpc::test
