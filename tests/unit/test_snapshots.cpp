// The pure parts of reset and snapshots (instances/snapshots.hpp): snapshot names, snapshot.json,
// the background Trash, and the crash-safety promise that every tree being made or thrown away
// carries a name Service::finish_deletions() removes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/copy_tree.hpp"
#include "base/error.hpp"
#include "common/temp_dir.hpp"
#include "config/config.hpp"
#include "instances/snapshots.hpp"
#include "store/store.hpp"

namespace fs = std::filesystem;
namespace instances = nshpc::instances;
using nshpc::UsageError;

TEST(SnapshotNames, FollowTheInstanceIdRuleAndSaySo) {
  for (const char* good : {"s1", "before-upgrade", "v1.2_ok", "A"}) EXPECT_NO_THROW(instances::validate_snapshot_name(good));
  for (const char* bad : {"", "..", "../x", ".hidden", "-x", "a/b", "a b", "output"}) {
    try {
      instances::validate_snapshot_name(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a snapshot name: use 1-63 of A-Z a-z 0-9 _ . -"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(instances::validate_snapshot_name(std::string(64, 'a')), UsageError);
}

TEST(SnapshotRecord, RoundTripsAndRefusesWhatIsNotOne) {
  instances::SnapshotInfo info{"s1", "2026-12-02T10:00:00Z", "image:test@20261202T065832Z", 123456, true};
  const auto back = instances::parse_snapshot("s1", instances::to_json(info).dump());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->created_at, info.created_at);
  EXPECT_EQ(back->root, info.root);
  EXPECT_EQ(back->bytes, 123456u);
  EXPECT_TRUE(back->has_layer);
  // The folder's name wins over anything written inside.
  EXPECT_EQ(instances::parse_snapshot("real", R"({"name":"other"})")->name, "real");
  EXPECT_EQ(instances::parse_snapshot("x", R"({})")->root, "host");
  EXPECT_FALSE(instances::parse_snapshot("x", "not json"));
  EXPECT_FALSE(instances::parse_snapshot("x", "[1]"));
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
    instances::Trash trash(/*finish_on_exit=*/false);
    trash.add(tree("one"));
    trash.add(tmp.path() / "missing");  // nothing there: nothing to do, no error
    trash.drain();
    EXPECT_FALSE(fs::exists(tmp.path() / "one"));
  }
  {
    instances::Trash trash(/*finish_on_exit=*/true);
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
  nshpc::instances::Service instances(config);
  const nshpc::store::Store& store = instances.store();
  instances.create("snap-crash", {}, "test");
  for (const char* left : {".deleting-snap-crash-reset-0a1b2c3d/layer/upper/usr",
                           ".deleting-snap-crash-restore-0a1b2c3d/workspace/x",
                           ".deleting-snap-crash-snapshot-0a1b2c3d/layer"})
    fs::create_directories(store.root() / left);
  EXPECT_EQ(instances.finish_deletions(), 3u);
  for (const auto& e : fs::directory_iterator(store.root()))
    EXPECT_NE(e.path().filename().string().rfind(".deleting-", 0), 0u) << e.path();
  EXPECT_NO_THROW(store.get("snap-crash"));
}

// ---- The exact copy of an instance's tree (base/copy_tree.hpp) ----------------------------------

namespace {

struct stat lstat_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

// What a snapshot must keep: modes (set-gid and 000 included), times, symlinks as symlinks (even
// ones that point out of the tree), hard links as one file, FIFOs, holes, user extended attributes.
TEST(CopyTree, CopiesExactlyWhatIsThere) {
  nshpc::tests::TempDir tmp("nshpc-copy-tree");
  const fs::path from = tmp.path() / "from";
  fs::create_directories(from / "sub" / "deeper");
  write(from / "a.txt", "alpha\n");
  write(from / "sub" / "deeper" / "b", "beta");
  ASSERT_EQ(::chmod((from / "a.txt").c_str(), 0640), 0);
  ASSERT_EQ(::chmod((from / "sub").c_str(), 02750), 0);
  write(from / "closed", "shut");
  ASSERT_EQ(::chmod((from / "closed").c_str(), 0), 0);
  fs::create_directories(from / "shut");
  write(from / "shut" / "in", "inside");
  ASSERT_EQ(::chmod((from / "shut").c_str(), 0), 0);  // closed even to its owner
  ASSERT_EQ(::link((from / "a.txt").c_str(), (from / "sub" / "hard").c_str()), 0);
  ASSERT_EQ(::symlink("/etc", (from / "out").c_str()), 0);
  ASSERT_EQ(::symlink("deeper/b", (from / "sub" / "rel").c_str()), 0);
  ASSERT_EQ(::mkfifo((from / "pipe").c_str(), 0600), 0);
  ASSERT_EQ(::chmod((from / "pipe").c_str(), 0620), 0);  // past the umask
  {
    std::ofstream sparse(from / "sparse");
    sparse.seekp(8 << 20);
    sparse << "end";
  }
  const bool xattrs = ::setxattr((from / "a.txt").c_str(), "user.note", "kept", 4, 0) == 0;
  const struct timespec old_times[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (from / "sub" / "deeper").c_str(), old_times, 0), 0);

  const nshpc::fs::TreeCopied copied = nshpc::fs::copy_tree_exact(from, tmp.path() / "to");
  const fs::path to = tmp.path() / "to";
  EXPECT_EQ(copied.skipped, 0u);
  EXPECT_EQ(read(to / "a.txt"), "alpha\n");
  EXPECT_EQ(read(to / "sub" / "deeper" / "b"), "beta");
  EXPECT_EQ(lstat_of(to / "a.txt").st_mode & 07777, 0640u);
  EXPECT_EQ(lstat_of(to / "sub").st_mode & 07777, 02750u);
  EXPECT_EQ(lstat_of(to / "closed").st_mode & 07777, 0u);
  EXPECT_EQ(lstat_of(to / "a.txt").st_ino, lstat_of(to / "sub" / "hard").st_ino) << "a hard link stays one file";
  EXPECT_TRUE(S_ISLNK(lstat_of(to / "out").st_mode)) << "a link out of the tree is copied as the link";
  EXPECT_EQ(fs::read_symlink(to / "out"), "/etc");
  EXPECT_EQ(fs::read_symlink(to / "sub" / "rel"), "deeper/b");
  EXPECT_TRUE(S_ISFIFO(lstat_of(to / "pipe").st_mode));
  EXPECT_EQ(lstat_of(to / "pipe").st_mode & 07777, 0620u);
  EXPECT_EQ(lstat_of(to / "sparse").st_size, (8 << 20) + 3);
  EXPECT_LT(lstat_of(to / "sparse").st_blocks * 512, 1 << 20) << "a hole stays a hole";
  EXPECT_EQ(lstat_of(to / "sub" / "deeper").st_mtim.tv_sec, 1000000000);
  if (xattrs) {
    char value[16] = {};
    EXPECT_EQ(::getxattr((to / "a.txt").c_str(), "user.note", value, sizeof value), 4);
    EXPECT_STREQ(value, "kept");
  }
  EXPECT_EQ(lstat_of(to / "a.txt").st_uid, lstat_of(from / "a.txt").st_uid);
  // Folders and files closed even to their owner are copied (and keep their modes, on both sides).
  EXPECT_EQ(lstat_of(from / "shut").st_mode & 07777, 0u);
  EXPECT_EQ(lstat_of(from / "closed").st_mode & 07777, 0u);
  EXPECT_EQ(lstat_of(to / "shut").st_mode & 07777, 0u);
  ASSERT_EQ(::chmod((to / "shut").c_str(), 0700), 0);
  EXPECT_EQ(read(to / "shut" / "in"), "inside");
  ASSERT_EQ(::chmod((from / "shut").c_str(), 0700), 0);  // for TempDir's removal
  // The destination must not exist: nothing is merged into a tree that is there.
  EXPECT_THROW(nshpc::fs::copy_tree_exact(from, to), nshpc::SysError);
}

// A folder of the tree swapped for a symlink to a folder outside it, over and over while copies
// run (what a sandbox watching the copy with inotify does): no copy ever holds a file from outside.
TEST(CopyTree, NeverFollowsAFolderSwappedForALinkWhileItCopies) {
  nshpc::tests::TempDir tmp("nshpc-copy-swap");
  const fs::path secret = tmp.path() / "secret";
  fs::create_directories(secret);
  write(secret / "key", "the host's secret");
  const fs::path from = tmp.path() / "from";
  fs::create_directories(from / "d");
  for (int i = 0; i < 50; ++i) write(from / "d" / ("f" + std::to_string(i)), "ordinary");
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const fs::path d = from / "d", aside = from / "d.aside";
    while (!stop) {
      if (::rename(d.c_str(), aside.c_str()) == 0) {
        ::symlink(secret.c_str(), d.c_str());
        ::unlink(d.c_str());
        ::rename(aside.c_str(), d.c_str());
      }
    }
  });
  int copies = 0, saw_link = 0;
  for (int i = 0; i < 300; ++i) {
    const fs::path to = tmp.path() / ("to" + std::to_string(i));
    try {
      nshpc::fs::copy_tree_exact(from, to);
      ++copies;
    } catch (const nshpc::SysError&) {
      // An entry that changed between reading the folder and copying it may fail the copy; it
      // never brings in what is outside.
    }
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(to, ec); it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_symlink()) ++saw_link;
      EXPECT_NE(it->path().filename(), "key") << it->path();
      if (it->is_regular_file() && !it->is_symlink()) EXPECT_EQ(read(it->path()), "ordinary") << it->path();
    }
    fs::remove_all(to, ec);
  }
  stop = true;
  swapper.join();
  EXPECT_GT(copies, 0);
  std::printf("[ %d copies under swaps; the swapped-in link was copied as a link %d time(s) ]\n", copies, saw_link);
}
