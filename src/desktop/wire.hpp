// The display agent's wire: how the server talks to `ns-hpc __display`, the process that holds an
// instance's X connection (desktop/agent.hpp). Everything the agent sends is hostile to the server:
// the agent parses what the sandbox's X server says, so a subverted agent is the sandbox talking.
//
// Framing (both directions, a SOCK_STREAM socket pair): a frame is
//   u32 little-endian header length, the header (JSON text, an object), u32 little-endian payload
//   length, the payload (bytes; empty for most messages).
// The server reads at most kMaxHeader header bytes and kMaxPayload payload bytes; more, or a header
// that is not a JSON object, is a broken agent: the server kills it.
//
// Requests (header {"op": NAME, ...}) and replies ({"ok": true, ...} or {"ok": false, "error": TEXT};
// after an error the agent goes on):
//   hello     {cookie: hex of the 16-byte MIT-MAGIC-COOKIE-1}   -- first; the agent connects X here
//             -> {width, height, depth}   (screens of 1x1 to 8192x8192, 24 or 32 bits deep)
//   info      -> {width, height, cursor: [x, y], focused: {id: "0x..", title, wm_class} | null}
//             (focused: the window manager's active window, else the top-level window with the focus)
//   capture   {format: "jpeg"|"png", quality: 1..100 (jpeg), region: [x0, y0, x1, y1] (screen
//             pixels, end exclusive; omitted: the whole screen), width, height (the size to scale
//             the region to; omitted: the region's own; one of them: the other keeps the region's
//             proportions)} -> {format, width, height}, payload: the image
//             A region not inside the screen, or a size outside 1..8192, is an error.
//   input     {events: [ {"move": [x, y]} | {"button": 1..7, "down": bool} |
//                        {"key": KEYSYM, "down": bool} | {"sleep_ms": 0..300000} ]}
//             played in order with XTest; a keysym the keymap lacks is mapped onto a spare keycode for
//             the request; the agent releases every key and button this request pressed and left
//             down before answering, but buttons with "release": false (left_mouse_down: a later
//             request releases them). A keysym on the Shift level gets Shift pressed with it. A move
//             off the screen is refused (never clamped); at most 10000 events and 300000 ms of
//             sleep a request. -> {}
//   type      {text: UTF-8, delay_ms: 0..100} -> {characters}
//             every character typed exactly (ASCII through the keymap with Shift; anything else through
//             spare keycodes remapped to its keysym, then the map restored); newline = Return, tab = Tab.
//             "\r\n" and a lone "\r" are one Return; other control characters are refused; at
//             most 100000 characters a request.
//   windows   -> {windows: [{id: "0x..", title, wm_class, desktop, x, y, width, height, active,
//             states: ["maximized_vert", "hidden", ...]}]}   (the window manager's client list, EWMH;
//             without a window manager the mapped top-level windows). wm_class is WM_CLASS's class
//             ("Mousepad"); desktop is _NET_WM_DESKTOP, -1 on every desktop, null unknown; x, y,
//             width, height are on the root, the window manager's frame included.
//   window    {id: "0x..", action: "activate"|"maximize"|"minimize"|"restore"|"close"|"move",
//             x, y, width, height (move; width/height optional)} -> {}
//             id must be one `windows` lists. move takes the frame's corner and size as `windows`
//             reports them. Without a window manager, activate raises the window and gives it the
//             focus and move configures it; the other actions are errors.
//   clipboard_get -> {text}          (CLIPBOARD selection as UTF8_STRING, else STRING; "" when
//             nobody owns it; an error past 1 MiB, for an INCR transfer, or without a text target)
//   clipboard_set {text} -> {}       (at most 1 MiB; the agent owns CLIPBOARD and serves it while
//             it runs: UTF8_STRING, STRING, TEXT, TARGETS, TIMESTAMP)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/json.hpp"

namespace nshpc::desktop {

// argv[1] that makes ns-hpc a display agent (dispatched in main() before anything else is set up).
inline constexpr std::string_view kAgentCommand = "__display";

inline constexpr std::size_t kMaxHeader = std::size_t{1} << 20;
inline constexpr std::size_t kMaxPayload = std::size_t{64} << 20;

// Inside the sandbox: display :0, its socket, and the session's runtime folder (on the sandbox's own
// /tmp, a tmpfs: node-local, gone with the sandbox).
inline constexpr std::string_view kDisplay = ":0";
inline constexpr std::string_view kXSocket = "/tmp/.X11-unix/X0";
inline constexpr std::string_view kRuntimeDir = "/tmp/.ns-hpc-desktop";
inline constexpr std::string_view kXauthority = "/tmp/.ns-hpc-desktop/Xauthority";
inline constexpr std::string_view kSessionBus = "unix:path=/tmp/.ns-hpc-desktop/bus";
// The live view's VNC server (x11vnc) listens here and nowhere else: no TCP port, no password. The
// socket is reached only through the sandbox's own filesystem, which the server resolves beneath the
// sandbox's root without following links (instances::Desktops::connect_vnc); the runtime folder
// is the sandbox user's, mode 0700. kVncMissing exists when the root has no x11vnc.
inline constexpr std::string_view kVncSocket = "/tmp/.ns-hpc-desktop/vnc";
inline constexpr std::string_view kVncMissing = "/tmp/.ns-hpc-desktop/vnc.missing";

struct Frame {
  nlohmann::json header;
  std::string payload;
};

// Writes one frame on `fd` (EINTR retried; on a non-blocking `fd`, waits for room). Throws
// SysError. With a `deadline` (steady clock), a peer that does not take the frame in time is an
// Error: the server writes to an agent it does not trust to read.
void write_frame(int fd, const nlohmann::json& header, std::string_view payload = {},
                 std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

// Reads one frame from `fd`, waiting at most until `deadline` (steady clock) for all of it. Throws
// Error naming what was wrong: the peer closed the connection, the deadline passed, a header or
// payload over the limits, a header that is not a JSON object.
Frame read_frame(int fd, std::chrono::steady_clock::time_point deadline, std::size_t max_header = kMaxHeader,
                 std::size_t max_payload = kMaxPayload);

}  // namespace nshpc::desktop
