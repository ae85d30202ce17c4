// Factory reset and snapshots as a user and an agent meet them: what apt-get installed in an
// image instance goes with a reset, comes back with a snapshot's restore, and travels with the
// instance through archive and restore. The packages come from the local repository that
// scripts/test-image.sh (make test's set-up) made, served here on 127.0.0.1: no sandbox talks to
// anything but this test.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/json.hpp"
#include "common/file_server.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

const fs::path kCache = test_image_cache();

// Why image instances cannot be tested here, or "" when they can.
std::string image_skip_reason() {
  if (!fs::exists(kCache / "images" / "test" / "current"))
    return "no image 'test' in " + (kCache / "images").string() + ": scripts/test-image.sh (run by make test) builds it";
  if (!fs::exists(kCache / "repo" / "Packages")) return "no local apt repository in " + (kCache / "repo").string();
  return "";
}

// The apt sources of an instance pointed at the test's repository only.
std::string apt_local(std::uint16_t port) {
  return "echo 'deb [trusted=yes] http://127.0.0.1:" + std::to_string(port) +
         " ./' > /etc/apt/sources.list.d/local.list && rm -f /etc/apt/sources.list "
         "/etc/apt/sources.list.d/debian.sources && apt-get update -q >/dev/null 2>&1";
}

class SnapshotsOnImage : public ::testing::Test {
 protected:
  // apt reaches the test's repository on the host's loopback: the host's network.
  SnapshotsOnImage()
      : env_("images_dir = \"" + (kCache / "images").string() + "\"\ndefault_network = \"host\"\n") {}
  void SetUp() override {
    if (const std::string why = image_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
  void create(const std::string& id) {
    Result made = env_.run({"instance", "create", id, "--image", "test"});
    ASSERT_EQ(made.exit_code, 0) << made.err;
  }
  Result in(const std::string& id, const std::string& command, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    return env_.run({"bwrap", id, "--", "/bin/sh", "-c", command}, "", timeout);
  }
  void install_hello(const std::string& id) {
    Result installed = in(id, apt_local(repo_.port()) + " && apt-get install -y -q hello >/dev/null 2>&1 && hello");
    ASSERT_EQ(installed.exit_code, 0) << installed.out << installed.err;
    ASSERT_EQ(installed.out, "Hello, world!\n");
  }
  json cli_json(const std::vector<std::string>& args) {
    Result r = env_.run(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nshpc::parse_json_or_discarded(r.out);
  }
  std::vector<std::string> leftovers() const {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(env_.instances(), ec))
      if (e.path().filename().string().rfind(".deleting-", 0) == 0) names.push_back(e.path().filename());
    return names;
  }

  Env env_;
  nshpc::tests::FileServer repo_{kCache / "repo"};
};

}  // namespace

// The whole story from the command line: install, snapshot, break things, restore, reset.
TEST_F(SnapshotsOnImage, SnapshotRestoreAndResetBringBackExactlyWhatWasThere) {
  const std::string id = "snap-cli";
  create(id);
  install_hello(id);
  // Beside the package: a deleted image file (an overlay whiteout), a replaced image folder (an
  // opaque folder: a trusted.overlay xattr) and a workspace file.
  Result shaped = in(id, "rm /etc/motd && rm -rf /etc/skel && mkdir /etc/skel && echo mine > /etc/skel/mine && "
                         "echo one > /workspace/note");
  ASSERT_EQ(shaped.exit_code, 0) << shaped.err;

  json taken = cli_json({"instance", "snapshot", id, "s1", "--json"});
  EXPECT_EQ(taken["snapshot"]["name"], "s1") << taken.dump();
  EXPECT_EQ(taken["snapshot"]["has_layer"], true);
  EXPECT_GT(taken["snapshot"]["bytes"].get<std::uint64_t>(), 100u * 1024) << "hello's files and apt's lists";
  EXPECT_EQ(taken["was_running"], true) << "the sandbox is stopped while the snapshot is taken";
  std::printf("[ snapshot of a small layer: %.1f ms ]\n", taken["took_ms"].get<double>());

  Result broken = in(id, "apt-get remove -y -q hello >/dev/null 2>&1 && echo two > /workspace/note && "
                         "echo new > /workspace/extra && echo back > /etc/motd && touch /etc/skel/later");
  ASSERT_EQ(broken.exit_code, 0) << broken.err;
  Result taken_again = env_.run({"instance", "snapshot", id, "s1"});
  EXPECT_EQ(taken_again.exit_code, 1);
  EXPECT_NE(taken_again.err.find("already has a snapshot named 's1'"), std::string::npos) << taken_again.err;

  json restored = cli_json({"instance", "snapshot-restore", id, "s1", "-f", "--json"});
  EXPECT_EQ(restored["layer"], true) << restored.dump();
  EXPECT_EQ(restored["workspace"], true);
  Result after = in(id, "hello; cat /workspace/note; ls /workspace; test -e /etc/motd && echo motd; ls -A /etc/skel");
  EXPECT_EQ(after.out, "Hello, world!\none\nnote\nmine\n") << after.err;
  EXPECT_TRUE(leftovers().empty()) << "the CLI finishes removing the old trees before it exits";

  json listed = cli_json({"instance", "snapshots", id, "--json"});
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["name"], "s1");
  json described = cli_json({"instance", "describe", id, "--json"});
  EXPECT_GT(described["disk_usage"]["layer_bytes"].get<std::uint64_t>(), 100u * 1024) << described.dump();
  EXPECT_GT(described["disk_usage"]["snapshots_bytes"].get<std::uint64_t>(), 100u * 1024);
  json all = cli_json({"instance", "list", "--json"});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]["disk_usage"]["snapshots_bytes"], described["disk_usage"]["snapshots_bytes"]);
  json clean = cli_json({"clean", "--days", "0", "--dry-run", "--json"});
  ASSERT_EQ(clean["candidates"].size(), 1u) << clean.dump();
  EXPECT_EQ(clean["candidates"][0]["disk_usage"]["layer_bytes"], described["disk_usage"]["layer_bytes"]);
  Result clean_text = env_.run({"clean", "--days", "0", "--dry-run"});
  EXPECT_NE(clean_text.out.find(" on disk, root layer "), std::string::npos) << clean_text.out;

  // Reset: the image's root again, the workspace kept.
  json reset = cli_json({"instance", "reset", id, "-f", "--json"});
  EXPECT_EQ(reset["layer"], true) << reset.dump();
  EXPECT_EQ(reset["workspace"], false);
  std::printf("[ factory reset of a small layer: %.2f ms in all, %.2f ms for the swap ]\n",
              reset["took_ms"].get<double>(), reset["swap_ms"].get<double>());
  Result fresh = in(id, "command -v hello || echo no-hello; test -e /etc/motd && echo motd; test -e /etc/skel/.bashrc "
                        "&& echo bashrc; cat /workspace/note");
  EXPECT_EQ(fresh.out, "no-hello\nmotd\nbashrc\none\n") << fresh.err;
  EXPECT_TRUE(leftovers().empty());

  // With the workspace: empty (looked at from the host before anything runs in it again).
  Result both = env_.run({"instance", "reset", id, "--include-workspace", "-f"});
  EXPECT_EQ(both.exit_code, 0) << both.err;
  EXPECT_NE(both.out.find("its root is back to its image and its workspace is empty"), std::string::npos) << both.out;
  EXPECT_TRUE(fs::is_empty(env_.instances() / id / "workspace"));
  Result empty = in(id, "ls -A /workspace; echo done");
  EXPECT_EQ(empty.out, "done\n") << empty.err;

  // The snapshot is still there and still restores, then goes for good.
  json again = cli_json({"instance", "snapshot-restore", id, "s1", "-f", "--json"});
  EXPECT_EQ(in(id, "hello").out, "Hello, world!\n");
  Result deleted = env_.run({"instance", "snapshot-delete", id, "s1", "-f"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_EQ(cli_json({"instance", "snapshots", id, "--json"}), json::array());
  EXPECT_FALSE(fs::exists(env_.instances() / id / "snapshots" / "s1"));
  // Audited, each one.
  const std::string audit = read_text(env_.instances() / id / "audit.log");
  for (const char* event : {"instance.snapshot_taken", "instance.snapshot_restored", "instance.reset",
                            "instance.snapshot_deleted"})
    EXPECT_NE(audit.find(event), std::string::npos) << event;
}

// An agent's view: the tools, their results and their errors.
TEST_F(SnapshotsOnImage, TheToolsSnapshotRestoreResetAndSayWhatWentWrong) {
  const std::string id = "snap-agent";
  create(id);
  McpSession server(env_);
  auto run = [&](const std::string& command) {
    return server.tool("terminal_execute", {{"instance_id", id}, {"command", command}, {"timeout", 60}});
  };
  EXPECT_EQ(run("echo agent > /etc/agent-file && echo w > /workspace/w")["exit_code"], 0);
  json taken = server.tool("snapshot_instance", {{"instance_id", id}, {"name", "before"}});
  EXPECT_EQ(taken["snapshot"]["name"], "before") << taken.dump();
  EXPECT_EQ(taken["was_running"], true);
  EXPECT_EQ(run("rm /etc/agent-file /workspace/w && echo later > /workspace/later")["exit_code"], 0);

  // Errors: a bad name, an unknown snapshot (naming the ones there are), a name taken.
  json bad = server.call_and_wait("snapshot_instance", {{"instance_id", id}, {"name", "../up"}});
  EXPECT_TRUE(bad["result"].value("isError", false));
  EXPECT_NE(result_text(bad).find("'../up' is not a snapshot name"), std::string::npos) << bad.dump();
  json unknown = server.call_and_wait("restore_snapshot", {{"instance_id", id}, {"name", "nope"}});
  EXPECT_TRUE(unknown["result"].value("isError", false));
  EXPECT_NE(result_text(unknown).find("has no snapshot 'nope'; its snapshots: before"), std::string::npos)
      << unknown.dump();
  json taken_twice = server.call_and_wait("snapshot_instance", {{"instance_id", id}, {"name", "before"}});
  EXPECT_TRUE(taken_twice["result"].value("isError", false));

  json restored = server.tool("restore_snapshot", {{"instance_id", id}, {"name", "before"}});
  EXPECT_EQ(restored["snapshot"]["name"], "before") << restored.dump();
  EXPECT_EQ(run("cat /etc/agent-file /workspace/w; ls /workspace")["stdout"], "agent\nw\nw\n");
  json listed = server.tool("list_snapshots", {{"instance_id", id}});
  EXPECT_EQ(listed["count"], 1);
  json described = server.tool("describe_instance", {{"instance_id", id}});
  EXPECT_GT(described["disk_usage"]["snapshots_bytes"].get<std::uint64_t>(), 0u) << described.dump();
  EXPECT_GT(described["disk_usage"]["layer_bytes"].get<std::uint64_t>(), 0u);

  json reset = server.tool("factory_reset_instance", {{"instance_id", id}});
  EXPECT_EQ(reset["layer_reset"], true) << reset.dump();
  EXPECT_EQ(reset["workspace_emptied"], false);
  std::printf("[ factory_reset_instance: %.2f ms ]\n", reset["took_ms"].get<double>());
  EXPECT_EQ(run("test -e /etc/agent-file || echo gone; cat /workspace/w")["stdout"], "gone\nw\n");
  json wiped = server.tool("factory_reset_instance", {{"instance_id", id}, {"include_workspace", true}});
  EXPECT_EQ(wiped["workspace_emptied"], true);
  EXPECT_EQ(run("ls -A /workspace | wc -l")["stdout"], "0\n");

  json deleted = server.tool("delete_snapshot", {{"instance_id", id}, {"name", "before"}});
  EXPECT_EQ(deleted["deleted"], "before");
  EXPECT_EQ(server.tool("list_snapshots", {{"instance_id", id}})["count"], 0);
}

// Archive and restore carry the layer and the snapshots with the instance.
TEST_F(SnapshotsOnImage, AnArchivedAndRestoredInstanceKeepsItsPackagesAndSnapshots) {
  const std::string id = "snap-archived";
  create(id);
  install_hello(id);
  ASSERT_EQ(env_.run({"instance", "snapshot", id, "with-hello"}).exit_code, 0);
  Result archived = env_.run({"instance", "archive", id, "-f"});
  ASSERT_EQ(archived.exit_code, 0) << archived.err;
  Result restored = env_.run({"instance", "restore", id});
  ASSERT_EQ(restored.exit_code, 0) << restored.err;
  EXPECT_EQ(in(id, "hello").out, "Hello, world!\n");
  json listed = cli_json({"instance", "snapshots", id, "--json"});
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["name"], "with-hello");
  ASSERT_EQ(env_.run({"instance", "reset", id, "-f"}).exit_code, 0);
  EXPECT_NE(in(id, "hello").exit_code, 0);
  ASSERT_EQ(env_.run({"instance", "snapshot-restore", id, "with-hello", "-f"}).exit_code, 0);
  EXPECT_EQ(in(id, "hello").out, "Hello, world!\n");
}

// An instance on the host's root has no layer: a reset must say so, not pretend; its workspace
// can still be emptied and snapshotted. Runs as any user.
TEST(Snapshots, AHostRootInstanceResetsOnlyItsWorkspaceAndSnapshotsIt) {
  Env env;
  env.create("snap-host");
  const fs::path ws = env.instances() / "snap-host" / "workspace";
  ASSERT_EQ(env.run({"bwrap", "snap-host", "--", "/bin/sh", "-c", "echo kept > /workspace/a"}).exit_code, 0);
  Result refused = env.run({"instance", "reset", "snap-host", "-f"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("runs on the host's root (read-only): it has no root of its own to reset; "
                             "--include-workspace empties its workspace"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(read_text(ws / "a"), "kept\n");

  Result taken = env.run({"instance", "snapshot", "snap-host", "ws1", "--json"});
  ASSERT_EQ(taken.exit_code, 0) << taken.err;
  EXPECT_EQ(nshpc::parse_json(taken.out)["snapshot"]["has_layer"], false);
  Result wiped = env.run({"instance", "reset", "snap-host", "--include-workspace", "-f"});
  EXPECT_EQ(wiped.exit_code, 0) << wiped.err;
  EXPECT_TRUE(fs::is_empty(ws));
  Result restored = env.run({"instance", "snapshot-restore", "snap-host", "ws1", "-f"});
  EXPECT_EQ(restored.exit_code, 0) << restored.err;
  EXPECT_EQ(read_text(ws / "a"), "kept\n");

  // Bad names and unknown snapshots, before anything is stopped.
  for (const char* name : {"../x", ".hidden", "a/b", ""}) {
    Result bad = env.run({"instance", "snapshot", "snap-host", name});
    EXPECT_EQ(bad.exit_code, 1) << name;
    EXPECT_NE(bad.err.find("is not a snapshot name"), std::string::npos) << name << ": " << bad.err;
  }
  Result unknown = env.run({"instance", "snapshot-restore", "snap-host", "nope", "-f"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("instance 'snap-host' has no snapshot 'nope'; its snapshots: ws1"), std::string::npos)
      << unknown.err;
  Result none = env.run({"instance", "snapshot-delete", "snap-missing", "x", "-f"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("instance 'snap-missing' not found"), std::string::npos) << none.err;

  // The agent's side of the refusal.
  McpSession server(env);
  json agent = server.call_and_wait("factory_reset_instance", {{"instance_id", "snap-host"}});
  EXPECT_TRUE(agent["result"].value("isError", false));
  EXPECT_NE(result_text(agent).find("include_workspace: true empties its workspace"), std::string::npos)
      << agent.dump();

}

// Nothing of an instance runs while its trees are copied, and nothing is killed for a copy: a
// snapshot, restore or reset is refused while a command or a job runs in it, naming them, and
// they run on. Then it goes through.
TEST(Snapshots, RefusedWhileACommandOrJobRunsWhichRunOn) {
  Env env;
  env.create("snap-busy");
  const fs::path ws = env.instances() / "snap-busy" / "workspace";
  McpSession server(env);
  const int running = server.call("terminal_execute", {{"instance_id", "snap-busy"},
                                                       {"command", "echo started > /workspace/mark; sleep 4; echo done"}});
  ASSERT_TRUE(eventually([&] { return fs::exists(ws / "mark"); }, std::chrono::seconds(20)));
  const json refused = server.call_and_wait("snapshot_instance", {{"instance_id", "snap-busy"}, {"name", "during"}});
  EXPECT_TRUE(refused["result"].value("isError", false)) << refused.dump();
  EXPECT_NE(result_text(refused).find("is running a command (`echo started > /workspace/mark; sleep 4; echo done`)"),
            std::string::npos)
      << refused.dump();
  const json reset = server.call_and_wait("factory_reset_instance", {{"instance_id", "snap-busy"}, {"include_workspace", true}});
  EXPECT_TRUE(reset["result"].value("isError", false)) << reset.dump();
  EXPECT_TRUE(fs::exists(ws / "mark")) << "a refused reset emptied nothing";
  // From another process (the CLI) too.
  Result cli = env.run({"instance", "snapshot", "snap-busy", "during"});
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.err.find("a command of another ns-hpc process (pid "), std::string::npos) << cli.err;
  const json ended = server.wait_for(running, std::chrono::seconds(30));
  ASSERT_FALSE(ended.is_null());
  EXPECT_EQ(ended["result"]["structuredContent"]["exit_code"], 0) << "the command was not killed: " << ended.dump();
  EXPECT_EQ(ended["result"]["structuredContent"]["stdout"], "done\n");

  // A job: refused naming it, and it is still running afterwards.
  const json job = server.tool("submit_job", {{"instance_id", "snap-busy"}, {"command", "sleep 30"}, {"timeout", 0}});
  const std::string job_id = job["job_id"];
  const json refused_job = server.call_and_wait("snapshot_instance", {{"instance_id", "snap-busy"}, {"name", "job"}});
  EXPECT_TRUE(refused_job["result"].value("isError", false)) << refused_job.dump();
  EXPECT_NE(result_text(refused_job).find("has 1 job(s) that have not ended: " + job_id + " (running: `sleep 30`)"),
            std::string::npos)
      << refused_job.dump();
  EXPECT_EQ(server.tool("poll_job", {{"instance_id", "snap-busy"}, {"job_id", job_id}})["status"], "running");
  server.tool("cancel_job", {{"instance_id", "snap-busy"}, {"job_id", job_id}});

  // Nothing runs now: it goes through.
  const json taken = server.tool("snapshot_instance", {{"instance_id", "snap-busy"}, {"name", "after"}});
  EXPECT_EQ(taken["snapshot"]["name"], "after") << taken.dump();
  EXPECT_EQ(taken["restarted"], false);
}

// While a copy holds the instance still, no execution of it starts: one that is asked for waits
// until the copy is done. (The test holds the gate itself, as a copy would.)
TEST(Snapshots, NothingOfTheInstanceStartsWhileItIsHeldStill) {
  Env env;
  env.create("snap-gate");
  const fs::path ws = env.instances() / "snap-gate" / "workspace";
  ASSERT_EQ(env.run({"bwrap", "snap-gate", "--", "true"}).exit_code, 0);  // its status folder exists
  const fs::path gate = env.instances() / "snap-gate" / "status" / "exec.lock";
  int fd = ::open(gate.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << gate << ": " << std::strerror(errno);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const pid_t waiting = env.start({"bwrap", "snap-gate", "--", "/bin/sh", "-c", "echo ran > /workspace/ran"});
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(fs::exists(ws / "ran")) << "a command ran while the instance was held still";
  ::close(fd);  // the copy is done
  EXPECT_EQ(wait_child(waiting, std::chrono::seconds(30)), 0);
  EXPECT_EQ(read_text(ws / "ran"), "ran\n");
}

// A living instance's own processes are ended for the copy, and its sandbox runs again after it;
// the result says so.
TEST(Snapshots, ALivingInstanceIsStoppedForTheCopyAndStartedAgain) {
  Env env;
  env.create("snap-live", {"--persistent"});
  ASSERT_EQ(env.run({"bwrap", "snap-live", "--", "/bin/sh", "-c", "echo kept > /workspace/k; sleep 1000 >/dev/null 2>&1 &"})
                .exit_code,
            0);
  Result taken = env.run({"instance", "snapshot", "snap-live", "s1", "--json"});
  ASSERT_EQ(taken.exit_code, 0) << taken.err;
  const json change = nshpc::parse_json(taken.out);
  EXPECT_EQ(change["was_running"], true) << change.dump();
  EXPECT_EQ(change["restarted"], true) << change.dump();
  Result text = env.run({"instance", "snapshot", "snap-live", "s2"});
  EXPECT_NE(text.out.find("Stopped its sandbox for this (every process ended) and started it again."), std::string::npos)
      << text.out;
  Result status = env.run({"instance", "describe", "snap-live", "--json"});
  EXPECT_EQ(nshpc::parse_json_or_discarded(status.out)["state"], "running") << status.out << status.err;
  Result ps = env.run({"instance", "ps", "snap-live"});
  EXPECT_EQ(ps.out.find("sleep 1000"), std::string::npos) << "the background process ended: " << ps.out;
  EXPECT_EQ(env.run({"instance", "stop", "snap-live"}).exit_code, 0);
}

// The attack of the security review: a sandbox swaps a folder of its workspace for a link to a
// host folder, over and over, while snapshots are taken and restored. Whatever it does, no host
// file reaches the sandbox through a snapshot: a root-only file as root, the user's own 0600 file
// in a 0700 folder as a normal user.
TEST(Snapshots, ASandboxSwappingAFolderForALinkNeverGetsAHostFileThroughASnapshot) {
  Env env;
  const fs::path secret = env.root() / "secret";
  fs::create_directories(secret);
  fs::permissions(secret, fs::perms::owner_all, fs::perm_options::replace);
  { std::ofstream(secret / "key") << "the host's secret\n"; }
  fs::permissions(secret / "key", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  env.create("snap-attack", {"--persistent"});
  const std::string swapper =
      "mkdir -p /workspace/d && for i in $(seq 100); do echo ordinary > /workspace/d/f$i; done; "
      "(while :; do mv /workspace/d /workspace/d.x && ln -s " + secret.string() +
      " /workspace/d && rm /workspace/d && mv /workspace/d.x /workspace/d; done) >/dev/null 2>&1 &";
  for (int round = 0; round < 5; ++round) {
    ASSERT_EQ(env.run({"bwrap", "snap-attack", "--", "/bin/sh", "-c", swapper}).exit_code, 0);
    const std::string name = "s" + std::to_string(round);
    Result taken = env.run({"instance", "snapshot", "snap-attack", name});
    ASSERT_EQ(taken.exit_code, 0) << taken.err;
    Result restored = env.run({"instance", "snapshot-restore", "snap-attack", name, "-f"});
    ASSERT_EQ(restored.exit_code, 0) << restored.err;
    Result looked = env.run({"bwrap", "snap-attack", "--", "/bin/sh", "-c",
                             "grep -rs secret /workspace; find /workspace -name key; cat /workspace/d*/key 2>/dev/null; "
                             "echo checked"});
    EXPECT_EQ(looked.out, "checked\n") << "round " << round << ": " << looked.out;
  }
  EXPECT_EQ(env.run({"instance", "stop", "snap-attack"}).exit_code, 0);

  // The swapper in the foreground of a command of another process (an instance with a sandbox per
  // command): every snapshot is refused while it runs, then one is taken once it has ended.
  env.create("snap-attack2");
  const pid_t attacker = env.start({"bwrap", "snap-attack2", "--", "/bin/sh", "-c",
                                    "mkdir -p /workspace/d && echo ordinary > /workspace/d/f && end=$(($(date +%s)+4)); "
                                    "while [ $(date +%s) -lt $end ]; do mv /workspace/d /workspace/d.x && ln -s " +
                                        secret.string() +
                                        " /workspace/d && rm /workspace/d && mv /workspace/d.x /workspace/d; done"});
  ASSERT_TRUE(eventually([&] { return fs::exists(env.instances() / "snap-attack2" / "workspace" / "d.x") ||
                                      fs::exists(env.instances() / "snap-attack2" / "workspace" / "d"); },
                         std::chrono::seconds(20)));
  int refused = 0;
  for (int i = 0; i < 5; ++i) {
    Result taken = env.run({"instance", "snapshot", "snap-attack2", "during" + std::to_string(i)});
    if (taken.exit_code != 0 && taken.err.find("a command of another ns-hpc process (pid ") != std::string::npos)
      ++refused;
  }
  EXPECT_EQ(refused, 5) << "every snapshot refused while the command runs";
  EXPECT_EQ(wait_child(attacker, std::chrono::seconds(30)), 0);
  ASSERT_EQ(env.run({"instance", "snapshot", "snap-attack2", "after"}).exit_code, 0);
  ASSERT_EQ(env.run({"instance", "snapshot-restore", "snap-attack2", "after", "-f"}).exit_code, 0);
  Result looked = env.run({"bwrap", "snap-attack2", "--", "/bin/sh", "-c",
                           "grep -rs secret /workspace; find /workspace -name key; echo checked"});
  EXPECT_EQ(looked.out, "checked\n") << looked.out;

  // Nor in the snapshots themselves, looked at from the host.
  for (const char* id : {"snap-attack", "snap-attack2"}) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(env.instances() / id / "snapshots", ec);
         it != fs::recursive_directory_iterator(); it.increment(ec))
      EXPECT_NE(it->path().filename(), "key") << it->path();
  }
}

// A snapshot that does not fit on the disk says so and leaves the instance as it was, with no
// half-made copy behind. (A small tmpfs as the instances folder: root only.)
TEST(Snapshots, AFullDiskLeavesTheInstanceAsItWas) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  Env env;
  fs::create_directories(env.instances());
  ASSERT_EQ(::mount("snap-tmpfs", env.instances().c_str(), "tmpfs", 0, "size=2m,mode=0755"), 0) << strerror(errno);
  struct Unmount {
    fs::path at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{env.instances()};
  env.create("snap-full");
  const fs::path ws = env.instances() / "snap-full" / "workspace";
  ASSERT_EQ(env.run({"bwrap", "snap-full", "--", "/bin/sh", "-c", "head -c 1300000 /dev/urandom > /workspace/big"})
                .exit_code,
            0);
  Result full = env.run({"instance", "snapshot", "snap-full", "s1"});
  EXPECT_EQ(full.exit_code, 1);
  EXPECT_NE(full.err.find("snapshot 's1' of instance 'snap-full' not taken (the instance is as it was): copying"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("No space left on device"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("the instance is as it was"), std::string::npos) << full.err;
  EXPECT_EQ(fs::file_size(ws / "big"), 1300000u);
  Result listed = env.run({"instance", "snapshots", "snap-full", "--json"});
  EXPECT_EQ(listed.out, "[]\n") << listed.err;
  for (const auto& e : fs::directory_iterator(env.instances()))
    EXPECT_NE(e.path().filename().string().rfind(".deleting-", 0), 0u) << e.path();
}
