#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "common/temp_dir.hpp"
#include "store/store.hpp"
#include "base/text.hpp"

#include <fmt/format.h>
#include <thread>

namespace fs = std::filesystem;
using nshpc::Error;
using nshpc::UsageError;
namespace store = nshpc::store;
namespace config = nshpc::config;

namespace {

// The store with the steps the instances service would pass: no image roots, nothing running to
// stop, trees removed by this process.
class TestStore : public store::Store {
 public:
  explicit TestStore(const config::Config& config) : Store(config, config::Network::nat) {}
  using Store::archive;
  using Store::create;
  using Store::finish_deletions;
  using Store::remove;
  using Store::remove_archived;
  store::Instance create(std::string id, const store::CreateOptions& options, std::string_view actor) {
    return Store::create(std::move(id), options, actor, nullptr);
  }
  store::ArchivedInstance archive(std::string_view id, std::string_view actor) { return Store::archive(id, actor, steps()); }
  void remove(std::string_view id, std::string_view actor) { Store::remove(id, actor, steps()); }
  void remove_archived(std::string_view name, std::string_view actor) { Store::remove_archived(name, actor, steps()); }
  std::size_t finish_deletions() const { return Store::finish_deletions(steps()); }
  static store::RemovalSteps steps() {
    return {.before_move = {}, .remove_tree = [](const fs::path& tree) { nshpc::fs::remove_tree(tree); }};
  }
};

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.path() / "instances";
    config_.ns.instances_dir = root_;
    config_.ns.sandbox_uid = static_cast<uint32_t>(::getuid());  // no chown in unit tests
    config_.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
    config_.server.state_dir = tmp_.path() / "state";  // the listing index, outside instances_dir
  }

  TestStore make() { return TestStore(config_); }
  std::vector<nlohmann::json> audit_lines(const fs::path& file) {
    std::vector<nlohmann::json> out;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) out.push_back(nshpc::parse_json(line));
    return out;
  }
  void age(const fs::path& file, int days) {
    struct timespec times[2];
    times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - days * 86400;
    times[0].tv_nsec = times[1].tv_nsec = 0;
    ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  }

  nshpc::tests::TempDir tmp_{"nshpc-store"};
  fs::path root_;
  config::Config config_ = config::built_in();
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
  auto meta = nshpc::parse_json(nshpc::fs::read_file(root_ / "alpha/metadata.json").value());
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
  auto meta = nshpc::parse_json(nshpc::fs::read_file(root_ / "alpha/metadata.json").value());
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

// The instances service refuses an archive or delete in the step before anything moves (jobs
// still running): the store then leaves the instance exactly where it was.
TEST_F(StoreTest, ArchiveAndDeleteRefusedByTheirStepMoveNothing) {
  auto s = make();
  s.create("busy", {.description = "kept"}, "t");
  std::vector<std::string> seen;
  store::RemovalSteps refuse = TestStore::steps();
  refuse.before_move = [&](const store::Instance& inst) {
    seen.push_back(inst.id + ":" + inst.meta.description());
    throw UsageError("cannot: 1 job(s) still running");
  };
  EXPECT_NE(usage_error([&] { s.archive("busy", "t", refuse); }).find("still running"), std::string::npos);
  EXPECT_NE(usage_error([&] { s.remove("busy", "t", refuse); }).find("still running"), std::string::npos);
  EXPECT_EQ(seen, (std::vector<std::string>{"busy:kept", "busy:kept"}));
  EXPECT_TRUE(fs::exists(root_ / "busy/metadata.json"));
  EXPECT_TRUE(fs::exists(root_ / "output/busy"));
  EXPECT_TRUE(s.list_archived().empty());
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
  auto meta = nshpc::parse_json(nshpc::fs::read_file(root_ / "idle/metadata.json").value());
  meta["created_at"] = "2020-01-01T00:00:00+00:00";
  nshpc::fs::atomic_write(root_ / "idle/metadata.json", meta.dump());
  age(root_ / "idle/metadata.json", 30);
  auto active_meta = nshpc::parse_json(nshpc::fs::read_file(root_ / "active/metadata.json").value());
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

// ---- The listing index ----------------------------------------------------------------------

namespace {

std::vector<std::string> page_ids(const store::Page& page) {
  std::vector<std::string> ids;
  for (const auto& inst : page.instances) ids.push_back(inst.id);
  return ids;
}

}  // namespace

TEST_F(StoreTest, ListPagePagesFiltersAndSortsFromTheIndex) {
  auto s = make();
  for (int i = 0; i < 30; ++i)
    s.create(fmt::format("inst{:02}", i), {.description = i % 10 == 3 ? "Protein folding" : "other"}, "test");
  store::ListQuery q;
  q.sort = store::SortBy::id;
  q.limit = 10;
  q.offset = 10;
  store::Page page = s.list_page(q);
  EXPECT_TRUE(page.indexed);
  EXPECT_EQ(page.total, 30u);
  ASSERT_EQ(page.instances.size(), 10u);
  EXPECT_EQ(page.instances.front().id, "inst10");
  EXPECT_EQ(page.instances.back().id, "inst19");
  EXPECT_TRUE(fs::exists(store::Index::default_file(config_.server.state_dir, root_)));
  EXPECT_FALSE(fs::exists(root_ / "index"));

  q = {};
  q.filter = "PROTEIN";
  page = s.list_page(q);
  EXPECT_EQ(page.total, 3u);
  q.filter = "inst2";
  EXPECT_EQ(s.list_page(q).total, 10u);
}

TEST_F(StoreTest, ListPageSortsByActivityNotedInBatches) {
  auto s = make();
  for (const char* id : {"a", "b", "c"}) s.create(id, {}, "test");
  store::ListQuery q;  // by last activity, newest first
  ASSERT_EQ(s.list_page(q).total, 3u);
  s.audit(s.get("a"), "test.touch", "test");  // noted, not written yet
  // Another process (a second store on the same tree) sees it once the batch is written.
  auto other = make();
  EXPECT_TRUE([&] {
    for (int i = 0; i < 100; ++i) {
      if (page_ids(other.list_page(q)).front() == "a") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }()) << "the activity never reached the index";
}

TEST_F(StoreTest, IndexFollowsOtherWritersAndHandMadeChanges) {
  auto s = make();
  s.create("one", {}, "test");
  ASSERT_EQ(s.list_page({}).total, 1u);
  auto other = make();  // another process: its changes reach the same index
  other.create("two", {}, "test");
  other.archive("one", "test");
  EXPECT_EQ(page_ids(s.list_page({.sort = store::SortBy::id})), std::vector<std::string>{"two"});
  // By hand, as an older release would: the folder's time gives it away.
  fs::create_directories(root_ / "three");
  std::ofstream(root_ / "three/metadata.json") << R"({"id":"three","description":"hand made"})";
  fs::create_directories(root_ / "broken");
  std::ofstream(root_ / "broken/metadata.json") << "{not json";
  store::Page page = s.list_page({.filter = "hand", .sort = store::SortBy::id});
  EXPECT_EQ(page_ids(page), std::vector<std::string>{"three"});
  page = s.list_page({.sort = store::SortBy::id});
  EXPECT_EQ(page_ids(page), (std::vector<std::string>{"three", "two"}));
  ASSERT_EQ(page.corrupt.size(), 1u);
  EXPECT_EQ(page.corrupt[0].id, "broken");
}

TEST_F(StoreTest, ADamagedOrMissingIndexIsRebuiltFromTheTree) {
  auto s = make();
  s.create("kept", {}, "test");
  ASSERT_EQ(s.list_page({}).total, 1u);
  const fs::path db = store::Index::default_file(config_.server.state_dir, root_);
  {
    auto fresh = make();  // a new process meets a damaged file
    std::ofstream(db, std::ios::binary | std::ios::trunc) << "garbage, not SQLite";
    fs::remove(db.string() + "-wal");
    fs::remove(db.string() + "-shm");
    EXPECT_EQ(page_ids(fresh.list_page({})), std::vector<std::string>{"kept"});
  }
  fs::remove(db);
  fs::remove(db.string() + "-wal");
  fs::remove(db.string() + "-shm");
  auto later = make();
  later.create("new", {}, "test");  // no index yet: nothing to keep, the listing builds it
  EXPECT_EQ(page_ids(later.list_page({.sort = store::SortBy::id})), (std::vector<std::string>{"kept", "new"}));
}

TEST_F(StoreTest, WithoutAUsableStateFolderTheListingWalksTheTree) {
  config_.server.state_dir = "/proc/nshpc-no-such-state";
  auto s = make();
  s.create("walked", {.description = "x"}, "test");
  store::Page page = s.list_page({.filter = "walk"});
  EXPECT_FALSE(page.indexed);
  EXPECT_EQ(page_ids(page), std::vector<std::string>{"walked"});
}

// ---- Archives that come back, near misses ---------------------------------------------------

TEST_F(StoreTest, AnArchivedIdIsReportedWithItsArchiveAndComesBack) {
  auto s = make();
  auto inst = s.create("lab", {.description = "keep me"}, "test");
  std::ofstream(inst.workspace / "data.txt") << "data";
  store::ArchivedInstance archived = s.archive("lab", "test");
  try {
    s.get("lab");
    FAIL() << "an archived id was found";
  } catch (const nshpc::NotFound& e) {
    EXPECT_EQ(e.facts().archive_name, archived.name);
    EXPECT_NE(std::string(e.what()).find("was archived as " + archived.name + " on "), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("ns-hpc"), std::string::npos) << "the store names a front end: " << e.what();
  }
  ASSERT_TRUE(s.latest_archive("lab"));
  EXPECT_EQ(s.latest_archive("lab")->name, archived.name);

  s.create("lab", {}, "test");  // the id is free again; the archive comes back beside it
  store::Instance back = s.restore(archived.name, "", "test");
  EXPECT_EQ(back.id, "lab-restored");
  EXPECT_EQ(back.meta.description(), "keep me");
  EXPECT_FALSE(back.meta.archived());
  EXPECT_EQ(back.meta.raw["restored_from"], archived.name);
  EXPECT_TRUE(fs::exists(root_ / "lab-restored/workspace/data.txt"));
  EXPECT_TRUE(fs::is_directory(root_ / "output/lab-restored"));
  EXPECT_FALSE(fs::exists(root_ / ".archived" / archived.name));
  EXPECT_NE(usage_error([&] { s.restore(archived.name, "", "test"); }).find("not found"), std::string::npos);
  EXPECT_NE(usage_error([&] { s.restore("nothing", "", "test"); }).find("has no archive"), std::string::npos);
  s.archive("lab-restored", "test");
  EXPECT_NE(usage_error([&] { s.restore("lab-restored", "lab", "test"); }).find("already exists"), std::string::npos);
  EXPECT_EQ(s.restore("lab-restored", "lab3", "test").id, "lab3");
}

TEST_F(StoreTest, AnUnknownIdNamesTheNearMiss) {
  auto s = make();
  s.create("protein-analysis", {}, "test");
  try {
    s.get("protein-analysys");
    FAIL();
  } catch (const nshpc::NotFound& e) {
    EXPECT_EQ(e.facts().near_miss, "protein-analysis");
    EXPECT_EQ(std::string(e.what()), "instance 'protein-analysys' not found");
  }
  try {
    s.get("zebra");
    FAIL();
  } catch (const nshpc::NotFound& e) {
    EXPECT_EQ(e.facts().near_miss, "");
  }
}

TEST(Text, ClosestFindsLikelyTyposOnly) {
  const std::vector<std::string> names{"list_instances", "terminal_execute", "read_file"};
  EXPECT_EQ(nshpc::text::closest("list_instance", names), "list_instances");
  EXPECT_EQ(nshpc::text::closest("terminal_exec", names), "terminal_execute");
  EXPECT_EQ(nshpc::text::closest("raed_file", names), "read_file");
  EXPECT_EQ(nshpc::text::closest("write", names), std::nullopt);
  EXPECT_EQ(nshpc::text::closest("list_instances", names), std::nullopt);  // itself is no near miss
}

TEST_F(StoreTest, AOneShotCommandsActivityReachesTheIndexThroughItsJournal) {
  auto lister = make();
  for (const char* id : {"a", "b", "c"}) lister.create(id, {}, "test");
  ASSERT_EQ(page_ids(lister.list_page({})).front(), "c");  // the newest
  const fs::path journal = store::Index::default_file(config_.server.state_dir, root_).string() + ".activity";
  {
    auto command = make();  // never lists: no SQLite, no thread; one append at its end
    command.audit(command.get("a"), "sandbox.exec", "test");
    EXPECT_FALSE(fs::exists(journal));
  }
  EXPECT_GT(fs::file_size(journal), 0u);
  EXPECT_EQ(page_ids(lister.list_page({})).front(), "a");
  EXPECT_EQ(fs::file_size(journal), 0u);  // folded in
}
