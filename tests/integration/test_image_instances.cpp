// Instances on an image, as an agent and a person meet them: a Debian root of the instance's own
// where commands run as uid 0 and `apt-get install` stays, while on the host they are an
// unprivileged range that nothing else uses. The image is make test's set-up
// (scripts/test-image.sh); packages come from the local repository it keeps, served by the test
// on loopback. Checked from inside, as the sandbox tests check host-root instances.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "base/json.hpp"
#include "common/file_server.hpp"
#include "common/temp_dir.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

const fs::path kCache = test_image_cache();
const bool kRoot = ::geteuid() == 0;

// The repository's apt source, and nothing else (no sandbox in a test reaches the mirror).
std::string use_local_repo(const nshpc::tests::FileServer& repo) {
  return "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*; echo 'deb [trusted=yes] " + repo.url() +
         " ./' > /etc/apt/sources.list.d/local.list && apt-get update -q >/dev/null";
}

class ImageInstance : public ::testing::Test {
 protected:
  ImageInstance()
      // apt reaches the test's repository on the host's loopback: the host's network.
      : env_("images_dir = \"" + (kCache / "images").string() + "\"\nidle_stop = 300\ndefault_network = \"host\"\n") {}

  void SetUp() override {
    if (!fs::exists(kCache / "images/test/current"))
      GTEST_SKIP() << "no test image in " << kCache << " (scripts/test-image.sh, run by make test, builds it)";
  }

  Result in(const std::string& id, const std::string& script) { return env_.run({"bwrap", id, "--", "/bin/sh", "-c", script}); }

  json metadata(const std::string& id) { return nshpc::parse_json(read_text(env_.instances() / id / "metadata.json")); }

  Env env_;
};

}  // namespace

TEST_F(ImageInstance, AptInstallStaysAcrossCommandsJobsRestartsAndServers) {
  nshpc::tests::FileServer repo(kCache / "repo");
  env_.create("img-apt", {"--image", "test"});
  const json meta = metadata("img-apt");
  EXPECT_EQ(meta["root"].get<std::string>().rfind("image:test@", 0), 0u) << meta.dump();
  EXPECT_TRUE(meta["persistent"].get<bool>());
  const uid_t base = meta["ids"]["host_base"].get<uid_t>();

  Result install = in("img-apt", use_local_repo(repo) + " && apt-get install -y -q hello >/dev/null && hello");
  ASSERT_EQ(install.exit_code, 0) << install.out << install.err;
  EXPECT_EQ(install.out, "Hello, world!\n");
  EXPECT_GT(repo.requests(), 0);
  // On the host the package is in the instance's own layer, owned by its range; the image is
  // untouched.
  struct stat st{};
  ASSERT_EQ(::stat((env_.instances() / "img-apt/layer/upper/usr/bin/hello").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, base);
  if (!kRoot) {
    EXPECT_EQ(base, ::geteuid());  // a normal user's instance root is the user
  }
  EXPECT_FALSE(fs::exists(kCache / "images/test/current/rootfs/usr/bin/hello"));

  EXPECT_EQ(in("img-apt", "hello").out, "Hello, world!\n");                        // a later command
  Result job = env_.run({"instance", "run", "img-apt", "--", "hello"});            // a job
  EXPECT_NE(job.out.find("Hello, world!"), std::string::npos) << job.out << job.err;
  ASSERT_EQ(env_.run({"instance", "restart", "img-apt"}).exit_code, 0);            // the instance restarted
  EXPECT_EQ(in("img-apt", "hello").out, "Hello, world!\n");
  ASSERT_EQ(env_.run({"instance", "stop", "img-apt"}).exit_code, 0);
  {
    McpSession mcp(env_);  // a server, after a stop
    const json r = mcp.call_and_wait("terminal_execute", {{"instance_id", "img-apt"}, {"command", "hello; id -u"}});
    EXPECT_NE(result_text(r).find("Hello, world!\n0"), std::string::npos) << r.dump();
    mcp.crash();
  }
  McpSession again(env_);  // and the next server, after the last one crashed
  const json r = again.call_and_wait("terminal_execute", {{"instance_id", "img-apt"}, {"command", "hello"}});
  EXPECT_NE(result_text(r).find("Hello, world!"), std::string::npos) << r.dump();
}

TEST_F(ImageInstance, RootInsideIsAnUnprivilegedRangeOfItsOwnOutside) {
  env_.create("img-a", {"--image", "test"});
  env_.create("img-b", {"--image", "test"});
  const json ids = metadata("img-a")["ids"];
  const uid_t a = ids["host_base"].get<uid_t>();
  const uid_t b = metadata("img-b")["ids"]["host_base"].get<uid_t>();
  if (kRoot) {  // root gives each instance a range of its own, above every account and subuid range
    EXPECT_NE(a, b);
    EXPECT_GE(a, 1u << 20);
    EXPECT_EQ(a % 65536, 0u);
  } else {  // a normal user's instances are the user, and its subordinate range above
    EXPECT_EQ(a, ::geteuid());
    EXPECT_EQ(b, a);
  }
  // Without a subordinate range only uid 0 exists inside: an account can be made, but it can own
  // nothing and nobody can become it.
  const bool single = ids["map"] == "single";
  const std::string accounts = single ? "useradd -m agent; chown agent /tmp 2>/dev/null || echo agent-owns-nothing; "
                                        "echo made > /etc/agent-was-here"
                                      : "useradd -m agent && su agent -c 'id -un' && echo made > /etc/agent-was-here";
  Result who = in("img-a", "id -u; id -g; grep CapEff /proc/self/status; cat /proc/self/uid_map; " + accounts);
  ASSERT_EQ(who.exit_code, 0) << who.out << who.err;
  std::istringstream lines(who.out);
  std::string uid, gid, cap, map_inside, map_outside, map_count;
  lines >> uid >> gid >> cap >> cap >> map_inside >> map_outside >> map_count;
  EXPECT_EQ(uid, "0");
  EXPECT_EQ(gid, "0");
  EXPECT_EQ(map_outside, std::to_string(a));
  if (kRoot) {
    EXPECT_EQ(map_count, "65536");
  } else if (single) {
    EXPECT_EQ(map_count, "1");
    EXPECT_NE(who.out.find("agent-owns-nothing"), std::string::npos) << who.out;
  } else {  // uid 0 is the user; 1-65536 its /etc/subuid range, as ns-hpc image build maps
    EXPECT_EQ(map_count, "1");
    std::string one, sub, count;
    lines >> one >> sub >> count;
    EXPECT_EQ(one + " " + count, "1 65536") << who.out;
    EXPECT_EQ(sub, std::to_string(ids["sub_uid"].get<uid_t>()));
  }
  // A container's capabilities, but never SYS_ADMIN (bit 21), NET_ADMIN (12) or NET_RAW (13).
  const unsigned long long caps = std::stoull(cap, nullptr, 16);
  EXPECT_NE(caps & 1ULL, 0ULL) << cap;  // CHOWN
  EXPECT_EQ(caps & ((1ULL << 21) | (1ULL << 12) | (1ULL << 13)), 0ULL) << cap;
  if (!single) {
    EXPECT_NE(who.out.find("agent\n"), std::string::npos) << who.out;
  }
  EXPECT_FALSE(fs::exists("/etc/agent-was-here"));

  // Those capabilities hold in the instance's own namespaces only: nothing of the host's.
  Result host = in("img-a",
                   "mknod /tmp/mem c 1 1 2>&1 | grep -c 'Operation not permitted'; "
                   "date -s '2001-01-01' >/dev/null 2>&1 || echo no-clock; "
                   "echo 1 > /proc/sys/kernel/sysrq 2>/dev/null || echo no-sysctl; "
                   "unshare -U true 2>/dev/null || echo no-userns; "
                   "mount -t tmpfs x /mnt 2>/dev/null || echo no-mount; "
                   "chown 70000 /tmp 2>/dev/null || echo no-foreign-owner; "
                   "ls /proc | grep -c '^[0-9]'");
  EXPECT_NE(host.out.find("1\nno-clock\nno-sysctl\nno-userns\nno-mount\nno-foreign-owner\n"), std::string::npos)
      << host.out << host.err;
  const int pids = std::stoi(host.out.substr(host.out.rfind("\n", host.out.size() - 2) + 1));
  EXPECT_LE(pids, 6) << "host processes are visible: " << host.out;

  // The host sees the sandbox's processes as the instance's range, never root.
  Result ps = env_.run({"instance", "ps", "img-a"});
  std::istringstream table(ps.out);
  std::string header;
  std::getline(table, header);
  int seen = 0;
  for (std::string row; std::getline(table, row);) {
    const pid_t pid = static_cast<pid_t>(std::atoi(row.c_str()));
    struct stat st{};
    if (pid <= 0 || ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) continue;
    ++seen;
    EXPECT_EQ(st.st_uid, a) << row;
  }
  EXPECT_GT(seen, 0) << ps.out;

  // Nothing of the other instance, the host's instance folders or the server's secrets.
  std::ofstream(env_.instances() / "img-b/workspace/b-secret.txt") << "b's data";
  Result other = in("img-a", "cat " + (env_.instances() / "img-b/workspace/b-secret.txt").string() +
                                 " 2>/dev/null; env; cat /proc/self/mountinfo; ls /");
  EXPECT_EQ(other.out.find("b's data"), std::string::npos) << other.out;
  EXPECT_EQ(other.out.find(kSecret), std::string::npos);
  EXPECT_EQ(other.out.find(env_.instances().string() + "/img-b"), std::string::npos) << other.out;
}

TEST_F(ImageInstance, FilesMadeOnEitherSideBelongToTheInstancesRoot) {
  env_.create("img-files", {"--image", "test"});
  const uid_t base = metadata("img-files")["ids"]["host_base"].get<uid_t>();
  struct stat st{};
  ASSERT_EQ(::stat((env_.instances() / "img-files/workspace").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, base);
  McpSession mcp(env_);
  const json w = mcp.call_and_wait("write_file", {{"instance_id", "img-files"}, {"path", "notes/from-agent.txt"}, {"content", "hello\n"}});
  ASSERT_FALSE(w["result"].value("isError", false)) << w.dump();
  ASSERT_EQ(::stat((env_.instances() / "img-files/workspace/notes/from-agent.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, base);
  const json t = mcp.call_and_wait(
      "terminal_execute", {{"instance_id", "img-files"}, {"command", "stat -c '%U %a' notes/from-agent.txt; cat notes/from-agent.txt; echo made > inside.txt"}});
  EXPECT_NE(result_text(t).find("root 644\nhello"), std::string::npos) << t.dump();
  const json r = mcp.call_and_wait("read_file", {{"instance_id", "img-files"}, {"path", "inside.txt"}});
  EXPECT_NE(result_text(r).find("made"), std::string::npos) << r.dump();

  // A file of another account inside (one of the instance's own ids) is the instance's too: the
  // file tools read it. A file of an id outside the instance's (a hard link to a host file would
  // be one) is still refused.
  if (metadata("img-files")["ids"]["map"] == "single") return;  // no other account can own a file
  const json made = mcp.call_and_wait(
      "terminal_execute", {{"instance_id", "img-files"},
                           {"command", "useradd agent && echo by-agent > agent.txt && chown agent: agent.txt && "
                                       "stat -c %U-%a agent.txt"}});
  ASSERT_NE(result_text(made).find("agent-644"), std::string::npos) << made.dump();
  const json theirs = mcp.call_and_wait("read_file", {{"instance_id", "img-files"}, {"path", "agent.txt"}});
  EXPECT_FALSE(theirs["result"].value("isError", false)) << theirs.dump();
  EXPECT_NE(result_text(theirs).find("by-agent"), std::string::npos) << theirs.dump();
}

// What an agent makes inside that the server could not touch from outside as a normal user —
// folders and files of an account made inside (the user's subordinate uids) with modes that keep
// others out, a file and a folder closed even to their owner (mode 000) — is read, listed,
// written, edited, copied, moved and deleted through the file tools like any other file (as a
// normal user by a helper that is root of a user namespace mapping the instance's ids).
TEST_F(ImageInstance, FilesClosedToTheServerAreManagedThroughTheFileTools) {
  env_.create("img-closed", {"--image", "test"});
  const bool range = metadata("img-closed")["ids"]["map"] != "single";
  McpSession mcp(env_);
  auto call = [&](const std::string& tool, json args) {
    args["instance_id"] = "img-closed";
    return mcp.call_and_wait(tool, args);
  };
  auto ok = [&](const std::string& tool, json args) {
    const json r = call(tool, std::move(args));
    EXPECT_FALSE(r["result"].value("isError", false)) << tool << ": " << r.dump();
    return result_text(r);
  };
  std::string setup = "echo closed > closed.txt && chmod 000 closed.txt && mkdir shut && echo in > shut/x && "
                      "ln -s /etc/passwd shut/abs && ln -s ../../../../../../etc/passwd shut/up && "
                      "head -c 2097152 /dev/urandom > shut/big && chmod 000 shut";
  if (range)
    setup += " && useradd agent && mkdir -p private/sub && echo secret > private/a.txt && echo deep > private/sub/b.txt"
             " && chown -R agent: private && chmod 600 private/a.txt private/sub/b.txt && chmod 700 private private/sub"
             " && stat -c %U-%a private/a.txt";
  const std::string made = ok("terminal_execute", {{"command", setup}});
  if (range) {
    ASSERT_NE(made.find("agent-600"), std::string::npos) << made;
  }

  // Counted in the disk use too.
  const json described = call("describe_instance", {});
  EXPECT_GE(described["result"]["structuredContent"]["disk_usage"]["workspace_bytes"].get<std::uint64_t>(), 2097152u)
      << described.dump();
  EXPECT_NE(ok("read_file", {{"path", "closed.txt"}}).find("closed"), std::string::npos);
  EXPECT_NE(ok("list_directory", {{"path", "shut"}}).find("x"), std::string::npos);
  EXPECT_NE(ok("read_file", {{"path", "shut/x"}}).find("in"), std::string::npos);
  for (const char* link : {"shut/abs", "shut/up"}) {  // links in a closed folder stay inside too
    const json r = call("read_file", {{"path", link}});
    EXPECT_TRUE(r["result"].value("isError", false)) << r.dump();
    EXPECT_EQ(r.dump().find("root:x:0:0"), std::string::npos) << r.dump();
  }
  ok("write_file", {{"path", "shut/y"}, {"content", "written\n"}});
  ok("delete_file", {{"path", "shut"}, {"recursive", true}});
  std::string check = "ls shut 2>&1; cat closed.txt";
  if (range) {
    EXPECT_NE(ok("read_file", {{"path", "private/a.txt"}}).find("secret"), std::string::npos);
    EXPECT_NE(ok("list_directory", {{"path", "private/sub"}}).find("b.txt"), std::string::npos);
    ok("edit_file", {{"path", "private/a.txt"}, {"old_text", "secret"}, {"new_text", "edited"}});
    ok("write_file", {{"path", "private/sub/new.txt"}, {"content", "from the agent\n"}});
    ok("copy_file", {{"source", "private"}, {"destination", "copied"}});
    ok("move_file", {{"source", "private/sub/new.txt"}, {"destination", "private/moved.txt"}});
    ok("delete_file", {{"path", "private/sub"}, {"recursive", true}});
    check += "; cat private/a.txt private/moved.txt copied/sub/b.txt copied/sub/new.txt; ls private; "
             "stat -c %U-%a private/a.txt";
  }
  const std::string seen = ok("terminal_execute", {{"command", check}});
  EXPECT_NE(seen.find("No such file or directory"), std::string::npos) << seen;  // shut/ is gone
  EXPECT_NE(seen.find("closed"), std::string::npos) << seen;
  if (range) {
    EXPECT_NE(seen.find("edited\nfrom the agent\ndeep\nfrom the agent\na.txt\nmoved.txt\n"), std::string::npos) << seen;
    EXPECT_NE(seen.find("agent-600"), std::string::npos) << seen;  // an edit keeps the file's owner and mode
  }

  // Archived, restored and purged with what the server cannot open in its output folder too.
  std::string closed_output = "mkdir /output/shut && echo o > /output/shut/f && chmod 000 /output/shut";
  if (range) closed_output += " && mkdir /output/theirs && echo t > /output/theirs/f && chown -R agent: /output/theirs "
                              "&& chmod 700 /output/theirs";
  ok("terminal_execute", {{"command", closed_output}});
  mcp.crash();
  ASSERT_EQ(env_.run({"instance", "archive", "-f", "img-closed"}).exit_code, 0);
  json archives = nshpc::parse_json(env_.run({"instance", "list-archived", "--json"}).out);
  ASSERT_EQ(archives.size(), 1u) << archives.dump();
  ASSERT_EQ(env_.run({"instance", "restore", archives[0]["name"].get<std::string>()}).exit_code, 0);
  EXPECT_EQ(in("img-closed", "cat private/a.txt 2>/dev/null; chmod 700 /output/shut; cat /output/shut/f").out,
            range ? "edited\no\n" : "o\n");
  ASSERT_EQ(env_.run({"instance", "archive", "-f", "img-closed"}).exit_code, 0);
  archives = nshpc::parse_json(env_.run({"instance", "list-archived", "--json"}).out);
  ASSERT_EQ(archives.size(), 1u) << archives.dump();
  const Result purged = env_.run({"instance", "delete", "--archived", "-f", archives[0]["name"].get<std::string>()});
  EXPECT_EQ(purged.exit_code, 0) << purged.out << purged.err;
  EXPECT_EQ(nshpc::parse_json(env_.run({"instance", "list-archived", "--json"}).out).size(), 0u);
}

TEST_F(ImageInstance, WhatCannotWorkIsRefusedWithTheReason) {
  Result unknown = env_.run({"instance", "create", "img-x", "--image", "no-such-image"});
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("there is no image 'no-such-image'"), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("ns-hpc image build no-such-image"), std::string::npos) << unknown.err;
  EXPECT_FALSE(fs::exists(env_.instances() / "img-x"));

  Result ephemeral = env_.run({"instance", "create", "img-x", "--image", "test", "--no-persistent"});
  EXPECT_NE(ephemeral.err.find("always persistent"), std::string::npos) << ephemeral.err;

  env_.create("img-slurm", {"--image", "test"});
  Result slurm = env_.run({"instance", "run", "img-slurm", "--slurm", "--", "true"});
  EXPECT_NE(slurm.exit_code, 0);
  EXPECT_NE(slurm.err.find("a compute node has neither"), std::string::npos) << slurm.err;
  Result update = env_.run({"instance", "update", "img-slurm", "--no-persistent"});
  EXPECT_NE(update.err.find("always persistent"), std::string::npos) << update.err;

  // A layer changed behind ns-hpc's back (its folder no longer the instance root's) is named at
  // the start, never left to fail later inside.
  if (!kRoot) return;  // a normal user cannot give a folder away
  ASSERT_EQ(::chown((env_.instances() / "img-slurm/layer/upper").c_str(), 0, 0), 0);
  Result broken = in("img-slurm", "true");
  EXPECT_NE(broken.exit_code, 0);
  EXPECT_NE(broken.err.find("is not a folder of the instance's root"), std::string::npos) << broken.err;
  // Each face words the remedy for its reader: the person a command, the agent a tool.
  EXPECT_NE(broken.err.find("reset the instance (ns-hpc instance reset"), std::string::npos) << broken.err;
  EXPECT_EQ(broken.err.find("factory_reset_instance"), std::string::npos) << broken.err;
  McpSession server(env_);
  const json refused = server.call_and_wait("terminal_execute", {{"instance_id", "img-slurm"}, {"command", "true"}});
  const std::string said = result_text(refused);
  EXPECT_TRUE(refused["result"].value("isError", false)) << refused.dump();
  EXPECT_NE(said.find("is not a folder of the instance's root"), std::string::npos) << said;
  EXPECT_NE(said.find("factory_reset_instance puts its root back to the image, or restore_snapshot"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("ns-hpc instance"), std::string::npos) << said;
}

// Images made by hand for a test: a version folder with an empty image.json, current.
class StandInImages : public ::testing::Test {
 protected:
  // The version folder of a new image `name` (its rootfs is the test's to make).
  fs::path stand_in(const std::string& name) {
    const fs::path version = images / name / "20260101T000000Z";
    fs::create_directories(version);
    std::ofstream(version / "image.json") << "{}";
    fs::create_symlink("20260101T000000Z", images / name / "current");
    return version;
  }
  nshpc::tests::TempDir tmp;
  const fs::path images = tmp.path() / "images";
  Env env{"images_dir = \"" + images.string() + "\"\n"};
};

// An image whose files belong to someone other than the instance's root (an image another user
// built, or root's image used by a normal user) is refused at once with the reason, and nothing
// is made.
TEST_F(StandInImages, AnImageOfAnotherOwnerIsRefusedWithTheReasonAndLeavesNothing) {
  const fs::path version = stand_in("fake");
  uid_t owner = 0;  // a normal user: the host's own /usr, root's
  if (kRoot) {
    owner = 4242;
    fs::create_directories(tmp.path() / "foreign/usr");
    ASSERT_EQ(::chown((tmp.path() / "foreign/usr").c_str(), owner, owner), 0);
    fs::create_symlink(tmp.path() / "foreign", version / "rootfs");
  } else {
    fs::create_symlink("/", version / "rootfs");
  }
  Result r = env.run({"instance", "create", "img-foreign", "--image", "fake"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("belongs to uid " + std::to_string(owner)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("build the image as the user who runs ns-hpc (ns-hpc image build NAME)"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(env.instances() / "img-foreign"));
  // An agent is told what to ask of the operator, never to run the build itself.
  McpSession server(env);
  const json refused = server.call_and_wait("create_instance", {{"instance_id", "img-foreign"}, {"image", "fake"}});
  const std::string said = result_text(refused);
  EXPECT_TRUE(refused["result"].value("isError", false)) << refused.dump();
  EXPECT_NE(said.find("belongs to uid " + std::to_string(owner)), std::string::npos) << said;
  EXPECT_NE(said.find("ask the server's operator to build the image as the user who runs the server"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("ns-hpc"), std::string::npos) << said;
  EXPECT_FALSE(fs::exists(env.instances() / "img-foreign"));
}

// An image version stays while an instance uses it, archived instances included (a restore
// brings the instance back on the same version): `image rm` names them and removes nothing; once
// they are gone it removes the image.
TEST_F(StandInImages, AnImageUsedByAnArchivedInstanceIsKeptUntilTheArchiveIsGone) {
  fs::create_directories(stand_in("mini") / "rootfs/usr");
  env.create("img-kept", {"--image", "mini"});
  ASSERT_EQ(env.run({"instance", "archive", "-f", "img-kept"}).exit_code, 0);
  const json archives = nshpc::parse_json(env.run({"instance", "list-archived", "--json"}).out);
  ASSERT_EQ(archives.size(), 1u) << archives.dump();
  const std::string archive = archives[0]["name"].get<std::string>();

  Result refused = env.run({"image", "rm", "mini"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find(archive + " (archived)"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::exists(images / "mini/20260101T000000Z/rootfs/usr"));
  EXPECT_NE(env.run({"image", "list"}).out.find(archive + " (archived)"), std::string::npos);

  ASSERT_EQ(env.run({"instance", "delete", "--archived", "-f", archive}).exit_code, 0);
  Result removed = env.run({"image", "rm", "mini"});
  EXPECT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_FALSE(fs::exists(images / "mini"));
}
