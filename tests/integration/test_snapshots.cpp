// Factory reset and snapshots as a user and an agent meet them: what apt-get installed in an
// image instance goes with a reset, comes back with a snapshot's restore, and travels with the
// instance through archive and restore. The packages come from the local repository that
// scripts/test-image.sh (make test's set-up) made, served here on 127.0.0.1: no sandbox talks to
// anything but this test.
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

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
    return json::parse(r.out, nullptr, false);
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
  EXPECT_EQ(json::parse(taken.out)["snapshot"]["has_layer"], false);
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

  // A command still running in it (this instance has a sandbox per command) ends before the
  // snapshot is taken, as its jobs would: the snapshot and the workspace agree.
  const int running = server.call("terminal_execute", {{"instance_id", "snap-host"},
                                                       {"command", "echo started > /workspace/mark; sleep 60"}});
  ASSERT_TRUE(eventually([&] { return fs::exists(ws / "mark"); }, std::chrono::seconds(20)));
  const auto asked = std::chrono::steady_clock::now();
  const json taken_now = server.call_and_wait("snapshot_instance", {{"instance_id", "snap-host"}, {"name", "during"}});
  EXPECT_FALSE(taken_now["result"].value("isError", false)) << taken_now.dump();
  const json ended = server.wait_for(running, std::chrono::seconds(20));
  ASSERT_FALSE(ended.is_null()) << "the command was still running after the snapshot";
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(30));
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
  EXPECT_NE(full.err.find("snapshot 's1' of instance 'snap-full' not taken: copying"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("No space left on device"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("the instance is as it was"), std::string::npos) << full.err;
  EXPECT_EQ(fs::file_size(ws / "big"), 1300000u);
  Result listed = env.run({"instance", "snapshots", "snap-full", "--json"});
  EXPECT_EQ(listed.out, "[]\n") << listed.err;
  for (const auto& e : fs::directory_iterator(env.instances()))
    EXPECT_NE(e.path().filename().string().rfind(".deleting-", 0), 0u) << e.path();
}
