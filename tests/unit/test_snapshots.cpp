// The pure parts of reset and snapshots (lifecycle/snapshots.hpp): snapshot names, snapshot.json,
// the background Trash, and the crash-safety promise that every tree being made or thrown away
// carries a name Store::finish_deletions() removes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/error.hpp"
#include "common/temp_dir.hpp"
#include "config/config.hpp"
#include "lifecycle/snapshots.hpp"
#include "store/store.hpp"

namespace fs = std::filesystem;
namespace lifecycle = nshpc::lifecycle;
using nshpc::UsageError;

TEST(SnapshotNames, FollowTheInstanceIdRuleAndSaySo) {
  for (const char* good : {"s1", "before-upgrade", "v1.2_ok", "A"}) EXPECT_NO_THROW(lifecycle::validate_snapshot_name(good));
  for (const char* bad : {"", "..", "../x", ".hidden", "-x", "a/b", "a b", "output"}) {
    try {
      lifecycle::validate_snapshot_name(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a snapshot name: use 1-63 of A-Z a-z 0-9 _ . -"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(lifecycle::validate_snapshot_name(std::string(64, 'a')), UsageError);
}

TEST(SnapshotRecord, RoundTripsAndRefusesWhatIsNotOne) {
  lifecycle::SnapshotInfo info{"s1", "2026-12-02T10:00:00Z", "image:test@20261202T065832Z", 123456, true};
  const auto back = lifecycle::parse_snapshot("s1", lifecycle::to_json(info).dump());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->created_at, info.created_at);
  EXPECT_EQ(back->root, info.root);
  EXPECT_EQ(back->bytes, 123456u);
  EXPECT_TRUE(back->has_layer);
  // The folder's name wins over anything written inside.
  EXPECT_EQ(lifecycle::parse_snapshot("real", R"({"name":"other"})")->name, "real");
  EXPECT_EQ(lifecycle::parse_snapshot("x", R"({})")->root, "host");
  EXPECT_FALSE(lifecycle::parse_snapshot("x", "not json"));
  EXPECT_FALSE(lifecycle::parse_snapshot("x", "[1]"));
}

TEST(SnapshotTrash, RemovesInTheBackgroundAndFinishesOnExitWhenAsked) {
  nshpc::tests::TempDir tmp("nshpc-trash");
  auto tree = [&](const std::string& name) {
    fs::create_directories(tmp.path() / name / "a" / "b");
    std::ofstream(tmp.path() / name / "a" / "b" / "f") << "x";
    fs::create_symlink("/etc", tmp.path() / name / "link");  // never followed
    return tmp.path() / name;
  };
  {
    lifecycle::Trash trash(/*finish_on_exit=*/false);
    trash.add(tree("one"));
    trash.add(tmp.path() / "missing");  // nothing there: nothing to do, no error
    trash.drain();
    EXPECT_FALSE(fs::exists(tmp.path() / "one"));
  }
  {
    lifecycle::Trash trash(/*finish_on_exit=*/true);
    for (int i = 0; i < 5; ++i) trash.add(tree("many" + std::to_string(i)));
  }
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(fs::exists(tmp.path() / ("many" + std::to_string(i))));
  EXPECT_TRUE(fs::exists("/etc/hostname") || fs::exists("/etc/passwd"));
}

// A crash between "made aside" and "thrown away" leaves a .deleting- tree in the instances folder;
// the next start of the server finishes it.
TEST(SnapshotTrash, WhatACrashLeftIsFinishedAtTheNextStart) {
  nshpc::tests::TempDir tmp("nshpc-trash-store");
  nshpc::config::Config config = nshpc::config::built_in();
  config.ns.instances_dir = tmp.path() / "instances";
  config.ns.sandbox_uid = static_cast<uint32_t>(::getuid());
  config.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
  config.server.state_dir = tmp.path() / "state";
  nshpc::store::RecordedJobsGuard guard;
  nshpc::store::Store store(config, guard);
  store.create("snap-crash", {}, "test");
  for (const char* left : {".deleting-snap-crash-reset-0a1b2c3d/layer/upper/usr",
                           ".deleting-snap-crash-restore-0a1b2c3d/workspace/x",
                           ".deleting-snap-crash-snapshot-0a1b2c3d/layer"})
    fs::create_directories(store.root() / left);
  EXPECT_EQ(store.finish_deletions(), 3u);
  for (const auto& e : fs::directory_iterator(store.root()))
    EXPECT_NE(e.path().filename().string().rfind(".deleting-", 0), 0u) << e.path();
  EXPECT_NO_THROW(store.get("snap-crash"));
}
