// Key names as a model writes them (desktop/keys.hpp), and the display agent's frame reader
// against a peer that sends too much, too little, garbage or nothing (desktop/wire.hpp).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "desktop/keys.hpp"
#include "desktop/wire.hpp"

namespace {

using namespace nshpc::desktop;
using Syms = std::vector<std::uint32_t>;
using Clock = std::chrono::steady_clock;

// keysymdef.h values.
constexpr std::uint32_t kShiftL = 0xffe1, kControlL = 0xffe3, kAltL = 0xffe9, kSuperL = 0xffeb;
constexpr std::uint32_t kReturn = 0xff0d, kTab = 0xff09, kEscape = 0xff1b, kBackSpace = 0xff08, kDelete = 0xffff;
constexpr std::uint32_t kPageDown = 0xff56, kPageUp = 0xff55, kKpEnter = 0xff8d, kF5 = 0xffc2, kSpace = 0x20;

std::string usage_error(std::string_view chord) {
  try {
    parse_chord(chord);
  } catch (const nshpc::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DesktopKeys, ChordsPutModifiersFirstThenTheKey) {
  EXPECT_EQ(parse_chord("ctrl+s"), (Syms{kControlL, 's'}));
  EXPECT_EQ(parse_chord("alt+Tab"), (Syms{kAltL, kTab}));
  EXPECT_EQ(parse_chord("ctrl+shift+t"), (Syms{kControlL, kShiftL, 't'}));
  EXPECT_EQ(parse_chord("t+ctrl"), (Syms{kControlL, 't'}));
  EXPECT_EQ(parse_chord("Return"), (Syms{kReturn}));
  EXPECT_EQ(parse_chord("KP_Enter"), (Syms{kKpEnter}));
  EXPECT_EQ(parse_chord("super"), (Syms{kSuperL}));
  EXPECT_EQ(parse_chord("F5"), (Syms{kF5}));
  EXPECT_EQ(parse_chord("space"), (Syms{kSpace}));
  EXPECT_EQ(parse_chord("Page_Down"), (Syms{kPageDown}));
  EXPECT_EQ(parse_chord(" ctrl + alt + Delete "), (Syms{kControlL, kAltL, kDelete}));
  EXPECT_EQ(parse_chord("XF86AudioMute"), (Syms{0x1008FF12}));
}

TEST(DesktopKeys, AliasesModelsUse) {
  EXPECT_EQ(parse_chord("pagedown"), (Syms{kPageDown}));
  EXPECT_EQ(parse_chord("pageup"), (Syms{kPageUp}));
  EXPECT_EQ(parse_chord("esc"), (Syms{kEscape}));
  EXPECT_EQ(parse_chord("enter"), (Syms{kReturn}));
  EXPECT_EQ(parse_chord("backspace"), (Syms{kBackSpace}));
  EXPECT_EQ(parse_chord("delete"), (Syms{kDelete}));
  EXPECT_EQ(parse_chord("del"), (Syms{kDelete}));
  for (const char* super : {"cmd", "win", "meta", "super", "command"})
    EXPECT_EQ(parse_chord(std::string(super) + "+l"), (Syms{kSuperL, 'l'})) << super;
  EXPECT_EQ(parse_chord("control+c"), (Syms{kControlL, 'c'}));
}

TEST(DesktopKeys, CaseDoesNotMatterUnlessItNamesAnotherKeysym) {
  EXPECT_EQ(parse_chord("RETURN"), (Syms{kReturn}));
  EXPECT_EQ(parse_chord("CTRL+S"), (Syms{kControlL, 'S'}));  // the keysym S: xdotool adds Shift too
  EXPECT_EQ(parse_chord("Ctrl+s"), (Syms{kControlL, 's'}));
  EXPECT_EQ(parse_chord("page_down"), (Syms{kPageDown}));
  EXPECT_EQ(parse_chord("kp_enter"), (Syms{kKpEnter}));
  EXPECT_EQ(parse_chord("f5"), (Syms{kF5}));
  EXPECT_EQ(parse_chord("Escape"), (Syms{kEscape}));
  EXPECT_EQ(parse_chord("ESC"), (Syms{kEscape}));
  EXPECT_EQ(parse_chord("TAB"), (Syms{kTab}));
  // Two keysyms differ only in case: the exact spelling, else the lower-case one.
  EXPECT_EQ(parse_chord("Aacute"), (Syms{0xc1}));
  EXPECT_EQ(parse_chord("aacute"), (Syms{0xe1}));
  EXPECT_EQ(parse_chord("AACUTE"), (Syms{0xe1}));
}

TEST(DesktopKeys, OneCharacterIsItsOwnKeysym) {
  EXPECT_EQ(parse_chord("ctrl+/"), (Syms{kControlL, '/'}));
  EXPECT_EQ(parse_chord("ä"), (Syms{0xe4}));
  EXPECT_EQ(parse_chord("€"), (Syms{0x10020ac}));
  EXPECT_EQ(parse_chord("ctrl++"), (Syms{kControlL, '+'}));
  EXPECT_EQ(parse_chord("+"), (Syms{'+'}));
  EXPECT_EQ(parse_chord("ctrl+plus"), (Syms{kControlL, '+'}));
}

TEST(DesktopKeys, UnknownNamesAreRefusedByName) {
  const std::string e = usage_error("ctrl+foo");
  EXPECT_NE(e.find("'foo' in 'ctrl+foo' is not a key name"), std::string::npos) << e;
  const std::string near = usage_error("Retrun");
  EXPECT_NE(near.find("'Retrun'"), std::string::npos) << near;
  EXPECT_NE(near.find("did you mean 'return'"), std::string::npos) << near;
  EXPECT_NE(usage_error("").find("empty key chord"), std::string::npos);
  EXPECT_NE(usage_error("ctrl++s").find("empty key name"), std::string::npos);
  EXPECT_NE(usage_error("ctrl+\x01").find("is not a key name"), std::string::npos);
  EXPECT_THROW(parse_chord("\xff\xfe"), nshpc::UsageError);
  EXPECT_THROW(parse_chord("a+b+c+d+e+f+g+h+i+j+k+l+m+n+o+p+q"), nshpc::UsageError);
}

TEST(DesktopKeys, ModifiersForMouseActions) {
  EXPECT_EQ(parse_modifiers("ctrl"), (Syms{kControlL}));
  EXPECT_EQ(parse_modifiers("ctrl+shift"), (Syms{kControlL, kShiftL}));
  EXPECT_EQ(parse_modifiers("Alt+SUPER"), (Syms{kAltL, kSuperL}));
  EXPECT_EQ(parse_modifiers(""), Syms{});
  try {
    parse_modifiers("ctrl+a");
    FAIL() << "a is not a modifier";
  } catch (const nshpc::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'a' in 'ctrl+a' is not a modifier"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_modifiers("capslock"), nshpc::UsageError);
  EXPECT_THROW(parse_modifiers("ctrl+"), nshpc::UsageError);
  EXPECT_THROW(parse_modifiers("hold"), nshpc::UsageError);
}

TEST(DesktopKeys, CodePointsAndTheirKeysyms) {
  const auto cps = code_points("aä€😀\n");
  ASSERT_TRUE(cps);
  EXPECT_EQ(*cps, (std::u32string{U'a', U'ä', U'€', U'😀', U'\n'}));
  EXPECT_FALSE(code_points("\xc3"));
  EXPECT_FALSE(code_points("\xed\xa0\x80"));  // a surrogate
  EXPECT_EQ(keysym_of_code_point(U'a'), 0x61u);
  EXPECT_EQ(keysym_of_code_point(U'ä'), 0xe4u);
  EXPECT_EQ(keysym_of_code_point(U'€'), 0x10020acu);
  EXPECT_EQ(keysym_of_code_point(U'😀'), 0x101f600u);
  EXPECT_EQ(keysym_of_code_point(U'\n'), kReturn);
  EXPECT_EQ(keysym_of_code_point(U'\t'), kTab);
}

// ---- the frame reader

struct Pair {
  nshpc::UniqueFd a, b;
  Pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw std::runtime_error("socketpair");
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

void send_bytes(int fd, std::string_view bytes) {
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

std::string u32(std::uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string read_error(int fd, std::chrono::milliseconds wait, std::size_t max_header = kMaxHeader,
                       std::size_t max_payload = kMaxPayload) {
  try {
    read_frame(fd, Clock::now() + wait, max_header, max_payload);
  } catch (const nshpc::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DesktopWire, AFrameRoundTrips) {
  Pair p;
  write_frame(p.a.get(), {{"op", "capture"}, {"w", 3}}, std::string("\x00\x01payload", 9));
  const Frame f = read_frame(p.b.get(), Clock::now() + std::chrono::seconds(2));
  EXPECT_EQ(f.header["op"], "capture");
  EXPECT_EQ(f.header["w"], 3);
  EXPECT_EQ(f.payload, std::string("\x00\x01payload", 9));
}

TEST(DesktopWire, OversizedHeaderOrPayloadIsRefusedBeforeReadingIt) {
  Pair p;
  send_bytes(p.a.get(), u32(0xffffffffu));
  EXPECT_NE(read_error(p.b.get(), std::chrono::seconds(2)).find("a header of 4294967295 bytes"), std::string::npos);
  Pair q;
  send_bytes(q.a.get(), u32(2) + "{}" + u32(101));
  EXPECT_NE(
      read_error(q.b.get(), std::chrono::seconds(2), kMaxHeader, 100).find("a payload of 101 bytes (at most 100)"),
      std::string::npos);
}

TEST(DesktopWire, MalformedHeadersAreRefused) {
  for (const std::string header : {"[1,2]", "{\"a\":", "\"text\"", "\xff\xfe"}) {
    Pair p;
    send_bytes(p.a.get(), u32(static_cast<std::uint32_t>(header.size())) + header + u32(0));
    EXPECT_NE(read_error(p.b.get(), std::chrono::seconds(2)).find("not a JSON object"), std::string::npos) << header;
  }
}

TEST(DesktopWire, APeerThatClosesOrStallsEndsTheRead) {
  Pair closed;
  send_bytes(closed.a.get(), u32(10) + "{\"a\"");
  closed.a.reset();
  EXPECT_NE(read_error(closed.b.get(), std::chrono::seconds(2)).find("closed"), std::string::npos);

  // A slow peer: a byte every 50 ms never makes the frame within 300 ms, and the read ends then.
  Pair slow;
  std::thread trickle([fd = slow.a.get()] {
    const std::string frame = u32(40) + std::string(40, ' ');
    for (char c : frame) {
      if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const auto started = Clock::now();
  EXPECT_NE(read_error(slow.b.get(), std::chrono::milliseconds(300)).find("in time"), std::string::npos);
  const auto took = Clock::now() - started;
  EXPECT_LT(took, std::chrono::milliseconds(1000));
  slow.b.reset();
  trickle.join();

  // Nothing at all.
  Pair silent;
  EXPECT_NE(read_error(silent.b.get(), std::chrono::milliseconds(100)).find("in time"), std::string::npos);
}

TEST(DesktopWire, AWriterWithADeadlineDoesNotWaitForAPeerThatNeverReads) {
  Pair p;
  ASSERT_EQ(::fcntl(p.a.get(), F_SETFL, O_NONBLOCK), 0);
  const std::string big(std::size_t{8} << 20, 'x');  // far beyond a socket's buffer
  const auto started = Clock::now();
  EXPECT_THROW(write_frame(p.a.get(), {{"op", "clipboard_set"}}, big, Clock::now() + std::chrono::milliseconds(200)),
               nshpc::Error);
  EXPECT_LT(Clock::now() - started, std::chrono::milliseconds(1500));
}

}  // namespace
