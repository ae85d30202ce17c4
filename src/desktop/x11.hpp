// The display agent's X connection (used by desktop/agent.cpp only, inside the confined agent
// process): capture, XTest input, typing, EWMH windows, the CLIPBOARD selection and pointer and
// focus information, all over one xcb connection to the sandbox's X server.
//
// The X server is the sandbox's, so every length and size it reports is checked before it is
// used: the connection setup is walked by hand, every list in a reply is held against the reply's
// own length, screens above kMaxSide are refused, and property reads are capped. A lie ends in
// an Error (or, past those checks, in the agent's own memory limit), never in a read out of
// bounds.
#pragma once

#include <xcb/xcb.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::desktop::x11 {

// The largest screen side, region side and scaled image side handled (pixels).
inline constexpr int kMaxSide = 8192;
// Text through the clipboard, either way.
inline constexpr std::size_t kMaxClipboard = std::size_t{1} << 20;

struct CaptureRequest {
  bool png = false;                    // else JPEG
  int quality = 75;                    // JPEG, 1..100
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // the region, end exclusive, inside the screen
  int width = 0, height = 0;           // the image's size (the region scaled to it)
};

struct InputEvent {
  enum class Kind { move, button, key, sleep };
  Kind kind = Kind::move;
  int x = 0, y = 0;          // move
  int button = 0;            // button: 1..7
  std::uint32_t keysym = 0;  // key
  bool down = false;         // button, key
  int sleep_ms = 0;          // sleep
};

struct WindowInfo {
  std::uint32_t id = 0;
  std::string title, wm_class;
  long desktop = -1;                        // _NET_WM_DESKTOP; -1: unknown, 0xFFFFFFFF: all desktops
  int x = 0, y = 0, width = 0, height = 0;  // on the root, the window manager's frame included
  bool active = false;
  std::vector<std::string> states;  // "maximized_vert", "hidden", ... (_NET_WM_STATE, lower-case)
};

struct PointerInfo {
  int x = 0, y = 0;
};

enum class WindowAction { activate, maximize, minimize, restore, close, move };

struct MoveTo {
  int x = 0, y = 0;                  // the frame's top-left corner, as `windows` reports it
  std::optional<int> width, height;  // the size with the frame, as `windows` reports it
};

class Display {
 public:
  // Speaks X over `fd` (a connected stream socket, owned by the Display from here, closed even
  // when connecting fails) with the MIT-MAGIC-COOKIE-1 `cookie` (16 bytes). Throws Error: the
  // server refused (with its reason), closed the connection, or described a screen this agent
  // does not handle. xcb writes a server's refusal to standard error, and nowhere else: when
  // `refusal_fd` (non-blocking) reads what was written there, the error quotes it.
  static std::unique_ptr<Display> connect(int fd, std::string_view cookie, int refusal_fd = -1);
  ~Display();
  Display(const Display&) = delete;
  Display& operator=(const Display&) = delete;

  int width() const;
  int height() const;
  int depth() const;
  // The connection's descriptor, for poll(); -1 once the connection is broken.
  int fd() const;
  // Serves what arrived meanwhile (a paste from the clipboard this agent owns, keymap changes).
  void serve_events();

  // The encoded image; throws Error (an invalid region or size, a lying server).
  std::string capture(const CaptureRequest& request);
  // Buttons it pressed and left down stay down when `hold_buttons` (Anthropic's left_mouse_down,
  // released by a later request); keys are released either way.
  void input(const std::vector<InputEvent>& events, bool hold_buttons = false);
  // Types `text` (code points; '\n' is Return, '\t' Tab) with `delay` between characters.
  void type(const std::u32string& text, std::chrono::milliseconds delay);
  PointerInfo pointer();
  std::optional<WindowInfo> focused();
  std::vector<WindowInfo> windows();
  void window_action(std::uint32_t id, WindowAction action, const MoveTo& move = {});
  std::string clipboard_get();
  void clipboard_set(std::string text);

  struct State;  // the connection and what is known of the server (x11.cpp)

 private:
  explicit Display(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace nshpc::desktop::x11
