#include "harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace nshpc::test {

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Forks and runs `argv` with the environment `env`; the child's stdin, stdout and stderr become
// `in`, `out` and `err` (-1: the test's own). The pid, or -1 when fork failed.
pid_t spawn(std::vector<std::string> argv, std::vector<std::string> env, int in, int out, int err = -1) {
  auto argv_c = c_strings(argv);
  auto env_c = c_strings(env);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (in >= 0) ::dup2(in, 0);
    if (out >= 0) ::dup2(out, 1);
    if (err >= 0) ::dup2(err, 2);
    ::execve(argv_c[0], argv_c.data(), env_c.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

std::string binary() { return env_or("NSHPC_BINARY", NSHPC_BINARY); }
std::string probe() { return env_or("NSHPC_PROBE", NSHPC_PROBE); }

Env::Env(const std::string& extra_toml) {
  char tmpl[] = "/tmp/nshpc-it-XXXXXX";
  root_ = ::mkdtemp(tmpl);
  ::chmod(root_.c_str(), 0755);
  // No test builds the default image in the background (a build reaches the Debian mirror),
  // unless it says otherwise.
  const bool own_default_image = extra_toml.find("default_image") != std::string::npos;
  std::ofstream(config_file()) << "[namespace]\ninstances_dir = \"" << instances().string() << "\"\n"
                               << (own_default_image ? "" : "default_image = \"\"\n") << extra_toml;
}

Env::~Env() {
  // Living instances outlive every ns-hpc process: their keepers (on record) go first, and
  // with them their sandboxes.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(instances(), ec)) {
    const std::string record = read_text(entry.path() / "status" / "sandbox.status");
    const auto at = record.find("\"ns-hpc-keeper\": ");
    if (at == std::string::npos) continue;
    const pid_t keeper = static_cast<pid_t>(std::atoi(record.c_str() + at + 17));
    if (keeper > 1) ::kill(keeper, SIGKILL);
  }
  ec.clear();
  // So do the network namespaces held for the commands of the others (what serves them ends
  // with their holder).
  for (const auto& entry : fs::directory_iterator(instances(), ec)) {
    std::error_code sec;
    for (const auto& held : fs::directory_iterator(entry.path() / "status", sec)) {
      if (held.path().filename().string().rfind("network-", 0) != 0) continue;
      const pid_t holder = static_cast<pid_t>(std::atoi(read_text(held.path() / "network.holder.pid").c_str()));
      const std::string cmdline = read_text("/proc/" + std::to_string(holder) + "/cmdline");
      if (holder > 1 && cmdline.find(held.path().string()) != std::string::npos) ::kill(holder, SIGTERM);
    }
  }
  ec.clear();
  // The listing index this store left in the state folder outside root_ (as root
  // /var/lib/ns-hpc/index): the one whose database names our instances folder.
  for (const auto& entry : fs::directory_iterator("/var/lib/ns-hpc/index", ec)) {
    const std::string db = entry.path().string();
    if (entry.path().extension() != ".sqlite") continue;
    if (read_text(db).find(instances().string()) == std::string::npos &&
        read_text(db + "-wal").find(instances().string()) == std::string::npos)
      continue;
    for (const char* suffix : {"", "-wal", "-shm", ".activity"}) ::unlink((db + suffix).c_str());
  }
  ec.clear();
  // Workspaces belong to the sandbox uid; root (or the owner) can remove them.
  fs::remove_all(root_, ec);
  if (ec) std::system(("chmod -R u+rwX '" + root_.string() + "' 2>/dev/null; rm -rf '" + root_.string() + "'").c_str());
}

std::vector<std::string> Env::argv_for(const std::vector<std::string>& args) const {
  std::vector<std::string> argv{binary(), "--config", config_file().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> Env::env_for(const std::vector<std::string>& extra) const {
  std::vector<std::string> env{"PATH=/usr/local/bin:/usr/bin:/bin",
                               "HOME=" + root_.string(),
                               "XDG_CONFIG_HOME=" + (root_ / "xdg").string(),
                               std::string("NSHPC_TEST_SECRET=") + kSecret,
                               "LANG=C.UTF-8"};
  for (const std::string& var : extra) {  // NAME=value replaces the default of that name
    const std::string name = var.substr(0, var.find('=') + 1);
    const auto same = std::find_if(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(name, 0) == 0; });
    if (same != env.end()) *same = var;
    else env.push_back(var);
  }
  return env;
}

Result Env::run(const std::vector<std::string>& args, const std::string& input, std::chrono::seconds timeout,
                const std::vector<std::string>& extra_env) const {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC)) return {};
  pid_t pid = spawn(argv_for(args), env_for(extra_env), in[0], out[1], err[1]);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (!input.empty()) {
    ssize_t ignored = ::write(in[1], input.data(), input.size());
    (void)ignored;
  }
  ::close(in[1]);
  Result r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool out_open = true, err_open = true;
  char buf[65536];
  while (out_open || err_open) {
    pollfd fds[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      ADD_FAILURE() << "ns-hpc timed out: " << args.front();
      break;
    }
    ::poll(fds, 2, static_cast<int>(left.count()));
    for (int i = 0; i < 2; ++i) {
      if (!fds[i].revents) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        (i == 0 ? out_open : err_open) = false;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

pid_t Env::start(const std::vector<std::string>& args) const {
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const pid_t pid = spawn(argv_for(args), env_for({}), null, null);
  if (null >= 0) ::close(null);
  return pid;
}

void Env::create(const std::string& id, const std::vector<std::string>& flags) const {
  std::vector<std::string> args{"instance", "create", id};
  args.insert(args.end(), flags.begin(), flags.end());
  Result r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

void Env::install_probe(const std::string& id) const {
  const fs::path dest = instances() / id / "workspace" / "probe";
  fs::copy_file(probe(), dest, fs::copy_options::overwrite_existing);
  ::chmod(dest.c_str(), 0755);
}

int wait_child(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    // A process that ends while it is read gives ESRCH, which libstdc++ throws from underflow.
    std::string cmdline;
    try {
      std::ifstream in(entry.path() / "cmdline");
      cmdline.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::exception&) {
      continue;
    }
    if (cmdline.find(marker) != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path test_image_cache() {
  if (::geteuid() == 0) return "/var/cache/ns-hpc-test";
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  return cache && *cache ? fs::path(cache) / "ns-hpc-test" : fs::path(home ? home : "/nonexistent") / ".cache/ns-hpc-test";
}


McpSession::McpSession(const Env& env, const std::vector<std::string>& extra_env,
                       const std::vector<std::string>& command, bool initialize) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC)) throw std::runtime_error("pipe");
  pid_ = spawn(env.argv_for(command), env.env_for(extra_env), in[0], out[1]);
  ::close(in[0]);
  ::close(out[1]);
  to_ = in[1];
  from_ = out[0];
  if (!initialize) return;
  const int id = request("initialize", {{"protocolVersion", "2025-06-18"},
                                        {"capabilities", nlohmann::json::object()},
                                        {"clientInfo", {{"name", "ns-hpc-integration"}, {"version", "1"}}}});
  if (!wait_for(id, std::chrono::seconds(30)).is_object()) ADD_FAILURE() << "ns-hpc run did not answer initialize";
  send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
}

McpSession::~McpSession() {
  if (to_ >= 0) ::close(to_);
  if (pid_ > 0 && wait_child(pid_, std::chrono::seconds(20)) < 0) {
    ADD_FAILURE() << "the server did not stop at the end of its input";
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (from_ >= 0) ::close(from_);
}

void McpSession::crash() {
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void McpSession::send(const nlohmann::json& message) {
  const std::string line = message.dump() + "\n";
  if (::write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ADD_FAILURE() << "write to ns-hpc run";
}

int McpSession::request(const std::string& method, const nlohmann::json& params) {
  const int id = ++next_id_;
  send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
  return id;
}

nlohmann::json McpSession::wait_for(int id, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->contains("id") && (*it)["id"] == id) {
        nlohmann::json found = std::move(*it);
        pending_.erase(it);
        return found;
      }
    }
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      auto message = nshpc::parse_json_or_discarded(buffer_.substr(0, nl));
      buffer_.erase(0, nl + 1);
      if (message.is_object()) pending_.push_back(std::move(message));
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return nullptr;
    pollfd p{from_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::read(from_, buf, sizeof buf);
    if (n <= 0) return nullptr;
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

bool McpSession::notified(const std::string& method, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (auto nl = buffer_.find('\n'); nl != std::string::npos; nl = buffer_.find('\n')) {
      auto message = nshpc::parse_json_or_discarded(buffer_.substr(0, nl));
      buffer_.erase(0, nl + 1);
      if (message.is_object()) pending_.push_back(std::move(message));
    }
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (!it->contains("id") && it->value("method", "") == method) {
        pending_.erase(it);
        return true;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    pollfd p{from_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::read(from_, buf, sizeof buf);
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

nlohmann::json McpSession::tool(const std::string& name, const nlohmann::json& args) {
  nlohmann::json response = call_and_wait(name, args);
  if (!response.is_object()) {
    ADD_FAILURE() << "no answer to " << name;
    return nlohmann::json::object();
  }
  const nlohmann::json result = response.value("result", nlohmann::json::object());
  EXPECT_FALSE(result.value("isError", false)) << response.dump();
  return result.value("structuredContent", nlohmann::json::object());
}

std::string result_text(const nlohmann::json& response) {
  if (!response.is_object() || !response.contains("result")) return response.dump();
  std::string text;
  for (const auto& c : response["result"]["content"]) text += c.value("text", "");
  return text;
}

}  // namespace nshpc::test
