// A confined root (files::Root::confine): the root folder of a living sandbox reached from outside
// holds kernel interfaces too (its /proc, /proc/sys, devices), which the server, as root, could
// read and write far beyond what the sandbox may. Modelled here by the host's own "/" confined to
// the file system of a test folder: /proc is refused before anything of it is opened, as are a
// FIFO or device, a file system nobody listed, and a file of another uid.
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "common/temp_dir.hpp"
#include "files/resolver.hpp"

namespace stdfs = std::filesystem;
using namespace nshpc;
using nshpc::tests::TempDir;

namespace {

std::int64_t fs_type(const stdfs::path& path) {
  struct statfs sfs {};
  EXPECT_EQ(::statfs(path.c_str(), &sfs), 0);
  return static_cast<std::int64_t>(sfs.f_type);
}

// "/" as a confined root of this process's own files, on the test folder's file system.
files::Root confined_slash(const TempDir& dir, std::vector<std::int64_t> types = {}) {
  files::Root root = files::Root::open("/", "/", std::nullopt);
  if (types.empty()) types.push_back(fs_type(dir.path()));
  root.confine(std::move(types));
  return root;
}

int refusal(const std::function<void()>& operation) {
  try {
    operation();
  } catch (const SysError& e) {
    return e.code();
  }
  return 0;
}

}  // namespace

TEST(ConfinedRoot, KernelInterfacesAreRefusedBeforeTheyAreOpened) {
  TempDir dir;
  files::Root root = confined_slash(dir);
  for (const char* rel : {"proc/self/status", "proc/sys/kernel/hostname", "proc/version"}) {
    EXPECT_EQ(refusal([&] { files::open_read({&root, rel}); }), EPERM) << rel;
    EXPECT_EQ(refusal([&] { files::list_dir({&root, "proc/self"}); }), EPERM);
  }
  EXPECT_EQ(refusal([&] { files::begin_write({&root, "proc/sys/kernel/hostname"}, {}); }), EPERM);
  EXPECT_EQ(refusal([&] { files::begin_write({&root, "proc/self/new"}, {}); }), EPERM);
  try {
    files::open_read({&root, "proc/version"});
  } catch (const SysError& e) {
    EXPECT_NE(std::string(e.what()).find("on proc, a kernel interface"), std::string::npos) << e.what();
  }
  EXPECT_STREQ(files::kernel_interface(0x9fa0), "proc");
  EXPECT_EQ(files::kernel_interface(0xEF53), nullptr);  // ext4: files
}

TEST(ConfinedRoot, OwnFilesAreReadAndWrittenOthersAreNot) {
  TempDir dir;
  const std::string rel = dir.path().string().substr(1);
  std::ofstream(dir.path() / "a.txt") << "mine\n";
  files::Root root = confined_slash(dir);
  files::Opened o = files::open_read({&root, rel + "/a.txt"});
  EXPECT_EQ(o.st.st_size, 5);
  auto pending = files::begin_write({&root, rel + "/b/c.txt"}, {.create_parents = true});
  pending->write("new\n");
  pending->commit();
  EXPECT_TRUE(stdfs::exists(dir.path() / "b/c.txt"));
  // A FIFO: never opened (it would block), refused as not a regular file.
  ASSERT_EQ(::mkfifo((dir.path() / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(refusal([&] { files::open_read({&root, rel + "/fifo"}); }), ENXIO);
  // A file system nobody listed.
  files::Root elsewhere = confined_slash(dir, {0x12345678});
  EXPECT_EQ(refusal([&] { files::open_read({&elsewhere, rel + "/a.txt"}); }), EPERM);
  if (::geteuid() == 0) {
    // A file, and a folder to write in, of another uid: whatever their modes.
    ASSERT_EQ(::chown((dir.path() / "a.txt").c_str(), 4242, 4242), 0);
    EXPECT_EQ(refusal([&] { files::open_read({&root, rel + "/a.txt"}); }), EPERM);
    EXPECT_EQ(refusal([&] { files::begin_write({&root, rel + "/a.txt"}, {}); }), EPERM);
    stdfs::create_directory(dir.path() / "theirs");
    ASSERT_EQ(::chown((dir.path() / "theirs").c_str(), 4242, 4242), 0);
    ::chmod((dir.path() / "theirs").c_str(), 0777);
    EXPECT_EQ(refusal([&] { files::begin_write({&root, rel + "/theirs/x"}, {}); }), EPERM);
    EXPECT_EQ(refusal([&] { files::begin_write({&root, rel + "/theirs/y/x"}, {.create_parents = true}); }), EPERM);
    EXPECT_FALSE(stdfs::exists(dir.path() / "theirs/x"));
    EXPECT_FALSE(stdfs::exists(dir.path() / "theirs/y"));
  }
}
