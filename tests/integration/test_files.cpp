// The file tools through the real `ns-hpc run` on stdio, against a sandbox that attacks them:
// links to host files planted by sandbox commands, a link swapped back and forth by a running
// job while the server reads, and ownership of what the server writes. Run as root (the sandbox
// is uid 65534) and, in IntegrationAsUnprivilegedUser, as a normal user.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "common/temp_dir.hpp"
#include "files/broker.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

class FileTools : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.create(kId);
    secret_ = env_.root() / "host-secret.txt";
    std::ofstream(secret_) << kSecret << "\n";
    ::chmod(env_.root().c_str(), 0755);
  }
  json call(McpSession& server, const std::string& tool, json args) {
    args["instance_id"] = kId;
    json r = server.call_and_wait(tool, args);
    EXPECT_TRUE(r.is_object() && r.contains("result")) << r.dump().substr(0, 500);
    return r;
  }
  static bool is_error(const json& r) { return r["result"].value("isError", false); }
  static constexpr const char* kId = "files-int";
  Env env_;
  fs::path secret_;
};

}  // namespace

TEST_F(FileTools, LinksPlantedBySandboxCommandsNeverReachHostFiles) {
  McpSession server(env_);
  const std::string s = secret_.string();
  json planted = call(server, "terminal_execute",
                      {{"command", "ln -s " + s + " abs && ln -s ../../../../../../../../.." + s + " rel && ln -s " +
                                       env_.root().string() + " dir && ln -s ../metadata.json meta && ln -s "
                                       "/proc/self/root" + s + " proc && mkdir -p sub && ln -s ../.. sub/up"}});
  ASSERT_EQ(planted["result"]["structuredContent"]["exit_code"], 0) << planted.dump();
  for (const char* p : {"abs", "rel", "dir/host-secret.txt", "meta", "proc", "sub/up/metadata.json",
                        "sub/up/audit.log", "/workspace/../metadata.json"}) {
    json r = call(server, "read_file", {{"path", p}});
    EXPECT_TRUE(is_error(r)) << p << ": " << r.dump().substr(0, 400);
    EXPECT_EQ(r.dump().find(kSecret), std::string::npos) << p;
    EXPECT_EQ(r.dump().find("created_at"), std::string::npos) << p << " shows metadata";
  }
  // The files resource and copy_file do not follow them out either.
  json res = server.wait_for(server.request("resources/read", {{"uri", std::string("resource://ns-hpc/instances/") + kId +
                                                                           "/files/workspace/abs"}}));
  EXPECT_EQ(res.dump().find(kSecret), std::string::npos);
  EXPECT_TRUE(is_error(call(server, "copy_file", {{"source", "rel"}, {"destination", "copied"}})));
  // Writing to a link replaces the link; the host file stays as it was.
  json w = call(server, "write_file", {{"path", "abs"}, {"content", "mine"}});
  EXPECT_FALSE(is_error(w)) << w.dump();
  EXPECT_EQ(read_text(secret_), std::string(kSecret) + "\n");
  // Deleting a link to a folder deletes the link, not the folder's files.
  EXPECT_FALSE(is_error(call(server, "delete_file", {{"path", "dir"}, {"recursive", true}})));
  EXPECT_TRUE(fs::exists(secret_));
  EXPECT_TRUE(fs::exists(env_.instances() / kId / "metadata.json"));
}

TEST_F(FileTools, WhatTheServerWritesBelongsToTheSandboxUser) {
  McpSession server(env_);
  ASSERT_FALSE(is_error(call(server, "write_file", {{"path", "new/dir/f.txt"}, {"content", "x\n"}})));
  ASSERT_FALSE(is_error(call(server, "copy_file", {{"source", "new"}, {"destination", "/output/copy"}})));
  json seen = server.tool("terminal_execute",
                          {{"instance_id", kId},
                           {"command", "id -u; stat -c %u new new/dir new/dir/f.txt /output/copy /output/copy/dir/f.txt; "
                                       "echo more >> new/dir/f.txt && echo appended"}});
  std::istringstream lines(seen["stdout"].get<std::string>());
  std::string uid, line;
  std::getline(lines, uid);
  int owned = 0;
  while (std::getline(lines, line) && line != "appended") {
    EXPECT_EQ(line, uid) << seen.dump();
    ++owned;
  }
  EXPECT_EQ(owned, 5) << seen.dump();
  EXPECT_EQ(line, "appended") << seen.dump();
  struct stat st {};
  ASSERT_EQ(::stat((env_.instances() / kId / "workspace" / "new" / "dir" / "f.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid() == 0 ? 65534u : ::geteuid());
}

// A job swaps `d` between a folder and links out of the workspace as fast as it can while the
// server reads d/passwd and writes d/new: never the host's /etc/passwd, never a file outside.
TEST_F(FileTools, ALinkSwappedByARunningJobNeverLeadsOut) {
  McpSession server(env_);
  json job = server.tool(
      "submit_job",
      {{"instance_id", kId},
       {"command", "mkdir -p real && echo inside > real/passwd && "
                   "end=$((SECONDS+8)); while [ $SECONDS -lt $end ]; do ln -sfn /etc d; ln -sfn ../../../../../../etc d; "
                   "ln -sfn " + env_.root().string() + " d; rm -f d; ln -sfn real d; done"},
       {"timeout", 0}});
  ASSERT_TRUE(job.contains("job_id")) << job.dump();
  int inside = 0;
  std::string last;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  while (std::chrono::steady_clock::now() < until) {
    json r = call(server, "read_file", {{"path", "d/passwd"}});
    const std::string all = r.dump();
    ASSERT_EQ(all.find("root:x:0:0"), std::string::npos) << "read the host's /etc/passwd: " << all.substr(0, 300);
    if (!is_error(r) && r["result"]["structuredContent"]["content"] == "inside\n") ++inside;
    last = result_text(r);
    // (No parents: a folder made at a moment d is missing would end the swapping.)
    call(server, "write_file", {{"path", "d/new"}, {"content", "x"}, {"create_parent_directories", false}});
    call(server, "read_file", {{"path", "d/host-secret.txt"}});
  }
  EXPECT_FALSE(fs::exists(env_.root() / "new"));
  EXPECT_FALSE(fs::exists("/etc/new"));
  EXPECT_EQ(read_text(secret_), std::string(kSecret) + "\n");
  std::printf("[ %d reads of d/passwd landed inside while the job swapped d ]\n", inside);
  EXPECT_GT(inside, 0) << "no read landed while d pointed inside (the job did not swap?): " << last;
  server.tool("cancel_job", {{"instance_id", kId}, {"job_id", job["job_id"]}});
}

// The file broker (files/broker.hpp) is root of a user namespace that maps every file of the
// user: it must do nothing the server's descriptor does not reach. Driven here directly (as
// ns-hpc __file-broker, without the namespace), with requests a buggy caller could send.
TEST(FileBroker, ReachesNothingBeyondTheDescriptorsItIsGiven) {
  nshpc::tests::TempDir tmp;
  fs::create_directories(tmp.path() / "root/sub");
  std::ofstream(tmp.path() / "secret") << "host file\n";
  std::ofstream(tmp.path() / "root/sub/f") << "inside\n";
  fs::create_symlink("/etc/passwd", tmp.path() / "root/abs");
  fs::create_symlink("../../secret", tmp.path() / "root/sub/up");
  nshpc::files::Broker broker({binary(), std::string(nshpc::files::kBrokerCommand)});
  nshpc::UniqueFd root(::open((tmp.path() / "root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  using nshpc::fs::Resolve;

  EXPECT_EQ(broker.mkdirat(root.get(), "made", 0755), 0);  // what it is for
  EXPECT_TRUE(fs::is_directory(tmp.path() / "root/made"));
  nshpc::UniqueFd f = broker.open_beneath(root.get(), "sub/f", O_RDONLY, 0, Resolve::in_root, "sub/f");
  char buffer[16] = {};
  EXPECT_EQ(::read(f.get(), buffer, sizeof buffer), 7);

  // A path where a name is asked for.
  EXPECT_EQ(broker.mkdirat(root.get(), "../escaped", 0755), EINVAL);
  EXPECT_EQ(broker.unlinkat(root.get(), "../secret", 0), EINVAL);
  EXPECT_EQ(broker.unlinkat(root.get(), "sub/f", 0), EINVAL);
  EXPECT_EQ(broker.renameat2(root.get(), "made", root.get(), "../moved", 0), EINVAL);
  EXPECT_EQ(broker.symlinkat("/", root.get(), "../link"), EINVAL);
  EXPECT_EQ(broker.remove_tree_at(root.get(), ".."), EINVAL);
  EXPECT_FALSE(fs::exists(tmp.path() / "escaped"));
  EXPECT_TRUE(fs::exists(tmp.path() / "secret"));
  // Opens stay beneath the descriptor: ".." and links are clamped to it or refused.
  for (const char* path : {"../secret", "abs", "sub/up"}) {
    for (Resolve how : {Resolve::in_root, Resolve::in_root_follow}) {
      try {
        nshpc::UniqueFd fd = broker.open_beneath(root.get(), path, O_RDONLY, 0, how, path);
        char got[64] = {};
        const ssize_t n = ::read(fd.get(), got, sizeof got - 1);
        ADD_FAILURE() << path << " opened through the broker: " << (n > 0 ? got : "");
      } catch (const nshpc::SysError& e) {
        EXPECT_TRUE(e.code() == ENOENT || e.code() == ELOOP || e.code() == EXDEV) << path << ": " << e.what();
      }
    }
  }
  EXPECT_THROW(broker.open_beneath(root.get(), "/etc/passwd", O_RDONLY, 0, Resolve::in_root, "/etc/passwd"),
               nshpc::SysError);
  EXPECT_THROW(broker.open_beneath(root.get(), "sub/up", O_RDONLY, 0, Resolve::beneath_no_links, "sub/up"),
               nshpc::SysError);
}

// Run by hand it says what it is and does nothing.
TEST(FileBroker, RunByHandSaysItIsStartedByTheServerOnly) {
  const std::string line = binary() + " " + std::string(nshpc::files::kBrokerCommand) + " 3</dev/null 2>&1";
  FILE* p = ::popen(line.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string said;
  char buffer[512];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, p)) > 0;) said.append(buffer, n);
  const int status = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(said.find("started by ns-hpc only"), std::string::npos) << said;
}

// Issue 29: copy_file of a folder checks every file as read_file checks one. A root-only file
// planted from the host in a workspace folder is not handed to the sandbox by copying the
// folder: the copy is refused naming the file, and nothing of it is made.
TEST_F(FileTools, ACopiedFolderNeverHandsTheSandboxAFileItMayNotRead) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "as a normal user the server plants only files of its own uid, which is the sandbox's: there is "
                    "no file of another uid for a copy to hand out";
  McpSession server(env_);
  ASSERT_FALSE(is_error(call(server, "write_file", {{"path", "dir/sub/mine.txt"}, {"content", "mine\n"}})));
  const fs::path planted = env_.instances() / kId / "workspace" / "dir" / "sub" / "root-only";
  std::ofstream(planted) << kSecret << "\n";
  ASSERT_EQ(::chmod(planted.c_str(), 0600), 0);
  for (const char* to : {"copy", "/output/copy"}) {
    json r = call(server, "copy_file", {{"source", "dir"}, {"destination", to}});
    EXPECT_TRUE(is_error(r)) << r.dump();
    EXPECT_NE(result_text(r).find("/workspace/dir/sub/root-only (it belongs to uid 0"), std::string::npos) << r.dump();
    EXPECT_EQ(r.dump().find(kSecret), std::string::npos);
  }
  // From inside: no copy to read, nothing half made.
  Result inside = env_.run({"bwrap", kId, "--", "/bin/sh", "-c",
                            "cat copy/sub/root-only /output/copy/sub/root-only dir/sub/root-only; ls -A . /output"});
  EXPECT_EQ(inside.out.find(kSecret), std::string::npos) << inside.out;
  EXPECT_EQ(inside.out.find("copy"), std::string::npos) << "a copy or its temporary was left: " << inside.out;
  EXPECT_NE(inside.out.find("dir"), std::string::npos) << inside.out << inside.err;
  // Without the planted file the folder is copied, whole.
  ASSERT_TRUE(fs::remove(planted));
  EXPECT_FALSE(is_error(call(server, "copy_file", {{"source", "dir"}, {"destination", "copy"}})));
  EXPECT_EQ(env_.run({"bwrap", kId, "--", "cat", "copy/sub/mine.txt"}).out, "mine\n");
}

// The error of a copy says what is missing: the source (or what a link there leads to), or the
// destination's folder.
TEST_F(FileTools, ACopyWithAMissingSourceSaysTheSourceIsMissing) {
  McpSession server(env_);
  ASSERT_FALSE(is_error(call(server, "write_file", {{"path", "a.txt"}, {"content", "a\n"}})));
  ASSERT_EQ(call(server, "terminal_execute", {{"command", "ln -s gone dangling"}})["result"]["structuredContent"]["exit_code"], 0);
  json missing = call(server, "copy_file", {{"source", "nope.txt"}, {"destination", "b.txt"}});
  EXPECT_NE(result_text(missing).find("The source does not exist: /workspace/nope.txt"), std::string::npos) << missing.dump();
  json dangling = call(server, "copy_file", {{"source", "dangling"}, {"destination", "b.txt"}});
  EXPECT_NE(result_text(dangling).find("The source /workspace/dangling is a link to something that does not exist"),
            std::string::npos)
      << dangling.dump();
  json parent = call(server, "copy_file", {{"source", "a.txt"}, {"destination", "no/such/b.txt"}});
  EXPECT_NE(result_text(parent).find("The destination's parent directory does not exist: /workspace/no/such"),
            std::string::npos)
      << parent.dump();
  json moved = call(server, "move_file", {{"source", "nope.txt"}, {"destination", "b.txt"}});
  EXPECT_NE(result_text(moved).find("The source does not exist: /workspace/nope.txt"), std::string::npos) << moved.dump();
}

// Issue 29: a path is at most 4,096 bytes (the error names the limit), and its walk is linear: 16
// reads at once of a file 2,000 folders deep each get the file (asserted by result, not time).
TEST_F(FileTools, PathsAreBoundedAndSixteenDeepReadsAtOnceEachGetTheirFile) {
  McpSession server(env_);
  // 4,000 bytes below the workspace: removed by descriptor (a removal by path would pass PATH_MAX).
  struct RemovedAtEnd {
    fs::path tree;
    ~RemovedAtEnd() {
      try {
        nshpc::fs::remove_tree(tree);
      } catch (const nshpc::SysError& e) {
        ADD_FAILURE() << e.what();
      }
    }
  } removed{env_.instances() / kId / "workspace" / "a"};
  std::string deep;
  for (int i = 0; i < 2000; ++i) deep += "a/";
  json made = call(server, "terminal_execute", {{"command", "mkdir -p " + deep + " && echo deep > " + deep + "f"}});
  ASSERT_EQ(made["result"]["structuredContent"]["exit_code"], 0) << made.dump().substr(0, 500);
  std::vector<int> ids;
  for (int i = 0; i < 16; ++i)
    ids.push_back(server.call("read_file", {{"instance_id", kId}, {"path", deep + (i % 4 == 3 ? "missing" : "f")}}));
  for (int i = 0; i < 16; ++i) {
    json r = server.wait_for(ids[i]);
    ASSERT_TRUE(r.contains("result")) << r.dump().substr(0, 300);
    if (i % 4 == 3) {
      EXPECT_TRUE(is_error(r));
      EXPECT_NE(result_text(r).find("File does not exist"), std::string::npos) << result_text(r).substr(0, 300);
    } else {
      EXPECT_EQ(r["result"]["structuredContent"]["content"], "deep\n") << r.dump().substr(0, 300);
    }
  }
  std::string long_path;
  while (long_path.size() < 160000) long_path += "a/";  // 80,000 components
  json r = call(server, "read_file", {{"path", long_path}});
  EXPECT_TRUE(is_error(r));
  EXPECT_NE(result_text(r).find("the path is 160000 bytes; the limit is 4096 bytes"), std::string::npos)
      << result_text(r).substr(0, 300);
  json c = call(server, "copy_file", {{"source", "a"}, {"destination", long_path}});
  EXPECT_NE(result_text(c).find("the limit is 4096 bytes"), std::string::npos) << result_text(c).substr(0, 300);
}
