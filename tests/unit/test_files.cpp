// The files resolver: paths as the sandbox sees them, and every operation beneath a root that a
// hostile sandbox controls (links, "..", swaps between check and use, FIFOs, hard links).
#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "common/temp_dir.hpp"
#include "files/content.hpp"
#include "files/broker.hpp"
#include "files/resolver.hpp"

namespace stdfs = std::filesystem;
using namespace nshpc;
using nshpc::tests::TempDir;

namespace {

std::string slurp(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(out.size()))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::string slurp(const stdfs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SysError& e) {
    return e.code();
  }
  return 0;
}

// An instance layout: <t>/inst/workspace, <t>/inst/metadata.json, <t>/output, a secret outside.
struct Layout {
  TempDir t{"nshpc-files"};
  stdfs::path ws = t.path() / "inst" / "workspace";
  stdfs::path out = t.path() / "output";
  Layout() {
    stdfs::create_directories(ws);
    stdfs::create_directories(out);
    std::ofstream(t.path() / "inst" / "metadata.json") << "{\"secret\": true}";
    std::ofstream(t.path() / "secret") << "host secret";
    stdfs::create_directories(t.path() / "inst" / ".ns_hpc_jobs");
    std::ofstream(t.path() / "inst" / ".ns_hpc_jobs" / "j.state") << "job";
  }
  files::InstanceView view() const {
    files::InstanceView v;
    v.workspace = ws;
    v.output = out;
    return v;
  }
  // The view of a sandbox user's instance (root only): its workspace and output folder are that
  // user's, as the store makes them, and every operation acts as it (files::acting_identity).
  files::InstanceView owned_by(uid_t uid, gid_t gid) const {
    EXPECT_EQ(::chown(ws.c_str(), uid, gid), 0);
    EXPECT_EQ(::chown(out.c_str(), uid, gid), 0);
    files::InstanceView v = view();
    v.owner = files::Owner{uid, gid};
    return v;
  }
};

// This thread's filesystem uid and gid (setfsuid/setfsgid with an invalid id change nothing).
std::pair<uid_t, gid_t> fs_ids() {
  return {static_cast<uid_t>(::setfsuid(static_cast<uid_t>(-1))), static_cast<gid_t>(::setfsgid(static_cast<gid_t>(-1)))};
}

std::string read_at(const files::InstanceFiles& f, std::string_view path) {
  files::Opened o = files::open_read(f.resolve(path));
  return slurp(o.fd.get());
}

}  // namespace

TEST(FilesNormalize, FoldsDotsAndKeepsAbsoluteness) {
  EXPECT_EQ(files::normalize("/workspace/./a//b/../c"), "/workspace/a/c");
  EXPECT_EQ(files::normalize("/../../etc"), "/etc");
  EXPECT_EQ(files::normalize("a/../../b"), "../b");
  EXPECT_EQ(files::normalize("/"), "/");
  EXPECT_EQ(files::normalize("./"), "");
  EXPECT_THROW(files::normalize(std::string("a\0b", 3)), UsageError);
}

TEST(FilesResolve, SandboxPathsMapToWorkspaceAndOutput) {
  Layout l;
  files::InstanceFiles f(l.view());
  auto a = f.resolve("notes/a.txt");
  EXPECT_EQ(a.root, &f.workspace());
  EXPECT_EQ(a.rel, "notes/a.txt");
  EXPECT_EQ(a.shown(), "/workspace/notes/a.txt");
  auto b = f.resolve("/workspace");
  EXPECT_EQ(b.root, &f.workspace());
  EXPECT_EQ(b.rel, "");
  auto c = f.resolve("/output/r/x.csv");
  EXPECT_EQ(c.root, &f.output());
  EXPECT_EQ(c.rel, "r/x.csv");
  auto d = f.resolve("../output/y");  // relative to /workspace, as the sandbox's shell would
  EXPECT_EQ(d.root, &f.output());
  EXPECT_EQ(d.rel, "y");
  EXPECT_THROW(f.resolve(""), UsageError);
  EXPECT_THROW(f.resolve("/etc/passwd"), UsageError);
  EXPECT_THROW(f.resolve("../metadata.json"), UsageError);
  EXPECT_THROW(f.resolve("/workspacex/a"), UsageError);
  EXPECT_THROW(f.resolve("/"), UsageError);
}

// A broker that cannot start (newuidmap refused, no unshare) is named with what it said, on this
// call and every later one; nothing is left running.
TEST(FilesBroker, OneThatCannotStartSaysWhyOnEveryCall) {
  Layout l;
  files::Broker broker({"/bin/sh", "-c", "echo 'newuidmap: write to uid_map failed' >&2; exit 1"});
  UniqueFd dir = fs::open_dir_path(l.ws);
  for (int i = 0; i < 2; ++i) {
    try {
      broker.mkdirat(dir.get(), "x", 0755);
      FAIL() << "a broker that exited did something";
    } catch (const SysError& e) {
      EXPECT_EQ(e.code(), EACCES);
      EXPECT_NE(std::string(e.what()).find("did not work"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("/bin/sh -c"), std::string::npos) << e.what();
      if (i == 0) {
        EXPECT_NE(std::string(e.what()).find("write to uid_map failed"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_FALSE(stdfs::exists(l.ws / "x"));
}

TEST(FilesRead, ReadsFilesAndFollowsLinksThatStayInside) {
  Layout l;
  stdfs::create_directories(l.ws / "a");
  std::ofstream(l.ws / "a" / "f.txt") << "hello";
  stdfs::create_symlink("a/f.txt", l.ws / "rel");
  stdfs::create_symlink("/a/f.txt", l.ws / "abs");  // absolute: re-rooted at the workspace
  files::InstanceFiles f(l.view());
  EXPECT_EQ(read_at(f, "a/f.txt"), "hello");
  EXPECT_EQ(read_at(f, "/workspace/rel"), "hello");
  EXPECT_EQ(read_at(f, "abs"), "hello");
  EXPECT_TRUE(files::open_read(f.resolve("a")).is_dir());
}

TEST(FilesRead, LinksAndDotDotNeverLeaveTheRoot) {
  Layout l;
  stdfs::create_symlink(l.t.path() / "secret", l.ws / "host_abs");      // host path: re-rooted, missing
  stdfs::create_symlink("../../secret", l.ws / "up");                     // clamped at the root
  stdfs::create_symlink("../metadata.json", l.ws / "meta");
  stdfs::create_symlink("../.ns_hpc_jobs/j.state", l.ws / "job");
  stdfs::create_symlink(l.t.path(), l.ws / "dir_out");
  files::InstanceFiles f(l.view());
  for (const char* p : {"host_abs", "up", "meta", "job", "dir_out/secret", "dir_out/inst/metadata.json"}) {
    int code = error_of([&] { read_at(f, p); });
    EXPECT_NE(code, 0) << p << " was read";
  }
  // ".." inside a relative path below the root is clamped by the kernel, never climbs.
  files::Location raw{&f.workspace(), "a/../../secret"};
  EXPECT_NE(error_of([&] { files::open_read(raw); }), 0);
  files::Location raw2{&f.workspace(), "../inst/metadata.json"};
  EXPECT_NE(error_of([&] { files::open_read(raw2); }), 0);
}

TEST(FilesRead, MagicLinksAreRefused) {
  // /proc/self/root is a magic link: refused even when the root itself holds a procfs.
  files::Root root = files::Root::open("/", "/", std::nullopt);
  int code = error_of([&] { files::open_read({&root, "proc/self/root/etc/hostname"}); });
  EXPECT_EQ(code, ELOOP);
  code = error_of([&] { files::open_read({&root, "proc/self/fd/0"}); });
  EXPECT_EQ(code, ELOOP);
  // A link planted in a workspace pointing at /proc/self/root: re-rooted, so it finds nothing.
  Layout l;
  stdfs::create_symlink("/proc/self/root/etc/hostname", l.ws / "magic");
  files::InstanceFiles f(l.view());
  EXPECT_NE(error_of([&] { read_at(f, "magic"); }), 0);
}

TEST(FilesRead, FifosAndDevicesAreRefusedWithoutBlocking) {
  Layout l;
  ASSERT_EQ(::mkfifo((l.ws / "fifo").c_str(), 0644), 0);
  stdfs::create_symlink("/dev/zero", l.ws / "zero");
  files::InstanceFiles f(l.view());
  EXPECT_EQ(error_of([&] { read_at(f, "fifo"); }), ENXIO);
  EXPECT_NE(error_of([&] { read_at(f, "zero"); }), 0);  // re-rooted: /workspace/dev/zero is missing
}

TEST(FilesRead, AHardLinkToAnotherUsersFileIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to own files of another uid";
  Layout l;
  std::ofstream(l.ws / "mine") << "mine";
  ASSERT_EQ(::chown((l.ws / "mine").c_str(), 4242, 4242), 0);
  std::ofstream(l.t.path() / "root_file") << "root only";
  stdfs::create_hard_link(l.t.path() / "root_file", l.ws / "hard");
  auto v = l.view();
  v.owner = files::Owner{4242, 4242};
  files::InstanceFiles f(v);
  EXPECT_EQ(read_at(f, "mine"), "mine");
  EXPECT_EQ(error_of([&] { read_at(f, "hard"); }), EPERM);
  // A hard link to a file of the owner is the same content the sandbox sees: read.
  stdfs::create_hard_link(l.ws / "mine", l.ws / "mine2");
  EXPECT_EQ(read_at(f, "mine2"), "mine");
  // A root no sandbox writes (a WebDAV extra) may read files of any uid.
  files::Root any = files::Root::open(l.ws, "/dav/extra", files::Owner{4242, 4242}, true, /*any_owner=*/true);
  EXPECT_EQ(slurp(files::open_read({&any, "hard"}).fd.get()), "root only");
}

TEST(FilesRead, ASymlinkSwappedInBetweenCheckAndUseNeverLeadsOutside) {
  Layout l;
  stdfs::create_directories(l.t.path() / "outside");
  std::ofstream(l.t.path() / "outside" / "f") << "OUTSIDE";
  stdfs::create_directories(l.ws / "real");
  std::ofstream(l.ws / "real" / "f") << "inside";
  files::InstanceFiles f(l.view());
  std::atomic<bool> stop{false};
  // The "sandbox": swaps d between a folder and links out of the workspace, as fast as it can.
  std::thread swapper([&] {
    const stdfs::path d = l.ws / "d";
    const std::string host_abs = (l.t.path() / "outside").string();
    int i = 0;
    while (!stop) {
      std::error_code ec;
      stdfs::remove(l.ws / "tmp", ec);
      switch (i++ % 3) {
        case 0: ::symlink("real", (l.ws / "tmp").c_str()); break;
        case 1: ::symlink("../../outside", (l.ws / "tmp").c_str()); break;
        case 2: ::symlink(host_abs.c_str(), (l.ws / "tmp").c_str()); break;
      }
      ::rename((l.ws / "tmp").c_str(), d.c_str());
    }
  });
  int inside = 0;
  int leaked_at = -1;
  for (int i = 0; i < 20000 && leaked_at < 0; ++i) {
    try {
      std::string got = read_at(f, "d/f");
      if (got == "OUTSIDE") leaked_at = i;
      if (got == "inside") ++inside;
    } catch (const SysError&) {
    }
    // The write side too: never lands outside.
    try {
      auto p = files::begin_write(f.resolve("d/w"), {});
      p->write("x");
      p->commit();
    } catch (const SysError&) {
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(leaked_at, -1) << "read through a swapped link at iteration " << leaked_at;
  EXPECT_GT(inside, 0);
  EXPECT_FALSE(stdfs::exists(l.t.path() / "outside" / "w"));
  EXPECT_EQ(slurp(l.t.path() / "outside" / "f"), "OUTSIDE");
}

TEST(FilesWrite, AtomicReplaceKeepsModeAndNeverWritesThroughALink) {
  Layout l;
  std::ofstream(l.ws / "run.sh") << "old";
  stdfs::permissions(l.ws / "run.sh", stdfs::perms(0750));
  stdfs::create_symlink(l.t.path() / "secret", l.ws / "link");
  files::InstanceFiles f(l.view());
  {
    auto p = files::begin_write(f.resolve("run.sh"), {});
    p->write("new");
    // Not committed yet: the old content is still there.
    EXPECT_EQ(slurp(l.ws / "run.sh"), "old");
    auto st = p->commit();
    EXPECT_EQ(st.st_mode & 07777, 0750u);
  }
  EXPECT_EQ(slurp(l.ws / "run.sh"), "new");
  {
    auto p = files::begin_write(f.resolve("link"), {});
    p->write("replaced");
    p->commit();
  }
  EXPECT_EQ(slurp(l.t.path() / "secret"), "host secret");
  EXPECT_FALSE(stdfs::is_symlink(l.ws / "link"));
  EXPECT_EQ(slurp(l.ws / "link"), "replaced");
  // Abandoned: no temporary left behind.
  { auto p = files::begin_write(f.resolve("gone.txt"), {}); p->write("x"); }
  EXPECT_FALSE(stdfs::exists(l.ws / "gone.txt"));
  std::size_t entries = 0;
  for ([[maybe_unused]] auto& e : stdfs::directory_iterator(l.ws)) ++entries;
  EXPECT_EQ(entries, 2u);
}

TEST(FilesWrite, ParentsOnlyWhenAskedAndCreateOnlyRefusesExisting) {
  Layout l;
  files::InstanceFiles f(l.view());
  EXPECT_EQ(error_of([&] { files::begin_write(f.resolve("a/b/c.txt"), {}); }), ENOENT);
  files::WriteOptions parents;
  parents.create_parents = true;
  auto p = files::begin_write(f.resolve("/output/a/b/c.txt"), parents);
  p->write("deep");
  p->commit();
  EXPECT_EQ(slurp(l.out / "a" / "b" / "c.txt"), "deep");
  files::WriteOptions create_only;
  create_only.no_replace = true;
  EXPECT_EQ(error_of([&] { files::begin_write(f.resolve("/output/a/b/c.txt"), create_only); }), EEXIST);
  EXPECT_EQ(error_of([&] { files::begin_write(f.resolve("/output/a"), {}); }), EISDIR);
  EXPECT_EQ(error_of([&] { files::begin_write(f.resolve("/workspace"), {}); }), EISDIR);
}

TEST(FilesWrite, NewFilesAndFoldersBelongToTheSandboxUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give files away";
  Layout l;
  files::InstanceFiles f(l.owned_by(4243, 4244));
  files::WriteOptions parents;
  parents.create_parents = true;
  auto p = files::begin_write(f.resolve("x/y/z.txt"), parents);
  p->write("z");
  p->commit();
  files::make_dir(f.resolve("m"), false);
  for (auto rel : {"x", "x/y", "x/y/z.txt", "m"}) {
    struct stat st;
    ASSERT_EQ(::lstat((l.ws / rel).c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 4243u) << rel;
    EXPECT_EQ(st.st_gid, 4244u) << rel;
  }
}

TEST(FilesWrite, AReadOnlyRootRefusesEveryWrite) {
  Layout l;
  files::Root root = files::Root::open(l.ws, "/dav/extra", std::nullopt, /*read_only=*/true);
  std::ofstream(l.ws / "f") << "f";
  files::Location at{&root, "f"};
  EXPECT_EQ(error_of([&] { files::begin_write(at, {}); }), EROFS);
  EXPECT_EQ(error_of([&] { files::remove(at, false); }), EROFS);
  EXPECT_EQ(error_of([&] { files::make_dir({&root, "d"}, false); }), EROFS);
  EXPECT_EQ(error_of([&] { files::rename(at, {&root, "g"}, false); }), EROFS);
  EXPECT_EQ(slurp(files::open_read(at).fd.get()), "f");
}

TEST(FilesOps, RemoveNeverFollowsAndFoldersNeedRecursive) {
  Layout l;
  stdfs::create_directories(l.t.path() / "keep");
  std::ofstream(l.t.path() / "keep" / "k") << "k";
  stdfs::create_directories(l.ws / "tree" / "sub");
  std::ofstream(l.ws / "tree" / "sub" / "f") << "f";
  stdfs::create_symlink(l.t.path() / "keep", l.ws / "tree" / "out");
  stdfs::create_symlink(l.t.path() / "keep", l.ws / "link");
  files::InstanceFiles f(l.view());
  EXPECT_EQ(error_of([&] { files::remove(f.resolve("tree"), false); }), EISDIR);
  files::remove(f.resolve("tree"), true);
  EXPECT_FALSE(stdfs::exists(l.ws / "tree"));
  files::remove(f.resolve("link"), false);
  EXPECT_FALSE(stdfs::is_symlink(l.ws / "link"));
  EXPECT_EQ(slurp(l.t.path() / "keep" / "k"), "k");
  EXPECT_EQ(error_of([&] { files::remove(f.resolve("/workspace"), true); }), EBUSY);
  EXPECT_EQ(error_of([&] { files::remove(f.resolve("missing"), false); }), ENOENT);
  EXPECT_TRUE(stdfs::exists(l.t.path() / "inst" / "metadata.json"));
}

TEST(FilesOps, RenameAndCopyWithinAndAcrossRoots) {
  Layout l;
  std::ofstream(l.ws / "a.txt") << "A";
  stdfs::permissions(l.ws / "a.txt", stdfs::perms(0600));
  stdfs::create_directories(l.ws / "d" / "e");
  std::ofstream(l.ws / "d" / "e" / "f") << "F";
  stdfs::create_symlink(l.t.path() / "secret", l.ws / "d" / "out");
  ASSERT_EQ(::mkfifo((l.ws / "d" / "fifo").c_str(), 0644), 0);
  std::ofstream(l.ws / "b.txt") << "B";
  files::InstanceFiles f(l.view());
  EXPECT_EQ(error_of([&] { files::rename(f.resolve("a.txt"), f.resolve("b.txt"), false); }), EEXIST);
  files::copy(f.resolve("a.txt"), f.resolve("/output/a-copy.txt"), false);
  EXPECT_EQ(slurp(l.out / "a-copy.txt"), "A");
  EXPECT_EQ(stdfs::status(l.out / "a-copy.txt").permissions(), stdfs::perms(0600));
  files::copy(f.resolve("d"), f.resolve("/output/d2"), false);
  EXPECT_EQ(slurp(l.out / "d2" / "e" / "f"), "F");
  EXPECT_TRUE(stdfs::is_symlink(l.out / "d2" / "out"));  // copied as a link, not followed
  EXPECT_FALSE(stdfs::exists(stdfs::symlink_status(l.out / "d2" / "fifo")));
  EXPECT_EQ(error_of([&] { files::copy(f.resolve("d"), f.resolve("d/e/x"), false); }), EINVAL);
  files::rename(f.resolve("a.txt"), f.resolve("/output/moved.txt"), false);
  EXPECT_EQ(slurp(l.out / "moved.txt"), "A");
  files::rename(f.resolve("b.txt"), f.resolve("/output/moved.txt"), true);
  EXPECT_EQ(slurp(l.out / "moved.txt"), "B");
}

TEST(FilesOps, ListsEntriesWithoutFollowingThem) {
  Layout l;
  std::ofstream(l.ws / "f") << "12345";
  stdfs::create_directories(l.ws / "d");
  stdfs::create_symlink(l.t.path() / "secret", l.ws / "s");
  ASSERT_EQ(::mkfifo((l.ws / "p").c_str(), 0644), 0);
  files::InstanceFiles f(l.view());
  auto entries = files::list_dir(f.resolve("/workspace"));
  std::map<std::string, files::Entry> by_name;
  for (auto& e : entries) by_name[e.name] = e;
  ASSERT_EQ(by_name.size(), 4u);
  EXPECT_EQ(by_name["f"].type, files::EntryType::file);
  EXPECT_EQ(by_name["f"].size, 5u);
  EXPECT_EQ(by_name["d"].type, files::EntryType::directory);
  EXPECT_EQ(by_name["s"].type, files::EntryType::symlink);
  EXPECT_EQ(by_name["p"].type, files::EntryType::other);
  EXPECT_EQ(files::read_link(f.resolve("s")), (l.t.path() / "secret").string());
  EXPECT_EQ(error_of([&] { files::list_dir(f.resolve("f")); }), ENOTDIR);
  EXPECT_EQ(files::list_dir(f.resolve("/workspace"), 2).size(), 2u);
}

TEST(FilesContent, SniffTellsTextImagesAndBinaries) {
  using C = files::Kind::Class;
  EXPECT_EQ(files::sniff("x\ny\n").cls, C::text);
  EXPECT_EQ(files::sniff("BMI table\n").cls, C::text);
  EXPECT_EQ(files::sniff("").cls, C::empty);
  EXPECT_EQ(files::sniff("h\xc3\xa9llo").cls, C::text);
  EXPECT_EQ(files::sniff("h\xc3").cls, C::text);  // a sequence cut by the end of the head
  EXPECT_EQ(files::sniff(std::string("\x89PNG\r\n\x1a\n....", 12)).mime, "image/png");
  EXPECT_EQ(files::sniff("GIF89a...").mime, "image/gif");
  EXPECT_EQ(files::sniff(std::string("RIFF\0\0\0\0WEBPVP8 ", 16)).mime, "image/webp");
  EXPECT_EQ(files::sniff(std::string("\x7f" "ELF\2\1\1\0", 8)).description, "ELF executable or library");
  EXPECT_EQ(files::sniff(std::string("ab\0cd", 5)).cls, C::binary);
  EXPECT_EQ(files::sniff("\xff\xfe\xfd garbage").cls, C::binary);
}

TEST(FilesContent, Base64RoundTripsAndRefusesGarbage) {
  for (std::string s : {std::string(), std::string("a"), std::string("ab"), std::string("abc"), std::string("\0\xff\x10", 3)})
    EXPECT_EQ(files::base64_decode(files::base64_encode(s)), s);
  EXPECT_EQ(files::base64_encode("hello"), "aGVsbG8=");
  EXPECT_EQ(files::base64_decode("aGVs\nbG8="), "hello");
  EXPECT_FALSE(files::base64_decode("a$b="));
  EXPECT_FALSE(files::base64_decode("aGVsbG8=x"));
  EXPECT_EQ(files::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Image previews run the ns-hpc binary as their decoder: their tests are in
// tests/integration/test_agent_results.cpp (ImagePreviews).

TEST(FilesResolve, AbsoluteLinksToTheSandboxMountsLeadWhereTheyLeadInTheSandbox) {
  Layout l;
  stdfs::create_directories(l.ws / "data");
  std::ofstream(l.ws / "data" / "d.txt") << "data";
  std::ofstream(l.out / "o.txt") << "out";
  stdfs::create_symlink("/workspace/data", l.ws / "wslink");       // a folder, by its sandbox path
  stdfs::create_symlink("/output", l.ws / "outlink");              // the other area
  stdfs::create_symlink("/output/o.txt", l.ws / "outfile");        // a file, last component
  stdfs::create_symlink("/etc", l.ws / "etclink");                 // outside: stays re-rooted
  files::InstanceFiles f(l.view());
  using F = files::InstanceFiles::Follow;
  EXPECT_EQ(slurp(files::open_read(f.resolve("wslink/d.txt")).fd.get()), "data");
  EXPECT_EQ(slurp(files::open_read(f.resolve("outlink/o.txt")).fd.get()), "out");
  EXPECT_EQ(f.resolve("outlink/o.txt").root, &f.output());
  EXPECT_EQ(slurp(files::open_read(f.resolve("outfile", F::last)).fd.get()), "out");
  // Not following the last component: the link itself (writes replace it, deletes remove it).
  EXPECT_EQ(f.resolve("outfile").rel, "outfile");
  EXPECT_EQ(f.resolve("outfile").root, &f.workspace());
  EXPECT_NE(error_of([&] { files::open_read(f.resolve("etclink/passwd", F::last)); }), 0);
  // A write through a linked folder lands where the sandbox would put it.
  auto p = files::begin_write(f.resolve("outlink/new.txt"), {});
  p->write("n");
  p->commit();
  EXPECT_EQ(slurp(l.out / "new.txt"), "n");
  // A loop ends.
  stdfs::create_symlink("/workspace/loop2", l.ws / "loop1");
  stdfs::create_symlink("/workspace/loop1", l.ws / "loop2");
  EXPECT_NE(error_of([&] { files::open_read(f.resolve("loop1/x", F::last)); }), 0);
}

// copy_file of a folder: every file and folder of the copy must be the tree's own, as read_file
// requires; the first that is not refuses the copy, naming it, and nothing of it is left.
TEST(FilesOps, ACopiedFolderRefusesFilesOfAnotherUidAndIsWholeOrNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a file of another uid is planted with chown";
  Layout l;
  auto v = l.owned_by(4243, 4244);
  stdfs::create_directories(l.ws / "d" / "sub");
  std::ofstream(l.ws / "d" / "a.txt") << "A";
  std::ofstream(l.ws / "d" / "sub" / "b.txt") << "B";
  std::ofstream(l.ws / "d" / "sub" / "secret") << "root only";  // planted from the host
  ::chmod((l.ws / "d" / "sub" / "secret").c_str(), 0600);
  for (auto rel : {"d", "d/a.txt", "d/sub", "d/sub/b.txt"}) ASSERT_EQ(::lchown((l.ws / rel).c_str(), 4243, 4244), 0);
  stdfs::create_directories(l.out / "kept");
  std::ofstream(l.out / "kept" / "old") << "old";
  for (auto rel : {"kept", "kept/old"}) ASSERT_EQ(::lchown((l.out / rel).c_str(), 4243, 4244), 0);
  files::InstanceFiles f(v);
  auto refusal = [&](const char* to, bool overwrite) -> std::string {
    try {
      files::copy(f.resolve("d"), f.resolve(to), overwrite);
    } catch (const SysError& e) {
      EXPECT_EQ(e.code(), EPERM) << e.what();
      return e.what();
    }
    return "copied";
  };
  const std::string said = refusal("/output/new", false);
  EXPECT_NE(said.find("/workspace/d/sub/secret (it belongs to uid 0, not to the sandbox's uid 4243)"), std::string::npos)
      << said;
  EXPECT_NE(refusal("/output/kept", true), "copied");
  // Nothing was made, and what was at the destination is still there.
  std::set<std::string> in_output;
  for (const auto& e : stdfs::directory_iterator(l.out)) in_output.insert(e.path().filename().string());
  EXPECT_EQ(in_output, std::set<std::string>{"kept"});
  EXPECT_EQ(slurp(l.out / "kept" / "old"), "old");
  // A folder of another uid refuses too (the sandbox may not enter a root 0700 folder).
  ASSERT_EQ(::lchown((l.ws / "d" / "sub" / "secret").c_str(), 4243, 4244), 0);
  ASSERT_EQ(::lchown((l.ws / "d" / "sub").c_str(), 0, 0), 0);
  EXPECT_NE(refusal("/output/new", false).find("/workspace/d/sub (it belongs to uid 0"), std::string::npos);
  EXPECT_FALSE(stdfs::exists(l.out / "new"));
  // All the tree's own: copied whole, over what was there, everything the sandbox's.
  ASSERT_EQ(::lchown((l.ws / "d" / "sub").c_str(), 4243, 4244), 0);
  files::copy(f.resolve("d"), f.resolve("/output/kept"), true);
  EXPECT_EQ(slurp(l.out / "kept" / "sub" / "secret"), "root only");
  EXPECT_FALSE(stdfs::exists(l.out / "kept" / "old"));
  for (auto rel : {"kept", "kept/a.txt", "kept/sub", "kept/sub/secret"}) {
    struct stat st;
    ASSERT_EQ(::lstat((l.out / rel).c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 4243u) << rel;
  }
  in_output.clear();
  for (const auto& e : stdfs::directory_iterator(l.out)) in_output.insert(e.path().filename().string());
  EXPECT_EQ(in_output, std::set<std::string>{"kept"});
}

TEST(FilesOps, ACancelledFolderCopyLeavesNothing) {
  Layout l;
  stdfs::create_directories(l.ws / "d" / "sub");
  for (int i = 0; i < 6; ++i) std::ofstream(l.ws / "d" / "sub" / std::to_string(i)) << i;
  ::chmod((l.ws / "d" / "sub").c_str(), 0555);  // a read-only folder is copied too
  files::InstanceFiles f(l.view());
  int asked = 0;
  EXPECT_EQ(error_of([&] { files::copy(f.resolve("d"), f.resolve("/output/d"), false, [&] { return ++asked > 4; }); }),
            ECANCELED);
  EXPECT_EQ(asked, 5);
  EXPECT_TRUE(stdfs::is_empty(l.out));
  files::copy(f.resolve("d"), f.resolve("/output/d"), false, [] { return false; });
  EXPECT_EQ(slurp(l.out / "d" / "sub" / "5"), "5");
  EXPECT_EQ(stdfs::status(l.out / "d" / "sub").permissions(), stdfs::perms(0555));
  ::chmod((l.out / "d" / "sub").c_str(), 0755);
  ::chmod((l.ws / "d" / "sub").c_str(), 0755);
}

TEST(FilesResolve, APathLongerThanPathMaxIsRefusedNamingTheLimit) {
  Layout l;
  files::InstanceFiles f(l.view());
  std::string path;
  while (path.size() < 80000) path += "a/";
  try {
    f.resolve(path);
    ADD_FAILURE() << "resolved a path of " << path.size() << " bytes";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the path is 80000 bytes; the limit is 4096 bytes"), std::string::npos)
        << e.what();
  }
  // An absolute link that makes the path too long on the way is refused the same.
  stdfs::create_symlink("/workspace/" + std::string(4000, 'x'), l.ws / "long");
  try {
    f.resolve("long/" + std::string(200, 'y'));
    ADD_FAILURE() << "resolved through a link to a path over 4096 bytes";
  } catch (const SysError& e) {
    EXPECT_EQ(e.code(), ENAMETOOLONG) << e.what();
    EXPECT_NE(std::string(e.what()).find("the limit is 4096"), std::string::npos) << e.what();
  }
}

// The walk costs a few system calls per component: 16 concurrent reads of a file 2,000 folders
// deep (and through an absolute link there) each get the file, and a missing component a clear
// ENOENT.
TEST(FilesResolve, SixteenConcurrentWalksOfTwoThousandComponentsEachGetTheirFile) {
  Layout l;
  constexpr int kDepth = 2000;
  std::string deep;
  {
    UniqueFd dir(::open(l.ws.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    for (int i = 0; i < kDepth; ++i) {
      ASSERT_EQ(::mkdirat(dir.get(), "a", 0755), 0);
      dir = UniqueFd(::openat(dir.get(), "a", O_PATH | O_DIRECTORY | O_CLOEXEC));
      ASSERT_TRUE(dir);
      deep += "a/";
    }
    UniqueFd file(::openat(dir.get(), "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_EQ(::write(file.get(), "deep", 4), 4);
    ASSERT_EQ(::symlinkat("/output/o.txt", dir.get(), "abs"), 0);
  }
  std::ofstream(l.out / "o.txt") << "out";
  files::InstanceFiles f(l.view());
  using F = files::InstanceFiles::Follow;
  std::vector<std::string> got(16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&, t] {
      const std::string path = deep + (t % 4 == 3 ? "missing/f" : t % 2 ? "abs" : "f");
      try {
        got[t] = slurp(files::open_read(f.resolve(path, F::last)).fd.get());
      } catch (const SysError& e) {
        got[t] = e.code() == ENOENT ? "ENOENT" : e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int t = 0; t < 16; ++t) EXPECT_EQ(got[t], t % 4 == 3 ? "ENOENT" : t % 2 ? "out" : "deep") << t;
  nshpc::fs::remove_tree(l.ws / "a");
}

// Issue 31: one identity regime for an instance's files, decided in one place.
TEST(FilesIdentity, OnlyARootServerActsAndOnlyAsAPlainInstancesUser) {
  const files::Owner plain{4243, 4244};
  auto acting = files::acting_identity(plain, /*as_root=*/true);
  ASSERT_TRUE(acting.has_value());
  EXPECT_EQ(acting->uid, 4243u);
  EXPECT_EQ(acting->gid, 4244u);
  EXPECT_FALSE(files::acting_identity(plain, /*as_root=*/false)) << "a normal user's server is the sandbox's uid";
  EXPECT_FALSE(files::acting_identity(std::nullopt, true)) << "no owner: this process's own files (a WebDAV extra)";
  EXPECT_FALSE(files::acting_identity(files::Owner{0, 0}, true));
  files::Owner image{1u << 20, 1u << 20, (1u << 20) + 1, 65535};
  EXPECT_FALSE(files::acting_identity(image, true)) << "an image instance's user is root of its namespace";
}

// As root, every operation beneath a plain instance's root has exactly its sandbox user's
// permissions: mode bits that keep that user out keep the server out too, with the errno the
// sandbox would get; afterwards the thread is root again.
TEST(FilesIdentity, AsRootOperationsHaveTheSandboxUsersPermissions) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a normal user's server already is its sandbox's user";
  Layout l;
  files::InstanceFiles f(l.owned_by(4243, 4244));
  auto own = [&](const stdfs::path& p, mode_t mode) {
    ASSERT_EQ(::lchown(p.c_str(), 4243, 4244), 0);
    ASSERT_EQ(::chmod(p.c_str(), mode), 0);
  };
  std::ofstream(l.ws / "ro.txt") << "frozen";
  own(l.ws / "ro.txt", 0444);
  std::ofstream(l.ws / "closed.txt") << "closed";
  own(l.ws / "closed.txt", 0000);
  stdfs::create_directories(l.ws / "shut");
  std::ofstream(l.ws / "shut" / "keep.txt") << "kept";
  own(l.ws / "shut" / "keep.txt", 0644);
  own(l.ws / "shut", 0555);
  std::ofstream(l.ws / "roots.txt") << "root's";  // a file of another uid, 0600
  ::chmod((l.ws / "roots.txt").c_str(), 0600);
  const auto before = fs_ids();
  ASSERT_EQ(before.first, 0u);
  std::vector<gid_t> groups(static_cast<std::size_t>(::getgroups(0, nullptr)));
  ::getgroups(static_cast<int>(groups.size()), groups.data());

  EXPECT_EQ(error_of([&] { files::begin_write(f.resolve("ro.txt"), {}); }), EACCES);
  EXPECT_EQ(error_of([&] { files::copy(f.resolve("closed.txt"), f.resolve("ro.txt"), true); }), EACCES);
  EXPECT_EQ(error_of([&] { files::open_read(f.resolve("closed.txt")); }), EACCES);
  EXPECT_EQ(error_of([&] { files::begin_write(f.resolve("shut/new.txt"), {}); }), EACCES);
  EXPECT_EQ(error_of([&] { files::make_dir(f.resolve("shut/sub"), false); }), EACCES);
  EXPECT_EQ(error_of([&] { files::remove(f.resolve("shut/keep.txt"), false); }), EACCES);
  EXPECT_EQ(error_of([&] { files::rename(f.resolve("shut/keep.txt"), f.resolve("moved.txt"), false); }), EACCES);
  EXPECT_EQ(error_of([&] { files::copy(f.resolve("shut/keep.txt"), f.resolve("shut/copy.txt"), false); }), EACCES);
  // A file of another uid is refused as such (EPERM), though its mode would refuse it too.
  try {
    files::open_read(f.resolve("roots.txt"));
    ADD_FAILURE() << "read a root-only file";
  } catch (const SysError& e) {
    EXPECT_EQ(e.code(), EPERM) << e.what();
    EXPECT_NE(std::string(e.what()).find("belongs to uid 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(l.ws / "ro.txt"), "frozen");
  EXPECT_EQ(slurp(l.ws / "shut" / "keep.txt"), "kept");
  EXPECT_FALSE(stdfs::exists(l.ws / "shut" / "new.txt"));
  EXPECT_FALSE(stdfs::exists(l.ws / "moved.txt"));

  // What the user may do works, and what is made is the user's.
  EXPECT_EQ(slurp(files::open_read(f.resolve("shut/keep.txt")).fd.get()), "kept");
  auto p = files::begin_write(f.resolve("new/file.txt"), {.create_parents = true});
  p->write("new");
  p->commit();
  files::rename(f.resolve("new/file.txt"), f.resolve("/output/moved.txt"), false);
  files::copy(f.resolve("shut"), f.resolve("/output/shut-copy"), false);
  for (auto path : {l.ws / "new", l.out / "moved.txt", l.out / "shut-copy", l.out / "shut-copy" / "keep.txt"}) {
    struct stat st;
    ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_uid, 4243u) << path;
    EXPECT_EQ(st.st_gid, 4244u) << path;
  }
  files::remove(f.resolve("/output/shut-copy"), true);  // a 0555 folder of its own: made writable, then removed
  EXPECT_FALSE(stdfs::exists(l.out / "shut-copy"));

  // Back to root, with its groups, whatever succeeded or failed.
  EXPECT_EQ(fs_ids(), before);
  std::vector<gid_t> now(static_cast<std::size_t>(::getgroups(0, nullptr)));
  ::getgroups(static_cast<int>(now.size()), now.data());
  EXPECT_EQ(now, groups);
  ::chmod((l.ws / "shut").c_str(), 0755);
}

// A normal user's server is its sandbox's user: a 0444 file of its own is not written either.
TEST(FilesIdentity, AReadOnlyFileIsNotReplaced) {
  Layout l;
  std::ofstream(l.ws / "ro.txt") << "frozen";
  ::chmod((l.ws / "ro.txt").c_str(), 0444);
  files::InstanceFiles f(::geteuid() == 0 ? l.owned_by(4243, 4244) : l.view());
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((l.ws / "ro.txt").c_str(), 4243, 4244), 0);
  }
  try {
    files::begin_write(f.resolve("ro.txt"), {});
    ADD_FAILURE() << "a 0444 file was opened for replacing";
  } catch (const SysError& e) {
    EXPECT_EQ(e.code(), EACCES);
    EXPECT_NE(std::string(e.what()).find("/workspace/ro.txt (mode 0444"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(l.ws / "ro.txt"), "frozen");
  // Made writable (as a command in the instance would), it is.
  ::chmod((l.ws / "ro.txt").c_str(), 0644);
  auto p = files::begin_write(f.resolve("ro.txt"), {});
  p->write("thawed");
  p->commit();
  EXPECT_EQ(slurp(l.ws / "ro.txt"), "thawed");
}
