// Living instances, as an agent and a user see them: one long-lived sandbox per instance that
// every command and job joins. Runs as root and again as an unprivileged user.
#include <signal.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;

namespace {

class Living : public ::testing::Test {
 protected:
  Living() : env_("persistent = true\nidle_stop = 120\ndefault_network = \"off\"\n") {}
  void SetUp() override { env_.create("alpha"); }
  Result in_alpha(const std::string& command) { return env_.run({"bwrap", "alpha", "--", "/bin/sh", "-c", command}); }
  Env env_;
};

}  // namespace

// A server started in the background by one command answers the next one, over the instance's
// own loopback (its network is off: no host address is involved), and /tmp is the same.
TEST_F(Living, BackgroundProcessesTmpAndLoopbackStayBetweenCommands) {
  Result start = in_alpha(
      "echo kept > /tmp/marker; cd /tmp && python3 -m http.server 18080 --bind 127.0.0.1 >/dev/null 2>&1 & "
      "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 18080))' "
      "2>/dev/null && break; sleep 0.05; done; echo started");
  ASSERT_EQ(start.exit_code, 0) << start.err;
  EXPECT_NE(start.out.find("started"), std::string::npos);
  Result next = in_alpha(
      "cat /tmp/marker; python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:18080/marker\").read().decode())'");
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_EQ(next.out, "kept\nkept\n\n");
  // Twice: the server survived answering (its log goes nowhere, its stdout was not a dead pipe).
  Result again = in_alpha("python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:18080/marker\").status)'");
  EXPECT_EQ(again.out, "200\n") << again.err;
}

// A command that times out has its whole tree killed (setsid'd and SIGTERM-ignoring processes
// included); a background process of an earlier command is not touched.
TEST_F(Living, ATimeoutKillsTheCommandsTreeAndNothingElse) {
  Result bg = in_alpha("setsid sh -c 'exec sleep 4321.5' >/dev/null 2>&1 & echo ok");
  ASSERT_EQ(bg.exit_code, 0) << bg.err;
  ASSERT_TRUE(eventually([] { return processes_with("4321.5").size() == 1; }, std::chrono::seconds(5)));

  McpSession server(env_);
  nlohmann::json result = server.tool(
      "terminal_execute",
      {{"instance_id", "alpha"},
       {"command", "setsid sh -c 'trap \"\" TERM; exec sleep 4322.5' & trap '' TERM; sleep 4322.6"},
       {"timeout", 1}});
  EXPECT_EQ(result["exit_code"], 124) << result.dump();
  EXPECT_TRUE(eventually([] { return processes_with("4322.").empty(); }, std::chrono::seconds(5)))
      << processes_with("4322.").size() << " survivors of the timed-out command";
  EXPECT_EQ(processes_with("4321.5").size(), 1u) << "the earlier command's background process was killed";
}

// The sandbox stops itself after idle_stop without use (no server needed); files stay, and the
// next command starts it again.
TEST(LivingIdle, StopsItselfWhenUnusedAndStartsAgainOnNextUse) {
  Env env("persistent = true\nidle_stop = 2\n");
  env.create("idle");
  Result first = env.run({"bwrap", "idle", "--", "/bin/sh", "-c", "echo data > f; sleep 3333.5 >/dev/null 2>&1 & echo ok"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(eventually([] { return processes_with("3333.5").size() == 1; }, std::chrono::seconds(5)));
  EXPECT_TRUE(eventually([] { return processes_with("3333.5").empty(); }, std::chrono::seconds(15)))
      << "still running after idle_stop";
  EXPECT_NE(read_text(env.instances() / "idle/status/sandbox.status").find("ns-hpc-idle"), std::string::npos);
  Result again = env.run({"bwrap", "idle", "--", "cat", "f"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "data\n");
}

// A local job runs inside the living sandbox: it sees the instance's /tmp.
TEST_F(Living, JobsRunInsideTheLivingSandbox) {
  ASSERT_EQ(in_alpha("echo from-a-command > /tmp/shared").exit_code, 0);
  McpSession server(env_);
  nlohmann::json job = server.tool("submit_job", {{"instance_id", "alpha"}, {"command", "cat /tmp/shared"}, {"timeout", 30}});
  EXPECT_EQ(job["status"], "completed") << job.dump();
  EXPECT_NE(job.dump().find("from-a-command"), std::string::npos) << job.dump();
}

// Through terminal_execute (with its per-command limits, a cgroup as root): a server started in
// the background, its output not redirected, keeps running and answering after the call that
// started it returned, and that call returns at once.
TEST_F(Living, TerminalExecuteBackgroundServerKeepsAnswering) {
  McpSession server(env_);
  nlohmann::json start = server.tool(
      "terminal_execute",
      {{"instance_id", "alpha"},
       {"command",
        "cd /tmp && echo page > index.txt && python3 -m http.server 18081 --bind 127.0.0.1 & "
        "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 18081))' "
        "2>/dev/null && break; sleep 0.05; done; echo up"}});
  EXPECT_EQ(start["exit_code"], 0) << start.dump();
  EXPECT_LT(start["exec_duration_ms"].get<int>(), 5000) << start.dump();
  for (int i = 0; i < 3; ++i) {
    nlohmann::json get = server.tool(
        "terminal_execute",
        {{"instance_id", "alpha"},
         {"args", {"python3", "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:18081/index.txt').read().decode(), end='')"}}});
    EXPECT_EQ(get["stdout"], "page\n") << get.dump();
  }
}

// Nothing inside can end the living sandbox: its main process is pid 1 (signals from inside do
// not reach it) and what it waits in is restarted; a background process of an earlier command
// lives on through the attempt.
TEST_F(Living, CommandsCannotKillTheSandboxItself) {
  ASSERT_EQ(in_alpha("sleep 6161.5 >/dev/null 2>&1 & echo ok").exit_code, 0);
  Result init = in_alpha("kill -KILL 1; kill -TERM 1; echo done");
  EXPECT_EQ(init.out, "done\n") << init.err;
  // Whatever these reach (as a normal user a command sees only its own processes), the sandbox
  // stays.
  in_alpha("pkill -KILL -x sleep; pkill -x bash; sleep 0.3");
  Result after = in_alpha("echo alive");
  EXPECT_EQ(after.out, "alive\n") << after.err;
  const std::string record = read_text(env_.instances() / "alpha/status/sandbox.status");
  EXPECT_EQ(record.find("ns-hpc-ended"), std::string::npos) << "the sandbox ended: " << record;
  // As root commands share the sandbox's pids: pkill -KILL -x sleep ended the agent's own sleep.
  if (::geteuid() == 0) {
    EXPECT_TRUE(eventually([] { return processes_with("6161.5").empty(); }, std::chrono::seconds(5)));
  }
}

// As root every command runs in the sandbox's own pid namespace (its tree is killed through its
// cgroup): a later command sees an earlier one's background process in ps and can stop it.
TEST_F(Living, AsRootALaterCommandCanPsAndKillAnEarlierOnesBackgroundProcess) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "as a normal user without delegated cgroups each command has a pid namespace of its own "
                    "(described in terminal_execute); the escape checks run as this user";
  ASSERT_EQ(in_alpha("sleep 5151.5 >/dev/null 2>&1 & echo ok").exit_code, 0);
  for (int i = 0; i < 5; ++i) {  // ps must work every time, whatever pid the command gets
    Result ps = in_alpha("ps -eo pid,args | grep -c '[s]leep 5151.5'");
    EXPECT_EQ(ps.out, "1\n") << ps.err;
  }
  Result kill = in_alpha("pkill -f '^sleep 5151.5' && echo killed");
  EXPECT_EQ(kill.out, "killed\n") << kill.err;
  EXPECT_TRUE(eventually([] { return processes_with("5151.5").empty(); }, std::chrono::seconds(5)));
}

// What terminal_execute's description says of background processes is what this server does:
// it says later calls' ps and kill do not see them exactly when a later command cannot stop an
// earlier one's background process (as root it can; as a normal user each command has its own
// pid namespace).
TEST_F(Living, TerminalExecuteSaysTrulyWhetherALaterCallSeesBackgroundProcesses) {
  McpSession server(env_);
  nlohmann::json list = server.wait_for(server.request("tools/list", nlohmann::json::object()));
  std::string description;
  for (const auto& tool : list["result"]["tools"])
    if (tool["name"] == "terminal_execute") description = tool["description"];
  ASSERT_FALSE(description.empty()) << list.dump();
  const bool says_unseen = description.find("not seen by ps") != std::string::npos ||
                           description.find("ps and kill do not see") != std::string::npos;

  nlohmann::json bg = server.tool("terminal_execute", {{"instance_id", "alpha"},
                                                        {"command", "sleep 6161.5 >/dev/null 2>&1 & echo ok"}});
  ASSERT_EQ(bg["exit_code"], 0) << bg.dump();
  nlohmann::json kill = server.tool("terminal_execute",
                                    {{"instance_id", "alpha"}, {"command", "pkill -f '^sleep 6161.5' && echo killed"}});
  const bool killed = kill["stdout"] == "killed\n";
  EXPECT_EQ(says_unseen, !killed) << "description: " << description << "\nkill: " << kill.dump();
  if (::geteuid() == 0) EXPECT_TRUE(killed) << kill.dump();
  env_.run({"instance", "stop", "alpha"});
  EXPECT_TRUE(eventually([] { return processes_with("6161.5").empty(); }, std::chrono::seconds(10)));
}

// ps, pgrep and kill inside a command see the pids the command itself uses, in either mode (as a
// normal user each command has a pid namespace and a /proc of its own).
TEST_F(Living, PsPgrepAndKillWorkInsideEveryCommand) {
  Result r = in_alpha(
      "sleep 7171.5 >/dev/null 2>&1 & for i in $(seq 200); do pgrep -f '^sleep 7171.5' >/dev/null && break; sleep 0.02; done; "
      "ps -eo pid,args >/tmp/ps.txt || echo ps-failed; "
      "grep -c '[s]leep 7171.5' /tmp/ps.txt; kill $(pgrep -f '^sleep 7171.5') && wait && echo killed");
  EXPECT_EQ(r.out, "1\nkilled\n") << r.err;
  EXPECT_TRUE(eventually([] { return processes_with("7171.5").empty(); }, std::chrono::seconds(5)));
  // Its /proc/sys stays read-only, and nothing there can be unmounted to look below.
  Result sys = in_alpha("echo 1 > /proc/sys/vm/drop_caches || echo refused; umount /proc 2>/dev/null || echo kept");
  EXPECT_EQ(sys.out, "refused\nkept\n") << sys.err;
}

// Nothing runs that no record names: a living sandbox whose instance was deleted behind its back
// (its metadata gone, the record its keeper holds still there, so the keeper cannot notice) is
// ended by doctor (and by every server start), found through that record. (Its whole folder
// removed, the keeper ends it by itself: test_strays.cpp.)
TEST(LivingStray, ASandboxWhoseInstanceWasRemovedBehindItsBackIsEnded) {
  Env env("persistent = true\nidle_stop = 0\n");
  env.create("lost");
  env.create("kept");
  ASSERT_EQ(env.run({"bwrap", "lost", "--", "/bin/sh", "-c", "sleep 6161.5 >/dev/null 2>&1 & echo ok"}).exit_code, 0);
  ASSERT_EQ(env.run({"bwrap", "kept", "--", "/bin/sh", "-c", "sleep 7172.5 >/dev/null 2>&1 & echo ok"}).exit_code, 0);
  ASSERT_TRUE(eventually([] { return processes_with("6161.5").size() == 1; }, std::chrono::seconds(5)));
  ASSERT_TRUE(fs::remove(env.instances() / "lost" / "metadata.json"));
  Result doctor = env.run({"doctor"});
  EXPECT_NE(doctor.out.find("no instance names it"), std::string::npos) << doctor.out << doctor.err;
  EXPECT_TRUE(eventually([] { return processes_with("6161.5").empty(); }, std::chrono::seconds(5)))
      << "the stray sandbox still runs";
  EXPECT_EQ(processes_with("7172.5").size(), 1u) << "a sandbox that a record names was ended";
}

// restart_instance while a job runs: the job is ended properly (its final state on record, named
// in the result), every process of the sandbox ends, and a fresh sandbox runs.
TEST_F(Living, RestartEndsRunningJobsAndEveryProcess) {
  ASSERT_EQ(in_alpha("sleep 8181.5 >/dev/null 2>&1 & echo ok").exit_code, 0);
  McpSession server(env_);
  nlohmann::json job =
      server.tool("submit_job", {{"instance_id", "alpha"}, {"command", "sleep 8182.5"}, {"timeout", 0}});
  const std::string job_id = job["job_id"];
  ASSERT_TRUE(eventually([] { return processes_with("8182.5").size() == 1; }, std::chrono::seconds(10)));
  nlohmann::json restarted = server.tool("restart_instance", {{"instance_id", "alpha"}});
  EXPECT_EQ(restarted["was_running"], true) << restarted.dump();
  ASSERT_EQ(restarted["jobs_ended"].size(), 1u) << restarted.dump();
  EXPECT_EQ(restarted["jobs_ended"][0]["job_id"], job_id);
  EXPECT_EQ(restarted["state"], "running") << restarted.dump();
  EXPECT_TRUE(eventually([] { return processes_with("8181.5").empty() && processes_with("8182.5").empty(); },
                         std::chrono::seconds(10)));
  nlohmann::json polled = server.tool("poll_job", {{"instance_id", "alpha"}, {"job_id", job_id}, {"timeout", 0}});
  EXPECT_EQ(polled["status"], "cancelled") << polled.dump();
  nlohmann::json echo = server.tool("terminal_execute", {{"instance_id", "alpha"}, {"command", "echo fresh"}});
  EXPECT_EQ(echo["stdout"], "fresh\n");
}

// A sandbox that died outside ns-hpc's control (its keeper killed) is seen as stopped, with why,
// and starts again on the next command.
TEST_F(Living, ASandboxThatDiedIsReportedAndStartsAgain) {
  ASSERT_EQ(in_alpha("echo x > /tmp/gone").exit_code, 0);
  const std::string record = read_text(env_.instances() / "alpha/status/sandbox.status");
  const auto at = record.find("\"ns-hpc-keeper\": ");
  ASSERT_NE(at, std::string::npos) << record;
  ::kill(static_cast<pid_t>(std::atoi(record.c_str() + at + 17)), SIGKILL);
  McpSession server(env_);
  ASSERT_TRUE(eventually([&] { return server.tool("describe_instance", {{"instance_id", "alpha"}})["state"] == "stopped"; },
                         std::chrono::seconds(10)));
  nlohmann::json described = server.tool("describe_instance", {{"instance_id", "alpha"}});
  EXPECT_NE(described.value("last_end", std::string()).find("outside ns-hpc"), std::string::npos) << described.dump();
  nlohmann::json again = server.tool("terminal_execute", {{"instance_id", "alpha"}, {"command", "cat /tmp/gone 2>&1; echo back"}});
  EXPECT_NE(again["stdout"].get<std::string>().find("back"), std::string::npos) << again.dump();
  EXPECT_EQ(again["stdout"].get<std::string>().find("x\n"), std::string::npos) << "/tmp should be fresh";
}

// A restart right after a command (the old keeper still finishing) always brings the sandbox up,
// from the command line too; ps lists its processes.
TEST_F(Living, RestartRightAfterACommandComesUpEveryTime) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(in_alpha("sleep 9191.5 >/dev/null 2>&1 & echo ok").exit_code, 0);
    Result restart = env_.run({"instance", "restart", "alpha"});
    EXPECT_EQ(restart.exit_code, 0) << restart.out << restart.err;
    EXPECT_TRUE(eventually([] { return processes_with("9191.5").empty(); }, std::chrono::seconds(5)));
  }
  Result ps = env_.run({"instance", "ps", "alpha"});
  EXPECT_EQ(ps.exit_code, 0) << ps.err;
  EXPECT_NE(ps.out.find("sleep 86400"), std::string::npos) << ps.out;
}

// A command's group (as root) is used again by a later command of the instance only once empty:
// a command that times out kills its own tree and not what an earlier one in the same session
// left running, and an earlier command's out-of-memory kill is not reported for the next one.
TEST(LivingGroups, ALaterCommandNeverSharesAGroupWithWhatAnEarlierOneLeftRunning) {
  Env env("persistent = true\nidle_stop = 120\ndefault_network = \"off\"\n[terminal.limits]\nmemory = 64\n");
  env.create("alpha");
  McpSession server(env);
  auto run = [&](const std::string& command, int timeout = 30) {
    return server.tool("terminal_execute", {{"instance_id", "alpha"}, {"command", command}, {"timeout", timeout}});
  };
  nlohmann::json first = run("sleep 4324.5 >/dev/null 2>&1 & echo ok");
  ASSERT_EQ(first["exit_code"], 0) << first.dump();
  ASSERT_TRUE(eventually([] { return processes_with("4324.5").size() == 1; }, std::chrono::seconds(5)));
  for (int i = 0; i < 3; ++i) {
    nlohmann::json quick = run("true");
    ASSERT_EQ(quick["exit_code"], 0) << quick.dump();
  }
  nlohmann::json timed_out = run("sleep 4325.5 & sleep 4325.6", 1);
  EXPECT_EQ(timed_out["exit_code"], 124) << timed_out.dump();
  EXPECT_TRUE(eventually([] { return processes_with("4325.").empty(); }, std::chrono::seconds(5)));
  EXPECT_EQ(processes_with("4324.5").size(), 1u) << "an earlier command's background process was killed";

  if (::geteuid() != 0) GTEST_SKIP() << "the memory limit needs writable cgroups (root here)";
  nlohmann::json hog = run("awk 'BEGIN { s = \"x\"; for (i = 0; i < 28; i++) s = s s; print length(s) }'");
  EXPECT_NE(hog.dump().find("out of memory"), std::string::npos) << hog.dump();
  for (int i = 0; i < 3; ++i) {
    nlohmann::json after = run("echo fine");
    EXPECT_EQ(after["exit_code"], 0) << after.dump();
    EXPECT_EQ(after.dump().find("out of memory"), std::string::npos) << after.dump();
  }
}

namespace {

// The members of the instance's command groups (term-*) on this host, by cgroup v2 where it
// is mounted: the joiner prepared for the next command waits in one of them.
std::vector<std::string> command_group_members(const std::string& instance) {
  std::vector<std::string> members;
  for (const char* root : {"/sys/fs/cgroup/unified/ns-hpc", "/sys/fs/cgroup/ns-hpc"}) {
    std::error_code ec;
    for (const auto& folder : fs::directory_iterator(root, ec)) {
      if (!folder.path().filename().string().starts_with(instance + "@")) continue;
      for (const auto& group : fs::directory_iterator(folder.path(), ec)) {
        if (!group.path().filename().string().starts_with("term-")) continue;
        std::istringstream procs(read_text(group.path() / "cgroup.procs"));
        for (std::string pid; procs >> pid;) members.push_back(pid);
      }
    }
  }
  return members;
}

}  // namespace

// Between commands the server prepares the next one's joiner (as root: a process already in the
// sandbox's namespaces, in the next command's group, under its restrictions). A command it
// starts is like any other: its words, environment, folder, stdin, exit code and errors; nothing
// of the joiner is visible inside; it goes with the sandbox's stop and with the server.
TEST_F(Living, ACommandOnAPreparedJoinerIsLikeAnyOther) {
  std::vector<std::string> waiting;
  {
    McpSession server(env_);
    for (int i = 0; i < 4; ++i) {
      nlohmann::json missing = server.call_and_wait("terminal_execute", {{"instance_id", "alpha"},
                                                                         {"args", {"no-such-command-4711"}}});
      EXPECT_NE(result_text(missing).find("no-such-command-4711"), std::string::npos) << missing.dump();
      nlohmann::json r = server.tool("terminal_execute", {{"instance_id", "alpha"},
                                                          {"args", {"sh", "-c", "echo $FOO; pwd; cat; exit 3"}},
                                                          {"env", {{"FOO", "bar" + std::to_string(i)}}},
                                                          {"working_directory", "/tmp"},
                                                          {"stdin", "in\n"}});
      EXPECT_EQ(r["stdout"], "bar" + std::to_string(i) + "\n/tmp\nin\n") << r.dump();
      EXPECT_EQ(r["exit_code"], 3) << r.dump();
      // Running processes only: the process of a command whose exec failed (above) keeps the name
      // "ns-hpc" as a zombie until the sandbox's init reaps it, which a loaded machine may not have
      // done yet.
      nlohmann::json ps = server.tool("terminal_execute",
                                      {{"instance_id", "alpha"}, {"command", "ps -eo stat=,comm= | grep -v '^Z'"}});
      // (A normal user's command has its own pid namespace, whose init is "ns-hpc-init".)
      EXPECT_EQ(ps["stdout"].get<std::string>().find(" ns-hpc\n"), std::string::npos) << ps.dump();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // time to prepare the next joiner
    }
    if (::geteuid() == 0) {
      waiting = command_group_members("alpha");
      EXPECT_FALSE(waiting.empty()) << "no joiner waits for the next command";
    }
    server.tool("stop_instance", {{"instance_id", "alpha"}});
    EXPECT_TRUE(eventually([] { return command_group_members("alpha").empty(); }, std::chrono::seconds(5)))
        << "a prepared joiner outlived its sandbox's stop";
    nlohmann::json again = server.tool("terminal_execute", {{"instance_id", "alpha"}, {"args", {"echo", "back"}}});
    EXPECT_EQ(again["stdout"], "back\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // The server is gone: so is what it prepared.
  for (const std::string& pid : waiting) EXPECT_FALSE(fs::exists("/proc/" + pid)) << pid;
  EXPECT_TRUE(eventually([] { return command_group_members("alpha").empty(); }, std::chrono::seconds(5)))
      << "a prepared joiner outlived the server";
}
