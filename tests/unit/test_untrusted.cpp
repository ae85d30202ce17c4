// What the server does with things a sandbox controls: the safe resolver, tree walks that a deep
// or hostile tree cannot exhaust, audit lines that stay bounded and rotate without loss, limits
// that cannot be switched off, commands that cannot be cut by a NUL.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "audit/audit.hpp"
#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/safe_path.hpp"
#include "common/temp_dir.hpp"
#include "config/config.hpp"
#include "sandbox/bwrap_argv.hpp"

namespace stdfs = std::filesystem;
using namespace nshpc;
namespace nfs = nshpc::fs;
using nshpc::tests::TempDir;

namespace {

std::string read_fd(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(out.size()))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST(SafePath, ARegularFileOfTheExpectedOwnerIsRead) {
  TempDir t("nshpc-untrusted");
  std::ofstream(t.path() / "a.out") << "hello";
  UniqueFd dir = nfs::open_dir_path(t.path());
  nfs::Refusal refusal;
  UniqueFd fd = nfs::open_untrusted_file(dir.get(), "a.out", {.owner = ::geteuid()}, &refusal);
  ASSERT_TRUE(fd) << refusal.why;
  EXPECT_EQ(read_fd(fd.get()), "hello");
}

TEST(SafePath, LinksFifosHardLinksAndEscapesAreRefusedWithAReason) {
  TempDir t("nshpc-untrusted");
  const stdfs::path ws = t.path() / "ws";
  stdfs::create_directories(ws / "sub");
  std::ofstream(t.path() / "secret") << "secret";
  stdfs::create_symlink(t.path() / "secret", ws / "link");
  stdfs::create_symlink(t.path(), ws / "dirlink");
  stdfs::create_hard_link(t.path() / "secret", ws / "hard");
  ASSERT_EQ(::mkfifo((ws / "fifo").c_str(), 0600), 0);
  UniqueFd dir = nfs::open_dir_path(ws);
  struct Case {
    const char* path;
    int code;
    const char* says;
  } cases[] = {{"link", ELOOP, "symbolic link"},        {"dirlink/secret", ELOOP, "symbolic link"},
               {"hard", EPERM, "hard links"},           {"fifo", ENXIO, "not a regular file"},
               {"../secret", EXDEV, "leaves its folder"}, {"sub", ENXIO, "not a regular file"},
               {"missing", ENOENT, "does not exist"}};
  for (const Case& c : cases) {
    nfs::Refusal refusal;
    UniqueFd fd = nfs::open_untrusted_file(dir.get(), c.path, {}, &refusal);  // a FIFO must not block
    EXPECT_FALSE(fd) << c.path;
    EXPECT_EQ(refusal.code, c.code) << c.path << ": " << refusal.why;
    EXPECT_NE(refusal.why.find(c.says), std::string::npos) << c.path << ": " << refusal.why;
  }
  nfs::Refusal refusal;
  EXPECT_FALSE(nfs::open_untrusted_file(dir.get(), "sub/../../secret", {}, &refusal)) << refusal.why;
  EXPECT_FALSE(nfs::open_untrusted_file(dir.get(), "/etc/passwd", {}, &refusal));
}

TEST(SafePath, AFileOfAnotherOwnerIsRefused) {
  TempDir t("nshpc-untrusted");
  std::ofstream(t.path() / "f") << "x";
  UniqueFd dir = nfs::open_dir_path(t.path());
  nfs::Refusal refusal;
  EXPECT_FALSE(nfs::open_untrusted_file(dir.get(), "f", {.owner = ::geteuid() + 1}, &refusal));
  EXPECT_EQ(refusal.code, EPERM);
  EXPECT_NE(refusal.why.find("belongs to uid"), std::string::npos) << refusal.why;
}

TEST(SafePath, ALinkSwappedInWhileOpeningNeverLeadsOutside) {
  TempDir t("nshpc-untrusted");
  const stdfs::path ws = t.path() / "ws";
  stdfs::create_directories(ws);
  std::ofstream(t.path() / "secret") << "SECRET";
  std::ofstream(ws / "plain") << "plain";
  stdfs::create_symlink(t.path() / "secret", ws / "evil");
  std::atomic<bool> stop{false};
  // The "sandbox": swaps the name between a regular file and a link to the secret, forever.
  std::thread swapper([&] {
    while (!stop) {
      ::rename((ws / "plain").c_str(), (ws / "name").c_str());
      ::rename((ws / "name").c_str(), (ws / "plain").c_str());
      stdfs::create_symlink(t.path() / "secret", ws / "tmp-link");
      ::rename((ws / "tmp-link").c_str(), (ws / "name").c_str());
      ::unlink((ws / "name").c_str());
    }
  });
  UniqueFd dir = nfs::open_dir_path(ws);
  int opened = 0;
  for (int i = 0; i < 20000; ++i) {
    UniqueFd fd = nfs::open_untrusted_file(dir.get(), "name", {});
    if (!fd) continue;
    ++opened;
    EXPECT_NE(read_fd(fd.get()), "SECRET");
  }
  stop = true;
  swapper.join();
  (void)opened;
}

TEST(SafePath, CreateBeneathRefusesALinkedParentAndReplacesAPlantedEntry) {
  TempDir t("nshpc-untrusted");
  const stdfs::path ws = t.path() / "ws", host = t.path() / "host";
  stdfs::create_directories(ws);
  stdfs::create_directories(host);
  stdfs::create_symlink(host, ws / "out");
  UniqueFd dir = nfs::open_dir_path(ws);
  try {
    nfs::create_beneath(dir.get(), "out/job.out", 0644, std::nullopt);
    FAIL() << "created a file through a symlinked folder";
  } catch (const SysError& e) {
    EXPECT_TRUE(e.code() == ELOOP || e.code() == ENOTDIR) << e.what();
  }
  EXPECT_TRUE(stdfs::is_empty(host));
  stdfs::remove(ws / "out");
  // Missing folder: made; a planted link at the file's name: removed, never followed.
  UniqueFd fd = nfs::create_beneath(dir.get(), "out/job.out", 0644, std::nullopt);
  ASSERT_TRUE(fd);
  fd.reset();
  stdfs::remove(ws / "out" / "job.out");
  stdfs::create_symlink(host / "victim", ws / "out" / "job.out");
  fd = nfs::create_beneath(dir.get(), "out/job.out", 0644, std::nullopt);
  ASSERT_TRUE(fd);
  EXPECT_FALSE(stdfs::exists(host / "victim"));
  EXPECT_TRUE(stdfs::is_regular_file(stdfs::symlink_status(ws / "out" / "job.out")));
}

TEST(TreeWalk, ADeepChainIsRemovedAndMeasuredWithFewDescriptors) {
  TempDir t("nshpc-untrusted");
  const stdfs::path top = t.path() / "deep";
  stdfs::create_directories(top);
  // 2,000 levels, made with relative mkdirs (the full path is far longer than PATH_MAX).
  UniqueFd cur(::open(top.c_str(), O_RDONLY | O_DIRECTORY));
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(::mkdirat(cur.get(), "d", 0755), 0);
    cur.reset(::openat(cur.get(), "d", O_RDONLY | O_DIRECTORY));
    ASSERT_TRUE(cur);
  }
  int leaf = ::openat(cur.get(), "leaf", O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(leaf, 0);
  ASSERT_EQ(::write(leaf, "1234", 4), 4);
  ::close(leaf);
  ::chmod(top.c_str(), 0500);  // a read-only folder on the way, as a sandbox could leave
  cur.reset();
  // In a child with a small descriptor limit: one descriptor per level would hit EMFILE.
  pid_t pid = ::fork();
  if (pid == 0) {
    rlimit small{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &small);
    try {
      const auto usage = nfs::tree_usage(top);
      if (usage.files != 1 || usage.folders != 2000) ::_exit(2);
      nfs::remove_tree(top);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      ::_exit(1);
    }
    ::_exit(stdfs::exists(top) ? 3 : 0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(TreeWalk, UsageCountsBlocksNeverFollowsLinks) {
  TempDir t("nshpc-untrusted");
  stdfs::create_directories(t.path() / "ws" / "a");
  std::ofstream(t.path() / "ws" / "a" / "f") << std::string(100000, 'x');
  std::ofstream(t.path() / "big") << std::string(5000000, 'x');
  stdfs::create_symlink(t.path() / "big", t.path() / "ws" / "link");
  stdfs::create_directory_symlink(t.path(), t.path() / "ws" / "loop");
  const auto usage = nfs::tree_usage(t.path() / "ws");
  EXPECT_EQ(usage.files, 3u);  // f, link, loop (links are entries, not followed)
  EXPECT_GE(usage.bytes, 100000u);
  EXPECT_LT(usage.bytes, 1000000u);
}

TEST(AuditLine, ALongArgvMakesABoundedLineWithAMarkerAndTheHash) {
  std::vector<std::string> argv(20000, std::string(100, 'a'));
  const std::string line = audit::format_line("job.running", "mcp:x", {{"command", argv}, {"job_id", "abc"}});
  EXPECT_LE(line.size(), audit::kMaxLineBytes);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  auto j = nshpc::parse_json(line);
  EXPECT_EQ(j["job_id"], "abc");
  const std::string command = j["command"].get<std::string>();
  EXPECT_NE(command.find("…[cut: "), std::string::npos);
  EXPECT_NE(command.find("sha256 "), std::string::npos);
  // A long string alone is cut too, keeping its start.
  const std::string s = audit::format_line("e", "a", {{"out", std::string(100000, 'z')}});
  EXPECT_LE(s.size(), 10000u);
  EXPECT_NE(s.find("zzzz"), std::string::npos);
  // Many fields that are each small still make a bounded line.
  nlohmann::json many = nlohmann::json::object();
  for (int i = 0; i < 20000; ++i) many["k" + std::to_string(i)] = "v";
  EXPECT_LE(audit::format_line("e", "a", many).size(), audit::kMaxLineBytes);
}

TEST(AuditLog, RotationUnderConcurrentWritersLosesAndDuplicatesNothing) {
  TempDir t("nshpc-untrusted");
  const stdfs::path log = t.path() / "audit.log";
  constexpr int kWriters = 6, kLines = 300;
  const audit::Rotation rotation{.max_bytes = 64 * 1024, .keep = 100};
  ASSERT_NO_FATAL_FAILURE(nshpc::tests::run_in_children(kWriters, [&](int w) {
    for (int i = 0; i < kLines; ++i)
      audit::append(log, "e", "t", {{"w", w}, {"i", i}, {"pad", std::string(300, 'p')}}, rotation);
  }));
  std::set<std::pair<int, int>> seen;
  int files = 0;
  for (const auto& entry : stdfs::directory_iterator(t.path())) {
    if (entry.path().filename().string().rfind("audit.log", 0) != 0) continue;
    ++files;
    EXPECT_LE(stdfs::file_size(entry.path()), rotation.max_bytes) << entry.path();
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      auto j = nshpc::parse_json_or_discarded(line);
      ASSERT_TRUE(j.is_object()) << "interleaved line in " << entry.path();
      EXPECT_TRUE(seen.emplace(j["w"].get<int>(), j["i"].get<int>()).second) << "duplicated " << line.substr(0, 40);
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kWriters * kLines)) << "lines lost";
  EXPECT_GT(files, 5);
}

TEST(AuditLog, OnlyKeepRotatedFilesStay) {
  TempDir t("nshpc-untrusted");
  const stdfs::path log = t.path() / "audit.log";
  for (int i = 0; i < 400; ++i) audit::append(log, "e", "t", {{"pad", std::string(500, 'p')}}, {.max_bytes = 8192, .keep = 2});
  EXPECT_TRUE(stdfs::exists(log));
  EXPECT_TRUE(stdfs::exists(t.path() / "audit.log.1"));
  EXPECT_TRUE(stdfs::exists(t.path() / "audit.log.2"));
  EXPECT_FALSE(stdfs::exists(t.path() / "audit.log.3"));
}

TEST(LocalLimits, EveryKnownLocalLimitHasAMinimumAboveZero) {
  for (const char* name : {"cpus", "memory", "pids", "time", "output"}) {
    auto min = config::local_limit_minimum(name);
    ASSERT_TRUE(min) << name;
    EXPECT_GE(*min, 1) << name;
  }
  EXPECT_FALSE(config::local_limit_minimum("gpus"));
}

TEST(CommandCheck, NulBytesAreRefused) {
  EXPECT_THROW(sandbox::check_command({"echo", std::string("a\0b", 3)}), UsageError);
  EXPECT_THROW(sandbox::check_command({"pwd"}, std::string_view("/ws\0/etc", 8)), UsageError);
  EXPECT_NO_THROW(sandbox::check_command({"echo", "ok"}, "/workspace"));
}
