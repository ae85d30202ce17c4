#include "sandbox/network.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/spawn.hpp"
#include "network/netns.hpp"
#include "network/proxy.hpp"

namespace nshpc::sandbox {

namespace {

namespace stdfs = std::filesystem;

// In the instance's state folder (host-only; the sandbox never sees it).
constexpr const char* kModeFile = "network.mode";            // the mode served now
constexpr const char* kPolicyFile = "network.policy.json";   // the proxy's policy
constexpr const char* kProxyPidFile = "network.proxy.pid";   // the proxy serving it
constexpr const char* kPastaPidFile = "network.pasta.pid";   // pasta, written by pasta
constexpr const char* kProxyLogFile = "network.proxy.log";   // what the proxy says

// The proxy's policy for `mode`: the allow list in `filtered`, nothing in any other.
void write_policy(const NetworkPlan& plan, config::Network mode) {
  nlohmann::json resolve = nlohmann::json::object();
  for (const std::string& pair : plan.resolve) {
    const auto eq = pair.find('=');
    resolve[pair.substr(0, eq)].push_back(pair.substr(eq + 1));
  }
  const nlohmann::json policy = {{"mode", mode == config::Network::filtered ? "filtered" : "off"},
                                 {"allow", plan.allow},
                                 {"resolve", resolve}};
  fs::atomic_write(plan.state_dir / kPolicyFile, policy.dump(2) + "\n", 0600);
}

// The proxy on record, when it still runs (its pid, and its command line naming this policy).
UniqueFd find_proxy(const NetworkPlan& plan) {
  std::ifstream in(plan.state_dir / kProxyPidFile);
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 1) return {};
  UniqueFd fd = open_pidfd(pid);
  if (!fd) return {};
  std::ifstream cmdline(fmt::format("/proc/{}/cmdline", pid));
  const std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
  if (args.find(network::kProxyCommand) == std::string::npos ||
      args.find((plan.state_dir / kPolicyFile).string()) == std::string::npos)
    return {};
  return fd;
}

void start_proxy(const NetworkPlan& plan, const network::Netns& ns, pid_t init, Leftovers& leftovers) {
  UniqueFd listener = network::listen_in(ns, "127.0.0.1", kProxyPort);
  SpawnSpec spec;
  spec.program = fs::self_program("the network proxy of a filtered instance");
  spec.argv = {spec.program,
               std::string(network::kProxyCommand),
               "--policy",
               (plan.state_dir / kPolicyFile).string(),
               "--audit",
               plan.audit_log.string(),
               "--watch-pid",
               std::to_string(init)};
  // Nothing of the caller's (an MCP client's stdio): /dev/null, and what it says goes to a log of
  // its own beside the policy.
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd) throw SysError(errno, "open", "/dev/null");
  const stdfs::path log_path = plan.state_dir / kProxyLogFile;
  UniqueFd log_fd(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!log_fd) throw SysError(errno, "open", log_path.string());
  spec.fds = {{null_fd.get(), 0}, {null_fd.get(), 1}, {log_fd.get(), 2}, {listener.get(), 3}};
  spec.new_session = true;  // no terminal signal of the server's reaches it
  SpawnedChild proxy = spawn(spec);
  fs::atomic_write(plan.state_dir / kProxyPidFile, std::to_string(proxy.pid()) + "\n", 0600);
  // It ends with the sandbox's init (--watch-pid), whether or not this process still runs.
  leftovers.add(UniqueFd(::fcntl(proxy.pidfd(), F_DUPFD_CLOEXEC, 3)));
  proxy.release();
}

void leave_nat(const NetworkPlan& plan, const network::Netns& ns) {
  network::detach_pasta(plan.state_dir / kPastaPidFile);
  network::destroy_sockets(ns);
}

void enter_nat(const NetworkPlan& plan, const network::Netns& ns, pid_t init, Leftovers& leftovers) {
  if (auto why = network::nat_unavailable())
    throw UsageError(fmt::format("network 'nat' cannot work here: {}; use 'filtered' or 'off'", *why));
  // The host's own addresses first: pasta would reach the host's services through them.
  network::block_addresses(ns, network::host_addresses());
  network::PastaProcess pasta = network::attach_pasta(ns, {.pid_file = plan.state_dir / kPastaPidFile});
  if (pasta.adopted) leftovers.add(std::move(pasta.pidfd));
  // pasta does not end with the namespace (an idle stop of the sandbox happens without any
  // server): a watcher of the sandbox's init detaches it then.
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd) throw SysError(errno, "open", "/dev/null");
  SpawnSpec spec;
  spec.program = fs::self_program("the watcher of a nat instance's pasta");
  spec.argv = {spec.program, std::string(network::kWatchCommand), "--watch-pid", std::to_string(init),
               "--pasta-pid-file", (plan.state_dir / kPastaPidFile).string()};
  spec.fds = {{null_fd.get(), 0}, {null_fd.get(), 1}, {null_fd.get(), 2}};
  spec.new_session = true;
  SpawnedChild watcher = spawn(spec);
  leftovers.add(UniqueFd(::fcntl(watcher.pidfd(), F_DUPFD_CLOEXEC, 3)));
  watcher.release();
  log::info("instance {}: network nat attached (pasta pid {}, {} ms)", plan.instance_id, pasta.pid,
            std::chrono::duration_cast<std::chrono::milliseconds>(pasta.took).count());
}

}  // namespace

std::optional<config::Network> served_network(const stdfs::path& state_dir) {
  std::ifstream in(state_dir / kModeFile);
  std::string name;
  if (!(in >> name)) return std::nullopt;
  return config::parse_network(name);
}

void serve_network(const NetworkPlan& plan, pid_t init, Leftovers& leftovers) {
  if (plan.mode == config::Network::host)
    throw Error("internal: a sandbox that shares the host's network is not served; restart it");
  const std::optional<config::Network> from = served_network(plan.state_dir);
  const network::NetnsFds ns = network::open_netns(init);
  if (from == config::Network::nat && plan.mode != config::Network::nat) leave_nat(plan, ns.view());

  // The proxy's policy follows the mode in every case: leaving `filtered` closes its tunnels.
  write_policy(plan, plan.mode);
  if (UniqueFd proxy = find_proxy(plan)) {
    signal_pidfd(proxy.get(), SIGHUP);
  } else if (plan.mode == config::Network::filtered) {
    start_proxy(plan, ns.view(), init, leftovers);
  }
  if (plan.mode == config::Network::nat && from != config::Network::nat) enter_nat(plan, ns.view(), init, leftovers);
  fs::atomic_write(plan.state_dir / kModeFile, config::to_string(plan.mode) + "\n", 0600);
}

void end_network(const NetworkPlan& plan) {
  network::detach_pasta(plan.state_dir / kPastaPidFile);
  if (UniqueFd proxy = find_proxy(plan)) signal_pidfd(proxy.get(), SIGTERM);
  for (const char* name : {kModeFile, kProxyPidFile})
    if (::unlink((plan.state_dir / name).c_str()) < 0 && errno != ENOENT)
      throw SysError(errno, "remove", (plan.state_dir / name).string());
}

}  // namespace nshpc::sandbox
