// [namespace] limits: the limits of a whole instance, against the real kernel. As root (cgroup v2
// here) they hold across commands and nest with each execution's own; as a normal user without
// delegated cgroups they are reported as unenforced and nothing else changes.
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "base/json.hpp"
#include "harness.hpp"
#include "sandbox/cgroups.hpp"

using namespace nshpc::test;
using nlohmann::json;
namespace sb = nshpc::sandbox;

namespace {

const sb::CgroupSupport& support() {
  static const sb::CgroupSupport s = sb::probe_cgroups();
  return s;
}

#define REQUIRE_CGROUP(what)                                                                             \
  if (::geteuid() != 0) GTEST_SKIP() << "instance limits need writable cgroups (root here)";             \
  if (!support().what) GTEST_SKIP() << "no usable " #what " cgroup here: " << support().detail

// Instance ids are cgroup names below the server's own group: unique per test process, so
// that tests running side by side never share one.
std::string unique_id(const std::string& what) { return fmt::format("lim-{}-{}", what, ::getpid()); }

// Touches `mib` MiB for real (a bytes object of that size), then says "done".
std::string hog(int mib) { return fmt::format("python3 -c 'x = b\"x\" * ({} << 20); print(\"done\")'", mib); }

// Forks until fork fails (or 200 times); each child waits for the parent to end, then exits.
// Prints how many forks worked.
const char* kForkLoop =
    "python3 -c '\n"
    "import os\n"
    "r, w = os.pipe()\n"
    "n = 0\n"
    "for i in range(200):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        os.close(w); os.close(1); os.close(2)\n"
    "        os.read(r, 1)\n"
    "        os._exit(0)\n"
    "    n += 1\n"
    "print(n)'";

// The cgroup folders of instance `id` ("<id>@<store>", Store::cgroup_folder) in every hierarchy.
std::vector<std::string> folders_of(const std::string& id) {
  std::set<std::string> names;
  for (const auto& p : sb::Cgroup::candidate_paths("probe")) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(id + "@", 0) == 0) names.insert(name);
    }
  }
  return {names.begin(), names.end()};
}

// Removes an instance's groups when a test ends, also when it failed half-way (declared before
// the Env, so it goes after the Env has ended the instance's living sandbox).
struct GroupsGone {
  std::string id;
  ~GroupsGone() {
    for (int attempt = 0; attempt < 100; ++attempt) {
      try {
        bool all = true;
        for (const auto& folder : folders_of(id))
          all = sb::Cgroup::remove_empty(folder, "") == 0 && sb::Cgroup::remove_folder(folder) && all;
        if (all) return;
      } catch (const std::exception&) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

json describe(const Env& env, const std::string& id) {
  Result r = env.run({"instance", "describe", id, "--json"});
  json j = nshpc::parse_json_or_discarded(r.out);
  EXPECT_TRUE(j.is_object()) << r.out << r.err;
  return j;
}

bool groups_exist(const std::string& id) { return !folders_of(id).empty(); }

}  // namespace

// The same memory-hungry command is OOM-killed in an instance limited to 64 MiB, both through
// `ns-hpc bwrap` and terminal_execute (whose own limit, 4096 MiB, would let it be), and runs in an
// instance without a limit.
TEST(InstanceLimits, MemoryHogIsKilledOnlyInTheLimitedInstance) {
  REQUIRE_CGROUP(memory);
  const std::string small = unique_id("small"), free = unique_id("free");
  GroupsGone small_groups{small}, free_groups{free};
  Env limited("limits = { memory = 64 }\n");
  limited.create(small);
  Env unlimited;
  unlimited.create(free);

  Result ok = unlimited.run({"bwrap", free, "--", "/bin/sh", "-c", hog(150)});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "done\n");

  Result killed = limited.run({"bwrap", small, "--", "/bin/sh", "-c", hog(150)});
  EXPECT_EQ(killed.exit_code, 137) << killed.out << killed.err;
  EXPECT_EQ(killed.out.find("done"), std::string::npos);

  {
    McpSession server(limited);
    json r = server.tool("terminal_execute", {{"instance_id", small}, {"command", hog(150)}});
    EXPECT_EQ(r["exit_code"], 137) << r.dump();
    EXPECT_EQ(r["stdout"], "") << r.dump();
  }

  json d = describe(limited, small);
  EXPECT_EQ(d["limits"]["memory_mib"], 64) << d.dump();
  EXPECT_EQ(d["limits"]["enforced"], true) << d.dump();
  // A fresh-sandbox instance's command group waits for its next command while the server runs
  // (CgroupPool), and goes with the server.
  EXPECT_TRUE(eventually([&] { return !groups_exist(small); }, std::chrono::seconds(5)));
}

// Deleting an instance whose commands each get a fresh sandbox removes the groups kept for its
// next command, while the server that kept them runs on.
TEST(InstanceLimits, DeletingAnInstanceRemovesItsKeptGroups) {
  REQUIRE_CGROUP(memory);
  const std::string id = unique_id("gone");
  GroupsGone groups{id};
  Env env("limits = { memory = 256 }\n");
  env.create(id);
  McpSession server(env);
  json r = server.tool("terminal_execute", {{"instance_id", id}, {"command", "echo hi"}});
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_TRUE(groups_exist(id));
  server.tool("delete_instance", {{"instance_id", id}});
  EXPECT_TRUE(eventually([&] { return !groups_exist(id); }, std::chrono::seconds(5)));
}

// Two commands of a living instance share its pids limit: background processes one command left
// running take from what the next command may fork (each command's own limit, 1024, is far
// away). Once they are gone, the next command forks that many more.
TEST(InstanceLimits, PidsAreBoundedForTheInstanceAcrossCommands) {
  REQUIRE_CGROUP(pids);
  const std::string id = unique_id("pids");
  GroupsGone groups{id};
  Env env("persistent = true\nidle_stop = 120\ndefault_network = \"off\"\nlimits = { pids = 40 }\n");
  env.create(id);
  McpSession server(env);
  auto run = [&](const std::string& command) {
    return server.tool("terminal_execute", {{"instance_id", id}, {"command", command}});
  };
  json bg = run("for i in 1 2 3 4 5 6 7 8 9 10; do sleep 7100.$i >/dev/null 2>&1 & done; echo started");
  ASSERT_EQ(bg["stdout"], "started\n") << bg.dump();
  ASSERT_TRUE(eventually([] { return processes_with("7100.").size() == 10; }, std::chrono::seconds(5)))
      << processes_with("7100.").size() << " of the 10 background sleeps are there";

  // What the instance holds now: its sandbox's own processes and the 10 sleeps.
  json d = describe(env, id);
  EXPECT_EQ(d["limits"]["pids"], 40) << d.dump();
  const int holding = d["limits"]["usage"]["pids"].get<int>();
  EXPECT_GE(holding, 10) << d.dump();

  json first = run(kForkLoop);
  ASSERT_EQ(first["exit_code"], 0) << first.dump();
  const int with_sleeps = std::stoi(first["stdout"].get<std::string>());
  EXPECT_GE(with_sleeps, 1) << first.dump();
  EXPECT_LE(with_sleeps, 40 - 10 - 1) << "the instance's 40 processes hold the 10 sleeps and the forking python";

  json kill = run("pkill -f '^sleep 7100' ; echo killed");
  ASSERT_EQ(kill["stdout"], "killed\n") << kill.dump();
  ASSERT_TRUE(eventually([] { return processes_with("7100.").empty(); }, std::chrono::seconds(5)));
  ASSERT_TRUE(eventually(
      [&] {
        json now = describe(env, id);
        return now["limits"]["usage"]["pids"].get<int>() <= holding - 10;  // also the forks of `first` gone
      },
      // A bound, not a wait: on a loaded 2-core machine the killed sleeps leave the cgroup's count
      // in well over 5 s now and then (seen under make test's parallel suites).
      std::chrono::seconds(30)));
  json second = run(kForkLoop);
  const int without_sleeps = std::stoi(second["stdout"].get<std::string>());
  EXPECT_GE(without_sleeps, with_sleeps + 9) << "the sleeps' 10 processes came back to the instance";
  EXPECT_LE(without_sleeps, 40 - 1);

  // Stopping the instance removes its groups.
  ASSERT_EQ(env.run({"instance", "stop", id}).exit_code, 0);
  EXPECT_TRUE(eventually([&] { return !groups_exist(id); }, std::chrono::seconds(5)));
}

// Two stores (two instances_dir, e.g. two users' servers as root) may each have an instance of
// the same id: their limits are their own. Ten sleeps held by one take nothing from what the
// other may fork.
TEST(InstanceLimits, TwoStoresWithTheSameInstanceIdHaveLimitsOfTheirOwn) {
  REQUIRE_CGROUP(pids);
  const std::string id = unique_id("twin");
  GroupsGone groups{id};
  const std::string config = "persistent = true\nidle_stop = 120\ndefault_network = \"off\"\nlimits = { pids = 40 }\n";
  Env first(config), second(config);
  first.create(id);
  second.create(id);
  McpSession one(first), two(second);
  json bg = one.tool("terminal_execute",
                     {{"instance_id", id}, {"command", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 7200.$i >/dev/null 2>&1 & done; echo started"}});
  ASSERT_EQ(bg["stdout"], "started\n") << bg.dump();
  ASSERT_TRUE(eventually([] { return processes_with("7200.").size() == 10; }, std::chrono::seconds(5)));
  json forks = two.tool("terminal_execute", {{"instance_id", id}, {"command", kForkLoop}});
  ASSERT_EQ(forks["exit_code"], 0) << forks.dump();
  EXPECT_GT(std::stoi(forks["stdout"].get<std::string>()), 40 - 10) << "the other store's sleeps counted here";
  EXPECT_EQ(folders_of(id).size(), 2u) << "one folder per store";
  // Stopping one store's instance leaves the other's running.
  ASSERT_EQ(second.run({"instance", "stop", id}).exit_code, 0);
  EXPECT_EQ(processes_with("7200.").size(), 10u);
  ASSERT_EQ(first.run({"instance", "stop", id}).exit_code, 0);
  EXPECT_TRUE(eventually([] { return processes_with("7200.").empty(); }, std::chrono::seconds(5)));
}

// A job's own memory limit below the instance's is its own: a job using 100 MiB is killed at its
// 64 MiB in an instance of 256 MiB, and the same job with the default job limit runs.
TEST(InstanceLimits, AJobKeepsItsOwnLimitBelowTheInstances) {
  REQUIRE_CGROUP(memory);
  const std::string id = unique_id("job");
  GroupsGone groups{id};
  Env env("limits = { memory = 256 }\n");
  env.create(id);
  auto job = [&](std::vector<std::string> limit) {
    std::vector<std::string> args{"instance", "run", id, "--json", "--timeout", "30"};
    args.insert(args.end(), limit.begin(), limit.end());
    args.insert(args.end(), {"--", hog(100)});
    Result r = env.run(args);
    json j = nshpc::parse_json_or_discarded(r.out);
    EXPECT_TRUE(j.is_object()) << r.out << r.err;
    return j;
  };
  json small = job({"-l", "memory=64"});
  EXPECT_EQ(small["status"], "out_of_memory") << small.dump();
  EXPECT_NE(small.value("reason", "").find("out of memory"), std::string::npos) << small.dump();
  json fits = job({});
  EXPECT_EQ(fits["status"], "completed") << fits.dump();
  EXPECT_EQ(fits["stdout_tail"], "done") << fits.dump();
}

// Without writable cgroups (a normal user here) the instance's limits are listed as unenforced
// with why, and commands, living or not, run as before.
TEST(InstanceLimitsAsUser, UnenforcedLimitsAreReportedAndNothingBreaks) {
  if (::geteuid() == 0 && support().memory && support().pids)
    GTEST_SKIP() << "as root the cgroups are writable here";
  const std::string fresh = unique_id("fresh"), living = unique_id("living");
  Env env("limits = { memory = 64, pids = 40 }\nidle_stop = 120\n");
  env.create(fresh);
  env.create(living, {"--persistent"});
  json d = describe(env, fresh);
  EXPECT_EQ(d["limits"]["memory_mib"], 64) << d.dump();
  EXPECT_EQ(d["limits"]["enforced"], false) << d.dump();
  ASSERT_TRUE(d["limits"].contains("unenforced")) << d.dump();
  EXPECT_NE(d["limits"]["unenforced"].dump().find("memory"), std::string::npos) << d.dump();
  Result text = env.run({"instance", "describe", fresh});
  EXPECT_NE(text.out.find("NOT enforced"), std::string::npos) << text.out;
  for (const std::string& id : {fresh, living}) {
    Result r = env.run({"bwrap", id, "--", "/bin/sh", "-c", "echo ok"});
    EXPECT_EQ(r.exit_code, 0) << id << ": " << r.err;
    EXPECT_EQ(r.out, "ok\n") << id;
  }
  McpSession server(env);
  json r = server.tool("terminal_execute", {{"instance_id", living}, {"command", "echo ok"}});
  EXPECT_EQ(r["stdout"], "ok\n") << r.dump();
  json item = server.tool("describe_instance", {{"instance_id", living}});
  EXPECT_EQ(item["limits"]["enforced"], false) << item.dump();
}
