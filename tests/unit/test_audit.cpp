#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "audit/audit.hpp"
#include "base/json.hpp"
#include "common/temp_dir.hpp"

namespace fs = std::filesystem;

TEST(Audit, OneJsonObjectPerLineWithEventTimeActorAndFields) {
  const nshpc::tests::TempDir tmp("nshpc-audit");
  const fs::path& dir = tmp.path();
  nshpc::audit::append(dir / "audit.log", "instance.created", "cli:ada", {{"instance_id", "x"}});
  nshpc::audit::append(dir / "audit.log", "sandbox.exec", "cli:ada",
                       {{"command", {"sh", "-c", "echo \"hi\"\nthere"}}, {"exit_code", 0}});
  std::ifstream in(dir / "audit.log");
  std::string line;
  std::vector<nlohmann::json> events;
  while (std::getline(in, line)) events.push_back(nshpc::parse_json(line));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["event"], "instance.created");
  EXPECT_EQ(events[0]["actor"], "cli:ada");
  EXPECT_EQ(events[0]["instance_id"], "x");
  EXPECT_TRUE(events[0]["timestamp"].get<std::string>().ends_with("+00:00"));
  EXPECT_EQ(events[1]["command"][2], "echo \"hi\"\nthere");
  EXPECT_EQ(fs::status(dir / "audit.log").permissions() & fs::perms::others_read, fs::perms::none);
}

TEST(Audit, ConcurrentWritersNeverInterleave) {
  const nshpc::tests::TempDir tmp("nshpc-audit");
  const fs::path& dir = tmp.path();
  const fs::path log = dir / "audit.log";
  constexpr int kWriters = 8, kLines = 200;
  const std::string big(3000, 'x');  // lines well over PIPE_BUF
  ASSERT_NO_FATAL_FAILURE(nshpc::tests::run_in_children(kWriters, [&](int w) {
    for (int i = 0; i < kLines; ++i) nshpc::audit::append(log, "e", "t", {{"w", w}, {"i", i}, {"pad", big}});
  }));
  std::ifstream in(log);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) {
    auto j = nshpc::parse_json_or_discarded(line);
    ASSERT_TRUE(j.is_object()) << "interleaved line " << count;
    EXPECT_EQ(j["pad"], big);
    ++count;
  }
  EXPECT_EQ(count, kWriters * kLines);
}

TEST(Audit, InvalidUtf8AndHugeFieldsStillGiveOneValidLine) {
  std::string line = nshpc::audit::format_line("e", "a", {{"bad", std::string("\xff\xfe ok")},
                                                          {"huge", std::string(100000, 'y')}});
  auto j = nshpc::parse_json(line);
  EXPECT_LT(line.size(), 20000u);
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  EXPECT_TRUE(j["bad"].get<std::string>().ends_with(" ok"));
}

// How the server hands its [audit] rotation to the helpers that write an instance's log.
TEST(Audit, RotationArgumentGoesThereAndBack) {
  const nshpc::audit::Rotation r{5u * 1024 * 1024, 2};
  EXPECT_EQ(nshpc::audit::rotation_argument(r), "5242880,2");
  const auto back = nshpc::audit::parse_rotation_argument("5242880,2");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->max_bytes, r.max_bytes);
  EXPECT_EQ(back->keep, r.keep);
  EXPECT_TRUE(nshpc::audit::parse_rotation_argument("0,0"));  // never rotated
  for (const char* bad : {"", ",", "5", "5,", ",2", "5,-1", "x,2", "5,2,3", "5 ,2", "-5,2"})
    EXPECT_FALSE(nshpc::audit::parse_rotation_argument(bad)) << bad;
}
