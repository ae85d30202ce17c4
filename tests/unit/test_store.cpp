#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "common/temp_dir.hpp"
#include "store/store.hpp"

namespace fs = std::filesystem;
using nshpc::Error;
using nshpc::UsageError;
namespace store = nshpc::store;
namespace config = nshpc::config;

namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path() / "instances";
    config_.ns.instances_dir = root_;
    config_.ns.sandbox_uid = static_cast<uint32_t>(::getuid());  // no chown in unit tests
    config_.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
  }

  store::Store make() { return store::Store(config_, guard_); }
  std::vector<nlohmann::json> audit_lines(const fs::path& file) {
    std::vector<nlohmann::json> out;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  void age(const fs::path& file, int days) {
    struct timespec times[2];
    times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - days * 86400;
    times[0].tv_nsec = times[1].tv_nsec = 0;
    ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  }
  void fake_job(const store::Instance& inst, const std::string& status) {
    fs::create_directories(inst.base / ".ns_hpc_jobs");
    std::ofstream(inst.base / ".ns_hpc_jobs" / "abc123def456.state") << nlohmann::json{{"status", status}}.dump();
  }

  nshpc::tests::TempDir tmp_{"nshpc-store"};
  fs::path root_;
  config::Config config_ = config::built_in();
  store::RecordedJobsGuard guard_;
};

template <typename F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

}  // namespace

TEST(Ids, ValidIdsPass) {
  for (const std::string& id : std::vector<std::string>{"a", "my-inst", "Run_2.v3", "0abc", std::string(63, 'x')})
    EXPECT_NO_THROW(store::validate_id(id)) << id;
}

TEST(Ids, InvalidAndReservedIdsAreRefusedWithTheRule) {
  EXPECT_NE(usage_error([] { store::validate_id(""); }).find("empty"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id(std::string(64, 'x')); }).find("limit is 63"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id("../evil"); }).find("'/' is not allowed"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id("a b"); }).find("' ' is not allowed"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id(".archived"); }).find("start with a letter or digit"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id("-rf"); }).find("start with a letter or digit"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id("output"); }).find("reserved"), std::string::npos);
  EXPECT_NE(usage_error([] { store::validate_id(std::string("a\nb")); }).find("\\x0a"), std::string::npos);
}

TEST(Ids, GeneratedIdsAreReadableAndValid) {
  std::regex shape("^[a-z]+-[a-z]+-[0-9a-f]{4}$");
  for (int i = 0; i < 50; ++i) {
    std::string id = store::generate_id();
    EXPECT_TRUE(std::regex_match(id, shape)) << id;
    EXPECT_NO_THROW(store::validate_id(id));
  }
}

TEST_F(StoreTest, CreateLaysOutTheInstanceAsTheOriginalDid) {
  auto s = make();
  auto inst = s.create("alpha", {.description = "first", .network = config::Network::off}, "cli:test");
  EXPECT_TRUE(fs::is_directory(root_ / "alpha/workspace"));
  EXPECT_TRUE(fs::is_directory(root_ / "output/alpha"));
  auto meta = nlohmann::json::parse(nshpc::fs::read_file(root_ / "alpha/metadata.json").value());
  EXPECT_EQ(meta["id"], "alpha");
  EXPECT_EQ(meta["description"], "first");
  EXPECT_EQ(meta["network"], "off");
  EXPECT_EQ(meta["workspace"], (root_ / "alpha/workspace").string());
  EXPECT_TRUE(meta["created_at"].get<std::string>().ends_with("+00:00"));
  EXPECT_FALSE(meta["hostname"].get<std::string>().empty());
  auto audit = audit_lines(root_ / "alpha/audit.log");
  ASSERT_EQ(audit.size(), 1u);
  EXPECT_EQ(audit[0]["event"], "instance.created");
  EXPECT_EQ(audit[0]["actor"], "cli:test");
  EXPECT_EQ(inst.network, config::Network::off);
}

TEST_F(StoreTest, CreateWithoutIdGeneratesOne) {
  auto s = make();
  auto inst = s.create("", {}, "t");
  EXPECT_NO_THROW(store::validate_id(inst.id));
  EXPECT_TRUE(fs::exists(root_ / inst.id / "metadata.json"));
}

TEST_F(StoreTest, DuplicateAndForeignFolderAreRefused) {
  auto s = make();
  s.create("alpha", {}, "t");
  EXPECT_NE(usage_error([&] { s.create("alpha", {}, "t"); }).find("already exists"), std::string::npos);
  fs::create_directories(root_ / "stray");
  EXPECT_NE(usage_error([&] { s.create("stray", {}, "t"); }).find("not an instance"), std::string::npos);
}

TEST_F(StoreTest, FailedCreateLeavesNothingBehind) {
  auto s = make();
  fs::create_directories(root_ / "output/beta");
  std::ofstream(root_ / "output/beta/old.txt") << "left over";
  EXPECT_NE(usage_error([&] { s.create("beta", {}, "t"); }).find("not empty"), std::string::npos);
  EXPECT_FALSE(fs::exists(root_ / "beta"));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".creating"), std::string::npos);
}

TEST_F(StoreTest, ListIsSortedAndSkipsCorruptMetadataByName) {
  auto s = make();
  s.create("zeta", {}, "t");
  s.create("alpha", {}, "t");
  s.create("broken", {}, "t");
  std::ofstream(root_ / "broken/metadata.json", std::ios::trunc) << "{ not json";
  auto listing = s.list();
  ASSERT_EQ(listing.instances.size(), 2u);
  EXPECT_EQ(listing.instances[0].id, "alpha");
  EXPECT_EQ(listing.instances[1].id, "zeta");
  ASSERT_EQ(listing.corrupt.size(), 1u);
  EXPECT_EQ(listing.corrupt[0].id, "broken");
  try {
    s.get("broken");
    FAIL() << "corrupt metadata accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt metadata.json"), std::string::npos);
  }
  EXPECT_NE(usage_error([&] { s.get("nope"); }).find("not found"), std::string::npos);
}

TEST_F(StoreTest, UpdatePersistsAndKeepsUnknownFields) {
  auto s = make();
  s.create("alpha", {}, "t");
  auto meta = nlohmann::json::parse(nshpc::fs::read_file(root_ / "alpha/metadata.json").value());
  meta["custom"] = "kept";
  nshpc::fs::atomic_write(root_ / "alpha/metadata.json", meta.dump());
  s.update("alpha", {.description = std::string("new text"), .network = config::Network::off}, "t");
  auto again = make().get("alpha");
  EXPECT_EQ(again.meta.description(), "new text");
  EXPECT_EQ(again.network, config::Network::off);
  EXPECT_EQ(again.meta.raw["custom"], "kept");
  auto audit = audit_lines(root_ / "alpha/audit.log");
  EXPECT_EQ(audit.back()["event"], "instance.updated");
  EXPECT_EQ(audit.back()["changes"]["description"], "new text");
}

TEST_F(StoreTest, ArchiveMovesInstanceAndOutputAndFreesTheName) {
  auto s = make();
  s.create("alpha", {}, "t");
  std::ofstream(root_ / "output/alpha/result.txt") << "42";
  auto archived = s.archive("alpha", "t");
  EXPECT_FALSE(fs::exists(root_ / "alpha"));
  EXPECT_TRUE(fs::exists(root_ / ".archived" / archived.name / "metadata.json"));
  EXPECT_TRUE(fs::exists(root_ / "output" / archived.name / "result.txt"));
  EXPECT_TRUE(archived.meta.archived());
  EXPECT_EQ(s.list().instances.size(), 0u);
  auto listed = s.list_archived();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, "alpha");
  auto audit = audit_lines(root_ / ".archived" / archived.name / "audit.log");
  EXPECT_EQ(audit.back()["event"], "instance.archived");
  s.create("alpha", {}, "t");  // the name is free again
  auto second = s.archive("alpha", "t");
  EXPECT_NE(second.name, archived.name);
  EXPECT_EQ(s.list_archived().size(), 2u);
}

TEST_F(StoreTest, ArchiveAndDeleteRefuseWhileJobsRun) {
  auto s = make();
  auto inst = s.create("busy", {}, "t");
  fake_job(inst, "running");
  EXPECT_NE(usage_error([&] { s.archive("busy", "t"); }).find("1 job(s) still running"), std::string::npos);
  EXPECT_NE(usage_error([&] { s.remove("busy", "t"); }).find("still running"), std::string::npos);
  EXPECT_TRUE(fs::exists(root_ / "busy/metadata.json"));
  fake_job(inst, "completed");
  EXPECT_NO_THROW(s.archive("busy", "t"));
}

TEST_F(StoreTest, DeletePurgesEverythingAndAuditsAtStoreLevel) {
  auto s = make();
  s.create("gone", {}, "t");
  std::ofstream(root_ / "gone/workspace/data") << "x";
  s.remove("gone", "cli:test");
  EXPECT_FALSE(fs::exists(root_ / "gone"));
  EXPECT_FALSE(fs::exists(root_ / "output/gone"));
  auto audit = audit_lines(root_ / ".audit.log");
  ASSERT_FALSE(audit.empty());
  EXPECT_EQ(audit.back()["event"], "instance.deleted");
  EXPECT_EQ(audit.back()["instance_id"], "gone");
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".deleting"), std::string::npos);
}

TEST_F(StoreTest, DeleteArchiveByName) {
  auto s = make();
  s.create("old", {}, "t");
  auto archived = s.archive("old", "t");
  EXPECT_NE(usage_error([&] { s.remove_archived("old", "t"); }).find("not an archive name"), std::string::npos);
  EXPECT_NE(usage_error([&] { s.remove_archived("old__1", "t"); }).find("not found"), std::string::npos);
  s.remove_archived(archived.name, "t");
  EXPECT_TRUE(s.list_archived().empty());
  EXPECT_FALSE(fs::exists(root_ / "output" / archived.name));
}

TEST_F(StoreTest, CleanSelectsByLastActivityNotCreation) {
  auto s = make();
  s.create("idle", {}, "t");
  s.create("active", {}, "t");
  for (const char* id : {"idle", "active"}) {
    age(root_ / id / "metadata.json", 30);
    age(root_ / id / "audit.log", 30);
  }
  // "active" was created long ago but used today.
  auto meta = nlohmann::json::parse(nshpc::fs::read_file(root_ / "idle/metadata.json").value());
  meta["created_at"] = "2020-01-01T00:00:00+00:00";
  nshpc::fs::atomic_write(root_ / "idle/metadata.json", meta.dump());
  age(root_ / "idle/metadata.json", 30);
  auto active_meta = nlohmann::json::parse(nshpc::fs::read_file(root_ / "active/metadata.json").value());
  active_meta["created_at"] = "2020-01-01T00:00:00+00:00";
  nshpc::fs::atomic_write(root_ / "active/metadata.json", active_meta.dump());
  age(root_ / "active/metadata.json", 30);
  std::ofstream(root_ / "active/audit.log", std::ios::app) << "{}\n";
  auto candidates = s.clean_candidates(std::chrono::hours(24 * 7));
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].id, "idle");
}

TEST_F(StoreTest, ConcurrentProcessesCreateDistinctAndContendedIdsSafely) {
  constexpr int kProcs = 8;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int failures = 0;
      auto s = make();
      for (int i = 0; i < 5; ++i) {
        try {
          s.create("p" + std::to_string(p) + "-" + std::to_string(i), {}, "t");
        } catch (...) {
          ++failures;
        }
      }
      bool won = false;
      try {
        s.create("contended", {}, "t");
        won = true;
      } catch (const UsageError&) {
      }
      ::_exit(failures ? 2 : (won ? 10 : 11));
    }
    pids.push_back(pid);
  }
  int winners = 0;
  for (pid_t pid : pids) {
    int status;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_NE(WEXITSTATUS(status), 2);
    if (WEXITSTATUS(status) == 10) ++winners;
  }
  EXPECT_EQ(winners, 1);
  auto listing = make().list();
  EXPECT_EQ(listing.instances.size(), static_cast<size_t>(kProcs * 5 + 1));
  EXPECT_TRUE(listing.corrupt.empty());
}

TEST_F(StoreTest, ConcurrentUpdatesNeverCorruptMetadata) {
  make().create("shared", {}, "t");
  ASSERT_NO_FATAL_FAILURE(nshpc::tests::run_in_children(6, [&](int p) {
    auto s = make();
    for (int i = 0; i < 20; ++i)
      s.update("shared", {.description = "writer " + std::to_string(p) + " #" + std::to_string(i)}, "t");
  }));
  auto inst = make().get("shared");
  EXPECT_EQ(inst.meta.description().rfind("writer ", 0), 0u);
  EXPECT_EQ(audit_lines(root_ / "shared/audit.log").size(), 1u + 6 * 20);
}
