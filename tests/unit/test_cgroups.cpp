// Per-job cgroups without the kernel's cgroups: the "nothing enforceable" behaviour, with a
// mount root that holds no cgroup mounts, and the checks of names, limits and paths:
//   - no limits asked: create() succeeds with no paths and one "kill: ..." entry in unenforced;
//   - limits asked: every limit lands in unenforced and create() throws nshpc::Error.
// Tests that create real cgroups are in tests/integration/test_cgroups.cpp.
#include "sandbox/cgroups.hpp"

#include <signal.h>
#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.hpp"
#include "common/temp_dir.hpp"
#include "sandbox/limits.hpp"

namespace {

namespace sb = nshpc::sandbox;
namespace stdfs = std::filesystem;
using nshpc::tests::TempDir;

}  // namespace

// ---- everywhere -------------------------------------------------------------------------------

TEST(Cgroups, RejectsBadNamesAndLimits) {
  std::vector<std::string> unenforced;
  TempDir tmp("nshpc-cgtest");
  for (const char* bad : {"", "/abs", "a/../b", "a//b", "a/", ".", ".."})
    EXPECT_THROW(sb::Cgroup::create(bad, {}, unenforced, tmp.path()), nshpc::UsageError) << bad;
  sb::CgroupLimits limits;
  limits.cpus = 0;
  EXPECT_THROW(sb::Cgroup::create("x", limits, unenforced, tmp.path()), nshpc::UsageError);
  limits.cpus = -1.5;
  EXPECT_THROW(sb::Cgroup::create("x", limits, unenforced, tmp.path()), nshpc::UsageError);
}

TEST(Cgroups, NothingEnforceableWithoutLimitsGivesEmptyGroup) {
  TempDir tmp("nshpc-cgtest");  // no cgroup mounts below it
  std::vector<std::string> unenforced;
  auto cg = sb::Cgroup::create("job", {}, unenforced, tmp.path());
  ASSERT_TRUE(cg);
  EXPECT_TRUE(cg->paths().empty());
  ASSERT_EQ(unenforced.size(), 1u);
  EXPECT_EQ(unenforced[0].rfind("kill: ", 0), 0u) << unenforced[0];
  EXPECT_NE(unenforced[0].find(tmp.path().string()), std::string::npos) << unenforced[0];
  EXPECT_TRUE(cg->procs_fds().empty());
  EXPECT_TRUE(cg->members().empty());
  EXPECT_TRUE(cg->empty());
  EXPECT_TRUE(cg->kill(0));
  cg->signal_all(SIGTERM);
  EXPECT_FALSE(cg->oom_killed());
  EXPECT_FALSE(cg->memory_peak());
  EXPECT_NO_THROW(cg->remove());
  EXPECT_NO_THROW(cg->remove());
}

TEST(Cgroups, NothingEnforceableWithLimitsThrowsAndListsEachLimit) {
  TempDir tmp("nshpc-cgtest");
  std::vector<std::string> unenforced;
  sb::CgroupLimits limits;
  limits.cpus = 1.0;
  limits.memory_bytes = 64u << 20;
  limits.pids = 10;
  try {
    sb::Cgroup::create("job", limits, unenforced, tmp.path());
    ADD_FAILURE() << "expected nshpc::Error";
  } catch (const nshpc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no cgroup could be created"), std::string::npos) << e.what();
  }
  ASSERT_EQ(unenforced.size(), 3u);
  EXPECT_EQ(unenforced[0].rfind("memory: ", 0), 0u) << unenforced[0];
  EXPECT_EQ(unenforced[1].rfind("cpu: ", 0), 0u) << unenforced[1];
  EXPECT_EQ(unenforced[2].rfind("pids: ", 0), 0u) << unenforced[2];

  auto s = sb::probe_cgroups(tmp.path());
  EXPECT_FALSE(s.memory);
  EXPECT_FALSE(s.cpu);
  EXPECT_FALSE(s.pids);
  EXPECT_FALSE(s.kill);
  EXPECT_NE(s.detail.find(tmp.path().string()), std::string::npos) << s.detail;
}

TEST(Cgroups, AttachChecksPaths) {
  TempDir tmp("nshpc-cgtest");
  EXPECT_THROW(sb::Cgroup::attach({tmp.path()}), nshpc::Error);  // not a cgroup file system
  try {
    sb::Cgroup::attach({tmp.path() / "missing"});
    ADD_FAILURE() << "expected SysError";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), ENOENT);
  }
  auto none = sb::Cgroup::attach({});
  EXPECT_TRUE(none->paths().empty());
  EXPECT_TRUE(none->empty());
}

// [namespace] limits: only cpus, memory (MiB) and pids that are set reach a cgroup; without
// use_cgroups every limit set is reported unenforced, in one line, and nothing is probed or read.
TEST(InstanceLimits, OnlyLimitsThatAreSetCountAndWithoutCgroupsTheyAreUnenforced) {
  const std::map<std::string, std::int64_t> limits{{"cpus", 2}, {"memory", 64}, {"pids", 0}, {"output", 5}};
  const sb::CgroupLimits cg = sb::cgroup_limits(limits);
  EXPECT_EQ(cg.cpus, 2.0);
  EXPECT_EQ(cg.memory_bytes, 64u << 20);
  EXPECT_FALSE(cg.pids);

  EXPECT_TRUE(sb::instance_limits_unenforced({{"cpus", 0}, {"memory", 0}}, false).empty());
  EXPECT_EQ(sb::instance_limits_unenforced(limits, false),
            std::vector<std::string>{"cpus, memory: [jobs.local] use_cgroups is false"});
  const sb::InstanceLimits shown = sb::instance_limits(limits, "alpha", false);
  EXPECT_EQ(shown.configured, (std::map<std::string, std::int64_t>{{"cpus", 2}, {"memory", 64}}));
  EXPECT_EQ(shown.unenforced.size(), 1u);
  EXPECT_FALSE(shown.usage);
  // Nothing to apply without cgroups, and nothing made.
  EXPECT_TRUE(sb::apply_instance_limits(limits, "alpha", false).empty());
}
