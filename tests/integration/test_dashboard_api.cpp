// The dashboard's JSON API (docs/api.md) against the real ns-hpc binary on 127.0.0.1, with the
// bearer token, as a script would use it: instances (create, list with filter and paging,
// start/stop, network, snapshot and restore), a job and its output (also as server-sent events),
// files (upload, then read back through the read_file MCP tool of another process), the activity
// of another process (a stdio `ns-hpc run` on the same instances folder) with the token redacted,
// and hostile or malformed requests.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/loopback.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using namespace std::chrono_literals;
using nshpc::tests::free_port;
using json = nlohmann::json;

namespace {

constexpr const char* kToken = "dash-test-token-0123456789abcdef0123456";

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

Result shell(const std::string& command) {
  Result r;
  FILE* p = ::popen(("timeout 120 " + command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

struct Reply {
  int status = 0;
  std::string headers;
  std::string body;
  json data() const {
    try {
      return json::parse(body);
    } catch (const std::exception&) {
      return json();
    }
  }
};

class Dashboard {
 public:
  explicit Dashboard(const Env& env) : port_(free_port()) {
    pid_ = env.start({"run", "-t", "http", "--port", std::to_string(port_)});
    ready_ = eventually(
        [&] { return shell("curl -s -o /dev/null -w '%{http_code}' " + base() + "/healthz").out == "200"; }, 30s);
  }
  ~Dashboard() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      wait_child(pid_, 30s);
    }
  }
  bool ready() const { return ready_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // curl with the token (unless `auth` says otherwise); --path-as-is so hostile paths arrive as written.
  Reply curl(const std::string& method, const std::string& path, const std::string& extra = "",
             const std::string& auth = std::string("-H 'Authorization: Bearer ") + kToken + "'") const {
    char dir[] = "/tmp/nshpc-dash-curl-XXXXXX";
    const std::string tmp = ::mkdtemp(dir);
    const Result r = shell("curl -s --path-as-is -X " + method + " " + auth + " -D " + quote(tmp + "/h") + " -o " +
                           quote(tmp + "/b") + " -w '%{http_code}' " + extra + " " + quote(base() + path));
    Reply reply;
    reply.status = std::atoi(r.out.c_str());
    reply.headers = read_text(tmp + "/h");
    reply.body = read_text(tmp + "/b");
    std::filesystem::remove_all(tmp);
    return reply;
  }
  Reply send(const std::string& method, const std::string& path, const json& body) const {
    return curl(method, path, "-H 'Content-Type: application/json' --data-binary " + quote(body.dump()));
  }
  // An event stream read for `seconds` (curl ends it).
  std::string events(const std::string& path, int seconds, const std::string& extra = "") const {
    return shell("curl -s -N --max-time " + std::to_string(seconds) + " -H 'Authorization: Bearer " + kToken + "' " +
                 extra + " " + quote(base() + path))
        .out;
  }

 private:
  std::uint16_t port_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

struct DashEnv {
  DashEnv() : env(config()) {}
  static std::string config() {
    char dir[] = "/tmp/nshpc-dash-state-XXXXXX";
    state = ::mkdtemp(dir);
    return std::string("[server]\nauth_token = \"") + kToken + "\"\nstate_dir = \"" + state + "\"\n";
  }
  ~DashEnv() { std::filesystem::remove_all(state); }
  static inline std::string state;
  Env env;
};

std::string fmt_id(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "many-%04d", i);
  return buf;
}

// The events of a server-sent event stream: (event name, data).
std::vector<std::pair<std::string, std::string>> sse_events(const std::string& stream) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string name, data;
  std::istringstream in(stream);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      if (!name.empty() || !data.empty()) out.emplace_back(name.empty() ? "message" : name, data);
      name.clear();
      data.clear();
    } else if (line.starts_with("event: ")) {
      name = line.substr(7);
    } else if (line.starts_with("data: ")) {
      data += (data.empty() ? "" : "\n") + line.substr(6);
    }
  }
  return out;
}

bool has_header(const Reply& r, const std::string& line) { return r.headers.find(line) != std::string::npos; }

class DashboardApi : public ::testing::Test {
 protected:
  DashEnv de;
  Dashboard server{de.env};
  void SetUp() override { ASSERT_TRUE(server.ready()) << "the server did not answer /healthz"; }
};

TEST_F(DashboardApi, EveryApiRouteNeedsTheToken) {
  for (const char* path : {"/api/server", "/api/instances", "/api/activity", "/api/events", "/api/jobs/a/b/output"}) {
    const Reply r = server.curl("GET", path, "--max-time 5", "");
    EXPECT_EQ(r.status, 401) << path << ": " << r.body;
    EXPECT_EQ(r.body.find("instances_dir"), std::string::npos);
  }
  EXPECT_EQ(server.curl("GET", "/api/instances", "", "-H 'Authorization: Bearer wrong'").status, 401);
  EXPECT_EQ(server.send("POST", "/api/instances", json{{"id", "x"}}).status, 201);  // with it: fine
}

TEST_F(DashboardApi, InstancesCreateListPageAndFilter) {
  const std::string hostile = "<img src=x onerror=alert(1)>";
  const Reply created = server.send("POST", "/api/instances", {{"id", "dash-a"}, {"description", hostile}, {"network", "off"}});
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(created.data()["id"], "dash-a");
  EXPECT_EQ(created.data()["description"], hostile);  // data, as it is: the page renders it as text
  EXPECT_TRUE(has_header(created, "Cache-Control: no-store")) << created.headers;
  EXPECT_TRUE(has_header(created, "Content-Security-Policy: default-src 'none'; frame-ancestors 'none'")) << created.headers;
  for (const char* id : {"dash-b", "dash-c", "other-1"})
    ASSERT_EQ(server.send("POST", "/api/instances", {{"id", id}}).status, 201);
  // The same id twice: refused.
  EXPECT_EQ(server.send("POST", "/api/instances", {{"id", "dash-b"}}).status, 400);

  Reply page = server.curl("GET", "/api/instances?filter=dash&sort=id&limit=2");
  ASSERT_EQ(page.status, 200) << page.body;
  json p = page.data();
  EXPECT_EQ(p["total"], 3);
  ASSERT_EQ(p["instances"].size(), 2u);
  EXPECT_EQ(p["instances"][0]["id"], "dash-a");
  EXPECT_EQ(p["instances"][1]["id"], "dash-b");
  EXPECT_EQ(p["instances"][0]["state"], "ephemeral");
  EXPECT_TRUE(p["instances"][0].contains("jobs_running"));
  p = server.curl("GET", "/api/instances?filter=dash&sort=id&limit=2&offset=2").data();
  ASSERT_EQ(p["instances"].size(), 1u);
  EXPECT_EQ(p["instances"][0]["id"], "dash-c");
  EXPECT_EQ(server.curl("GET", "/api/instances?limit=0").status, 400);
  EXPECT_EQ(server.curl("GET", "/api/instances?limit=abc").status, 400);
  EXPECT_EQ(server.curl("GET", "/api/instances?sort=size").status, 400);

  // The detail view measures disk use on demand; the listing's background measure catches up.
  const json detail = server.curl("GET", "/api/instances/dash-a").data();
  EXPECT_TRUE(detail["disk"].contains("workspace_bytes")) << detail.dump();
  EXPECT_TRUE(detail["disk_bytes"].is_number());
  EXPECT_TRUE(detail["limits"].is_object());

  const Reply missing = server.curl("GET", "/api/instances/no-such-box");
  EXPECT_EQ(missing.status, 404);
  EXPECT_TRUE(missing.data().contains("error")) << missing.body;
  EXPECT_EQ(server.curl("GET", "/api/instances/..%2F..%2Fetc").status, 404);

  const Reply deleted = server.curl("DELETE", "/api/instances/dash-c");
  EXPECT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(server.curl("GET", "/api/instances/dash-c").status, 404);
  EXPECT_FALSE(std::filesystem::exists(de.env.instances() / "dash-c"));
}

TEST_F(DashboardApi, StartStopAndNetworkOfALivingInstance) {
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "live"}, {"persistent", true}, {"network", "off"}}).status, 201);
  EXPECT_EQ(server.curl("GET", "/api/instances/live").data()["state"], "stopped");
  const Reply started = server.send("POST", "/api/instances/live/start", json::object());
  ASSERT_EQ(started.status, 200) << started.body;
  EXPECT_EQ(started.data()["state"], "running");
  json seen = server.curl("GET", "/api/instances?filter=live").data()["instances"][0];
  EXPECT_EQ(seen["state"], "running");
  EXPECT_GE(seen["processes"].get<int>(), 1);
  ASSERT_TRUE(seen["usage"].is_object()) << seen.dump();  // no limits here: what its processes hold
  EXPECT_GT(seen["usage"]["memory_bytes"].get<std::uint64_t>(), 0u);

  const Reply net = server.send("PUT", "/api/instances/live/network", {{"mode", "filtered"}, {"allow", {"pypi.org"}}});
  ASSERT_EQ(net.status, 200) << net.body;
  EXPECT_EQ(net.data()["network"], "filtered");
  EXPECT_EQ(net.data()["applied"], "applied");
  EXPECT_EQ(server.curl("GET", "/api/instances/live").data()["network"], "filtered");
  EXPECT_EQ(server.send("PUT", "/api/instances/live/network", {{"mode", "wide-open"}}).status, 400);
  EXPECT_EQ(server.send("PUT", "/api/instances/live/network", {{"mode", 5}}).status, 400);

  const Reply stopped = server.send("POST", "/api/instances/live/stop", json::object());
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  EXPECT_EQ(stopped.data()["was_running"], true);
  EXPECT_EQ(server.curl("GET", "/api/instances/live").data()["state"], "stopped");
  // Not persistent: nothing to start.
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "eph"}}).status, 201);
  EXPECT_EQ(server.send("POST", "/api/instances/eph/start", json::object()).status, 409);
}

// With [namespace] limits an instance has a cgroup of its own (v2, or v1's controllers as this
// host has): usage and cpu_percent come from it.
TEST(DashboardApiLimits, UsageAndCpuPercentFromTheInstancesCgroup) {
  char dir[] = "/tmp/nshpc-dash-state-XXXXXX";
  const std::string state = ::mkdtemp(dir);
  struct Removed {
    std::string path;
    ~Removed() { std::filesystem::remove_all(path); }
  } removed{state};  // after the server has stopped
  Env env(std::string("[server]\nauth_token = \"") + kToken + "\"\nstate_dir = \"" + state +
          "\"\n[namespace.limits]\nmemory = 512\npids = 200\ncpus = 2\n");
  Dashboard server(env);
  ASSERT_TRUE(server.ready());
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "busy"}, {"persistent", true}}).status, 201);
  const json limits = server.curl("GET", "/api/instances/busy").data()["limits"];
  if (!limits.value("enforced", false))
    GTEST_SKIP() << "limits are not enforced on this host (no cgroup of its own to read): " << limits.dump();
  ASSERT_EQ(server.send("POST", "/api/instances/busy/start", json::object()).status, 200);
  ASSERT_EQ(server.send("POST", "/api/instances/busy/jobs", {{"command", "timeout 20 sh -c 'while :; do :; done'"}}).status, 201);
  json usage;
  const bool busy = eventually(
      [&] {
        usage = server.curl("GET", "/api/instances?filter=busy").data()["instances"][0]["usage"];
        return usage.is_object() && usage["cpu_percent"].is_number() && usage["cpu_percent"].get<double>() > 50;
      },
      15s);
  EXPECT_TRUE(busy) << usage.dump();
  EXPECT_EQ(usage["source"], "cgroup");
  EXPECT_GT(usage["memory_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GE(usage["pids"].get<int>(), 2);
  EXPECT_LT(usage["cpu_percent"].get<double>(), 210.0);  // at most its 2 cpus (and one loop)
  EXPECT_EQ(server.send("POST", "/api/instances/busy/stop", json::object()).status, 200);
}

TEST_F(DashboardApi, AThousandInstancesPageFast) {
  // One curl, one kept-alive connection, 1,000 creates (a config file: the command line would be too long).
  const std::string config = "/tmp/nshpc-dash-many.curl";
  {
    std::ofstream out(config);
    for (int i = 0; i < 1000; ++i)
      out << (i ? "next\n" : "") << "silent\noutput = \"/dev/null\"\nwrite-out = \"%{http_code}\\n\"\n"
          << "header = \"Authorization: Bearer " << kToken << "\"\nheader = \"Content-Type: application/json\"\n"
          << "data-binary = \"{\\\"id\\\": \\\"" << fmt_id(i) << "\\\", \\\"persistent\\\": " << (i % 2 == 0 ? "true" : "false")
          << "}\"\nurl = \"" << server.base() << "/api/instances\"\n";
  }
  const std::string args = "curl -K " + config;
  const Result made = shell(args);
  ASSERT_EQ(std::count(made.out.begin(), made.out.end(), '\n'), 1000);
  ASSERT_EQ(made.out.find("201\n201"), 0u) << made.out.substr(0, 200);
  EXPECT_EQ(made.out.find_first_not_of("201\n"), std::string::npos) << made.out.substr(0, 400);
  std::filesystem::remove(config);
  std::vector<double> took;
  for (const char* q : {"limit=100", "limit=100&offset=900", "limit=100&sort=id&filter=many-05", "limit=100", "limit=100"}) {
    const Result r = shell("curl -s -o /dev/null -w '%{http_code} %{time_total}' -H 'Authorization: Bearer " +
                           std::string(kToken) + "' " + quote(server.base() + "/api/instances?" + q));
    ASSERT_EQ(r.out.substr(0, 3), "200") << q;
    took.push_back(std::stod(r.out.substr(4)));
  }
  std::sort(took.begin(), took.end());
  EXPECT_LT(took[2], 0.1) << "median of five pages of 100 out of 1,000 instances: " << took[2] << " s";
  const json page = server.curl("GET", "/api/instances?limit=100&offset=900&sort=id").data();
  EXPECT_EQ(page["total"], 1000);
  ASSERT_EQ(page["instances"].size(), 100u);
  EXPECT_EQ(page["instances"][0]["id"], fmt_id(900));
}

TEST_F(DashboardApi, SnapshotAndRestore) {
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "snap"}}).status, 201);
  ASSERT_EQ(server.curl("PUT", "/api/instances/snap/files/content?path=/workspace/state.txt", "--data-binary v1").status, 201);
  const Reply taken = server.send("POST", "/api/instances/snap/snapshots", {{"name", "first"}});
  ASSERT_EQ(taken.status, 201) << taken.body;
  EXPECT_EQ(taken.data()["snapshot"]["name"], "first");
  ASSERT_EQ(server.curl("PUT", "/api/instances/snap/files/content?path=/workspace/state.txt", "--data-binary v2").status, 200);
  EXPECT_EQ(server.curl("GET", "/api/instances/snap/files/content?path=/workspace/state.txt").body, "v2");
  EXPECT_EQ(server.curl("GET", "/api/instances/snap/snapshots").data()["snapshots"][0]["name"], "first");
  const Reply restored = server.send("POST", "/api/instances/snap/snapshots/first/restore", json::object());
  ASSERT_EQ(restored.status, 200) << restored.body;
  EXPECT_EQ(server.curl("GET", "/api/instances/snap/files/content?path=/workspace/state.txt").body, "v1");
  EXPECT_EQ(server.send("POST", "/api/instances/snap/snapshots", {{"name", "first"}}).status, 409);  // taken
  EXPECT_EQ(server.send("POST", "/api/instances/snap/snapshots", {{"name", "../x"}}).status, 400);
  EXPECT_EQ(server.curl("DELETE", "/api/instances/snap/snapshots/first").status, 200);
  EXPECT_EQ(server.send("POST", "/api/instances/snap/snapshots/first/restore", json::object()).status, 404);
}

TEST_F(DashboardApi, AJobAndItsOutputAlsoAsEvents) {
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "jobs"}}).status, 201);
  const Reply submitted =
      server.send("POST", "/api/instances/jobs/jobs", {{"command", "echo hello-from-job; echo über-err >&2; sleep 2; echo done-now"}});
  ASSERT_EQ(submitted.status, 201) << submitted.body;
  const std::string job = submitted.data()["job_id"];
  ASSERT_EQ(job.size(), 12u);
  // The stream from the start: output as it comes, then the end.
  const std::string stream =
      server.events("/api/jobs/jobs/" + job + "/output", 10, "-w '\\ncurl-exit=%{exitcode}\\n'");
  // The response ends after the end event (curl returns 0, not 28 for its time limit).
  EXPECT_NE(stream.find("curl-exit=0\n"), std::string::npos) << stream;
  EXPECT_NE(stream.find("event: output"), std::string::npos) << stream;
  EXPECT_NE(stream.find("hello-from-job"), std::string::npos) << stream;
  EXPECT_NE(stream.find("über-err"), std::string::npos) << stream;
  EXPECT_NE(stream.find("done-now"), std::string::npos) << stream;
  const auto events = sse_events(stream);
  ASSERT_FALSE(events.empty()) << stream;
  EXPECT_EQ(events.back().first, "end") << stream;
  EXPECT_EQ(json::parse(events.back().second)["state"], "completed") << stream;
  EXPECT_EQ(json::parse(events.back().second)["exit_code"], 0) << stream;
  std::string out_text;
  for (const auto& [name, data] : events)
    if (name == "output" && json::parse(data)["stream"] == "stdout") out_text += json::parse(data)["text"].get<std::string>();
  EXPECT_EQ(out_text, "hello-from-job\ndone-now\n");
  const json view = server.curl("GET", "/api/instances/jobs/jobs/" + job).data();
  EXPECT_EQ(view["status"], "completed") << view.dump();
  EXPECT_NE(view["stdout_tail"].get<std::string>().find("hello-from-job"), std::string::npos);
  const json listed = server.curl("GET", "/api/instances/jobs/jobs").data();
  ASSERT_EQ(listed["jobs"].size(), 1u);
  EXPECT_EQ(listed["jobs"][0]["job_id"], job);
  // Resumed after stdout's first line: only the rest.
  const std::string rest = server.events("/api/jobs/jobs/" + job + "/output", 5, "-H 'Last-Event-ID: 15:0'");
  EXPECT_EQ(rest.find("hello-from-job"), std::string::npos) << rest;
  EXPECT_NE(rest.find("done-now"), std::string::npos) << rest;
  EXPECT_EQ(server.curl("GET", "/api/jobs/jobs/000000000000/output", "--max-time 5").status, 404);
  EXPECT_EQ(server.curl("GET", "/api/instances/jobs/jobs/not-a-job").status, 404);
  EXPECT_EQ(server.send("POST", "/api/instances/jobs/jobs", {{"command", ""}}).status, 400);
  EXPECT_EQ(server.send("POST", "/api/instances/jobs/jobs", {{"command", "true"}, {"nice", 5}}).status, 400);
}

TEST_F(DashboardApi, FilesThroughTheSameResolverAsTheTools) {
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "files"}}).status, 201);
  const Reply up = server.curl("PUT", "/api/instances/files/files/content?path=/workspace/up%20load.txt",
                               "--data-binary 'uploaded bytes äö'");
  ASSERT_EQ(up.status, 201) << up.body;
  // Another process (a stdio server on the same instances folder) reads it with read_file.
  {
    McpSession mcp(de.env);
    const json r = mcp.call_and_wait("read_file", {{"instance_id", "files"}, {"path", "up load.txt"}});
    EXPECT_NE(result_text(r).find("uploaded bytes äö"), std::string::npos) << r.dump();
  }
  const Reply down = server.curl("GET", "/api/instances/files/files/content?path=/workspace/up%20load.txt");
  EXPECT_EQ(down.body, "uploaded bytes äö");
  EXPECT_TRUE(has_header(down, "Content-Disposition: attachment")) << down.headers;

  ASSERT_EQ(server.send("POST", "/api/instances/files/files/folder", {{"path", "/workspace/new dir"}}).status, 201);
  json listing = server.curl("GET", "/api/instances/files/files?path=/workspace").data();
  std::set<std::string> names;
  for (const json& e : listing["entries"]) names.insert(e["name"].get<std::string>() + ":" + e["type"].get<std::string>());
  EXPECT_TRUE(names.contains("up load.txt:file")) << listing.dump();
  EXPECT_TRUE(names.contains("new dir:dir")) << listing.dump();
  EXPECT_EQ(server.curl("DELETE", "/api/instances/files/files?path=/workspace/new%20dir").status, 200);
  EXPECT_EQ(server.curl("GET", "/api/instances/files/files?path=/workspace/new%20dir").status, 404);

  // Hostile paths: refused, never the host's file.
  for (const char* path : {"../../etc/passwd", "/workspace/../../etc/passwd", "/etc/passwd", "%2e%2e/%2e%2e/etc/passwd"}) {
    const Reply r = server.curl("GET", std::string("/api/instances/files/files/content?path=") + path);
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_EQ(r.body.find("root:"), std::string::npos) << path;
  }
  // A link the sandbox planted that leads out: its target is not read.
  std::filesystem::create_symlink("/etc/passwd", de.env.instances() / "files" / "workspace" / "planted");
  const Reply planted = server.curl("GET", "/api/instances/files/files/content?path=/workspace/planted");
  EXPECT_NE(planted.status, 200) << planted.body;
  EXPECT_EQ(planted.body.find("root:"), std::string::npos);
  // The workspace itself cannot be deleted; a file cannot be listed as a folder.
  EXPECT_EQ(server.curl("DELETE", "/api/instances/files/files?path=/workspace").status, 403);
  EXPECT_EQ(server.curl("GET", "/api/instances/files/files?path=/workspace/up%20load.txt").status, 409);
  EXPECT_EQ(server.curl("GET", "/api/instances/files/files").status, 400);  // no path
}

TEST_F(DashboardApi, ActivityOfAnotherProcessWithTheTokenRedacted) {
  ASSERT_EQ(server.send("POST", "/api/instances", {{"id", "watched"}}).status, 201);
  // A live view open while another process acts.
  std::string live;
  std::thread watcher([&] { live = server.events("/api/events", 12); });
  std::this_thread::sleep_for(2s);
  {
    McpSession mcp(de.env);  // a stdio server: its own process, the same instances folder
    mcp.call_and_wait("list_directory", {{"instance_id", "watched"}, {"path", std::string("/workspace/") + kToken}});
    mcp.call_and_wait("create_instance", {{"instance_id", "made-by-mcp"}});
  }
  watcher.join();
  const Reply r = server.curl("GET", "/api/activity?instance=watched&kind=mcp.tool_call");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body.find(kToken), std::string::npos) << r.body;
  const json events = r.data()["events"];
  ASSERT_GE(events.size(), 1u) << r.body;
  EXPECT_EQ(events[0]["tool"], "list_directory");
  EXPECT_EQ(events[0]["instance"], "watched");
  EXPECT_NE(events[0]["arguments"]["path"].get<std::string>().find("[redacted]"), std::string::npos) << events[0].dump();
  EXPECT_TRUE(events[0].contains("session"));
  // The stream saw it live, and the instances event for the new instance.
  EXPECT_NE(live.find("event: activity"), std::string::npos) << live;
  EXPECT_NE(live.find("list_directory"), std::string::npos) << live;
  bool told = false;  // an instances event naming the instance the other process made
  for (const auto& [name, data] : sse_events(live))
    if (name == "instances") {
      const json ids = json::parse(data)["ids"];
      told = told || std::find(ids.begin(), ids.end(), json("made-by-mcp")) != ids.end();
    }
  EXPECT_TRUE(told) << live;
  EXPECT_EQ(live.find(kToken), std::string::npos);
  // Filters and paging.
  const json two = server.curl("GET", "/api/activity?limit=2").data();
  ASSERT_EQ(two["events"].size(), 2u);
  ASSERT_TRUE(two.contains("next_before"));
  const json older = server.curl("GET", "/api/activity?limit=2&before=" + std::to_string(two["next_before"].get<int>())).data();
  ASSERT_GE(older["events"].size(), 1u);
  EXPECT_LT(older["events"][0]["id"].get<int>(), two["events"][1]["id"].get<int>());
  EXPECT_EQ(server.curl("GET", "/api/activity?limit=x").status, 400);
}

TEST_F(DashboardApi, BadInputGetsAClearErrorAndTheServerLivesOn) {
  EXPECT_EQ(server.curl("POST", "/api/instances", "--data-binary 'not json'").status, 400);
  EXPECT_EQ(server.curl("POST", "/api/instances", "--data-binary '[1]'").status, 400);
  const Reply unknown = server.send("POST", "/api/instances", {{"id", "x1"}, {"colour", "red"}});
  EXPECT_EQ(unknown.status, 400);
  EXPECT_NE(unknown.body.find("colour"), std::string::npos) << unknown.body;
  EXPECT_EQ(server.send("POST", "/api/instances", {{"id", 5}}).status, 400);
  EXPECT_EQ(server.send("POST", "/api/instances", {{"id", "bad/id"}}).status, 400);
  const Reply wrong = server.curl("PATCH", "/api/instances");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_TRUE(has_header(wrong, "Allow: GET, POST")) << wrong.headers;
  EXPECT_EQ(server.curl("GET", "/api/nothing-here").status, 404);
  EXPECT_EQ(server.curl("GET", "/api/events?instance=nope", "--max-time 5").status, 404);
  EXPECT_EQ(server.curl("GET", "/api/instances?filter=%zz").status, 400);
  // A JSON body over 1 MiB: 413, nothing created.
  const std::string big = "/tmp/nshpc-dash-big.json";
  { std::ofstream(big) << "{\"description\": \"" << std::string(2 << 20, 'a') << "\"}"; }
  EXPECT_EQ(server.curl("POST", "/api/instances", "--data-binary @" + big).status, 413);
  std::filesystem::remove(big);
  EXPECT_EQ(server.curl("GET", "/api/server/doctor").status, 405);
  const Reply info = server.curl("GET", "/api/server");
  ASSERT_EQ(info.status, 200) << info.body;
  EXPECT_FALSE(info.data()["version"].get<std::string>().empty());
  EXPECT_EQ(info.data()["pid"].get<int>() > 0, true);
  EXPECT_EQ(info.body.find(kToken), std::string::npos);
  EXPECT_TRUE(info.data()["http"]["caps"].contains("server.max_sessions")) << info.body;  // the transport's board
  EXPECT_TRUE(info.data()["http"].contains("browser_sessions")) << info.body;
  EXPECT_EQ(server.curl("GET", "/healthz", "", "").status, 200);
}

}  // namespace
