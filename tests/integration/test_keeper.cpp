// The job keeper (src/sandbox/keeper.hpp) against a real MCP server on stdio: nothing a job
// leaves behind outlives it, nothing piles up under the server, and the wall-time limit holds
// while no server runs.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

// Children of `parent` that have exited and wait to be reaped.
std::vector<pid_t> zombie_children(pid_t parent) {
  std::vector<pid_t> zombies;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream in(entry.path() / "stat");
    std::string line;
    std::getline(in, line);
    const auto paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 1));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state == 'Z') zombies.push_back(std::stoi(name));
  }
  return zombies;
}

class Keeper : public ::testing::Test {
 protected:
  void SetUp() override { env_.create("alpha"); }
  Env env_{"[jobs]\ncancel_grace = 1\n"};
};

}  // namespace

TEST_F(Keeper, NothingAJobLeavesBehindOutlivesItAndNoZombiesPileUp) {
  McpSession server(env_);
  // Background children of three kinds: a plain `&`, setsid'd and nohup'd ones that would run
  // for a day, and a short one whose end (while the sandbox init waits for it) used to leave
  // the init as a zombie under the server. The markers appear only after the shell expands them.
  std::vector<std::string> ids;
  for (int i = 0; i < 10; ++i) {
    const std::string command =
        i % 2 == 0 ? "sleep 1.$((61000+1)) & echo started"
                   : "sleep $((61000+1)).1 & setsid sleep $((61000+1)).2 & "
                     "nohup sleep $((61000+1)).3 >/dev/null 2>&1 & echo started";
    json j = server.tool("submit_job", {{"instance_id", "alpha"}, {"command", command}, {"timeout", 30}});
    ASSERT_EQ(j.value("status", ""), "completed") << j.dump();
    EXPECT_EQ(j.value("stdout_tail", ""), "started");
    ids.push_back(j["job_id"]);
  }
  for (const auto& id : ids)
    EXPECT_EQ(server.tool("poll_job", {{"instance_id", "alpha"}, {"job_id", id}})["status"], "completed");

  EXPECT_TRUE(eventually([] { return processes_with("61001.").empty(); }, std::chrono::seconds(10)))
      << processes_with("61001.").size() << " background processes of finished jobs still run";
  // Once the short ones are gone too (they end by themselves after 1.6 s, longer than the old
  // 1 s wait for the sandbox init), nothing of any sandbox waits under the server to be reaped.
  ASSERT_TRUE(eventually([] { return processes_with("1.61001").empty(); }, std::chrono::seconds(10)));
  EXPECT_TRUE(eventually([&] { return zombie_children(server.pid()).empty(); }, std::chrono::seconds(5)))
      << zombie_children(server.pid()).size() << " zombies under the server";
  // The server still answers.
  EXPECT_EQ(server.tool("list_jobs", {{"instance_id", "alpha"}}).value("jobs", json::array()).size(), 10u);
}

TEST_F(Keeper, TheTimeLimitHoldsWhileNoServerRunsAndTheRealEndIsRecorded) {
  std::string id;
  {
    McpSession server(env_);
    // A job that ignores SIGTERM (so the grace runs out and SIGKILL ends it) and leaves a
    // setsid'd child, submitted without waiting; then the server dies at once.
    json j = server.tool("submit_job", {{"instance_id", "alpha"},
                                        {"command", "setsid sleep $((62000+1)).7 & trap '' TERM; sleep $((62000+1)).5"},
                                        {"limits", {{"time", 2}}},
                                        {"timeout", 0}});
    ASSERT_EQ(j.value("status", ""), "running") << j.dump();
    id = j["job_id"];
    server.crash();
  }
  ASSERT_TRUE(eventually([] { return processes_with("62001.").size() >= 2; }, std::chrono::seconds(5)))
      << "the job should still run right after its server died";
  // time 2 s + grace 1 s; the bound only has to be far below the job's own length (a day).
  EXPECT_TRUE(eventually([] { return processes_with("62001.").empty(); }, std::chrono::seconds(20)))
      << processes_with("62001.").size() << " processes of the job outlived its time limit";

  // Restarted a while later: when the job ended is what its keeper saw, not when we looked.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  McpSession again(env_);
  json j = again.tool("poll_job", {{"instance_id", "alpha"}, {"job_id", id}, {"timeout", 10}});
  EXPECT_EQ(j.value("status", ""), "timed_out") << j.dump();
  EXPECT_NE(j.value("reason", "").find("time limit of 2 s"), std::string::npos) << j.dump();
  const double duration = j.value("duration_s", 0.0);
  EXPECT_GE(duration, 1.5) << j.dump();
  EXPECT_LT(duration, 2 + 1 + 3) << j.dump();
}

TEST_F(Keeper, IsOutOfReachFromInsideTheSandbox) {
  // The job waits for the host pid of its own keeper, then tries to see and kill it.
  Result r = env_.run({"instance", "run", "alpha", "--json", "--timeout", "0", "--",
                       "while [ ! -s /workspace/keeper.pid ]; do sleep 0.05; done; k=$(cat /workspace/keeper.pid); "
                       "grep -l '[_]_keeper' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; "
                       "kill -KILL $k 2>/dev/null; echo kill=$?; [ -e /proc/$k ]; echo visible=$?"});
  json j = nshpc::parse_json_or_discarded(r.out);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  ASSERT_EQ(j["status"], "running") << r.out;
  const std::string id = j["job_id"];
  const fs::path status_file = env_.instances() / "alpha" / "status" / (id + ".status");
  pid_t keeper = 0;
  ASSERT_TRUE(eventually([&] {
    const std::string text = read_text(status_file);
    json doc = nshpc::parse_json_or_discarded(text.substr(0, text.find('\n')));
    if (doc.is_object() && doc.contains("ns-hpc-keeper")) keeper = doc["ns-hpc-keeper"].get<pid_t>();
    return keeper > 0;
  }, std::chrono::seconds(5))) << read_text(status_file);
  {
    const fs::path pid_file = env_.instances() / "alpha" / "workspace" / "keeper.pid";
    std::ofstream(pid_file) << keeper << "\n";
    ::chmod(pid_file.c_str(), 0644);
  }
  Result done = env_.run({"instance", "status", "alpha", id, "--json", "--timeout", "20"});
  json d = nshpc::parse_json_or_discarded(done.out);
  ASSERT_TRUE(d.is_object()) << done.out << done.err;
  EXPECT_EQ(d["status"], "completed") << done.out;
  EXPECT_EQ(d["stdout_tail"], "0\nkill=1\nvisible=1") << done.out;  // not listed, not killable, not there
}
