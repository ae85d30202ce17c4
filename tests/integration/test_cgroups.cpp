// Per-job cgroups against the real kernel: real groups created, joined, limited, killed and
// removed. Tests that need a writable controller skip (with the probe's reason) when not root
// or when the host lacks it. What needs no kernel cgroups is in tests/unit/test_cgroups.cpp.
#include "sandbox/cgroups.hpp"

#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "harness.hpp"

namespace {

namespace sb = nshpc::sandbox;
namespace stdfs = std::filesystem;
using namespace std::chrono_literals;
using nshpc::test::eventually;

const sb::CgroupSupport& support() {
  static const sb::CgroupSupport s = sb::probe_cgroups();
  return s;
}

#define REQUIRE_ROOT() \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (or a delegated cgroup) to write cgroups"
#define REQUIRE(what)                                                                   \
  REQUIRE_ROOT();                                                                       \
  if (!support().what) GTEST_SKIP() << "no usable " #what " cgroup here: " << support().detail

std::string unique_name(const std::string& what) {
  static int counter = 0;
  return fmt::format("test-{}-{}-{}", ::getpid(), what, ++counter);
}

std::string slurp(const stdfs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool contains(const std::vector<pid_t>& v, pid_t pid) {
  return std::find(v.begin(), v.end(), pid) != v.end();
}

// Kills whatever is left in the group (also when an assertion failed), then destroys it, which
// removes the folders.
struct GroupGuard {
  std::unique_ptr<sb::Cgroup> cg;
  explicit GroupGuard(std::unique_ptr<sb::Cgroup> c) : cg(std::move(c)) {}
  ~GroupGuard() {
    if (!cg) return;
    try {
      cg->kill(2000);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "cleanup kill: " << e.what();
    }
    cg.reset();
  }
  sb::Cgroup* operator->() const { return cg.get(); }
};

// Makes this process the reaper of orphaned grandchildren for one test, and reaps them at the
// end (they are dead by then: the group was killed before this is destroyed).
struct SubreaperScope {
  SubreaperScope() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~SubreaperScope() {
    const auto deadline = std::chrono::steady_clock::now() + 1s;
    for (;;) {
      pid_t r = ::waitpid(-1, nullptr, WNOHANG);
      if (r > 0) continue;
      if (r < 0 || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(5ms);
    }
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }
};

// A forked child that joined the group through procs_fds() before running `body`.
struct Child {
  pid_t pid = -1;
  nshpc::UniqueFd report;  // what the child wrote to its report descriptor

  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  // Reads exactly `n` bytes within `timeout_ms`.
  bool read_exact(void* buf, size_t n, int timeout_ms) {
    auto* p = static_cast<char*>(buf);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (n > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{report.get(), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      ssize_t r = ::read(report.get(), p, n);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }

  // The wait status, or nullopt after `timeout_ms`.
  std::optional<int> wait(int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int status = 0;
      pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return status;
      }
      if (r < 0 || std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(2ms);
    }
  }
};

// Forks; the child writes "0" to every descriptor (joining the group), reports 'R', then exits
// with body(report_fd). Returns once the child has joined.
void start_in_group(Child& c, const std::vector<int>& join_fds, const std::function<int(int)>& body) {
  nshpc::Pipe pipe = nshpc::make_pipe();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    pipe.read.reset();
    for (int fd : join_fds)
      if (::write(fd, "0", 1) != 1) ::_exit(120);
    char ready = 'R';
    if (::write(pipe.write.get(), &ready, 1) != 1) ::_exit(121);
    ::_exit(body(pipe.write.get()));
  }
  c.pid = pid;
  c.report = std::move(pipe.read);
  pipe.write.reset();
  char ready = 0;
  ASSERT_TRUE(c.read_exact(&ready, 1, 2000)) << "child did not join the group";
  ASSERT_EQ(ready, 'R');
}

int sleep_forever(int) {
  for (;;) ::pause();
}

// setsid(), ignores SIGTERM, forks grandchildren (one double-forked daemon, one that keeps
// forking), reports 'G', then waits.
int stubborn_tree(int report) {
  ::setsid();
  ::signal(SIGTERM, SIG_IGN);
  for (int i = 0; i < 3; ++i) {  // grandchildren that ignore SIGTERM too
    if (::fork() == 0) {
      for (;;) ::pause();
    }
  }
  if (::fork() == 0) {  // a daemon: double fork, the middle one exits
    if (::fork() == 0) {
      for (;;) ::pause();
    }
    ::_exit(0);
  }
  if (::fork() == 0) {  // keeps forking short-lived children
    for (;;) {
      pid_t p = ::fork();
      if (p == 0) ::_exit(0);
      if (p > 0) ::waitpid(p, nullptr, 0);
    }
  }
  char done = 'G';
  if (::write(report, &done, 1) != 1) return 1;
  for (;;) ::pause();
}

// The mount point of the first cgroup file system of `fstype` ("cgroup" for v1 ones with
// memory, cpu or pids), or "" when there is none.
std::string cgroup_mount(const std::string& fstype) {
  std::istringstream in(slurp("/proc/self/mountinfo"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    auto dash = std::find(f.begin(), f.end(), "-");
    if (dash == f.end() || f.end() - dash < 4 || f.size() < 5 || *(dash + 1) != fstype) continue;
    if (fstype == "cgroup2") return f[4];
    const std::string opts = "," + *(dash + 3) + ",";
    for (const char* c : {",pids,", ",memory,", ",cpu,"})
      if (opts.find(c) != std::string::npos) return f[4];
  }
  return "";
}

}  // namespace

// ---- as root, against the real kernel ----------------------------------------------------------

// What doctor shows: the controllers the probe reports are the ones this machine has.
TEST(Cgroups, ProbeReportsTheControllersThisMachineHas) {
  const auto& s = support();
  EXPECT_EQ(s.detail.find('\n'), std::string::npos) << s.detail;
  REQUIRE_ROOT();
  EXPECT_TRUE(s.kill) << s.detail;
  // What /proc/self/mountinfo shows (v1 super options, or the v2 root's controllers).
  std::string mountinfo = slurp("/proc/self/mountinfo");
  std::string v2controllers = slurp("/sys/fs/cgroup/cgroup.controllers");
  auto mounted = [&](const std::string& c) {
    std::istringstream in(mountinfo);
    for (std::string line; std::getline(in, line);) {
      auto dash = line.find(" - cgroup cgroup ");
      if (dash == std::string::npos) continue;
      std::string opts = "," + line.substr(line.rfind(' ') + 1) + ",";
      if (opts.find("," + c + ",") != std::string::npos) return true;
    }
    std::istringstream v2(v2controllers);
    for (std::string w; v2 >> w;)
      if (w == c) return true;
    return false;
  };
  // As root every controller the machine has is usable, and none it lacks is claimed; the
  // detail line names each one it reports.
  EXPECT_EQ(s.memory, mounted("memory")) << s.detail;
  EXPECT_EQ(s.cpu, mounted("cpu")) << s.detail;
  EXPECT_EQ(s.pids, mounted("pids")) << s.detail;
  for (const auto& [c, usable] : {std::pair{"memory", s.memory}, std::pair{"cpu", s.cpu}, std::pair{"pids", s.pids}})
    if (usable) {
      EXPECT_NE(s.detail.find(c), std::string::npos) << c << " missing from: " << s.detail;
    }
  if (!v2controllers.empty()) {
    EXPECT_NE(s.detail.find("v2 ("), std::string::npos) << s.detail;
  }

  // The probe group is gone again.
  std::vector<std::string> unenforced;
  GroupGuard g(sb::Cgroup::create(unique_name("probecheck"), {}, unenforced));
  ASSERT_FALSE(g->paths().empty());
  for (const auto& p : g->paths())
    EXPECT_FALSE(stdfs::exists(p.parent_path() / fmt::format("probe-{}", ::getpid()))) << p;
}

TEST(Cgroups, WritesLimits) {
  REQUIRE(memory);
  REQUIRE(cpu);
  REQUIRE(pids);
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.cpus = 0.5;
  limits.memory_bytes = 64u << 20;
  limits.pids = 20;
  GroupGuard g(sb::Cgroup::create(unique_name("limits"), limits, unenforced));
  EXPECT_TRUE(unenforced.empty()) << unenforced.front();
  bool memory = false, cpu = false, pids = false;
  for (const auto& p : g->paths()) {
    EXPECT_EQ(p.parent_path().filename(), "ns-hpc");
    if (stdfs::exists(p / "memory.limit_in_bytes")) {
      EXPECT_EQ(std::stoull(slurp(p / "memory.limit_in_bytes")), 64u << 20);
      if (stdfs::exists(p / "memory.memsw.limit_in_bytes")) {
        EXPECT_EQ(std::stoull(slurp(p / "memory.memsw.limit_in_bytes")), 64u << 20);
      }
      memory = true;
    } else if (stdfs::exists(p / "memory.max")) {
      EXPECT_EQ(std::stoull(slurp(p / "memory.max")), 64u << 20);
      memory = true;
    }
    if (stdfs::exists(p / "cpu.cfs_quota_us")) {
      EXPECT_EQ(std::stoll(slurp(p / "cpu.cfs_quota_us")), 50000);
      EXPECT_EQ(std::stoll(slurp(p / "cpu.cfs_period_us")), 100000);
      cpu = true;
    } else if (stdfs::exists(p / "cpu.max")) {
      EXPECT_EQ(slurp(p / "cpu.max"), "50000 100000\n");
      cpu = true;
    }
    if (stdfs::exists(p / "pids.max")) {
      EXPECT_EQ(slurp(p / "pids.max"), "20\n");
      pids = true;
    }
  }
  EXPECT_TRUE(memory && cpu && pids);
}

TEST(Cgroups, ChildJoiningAppearsInMembers) {
  REQUIRE(kill);
  std::vector<std::string> unenforced;
  GroupGuard g(sb::Cgroup::create(unique_name("members"), {}, unenforced));
  EXPECT_TRUE(unenforced.empty());
  ASSERT_FALSE(g->paths().empty());
  EXPECT_TRUE(g->empty());
  auto fds = g->procs_fds();
  EXPECT_EQ(fds.size(), g->paths().size());
  EXPECT_EQ(g->procs_fds(), fds);  // the same (owned) descriptors every time
  Child c;
  start_in_group(c, fds, sleep_forever);
  auto members = g->members();
  EXPECT_EQ(members, std::vector<pid_t>{c.pid});
  EXPECT_FALSE(g->empty());
  EXPECT_FALSE(contains(members, ::getpid()));
  EXPECT_TRUE(g->kill(2000));
  auto status = c.wait(2000);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
  EXPECT_TRUE(g->empty());
  EXPECT_TRUE(g->members().empty());
}

TEST(Cgroups, MemoryHogIsOomKilled) {
  REQUIRE(memory);
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.memory_bytes = 64u << 20;
  GroupGuard g(sb::Cgroup::create(unique_name("oom"), limits, unenforced));
  ASSERT_TRUE(unenforced.empty()) << unenforced.front();
  EXPECT_FALSE(g->oom_killed());
  Child c;
  start_in_group(c, g->procs_fds(), [](int) {
    std::vector<char*> chunks;
    for (int i = 0; i < 300; ++i) {
      auto* p = static_cast<char*>(std::malloc(1 << 20));
      if (!p) return 3;
      std::memset(p, i + 1, 1 << 20);
      chunks.push_back(p);
    }
    return 0;  // not stopped
  });
  auto status = c.wait(2500);
  ASSERT_TRUE(status) << "the hog was not stopped";
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << "status " << *status;
  EXPECT_TRUE(g->oom_killed());
  auto peak = g->memory_peak();
  ASSERT_TRUE(peak);
  EXPECT_GE(*peak, 32u << 20);
  EXPECT_LE(*peak, 66u << 20);
}

TEST(Cgroups, PidsLimitStopsForkLoop) {
  REQUIRE(pids);
  SubreaperScope reaper;
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.pids = 20;
  GroupGuard g(sb::Cgroup::create(unique_name("pids"), limits, unenforced));
  ASSERT_TRUE(unenforced.empty()) << unenforced.front();
  Child c;
  start_in_group(c, g->procs_fds(), [](int report) {
    int forked = 0, err = 0;
    for (int i = 0; i < 100; ++i) {
      pid_t p = ::fork();
      if (p == 0) {
        for (;;) ::pause();
      }
      if (p < 0) {
        err = errno;
        break;
      }
      ++forked;
    }
    int result[2] = {forked, err};
    if (::write(report, result, sizeof result) != sizeof result) return 1;
    for (;;) ::pause();
  });
  int result[2] = {-1, -1};
  ASSERT_TRUE(c.read_exact(result, sizeof result, 2500));
  EXPECT_EQ(result[1], EAGAIN) << std::strerror(result[1]);
  EXPECT_GE(result[0], 1);
  EXPECT_LE(result[0], 19);  // the child itself counts
  EXPECT_EQ(g->members().size(), static_cast<size_t>(result[0]) + 1);
  EXPECT_TRUE(g->kill(2000));
  EXPECT_TRUE(c.wait(2000));
  EXPECT_TRUE(g->empty());
}

// The share of a core a process spinning for one second got (reported on `report`).
int spin_one_second(int report) {
  auto seconds = [](clockid_t clock) {
    timespec ts{};
    ::clock_gettime(clock, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  const double wall0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
  volatile unsigned long spin = 0;
  while (seconds(CLOCK_MONOTONIC) - wall0 < 1.0)
    for (int i = 0; i < 10000; ++i) spin = spin + 1;
  const double share = (seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / (seconds(CLOCK_MONOTONIC) - wall0);
  return ::write(report, &share, sizeof share) == sizeof share ? 0 : 1;
}

// nr_throttled of the group's cpu controller (cpu.stat on v1 and v2).
std::optional<std::uint64_t> times_throttled(const sb::Cgroup& g) {
  for (const auto& p : g.paths()) {
    if (!stdfs::exists(p / "cpu.max") && !stdfs::exists(p / "cpu.cfs_quota_us")) continue;
    std::istringstream in(slurp(p / "cpu.stat"));
    for (std::string key; in >> key;) {
      std::uint64_t value = 0;
      in >> value;
      if (key == "nr_throttled") return value;
    }
  }
  return std::nullopt;
}

// A quota is a ceiling, not a promise: on a loaded machine the job may get less than its half
// core, never more. So: the limited spinner's share stays under the quota (plus one period of
// slack), and when an unlimited spinner beside it got clearly more than the quota, the limited
// one was throttled (the quota, not the load, held it back).
TEST(Cgroups, CpuQuotaHalfCoreIsACeiling) {
  REQUIRE(cpu);
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.cpus = 0.5;
  GroupGuard g(sb::Cgroup::create(unique_name("cpu"), limits, unenforced));
  ASSERT_TRUE(unenforced.empty()) << unenforced.front();
  Child limited, unlimited;
  start_in_group(limited, g->procs_fds(), spin_one_second);
  start_in_group(unlimited, {}, spin_one_second);
  double limited_share = -1, unlimited_share = -1;
  ASSERT_TRUE(limited.read_exact(&limited_share, sizeof limited_share, 10000));
  ASSERT_TRUE(unlimited.read_exact(&unlimited_share, sizeof unlimited_share, 10000));
  EXPECT_LE(limited_share, 0.5 + 0.1) << "unlimited beside it: " << unlimited_share;
  if (unlimited_share > 0.75) {
    const auto throttled = times_throttled(*g.cg);
    ASSERT_TRUE(throttled) << "no cpu.stat in the group";
    EXPECT_GT(*throttled, 0u) << "limited " << limited_share << ", unlimited " << unlimited_share;
  }
  for (Child* c : {&limited, &unlimited}) {
    auto status = c->wait(5000);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
}

TEST(Cgroups, KillTakesDownSessionLeaderIgnoringTermWithGrandchildren) {
  REQUIRE(kill);
  SubreaperScope reaper;
  std::vector<std::string> unenforced;
  GroupGuard g(sb::Cgroup::create(unique_name("kill"), {}, unenforced));
  Child c;
  start_in_group(c, g->procs_fds(), stubborn_tree);
  char done = 0;
  ASSERT_TRUE(c.read_exact(&done, 1, 2000));
  EXPECT_TRUE(eventually([&] { return g->members().size() >= 6; }, 5s)) << g->members().size();
  g->signal_all(SIGTERM);  // ignored by all of them
  EXPECT_FALSE(c.wait(100));             // the leader is still there ...
  EXPECT_GE(g->members().size(), 6u);    // ... and so is its tree
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(g->kill(2500));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_TRUE(g->empty());
  EXPECT_TRUE(g->members().empty());
  auto status = c.wait(1000);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
}

TEST(Cgroups, SignalAllReachesMembers) {
  REQUIRE(kill);
  std::vector<std::string> unenforced;
  GroupGuard g(sb::Cgroup::create(unique_name("signal"), {}, unenforced));
  Child a, b;
  start_in_group(a, g->procs_fds(), sleep_forever);
  start_in_group(b, g->procs_fds(), sleep_forever);
  EXPECT_EQ(g->members().size(), 2u);
  g->signal_all(SIGTERM);
  for (Child* c : {&a, &b}) {
    auto status = c->wait(2000);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGTERM);
  }
  EXPECT_TRUE(g->empty());
}

TEST(Cgroups, AttachToExistingGroup) {
  REQUIRE(kill);
  std::vector<std::string> unenforced;
  GroupGuard first(sb::Cgroup::create(unique_name("attach"), {}, unenforced));
  const auto paths = first->paths();
  Child c;
  start_in_group(c, first->procs_fds(), sleep_forever);
  {
    auto again = sb::Cgroup::attach(paths);
    EXPECT_EQ(again->paths(), paths);
    EXPECT_EQ(again->members(), std::vector<pid_t>{c.pid});
    EXPECT_TRUE(again->kill(2000));
    auto status = c.wait(2000);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
    EXPECT_TRUE(first->empty());
  }  // the attached object removes the groups
  for (const auto& p : paths) EXPECT_FALSE(stdfs::exists(p)) << p;
  EXPECT_NO_THROW(first->remove());  // already gone: fine
  try {
    sb::Cgroup::attach(paths);
    ADD_FAILURE() << "expected SysError";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), ENOENT);
  }
}

TEST(Cgroups, DestructionRemovesFolders) {
  REQUIRE(kill);
  const std::string inst = unique_name("inst");
  std::vector<std::string> unenforced;
  auto cg = sb::Cgroup::create(inst + "/job-1", {}, unenforced);
  const auto paths = cg->paths();
  ASSERT_FALSE(paths.empty());
  for (const auto& p : paths) {
    EXPECT_TRUE(stdfs::is_directory(p)) << p;
    EXPECT_EQ(p.filename(), "job-1");
    EXPECT_EQ(p.parent_path().filename(), inst);
    EXPECT_EQ(p.parent_path().parent_path().filename(), "ns-hpc");
  }
  cg.reset();
  for (const auto& p : paths) {
    EXPECT_FALSE(stdfs::exists(p)) << p;
    EXPECT_FALSE(stdfs::exists(p.parent_path())) << p.parent_path();
  }
}

TEST(Cgroups, RemovingBusyGroupFailsWithErrnoAndPath) {
  REQUIRE(kill);
  std::vector<std::string> unenforced;
  GroupGuard g(sb::Cgroup::create(unique_name("busy"), {}, unenforced));
  Child c;
  start_in_group(c, g->procs_fds(), sleep_forever);
  try {
    g->remove();
    ADD_FAILURE() << "expected SysError";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), EBUSY) << e.what();
    EXPECT_NE(std::string(e.what()).find(g->paths().front().string()), std::string::npos) << e.what();
  }
  EXPECT_TRUE(g->kill(2000));
  EXPECT_TRUE(c.wait(2000));
  EXPECT_NO_THROW(g->remove());
  for (const auto& p : g->paths()) EXPECT_FALSE(stdfs::exists(p)) << p;
}

TEST(Cgroups, ExistingEmptyGroupIsReusedButBusyOneIsRefused) {
  REQUIRE(kill);
  const std::string name = unique_name("dup");
  std::vector<std::string> unenforced;
  GroupGuard left_over(sb::Cgroup::create(name, {}, unenforced));
  GroupGuard g(sb::Cgroup::create(name, {}, unenforced));  // the empty left-over is taken over
  EXPECT_EQ(g->paths(), left_over->paths());
  Child c;
  start_in_group(c, g->procs_fds(), sleep_forever);
  try {
    sb::Cgroup::create(name, {}, unenforced);
    ADD_FAILURE() << "expected SysError";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), EBUSY) << e.what();
  }
  EXPECT_EQ(g->members(), std::vector<pid_t>{c.pid});  // the refused create left it alone
  EXPECT_TRUE(g->kill(2000));
  EXPECT_TRUE(c.wait(2000));
}

// The two kill paths on their own, by pointing mount_root at one hierarchy.
static void kill_tree_in_one_hierarchy(const std::string& mount, bool expect_kill_file) {
  SubreaperScope reaper;
  std::vector<std::string> unenforced;
  GroupGuard g(sb::Cgroup::create(unique_name("onekill"), {}, unenforced, mount));
  EXPECT_TRUE(unenforced.empty()) << unenforced.front();
  ASSERT_EQ(g->paths().size(), 1u);
  EXPECT_EQ(stdfs::exists(g->paths()[0] / "cgroup.kill"), expect_kill_file);
  Child c;
  start_in_group(c, g->procs_fds(), stubborn_tree);
  char done = 0;
  ASSERT_TRUE(c.read_exact(&done, 1, 2000));
  EXPECT_TRUE(eventually([&] { return g->members().size() >= 6; }, 5s)) << g->members().size();
  EXPECT_TRUE(g->kill(2500));
  EXPECT_TRUE(g->empty());
  auto status = c.wait(1000);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
}

TEST(Cgroups, KillWithoutCgroupKillSignalsEveryMember) {
  REQUIRE_ROOT();
  const std::string mount = cgroup_mount("cgroup");
  if (mount.empty()) GTEST_SKIP() << "no cgroup v1 hierarchy with memory, cpu or pids";
  kill_tree_in_one_hierarchy(mount, false);
}

TEST(Cgroups, KillThroughCgroupKillOnV2) {
  REQUIRE_ROOT();
  const std::string mount = cgroup_mount("cgroup2");
  if (mount.empty()) GTEST_SKIP() << "no cgroup2 mount";
  kill_tree_in_one_hierarchy(mount, true);
}

TEST(Cgroups, LimitsMissingFromTheOnlyHierarchyAreListedNotThrown) {
  REQUIRE_ROOT();
  const std::string mount = cgroup_mount("cgroup2");
  if (mount.empty()) GTEST_SKIP() << "no cgroup2 mount";
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.cpus = 1;
  limits.memory_bytes = 64u << 20;
  limits.pids = 100;
  GroupGuard g(sb::Cgroup::create(unique_name("partial"), limits, unenforced, mount));
  ASSERT_EQ(g->paths().size(), 1u);
  for (const auto& u : unenforced) {
    EXPECT_TRUE(u.rfind("memory: ", 0) == 0 || u.rfind("cpu: ", 0) == 0 || u.rfind("pids: ", 0) == 0 ||
                u.rfind("memory+swap: ", 0) == 0)
        << u;
  }
}

// An instance's folder: limits written on it bound the groups made below it (a fork loop in a
// leaf with no limit of its own stops at the folder's pids), usage() reads them back with what
// is used, a limit taken out is taken off, and the folder goes once nothing is below it.
TEST(Cgroups, AFolderBoundsTheGroupsBelowItAndTakesLimitsOff) {
  REQUIRE(pids);
  SubreaperScope reaper;
  const std::string folder = unique_name("instance");
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.pids = 20;
  sb::Cgroup::limit_folder(folder, limits, unenforced);
  ASSERT_TRUE(unenforced.empty()) << unenforced.front();
  GroupGuard leaf(sb::Cgroup::create(folder + "/leaf", {}, unenforced));
  ASSERT_TRUE(unenforced.empty()) << unenforced.front();
  auto usage = sb::Cgroup::usage(folder);
  ASSERT_TRUE(usage);
  EXPECT_EQ(usage->pids_max, 20u);
  EXPECT_EQ(usage->pids, 0u);

  Child c;
  start_in_group(c, leaf->procs_fds(), [](int report) {
    int forked = 0;
    for (int i = 0; i < 100; ++i) {
      pid_t p = ::fork();
      if (p == 0) {
        for (;;) ::pause();
      }
      if (p < 0) break;
      ++forked;
    }
    if (::write(report, &forked, sizeof forked) != sizeof forked) return 1;
    for (;;) ::pause();
  });
  int forked = -1;
  ASSERT_TRUE(c.read_exact(&forked, sizeof forked, 2500));
  EXPECT_GE(forked, 1);
  EXPECT_LE(forked, 19) << "the leaf has no limit: only the folder's 20 can stop it";
  usage = sb::Cgroup::usage(folder);
  ASSERT_TRUE(usage);
  EXPECT_EQ(usage->pids, static_cast<std::uint64_t>(forked) + 1);
  EXPECT_TRUE(leaf->kill(2000));
  EXPECT_TRUE(c.wait(2000));

  sb::Cgroup::limit_folder(folder, {}, unenforced);  // the limit left the configuration
  usage = sb::Cgroup::usage(folder);
  ASSERT_TRUE(usage);
  EXPECT_FALSE(usage->pids_max) << *usage->pids_max;

  EXPECT_FALSE(sb::Cgroup::remove_folder(folder)) << "removed with a group below it";
  leaf.cg->remove();
  EXPECT_TRUE(sb::Cgroup::remove_folder(folder));
  EXPECT_FALSE(sb::Cgroup::usage(folder));
  for (const auto& p : sb::Cgroup::candidate_paths(folder)) EXPECT_FALSE(stdfs::exists(p)) << p;
}

// cpus nest too: a group below a folder gets at most the folder's cores (v1 would refuse more with
// EINVAL; v2 takes the smaller itself), and lowering the folder below a group's own lowers the
// group first on v1, so the folder's limit is always accepted.
TEST(Cgroups, AFoldersCpusBoundTheGroupsBelowIt) {
  REQUIRE(cpu);
  const std::string folder = unique_name("cpus");
  std::vector<std::string> unenforced;
  sb::CgroupLimits one;
  one.cpus = 1;
  sb::Cgroup::limit_folder(folder, one, unenforced);
  ASSERT_TRUE(unenforced.empty()) << unenforced.front();
  sb::CgroupLimits two;
  two.cpus = 2;
  GroupGuard leaf(sb::Cgroup::create(folder + "/leaf", two, unenforced));
  EXPECT_TRUE(unenforced.empty()) << unenforced.front();
  auto cores = [](const stdfs::path& group) -> std::optional<double> {
    for (const auto& [quota_file, period_file] : {std::pair{"cpu.cfs_quota_us", "cpu.cfs_period_us"}}) {
      if (!stdfs::exists(group / quota_file)) continue;
      const double quota = std::stod(slurp(group / quota_file)), period = std::stod(slurp(group / period_file));
      if (quota > 0) return quota / period;
      return std::nullopt;
    }
    if (!stdfs::exists(group / "cpu.max")) return std::nullopt;
    std::istringstream in(slurp(group / "cpu.max"));
    std::string quota;
    double period = 0;
    in >> quota >> period;
    if (quota == "max") return std::nullopt;
    return std::stod(quota) / period;
  };
  // v2 keeps what was asked (the kernel takes the smaller itself); v1 gets the folder's.
  auto leaf_cores = [&]() -> std::pair<std::optional<double>, bool> {
    for (const auto& p : leaf->paths())
      if (auto c = cores(p)) return {c, stdfs::exists(p / "cpu.cfs_quota_us")};
    return {std::nullopt, false};
  };
  auto [before, v1] = leaf_cores();
  ASSERT_TRUE(before);
  EXPECT_DOUBLE_EQ(*before, v1 ? 1.0 : 2.0);

  sb::CgroupLimits half;
  half.cpus = 0.5;
  sb::Cgroup::limit_folder(folder, half, unenforced);
  EXPECT_TRUE(unenforced.empty()) << unenforced.front();
  auto usage = sb::Cgroup::usage(folder);
  ASSERT_TRUE(usage);
  ASSERT_TRUE(usage->cpus_max);
  EXPECT_DOUBLE_EQ(*usage->cpus_max, 0.5);
  if (v1) {
    EXPECT_DOUBLE_EQ(*leaf_cores().first, 0.5) << "the group below was not lowered first";
  }
  leaf.cg->remove();
  EXPECT_TRUE(sb::Cgroup::remove_folder(folder));
}
