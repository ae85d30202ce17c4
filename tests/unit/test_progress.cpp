// Progress messages that carry a long call's newest output lines, bounded.
#include <gtest/gtest.h>

#include <string>

#include "base/text.hpp"
#include "tools/progress.hpp"

using namespace nshpc::tools;

TEST(ProgressLines, TheNewestLinesOnlyEachCutAndValid) {
  EXPECT_EQ(newest_lines("a\nb\nc\nd\n"), "b\nc\nd");
  EXPECT_EQ(newest_lines("a\nb\nc\nd"), "b\nc\nd");
  EXPECT_EQ(newest_lines("one line"), "one line");
  EXPECT_EQ(newest_lines(""), "");
  EXPECT_EQ(newest_lines("\n\n  \n"), "");
  // A progress bar redrawn with \r shows its last state.
  EXPECT_EQ(newest_lines("10%\r50%\r90%\n"), "90%");
  const std::string longline(10000, 'x');
  EXPECT_EQ(newest_lines(longline + "\n"), std::string(kProgressLineBytes - 3, 'x') + "…");
  // Cut inside a multi-byte character: still valid UTF-8.
  std::string wide;
  for (int i = 0; i < 200; ++i) wide += "é";
  const std::string cut = newest_lines(wide);
  EXPECT_LE(cut.size(), kProgressLineBytes);
  EXPECT_FALSE(nshpc::text::find_invalid_utf8(cut)) << cut;
  EXPECT_EQ(newest_lines("ok\n\xff\xfe\n"), "ok\n\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(ProgressLines, AGrowingOutputShowsWhatCameSinceTheLastMessage) {
  OutputFollower f;
  EXPECT_EQ(f.grown("running, 1 s", "", ""), "running, 1 s");
  EXPECT_EQ(f.grown("running, 2 s", "step 1\n", ""), "running, 2 s\nstep 1");
  EXPECT_EQ(f.grown("running, 3 s", "step 1\n", ""), "running, 3 s");  // nothing new
  EXPECT_EQ(f.grown("running, 4 s", "step 1\nstep 2\nstep 3\nstep 4\nstep 5\n", "warn\n"),
            "running, 4 s\nstep 4\nstep 5\n[stderr] warn");
}

TEST(ProgressLines, ASlidingWindowShowsItsLastLinesWhenItChanged) {
  OutputFollower f;
  EXPECT_EQ(f.window("waiting", "a\nb\n", ""), "waiting\na\nb");
  EXPECT_EQ(f.window("waiting", "a\nb\n", ""), "waiting");
  EXPECT_EQ(f.window("waiting", "b\nc\n", ""), "waiting\nb\nc");
}
