#include "desktop/x11.hpp"

#include <png.h>
#include <poll.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <xcb/xtest.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <set>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "desktop/keys.hpp"

namespace nshpc::desktop::x11 {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long clients get to read a changed keyboard map before and after keys typed through it:
// a toolkit looks a key event up in the map it holds when it handles that event, so a spare
// keycode is given its keysym, the keys are pressed, and the map is only changed again once the
// application had time to handle them.
constexpr milliseconds kRemapSettle{15};
constexpr milliseconds kRemapDrain{60};
// A clipboard owner's answer, and a fresh server timestamp.
constexpr milliseconds kSelectionWait{3000};
// Largest single GetImage reply asked for; a taller region is read in strips of rows.
constexpr std::size_t kStripBytes = std::size_t{16} << 20;
// Windows listed at most, and the caps of the properties read from each.
constexpr std::size_t kMaxWindows = 1024;
constexpr std::size_t kMaxTitle = 4096;

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};
template <typename T>
using XPtr = std::unique_ptr<T, FreeDeleter>;

// X's predefined atoms used here.
constexpr xcb_atom_t kAtomATOM = 4, kAtomCARDINAL = 6, kAtomINTEGER = 19, kAtomSTRING = 31, kAtomWINDOW = 33,
                     kAtomWM_NAME = 39, kAtomWM_CLASS = 67;

// The atoms interned at connection, by index.
enum AtomIndex : std::size_t {
  aCLIPBOARD,
  aUTF8_STRING,
  aTARGETS,
  aTIMESTAMP,
  aTEXT,
  aINCR,
  aSELECTION_PROPERTY,
  aTIME_PROPERTY,
  a_NET_CLIENT_LIST,
  a_NET_WM_NAME,
  a_NET_WM_DESKTOP,
  a_NET_ACTIVE_WINDOW,
  a_NET_WM_STATE,
  a_NET_CLOSE_WINDOW,
  a_NET_MOVERESIZE_WINDOW,
  a_NET_FRAME_EXTENTS,
  a_NET_SUPPORTING_WM_CHECK,
  aWM_CHANGE_STATE,
  aWM_PROTOCOLS,
  aWM_DELETE_WINDOW,
  aFirstState,  // the _NET_WM_STATE_* atoms follow, in kStateNames' order
};
constexpr std::array<const char*, aFirstState> kAtomNames{
    "CLIPBOARD",
    "UTF8_STRING",
    "TARGETS",
    "TIMESTAMP",
    "TEXT",
    "INCR",
    "_NSHPC_SELECTION",
    "_NSHPC_TIME",
    "_NET_CLIENT_LIST",
    "_NET_WM_NAME",
    "_NET_WM_DESKTOP",
    "_NET_ACTIVE_WINDOW",
    "_NET_WM_STATE",
    "_NET_CLOSE_WINDOW",
    "_NET_MOVERESIZE_WINDOW",
    "_NET_FRAME_EXTENTS",
    "_NET_SUPPORTING_WM_CHECK",
    "WM_CHANGE_STATE",
    "WM_PROTOCOLS",
    "WM_DELETE_WINDOW",
};
// _NET_WM_STATE_<NAME>, reported as <name> in lower case.
constexpr std::array<const char*, 13> kStateNames{
    "MODAL",      "STICKY", "MAXIMIZED_VERT", "MAXIMIZED_HORZ",    "SHADED", "SKIP_TASKBAR", "SKIP_PAGER", "HIDDEN",
    "FULLSCREEN", "ABOVE",  "BELOW",          "DEMANDS_ATTENTION", "FOCUSED"};
constexpr std::size_t kAtomCount = aFirstState + kStateNames.size();
constexpr std::size_t kStateMaxVert = aFirstState + 2, kStateMaxHorz = aFirstState + 3;

std::size_t pad4(std::size_t n) { return (n + 3) & ~std::size_t{3}; }

// What the connection setup says of the first screen, checked.
struct Screen {
  xcb_window_t root = 0;
  xcb_visualid_t visual = 0;
  int width = 0, height = 0, depth = 0;
  int bits_per_pixel = 0, scanline_pad = 0;
  bool msb_first = false;  // image byte order: pixels are X,R,G,B in memory (else B,G,R,X)
  std::uint8_t min_keycode = 8, max_keycode = 255;
};

// Walks the setup block xcb read (8 + 4 * length bytes) by hand, every offset held against its
// size: xcb's own iterators trust the counts in it.
Screen check_setup(const xcb_setup_t* setup) {
  const auto* base = reinterpret_cast<const std::uint8_t*>(setup);
  const std::size_t total = 8 + std::size_t{setup->length} * 4;
  const auto broken = [](std::string_view what) {
    return Error(fmt::format("the desktop's X server sent a broken connection setup ({})", what));
  };
  if (total < sizeof(xcb_setup_t)) throw broken("shorter than its header");
  std::size_t at = sizeof(xcb_setup_t) + pad4(setup->vendor_len);
  const std::size_t formats_at = at;
  at += std::size_t{setup->pixmap_formats_len} * sizeof(xcb_format_t);
  if (at > total) throw broken("pixmap formats past its end");
  if (setup->roots_len < 1) throw broken("no screen");
  if (at + sizeof(xcb_screen_t) > total) throw broken("a screen past its end");
  xcb_screen_t screen;
  std::memcpy(&screen, base + at, sizeof screen);
  at += sizeof(xcb_screen_t);
  Screen out;
  out.root = screen.root;
  out.visual = screen.root_visual;
  out.width = screen.width_in_pixels;
  out.height = screen.height_in_pixels;
  out.depth = screen.root_depth;
  out.msb_first = setup->image_byte_order == XCB_IMAGE_ORDER_MSB_FIRST;
  out.min_keycode = setup->min_keycode;
  out.max_keycode = setup->max_keycode;
  if (out.width < 1 || out.height < 1 || out.width > kMaxSide || out.height > kMaxSide)
    throw Error(
        fmt::format("the desktop's X server has a screen of {}x{}; the display agent handles screens of "
                    "1x1 to {}x{}",
                    out.width, out.height, kMaxSide, kMaxSide));
  bool visual_ok = false;
  for (int d = 0; d < screen.allowed_depths_len; ++d) {
    if (at + sizeof(xcb_depth_t) > total) throw broken("a depth past its end");
    xcb_depth_t depth;
    std::memcpy(&depth, base + at, sizeof depth);
    at += sizeof(xcb_depth_t);
    if (at + std::size_t{depth.visuals_len} * sizeof(xcb_visualtype_t) > total) throw broken("visuals past its end");
    for (int v = 0; v < depth.visuals_len; ++v) {
      xcb_visualtype_t visual;
      std::memcpy(&visual, base + at + std::size_t(v) * sizeof visual, sizeof visual);
      if (visual.visual_id != out.visual || depth.depth != out.depth) continue;
      visual_ok = (visual._class == XCB_VISUAL_CLASS_TRUE_COLOR || visual._class == XCB_VISUAL_CLASS_DIRECT_COLOR) &&
                  visual.red_mask == 0xff0000 && visual.green_mask == 0xff00 && visual.blue_mask == 0xff;
    }
    at += std::size_t{depth.visuals_len} * sizeof(xcb_visualtype_t);
  }
  for (int f = 0; f < setup->pixmap_formats_len; ++f) {
    xcb_format_t format;
    std::memcpy(&format, base + formats_at + std::size_t(f) * sizeof format, sizeof format);
    if (format.depth != out.depth) continue;
    out.bits_per_pixel = format.bits_per_pixel;
    out.scanline_pad = format.scanline_pad;
  }
  if ((out.depth != 24 && out.depth != 32) || out.bits_per_pixel != 32 || !visual_ok ||
      (out.scanline_pad != 8 && out.scanline_pad != 16 && out.scanline_pad != 32))
    throw Error(
        fmt::format("the desktop's X server has a screen of depth {} ({} bits a pixel); the display agent "
                    "reads 24 or 32-bit true-colour screens (Xvfb -screen 0 WxHx24)",
                    out.depth, out.bits_per_pixel));
  if (out.min_keycode < 8 || out.max_keycode < out.min_keycode) throw broken("a keycode range that is not X's");
  return out;
}

// Latin-1 (an X STRING) as UTF-8.
std::string latin1_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

// UTF-8 as Latin-1 ('?' for what it lacks), for a paste that asks for STRING.
std::string utf8_to_latin1(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (n == 1)
      out += static_cast<char>(c);
    else if (n == 2 && i + 1 < s.size() && c <= 0xc3)
      out += static_cast<char>(((c & 0x1f) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3f));
    else
      out += '?';
    i += n;
  }
  return out;
}

// A property as read, its value held against the reply's own length.
struct Property {
  xcb_atom_t type = XCB_NONE;  // None: the property does not exist
  int format = 0;
  std::string data;
  std::uint32_t bytes_after = 0;

  std::vector<std::uint32_t> words() const {
    std::vector<std::uint32_t> out;
    if (format != 32) return out;
    out.resize(data.size() / 4);
    std::memcpy(out.data(), data.data(), out.size() * 4);
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// Pixels: scaling and encoding

struct Pixels {
  const std::uint8_t* data = nullptr;
  int width = 0, height = 0;
  std::size_t stride = 0;  // bytes per row
};

// Which source pixels make one destination pixel along one axis, and their weights (summing to 1).
struct Taps {
  std::vector<int> first, count;
  std::vector<float> weight;  // count[i] weights for destination i, one after the other
  std::vector<std::size_t> offset;
};

// Downscaling averages the source area each destination pixel covers (text stays legible,
// nothing aliases); upscaling (a zoom) interpolates linearly between the two nearest pixels.
Taps make_taps(int source, int dest) {
  Taps t;
  t.first.resize(static_cast<std::size_t>(dest));
  t.count.resize(static_cast<std::size_t>(dest));
  t.offset.resize(static_cast<std::size_t>(dest));
  const double scale = static_cast<double>(source) / dest;
  for (int o = 0; o < dest; ++o) {
    const auto i = static_cast<std::size_t>(o);
    t.offset[i] = t.weight.size();
    if (dest < source) {
      const double s0 = o * scale, s1 = (o + 1) * scale;
      const int from = static_cast<int>(std::floor(s0));
      const int to = std::min(source, static_cast<int>(std::ceil(s1)));
      t.first[i] = from;
      for (int s = from; s < to; ++s)
        t.weight.push_back(static_cast<float>((std::min(s1, s + 1.0) - std::max(s0, static_cast<double>(s))) / scale));
      t.count[i] = to - from;
    } else {
      const double centre = (o + 0.5) * scale - 0.5;
      int lo = static_cast<int>(std::floor(centre));
      const double f = centre - lo;
      if (lo < 0) {
        t.first[i] = 0;
        t.count[i] = 1;
        t.weight.push_back(1.0f);
      } else if (lo >= source - 1) {
        t.first[i] = source - 1;
        t.count[i] = 1;
        t.weight.push_back(1.0f);
      } else {
        t.first[i] = lo;
        t.count[i] = 2;
        t.weight.push_back(static_cast<float>(1.0 - f));
        t.weight.push_back(static_cast<float>(f));
      }
    }
  }
  return t;
}

// `src` scaled to width x height, 4 bytes a pixel (each byte a channel, whatever the order).
std::vector<std::uint8_t> scale(const Pixels& src, int width, int height) {
  const Taps cols = make_taps(src.width, width), rows = make_taps(src.height, height);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 4);
  std::vector<float> line(static_cast<std::size_t>(src.width) * 4);
  for (int y = 0; y < height; ++y) {
    const auto yi = static_cast<std::size_t>(y);
    std::fill(line.begin(), line.end(), 0.0f);
    for (int k = 0; k < rows.count[yi]; ++k) {
      const float w = rows.weight[rows.offset[yi] + static_cast<std::size_t>(k)];
      const std::uint8_t* row = src.data + static_cast<std::size_t>(rows.first[yi] + k) * src.stride;
      for (std::size_t i = 0; i < line.size(); ++i) line[i] += w * row[i];
    }
    std::uint8_t* dst = out.data() + yi * static_cast<std::size_t>(width) * 4;
    for (int x = 0; x < width; ++x) {
      const auto xi = static_cast<std::size_t>(x);
      float acc[4] = {0, 0, 0, 0};
      for (int k = 0; k < cols.count[xi]; ++k) {
        const float w = cols.weight[cols.offset[xi] + static_cast<std::size_t>(k)];
        const float* px = line.data() + static_cast<std::size_t>(cols.first[xi] + k) * 4;
        for (int c = 0; c < 4; ++c) acc[c] += w * px[c];
      }
      for (int c = 0; c < 4; ++c)
        dst[xi * 4 + static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(std::clamp(acc[c] + 0.5f, 0.0f, 255.0f));
    }
  }
  return out;
}

struct PngSink {
  std::string* out;
  bool out_of_memory = false;
};

void png_append(png_structp png, png_bytep data, png_size_t size) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  try {
    sink->out->append(reinterpret_cast<const char*>(data), size);
    return;
  } catch (const std::bad_alloc&) {
    sink->out_of_memory = true;
  }
  png_error(png, "out of memory");  // outside the catch: it does not return
}

void png_flush_nothing(png_structp) {}

[[noreturn]] void png_fail(png_structp png, png_const_charp) { std::longjmp(png_jmpbuf(png), 1); }
void png_warn_nothing(png_structp, png_const_charp) {}

// PNG at zlib level 1 without a row filter, each row turned into RGB here (libpng's own BGR and
// filler transforms cost 2 ms more a screen). Measured on an Xfce desktop at 1280x800 (wallpaper,
// panel, an editor full of text): no filter 12-14 ms and 219 KB, SUB 15 ms and 276 KB, UP 15 ms
// and 272 KB, UP with Z_RLE 12 ms but 360 KB; level 6 with every filter about 50 ms
// (features-2.md 4.2). Screens are flat colour and text, which the filters do not help. `row`
// holds 3 * width bytes. No C++ object lives in this frame, so libpng's longjmp on error skips
// no destructor.
bool encode_png_into(const Pixels& px, bool msb_first, unsigned char* row, PngSink& sink) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, png_fail, png_warn_nothing);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info ? &info : nullptr);
    return false;
  }
  png_set_write_fn(png, &sink, png_append, png_flush_nothing);
  png_set_IHDR(png, info, static_cast<png_uint_32>(px.width), static_cast<png_uint_32>(px.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(png, 1);
  png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_NONE);
  png_write_info(png, info);
  // X pixels are B,G,R,X in memory (or X,R,G,B from a big-endian server).
  const int r = msb_first ? 1 : 2, g = msb_first ? 2 : 1, b = msb_first ? 3 : 0;
  for (int y = 0; y < px.height; ++y) {
    const std::uint8_t* in = px.data + static_cast<std::size_t>(y) * px.stride;
    unsigned char* out = row;
    for (int x = 0; x < px.width; ++x, in += 4, out += 3) {
      out[0] = in[r];
      out[1] = in[g];
      out[2] = in[b];
    }
    png_write_row(png, row);
  }
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

std::string encode_png(const Pixels& px, bool msb_first) {
  std::string out;
  out.reserve(static_cast<std::size_t>(px.width) * static_cast<std::size_t>(px.height) / 4);
  std::vector<unsigned char> row(static_cast<std::size_t>(px.width) * 3);
  PngSink sink{&out};
  if (!encode_png_into(px, msb_first, row.data(), sink))
    throw Error(sink.out_of_memory ? "the PNG did not fit in the display agent's memory" : "the PNG could not be made");
  return out;
}

struct TjDeleter {
  void operator()(void* handle) const noexcept { tjDestroy(handle); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The connection

struct Display::State {
  xcb_connection_t* c = nullptr;
  Screen screen;
  std::array<xcb_atom_t, kAtomCount> atoms{};
  xcb_window_t window = 0;  // the agent's own (unmapped, input-only): the clipboard's owner and paste target
  bool xtest = false;
  std::unique_ptr<void, TjDeleter> jpeg;

  // The keyboard map as last read (keysyms_per_keycode entries a keycode), and the modifier keys.
  struct Keymap {
    int per = 0;
    std::vector<std::uint32_t> syms;
    std::uint8_t shift = 0, lock = 0;  // keycodes; 0: none
    std::set<std::uint8_t> modifiers;
    bool stale = true;
  } keymap;

  // The clipboard text this agent owns (nullopt: none) and the time it took the selection.
  std::optional<std::string> clipboard;
  xcb_timestamp_t clipboard_time = 0;

  ~State() {
    if (c) xcb_disconnect(c);
  }

  [[noreturn]] void lost() const {
    throw Error(
        "the desktop's X server closed the connection (it ended, or it sent something the display agent "
        "does not read)");
  }
  void check() const {
    if (xcb_connection_has_error(c)) lost();
  }
  xcb_atom_t atom(std::size_t index) const { return atoms[index]; }

  // One round trip: everything sent before has been handled by the server.
  void sync() {
    XPtr<xcb_get_input_focus_reply_t> r(xcb_get_input_focus_reply(c, xcb_get_input_focus(c), nullptr));
    if (!r) lost();
  }

  // ---- events

  void dispatch(const xcb_generic_event_t* ev) {
    switch (ev->response_type & 0x7f) {
      case XCB_SELECTION_REQUEST:
        serve_selection(*reinterpret_cast<const xcb_selection_request_event_t*>(ev));
        break;
      case XCB_SELECTION_CLEAR: {
        const auto& e = *reinterpret_cast<const xcb_selection_clear_event_t*>(ev);
        if (e.selection == atom(aCLIPBOARD) && e.owner == window) clipboard.reset();
        break;
      }
      case XCB_MAPPING_NOTIFY:
        keymap.stale = true;
        break;
      default:  // errors of requests nobody waits for (a window gone meanwhile), other events
        break;
    }
  }

  void serve_events() {
    while (XPtr<xcb_generic_event_t> ev{xcb_poll_for_event(c)}) dispatch(ev.get());
  }

  // Serves events until one `want` takes or `deadline` passes (then null).
  XPtr<xcb_generic_event_t> wait_event(Clock::time_point deadline,
                                       const std::function<bool(const xcb_generic_event_t&)>& want) {
    for (;;) {
      while (XPtr<xcb_generic_event_t> ev{xcb_poll_for_event(c)}) {
        if (want(*ev)) return ev;
        dispatch(ev.get());
      }
      check();
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return nullptr;
      pollfd p{xcb_get_file_descriptor(c), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30))) < 0 && errno != EINTR)
        throw SysError(errno, "poll", "the X connection");
    }
  }

  // Waits `time` while still serving the clipboard.
  void pause(milliseconds time) {
    xcb_flush(c);
    wait_event(Clock::now() + time, [](const xcb_generic_event_t&) { return false; });
  }

  // ---- properties

  xcb_get_property_cookie_t ask_property(xcb_window_t w, xcb_atom_t property, xcb_atom_t type, std::size_t max_bytes,
                                         bool remove = false) {
    return xcb_get_property(c, remove ? 1 : 0, w, property, type, 0, static_cast<std::uint32_t>((max_bytes + 3) / 4));
  }

  // nullopt: an error (the window is gone); a Property of type None: no such property.
  std::optional<Property> take_property(xcb_get_property_cookie_t cookie) {
    xcb_generic_error_t* error = nullptr;
    XPtr<xcb_get_property_reply_t> r(xcb_get_property_reply(c, cookie, &error));
    std::free(error);
    if (!r) {
      check();
      return std::nullopt;
    }
    Property p;
    p.type = r->type;
    p.format = r->format;
    p.bytes_after = r->bytes_after;
    if (r->format != 0 && r->format != 8 && r->format != 16 && r->format != 32)
      throw Error(fmt::format("the desktop's X server sent a property of format {}", r->format));
    const std::uint64_t bytes = std::uint64_t{r->value_len} * (r->format / 8u);
    if (bytes > std::uint64_t{r->length} * 4)
      throw Error("the desktop's X server sent a property longer than its reply");
    p.data.assign(static_cast<const char*>(xcb_get_property_value(r.get())), static_cast<std::size_t>(bytes));
    return p;
  }

  std::optional<Property> property(xcb_window_t w, xcb_atom_t property, xcb_atom_t type, std::size_t max_bytes) {
    return take_property(ask_property(w, property, type, max_bytes));
  }

  // A window manager that says it is there (EWMH): client list, active window and state changes.
  bool has_window_manager() {
    const auto p = property(screen.root, atom(a_NET_SUPPORTING_WM_CHECK), kAtomWINDOW, 4);
    return p && p->format == 32 && p->data.size() == 4;
  }

  // ---- keyboard

  void load_keymap() {
    const int count = screen.max_keycode - screen.min_keycode + 1;
    XPtr<xcb_get_keyboard_mapping_reply_t> map(xcb_get_keyboard_mapping_reply(
        c, xcb_get_keyboard_mapping(c, screen.min_keycode, static_cast<std::uint8_t>(count)), nullptr));
    XPtr<xcb_get_modifier_mapping_reply_t> mods(
        xcb_get_modifier_mapping_reply(c, xcb_get_modifier_mapping(c), nullptr));
    if (!map || !mods) lost();
    const int per = map->keysyms_per_keycode;
    if (per < 1 || per > 64 || std::uint64_t{map->length} < std::uint64_t(count) * std::uint64_t(per))
      throw Error("the desktop's X server sent a broken keyboard map");
    keymap.per = per;
    const auto* syms = xcb_get_keyboard_mapping_keysyms(map.get());
    keymap.syms.assign(syms, syms + static_cast<std::size_t>(count) * static_cast<std::size_t>(per));
    const std::size_t per_mod = mods->keycodes_per_modifier;
    if (std::uint64_t{mods->length} * 4 < per_mod * 8) throw Error("the desktop's X server sent a broken modifier map");
    const auto* codes = xcb_get_modifier_mapping_keycodes(mods.get());
    keymap.modifiers.clear();
    keymap.shift = keymap.lock = 0;
    for (std::size_t i = 0; i < per_mod * 8; ++i) {
      if (!codes[i]) continue;
      keymap.modifiers.insert(codes[i]);
      if (i < per_mod && !keymap.shift) keymap.shift = codes[i];
      if (i >= per_mod && i < 2 * per_mod && !keymap.lock) keymap.lock = codes[i];
    }
    keymap.stale = false;
  }

  std::uint32_t sym_at(std::uint8_t keycode, int level) const {
    return keymap.syms[static_cast<std::size_t>(keycode - screen.min_keycode) * static_cast<std::size_t>(keymap.per) +
                       static_cast<std::size_t>(level)];
  }

  struct Key {
    std::uint8_t keycode = 0;
    bool shift = false;
  };

  // Where `keysym` is on the keyboard without a modifier or with Shift.
  std::optional<Key> find_key(std::uint32_t keysym) const {
    for (int level = 0; level < std::min(2, keymap.per); ++level)
      for (int kc = screen.min_keycode; kc <= screen.max_keycode; ++kc)
        if (sym_at(static_cast<std::uint8_t>(kc), level) == keysym)
          return Key{static_cast<std::uint8_t>(kc), level == 1};
    return std::nullopt;
  }

  // Keycodes with no keysym and no modifier role, for keysyms the keyboard lacks.
  std::vector<std::uint8_t> spare_keycodes() const {
    std::vector<std::uint8_t> out;
    for (int kc = screen.min_keycode; kc <= screen.max_keycode; ++kc) {
      bool empty = !keymap.modifiers.contains(static_cast<std::uint8_t>(kc));
      for (int level = 0; empty && level < keymap.per; ++level)
        empty = sym_at(static_cast<std::uint8_t>(kc), level) == 0;
      if (empty) out.push_back(static_cast<std::uint8_t>(kc));
    }
    return out;
  }

  // Gives each keycode of `assign` its keysym on every level (0: none again), one request per run
  // of consecutive keycodes: each request is one MappingNotify every client handles.
  void remap(const std::map<std::uint8_t, std::uint32_t>& assign) {
    for (auto it = assign.begin(); it != assign.end();) {
      const std::uint8_t first = it->first;
      std::vector<std::uint32_t> syms;
      std::uint8_t next = first;
      for (; it != assign.end() && it->first == next; ++it, ++next) {
        for (int level = 0; level < keymap.per; ++level) {
          syms.push_back(it->second);
          keymap.syms[static_cast<std::size_t>(it->first - screen.min_keycode) * static_cast<std::size_t>(keymap.per) +
                      static_cast<std::size_t>(level)] = it->second;
        }
      }
      xcb_change_keyboard_mapping(c, static_cast<std::uint8_t>(next - first), first,
                                  static_cast<std::uint8_t>(keymap.per), syms.data());
    }
    sync();
  }

  void ensure_keymap() {
    if (keymap.stale) load_keymap();
  }

  void fake(std::uint8_t type, std::uint8_t detail, int x = 0, int y = 0) {
    xcb_test_fake_input(c, type, detail, XCB_CURRENT_TIME, type == XCB_MOTION_NOTIFY ? screen.root : XCB_NONE,
                        static_cast<std::int16_t>(x), static_cast<std::int16_t>(y), 0);
  }

  void require_xtest() const {
    if (!xtest)
      throw Error(
          "the desktop's X server has no XTEST extension, so the display agent cannot press keys or move the mouse");
  }

  // ---- the clipboard

  void serve_selection(const xcb_selection_request_event_t& req) {
    xcb_selection_notify_event_t reply{};
    reply.response_type = XCB_SELECTION_NOTIFY;
    reply.time = req.time;
    reply.requestor = req.requestor;
    reply.selection = req.selection;
    reply.target = req.target;
    reply.property = XCB_NONE;                                                         // refused, unless answered below
    const xcb_atom_t property = req.property != XCB_NONE ? req.property : req.target;  // obsolete clients
    const bool ours = req.selection == atom(aCLIPBOARD) && req.owner == window && clipboard &&
                      (req.time == XCB_CURRENT_TIME || req.time >= clipboard_time);
    // What fits in one request (no INCR transfers from here); 4-byte units, the header aside.
    const std::size_t max_bytes = std::size_t{xcb_get_maximum_request_length(c)} * 4 - 64;
    if (ours && req.target == atom(aTARGETS)) {
      const std::array<xcb_atom_t, 5> targets{atom(aTARGETS), atom(aTIMESTAMP), atom(aUTF8_STRING), kAtomSTRING,
                                              atom(aTEXT)};
      xcb_change_property(c, XCB_PROP_MODE_REPLACE, req.requestor, property, kAtomATOM, 32, targets.size(),
                          targets.data());
      reply.property = property;
    } else if (ours && req.target == atom(aTIMESTAMP)) {
      xcb_change_property(c, XCB_PROP_MODE_REPLACE, req.requestor, property, kAtomINTEGER, 32, 1, &clipboard_time);
      reply.property = property;
    } else if (ours && (req.target == atom(aUTF8_STRING) || req.target == atom(aTEXT)) &&
               clipboard->size() <= max_bytes) {
      xcb_change_property(c, XCB_PROP_MODE_REPLACE, req.requestor, property, atom(aUTF8_STRING), 8,
                          static_cast<std::uint32_t>(clipboard->size()), clipboard->data());
      reply.property = property;
    } else if (ours && req.target == kAtomSTRING && clipboard->size() <= max_bytes) {
      const std::string latin1 = utf8_to_latin1(*clipboard);
      xcb_change_property(c, XCB_PROP_MODE_REPLACE, req.requestor, property, kAtomSTRING, 8,
                          static_cast<std::uint32_t>(latin1.size()), latin1.data());
      reply.property = property;
    }
    xcb_send_event(c, 0, req.requestor, XCB_EVENT_MASK_NO_EVENT, reinterpret_cast<const char*>(&reply));
    xcb_flush(c);
  }

  // A timestamp of the server's clock (ICCCM: selections are taken at a real time, not CurrentTime).
  xcb_timestamp_t server_time() {
    xcb_change_property(c, XCB_PROP_MODE_APPEND, window, atom(aTIME_PROPERTY), kAtomSTRING, 8, 0, nullptr);
    xcb_flush(c);
    const xcb_atom_t time_atom = atom(aTIME_PROPERTY);
    const xcb_window_t w = window;
    const auto ev = wait_event(Clock::now() + kSelectionWait, [&](const xcb_generic_event_t& e) {
      if ((e.response_type & 0x7f) != XCB_PROPERTY_NOTIFY) return false;
      const auto& p = reinterpret_cast<const xcb_property_notify_event_t&>(e);
      return p.window == w && p.atom == time_atom;
    });
    if (!ev) throw Error("the desktop's X server did not report a property change within 3 s");
    return reinterpret_cast<const xcb_property_notify_event_t*>(ev.get())->time;
  }

  // ---- windows

  // Window ids to list: the window manager's client list, or without one the mapped top-level
  // windows (children of the root that are viewable, not override-redirect, InputOutput).
  std::vector<xcb_window_t> client_windows() {
    if (const auto list = property(screen.root, atom(a_NET_CLIENT_LIST), kAtomWINDOW, kMaxWindows * 4);
        list && list->format == 32 && list->type == kAtomWINDOW) {
      const auto ids = list->words();
      return {ids.begin(), ids.end()};
    }
    XPtr<xcb_query_tree_reply_t> tree(xcb_query_tree_reply(c, xcb_query_tree(c, screen.root), nullptr));
    if (!tree) lost();
    if (std::uint64_t{tree->children_len} * 4 > std::uint64_t{tree->length} * 4)
      throw Error("the desktop's X server sent a window tree longer than its reply");
    const auto* children = xcb_query_tree_children(tree.get());
    const std::size_t n = std::min<std::size_t>(tree->children_len, kMaxWindows);
    std::vector<xcb_get_window_attributes_cookie_t> cookies;
    for (std::size_t i = 0; i < n; ++i) cookies.push_back(xcb_get_window_attributes(c, children[i]));
    std::vector<xcb_window_t> out;
    for (std::size_t i = 0; i < n; ++i) {
      xcb_generic_error_t* error = nullptr;
      XPtr<xcb_get_window_attributes_reply_t> a(xcb_get_window_attributes_reply(c, cookies[i], &error));
      std::free(error);
      if (a && a->map_state == XCB_MAP_STATE_VIEWABLE && !a->override_redirect &&
          a->_class == XCB_WINDOW_CLASS_INPUT_OUTPUT && children[i] != window)
        out.push_back(children[i]);
    }
    check();
    return out;
  }

  std::string window_text(const std::optional<Property>& p) const {
    if (!p || p->type == XCB_NONE || p->format != 8) return {};
    std::string text = p->type == kAtomSTRING ? latin1_to_utf8(p->data) : text::sanitize_utf8(p->data);
    return text::truncate_utf8(text, kMaxTitle);
  }

  // Title, class, desktop, geometry and state of each of `ids`, asked for all at once (one round
  // trip whatever their number); windows gone meanwhile are left out.
  std::vector<WindowInfo> describe(const std::vector<xcb_window_t>& ids) {
    struct Asked {
      xcb_get_property_cookie_t net_name, name, wm_class, desktop, state, extents;
      xcb_get_geometry_cookie_t geometry;
      xcb_translate_coordinates_cookie_t origin;
    };
    std::vector<Asked> asked;
    asked.reserve(ids.size());
    for (xcb_window_t w : ids)
      asked.push_back({ask_property(w, atom(a_NET_WM_NAME), atom(aUTF8_STRING), kMaxTitle),
                       ask_property(w, kAtomWM_NAME, XCB_GET_PROPERTY_TYPE_ANY, kMaxTitle),
                       ask_property(w, kAtomWM_CLASS, kAtomSTRING, 1024),
                       ask_property(w, atom(a_NET_WM_DESKTOP), kAtomCARDINAL, 4),
                       ask_property(w, atom(a_NET_WM_STATE), kAtomATOM, 64 * 4),
                       ask_property(w, atom(a_NET_FRAME_EXTENTS), kAtomCARDINAL, 16), xcb_get_geometry(c, w),
                       xcb_translate_coordinates(c, w, screen.root, 0, 0)});
    const auto active = property(screen.root, atom(a_NET_ACTIVE_WINDOW), kAtomWINDOW, 4);
    const xcb_window_t active_id = active && active->words().size() == 1 ? active->words()[0] : XCB_NONE;
    std::vector<WindowInfo> out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const Asked& a = asked[i];
      const auto net_name = take_property(a.net_name);
      const auto name = take_property(a.name);
      const auto wm_class = take_property(a.wm_class);
      const auto desktop = take_property(a.desktop);
      const auto state = take_property(a.state);
      const auto extents = take_property(a.extents);
      xcb_generic_error_t* error = nullptr;
      XPtr<xcb_get_geometry_reply_t> geometry(xcb_get_geometry_reply(c, a.geometry, &error));
      std::free(error);
      error = nullptr;
      XPtr<xcb_translate_coordinates_reply_t> origin(xcb_translate_coordinates_reply(c, a.origin, &error));
      std::free(error);
      if (!geometry || !origin) continue;  // gone meanwhile
      WindowInfo info;
      info.id = ids[i];
      info.title = window_text(net_name);
      if (info.title.empty()) info.title = window_text(name);
      if (wm_class && wm_class->format == 8) {
        // "instance\0Class\0": the class, as people know the application.
        const auto parts = text::split(wm_class->data, '\0');
        info.wm_class = text::sanitize_utf8(parts.size() >= 2 && !parts[1].empty() ? parts[1] : parts[0]);
      }
      if (desktop && desktop->words().size() == 1) info.desktop = desktop->words()[0];
      std::uint32_t left = 0, right = 0, top = 0, bottom = 0;
      if (extents && extents->words().size() == 4) {
        const auto e = extents->words();
        // A frame wider than a screen is a lie: ignored.
        if (std::max({e[0], e[1], e[2], e[3]}) <= static_cast<std::uint32_t>(kMaxSide)) {
          left = e[0], right = e[1], top = e[2], bottom = e[3];
        }
      }
      info.x = origin->dst_x - static_cast<int>(left);
      info.y = origin->dst_y - static_cast<int>(top);
      info.width = geometry->width + static_cast<int>(left + right);
      info.height = geometry->height + static_cast<int>(top + bottom);
      info.active = ids[i] == active_id;
      if (state && state->format == 32)
        for (std::uint32_t s : state->words())
          for (std::size_t k = 0; k < kStateNames.size(); ++k)
            if (s == atom(aFirstState + k)) {
              std::string n = kStateNames[k];
              for (char& ch : n) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
              info.states.push_back(n);
            }
      out.push_back(std::move(info));
    }
    check();
    return out;
  }

  void client_message(xcb_window_t w, xcb_atom_t type, std::array<std::uint32_t, 5> data) {
    xcb_client_message_event_t ev{};
    ev.response_type = XCB_CLIENT_MESSAGE;
    ev.format = 32;
    ev.window = w;
    ev.type = type;
    std::memcpy(ev.data.data32, data.data(), sizeof ev.data.data32);
    xcb_send_event(c, 0, screen.root, XCB_EVENT_MASK_SUBSTRUCTURE_REDIRECT | XCB_EVENT_MASK_SUBSTRUCTURE_NOTIFY,
                   reinterpret_cast<const char*>(&ev));
  }
};

// ---------------------------------------------------------------------------------------------

Display::Display(std::unique_ptr<State> state) : state_(std::move(state)) {}
Display::~Display() = default;

std::unique_ptr<Display> Display::connect(int fd, std::string_view cookie, int refusal_fd) {
  if (cookie.size() != 16) throw Error("the X cookie must be 16 bytes (MIT-MAGIC-COOKIE-1)");
  std::string name = "MIT-MAGIC-COOKIE-1";
  std::string data(cookie);
  xcb_auth_info_t auth{static_cast<int>(name.size()), name.data(), static_cast<int>(data.size()), data.data()};
  auto s = std::make_unique<State>();
  // xcb owns `fd` from here (and closes it, even when the connection fails).
  s->c = xcb_connect_to_fd(fd, &auth);
  if (xcb_connection_has_error(s->c)) {
    xcb_disconnect(s->c);
    s->c = nullptr;
    char reason[256];
    const ssize_t n = refusal_fd >= 0 ? ::read(refusal_fd, reason, sizeof reason) : -1;
    if (n > 0) {
      const std::string said(text::trim(text::sanitize_utf8(std::string_view(reason, static_cast<std::size_t>(n)))));
      throw Error(fmt::format("the desktop's X server refused the connection: {}", said));
    }
    throw Error("the desktop's X server closed the connection before it was set up");
  }
  s->screen = check_setup(xcb_get_setup(s->c));

  std::array<xcb_intern_atom_cookie_t, kAtomCount> cookies;
  std::array<std::string, kAtomCount> names;
  for (std::size_t i = 0; i < kAtomCount; ++i) {
    names[i] = i < aFirstState ? kAtomNames[i] : std::string("_NET_WM_STATE_") + kStateNames[i - aFirstState];
    cookies[i] = xcb_intern_atom(s->c, 0, static_cast<std::uint16_t>(names[i].size()), names[i].c_str());
  }
  for (std::size_t i = 0; i < kAtomCount; ++i) {
    XPtr<xcb_intern_atom_reply_t> r(xcb_intern_atom_reply(s->c, cookies[i], nullptr));
    if (!r) s->lost();
    s->atoms[i] = r->atom;
  }
  const xcb_query_extension_reply_t* xtest = xcb_get_extension_data(s->c, &xcb_test_id);
  s->xtest = xtest && xtest->present;

  s->window = xcb_generate_id(s->c);
  if (s->window == static_cast<xcb_window_t>(-1)) throw Error("the desktop's X server gave no window id");
  const std::array<std::uint32_t, 2> values{1, XCB_EVENT_MASK_PROPERTY_CHANGE};
  xcb_create_window(s->c, 0, s->window, s->screen.root, -10, -10, 1, 1, 0, XCB_WINDOW_CLASS_INPUT_ONLY,
                    XCB_COPY_FROM_PARENT, XCB_CW_OVERRIDE_REDIRECT | XCB_CW_EVENT_MASK, values.data());
  s->load_keymap();
  s->sync();
  return std::unique_ptr<Display>(new Display(std::move(s)));
}

int Display::width() const { return state_->screen.width; }
int Display::height() const { return state_->screen.height; }
int Display::depth() const { return state_->screen.depth; }
int Display::fd() const { return xcb_connection_has_error(state_->c) ? -1 : xcb_get_file_descriptor(state_->c); }
void Display::serve_events() { state_->serve_events(); }

std::string Display::capture(const CaptureRequest& req) {
  State& s = *state_;
  s.check();
  const int w = req.x1 - req.x0, h = req.y1 - req.y0;
  if (req.x0 < 0 || req.y0 < 0 || w < 1 || h < 1 || req.x1 > s.screen.width || req.y1 > s.screen.height)
    throw Error(
        fmt::format("the region [{}, {}, {}, {}] is not inside the {}x{} screen (x0 < x1 <= width, "
                    "y0 < y1 <= height)",
                    req.x0, req.y0, req.x1, req.y1, s.screen.width, s.screen.height));
  if (req.width < 1 || req.height < 1 || req.width > kMaxSide || req.height > kMaxSide)
    throw Error(fmt::format("an image of {}x{}; images are 1x1 to {}x{}", req.width, req.height, kMaxSide, kMaxSide));
  const std::size_t stride = (static_cast<std::size_t>(w) * static_cast<std::size_t>(s.screen.bits_per_pixel) +
                              static_cast<std::size_t>(s.screen.scanline_pad) - 1) /
                             static_cast<std::size_t>(s.screen.scanline_pad) *
                             static_cast<std::size_t>(s.screen.scanline_pad) / 8;
  const int strip_rows =
      static_cast<int>(std::clamp<std::size_t>(kStripBytes / stride, 1, static_cast<std::size_t>(h)));
  // Each strip's reply, checked: the depth asked for and at least the rows asked for.
  const auto read_strip = [&](int y, int rows) {
    XPtr<xcb_get_image_reply_t> r(
        xcb_get_image_reply(s.c,
                            xcb_get_image(s.c, XCB_IMAGE_FORMAT_Z_PIXMAP, s.screen.root,
                                          static_cast<std::int16_t>(req.x0), static_cast<std::int16_t>(y),
                                          static_cast<std::uint16_t>(w), static_cast<std::uint16_t>(rows), ~0u),
                            nullptr));
    if (!r) {
      s.check();
      throw Error("the desktop's X server refused to read the screen");
    }
    if (r->depth != s.screen.depth ||
        std::uint64_t{r->length} * 4 < std::uint64_t{stride} * static_cast<std::uint64_t>(rows))
      throw Error("the desktop's X server sent a screen image that does not match the screen it described");
    return r;
  };
  Pixels region{nullptr, w, h, stride};
  XPtr<xcb_get_image_reply_t> whole;
  std::vector<std::uint8_t> strips;
  if (strip_rows >= h) {
    whole = read_strip(req.y0, h);
    region.data = xcb_get_image_data(whole.get());
  } else {
    strips.resize(stride * static_cast<std::size_t>(h));
    for (int y = 0; y < h; y += strip_rows) {
      const int rows = std::min(strip_rows, h - y);
      const auto r = read_strip(req.y0 + y, rows);
      std::memcpy(strips.data() + stride * static_cast<std::size_t>(y), xcb_get_image_data(r.get()),
                  stride * static_cast<std::size_t>(rows));
    }
    region.data = strips.data();
  }
  std::vector<std::uint8_t> scaled;
  Pixels image = region;
  if (req.width != w || req.height != h) {
    scaled = scale(region, req.width, req.height);
    image = Pixels{scaled.data(), req.width, req.height, static_cast<std::size_t>(req.width) * 4};
  }
  if (req.png) return encode_png(image, s.screen.msb_first);
  // JPEG straight from the X pixels (no conversion copy), 4:2:0 as is usual at q75: 2.5 ms at
  // 1280x800 where 4:4:4 takes 4 ms and 20% more bytes; TJFLAG_FASTDCT was no faster here.
  if (!s.jpeg) {
    s.jpeg.reset(tjInitCompress());
    if (!s.jpeg) throw Error("the JPEG encoder could not start");
  }
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(s.jpeg.get(), image.data, image.width, static_cast<int>(image.stride), image.height,
                  s.screen.msb_first ? TJPF_XRGB : TJPF_BGRX, &jpeg, &size, TJSAMP_420, std::clamp(req.quality, 1, 100),
                  0) != 0) {
    tjFree(jpeg);
    throw Error(fmt::format("the JPEG could not be made: {}", tjGetErrorStr2(s.jpeg.get())));
  }
  std::string out(reinterpret_cast<const char*>(jpeg), size);
  tjFree(jpeg);
  return out;
}

void Display::input(const std::vector<InputEvent>& events, bool hold_buttons) {
  State& s = *state_;
  s.check();
  s.require_xtest();
  s.ensure_keymap();
  // Keysyms the keyboard lacks get a spare keycode for this request.
  std::map<std::uint32_t, State::Key> keys;
  std::map<std::uint8_t, std::uint32_t> assign;
  std::vector<std::uint8_t> spares;
  for (const InputEvent& e : events) {
    if (e.kind != InputEvent::Kind::key || keys.contains(e.keysym)) continue;
    if (const auto key = s.find_key(e.keysym)) {
      keys[e.keysym] = *key;
      continue;
    }
    if (assign.empty()) spares = s.spare_keycodes();
    if (assign.size() >= spares.size())
      throw Error(fmt::format("the request needs {} keys the keyboard lacks and the keyboard map has {} free keycodes",
                              assign.size() + 1, spares.size()));
    const std::uint8_t kc = spares[assign.size()];
    assign[kc] = e.keysym;
    keys[e.keysym] = State::Key{kc, false};
  }
  if (!assign.empty()) {
    s.remap(assign);
    s.pause(kRemapSettle);
  }
  // Keys and buttons this request pressed and has not released, in order; Shift pressed for a
  // keysym on the Shift level counts per key.
  std::vector<std::uint8_t> keys_down, buttons_down;
  std::map<std::uint8_t, bool> shifted;  // keycode -> this request pressed Shift for it
  const auto release_all = [&] {
    for (auto it = keys_down.rbegin(); it != keys_down.rend(); ++it) {
      s.fake(XCB_KEY_RELEASE, *it);
      if (shifted[*it] && s.keymap.shift) s.fake(XCB_KEY_RELEASE, s.keymap.shift);
    }
    for (auto it = buttons_down.rbegin(); it != buttons_down.rend(); ++it) s.fake(XCB_BUTTON_RELEASE, *it);
    keys_down.clear();
    buttons_down.clear();
  };
  const auto restore = [&] {
    if (assign.empty()) return;
    s.pause(kRemapDrain);
    for (auto& [kc, sym] : assign) sym = 0;
    s.remap(assign);
  };
  try {
    for (const InputEvent& e : events) {
      switch (e.kind) {
        case InputEvent::Kind::move:
          s.fake(XCB_MOTION_NOTIFY, 0, e.x, e.y);
          break;
        case InputEvent::Kind::button: {
          const auto b = static_cast<std::uint8_t>(e.button);
          s.fake(e.down ? XCB_BUTTON_PRESS : XCB_BUTTON_RELEASE, b);
          if (e.down)
            buttons_down.push_back(b);
          else
            std::erase(buttons_down, b);
          break;
        }
        case InputEvent::Kind::key: {
          const State::Key key = keys.at(e.keysym);
          const bool held = std::find(keys_down.begin(), keys_down.end(), key.keycode) != keys_down.end();
          if (e.down) {
            // Shift for a keysym on the Shift level, unless the request holds Shift already.
            const bool add_shift = key.shift && !held && s.keymap.shift &&
                                   std::find(keys_down.begin(), keys_down.end(), s.keymap.shift) == keys_down.end();
            if (add_shift) s.fake(XCB_KEY_PRESS, s.keymap.shift);
            s.fake(XCB_KEY_PRESS, key.keycode);
            if (!held) {
              keys_down.push_back(key.keycode);
              shifted[key.keycode] = add_shift;
            }
          } else {
            s.fake(XCB_KEY_RELEASE, key.keycode);
            if (held) {
              if (shifted[key.keycode] && s.keymap.shift) s.fake(XCB_KEY_RELEASE, s.keymap.shift);
              std::erase(keys_down, key.keycode);
            }
          }
          break;
        }
        case InputEvent::Kind::sleep:
          s.pause(milliseconds(e.sleep_ms));
          break;
      }
    }
    if (hold_buttons) buttons_down.clear();
    release_all();
    s.sync();
    restore();
  } catch (...) {
    if (!xcb_connection_has_error(s.c)) {
      release_all();
      xcb_flush(s.c);
      try {
        restore();
      } catch (const std::exception&) {
      }
    }
    throw;
  }
}

void Display::type(const std::u32string& text, milliseconds delay) {
  State& s = *state_;
  s.check();
  s.require_xtest();
  s.ensure_keymap();
  std::vector<std::uint32_t> syms;
  syms.reserve(text.size());
  for (char32_t cp : text) syms.push_back(keysym_of_code_point(cp));
  const std::vector<std::uint8_t> spares = s.spare_keycodes();
  // Caps Lock would turn a typed 'a' into 'A': off while typing, on again after.
  bool caps = false;
  if (s.keymap.lock) {
    XPtr<xcb_query_pointer_reply_t> p(xcb_query_pointer_reply(s.c, xcb_query_pointer(s.c, s.screen.root), nullptr));
    if (!p) s.lost();
    caps = (p->mask & XCB_MOD_MASK_LOCK) != 0;
  }
  const auto tap = [&](std::uint8_t keycode) {
    s.fake(XCB_KEY_PRESS, keycode);
    s.fake(XCB_KEY_RELEASE, keycode);
  };
  if (caps) tap(s.keymap.lock);
  // The text in runs whose missing keysyms fit the spare keycodes; each run is typed through one
  // keyboard map (one MappingNotify per run of spare keycodes, not per character).
  std::map<std::uint8_t, std::uint32_t> assigned;  // every spare keycode given a keysym so far
  bool remapped = false;
  try {
    std::size_t i = 0;
    while (i < syms.size()) {
      std::map<std::uint32_t, State::Key> keys;
      std::map<std::uint8_t, std::uint32_t> run;
      std::size_t end = i;
      for (; end < syms.size(); ++end) {
        const std::uint32_t sym = syms[end];
        if (keys.contains(sym)) continue;
        if (const auto key = s.find_key(sym); key && !assigned.contains(key->keycode)) {
          keys[sym] = *key;
          continue;
        }
        if (spares.empty()) throw Error("the keyboard map has no free keycode to type the characters it lacks");
        if (run.size() >= spares.size()) break;
        const std::uint8_t kc = spares[run.size()];
        run[kc] = sym;
        keys[sym] = State::Key{kc, false};
      }
      if (!run.empty()) {
        if (remapped) s.pause(kRemapDrain);  // the previous run's keys handled before their keycodes change
        s.remap(run);
        for (const auto& [kc, sym] : run) assigned[kc] = sym;
        remapped = true;
        s.pause(kRemapSettle);
      }
      for (; i < end; ++i) {
        const State::Key key = keys.at(syms[i]);
        if (key.shift && s.keymap.shift) s.fake(XCB_KEY_PRESS, s.keymap.shift);
        tap(key.keycode);
        if (key.shift && s.keymap.shift) s.fake(XCB_KEY_RELEASE, s.keymap.shift);
        if (delay.count() > 0 && i + 1 < syms.size()) s.pause(delay);
      }
      s.sync();
    }
  } catch (...) {
    if (!xcb_connection_has_error(s.c) && remapped) {
      try {
        for (auto& [kc, sym] : assigned) sym = 0;
        s.remap(assigned);
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  if (remapped) {
    s.pause(kRemapDrain);
    for (auto& [kc, sym] : assigned) sym = 0;
    s.remap(assigned);
  }
  if (caps) {
    tap(s.keymap.lock);
    s.sync();
  }
}

PointerInfo Display::pointer() {
  State& s = *state_;
  s.check();
  XPtr<xcb_query_pointer_reply_t> p(xcb_query_pointer_reply(s.c, xcb_query_pointer(s.c, s.screen.root), nullptr));
  if (!p) s.lost();
  return {p->root_x, p->root_y};
}

std::optional<WindowInfo> Display::focused() {
  State& s = *state_;
  s.check();
  xcb_window_t w = XCB_NONE;
  if (s.has_window_manager()) {
    const auto active = s.property(s.screen.root, s.atom(a_NET_ACTIVE_WINDOW), kAtomWINDOW, 4);
    if (active && active->words().size() == 1) w = active->words()[0];
  } else {
    XPtr<xcb_get_input_focus_reply_t> f(xcb_get_input_focus_reply(s.c, xcb_get_input_focus(s.c), nullptr));
    if (!f) s.lost();
    w = f->focus;
    // The top-level window that holds the focus (a child of the root), a bounded climb.
    for (int depth = 0; w > XCB_INPUT_FOCUS_POINTER_ROOT && w != s.screen.root && depth < 32; ++depth) {
      XPtr<xcb_query_tree_reply_t> t(xcb_query_tree_reply(s.c, xcb_query_tree(s.c, w), nullptr));
      if (!t) {
        s.check();
        return std::nullopt;
      }
      if (t->parent == s.screen.root) break;
      w = t->parent;
    }
  }
  if (w <= XCB_INPUT_FOCUS_POINTER_ROOT || w == s.screen.root) return std::nullopt;
  auto described = s.describe({w});
  if (described.empty()) return std::nullopt;
  described[0].active = true;
  return described[0];
}

std::vector<WindowInfo> Display::windows() {
  State& s = *state_;
  s.check();
  return s.describe(s.client_windows());
}

void Display::window_action(std::uint32_t id, WindowAction action, const MoveTo& move) {
  State& s = *state_;
  s.check();
  const auto ids = s.client_windows();
  if (std::find(ids.begin(), ids.end(), id) == ids.end())
    throw Error(fmt::format("there is no window 0x{:x} on the desktop (windows lists them)", id));
  const bool wm = s.has_window_manager();
  const auto need_wm = [&](std::string_view what) {
    if (!wm) throw Error(fmt::format("the desktop has no window manager to {} windows", what));
  };
  constexpr std::uint32_t kSourcePager = 2;  // EWMH: a request on the user's behalf
  switch (action) {
    case WindowAction::activate:
      if (wm) {
        s.client_message(id, s.atom(a_NET_ACTIVE_WINDOW), {kSourcePager, XCB_CURRENT_TIME, 0, 0, 0});
      } else {
        const std::uint32_t above = XCB_STACK_MODE_ABOVE;
        xcb_configure_window(s.c, id, XCB_CONFIG_WINDOW_STACK_MODE, &above);
        xcb_set_input_focus(s.c, XCB_INPUT_FOCUS_POINTER_ROOT, id, XCB_CURRENT_TIME);
      }
      break;
    case WindowAction::maximize:
      need_wm("maximize");
      s.client_message(id, s.atom(a_NET_WM_STATE),
                       {1 /* add */, s.atom(kStateMaxVert), s.atom(kStateMaxHorz), kSourcePager, 0});
      break;
    case WindowAction::restore:
      need_wm("restore");
      s.client_message(id, s.atom(a_NET_WM_STATE),
                       {0 /* remove */, s.atom(kStateMaxVert), s.atom(kStateMaxHorz), kSourcePager, 0});
      xcb_map_window(s.c, id);  // a minimized window comes back
      s.client_message(id, s.atom(a_NET_ACTIVE_WINDOW), {kSourcePager, XCB_CURRENT_TIME, 0, 0, 0});
      break;
    case WindowAction::minimize:
      need_wm("minimize");
      s.client_message(id, s.atom(aWM_CHANGE_STATE), {3 /* IconicState */, 0, 0, 0, 0});
      break;
    case WindowAction::close:
      need_wm("close");
      s.client_message(id, s.atom(a_NET_CLOSE_WINDOW), {XCB_CURRENT_TIME, kSourcePager, 0, 0, 0});
      break;
    case WindowAction::move: {
      // Frame coordinates as `windows` reports them; the window manager is asked for the client's
      // size (the frame's extents taken off).
      const auto now = s.describe({id});
      if (now.empty()) throw Error(fmt::format("window 0x{:x} went away", id));
      const auto extents = s.property(id, s.atom(a_NET_FRAME_EXTENTS), kAtomCARDINAL, 16);
      const auto e = extents ? extents->words() : std::vector<std::uint32_t>{};
      std::uint32_t l = 0, r = 0, t = 0, b = 0;
      if (e.size() == 4 && *std::max_element(e.begin(), e.end()) <= std::uint32_t(kMaxSide)) {
        l = e[0], r = e[1], t = e[2], b = e[3];
      }
      const int width = move.width.value_or(now[0].width) - static_cast<int>(l + r);
      const int height = move.height.value_or(now[0].height) - static_cast<int>(t + b);
      if (width < 1 || height < 1 || width > kMaxSide || height > kMaxSide)
        throw Error(fmt::format("a window of {}x{} without its frame; windows are 1x1 to {}x{}", width, height,
                                kMaxSide, kMaxSide));
      if (wm) {
        // NorthWest gravity, x, y, width and height given, on the user's behalf.
        const std::uint32_t flags = 1u | (1u << 8) | (1u << 9) | (1u << 10) | (1u << 11) | (kSourcePager << 12);
        s.client_message(id, s.atom(a_NET_MOVERESIZE_WINDOW),
                         {flags, static_cast<std::uint32_t>(move.x), static_cast<std::uint32_t>(move.y),
                          static_cast<std::uint32_t>(width), static_cast<std::uint32_t>(height)});
      } else {
        const std::array<std::uint32_t, 4> values{static_cast<std::uint32_t>(move.x),
                                                  static_cast<std::uint32_t>(move.y), static_cast<std::uint32_t>(width),
                                                  static_cast<std::uint32_t>(height)};
        xcb_configure_window(
            s.c, id, XCB_CONFIG_WINDOW_X | XCB_CONFIG_WINDOW_Y | XCB_CONFIG_WINDOW_WIDTH | XCB_CONFIG_WINDOW_HEIGHT,
            values.data());
      }
      break;
    }
  }
  s.sync();
}

std::string Display::clipboard_get() {
  State& s = *state_;
  s.check();
  XPtr<xcb_get_selection_owner_reply_t> owner(
      xcb_get_selection_owner_reply(s.c, xcb_get_selection_owner(s.c, s.atom(aCLIPBOARD)), nullptr));
  if (!owner) s.lost();
  if (owner->owner == XCB_NONE) return {};
  // Asked through X even when this agent owns it: what another application would paste.
  for (xcb_atom_t target : {s.atom(aUTF8_STRING), kAtomSTRING}) {
    xcb_delete_property(s.c, s.window, s.atom(aSELECTION_PROPERTY));
    xcb_convert_selection(s.c, s.window, s.atom(aCLIPBOARD), target, s.atom(aSELECTION_PROPERTY), XCB_CURRENT_TIME);
    xcb_flush(s.c);
    const xcb_window_t w = s.window;
    const xcb_atom_t clipboard = s.atom(aCLIPBOARD);
    const auto ev = s.wait_event(Clock::now() + kSelectionWait, [&](const xcb_generic_event_t& e) {
      if ((e.response_type & 0x7f) != XCB_SELECTION_NOTIFY) return false;
      const auto& n = reinterpret_cast<const xcb_selection_notify_event_t&>(e);
      return n.requestor == w && n.selection == clipboard;
    });
    if (!ev) throw Error(fmt::format("the clipboard's owner (window 0x{:x}) did not answer within 3 s", owner->owner));
    if (reinterpret_cast<const xcb_selection_notify_event_t*>(ev.get())->property == XCB_NONE) continue;
    const auto p = s.take_property(
        s.ask_property(s.window, s.atom(aSELECTION_PROPERTY), XCB_GET_PROPERTY_TYPE_ANY, kMaxClipboard, true));
    if (!p || p->type == XCB_NONE) return {};
    if (p->type == s.atom(aINCR))
      throw Error(
          "the clipboard holds more text than its owner sends at once (an INCR transfer); the display agent "
          "reads up to 1 MiB sent at once");
    if (p->bytes_after > 0 || p->data.size() > kMaxClipboard)
      throw Error("the clipboard holds more than 1 MiB of text; not read");
    if (p->format != 8) throw Error("the clipboard's owner answered with something that is not text");
    return p->type == kAtomSTRING ? latin1_to_utf8(p->data) : text::sanitize_utf8(p->data);
  }
  throw Error("the clipboard holds no text (its owner offers neither UTF8_STRING nor STRING)");
}

void Display::clipboard_set(std::string text) {
  State& s = *state_;
  s.check();
  if (text.size() > kMaxClipboard) throw Error("clipboard text is at most 1 MiB");
  const xcb_timestamp_t time = s.server_time();
  xcb_set_selection_owner(s.c, s.window, s.atom(aCLIPBOARD), time);
  XPtr<xcb_get_selection_owner_reply_t> owner(
      xcb_get_selection_owner_reply(s.c, xcb_get_selection_owner(s.c, s.atom(aCLIPBOARD)), nullptr));
  if (!owner) s.lost();
  if (owner->owner != s.window) throw Error("the desktop's X server did not give the clipboard to the display agent");
  s.clipboard = std::move(text);
  s.clipboard_time = time;
}

}  // namespace nshpc::desktop::x11
