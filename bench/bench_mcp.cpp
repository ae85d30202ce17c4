// make bench, part 2: the MCP server over stdio, side by side with the sandbox floor.
//   - bare hardened `bwrap ... true` (the floor, exec'd directly), sharing the host's network and,
//     like for like with an instance whose network is off, with a network namespace of its own
//   - terminal_execute {args:["true"]} round trip through `ns-hpc run` (one server, many calls), in
//     an instance with the default network (nat where pasta is installed), one with network off,
//     and a running living instance
//   - the launch's steps, timed (medians of the server's debug lines, sandbox/..., base/steps.hpp)
//   - submit_job `true` (waiting for completion) and submit_job + poll_job round trips
//   - jobs per second with 8 submissions in flight, and the server's RSS after 1,000 jobs
//   - listing a store of 10,000 instances: a page of list_instances, resources/list (also alone:
//     `nshpc_bench_mcp --listing [BINARY]`)
// Figures only; no assertions.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "sandbox/seccomp.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Stats {
  double median, p99;
};
Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))]};
}

// A JSON-RPC client for `ns-hpc run` over pipes.
class Server {
 public:
  // `log`: the server's stderr, at debug (its step lines); empty: discarded.
  // `entry`: the subcommand and its flags (`computer` takes COMPUTER_ID from `computer_id`).
  Server(const std::string& binary, const fs::path& config, const fs::path& log = {},
         std::vector<std::string> entry = {"run"}, const std::string& computer_id = "") {
    std::vector<std::string> args{binary, "--config", config.string()};
    if (!log.empty()) args.insert(args.end(), {"--log-level", "debug"});
    args.insert(args.end(), entry.begin(), entry.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int in[2], out[2];
    if (::pipe(in) || ::pipe(out)) std::exit(1);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      int null = log.empty() ? ::open("/dev/null", O_WRONLY) : ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(null, 2);
      ::close(in[1]);
      ::close(out[0]);
      if (!computer_id.empty()) ::setenv("COMPUTER_ID", computer_id.c_str(), 1);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    call("initialize", {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()},
                        {"clientInfo", {{"name", "bench"}, {"version", "1"}}}});
    send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  }
  ~Server() {
    ::close(to_);
    int status;
    ::waitpid(pid_, &status, 0);
    ::close(from_);
  }
  pid_t pid() const { return pid_; }
  void send(const json& message) {
    std::string line = message.dump() + "\n";
    if (::write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::exit(1);
  }
  int start(const std::string& method, const json& params) {
    int id = ++next_id_;
    send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    return id;
  }
  json wait(int id) {
    for (;;) {
      if (auto it = done_.find(id); it != done_.end()) {
        json r = std::move(it->second);
        done_.erase(it);
        return r;
      }
      read_one();
    }
  }
  json call(const std::string& method, const json& params) { return wait(start(method, params)); }
  json tool(const std::string& name, const json& args) {
    json r = call("tools/call", {{"name", name}, {"arguments", args}});
    if (!r.contains("result") || r["result"].value("isError", false)) {
      std::fprintf(stderr, "bench: %s failed: %s\n", name.c_str(), r.dump().c_str());
      std::exit(1);
    }
    return r["result"];
  }

 private:
  void read_one() {
    for (;;) {
      auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        json m = json::parse(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
        if (m.contains("id") && m["id"].is_null()) {
          std::fprintf(stderr, "bench: server error: %s\n", m.dump().c_str());
          std::exit(1);
        }
        if (m.contains("id") && !m.contains("method")) {
          const int id = m["id"].get<int>();
          done_[id] = std::move(m);
        }
        return;
      }
      char buf[65536];
      ssize_t n = ::read(from_, buf, sizeof buf);
      if (n <= 0) {
        std::fprintf(stderr, "bench: the server went away\n");
        std::exit(1);
      }
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }
  pid_t pid_;
  int to_, from_;
  int next_id_ = 0;
  std::string buffer_;
  std::map<int, json> done_;
};

double bare_bwrap_ms(const std::vector<std::string>& argv, int seccomp_file, int ws, int out, bool drop) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  char* env[] = {const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
  auto t = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    int fd = ::open(("/proc/self/fd/" + std::to_string(seccomp_file)).c_str(), O_RDONLY);
    ::dup2(fd, 10);
    ::dup2(ws, 11);
    ::dup2(out, 12);
    if (drop && (::setgroups(0, nullptr) || ::setresgid(65534, 65534, 65534) || ::setresuid(65534, 65534, 65534)))
      ::_exit(126);
    ::execve(a[0], a.data(), env);
    ::_exit(127);
  }
  int status;
  ::waitpid(pid, &status, 0);
  return ms_since(t);
}

long rss_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      long kb;
      in >> kb;
      return kb;
    }
    in.ignore(1 << 16, '\n');
  }
  return -1;
}

}  // namespace

// Listing a store of 10,000 instances (issue 13): list_instances pages and resources/list's first
// page, through one server. The store is written directly, as ns-hpc lays it out. `binary` may be
// an older ns-hpc (without paging: its whole listing is measured) for a before/after figure.
void bench_listing(const std::string& binary, const fs::path& root) {
  constexpr int kInstances = 10000;
  const fs::path dir = root / "store10k";
  fs::create_directories(dir / "output");
  for (int i = 0; i < kInstances; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "i%05d", i);
    fs::create_directories(dir / id / "workspace");
    fs::create_directory(dir / "output" / id);
    std::ofstream(dir / id / "metadata.json")
        << json{{"id", id}, {"created_at", "2026-11-01T00:00:00+00:00"}, {"workspace", (dir / id / "workspace").string()},
                {"hostname", "bench"}, {"description", std::string("analysis run ") + id}, {"network", "off"},
                {"persistent", false}}.dump(2);
    std::ofstream(dir / id / "audit.log") << "{\"event\":\"instance.created\"}\n";
  }
  const fs::path config = root / "config-10k.toml";
  std::ofstream(config) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << dir.string() << "\"\n[server]\nstate_dir = \""
                        << (root / "state").string() << "\"\n";
  Server server(binary, config);
  const json page_args = {{"limit", 50}};
  auto list = [&](const json& args) {
    json r = server.call("tools/call", {{"name", "list_instances"}, {"arguments", args}});
    if (!r.contains("result") || r["result"].value("isError", false))  // a server without paging
      r = server.call("tools/call", {{"name", "list_instances"}, {"arguments", json::object()}});
    return r;
  };
  auto t = Clock::now();
  const std::size_t bytes = list(page_args).dump().size();
  const double first = ms_since(t);
  std::vector<double> page_ms, filter_ms, deep_ms, resources_ms;
  for (int i = 0; i < 20; ++i) {
    t = Clock::now();
    list(page_args);
    page_ms.push_back(ms_since(t));
    t = Clock::now();
    list({{"limit", 50}, {"filter", "run i042"}});
    filter_ms.push_back(ms_since(t));
    t = Clock::now();
    list({{"limit", 50}, {"offset", 5000}, {"sort", "id"}});
    deep_ms.push_back(ms_since(t));
    t = Clock::now();
    server.call("resources/list", json::object());
    resources_ms.push_back(ms_since(t));
  }
  Stats p = summarize(page_ms), f = summarize(filter_ms), d = summarize(deep_ms), r = summarize(resources_ms);
  std::printf("\nns-hpc bench: listing a store of %d instances (%s)\n\n", kInstances, binary.c_str());
  std::printf("  %-52s %10s %10s\n", "", "median ms", "p99 ms");
  std::printf("  %-52s %10.2f %10s\n", "first list_instances (index built from the tree)", first, "");
  std::printf("  %-52s %10.2f %10.2f   (target: <= 50 ms)\n", "list_instances, a page of 50", p.median, p.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "  filtered by text", f.median, f.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "  by id from offset 5,000", d.median, d.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "resources/list, first page", r.median, r.p99);
  std::printf("  size of one list_instances answer: %zu bytes\n\n", bytes);
}

// One step of a launch: "<launch> <subject>: step <name> <ms> ms" lines of a server at debug.
struct StepFigure {
  std::string launch;  // e.g. "off: fresh"
  std::string step;
  double median = 0;
  std::size_t count = 0;
};

// Runs `runs` terminal_execute calls in an instance with network off, one with the default
// network and a running living instance, on a server logging at debug, and gives each step's
// median per kind of instance, in the order the steps first appear.
std::vector<StepFigure> launch_steps(const std::string& binary, const fs::path& root, int runs) {
  const fs::path config = root / "config-steps.toml";
  std::ofstream(config) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "steps").string() << "\"\n";
  const fs::path log = root / "steps.log";
  std::vector<StepFigure> out;
  {
    Server server(binary, config, log);
    server.tool("create_instance", {{"instance_id", "off"}, {"network", "off"}});
    server.tool("create_instance", {{"instance_id", "default"}});
    server.tool("create_instance", {{"instance_id", "living"}, {"persistent", true}});
    for (const char* id : {"off", "default", "living"})
      for (int i = 0; i < 5; ++i) server.tool("terminal_execute", {{"instance_id", id}, {"args", {"true"}}});
    for (const char* id : {"off", "default", "living"})
      for (int i = 0; i < runs; ++i) server.tool("terminal_execute", {{"instance_id", id}, {"args", {"true"}}});
  }
  std::ifstream in(log);
  std::vector<std::pair<std::string, std::string>> order;
  std::map<std::pair<std::string, std::string>, std::vector<double>> times;
  std::string line;
  while (std::getline(in, line)) {
    // ns-hpc: debug: <launch> <subject>: step <name> <ms> ms   |   ...: total <ms> ms
    const auto colon = line.find(": ", line.find("debug: ") + 7);
    if (line.find("debug: ") == std::string::npos || colon == std::string::npos || !line.ends_with(" ms")) continue;
    const std::string head = line.substr(line.find("debug: ") + 7, colon - line.find("debug: ") - 7);
    const auto space = head.find(' ');
    if (space == std::string::npos) continue;
    const std::string launch = head.substr(0, space), subject = head.substr(space + 1);
    if (subject != "off" && subject != "default" && subject != "living") continue;
    std::string rest = line.substr(colon + 2, line.size() - colon - 2 - 3);
    std::string step;
    if (rest.starts_with("step ")) {
      rest.erase(0, 5);
    } else if (!rest.starts_with("total ")) {
      continue;
    }
    const auto last = rest.rfind(' ');
    if (last == std::string::npos) continue;
    step = rest.substr(0, last);
    double ms = 0;
    try {
      ms = std::stod(rest.substr(last + 1));
    } catch (const std::exception&) {
      continue;
    }
    const auto key = std::make_pair(subject + ": " + launch, step);
    if (!times.count(key)) order.push_back(key);
    times[key].push_back(ms);
  }
  // By instance, then outermost first: the tool, the captured run, the execution, the backend's
  // start and the launches below it.
  const std::vector<std::string> nesting = {"terminal_execute", "capture", "execute", "start",
                                            "living",           "join",    "fresh",   "prepare"};
  auto rank = [&](const std::string& name) {
    const std::string launch = name.substr(name.find(": ") + 2);
    return std::find(nesting.begin(), nesting.end(), launch) - nesting.begin();
  };
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    const std::string ia = a.first.substr(0, a.first.find(':')), ib = b.first.substr(0, b.first.find(':'));
    return ia != ib ? ia > ib : rank(a.first) < rank(b.first);
  });
  for (const auto& key : order) {
    std::vector<double>& v = times[key];
    std::sort(v.begin(), v.end());
    out.push_back({key.first, key.second, v[v.size() / 2], v.size()});
  }
  return out;
}

int main(int argc, char** argv) {
  const std::string binary = NSHPC_BINARY;
  if (argc > 1 && std::string(argv[1]) == "--listing") {  // only the listing figures
    char tmpl[] = "/tmp/nshpc-bench-list-XXXXXX";
    const fs::path root = ::mkdtemp(tmpl);
    bench_listing(argc > 2 ? argv[2] : binary, root);
    std::system(("rm -rf '" + root.string() + "'").c_str());
    return 0;
  }
  const int runs = argc > 1 ? std::atoi(argv[1]) : 200;
  char tmpl[] = "/tmp/nshpc-bench-mcp-XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  ::chmod(root.c_str(), 0755);
  const fs::path config = root / "config.toml";
  // Image instances need root and the test image (make test's set-up, scripts/test-image.sh).
  const fs::path test_images = "/var/cache/ns-hpc-test/images";
  const bool images = ::geteuid() == 0 && fs::exists(test_images / "test/current");
  std::ofstream(config) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "instances").string() << "\"\n"
                        << "images_dir = \"" << test_images.string() << "\"\n";
  Server server(binary, config);
  server.tool("create_instance", {{"instance_id", "bench"}});
  // The same store without cgroups: what terminal_execute's own cgroup ([terminal.limits]) costs.
  const fs::path config_nocg = root / "config-nocg.toml";
  std::ofstream(config_nocg) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "instances").string()
                             << "\"\n[jobs.local]\nuse_cgroups = false\n";
  Server nocg(binary, config_nocg);

  // The floor, with the same hardened flags, interleaved with the server's calls.
  const bool as_root = ::geteuid() == 0;
  const fs::path bpf = root / "filter.bpf";
  std::ofstream(bpf, std::ios::binary) << nshpc::sandbox::build_seccomp_bpf();
  const int bpf_fd = ::open(bpf.c_str(), O_RDONLY);
  const int ws = ::open((root / "instances/bench/workspace").c_str(), O_PATH | O_DIRECTORY);
  const int out = ::open((root / "instances/output/bench").c_str(), O_PATH | O_DIRECTORY);
  const std::vector<std::string> bare{
      "/usr/bin/bwrap", "--unshare-all", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", "/usr",
      "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
      "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc", "--unshare-user", "--disable-userns",
      "--cap-drop", "ALL", "--hostname", "bench", "--new-session", "--ro-bind", "/proc/sys", "/proc/sys",
      "--die-with-parent", "--share-net", "--bind-fd", "11", "/workspace", "--bind-fd", "12", "/output",
      "--seccomp", "10", "--chdir", "/workspace", "--", "true"};
  std::vector<std::string> bare_net_off = bare;  // a network namespace of its own, as network "off"
  bare_net_off.erase(std::find(bare_net_off.begin(), bare_net_off.end(), "--share-net"));

  // What the model reads on every turn: the tools/list result (one page holds them all), of both
  // entry points (no proxied servers, host commands or desktop here).
  const std::size_t tools_list_bytes = server.call("tools/list", json::object())["result"].dump().size();
  std::size_t computer_list_bytes = 0;
  {
    Server computer(binary, config, {}, {"computer"}, "bench-computer");
    computer_list_bytes = computer.call("tools/list", json::object())["result"].dump().size();
  }

  // A living instance: every command joins its one long-lived sandbox.
  server.tool("create_instance", {{"instance_id", "living"}, {"persistent", true}});
  std::vector<double> living_ms, living_nocg_ms, first_ms, image_ms, image_first_ms;
  if (images) server.tool("create_instance", {{"instance_id", "image"}, {"image", "test"}});

  server.tool("create_instance", {{"instance_id", "off"}, {"network", "off"}});
  const std::string default_network =
      server.tool("describe_instance", {{"instance_id", "bench"}})["structuredContent"].value("network", std::string("?"));
  std::vector<double> floor_ms, floor_off_ms, terminal_ms, terminal_off_ms, terminal_nocg_ms, submit_ms, submit_poll_ms;
  for (int i = 0; i < 10; ++i) {
    bare_bwrap_ms(bare, bpf_fd, ws, out, as_root);
    bare_bwrap_ms(bare_net_off, bpf_fd, ws, out, as_root);
    server.tool("terminal_execute", {{"instance_id", "bench"}, {"args", {"true"}}});
    server.tool("terminal_execute", {{"instance_id", "off"}, {"args", {"true"}}});
    server.tool("terminal_execute", {{"instance_id", "living"}, {"args", {"true"}}});
  }
  for (int i = 0; i < runs; ++i) {
    floor_ms.push_back(bare_bwrap_ms(bare, bpf_fd, ws, out, as_root));
    auto t = Clock::now();
    server.tool("terminal_execute", {{"instance_id", "bench"}, {"args", {"true"}}});
    terminal_ms.push_back(ms_since(t));
    floor_off_ms.push_back(bare_bwrap_ms(bare_net_off, bpf_fd, ws, out, as_root));
    t = Clock::now();
    server.tool("terminal_execute", {{"instance_id", "off"}, {"args", {"true"}}});
    terminal_off_ms.push_back(ms_since(t));
    t = Clock::now();
    nocg.tool("terminal_execute", {{"instance_id", "bench"}, {"args", {"true"}}});
    terminal_nocg_ms.push_back(ms_since(t));
    t = Clock::now();
    server.tool("terminal_execute", {{"instance_id", "living"}, {"args", {"true"}}});
    living_ms.push_back(ms_since(t));
    t = Clock::now();
    nocg.tool("terminal_execute", {{"instance_id", "living"}, {"args", {"true"}}});
    living_nocg_ms.push_back(ms_since(t));
    if (images) {
      t = Clock::now();
      server.tool("terminal_execute", {{"instance_id", "image"}, {"args", {"true"}}});
      image_ms.push_back(ms_since(t));
    }
  }
  // The first command of a stopped living instance (its sandbox started on the way).
  for (int i = 0; i < std::max(5, runs / 10); ++i) {
    server.tool("stop_instance", {{"instance_id", "living"}});
    auto t = Clock::now();
    server.tool("terminal_execute", {{"instance_id", "living"}, {"args", {"true"}}});
    first_ms.push_back(ms_since(t));
  }
  server.tool("stop_instance", {{"instance_id", "living"}});
  // The same for an image instance (its overlay mounted on the way).
  for (int i = 0; images && i < std::max(5, runs / 10); ++i) {
    server.tool("stop_instance", {{"instance_id", "image"}});
    auto t = Clock::now();
    server.tool("terminal_execute", {{"instance_id", "image"}, {"args", {"true"}}});
    image_first_ms.push_back(ms_since(t));
  }
  if (images) server.tool("stop_instance", {{"instance_id", "image"}});
  for (int i = 0; i < runs / 2; ++i) {
    auto t = Clock::now();
    server.tool("submit_job", {{"instance_id", "bench"}, {"command", "true"}, {"timeout", 30}});
    submit_ms.push_back(ms_since(t));
    t = Clock::now();
    json r = server.tool("submit_job", {{"instance_id", "bench"}, {"command", "true"}, {"timeout", 0}});
    server.tool("poll_job", {{"instance_id", "bench"}, {"job_id", r["structuredContent"]["job_id"]}, {"timeout", 30}});
    submit_poll_ms.push_back(ms_since(t));
  }

  // Throughput: 1,000 jobs with 8 submissions in flight (each waits for its job).
  const int total = 1000 - static_cast<int>(submit_ms.size() * 2);
  auto t = Clock::now();
  std::vector<int> in_flight;
  for (int i = 0; i < total; ++i) {
    in_flight.push_back(server.start("tools/call", {{"name", "submit_job"},
                                                    {"arguments", {{"instance_id", "bench"}, {"command", "true"}, {"timeout", 30}}}}));
    if (in_flight.size() == 8) {
      server.wait(in_flight.front());
      in_flight.erase(in_flight.begin());
    }
  }
  for (int id : in_flight) server.wait(id);
  const double jobs_per_s = total / (ms_since(t) / 1000.0);
  const long rss = rss_kb(server.pid());

  // Server memory with 100 living instances running, then with the same 100 stopped.
  const fs::path config_many = root / "config-many.toml";
  std::ofstream(config_many) << "[namespace]\ndefault_image = \"\"\ninstances_dir = \"" << (root / "many").string() << "\"\npersistent = true\n";
  long rss_running = 0, rss_stopped = 0;
  {
    Server many(binary, config_many);
    for (int i = 0; i < 100; ++i) {
      const std::string id = "l" + std::to_string(i);
      many.tool("create_instance", {{"instance_id", id}});
      many.tool("terminal_execute", {{"instance_id", id}, {"args", {"true"}}});
    }
    many.tool("list_instances", json::object());
    rss_running = rss_kb(many.pid());
    for (int i = 0; i < 100; ++i) many.tool("stop_instance", {{"instance_id", "l" + std::to_string(i)}});
    many.tool("list_instances", json::object());
    rss_stopped = rss_kb(many.pid());
  }

  const std::vector<StepFigure> steps = launch_steps(binary, root, runs / 2);

  Stats f = summarize(floor_ms), te = summarize(terminal_ms), tn = summarize(terminal_nocg_ms), sj = summarize(submit_ms), sp = summarize(submit_poll_ms);
  std::printf("\nns-hpc bench: MCP over stdio, %d runs (interleaved with the floor), %s\n\n", runs,
              as_root ? "as root (sandboxes as uid 65534)" : "as an unprivileged user");
  std::printf("  %-52s %10s %10s\n", "", "median ms", "p99 ms");
  Stats fo = summarize(floor_off_ms), to = summarize(terminal_off_ms);
  std::printf("  %-52s %10.2f %10.2f\n", "bare hardened bwrap ... true (floor)", f.median, f.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "  the same with a network namespace of its own", fo.median, fo.p99);
  std::printf("  %-52s %10.2f %10.2f\n", ("terminal_execute true, network " + default_network + " (default)").c_str(),
              te.median, te.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "terminal_execute true, network off", to.median, to.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "terminal_execute true, no cgroups (use_cgroups=false)", tn.median, tn.p99);
  Stats lv = summarize(living_ms), ln = summarize(living_nocg_ms), fc = summarize(first_ms);
  std::printf("  %-52s %10.2f %10.2f\n", "terminal_execute true, running living instance", lv.median, lv.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "  the same, no cgroups (use_cgroups=false)", ln.median, ln.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "first command of a stopped living instance", fc.median, fc.p99);
  if (images) {
    Stats im = summarize(image_ms), imf = summarize(image_first_ms);
    std::printf("  %-52s %10.2f %10.2f\n", "terminal_execute true, running image instance", im.median, im.p99);
    std::printf("  %-52s %10.2f %10.2f\n", "first command of a stopped image instance", imf.median, imf.p99);
  } else {
    std::printf("  (image instances: skipped, they need root and the test image of make test)\n");
  }
  std::printf("  %-52s %10.2f %10.2f\n", "submit_job true, waiting for it", sj.median, sj.p99);
  std::printf("  %-52s %10.2f %10.2f\n", "submit_job true + poll_job", sp.median, sp.p99);
  std::printf("\n  network off / floor with its own network (like for like): median %.2fx, p99 %.2fx   (target: <= 1.3x)\n",
              to.median / fo.median, to.p99 / fo.p99);
  std::printf("  network %s / floor:      median %.2fx, p99 %.2fx\n", default_network.c_str(), te.median / f.median,
              te.p99 / f.p99);
  std::printf("  without its cgroup:       median %.2fx, p99 %.2fx\n", tn.median / f.median, tn.p99 / f.p99);
  std::printf("  living instance / floor:  median %.2fx, p99 %.2fx   (target: <= 0.4x)\n", lv.median / f.median,
              lv.p99 / f.p99);
  std::printf("  living, without cgroups:  median %.2fx, p99 %.2fx\n", ln.median / f.median, ln.p99 / f.p99);
  std::printf("  jobs per second (8 in flight, 2 cores): %.0f\n", jobs_per_s);
  std::printf("  server RSS with 100 living instances running: %.1f MB, with them stopped: %.1f MB\n",
              rss_running / 1024.0, rss_stopped / 1024.0);
  std::printf("  server RSS after 1,000 finished jobs: %.1f MB   (target: <= 15 MB)\n", rss / 1024.0);
  std::printf("  tools/list result: ns-hpc run %zu bytes (budget 23,552; asked: 16,384), ns-hpc computer %zu bytes (budget 8,192)\n\n",
              tools_list_bytes, computer_list_bytes);
  std::printf("  The launch, step by step (a server logging at debug; medians, ms):\n");
  std::string launch;
  for (const StepFigure& s : steps) {
    if (s.launch != launch) std::printf("    %s\n", (launch = s.launch).c_str());
    std::printf("      %-46s %10.3f   (%zu)\n", s.step.c_str(), s.median, s.count);
  }
  std::printf("\n");
  bench_listing(binary, root);
  std::system(("rm -rf '" + root.string() + "'").c_str());
  return 0;
}
