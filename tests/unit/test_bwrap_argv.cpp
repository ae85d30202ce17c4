#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.hpp"
#include "sandbox/bwrap_argv.hpp"
#include "sandbox/status.hpp"

using namespace nshpc;
using namespace nshpc::sandbox;

namespace {

config::Namespace seed_namespace() {
  config::Namespace ns = config::built_in().ns;  // the defaults of the key table
  ns.bwrap_command = {"bwrap", "--unshare-all", "--share-net", "--proc", "/proc", "--dev", "/dev",
                      "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr", "--ro-bind", "/lib", "/lib",
                      "--ro-bind", "/bin", "/bin", "--ro-bind", "/etc", "/etc"};
  return ns;
}

RunSpec spec(config::Network net = config::Network::host) {
  RunSpec s;
  s.target.instance_id = "alpha";
  s.target.network = net;
  s.argv = {"/bin/sh", "-c", "echo 'a b'"};
  return s;
}

ArgvOptions options() {
  return {"/usr/bin/bwrap", [](const std::string& p) -> std::optional<std::string> {
            if (p == "/bin") return "usr/bin";
            if (p == "/lib") return "usr/lib";
            return std::nullopt;
          }};
}

const FdNumbers kFds{.status = 3, .seccomp = 4, .workspace = 5, .output = 6, .shared_output = -1};

bool has_sequence(const std::vector<std::string>& argv, std::vector<std::string> seq) {
  return std::search(argv.begin(), argv.end(), seq.begin(), seq.end()) != argv.end();
}

size_t index_of(const std::vector<std::string>& argv, const std::string& s) {
  return static_cast<size_t>(std::find(argv.begin(), argv.end(), s) - argv.begin());
}

}  // namespace

TEST(BwrapArgv, HardenedByDefaultAndCommandKeptWordForWord) {
  auto argv = build_bwrap_argv(seed_namespace(), spec(), kFds, options());
  EXPECT_EQ(argv.front(), "/usr/bin/bwrap");
  for (const char* flag : {"--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                           "--new-session"})
    EXPECT_TRUE(has_sequence(argv, {flag})) << flag;
  EXPECT_TRUE(has_sequence(argv, {"--cap-drop", "ALL"}));
  EXPECT_TRUE(has_sequence(argv, {"--ro-bind", "/proc/sys", "/proc/sys"}));
  EXPECT_TRUE(has_sequence(argv, {"--hostname", "alpha"}));
  EXPECT_TRUE(has_sequence(argv, {"--seccomp", "4"}));
  EXPECT_TRUE(has_sequence(argv, {"--json-status-fd", "3"}));
  EXPECT_TRUE(has_sequence(argv, {"--bind-fd", "5", "/workspace"}));
  EXPECT_TRUE(has_sequence(argv, {"--bind-fd", "6", "/output"}));
  EXPECT_TRUE(has_sequence(argv, {"--chdir", "/workspace", "--", "/bin/sh", "-c", "echo 'a b'"}));
  EXPECT_EQ(argv.back(), "echo 'a b'");
  // /proc/sys is re-bound read-only after the base's --proc.
  EXPECT_GT(index_of(argv, "/proc/sys"), index_of(argv, "--proc"));
  // No shared output unless asked for.
  EXPECT_FALSE(has_sequence(argv, {"/shared-output"}));
}

TEST(BwrapArgv, MergedUsrSymlinksAreReproduced) {
  auto argv = build_bwrap_argv(seed_namespace(), spec(), kFds, options());
  EXPECT_TRUE(has_sequence(argv, {"--symlink", "usr/bin", "/bin"}));
  EXPECT_TRUE(has_sequence(argv, {"--symlink", "usr/lib", "/lib"}));
  EXPECT_FALSE(has_sequence(argv, {"--ro-bind", "/bin", "/bin"}));
  EXPECT_TRUE(has_sequence(argv, {"--ro-bind", "/usr", "/usr"}));
  EXPECT_TRUE(has_sequence(argv, {"--ro-bind", "/etc", "/etc"}));
}

TEST(BwrapArgv, NetworkModeOfTheInstanceWinsOverTheBase) {
  auto host = build_bwrap_argv(seed_namespace(), spec(config::Network::host), kFds, options());
  EXPECT_EQ(std::count(host.begin(), host.end(), "--share-net"), 1);
  EXPECT_GT(index_of(host, "--share-net"), index_of(host, "--disable-userns"));
  auto off = build_bwrap_argv(seed_namespace(), spec(config::Network::off), kFds, options());
  EXPECT_EQ(std::count(off.begin(), off.end(), "--share-net"), 0);
  EXPECT_EQ(std::count(off.begin(), off.end(), "--unshare-net"), 1);
}

TEST(BwrapArgv, HardeningOffKeepsTheCustomCommandAsIs) {
  auto ns = seed_namespace();
  ns.hardening = false;
  ns.bwrap_command = {"bwrap", "--unshare-all", "--uid", "1000", "--ro-bind", "/srv/rootfs", "/",
                      "--proc", "/proc"};
  auto s = spec();
  s.die_with_caller = false;
  auto argv = build_bwrap_argv(ns, s, {.status = 3, .seccomp = -1, .workspace = 5, .output = 6}, options());
  EXPECT_TRUE(has_sequence(argv, {"/usr/bin/bwrap", "--unshare-all", "--uid", "1000", "--ro-bind",
                                  "/srv/rootfs", "/", "--proc", "/proc", "--share-net"}));
  for (const char* flag : {"--cap-drop", "--disable-userns", "--new-session", "--seccomp", "/proc/sys",
                           "--die-with-parent"})
    EXPECT_FALSE(has_sequence(argv, {flag})) << flag;
}

TEST(BwrapArgv, JobsThatOutliveTheCallerDoNotDieWithIt) {
  auto s = spec();
  s.die_with_caller = false;
  auto argv = build_bwrap_argv(seed_namespace(), s, kFds, options());
  EXPECT_FALSE(has_sequence(argv, {"--die-with-parent"}));
  EXPECT_TRUE(has_sequence(argv, {"--cap-drop", "ALL"}));  // still hardened
}

TEST(BwrapArgv, TerminalSessionsKeepTheirControllingTerminal) {
  auto s = spec();
  s.terminal = true;
  auto argv = build_bwrap_argv(seed_namespace(), s, kFds, options());
  EXPECT_FALSE(has_sequence(argv, {"--new-session"}));
  EXPECT_TRUE(has_sequence(argv, {"--seccomp", "4"}));  // TIOCSTI stays blocked by seccomp
}

TEST(BwrapArgv, SharedOutputIsOptIn) {
  auto ns = seed_namespace();
  ns.shared_output = true;
  FdNumbers fds = kFds;
  fds.shared_output = 7;
  auto argv = build_bwrap_argv(ns, spec(), fds, options());
  EXPECT_TRUE(has_sequence(argv, {"--ro-bind-fd", "7", "/shared-output"}));
}

TEST(BwrapArgv, UnusableBaseCommandsAreRefusedWithTheReason) {
  auto ns = seed_namespace();
  ns.bwrap_command.push_back("--");
  EXPECT_THROW(build_bwrap_argv(ns, spec(), kFds, options()), Error);
  ns = seed_namespace();
  ns.bwrap_command.push_back("--bogus");
  try {
    build_bwrap_argv(ns, spec(), kFds, options());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'--bogus'"), std::string::npos);
  }
  ns = seed_namespace();
  ns.bwrap_command.push_back("--ro-bind");
  ns.bwrap_command.push_back("/only-one");
  EXPECT_THROW(build_bwrap_argv(ns, spec(), kFds, options()), Error);
  auto empty = spec();
  empty.argv.clear();
  EXPECT_THROW(build_bwrap_argv(seed_namespace(), empty, kFds, options()), UsageError);
}

TEST(SandboxEnv, MinimalAndExplicit) {
  auto ns = seed_namespace();
  ns.env = {{"OMP_NUM_THREADS", "2"}};
  ns.pass_env = {"SLURM_JOB_ID", "NOT_SET"};
  auto s = spec();
  s.env = {{"EXTRA", "1"}};
  auto host = [](std::string_view name) -> std::optional<std::string> {
    if (name == "SLURM_JOB_ID") return "77";
    if (name == "TERM") return "xterm";
    if (name == "SECRET_TOKEN") return "hunter2";
    return std::nullopt;
  };
  auto env = build_sandbox_env(ns, s, host);
  std::vector<std::string> expected{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8",
                                    "TERM=xterm", "NS_HPC_INSTANCE=alpha", "OMP_NUM_THREADS=2",
                                    "SLURM_JOB_ID=77", "EXTRA=1"};
  EXPECT_EQ(env, expected);
  s.env = {{"BAD=NAME", "x"}};
  EXPECT_THROW(build_sandbox_env(ns, s, host), UsageError);
}

TEST(StatusStream, ParsesBwrapsConcatenatedDocumentsInPieces) {
  StatusStream st;
  std::string data = "{ \"child-pid\": 8150, \"cgroup-namespace\": 4026532}{ \"exit-code\": 42 }";
  for (char c : data) st.feed(std::string_view(&c, 1));
  EXPECT_EQ(st.child_pid(), 8150);
  EXPECT_EQ(st.exit_code(), 42);
  StatusStream setup_failed;
  setup_failed.feed("{ \"child-pid\": 12 }\n");
  EXPECT_FALSE(setup_failed.exit_code());
  EXPECT_FALSE(setup_failed.malformed());
}

// An image instance's sandbox: on the instance's root (a descriptor its starter made), no user
// namespace of bwrap's own (it runs as uid 0 of the instance's), a container's capabilities and
// never SYS_ADMIN or the network's, the instance's /tmp and /dev/shm writable by everyone inside.
TEST(BwrapArgv, AnImageInstanceRunsOnItsOwnRootWithTheImageCapabilities) {
  RunSpec s = spec(config::Network::off);
  s.target.image = ImageRoot{.image = "test@1", .rootfs = "/images/test/1/rootfs", .layer = "/i/alpha/layer"};
  FdNumbers fds = kFds;
  EXPECT_THROW(build_bwrap_argv(seed_namespace(), s, fds, options()), Error);  // no root descriptor
  fds.root = 9;
  const auto argv = build_bwrap_argv(seed_namespace(), s, fds, options());
  EXPECT_TRUE(has_sequence(argv, {"/usr/bin/bwrap", "--bind-fd", "9", "/"}));
  for (const char* absent : {"--unshare-user", "--unshare-all", "--disable-userns", "CAP_SYS_ADMIN", "CAP_NET_ADMIN",
                             "CAP_NET_RAW", "/usr", "/etc"})
    EXPECT_FALSE(has_sequence(argv, {absent})) << absent;
  EXPECT_TRUE(has_sequence(argv, {"--cap-drop", "ALL", "--cap-add", "CAP_CHOWN"}));
  EXPECT_TRUE(has_sequence(argv, {"--perms", "1777"}));
  EXPECT_TRUE(has_sequence(argv, {"--unshare-net"}));
  EXPECT_TRUE(has_sequence(argv, {"--bind-fd", "5", "/workspace"}));
  // The mask joined commands keep is the same set: CHOWN (0) in, SYS_ADMIN (21) out.
  EXPECT_EQ(image_capability_mask() & 1U, 1U);
  EXPECT_EQ(image_capability_mask() & (std::uint64_t{1} << 21), 0U);
  EXPECT_EQ(static_cast<std::size_t>(__builtin_popcountll(image_capability_mask())), std::size(kImageCapabilities));
  // Its commands find the system's tools (useradd) and apt never waits for an answer.
  const auto env = build_sandbox_env(seed_namespace(), s, [](std::string_view) { return std::nullopt; });
  EXPECT_NE(std::find(env.begin(), env.end(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"), env.end());
  EXPECT_NE(std::find(env.begin(), env.end(), "DEBIAN_FRONTEND=noninteractive"), env.end());
}
