#include "desktop/keys.hpp"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"

namespace nshpc::desktop {

// Every keysym name of X11/keysymdef.h and XF86keysym.h without its XK_ prefix (XF86XK_AudioMute
// is "XF86AudioMute", as xdotool spells it), generated at build time (src/CMakeLists.txt).
extern const std::pair<std::string_view, std::uint32_t> kKeysymNames[];
extern const std::size_t kKeysymNameCount;

namespace {

// Keysyms named here (keysymdef.h values).
constexpr std::uint32_t kShiftL = 0xffe1, kControlL = 0xffe3, kAltL = 0xffe9, kSuperL = 0xffeb, kHyperL = 0xffed;
constexpr std::uint32_t kLevel3Shift = 0xfe03;  // ISO_Level3_Shift (AltGr)

// Names people and models use that are not keysym names (or mean another keysym than the keysym
// of that name: xdotool's "meta" is the Super key on today's keyboards, not the keysym Meta_L).
constexpr std::pair<std::string_view, std::uint32_t> kAliases[] = {
    {"ctrl", kControlL},   {"control", kControlL}, {"shift", kShiftL},      {"alt", kAltL},     {"option", kAltL},
    {"super", kSuperL},    {"win", kSuperL},       {"windows", kSuperL},    {"cmd", kSuperL},   {"command", kSuperL},
    {"meta", kSuperL},     {"hyper", kHyperL},     {"altgr", kLevel3Shift}, {"esc", 0xff1b},    {"enter", 0xff0d},
    {"return", 0xff0d},    {"backspace", 0xff08},  {"del", 0xffff},         {"delete", 0xffff}, {"ins", 0xff63},
    {"pageup", 0xff55},    {"pagedown", 0xff56},   {"pgup", 0xff55},        {"pgdn", 0xff56},   {"capslock", 0xffe5},
    {"numlock", 0xff7f},   {"scrolllock", 0xff14}, {"printscreen", 0xff61}, {"prtsc", 0xff61},  {"arrowup", 0xff52},
    {"arrowdown", 0xff54}, {"arrowleft", 0xff51},  {"arrowright", 0xff53},
};

bool equal_folded(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    return lower(x) == lower(y);
  });
}

// The keysym of one printable character; nullopt unless `name` is exactly one.
std::optional<std::uint32_t> keysym_of_character(std::string_view name) {
  const auto cps = code_points(name);
  if (!cps || cps->size() != 1) return std::nullopt;
  const char32_t cp = (*cps)[0];
  if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) return std::nullopt;
  return keysym_of_code_point(cp);
}

std::vector<std::string> known_names() {
  std::vector<std::string> names;
  names.reserve(kKeysymNameCount + std::size(kAliases));
  for (const auto& [name, sym] : kAliases) names.emplace_back(name);
  for (std::size_t i = 0; i < kKeysymNameCount; ++i) names.emplace_back(kKeysymNames[i].first);
  return names;
}

[[noreturn]] void unknown_key(std::string_view name, std::string_view chord) {
  std::string message = chord == name ? fmt::format("'{}' is not a key name", name)
                                      : fmt::format("'{}' in '{}' is not a key name", name, chord);
  std::string lowered(name);
  for (char& c : lowered) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (const auto near = text::closest(lowered, known_names())) message += fmt::format(" (did you mean '{}'?)", *near);
  throw UsageError(message +
                   "; keys are X keysym names as xdotool takes them (Return, Tab, Page_Down, F5, "
                   "KP_Enter, a), one character, or ctrl, shift, alt, super joined with '+'");
}

// "ctrl+shift+t" -> {"ctrl", "shift", "t"}; "ctrl++" -> {"ctrl", "+"}; "+" -> {"+"}.
std::vector<std::string_view> split_chord(std::string_view chord) {
  if (chord == "+") return {chord};
  std::vector<std::string_view> names;
  std::string_view rest = chord;
  bool plus_key = false;
  if (rest.size() >= 2 && rest.ends_with("++")) {
    rest.remove_suffix(2);
    plus_key = true;
  }
  for (std::string_view name : text::split(rest, '+')) names.push_back(text::trim(name));
  if (plus_key) names.push_back("+");
  return names;
}

}  // namespace

std::uint32_t keysym_of_code_point(char32_t code_point) {
  if (code_point == U'\n') return 0xff0d;  // Return
  if (code_point == U'\t') return 0xff09;  // Tab
  return code_point < 0x100 ? code_point : 0x1000000 + code_point;
}

std::optional<std::u32string> code_points(std::string_view utf8) {
  if (text::find_invalid_utf8(utf8)) return std::nullopt;
  std::u32string out;
  out.reserve(utf8.size());
  const auto* b = reinterpret_cast<const unsigned char*>(utf8.data());
  for (std::size_t i = 0; i < utf8.size();) {
    // Well-formed, so the lead byte says the length and every continuation byte is there.
    if (b[i] < 0x80) {
      out += static_cast<char32_t>(b[i]);
      i += 1;
    } else if (b[i] < 0xe0) {
      out += static_cast<char32_t>(((b[i] & 0x1fu) << 6) | (b[i + 1] & 0x3fu));
      i += 2;
    } else if (b[i] < 0xf0) {
      out += static_cast<char32_t>(((b[i] & 0x0fu) << 12) | ((b[i + 1] & 0x3fu) << 6) | (b[i + 2] & 0x3fu));
      i += 3;
    } else {
      out += static_cast<char32_t>(((b[i] & 0x07u) << 18) | ((b[i + 1] & 0x3fu) << 12) | ((b[i + 2] & 0x3fu) << 6) |
                                   (b[i + 3] & 0x3fu));
      i += 4;
    }
  }
  return out;
}

std::optional<std::uint32_t> keysym_from_name(std::string_view name) {
  if (name.empty()) return std::nullopt;
  for (const auto& [alias, sym] : kAliases)
    if (equal_folded(alias, name)) return sym;
  if (const auto sym = keysym_of_character(name)) return sym;
  for (std::size_t i = 0; i < kKeysymNameCount; ++i)
    if (kKeysymNames[i].first == name) return kKeysymNames[i].second;
  // Folded, several names may match ("AACUTE": Aacute and aacute): the one with the lower-case
  // spelling, as for a single letter, so that case never adds a Shift nobody asked for.
  std::optional<std::uint32_t> found;
  for (std::size_t i = 0; i < kKeysymNameCount; ++i) {
    const auto& [candidate, sym] = kKeysymNames[i];
    if (!equal_folded(candidate, name)) continue;
    if (!found || (candidate[0] >= 'a' && candidate[0] <= 'z')) found = sym;
  }
  return found;
}

bool is_modifier_keysym(std::uint32_t keysym) {
  return (keysym >= 0xffe1 && keysym <= 0xffee) || keysym == kLevel3Shift || keysym == 0xff7e /* Mode_switch */;
}

std::vector<std::uint32_t> parse_chord(std::string_view chord) {
  const std::string_view trimmed = text::trim(chord);
  if (trimmed.empty()) throw UsageError("an empty key chord; name a key such as 'Return' or 'ctrl+s'");
  const auto names = split_chord(trimmed);
  if (names.size() > 16)
    throw UsageError(fmt::format("'{}' has {} keys; a chord has at most 16", trimmed, names.size()));
  std::vector<std::uint32_t> modifiers, keys;
  for (std::string_view name : names) {
    if (name.empty()) throw UsageError(fmt::format("'{}' has an empty key name between '+' signs", trimmed));
    const auto sym = keysym_from_name(name);
    if (!sym) unknown_key(name, trimmed);
    (is_modifier_keysym(*sym) ? modifiers : keys).push_back(*sym);
  }
  modifiers.insert(modifiers.end(), keys.begin(), keys.end());
  return modifiers;
}

std::vector<std::uint32_t> parse_modifiers(std::string_view modifiers) {
  const std::string_view trimmed = text::trim(modifiers);
  std::vector<std::uint32_t> syms;
  if (trimmed.empty()) return syms;
  for (std::string_view raw : text::split(trimmed, '+')) {
    const std::string_view name = text::trim(raw);
    const auto sym = keysym_from_name(name);
    // Caps Lock and Shift Lock toggle rather than being held.
    if (name.empty() || !sym || !is_modifier_keysym(*sym) || *sym == 0xffe5 || *sym == 0xffe6)
      throw UsageError(fmt::format("'{}' in '{}' is not a modifier; hold ctrl, shift, alt or super, joined with '+'",
                                   name, trimmed));
    syms.push_back(*sym);
  }
  return syms;
}

}  // namespace nshpc::desktop
