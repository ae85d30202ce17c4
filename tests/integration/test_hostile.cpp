// The server never trusts what a sandbox controls (issue 10): links, FIFOs and folders planted in
// the workspace, limits asked to be off, /tmp filled, trees that resist deletion, audit lines
// without end. Each test does the hostile thing from inside a real sandbox and asserts what the
// user then sees. Runs as root and again as a normal user (scripts/test-as-user.sh).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

constexpr const char* kHostSecret = "host-secret-4b1d9e";

// A host file the server can read but no sandbox may: 0600, owned by whoever runs the tests.
fs::path make_secret(const Env& env) {
  const fs::path dir = env.root() / "host-private";
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  const fs::path file = dir / "secret.txt";
  std::ofstream(file) << kHostSecret << "\n";
  ::chmod(file.c_str(), 0600);
  return file;
}

json parse_json(const Result& r) {
  auto j = nshpc::parse_json_or_discarded(r.out);
  EXPECT_TRUE(j.is_object()) << r.out << r.err;
  return j;
}

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override { env_.create("alpha"); }
  json submit(const std::string& command, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"instance", "run", "alpha", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", command});
    return parse_json(env_.run(args));
  }
  json status(const std::string& job) {
    return parse_json(env_.run({"instance", "status", "alpha", job, "--json"}, "", std::chrono::seconds(30)));
  }
  Env env_{"[jobs]\ncancel_grace = 1\n"};
};

}  // namespace

TEST_F(Hostile, AJobOutputReplacedByALinkToAHostFileIsNeverRead) {
  const fs::path secret = make_secret(env_);
  json job = submit("for f in /workspace/.ns_hpc_output/*; do ln -sf '" + secret.string() + "' \"$f\"; done");
  ASSERT_EQ(job["status"], "completed") << job.dump();
  for (const json& view : {job, status(job["job_id"])}) {
    EXPECT_EQ(view.dump().find(kHostSecret), std::string::npos) << view.dump();
  }
  json later = status(job["job_id"]);
  EXPECT_NE(later["stdout_tail"].get<std::string>().find("was not read"), std::string::npos) << later.dump();
  // The instance's own private files and the audit log stay out of reach the same way.
  json other = submit("ln -sf " + (env_.instances() / "alpha" / "audit.log").string() +
                      " /workspace/.ns_hpc_output/x; for f in /workspace/.ns_hpc_output/*.err; do ln -sf " +
                      (env_.instances() / "alpha" / "metadata.json").string() + " \"$f\"; done");
  json seen = status(other["job_id"]);
  EXPECT_EQ(seen.dump().find("instance.created"), std::string::npos) << seen.dump();
  EXPECT_NE(seen["stderr_tail"].get<std::string>().find("was not read"), std::string::npos) << seen.dump();
}

TEST_F(Hostile, AnOutputFolderReplacedByALinkToAHostFolderGetsNothingCreatedThere) {
  const fs::path host_dir = env_.root() / "host-dir";
  fs::create_directories(host_dir);
  ::chmod(host_dir.c_str(), 0755);
  ASSERT_EQ(env_.run({"bwrap", "alpha", "--", "sh", "-c",
                      "rm -rf /workspace/.ns_hpc_output && ln -s " + host_dir.string() + " /workspace/.ns_hpc_output"})
                .exit_code,
            0);
  Result r = env_.run({"instance", "run", "alpha", "--", "echo planted > /dev/null"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is not a plain folder"), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(fs::is_empty(host_dir)) << "the server created files in a host folder the sandbox pointed it to";
  // Once the agent removes the link, jobs work again.
  ASSERT_EQ(env_.run({"bwrap", "alpha", "--", "rm", "/workspace/.ns_hpc_output"}).exit_code, 0);
  EXPECT_EQ(submit("echo back")["stdout_tail"], "back");
}

TEST_F(Hostile, AFifoInPlaceOfTheOutputNeverHangsTheServer) {
  json job = submit("for f in /workspace/.ns_hpc_output/*; do rm -f \"$f\"; mkfifo \"$f\"; done");
  ASSERT_EQ(job["status"], "completed") << job.dump();
  for (int i = 0; i < 3; ++i) {
    json view = status(job["job_id"]);  // a FIFO would block open() for good
    EXPECT_NE(view["stdout_tail"].get<std::string>().find("not a regular file"), std::string::npos) << view.dump();
  }
  // The MCP server too: poll_job answers, and so does everything after it.
  McpSession mcp(env_);
  for (int i = 0; i < 3; ++i) {
    json r = mcp.call_and_wait("poll_job", {{"instance_id", "alpha"}, {"job_id", job["job_id"]}, {"timeout", 0}},
                               std::chrono::seconds(30));
    ASSERT_TRUE(r.is_object()) << "poll_job did not answer";
  }
  json list = mcp.call_and_wait("list_instances", json::object(), std::chrono::seconds(30));
  EXPECT_NE(result_text(list).find("alpha"), std::string::npos);
}

TEST_F(Hostile, AskingForZeroNeverSwitchesALocalLimitOff) {
  for (const std::string limit : {"pids=0", "memory=0", "time=0", "output=0", "cpus=0"}) {
    Result r = env_.run({"instance", "run", "alpha", "-l", limit, "--", "echo ran"});
    EXPECT_NE(r.exit_code, 0) << limit;
    EXPECT_NE(r.err.find("below its minimum"), std::string::npos) << limit << ": " << r.err;
    EXPECT_EQ(r.out.find("ran"), std::string::npos);
  }
  // An administrator cannot configure it off either.
  Env bad("[jobs.local.limit]\npids = { default = 0, max = 10 }\n");
  Result r = bad.run({"config", "show"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("below the minimum"), std::string::npos) << r.err;
}

TEST(HostileTmp, TmpAndDevShmAreSizedByTmpSize) {
  Env env("tmp_size = 8\n");  // lands in the harness's [namespace]
  env.create("alpha");
  for (const std::string dir : {"/tmp", "/dev/shm"}) {
    Result r = env.run({"bwrap", "alpha", "--", "sh", "-c", "head -c 20000000 /dev/zero > " + dir + "/fill"});
    EXPECT_NE(r.exit_code, 0) << dir << " took 20 MB with tmp_size = 8 MiB";
    Result small = env.run({"bwrap", "alpha", "--", "sh", "-c", "head -c 1000000 /dev/zero > " + dir + "/fill"});
    EXPECT_EQ(small.exit_code, 0) << dir << ": " << small.err;
  }
}

TEST(HostileTerminal, TerminalExecuteRunsUnderItsLimits) {
  Env env("[terminal.limits]\npids = 40\nmemory = 64\noutput = 1\n");
  env.create("alpha");
  McpSession mcp(env);
  // output: a file larger than the limit cannot be written (RLIMIT_FSIZE works everywhere).
  json big = mcp.call_and_wait("terminal_execute",
                               {{"instance_id", "alpha"}, {"command", "head -c 3000000 /dev/zero > big; echo rc=$?; wc -c < big"}});
  const std::string text = result_text(big);
  EXPECT_EQ(text.find("rc=0"), std::string::npos) << text;
  EXPECT_NE(text.find("1048576"), std::string::npos) << text;
  if (::geteuid() != 0) GTEST_SKIP() << "pids and memory limits need writable cgroups (root here)";
  json forks = mcp.call_and_wait(
      "terminal_execute",
      {{"instance_id", "alpha"}, {"command", "for i in $(seq 100); do sleep 5 & done; echo started"}});
  EXPECT_NE(result_text(forks).find("fork"), std::string::npos) << result_text(forks);
  json hog = mcp.call_and_wait("terminal_execute",
                               {{"instance_id", "alpha"}, {"command", "awk 'BEGIN { s = \"x\"; for (i = 0; i < 28; i++) s = s s; print length(s) }'"}});
  const std::string hog_text = result_text(hog);
  EXPECT_NE(hog_text.find("out of memory"), std::string::npos) << hog_text;
}

TEST_F(Hostile, DeleteRemovesADeepTreeAndFinishesLeftoversAtTheNextStart) {
  ASSERT_EQ(env_.run({"bwrap", "alpha", "--", "sh", "-c",
                      "i=0; while [ $i -lt 2000 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; echo x > leaf"},
                     "", std::chrono::seconds(120))
                .exit_code,
            0);
  Result r = env_.run({"instance", "delete", "alpha", "-f"}, "", std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const auto& entry : fs::directory_iterator(env_.instances()))
    EXPECT_EQ(entry.path().filename().string().rfind(".deleting-", 0), std::string::npos) << entry.path();
  // A delete cut short (a crash) leaves a .deleting-* tree: the next server start removes it.
  const fs::path leftover = env_.instances() / ".deleting-beta-0000";
  fs::create_directories(leftover / "workspace" / "a" / "b");
  std::ofstream(leftover / "workspace" / "a" / "b" / "f") << "x";
  { McpSession mcp(env_); }
  EXPECT_FALSE(fs::exists(leftover));
}

TEST_F(Hostile, DeletingAnInstanceStopsTheCommandStillWritingInIt) {
  McpSession mcp(env_);
  const int running = mcp.call("terminal_execute", {{"instance_id", "alpha"},
                                                    {"command", "mkdir -p w; i=0; while :; do echo $i > w/f$i; i=$((i+1)); done"},
                                                    {"timeout", 60}});
  ASSERT_TRUE(eventually([&] { return fs::exists(env_.instances() / "alpha" / "workspace" / "w" / "f100"); },
                         std::chrono::seconds(20)));
  json deleted = mcp.call_and_wait("delete_instance", {{"instance_id", "alpha"}}, std::chrono::seconds(60));
  EXPECT_FALSE(deleted["result"].value("isError", false)) << deleted.dump();
  json ended = mcp.wait_for(running, std::chrono::seconds(30));
  EXPECT_TRUE(ended.is_object()) << "the command in the deleted instance kept running";
  for (const auto& entry : fs::directory_iterator(env_.instances()))
    EXPECT_EQ(entry.path().filename().string().rfind(".deleting-", 0), std::string::npos) << entry.path();
}

TEST_F(Hostile, NulBytesInACommandAreRefusedNotCut) {
  McpSession mcp(env_);
  json r = mcp.call_and_wait("terminal_execute",
                             {{"instance_id", "alpha"}, {"args", {"echo", std::string("a\0b", 3)}}});
  EXPECT_TRUE(r["result"].value("isError", false)) << r.dump();
  EXPECT_NE(result_text(r).find("NUL"), std::string::npos) << r.dump();
  json cwd = mcp.call_and_wait("terminal_execute", {{"instance_id", "alpha"},
                                                    {"command", "pwd"},
                                                    {"working_directory", std::string("/workspace\0/etc", 15)}});
  EXPECT_TRUE(cwd["result"].value("isError", false)) << cwd.dump();
  json job = mcp.call_and_wait("submit_job", {{"instance_id", "alpha"}, {"command", std::string("echo a\0b", 8)}});
  EXPECT_TRUE(job["result"].value("isError", false)) << job.dump();
}

TEST_F(Hostile, JobTailsAndTerminalOutputShowInvalidUtf8TheSameWay) {
  json job = submit("printf 'a\\377b\\n'");
  McpSession mcp(env_);
  json term = mcp.call_and_wait("terminal_execute", {{"instance_id", "alpha"}, {"command", "printf 'a\\377b\\n'"}});
  EXPECT_EQ(job["stdout_tail"], "a\xEF\xBF\xBD" "b") << job.dump();
  EXPECT_EQ(term["result"]["structuredContent"]["stdout"], "a\xEF\xBF\xBD" "b\n") << term.dump();
  json polled = mcp.call_and_wait("poll_job", {{"instance_id", "alpha"}, {"job_id", job["job_id"]}, {"timeout", 0}});
  EXPECT_EQ(result_text(polled).find("\\xff"), std::string::npos) << result_text(polled);
}

TEST_F(Hostile, BatchOutputIsWrittenBeneathTheWorkspaceNeverThroughALink) {
  // How a Slurm batch job writes its output on the node: ns-hpc bwrap --stdout/--stderr.
  const fs::path secret = make_secret(env_);
  ASSERT_EQ(env_.run({"bwrap", "alpha", "--", "sh", "-c",
                      "mkdir -p .ns_hpc_output && ln -sf " + secret.string() + " .ns_hpc_output/j.out"})
                .exit_code,
            0);
  Result r = env_.run({"bwrap", "--stdout", ".ns_hpc_output/j.out", "alpha", "--", "echo overwritten"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(read_text(secret), std::string(kHostSecret) + "\n");
  Result ok = env_.run({"bwrap", "--stdout", ".ns_hpc_output/k.out", "--stderr", ".ns_hpc_output/k.err", "alpha", "--",
                        "sh", "-c", "echo to-out; echo to-err >&2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(read_text(env_.instances() / "alpha" / "workspace" / ".ns_hpc_output" / "k.out"), "to-out\n");
  EXPECT_EQ(read_text(env_.instances() / "alpha" / "workspace" / ".ns_hpc_output" / "k.err"), "to-err\n");
}

TEST_F(Hostile, AShellCommandIsNotInAnyArgvOtherUsersCanRead) {
  const std::string marker = "API_KEY=hidden-" + std::to_string(::getpid());
  McpSession mcp(env_);
  const int call = mcp.call("terminal_execute", {{"instance_id", "alpha"}, {"command", marker + " sleep 3; echo done $0"}});
  json job = mcp.call_and_wait("submit_job", {{"instance_id", "alpha"}, {"command", marker + " sleep 3"}, {"timeout", 0}});
  ASSERT_TRUE(job.is_object());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_TRUE(processes_with("hidden-" + std::to_string(::getpid())).empty())
      << "a command line shows the command";
  json done = mcp.wait_for(call, std::chrono::seconds(30));
  EXPECT_EQ(done["result"]["structuredContent"]["stdout"], "done /bin/bash\n") << done.dump();
}
