#include <gtest/gtest.h>

#include "transport/framing.hpp"

using nshpc::transport::Frame;
using nshpc::transport::LineFramer;

TEST(LineFramer, SplitsLinesAcrossChunksAndSkipsBlankOnes) {
  LineFramer framer(100);
  auto a = framer.feed("{\"a\":1}\n{\"b\"");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].text, "{\"a\":1}");
  auto b = framer.feed(":2}\r\n\n   \n{\"c\":3}");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].text, "{\"b\":2}");
  auto last = framer.finish();
  ASSERT_TRUE(last);
  EXPECT_EQ(last->text, "{\"c\":3}");
  EXPECT_FALSE(framer.finish());
}

TEST(LineFramer, TooLongLineIsReportedOnceAndReadingResumesAfterIt) {
  LineFramer framer(10);
  std::vector<Frame> frames;
  for (const char* chunk : {"0123456789", "ABCDEF", "GHIJ\n{\"ok\":1}\n"}) {
    auto got = framer.feed(chunk);
    frames.insert(frames.end(), got.begin(), got.end());
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].kind, Frame::Kind::too_long);
  EXPECT_EQ(frames[0].size, 20u);
  EXPECT_EQ(frames[1].kind, Frame::Kind::message);
  EXPECT_EQ(frames[1].text, "{\"ok\":1}");
}

TEST(LineFramer, ExactlyTheLimitIsAccepted) {
  LineFramer framer(5);
  auto frames = framer.feed("12345\n123456\n");
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].kind, Frame::Kind::message);
  EXPECT_EQ(frames[1].kind, Frame::Kind::too_long);
}
