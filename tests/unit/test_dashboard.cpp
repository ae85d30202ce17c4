// The dashboard's parts that need no server: redaction, the audit line parser, the log follower
// (appends, rotation, damaged lines), the activity's paging and cpu_percent.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "audit/audit.hpp"
#include "dashboard/activity.hpp"
#include "dashboard/live.hpp"

namespace nshpc::dashboard {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kToken = "tok-0123456789abcdef0123456789abcdef";

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "nshpc-dash-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    stdfs::remove_all(path_, ec);
  }
  const stdfs::path& path() const { return path_; }

 private:
  stdfs::path path_;
};

void append_raw(const stdfs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::app | std::ios::binary);
  out << text;
}

TEST(DashboardRedact, SecretKeysAndTheTokenGo) {
  EXPECT_TRUE(secret_key("GITHUB_TOKEN"));
  EXPECT_TRUE(secret_key("password"));
  EXPECT_TRUE(secret_key("db_passwd"));
  EXPECT_TRUE(secret_key("Authorization"));
  EXPECT_TRUE(secret_key("api_key"));
  EXPECT_TRUE(secret_key("Cookie"));
  EXPECT_FALSE(secret_key("command"));
  EXPECT_FALSE(secret_key("instance_id"));

  const json in = {{"command", std::string("curl -H 'x: ") + kToken + "'"},
                   {"env", {{"GITHUB_TOKEN", "ghp_abc"}, {"HOME", "/workspace"}}},
                   {"list", {std::string("a ") + kToken, "b"}},
                   {"secret", nullptr}};
  const json out = redact(in, kToken);
  EXPECT_EQ(out["command"], "curl -H 'x: [redacted]'");
  EXPECT_EQ(out["env"]["GITHUB_TOKEN"], "[redacted]");
  EXPECT_EQ(out["env"]["HOME"], "/workspace");
  EXPECT_EQ(out["list"][0], "a [redacted]");
  EXPECT_TRUE(out["secret"].is_null());
  EXPECT_EQ(out.dump().find(kToken), std::string::npos);
}

TEST(DashboardRedact, TextCutByTheAuditStillLosesItsSecrets) {
  // The audit cuts long arguments: what is left is not JSON but still holds "key": "value" pairs.
  const std::string cut = std::string(R"({"env": {"API_KEY": "sk-live-1", "X": "y"}, "password" : "hunter2", "c": ")") +
                          kToken + R"( and more…)";
  const std::string out = redact_text(cut, kToken);
  EXPECT_EQ(out.find("sk-live-1"), std::string::npos) << out;
  EXPECT_EQ(out.find("hunter2"), std::string::npos) << out;
  EXPECT_EQ(out.find(kToken), std::string::npos) << out;
  EXPECT_NE(out.find(R"("X": "y")"), std::string::npos) << out;
  // A secret value cut in the middle: nothing of it stays.
  EXPECT_EQ(redact_text(R"({"token": "abcdef)", ""), R"({"token": "[redacted]")");
}

TEST(DashboardActivity, ParsesAToolCallLine) {
  const std::string line = audit::format_line(
      "mcp.tool_call", "mcp:claude-code/1.0@sess-42",
      {{"tool", "terminal_execute"},
       {"arguments", json{{"instance_id", "box"}, {"command", std::string("echo ") + kToken}, {"password", "pw"}}.dump()},
       {"is_error", true},
       {"error", "exit 1"},
       {"duration_ms", 12}});
  const auto ev = parse_audit_line(line, "box", kToken);
  ASSERT_TRUE(ev);
  EXPECT_EQ((*ev)["kind"], "mcp.tool_call");
  EXPECT_EQ((*ev)["instance"], "box");
  EXPECT_EQ((*ev)["session"], "sess-42");
  EXPECT_EQ((*ev)["tool"], "terminal_execute");
  EXPECT_EQ((*ev)["arguments"]["command"], "echo [redacted]");
  EXPECT_EQ((*ev)["arguments"]["password"], "[redacted]");
  EXPECT_EQ((*ev)["outcome"], "error");
  EXPECT_EQ((*ev)["error"], "exit 1");
  EXPECT_EQ((*ev)["duration_ms"], 12);
  EXPECT_FALSE((*ev)["timestamp"].get<std::string>().empty());
}

TEST(DashboardActivity, DamagedLinesAreNotEvents) {
  for (const char* bad : {"", "not json", "[1,2]", "{\"event\": 5}", "{\"actor\": \"x\"}", "{\"event\":\"a\"",
                          "\xff\xfe{\"event\":\"x\"}"})
    EXPECT_FALSE(parse_audit_line(bad, "", kToken)) << bad;
  // The store's log names the instance in its fields.
  const auto ev = parse_audit_line(audit::format_line("instance.deleted", "cli", {{"instance_id", "gone"}}), "", kToken);
  ASSERT_TRUE(ev);
  EXPECT_EQ((*ev)["instance"], "gone");
}

TEST(DashboardLogTail, FollowsAppendsPartialLinesAndRotation) {
  TempDir dir;
  const stdfs::path log = dir.path() / "audit.log";
  append_raw(log, "old line\n");
  LogTail tail(log, 0);  // only what is added from now on
  EXPECT_TRUE(tail.poll().empty());
  append_raw(log, "one\ntw");
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"one"});
  append_raw(log, "o\n");
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"two"});
  // Rotation: lines added to the old file before it was renamed, then the new file's.
  append_raw(log, "three\n");
  stdfs::rename(log, dir.path() / "audit.log.1");
  append_raw(log, "four\n");
  EXPECT_EQ(tail.poll(), (std::vector<std::string>{"three", "four"}));
  // Rotated and nothing new written yet.
  append_raw(log, "five\n");
  stdfs::rename(log, dir.path() / "audit.log.1");
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"five"});
  append_raw(log, "six\n");
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"six"});
  // Shrunk in place (truncated, then less written than there was): read again from the start.
  { std::ofstream(log, std::ios::trunc) << "7\n"; }
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"7"});
}

TEST(DashboardLogTail, BoundsWhatItReadsAndDropsOverlongLines) {
  TempDir dir;
  const stdfs::path log = dir.path() / "audit.log";
  append_raw(log, "start\n");
  LogTail tail(log, UINT64_MAX);
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"start"});
  append_raw(log, std::string(300000, 'x') + "\nafter\n");
  std::vector<std::string> got;
  for (int i = 0; i < 10; ++i)
    for (auto& l : tail.poll(64 * 1024, 128 * 1024)) got.push_back(l);  // several looks of 64 KiB
  EXPECT_EQ(got, std::vector<std::string>{"after"});
  // A FIFO or a link in the log's place is not opened (no hang, nothing read).
  stdfs::remove(log);
  ASSERT_EQ(::mkfifo(log.c_str(), 0600), 0);
  EXPECT_TRUE(tail.poll().empty());
  stdfs::remove(log);
  stdfs::create_symlink("/etc/passwd", log);
  EXPECT_TRUE(tail.poll().empty());
}

TEST(DashboardLogTail, HistoryStartsAtAWholeLine) {
  TempDir dir;
  const stdfs::path log = dir.path() / "audit.log";
  append_raw(log, "aaaaaaaaaa\nbbbb\ncccc\n");
  LogTail tail(log, 8);  // the last 8 bytes begin inside "bbbb": its rest is dropped
  EXPECT_EQ(tail.poll(), std::vector<std::string>{"cccc"});
}

TEST(DashboardActivity, ReadsEveryLogNewestFirstAndPagesBackwards) {
  TempDir dir;
  const stdfs::path root = dir.path();
  stdfs::create_directories(root / "alpha");
  stdfs::create_directories(root / "beta");
  stdfs::create_directories(root / "output" / "alpha");  // not an instance
  for (int i = 0; i < 5; ++i) {
    audit::append(root / "alpha" / "audit.log", "mcp.tool_call", "mcp:c@s1", {{"tool", "t" + std::to_string(i)}});
    audit::append(root / "beta" / "audit.log", "job.running", "ns-hpc:jobs", {{"job_id", std::to_string(i)}});
  }
  audit::append(root / ".audit.log", "instance.deleted", "cli", {{"instance_id", "gamma"}});
  Activity activity({.root = root, .token = kToken});
  json page = activity.query({.limit = 4});
  ASSERT_EQ(page["events"].size(), 4u);
  EXPECT_EQ(page["events"][0]["kind"], "instance.deleted");  // the newest
  ASSERT_TRUE(page.contains("next_before"));
  std::size_t seen = page["events"].size();
  while (page.contains("next_before")) {
    page = activity.query({.before = page["next_before"].get<std::uint64_t>(), .limit = 4});
    seen += page["events"].size();
  }
  EXPECT_EQ(seen, 11u);
  EXPECT_EQ(activity.query({.instance = "alpha"})["events"].size(), 5u);
  EXPECT_EQ(activity.query({.session = "s1"})["events"].size(), 5u);
  EXPECT_EQ(activity.query({.kind = "job."})["events"].size(), 5u);
  EXPECT_EQ(activity.query({.kind = "job"})["events"].size(), 0u);  // exact unless it ends in '.'
  // Written by another process later: seen by the next query; a new instance's log too.
  stdfs::create_directories(root / "delta");
  audit::append(root / "delta" / "audit.log", "instance.created", "cli", {});
  audit::append(root / "alpha" / "audit.log", "mcp.tool_call", "mcp:c@s2", {{"tool", "late"}});
  const json fresh = activity.query({.limit = 2});
  ASSERT_EQ(fresh["events"].size(), 2u);
  std::set<std::string> kinds{fresh["events"][0]["kind"], fresh["events"][1]["kind"]};
  EXPECT_TRUE(kinds.contains("instance.created"));
  EXPECT_TRUE(kinds.contains("mcp.tool_call"));
  // A damaged line among them breaks nothing.
  append_raw(root / "alpha" / "audit.log", "{\"event\": \"half\n\x01\x02garbage\n");
  audit::append(root / "alpha" / "audit.log", "mcp.tool_call", "mcp:c@s3", {{"tool", "after-garbage"}});
  EXPECT_EQ(activity.query({.limit = 1})["events"][0]["tool"], "after-garbage");
}

TEST(DashboardActivity, TheRingIsBounded) {
  TempDir dir;
  stdfs::create_directories(dir.path() / "a");
  for (int i = 0; i < 50; ++i) audit::append(dir.path() / "a" / "audit.log", "x.y", "cli", {{"n", i}});
  Activity activity({.root = dir.path(), .ring = 10});
  const json page = activity.query({.limit = 500});
  ASSERT_EQ(page["events"].size(), 10u);
  EXPECT_EQ(page["events"][0]["fields"]["n"], 49);
  EXPECT_FALSE(page.contains("next_before"));
}

TEST(DashboardUsage, CpuPercentFromTwoLooks) {
  using namespace std::chrono;
  const auto t0 = steady_clock::time_point(seconds(100));
  EXPECT_DOUBLE_EQ(*cpu_percent(1'000'000, t0, 1'500'000, t0 + seconds(1)), 50.0);
  EXPECT_DOUBLE_EQ(*cpu_percent(0, t0, 4'000'000, t0 + seconds(2)), 200.0);  // two cores busy
  EXPECT_FALSE(cpu_percent(10, t0, 20, t0));                                  // no time between
  EXPECT_FALSE(cpu_percent(500, t0, 100, t0 + seconds(1)));                   // a new group
}

TEST(DashboardLive, Utf8IsNeverSplit) {
  EXPECT_EQ(utf8_whole_prefix("abc"), 3u);
  EXPECT_EQ(utf8_whole_prefix("a\xc3"), 1u);              // ä cut after its lead byte
  EXPECT_EQ(utf8_whole_prefix("a\xc3\xa4"), 3u);
  EXPECT_EQ(utf8_whole_prefix("\xe2\x82"), 0u);           // € cut
  EXPECT_EQ(utf8_whole_prefix("\xf0\x9f\x98\x80"), 4u);   // 😀 whole
  EXPECT_EQ(utf8_whole_prefix("\xf0\x9f\x98"), 0u);
}

}  // namespace
}  // namespace nshpc::dashboard
