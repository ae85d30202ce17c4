// Processes nobody owns: when an instance's folder is removed under its running sandboxes (rm -rf
// of the instance, or of the whole instances folder, as a cleaned scratch file system does), the
// sandboxes, their jobs and every helper serving them (the network holder, the proxy, the
// forwarders, pasta and its watcher) end by themselves within seconds, and the store's audit log
// says so; `doctor` ends those that could not notice; the server reaps what ended. Runs as root
// and again as an unprivileged user.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "base/fd.hpp"
#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"
#include "harness.hpp"
#include "network/netns.hpp"

using namespace nshpc::test;
using namespace std::chrono_literals;

namespace {

// What removal must end within (the issue: "within seconds").
constexpr auto kWithin = 5s;

std::vector<pid_t> all_pids() {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (!name.empty() && name[0] >= '0' && name[0] <= '9') pids.push_back(static_cast<pid_t>(std::atoi(name.c_str())));
  }
  return pids;
}

// Whether `path` (a link's target, " (deleted)" and all) is `folder` or below it.
bool below(std::string path, const std::string& folder) {
  constexpr std::string_view deleted = " (deleted)";
  if (path.ends_with(deleted)) path.resize(path.size() - deleted.size());
  return path == folder || path.starts_with(folder + "/");
}

// The processes of `folder` as the before-stop hook finds them: a command line naming a path in
// it, or a descriptor or working directory leading into it (removed or not; another user's
// descriptors cannot be read, nor those of a process that is not dumpable: its command line
// names its folder). This test and `except` are left out.
std::vector<pid_t> processes_of(const fs::path& folder, const std::set<pid_t>& except = {}) {
  const std::string name = folder.string();
  std::vector<pid_t> out;
  for (const pid_t pid : all_pids()) {
    if (pid == ::getpid() || except.contains(pid)) continue;
    bool found = false;
    for (const std::string& arg : nshpc::proc::read_cmdline(pid)) found = found || arg.find(name) != std::string::npos;
    std::error_code ec;
    const fs::path proc = "/proc/" + std::to_string(pid);
    found = found || below(fs::read_symlink(proc / "cwd", ec).string(), name);
    for (const auto& fd : fs::directory_iterator(proc / "fd", ec)) {
      if (found) break;
      std::error_code lec;
      found = below(fs::read_symlink(fd.path(), lec).string(), name);
    }
    if (found) out.push_back(pid);
  }
  return out;
}

// Their command lines, one a line (for failure messages).
std::string described(const std::vector<pid_t>& pids) {
  std::string text;
  for (const pid_t pid : pids) {
    text += std::to_string(pid) + ":";
    for (const std::string& arg : nshpc::proc::read_cmdline(pid)) text += " " + arg;
    text += "\n";
  }
  return text;
}

// Whether one of `pids` runs `command` (argv[1] of ns-hpc's helpers; pasta's program).
bool runs(const std::vector<pid_t>& pids, const std::string& command) {
  for (const pid_t pid : pids) {
    const std::vector<std::string> argv = nshpc::proc::read_cmdline(pid);
    if (argv.size() > 1 && (argv[1] == command || fs::path(argv[0]).filename() == command)) return true;
  }
  return false;
}

// The children of `parent` that are zombies (ended, not reaped).
std::vector<pid_t> zombies_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const pid_t pid : all_pids()) {
    const auto stat = nshpc::proc::read_stat(pid);
    if (stat && stat->ppid == parent && stat->ended()) out.push_back(pid);
  }
  return out;
}

// Everything the test found running is killed when it ends, whatever the result: nothing it
// started outlives it.
class KillAtExit {
 public:
  void add(const std::vector<pid_t>& pids) {
    for (const pid_t pid : pids)
      if (nshpc::UniqueFd fd = nshpc::open_pidfd(pid)) fds_.push_back(std::move(fd));
  }
  ~KillAtExit() {
    for (const nshpc::UniqueFd& fd : fds_) {
      try {
        nshpc::signal_pidfd(fd.get(), SIGKILL);
      } catch (const std::exception&) {
      }
    }
  }

 private:
  std::vector<nshpc::UniqueFd> fds_;
};

// The lines of the store's audit log that are `event`.
std::vector<nlohmann::json> audit_lines(const Env& env, const std::string& event) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(env.instances() / ".audit.log");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json doc = nshpc::parse_json_or_discarded(line);
    if (doc.is_object() && doc.value("event", "") == event) lines.push_back(doc);
  }
  return lines;
}

bool audited(const std::vector<nlohmann::json>& lines, const std::string& instance, const std::string& sandbox) {
  for (const nlohmann::json& line : lines)
    if (line.value("instance_id", "") == instance && line.value("sandbox", "") == sandbox) return true;
  return false;
}

}  // namespace

// rm -rf of two instances' folders while their sandboxes run: a living instance (network
// filtered: a proxy; a port exposed: a forwarder; a background process; a job joined to it) and
// an instance whose commands get fresh sandboxes (its held network namespace: holder, proxy,
// forwarder; a job in a sandbox of its own). Within seconds nothing of either runs, the store's
// audit log names each sandbox ended, and the server has reaped what it started; a third
// instance, untouched, keeps running.
TEST(Strays, RemovingInstanceFoldersEndsTheirSandboxesJobsAndHelpers) {
  Env env("idle_stop = 0\n");
  env.create("liv", {"--network", "filtered", "--persistent"});
  env.create("eph", {"--network", "filtered", "--no-persistent"});
  env.create("kept", {"--network", "off", "--persistent"});
  KillAtExit cleanup;
  McpSession server(env);
  const std::set<pid_t> the_server{server.pid()};
  const fs::path liv = env.instances() / "liv", eph = env.instances() / "eph";

  ASSERT_EQ(server.tool("terminal_execute", {{"instance_id", "liv"}, {"command", "sleep 5252.5 >/dev/null 2>&1 &"}})
                .value("exit_code", -1),
            0);
  ASSERT_EQ(server.tool("terminal_execute", {{"instance_id", "kept"}, {"command", "sleep 5255.5 >/dev/null 2>&1 &"}})
                .value("exit_code", -1),
            0);
  for (const char* id : {"liv", "eph"}) server.tool("expose_port", {{"instance_id", id}, {"port", 8000}});
  server.tool("submit_job", {{"instance_id", "liv"}, {"command", "sleep 5253.5"}, {"timeout", 0}});
  server.tool("submit_job", {{"instance_id", "eph"}, {"command", "sleep 5254.5"}, {"timeout", 0}});
  ASSERT_TRUE(eventually(
      [] {
        return !processes_with("5252.5").empty() && !processes_with("5253.5").empty() &&
               !processes_with("5254.5").empty() && !processes_with("5255.5").empty();
      },
      20s));
  const std::vector<pid_t> of_liv = processes_of(liv, the_server), of_eph = processes_of(eph, the_server);
  cleanup.add(of_liv);
  cleanup.add(of_eph);
  for (const char* marker : {"5252.5", "5253.5", "5254.5", "5255.5"}) cleanup.add(processes_with(marker));
  // What serves them runs (found as the hook finds it: by the folder it names).
  EXPECT_TRUE(runs(of_liv, "__net-proxy") && runs(of_liv, "__port-forward")) << described(of_liv);
  EXPECT_TRUE(runs(of_eph, "__net-hold") && runs(of_eph, "__net-proxy") && runs(of_eph, "__port-forward"))
      << described(of_eph);

  std::error_code ec;
  fs::remove_all(liv, ec);
  ASSERT_FALSE(ec) << ec.message();
  fs::remove_all(eph, ec);
  ASSERT_FALSE(ec) << ec.message();

  EXPECT_TRUE(eventually(
      [&] {
        return processes_of(liv, the_server).empty() && processes_of(eph, the_server).empty() &&
               processes_with("5252.5").empty() && processes_with("5253.5").empty() && processes_with("5254.5").empty();
      },
      kWithin))
      << "still running " << std::chrono::seconds(kWithin).count() << " s after the folders were removed:\n"
      << described(processes_of(liv, the_server)) << described(processes_of(eph, the_server))
      << described(processes_with("525"));
  EXPECT_EQ(processes_with("5255.5").size(), 1u) << "the sandbox of an instance that is still there was ended";
  const std::vector<nlohmann::json> lines = audit_lines(env, "sandbox.record_removed");
  EXPECT_TRUE(audited(lines, "liv", "living")) << read_text(env.instances() / ".audit.log");
  EXPECT_TRUE(audited(lines, "liv", "job")) << read_text(env.instances() / ".audit.log");
  EXPECT_TRUE(audited(lines, "eph", "job")) << read_text(env.instances() / ".audit.log");
  // The server reaps what it started as it ends (a keeper, a helper), not at the instance's next use.
  EXPECT_TRUE(eventually([&] { return zombies_of(server.pid()).empty(); }, 20s))
      << "zombies of the server: " << zombies_of(server.pid()).size();
}

// rm -rf of the whole instances folder (the case: a test suite's temporary folder, a
// cleaned scratch file system) under a living instance with a job; as root with nat where pasta
// can serve (pasta and its watcher), else filtered.
TEST(Strays, RemovingTheWholeInstancesFolderEndsEverythingInIt) {
  Env env("idle_stop = 0\n");
  const bool nat = !nshpc::network::nat_unavailable().has_value();
  env.create("all", {"--network", nat ? "nat" : "filtered", "--persistent"});
  KillAtExit cleanup;
  McpSession server(env);
  const std::set<pid_t> the_server{server.pid()};
  ASSERT_EQ(server.tool("terminal_execute", {{"instance_id", "all"}, {"command", "sleep 5256.5 >/dev/null 2>&1 &"}})
                .value("exit_code", -1),
            0);
  server.tool("expose_port", {{"instance_id", "all"}, {"port", 8000}});
  server.tool("submit_job", {{"instance_id", "all"}, {"command", "sleep 5257.5"}, {"timeout", 0}});
  ASSERT_TRUE(eventually([] { return !processes_with("5256.5").empty() && !processes_with("5257.5").empty(); }, 20s));
  const std::vector<pid_t> before = processes_of(env.instances(), the_server);
  cleanup.add(before);
  for (const char* marker : {"5256.5", "5257.5"}) cleanup.add(processes_with(marker));
  if (nat) {
    EXPECT_TRUE(runs(before, "__net-watch") && runs(before, "pasta")) << described(before);
  } else {
    EXPECT_TRUE(runs(before, "__net-proxy")) << described(before);
  }

  std::error_code ec;
  fs::remove_all(env.instances(), ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_TRUE(eventually(
      [&] {
        return processes_of(env.instances(), the_server).empty() && processes_with("5256.5").empty() &&
               processes_with("5257.5").empty();
      },
      kWithin))
      << "still running after the instances folder was removed:\n"
      << described(processes_of(env.instances(), the_server)) << described(processes_with("525"));
  EXPECT_TRUE(eventually([&] { return zombies_of(server.pid()).empty(); }, 20s))
      << "zombies of the server: " << zombies_of(server.pid()).size();
}

// A helper that cannot notice (its instance's folder was moved out of the store: the folder it
// holds is still there, the one its command line names is gone) is ended by `doctor`, which
// names each one it ended.
TEST(Strays, DoctorEndsNetworkHelpersWhoseInstanceFolderIsGone) {
  Env env("idle_stop = 0\n");
  env.create("moved", {"--network", "filtered", "--no-persistent"});
  KillAtExit cleanup;
  McpSession server(env);
  const std::set<pid_t> the_server{server.pid()};
  const fs::path folder = env.instances() / "moved", elsewhere = env.root() / "moved-away";
  server.tool("expose_port", {{"instance_id", "moved"}, {"port", 8000}});
  const std::vector<pid_t> helpers = processes_of(folder, the_server);
  cleanup.add(helpers);
  ASSERT_TRUE(runs(helpers, "__net-hold") && runs(helpers, "__net-proxy") && runs(helpers, "__port-forward"))
      << described(helpers);

  std::error_code ec;
  fs::rename(folder, elsewhere, ec);
  ASSERT_FALSE(ec) << ec.message();
  const Result doctor = env.run({"doctor"});
  for (const char* helper : {"__net-hold", "__net-proxy", "__port-forward"})
    EXPECT_NE(doctor.out.find(std::string("ended ") + helper), std::string::npos) << helper << "\n" << doctor.out;
  EXPECT_NE(doctor.out.find("its instance's folder is gone"), std::string::npos) << doctor.out;
  EXPECT_TRUE(eventually([&] { return processes_of(folder, the_server).empty(); }, kWithin))
      << described(processes_of(folder, the_server));
  fs::remove_all(elsewhere, ec);
  EXPECT_TRUE(eventually([&] { return zombies_of(server.pid()).empty(); }, 20s))
      << "zombies of the server: " << zombies_of(server.pid()).size();
}
