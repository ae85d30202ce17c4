// The desktop's tools (tools/desktop_tools.hpp). Coordinates are in screenshot pixels: the
// screenshot is the screen itself unless the screen is larger than a model takes in, when it is
// scaled down (shot_size) and every result says by how much. A coordinate outside the screenshot
// is refused, never clamped. Every result carries one text line (screen, focused window, cursor)
// beside any image, for clients that drop or delay images.
#include "tools/desktop_tools.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "desktop/atspi.hpp"
#include "desktop/keys.hpp"
#include "files/content.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;
using std::chrono::milliseconds;

constexpr int kMaxSide = 1568;   // Anthropic's bounds of an image a model sees
constexpr int kMaxTiles = 1568;  // of 28×28 pixels
constexpr int kJpegQuality = 75;
constexpr double kMaxDuration = 100;  // s, of wait and hold_key (the reference refuses more)
constexpr int kMaxRepeat = 100;
constexpr int kMaxScroll = 100;
constexpr std::size_t kMaxTypeChars = 20000;
constexpr std::size_t kMaxClipboard = 1 << 20;

const std::vector<std::string> kActions = {
    "screenshot",   "zoom",         "cursor_position", "mouse_move",      "left_click",   "right_click",
    "middle_click", "double_click", "triple_click",    "left_click_drag", "left_mouse_down", "left_mouse_up",
    "scroll",       "type",         "key",             "hold_key",        "wait"};

constexpr std::string_view kNotExecuted = "Not executed: an earlier computer action in this turn failed.";

bool fits(int w, int h) {
  return std::max(w, h) <= kMaxSide && ((w + 27) / 28) * ((h + 27) / 28) <= kMaxTiles;
}

json image_content(const desktop::Frame& frame) {
  const auto f = frame.header.find("format");
  const std::string format = f != frame.header.end() && f->is_string() ? f->get<std::string>() : "png";
  return {{"type", "image"},
          {"data", files::base64_encode(frame.payload)},
          {"mimeType", format == "jpeg" ? "image/jpeg" : "image/png"}};
}

json text_content(std::string text) { return {{"type", "text"}, {"text", std::move(text)}}; }

// Fields of what the display agent answered (hostile: a field may be missing or of another type).
int int_field(const json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_number_integer() ? static_cast<int>(std::clamp<std::int64_t>(it->get<std::int64_t>(), -1000000, 1000000)) : 0;
}
std::string str_field(const json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? text::truncate_utf8(text::sanitize_utf8(it->get<std::string>()), 1000) : "";
}
bool bool_field(const json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

// An argument's schema: its type and what it is (every argument of a listed tool is described).
json arg(const char* type, const char* what) { return {{"type", type}, {"description", what}}; }

// The instance's screen as one call sees it: its size, the screenshot's, the cursor and focus.
class Screen {
 public:
  Screen(instances::Desktops& desktops, store::Instance inst, std::string who)
      : desktops_(desktops), inst_(std::move(inst)), who_(std::move(who)) {
    refresh();
  }

  const store::Instance& inst() const { return inst_; }
  int width() const { return width_; }
  int height() const { return height_; }
  const ShotSize& shot() const { return shot_; }

  json call(const json& request, milliseconds deadline = std::chrono::seconds(10)) {
    return desktops_.call(inst_, request, who_, deadline).header;
  }
  desktop::Frame frame(const json& request, milliseconds deadline = std::chrono::seconds(15)) {
    return desktops_.call(inst_, request, who_, deadline);
  }

  // Screen facts anew (cursor, focus).
  void refresh() {
    info_ = call({{"op", "info"}});
    width_ = int_field(info_, "width");
    height_ = int_field(info_, "height");
    if (width_ <= 0 || height_ <= 0 || width_ > 32768 || height_ > 32768)
      throw Error("the desktop's X server reported an impossible screen size");
    shot_ = shot_size(width_, height_);
  }

  // A screenshot-space point as screen pixels; UsageError naming the argument when outside.
  std::pair<int, int> to_screen(const json& point, std::string_view name) const {
    if (!point.is_array() || point.size() != 2 || !point[0].is_number() || !point[1].is_number())
      throw UsageError(fmt::format("{} must be [x, y] (two numbers)", name));
    const double x = point[0].get<double>(), y = point[1].get<double>();
    if (x < 0 || y < 0 || x >= shot_.width || y >= shot_.height)
      throw UsageError(fmt::format("{} [{}, {}] is outside the screen: x must be 0-{}, y 0-{} (screenshot pixels)", name,
                                   x, y, shot_.width - 1, shot_.height - 1));
    const int sx = std::clamp(static_cast<int>(std::lround(x / shot_.scale)), 0, width_ - 1);
    const int sy = std::clamp(static_cast<int>(std::lround(y / shot_.scale)), 0, height_ - 1);
    return {sx, sy};
  }

  std::pair<int, int> cursor_on_screen() const {
    const json c = info_.value("cursor", json::array({0, 0}));
    const int x = c.is_array() && c.size() == 2 && c[0].is_number_integer() ? c[0].get<int>() : 0;
    const int y = c.is_array() && c.size() == 2 && c[1].is_number_integer() ? c[1].get<int>() : 0;
    return {std::clamp(x, 0, width_ - 1), std::clamp(y, 0, height_ - 1)};
  }

  std::pair<int, int> cursor_in_shot() const {
    const json c = info_.value("cursor", json::array({0, 0}));
    const int x = c.is_array() && c.size() == 2 && c[0].is_number_integer() ? c[0].get<int>() : 0;
    const int y = c.is_array() && c.size() == 2 && c[1].is_number_integer() ? c[1].get<int>() : 0;
    return {static_cast<int>(std::lround(x * shot_.scale)), static_cast<int>(std::lround(y * shot_.scale))};
  }

  std::string focused_title() const {
    const auto f = info_.find("focused");
    if (f == info_.end() || !f->is_object()) return "";
    return text::truncate_utf8(str_field(*f, "title"), 120);
  }

  // The text line beside every image.
  std::string line() const {
    const auto [cx, cy] = cursor_in_shot();
    std::string scale;
    if (shot_.scale != 1.0)
      scale = fmt::format(" (screenshot {}x{}: coordinates are screenshot pixels, x{:.4f} on the screen)", shot_.width,
                          shot_.height, 1.0 / shot_.scale);
    const std::string title = focused_title();
    return fmt::format("Screen {}x{}{}; focused window: {}; cursor at ({}, {}).", width_, height_, scale,
                       title.empty() ? "none" : fmt::format("\"{}\"", title), cx, cy);
  }

  json facts() const {
    const auto [cx, cy] = cursor_in_shot();
    return {{"screen", {width_, height_}},
            {"screenshot", {shot_.width, shot_.height}},
            {"scale", shot_.scale},
            {"cursor", {cx, cy}},
            {"focused_window", focused_title()}};
  }

  // The whole screen as the model gets it.
  desktop::Frame capture(const std::string& format) {
    json req = {{"op", "capture"}, {"format", format}, {"quality", kJpegQuality}};
    if (shot_.scale != 1.0) {
      req["width"] = shot_.width;
      req["height"] = shot_.height;
    }
    return frame(req);
  }

  // A capture once the screen has stopped changing (at most ~1 s after an action).
  desktop::Frame settled(const std::string& format) {
    std::this_thread::sleep_for(milliseconds(100));
    desktop::Frame last = capture(format);
    for (int i = 0; i < 9; ++i) {
      std::this_thread::sleep_for(milliseconds(100));
      desktop::Frame now = capture(format);
      const bool same = now.payload == last.payload;
      last = std::move(now);
      if (same) break;
    }
    refresh();
    return last;
  }

 private:
  instances::Desktops& desktops_;
  store::Instance inst_;
  std::string who_;
  json info_;
  int width_ = 0, height_ = 0;
  ShotSize shot_;
};

// Input events (desktop/wire.hpp).
json move_to(int x, int y) { return {{"move", {x, y}}}; }
json button(int n, bool down) { return {{"button", n}, {"down", down}}; }
json key(std::uint32_t keysym, bool down) { return {{"key", keysym}, {"down", down}}; }
json pause(int ms) { return {{"sleep_ms", ms}}; }

// `events` with the modifiers of `held` ("ctrl+shift") pressed around them.
json with_modifiers(const std::string& held, json events) {
  if (held.empty()) return events;
  const std::vector<std::uint32_t> mods = desktop::parse_modifiers(held);
  json out = json::array();
  for (std::uint32_t m : mods) out.push_back(key(m, true));
  for (auto& e : events) out.push_back(std::move(e));
  for (auto it = mods.rbegin(); it != mods.rend(); ++it) out.push_back(key(*it, false));
  return out;
}

json clicks(int n, int count) {
  json out = json::array();
  for (int i = 0; i < count; ++i) {
    out.push_back(button(n, true));
    out.push_back(button(n, false));
  }
  return out;
}

void play(Screen& screen, json events, milliseconds deadline = std::chrono::seconds(10), bool release = true) {
  json req = {{"op", "input"}, {"events", std::move(events)}};
  if (!release) req["release"] = false;
  screen.call(req, deadline);
}

std::string string_of(const json& a, const char* name) {
  const auto it = a.find(name);
  if (it == a.end() || it->is_null()) return "";
  if (!it->is_string()) throw UsageError(fmt::format("{} must be a string", name));
  return it->get<std::string>();
}

std::string required_text(const json& a, const std::string& action) {
  std::string t = string_of(a, "text");
  if (t.empty()) throw UsageError(fmt::format("{} needs text", action));
  return t;
}

double duration_of(const json& a, const std::string& action) {
  const auto it = a.find("duration");
  if (it == a.end() || !it->is_number()) throw UsageError(fmt::format("{} needs duration (seconds)", action));
  const double d = it->get<double>();
  if (d < 0 || d > kMaxDuration)
    throw UsageError(fmt::format("duration {} is out of range: {} takes 0 to {} seconds", d, action, kMaxDuration));
  return d;
}

int int_in(const json& a, const char* name, int low, int high, int fallback) {
  const auto it = a.find(name);
  if (it == a.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) throw UsageError(fmt::format("{} must be an integer", name));
  const auto v = it->get<std::int64_t>();
  if (v < low || v > high) throw UsageError(fmt::format("{} must be {}-{} (got {})", name, low, high, v));
  return static_cast<int>(v);
}

// What one action of `computer` did, and whether a screenshot follows it.
struct Done {
  std::string text;
  bool screenshot = true;
  std::optional<desktop::Frame> image;  // zoom's own image
};

int scroll_button(const std::string& direction) {
  if (direction == "up") return 4;
  if (direction == "down") return 5;
  if (direction == "left") return 6;
  if (direction == "right") return 7;
  throw UsageError(fmt::format("scroll_direction '{}' is not one of up, down, left, right", direction));
}

Done run_action(Screen& screen, const json& a, const std::string& format, mcp::RequestContext& rc) {
  const auto action_it = a.find("action");
  if (action_it == a.end() || !action_it->is_string())
    throw UsageError(fmt::format("action is missing; it is one of: {}", fmt::join(kActions, ", ")));
  const std::string action = action_it->get<std::string>();
  if (std::find(kActions.begin(), kActions.end(), action) == kActions.end())
    throw UsageError(fmt::format("unknown action '{}'; it is one of: {}", action, fmt::join(kActions, ", ")));
  const std::string held = string_of(a, "text");
  auto at = [&](json events) {
    if (a.contains("coordinate") && !a["coordinate"].is_null()) {
      const auto [x, y] = screen.to_screen(a["coordinate"], "coordinate");
      events.insert(events.begin(), move_to(x, y));
    }
    return events;
  };
  if (action == "screenshot") return {"screenshot"};
  if (action == "cursor_position") {
    const auto [x, y] = screen.cursor_in_shot();
    return {fmt::format("cursor at x={}, y={}", x, y), false};
  }
  if (action == "zoom") {
    const json r = a.value("region", json());
    if (!r.is_array() || r.size() != 4 || !std::all_of(r.begin(), r.end(), [](const json& v) { return v.is_number(); }))
      throw UsageError("zoom needs region [x0, y0, x1, y1] (screenshot pixels)");
    const auto [x0, y0] = screen.to_screen(json::array({r[0], r[1]}), "region's first corner");
    const double ex = r[2].get<double>(), ey = r[3].get<double>();
    if (ex <= r[0].get<double>() || ey <= r[1].get<double>() || ex > screen.shot().width || ey > screen.shot().height)
      throw UsageError(fmt::format("region [{}, {}, {}, {}] must have x0 < x1 <= {} and y0 < y1 <= {}", r[0].dump(),
                                   r[1].dump(), r[2].dump(), r[3].dump(), screen.shot().width, screen.shot().height));
    const int x1 = std::clamp(static_cast<int>(std::lround(ex / screen.shot().scale)), x0 + 1, screen.width());
    const int y1 = std::clamp(static_cast<int>(std::lround(ey / screen.shot().scale)), y0 + 1, screen.height());
    // The region at the screen's resolution, scaled to fill the screenshot's frame.
    const double fit = std::min(static_cast<double>(screen.shot().width) / (x1 - x0),
                                static_cast<double>(screen.shot().height) / (y1 - y0));
    const int w = std::max(1, static_cast<int>(std::lround((x1 - x0) * fit)));
    const int h = std::max(1, static_cast<int>(std::lround((y1 - y0) * fit)));
    desktop::Frame f = screen.frame({{"op", "capture"}, {"format", format}, {"quality", kJpegQuality},
                                     {"region", {x0, y0, x1, y1}}, {"width", w}, {"height", h}});
    return {fmt::format("zoom of screen pixels ({}, {})-({}, {}) shown at {}x{}; coordinates still refer to the full "
                        "screenshot",
                        x0, y0, x1, y1, w, h),
            false, std::move(f)};
  }
  if (action == "mouse_move") {
    if (!a.contains("coordinate")) throw UsageError("mouse_move needs coordinate [x, y]");
    // In a few steps, as a hand moves: a window manager starts moving a window on the first
    // motion with the button held (left_mouse_down) and follows the ones after it.
    const auto [x, y] = screen.to_screen(a["coordinate"], "coordinate");
    const auto [fx, fy] = screen.cursor_on_screen();
    json events = json::array();
    for (int i = 1; i <= 8; ++i) {
      events.push_back(move_to(fx + (x - fx) * i / 8, fy + (y - fy) * i / 8));
      if (i < 8) events.push_back(pause(3));
    }
    play(screen, std::move(events));
    return {"mouse moved"};
  }
  static const std::map<std::string, std::pair<int, int>> kClicks = {{"left_click", {1, 1}},   {"right_click", {3, 1}},
                                                                     {"middle_click", {2, 1}}, {"double_click", {1, 2}},
                                                                     {"triple_click", {1, 3}}};
  if (auto it = kClicks.find(action); it != kClicks.end()) {
    play(screen, with_modifiers(held, at(clicks(it->second.first, it->second.second))));
    return {action};
  }
  if (action == "left_click_drag") {
    if (!a.contains("start_coordinate") || !a.contains("coordinate"))
      throw UsageError("left_click_drag needs start_coordinate and coordinate");
    const auto [sx, sy] = screen.to_screen(a["start_coordinate"], "start_coordinate");
    const auto [ex, ey] = screen.to_screen(a["coordinate"], "coordinate");
    json events = json::array({move_to(sx, sy), button(1, true)});
    for (int i = 1; i <= 10; ++i) {  // intermediate motion: applications see a drag
      events.push_back(pause(5));
      events.push_back(move_to(sx + (ex - sx) * i / 10, sy + (ey - sy) * i / 10));
    }
    events.push_back(button(1, false));
    play(screen, with_modifiers(held, std::move(events)));
    return {"dragged"};
  }
  if (action == "left_mouse_down" || action == "left_mouse_up") {
    play(screen, at(json::array({button(1, action == "left_mouse_down")})), std::chrono::seconds(10),
         /*release=*/false);
    return {action};
  }
  if (action == "scroll") {
    const std::string direction = string_of(a, "scroll_direction");
    if (direction.empty()) throw UsageError("scroll needs scroll_direction (up, down, left, right)");
    const int n = int_in(a, "scroll_amount", 1, kMaxScroll, 3);
    play(screen, with_modifiers(held, at(clicks(scroll_button(direction), n))));
    return {fmt::format("scrolled {} {}", direction, n)};
  }
  if (action == "type") {
    const std::string t = required_text(a, action);
    if (text::utf8_length(t) > kMaxTypeChars)
      throw UsageError(fmt::format("type takes at most {} characters at a time", kMaxTypeChars));
    const json r = screen.call({{"op", "type"}, {"text", t}, {"delay_ms", 2}},
                               milliseconds(10000 + 20 * static_cast<std::int64_t>(t.size())));
    return {fmt::format("typed {} characters", int_field(r, "characters"))};
  }
  if (action == "key") {
    const std::vector<std::uint32_t> chord = desktop::parse_chord(required_text(a, action));
    const int repeat = int_in(a, "repeat", 1, kMaxRepeat, 1);
    json events = json::array();
    for (int i = 0; i < repeat; ++i) {
      for (std::uint32_t k : chord) events.push_back(key(k, true));
      for (auto it = chord.rbegin(); it != chord.rend(); ++it) events.push_back(key(*it, false));
    }
    play(screen, std::move(events));
    return {fmt::format("pressed {}{}", held, repeat > 1 ? fmt::format(" {} times", repeat) : "")};
  }
  if (action == "hold_key") {
    const std::vector<std::uint32_t> chord = desktop::parse_chord(required_text(a, action));
    const double d = duration_of(a, action);
    json events = json::array();
    for (std::uint32_t k : chord) events.push_back(key(k, true));
    events.push_back(pause(static_cast<int>(d * 1000)));
    for (auto it = chord.rbegin(); it != chord.rend(); ++it) events.push_back(key(*it, false));
    play(screen, std::move(events), milliseconds(static_cast<std::int64_t>(d * 1000) + 10000));
    return {fmt::format("held {} for {} s", held, d)};
  }
  // wait
  const double d = duration_of(a, action);
  if (rc.wait_cancelled_for(milliseconds(static_cast<std::int64_t>(d * 1000)))) throw Error("cancelled");
  return {fmt::format("waited {} s", d)};
}

// ---------------------------------------------------------------------------------------------
// mcp-virtual-computer's screen tools.

// The centre of an element of the accessibility tree (its ref from look_at_screen), in screen pixels.
std::pair<int, int> element_centre(instances::Desktops& desktops, const store::Instance& inst, const std::string& ref,
                                   const std::string& who) {
  const desktop::Node node =
      desktop::parse_element(desktops.accessibility(inst, {{"op", "element"}, {"ref", ref}}, who));
  if (!node.bounds || node.bounds->width <= 0 || node.bounds->height <= 0)
    throw UsageError(fmt::format("element {} has no place on the screen (hidden, or off screen); look_at_screen "
                                 "again",
                                 ref));
  return {node.bounds->x + node.bounds->width / 2, node.bounds->y + node.bounds->height / 2};
}

int button_number(const std::string& name) {
  if (name.empty() || name == "left") return 1;
  if (name == "middle") return 2;
  if (name == "right") return 3;
  throw UsageError(fmt::format("button '{}' is not one of left, middle, right", name));
}

// A point given as element, or x and y (screen pixels, as the seed's): the screen point.
std::optional<std::pair<int, int>> target_point(Screen& screen, instances::Desktops& desktops, const json& args,
                                                const std::string& who) {
  const std::string element = string_of(args, "element");
  const bool has_xy = args.contains("x") || args.contains("y");
  if (!element.empty() && has_xy) throw UsageError("give element or x and y, not both");
  if (!element.empty()) return element_centre(desktops, screen.inst(), element, who);
  if (!has_xy) return std::nullopt;
  if (!args.contains("x") || !args.contains("y")) throw UsageError("give both x and y");
  return screen.to_screen(json::array({args["x"], args["y"]}), "x, y");
}

// A window by id, exact title or class, or an unambiguous part of a title (the seed's rule).
json find_window(Screen& screen, const std::string& selector) {
  if (selector.empty()) throw UsageError("window is required: an id (0x...), a title or a class");
  const json reply = screen.call({{"op", "windows"}});
  const json list = reply.contains("windows") && reply["windows"].is_array() ? reply["windows"] : json::array();
  std::vector<json> exact, partial;
  std::string lower_sel = selector;
  std::transform(lower_sel.begin(), lower_sel.end(), lower_sel.begin(), ::tolower);
  for (const json& w : list) {
    if (!w.is_object()) continue;
    const std::string id = str_field(w, "id"), title = str_field(w, "title"), cls = str_field(w, "wm_class");
    if (id == selector || title == selector || cls == selector) {
      exact.push_back(w);
      continue;
    }
    std::string lt = title + "\n" + cls;
    std::transform(lt.begin(), lt.end(), lt.begin(), ::tolower);
    if (lt.find(lower_sel) != std::string::npos) partial.push_back(w);
  }
  const std::vector<json>& found = exact.empty() ? partial : exact;
  if (found.empty()) throw UsageError(fmt::format("No window matches '{}'; list_windows lists them.", selector));
  if (found.size() > 1) {
    std::vector<std::string> ids;
    for (std::size_t i = 0; i < found.size() && i < 8; ++i) ids.push_back(str_field(found[i], "id"));
    throw UsageError(fmt::format("Window selector is ambiguous; use one of: {}.", fmt::join(ids, ", ")));
  }
  return found.front();
}

// A window as the seed lists it.
json window_json(const json& w) {
  json states = json::array();
  if (auto it = w.find("states"); it != w.end() && it->is_array())
    for (const json& st : *it)
      if (st.is_string() && states.size() < 16) states.push_back(text::truncate_utf8(text::sanitize_utf8(st.get<std::string>()), 40));
  return {{"window_id", str_field(w, "id")},     {"desktop", int_field(w, "desktop")},
          {"x", int_field(w, "x")},               {"y", int_field(w, "y")},
          {"width", int_field(w, "width")},       {"height", int_field(w, "height")},
          {"wm_class", str_field(w, "wm_class")}, {"title", str_field(w, "title")},
          {"active", bool_field(w, "active")},    {"states", std::move(states)}};
}

// Which desktops are on, as tools/list needs to know on every call: read again at most every 2 s.
class DesktopsOn {
 public:
  explicit DesktopsOn(const store::Store& store) : store_(store) {}
  bool any() {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (!known_ || now - read_at_ > std::chrono::seconds(2)) {
      any_ = false;
      for (const store::Instance& inst : store_.list().instances)
        if (inst.meta.desktop()) {
          any_ = true;
          break;
        }
      read_at_ = now;
      known_ = true;
    }
    return any_;
  }
  void forget() {
    std::lock_guard lock(mutex_);
    known_ = false;
  }

 private:
  const store::Store& store_;
  std::mutex mutex_;
  bool known_ = false, any_ = false;
  std::chrono::steady_clock::time_point read_at_;
};

}  // namespace

namespace {

class ScreenResources : public mcp::ResourceProvider {
 public:
  ScreenResources(ToolContext ctx, std::function<std::optional<store::Instance>()> instance)
      : ctx_(std::move(ctx)), instance_(std::move(instance)) {}

  std::vector<mcp::Resource> list() override {
    const auto inst = on();
    if (!inst) return {};
    return {{kScreen, "current.png", "", "The desktop's screen now (PNG)", "image/png", std::nullopt},
            {kTree, "accessibility.json", "", "The desktop's accessibility tree now (at-spi-snapshot-v1)",
             "application/json", std::nullopt}};
  }
  std::vector<mcp::ResourceTemplate> templates() override { return {}; }
  std::optional<std::vector<mcp::ResourceContents>> read(const std::string& uri) override {
    if (uri != kScreen && uri != kTree) return std::nullopt;
    const auto inst = on();
    if (!inst) return std::nullopt;
    instances::Desktops& desktops = ctx_.services.instances.desktops();
    const std::string who = "mcp:resources";
    if (uri == kScreen) {
      const desktop::Frame f = desktops.call(*inst, {{"op", "capture"}, {"format", "png"}}, who, std::chrono::seconds(15));
      return std::vector<mcp::ResourceContents>{{uri, "image/png", std::nullopt, files::base64_encode(f.payload)}};
    }
    const desktop::Snapshot snap = desktop::parse_snapshot(desktops.accessibility(
        *inst, {{"op", "snapshot"}, {"max_nodes", 600}, {"max_depth", 12}, {"max_children", 200}, {"max_apps", 80}},
        who));
    return std::vector<mcp::ResourceContents>{{uri, "application/json", desktop::snapshot_json(snap).dump(), std::nullopt}};
  }

 private:
  static constexpr const char* kScreen = "computer://screen/current.png";
  static constexpr const char* kTree = "computer://screen/accessibility.json";
  std::optional<store::Instance> on() {
    std::optional<store::Instance> inst = instance_();
    if (!inst || !inst->meta.desktop()) return std::nullopt;
    return inst;
  }
  ToolContext ctx_;
  std::function<std::optional<store::Instance>()> instance_;
};

}  // namespace

std::shared_ptr<mcp::ResourceProvider> screen_resources(ToolContext ctx,
                                                        std::function<std::optional<store::Instance>()> instance) {
  return std::make_shared<ScreenResources>(std::move(ctx), std::move(instance));
}

ShotSize shot_size(int width, int height) {
  if (fits(width, height)) return {width, height, 1.0};
  double low = 0.0, high = 1.0;
  for (int i = 0; i < 40; ++i) {
    const double mid = (low + high) / 2;
    const int w = std::max(1, static_cast<int>(std::floor(width * mid))), h = std::max(1, static_cast<int>(std::floor(height * mid)));
    (fits(w, h) ? low : high) = mid;
  }
  const int w = std::max(1, static_cast<int>(std::floor(width * low)));
  const int h = std::max(1, static_cast<int>(std::floor(height * low)));
  return {w, h, static_cast<double>(w) / width};
}

void add_desktop_tools(mcp::Server& server, DesktopFace face) {
  auto f = std::make_shared<DesktopFace>(std::move(face));
  auto on = std::make_shared<DesktopsOn>(f->ctx.services.instances.store());
  instances::Desktops& desktops = f->ctx.services.instances.desktops();
  auto shown = [on] { return on->any(); };
  auto input = [f](json properties, std::vector<std::string> required = {}) {
    properties[f->id_name] = f->id_schema;
    return input_object(std::move(properties), std::move(required));
  };
  // A desktop that is off is said with the tool that switches it on.
  auto work = [f](const char* operation, std::function<mcp::ToolResult(const json&, mcp::RequestContext&)> body) {
    return f->working(operation, [body = std::move(body)](const json& args, mcp::RequestContext& rc) {
      try {
        return body(args, rc);
      } catch (const instances::DesktopOff& e) {
        throw UsageError(fmt::format("{}; set_desktop_environment with enabled=true switches it on", e.what()));
      }
    });
  };
  auto screen_of = [f, &desktops](const json& args, mcp::RequestContext& rc) {
    return Screen(desktops, f->instance_for(args, rc), actor(rc));
  };

  add_tool(server, {
      .name = "set_desktop_environment",
      .description = "Xfce desktop on/off in place (files, processes stay); screen tools are listed while on.",
      .input = input({{"enabled", arg("boolean", "On or off.")}}, {"enabled"}),
      .output = result_object({"desktop_environment"}),
      .hints = {.destructive = false},
      .handler = work("set_desktop_environment",
                            [f, on, &desktops, &server](const json& args, mcp::RequestContext& rc) {
                              const store::Instance inst = f->instance_for(args, rc);
                              const bool enabled = args.at("enabled").get<bool>();
                              store::Instance now;
                              try {
                                now = desktops.set(inst, enabled, actor(rc));
                              } catch (const instances::DesktopUnavailable& e) {
                                throw UsageError(f->unavailable_text(e));
                              }
                              on->forget();
                              server.notify_tool_list_changed();
                              server.notify_resource_list_changed();
                              json out = f->common(now, "idle");
                              out["desktop_environment"] = now.meta.desktop();
                              return mcp::ToolResult::text(out.dump(-1, ' ', false, json::error_handler_t::replace), out);
                            }),
      .listed = f->switch_listed,
  });

  const auto point = [](const char* what) {
    return json{{"type", "array"}, {"items", of_type("number")}, {"description", what}};
  };
  json action_props = {
      {"action", {{"type", "string"}, {"enum", kActions}, {"description", "What to do."}}},
      {"coordinate", point("[x, y]; clicks and scroll: omitted, at the cursor.")},
      {"start_coordinate", point("left_click_drag's start [x, y].")},
      {"text", {{"type", "string"}, {"description", "type: the text; key/hold_key: a chord (ctrl+s); clicks, scroll: modifiers held."}}},
      {"scroll_direction", {{"type", "string"}, {"enum", {"up", "down", "left", "right"}}, {"description", "scroll."}}},
      {"scroll_amount", arg("integer", "scroll: wheel clicks (1-100, default 3).")},
      {"duration", {{"type", "number"}, {"description", "Seconds (wait, hold_key; at most 100)."}}},
      {"region", {{"type", "array"}, {"items", of_type("number")}, {"description", "zoom: [x0, y0, x1, y1]."}}},
      {"repeat", arg("integer", "key: times (1-100).")}};
  json props = action_props;
  props["actions"] = {{"type", "array"},
                      {"items", of_type("object")},
                      {"description", "Several actions (each with these fields) run in order; stops at the first failure."}};
  props["format"] = {{"type", "string"}, {"enum", {"jpeg", "png"}}, {"description", "Of images (default jpeg)."}};
  add_tool(server, {
      .name = "computer",
      .description = "Anthropic's computer-use actions on the desktop. Coordinates are screenshot pixels. Actions "
                     "but cursor_position answer with a screenshot once the screen settles.",
      .input = input(std::move(props)),
      .output = result_object({"screen", "screenshot"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("computer", [f, screen_of](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        const std::string format = string_of(args, "format").empty() ? "jpeg" : string_of(args, "format");
        std::vector<json> batch;
        if (args.contains("actions") && !args["actions"].is_null()) {
          if (args.contains("action")) throw UsageError("give action or actions, not both");
          for (const json& a : args["actions"]) {
            if (!a.is_object()) throw UsageError("each item of actions is an object with an action");
            batch.push_back(a);
          }
          if (batch.empty()) throw UsageError("actions is empty");
        } else {
          batch.push_back(args);
        }
        mcp::ToolResult result;
        json done = json::array();
        bool failed = false, want_shot = false;
        std::optional<desktop::Frame> image;
        for (std::size_t i = 0; i < batch.size(); ++i) {
          const std::string name = str_field(batch[i], "action").empty() ? "?" : str_field(batch[i], "action");
          if (failed) {
            done.push_back({{"action", name}, {"error", kNotExecuted}});
            continue;
          }
          try {
            Done d = run_action(screen, batch[i], format, rc);
            want_shot = want_shot || d.screenshot || name == "screenshot";
            if (d.image) image = std::move(d.image);
            done.push_back({{"action", name}, {"result", d.text}});
          } catch (const mcp::ProtocolError&) {
            throw;
          } catch (const std::exception& e) {
            failed = true;
            done.push_back({{"action", name}, {"error", e.what()}});
          }
        }
        if (failed && batch.size() == 1) throw UsageError(done[0]["error"].get<std::string>());
        const bool only_shot = batch.size() == 1 && str_field(batch[0], "action") == "screenshot";
        if (want_shot && !image) image = only_shot ? screen.capture(format) : screen.settled(format);
        if (!want_shot) screen.refresh();
        json structured = screen.facts();
        std::string text;
        if (batch.size() > 1) {
          structured["actions"] = done;
          for (std::size_t i = 0; i < done.size(); ++i)
            text += fmt::format("{}. {}: {}\n", i + 1, done[i]["action"].get<std::string>(),
                                done[i].contains("error") ? "error: " + done[i]["error"].get<std::string>()
                                                          : done[i]["result"].get<std::string>());
        } else {
          text = done[0]["result"].get<std::string>() + "\n";
        }
        text += screen.line();
        result.content.push_back(text_content(std::move(text)));
        if (image) result.content.push_back(image_content(*image));
        result.structured = std::move(structured);
        result.is_error = failed;
        return result;
      }),
  });

  add_tool(server, {
      .name = "look_at_screen",
      .description = "A screenshot and the accessibility tree (element refs for click/type/scroll; refs change after "
                     "navigation: look again).",
      .input = input({{"include_image", arg("boolean", "Default true.")},
                      {"include_accessibility", arg("boolean", "Default true.")}}),
      .output = result_object({"accessibility"}),
      .hints = {.read_only = true},
      .shown = shown,
      .handler = work("look_at_screen", [f, screen_of, &desktops](const json& args, mcp::RequestContext& rc) {
        const bool image = args.value("include_image", true), tree = args.value("include_accessibility", true);
        if (!image && !tree) throw UsageError("include_image and include_accessibility cannot both be false");
        Screen screen = screen_of(args, rc);
        json out = f->common(screen.inst(), "look_at_screen");
        out["screen_image_uri"] = "computer://screen/current.png";
        out["accessibility_uri"] = "computer://screen/accessibility.json";
        std::string text = screen.line();
        out["accessibility"] = nullptr;
        if (tree) {
          const desktop::Snapshot snap =
              desktop::parse_snapshot(desktops.accessibility(screen.inst(), {{"op", "snapshot"}, {"max_nodes", 600},
                                                                           {"max_depth", 12}, {"max_children", 200},
                                                                           {"max_apps", 80}},
                                                             actor(rc)));
          out["accessibility"] = desktop::snapshot_json(snap);
          text += "\n" + desktop::snapshot_text(snap);
        }
        mcp::ToolResult result;
        result.content.push_back(text_content(std::move(text)));
        if (image) result.content.push_back(image_content(screen.capture("png")));
        out.update(screen.facts());
        result.structured = std::move(out);
        return result;
      }),
  });

  auto seed_result = [](json out) {
    return mcp::ToolResult::text(out.dump(-1, ' ', false, json::error_handler_t::replace), out);
  };

  add_tool(server, {
      .name = "click",
      .description = "Click an element (a ref from look_at_screen) or x, y.",
      .input = input({{"element", arg("string", "A ref from look_at_screen.")},
                      {"x", arg("integer", "Screen x (with y).")},
                      {"y", arg("integer", "Screen y.")},
                      {"button", {{"type", "string"}, {"enum", {"left", "middle", "right"}}, {"description", "Default left."}}},
                      {"clicks", arg("integer", "1-3 (default 1).")}}),
      .output = result_object({"ok"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("click", [screen_of, &desktops, seed_result](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        const int b = button_number(string_of(args, "button"));
        const int n = int_in(args, "clicks", 1, 3, 1);
        auto p = target_point(screen, desktops, args, actor(rc));
        if (!p) throw UsageError("click needs element, or x and y");
        play(screen, [&] {
          json events = clicks(b, n);
          events.insert(events.begin(), move_to(p->first, p->second));
          return events;
        }());
        return seed_result({{"ok", true}, {"x", p->first}, {"y", p->second},
                            {"button", string_of(args, "button").empty() ? "left" : string_of(args, "button")},
                            {"clicks", n}});
      }),
  });

  add_tool(server, {
      .name = "type",
      .description = "Type text (any script, exactly) into the focused window or an element; clear first, "
                     "press_enter after.",
      .input = input({{"text", arg("string", "What to type.")},
                      {"element", arg("string", "A ref, clicked first.")},
                      {"clear", arg("boolean", "Select all and delete first.")},
                      {"press_enter", arg("boolean", "Return after.")},
                      {"delay_ms", arg("integer", "Between keys, 0-100 (default 2).")}},
                     {"text"}),
      .output = result_object({"ok", "characters"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("type", [screen_of, &desktops, seed_result](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        const std::string t = args.at("text").get<std::string>();
        if (text::utf8_length(t) > kMaxTypeChars)
          throw UsageError(fmt::format("type takes at most {} characters at a time", kMaxTypeChars));
        const int delay = int_in(args, "delay_ms", 0, 100, 2);
        const std::string element = string_of(args, "element");
        if (!element.empty()) {
          const auto [x, y] = element_centre(desktops, screen.inst(), element, actor(rc));
          play(screen, json::array({move_to(x, y), button(1, true), button(1, false)}));
        }
        if (args.value("clear", false)) {
          const auto chord = desktop::parse_chord("ctrl+a");
          play(screen, json::array({key(chord[0], true), key(chord[1], true), key(chord[1], false), key(chord[0], false),
                                    key(desktop::parse_chord("BackSpace")[0], true),
                                    key(desktop::parse_chord("BackSpace")[0], false)}));
        }
        json r = json::object();
        if (!t.empty())
          r = screen.call({{"op", "type"}, {"text", t}, {"delay_ms", delay}},
                          milliseconds(10000 + (delay + 2) * static_cast<std::int64_t>(t.size())));
        const bool enter = args.value("press_enter", false);
        if (enter) {
          const auto ret = desktop::parse_chord("Return")[0];
          play(screen, json::array({key(ret, true), key(ret, false)}));
        }
        return seed_result({{"ok", true}, {"characters", int_field(r, "characters")}, {"pressed_enter", enter}});
      }),
  });

  add_tool(server, {
      .name = "scroll",
      .description = "Scroll the mouse wheel (at an element or x, y).",
      .input = input({{"direction", {{"type", "string"}, {"enum", {"up", "down", "left", "right"}}, {"description", "Default down."}}},
                      {"amount", arg("integer", "Wheel clicks, 1-50 (default 3).")},
                      {"element", arg("string", "A ref to scroll at.")},
                      {"x", arg("integer", "Screen x to scroll at (with y).")},
                      {"y", arg("integer", "Screen y.")}}),
      .output = result_object({"ok"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("scroll", [screen_of, &desktops, seed_result](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        const std::string direction = string_of(args, "direction").empty() ? "down" : string_of(args, "direction");
        const int amount = int_in(args, "amount", 1, 50, 3);
        json events = clicks(scroll_button(direction), amount);
        if (auto p = target_point(screen, desktops, args, actor(rc))) events.insert(events.begin(), move_to(p->first, p->second));
        play(screen, std::move(events));
        return seed_result({{"ok", true}, {"direction", direction}, {"amount", amount}});
      }),
  });

  add_tool(server, {
      .name = "list_windows",
      .description = "The desktop's windows: id, title, class, geometry, state.",
      .input = input(json::object()),
      .output = result_object({"windows"}),
      .hints = {.read_only = true},
      .shown = shown,
      .handler = work("list_windows", [screen_of, seed_result](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        json windows = json::array();
        const json reply = screen.call({{"op", "windows"}});
        if (reply.contains("windows") && reply["windows"].is_array())
          for (const json& w : reply["windows"])
            if (w.is_object() && windows.size() < 500) windows.push_back(window_json(w));
        return seed_result({{"windows", std::move(windows)}});
      }),
  });

  const json window_arg = {{"type", "string"}, {"description", "An id (0x...), an exact title or class, or part of a title."}};
  struct WindowTool {
    const char* name;
    const char* action;
    const char* what;
  };
  for (const WindowTool& t : {WindowTool{"switch_window", "activate", "Bring a window to the front."},
                              WindowTool{"maximize_window", "maximize", "Maximize a window."},
                              WindowTool{"restore_window", "restore", "Restore a maximized or minimized window."},
                              WindowTool{"minimize_window", "minimize", "Minimize a window."},
                              WindowTool{"close_window", "close", "Close a window (as its close button does)."}}) {
    const char* name = t.name;
    const std::string action = t.action;
    const char* what = t.what;
    add_tool(server, {
        .name = name,
        .description = what,
        .input = input({{"window", window_arg}}, {"window"}),
        .output = result_object({"ok"}),
        .hints = {.open_world = true},
        .shown = shown,
        .handler = work(name, [screen_of, seed_result, action = action](const json& args, mcp::RequestContext& rc) {
          Screen screen = screen_of(args, rc);
          const json w = find_window(screen, args.at("window").get<std::string>());
          screen.call({{"op", "window"}, {"id", str_field(w, "id")}, {"action", action}});
          return seed_result({{"ok", true}, {"window_id", str_field(w, "id")}, {"title", str_field(w, "title")}});
        }),
    });
  }
  add_tool(server, {
      .name = "move_window",
      .description = "Move a window to x, y (screen pixels), optionally resizing it.",
      .input = input({{"window", window_arg},
                      {"x", arg("integer", "Left edge.")},
                      {"y", arg("integer", "Top edge.")},
                      {"width", arg("integer", "New width.")},
                      {"height", arg("integer", "New height.")}},
                     {"window", "x", "y"}),
      .output = result_object({"ok"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("move_window", [screen_of, seed_result](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        const json w = find_window(screen, args.at("window").get<std::string>());
        json req = {{"op", "window"}, {"id", str_field(w, "id")}, {"action", "move"},
                    {"x", int_in(args, "x", -32768, 32767, 0)}, {"y", int_in(args, "y", -32768, 32767, 0)}};
        if (args.contains("width")) req["width"] = int_in(args, "width", 1, 32767, 1);
        if (args.contains("height")) req["height"] = int_in(args, "height", 1, 32767, 1);
        screen.call(req);
        return seed_result({{"ok", true}, {"window_id", str_field(w, "id")}});
      }),
  });

  add_tool(server, {
      .name = "clipboard",
      .description = "Read the desktop's clipboard, or set it to text (action get or set).",
      .input = input({{"action", {{"type", "string"}, {"enum", {"get", "set"}}, {"description", "get or set."}}},
                      {"text", arg("string", "set: the text.")}},
                     {"action"}),
      .output = result_object({"ok"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("clipboard", [screen_of, seed_result](const json& args, mcp::RequestContext& rc) {
        Screen screen = screen_of(args, rc);
        if (args.at("action") == "get") {
          const json r = screen.call({{"op", "clipboard_get"}});
          const std::string t = r.contains("text") && r["text"].is_string() ? r["text"].get<std::string>() : "";
          return seed_result({{"ok", true}, {"text", text::sanitize_utf8(t.substr(0, kMaxClipboard))}});
        }
        if (!args.contains("text")) throw UsageError("clipboard set needs text");
        const std::string t = args["text"].get<std::string>();
        if (t.size() > kMaxClipboard) throw UsageError(fmt::format("clipboard text is at most {} bytes", kMaxClipboard));
        screen.call({{"op", "clipboard_set"}, {"text", t}});
        return seed_result({{"ok", true}, {"characters", text::utf8_length(t)}});
      }),
  });

  add_tool(server, {
      .name = "open",
      .description = "Open a URL or file on the desktop with its default application (xdg-open).",
      .input = input({{"target", arg("string", "A URL or a path.")}}, {"target"}),
      .output = result_object({"ok"}),
      .hints = {.open_world = true},
      .shown = shown,
      .handler = work("open", [f, &desktops, seed_result](const json& args, mcp::RequestContext& rc) {
        const std::string what = args.at("target").get<std::string>();
        if (what.empty() || what.size() > 4096 || what.find('\0') != std::string::npos)
          throw UsageError("target must be a URL or a path (1-4096 bytes)");
        desktops.open(f->instance_for(args, rc), what, actor(rc));
        return seed_result({{"ok", true}, {"target", what}});
      }),
  });
}

}  // namespace nshpc::tools
