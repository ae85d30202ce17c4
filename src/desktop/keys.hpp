// Key names as people and models write them (xdotool's, which Anthropic's `key` action uses:
// "ctrl+s", "alt+Tab", "Return", "KP_Enter", "pagedown", "super") turned into X keysyms for the
// display agent's `input` request. Pure and server-side: names are checked before anything
// reaches a desktop.
//
// A name is an X keysym name (every name of X11/keysymdef.h and XF86keysym.h, compiled in at
// build time), an alias (ctrl, alt, super/cmd/win/meta, esc, enter, pagedown, del, ...), or one
// character (typed as its own keysym: "/", "ä"). Case does not matter, except that a name that
// matches a keysym name exactly wins: "A" is the keysym A (Shift+a), "a" the keysym a, "RETURN"
// is Return.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::desktop {

// The keysym that types `code_point` (X's rule: Latin-1 is its own code point, the rest of Unicode
// 0x1000000 + the code point); newline is Return and tab is Tab.
std::uint32_t keysym_of_code_point(char32_t code_point);

// The code points of `utf8`; nullopt when it is not well-formed UTF-8.
std::optional<std::u32string> code_points(std::string_view utf8);

// One key name; nullopt when it names nothing.
std::optional<std::uint32_t> keysym_from_name(std::string_view name);

// True for the keysyms of modifier keys (Shift, Control, Alt, Super, Meta, Hyper, AltGr, Caps Lock).
bool is_modifier_keysym(std::uint32_t keysym);

// "ctrl+shift+t" -> {Control_L, Shift_L, t}: the modifiers first (in the order given), then the
// other keys (in the order given; usually one). A lone "+" and a trailing "++" name the plus key.
// Throws UsageError naming the unknown name (and the closest known one) or an empty chord.
std::vector<std::uint32_t> parse_chord(std::string_view chord);

// The modifiers held during a mouse action: "ctrl", "shift+alt", "super"; "" holds none. Throws
// UsageError naming a name that is not a modifier.
std::vector<std::uint32_t> parse_modifiers(std::string_view modifiers);

}  // namespace nshpc::desktop
