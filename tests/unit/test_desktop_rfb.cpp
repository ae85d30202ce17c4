// The live view's client-side RFB filter (desktop/rfb.hpp): what a browser may send to the
// sandbox's VNC server, in any split, with view-only on and off.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "desktop/rfb.hpp"

namespace nshpc::desktop {
namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

const std::string kVersion = "RFB 003.008\n";
const std::string kHandshake = kVersion + bytes({1}) + bytes({0});  // None; ClientInit not shared
const std::string kHandshakeOut = kVersion + bytes({1}) + bytes({1});  // ClientInit forwarded shared

const std::string kPixelFormat = bytes({0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0});
const std::string kEncodings = bytes({2, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0x21});
const std::string kUpdate = bytes({3, 1, 0, 0, 0, 0, 5, 0, 3, 32});
const std::string kKeyDown = bytes({4, 1, 0, 0, 0, 0, 0, 0x61});
const std::string kKeyUp = bytes({4, 0, 0, 0, 0, 0, 0, 0x61});
const std::string kPointer = bytes({5, 1, 0, 10, 0, 20});
const std::string kCut = bytes({6, 0, 0, 0, 0, 0, 0, 5}) + "hello";

// Every message type, once each.
const std::string kAll = kPixelFormat + kEncodings + kUpdate + kKeyDown + kKeyUp + kPointer + kCut;

TEST(RfbClientFilter, PassesTheHandshakeAndEveryMessageTypeInControlMode) {
  RfbClientFilter filter(/*view_only=*/false);
  EXPECT_FALSE(filter.handshaken());
  EXPECT_EQ(filter.feed(kHandshake), kHandshakeOut);
  EXPECT_TRUE(filter.handshaken());
  EXPECT_EQ(filter.feed(kAll), kAll);
  EXPECT_EQ(filter.counts(), (RfbClientFilter::Counts{2, 1, 1}));
}

TEST(RfbClientFilter, ViewOnlyDropsKeysPointerAndClipboardButNotTheScreensMessages) {
  RfbClientFilter filter;  // view-only by default
  EXPECT_TRUE(filter.view_only());
  EXPECT_EQ(filter.feed(kHandshake), kHandshakeOut);
  EXPECT_EQ(filter.feed(kAll), kPixelFormat + kEncodings + kUpdate);
  EXPECT_EQ(filter.counts(), (RfbClientFilter::Counts{0, 0, 0}));
}

TEST(RfbClientFilter, EverySplitOfTheStreamGivesTheSameOutput) {
  const std::string in = kHandshake + kAll + kUpdate;
  const std::string want = kHandshakeOut + kAll + kUpdate;
  for (std::size_t cut = 0; cut <= in.size(); ++cut) {
    RfbClientFilter filter(false);
    std::string out = filter.feed(in.substr(0, cut));
    out += filter.feed(in.substr(cut));
    ASSERT_EQ(out, want) << "cut at byte " << cut;
    EXPECT_EQ(filter.counts(), (RfbClientFilter::Counts{2, 1, 1}));
  }
  // And one byte at a time, view-only.
  RfbClientFilter filter;
  std::string out;
  for (char c : in) out += filter.feed(std::string_view(&c, 1));
  EXPECT_EQ(out, kHandshakeOut + kPixelFormat + kEncodings + kUpdate + kUpdate);
}

TEST(RfbClientFilter, ViewOnlyChangesAtMessageBoundariesOnly) {
  RfbClientFilter filter(false);
  filter.feed(kHandshake);
  // Half a clipboard message passes; switching to view-only meanwhile keeps the rest of it
  // passing, and drops the next one whole.
  const std::string cut_head = kCut.substr(0, 10);
  EXPECT_EQ(filter.feed(cut_head), kCut.substr(0, 8) + "he");
  filter.set_view_only(true);
  EXPECT_EQ(filter.feed(kCut.substr(10) + kPointer + kKeyDown), "llo");
  EXPECT_EQ(filter.counts(), (RfbClientFilter::Counts{0, 0, 1}));
  // A key event half in when control is given back is dropped whole; the next passes.
  EXPECT_EQ(filter.feed(kKeyUp.substr(0, 3)), "");
  filter.set_view_only(false);
  EXPECT_EQ(filter.feed(kKeyUp.substr(3) + kPointer), kPointer);
  EXPECT_EQ(filter.counts(), (RfbClientFilter::Counts{0, 1, 1}));
}

TEST(RfbClientFilter, OlderVersionsHandshake) {
  {
    // 3.7: the client chooses the security type, as 3.8.
    RfbClientFilter filter(false);
    EXPECT_EQ(filter.feed("RFB 003.007\n" + bytes({1, 0}) + kUpdate), "RFB 003.007\n" + bytes({1, 1}) + kUpdate);
  }
  {
    // 3.3: the server names the type; the next byte is ClientInit.
    RfbClientFilter filter(false);
    EXPECT_EQ(filter.feed("RFB 003.003\n" + bytes({0}) + kUpdate), "RFB 003.003\n" + bytes({1}) + kUpdate);
  }
}

void expect_refused(const std::string& stream, const std::string& why) {
  RfbClientFilter filter(false);
  try {
    filter.feed(stream);
    ADD_FAILURE() << "accepted: " << why;
  } catch (const RfbError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  // Nothing more passes after a refusal.
  EXPECT_THROW(filter.feed(kUpdate), RfbError);
}

TEST(RfbClientFilter, RefusesWhatCannotBeFramedOrIsTooLarge) {
  expect_refused("RFB 003.889\n", "protocol version");
  expect_refused("GET / HTTP/1.1\r\n", "protocol version");
  expect_refused(kVersion + bytes({2}), "security type 2");
  expect_refused(kVersion + bytes({19}), "security type 19");
  expect_refused(kHandshake + bytes({7}), "message type 7");
  expect_refused(kHandshake + bytes({150, 1, 0, 0, 0, 0, 0, 0, 0, 0}), "message type 150");  // continuous updates
  expect_refused(kHandshake + bytes({248, 0, 0, 0}), "message type 248");                   // fence
  expect_refused(kHandshake + kUpdate + bytes({255}), "message type 255");
  // SetEncodings over the bound (n = 1025), ClientCutText over 1 MiB, plain or extended (its
  // length negative: -1048577).
  expect_refused(kHandshake + bytes({2, 0, 0x04, 0x01}), "1025 encodings");
  expect_refused(kHandshake + bytes({6, 0, 0, 0, 0, 0x10, 0, 1}), "ClientCutText of 1048577 bytes");
  expect_refused(kHandshake + bytes({6, 0, 0, 0, 0xff, 0xef, 0xff, 0xff}), "ClientCutText of 1048577 bytes");
}

// noVNC sends its clipboard capabilities in the Extended Clipboard form once the server accepts
// that encoding (x11vnc does): ClientCutText with a negative length, the body being -length bytes.
TEST(RfbClientFilter, AnExtendedClipboardMessageIsFramedByItsNegativeLength) {
  RfbClientFilter filter(false);
  filter.feed(kHandshake);
  const std::string caps = bytes({6, 0, 0, 0, 0xff, 0xff, 0xff, 0xf8}) + std::string(8, '\x01');
  EXPECT_EQ(filter.feed(caps + kUpdate), caps + kUpdate);
  EXPECT_EQ(filter.counts().clipboard, 1u);
  // View-only drops it whole, and the next message is framed right.
  filter.set_view_only(true);
  EXPECT_EQ(filter.feed(caps + kUpdate), kUpdate);
}

TEST(RfbClientFilter, TheLargestAllowedMessagesPass) {
  RfbClientFilter filter(false);
  filter.feed(kHandshake);
  std::string encodings = bytes({2, 0, 0x04, 0x00}) + std::string(kMaxEncodings * 4, '\x07');
  EXPECT_EQ(filter.feed(encodings), encodings);
  std::string cut = bytes({6, 0, 0, 0, 0, 0x10, 0, 0}) + std::string(kMaxCutText, 'x');
  // In pieces, as a socket gives it.
  std::string out;
  for (std::size_t at = 0; at < cut.size(); at += 65536) out += filter.feed(std::string_view(cut).substr(at, 65536));
  EXPECT_EQ(out.size(), cut.size());
  EXPECT_EQ(out, cut);
  EXPECT_EQ(filter.counts().clipboard, 1u);
  // A dropped clipboard message of the largest size is dropped whole.
  filter.set_view_only(true);
  out.clear();
  for (std::size_t at = 0; at < cut.size(); at += 65536) out += filter.feed(std::string_view(cut).substr(at, 65536));
  out += filter.feed(kUpdate);
  EXPECT_EQ(out, kUpdate);
  EXPECT_EQ(filter.counts().clipboard, 1u);
}

}  // namespace
}  // namespace nshpc::desktop
