#include "sandbox/network.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/file.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/scope.hpp"
#include "base/proc.hpp"
#include "base/spawn.hpp"
#include "base/text.hpp"
#include "network/forward.hpp"
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
constexpr const char* kHolderPidFile = "network.holder.pid"; // an ephemeral instance's holder
constexpr const char* kHolderLock = "network.lock";          // taken while a holder is found or made
constexpr const char* kPortsFile = "network.ports.json";     // the exposed ports
constexpr const char* kForwardLog = "network.forward.log";   // what the forwarders say

stdfs::path forward_pid_file(const NetworkPlan& plan, std::uint16_t port) {
  return plan.state_dir / fmt::format("network.forward.{}.pid", port);
}

// The proxy's policy for `mode`: the allow list in `filtered`, nothing in any other.
void write_policy(const NetworkPlan& plan, config::Network mode) {
  nlohmann::json resolve = nlohmann::json::object();
  for (const std::string& pair : plan.resolve) {
    const auto eq = pair.find('=');
    resolve[pair.substr(0, eq)].push_back(pair.substr(eq + 1));
  }
  const nlohmann::json policy = {{"mode", mode == config::Network::filtered ? "filtered" : "off"},
                                 {"allow", plan.allow},
                                 {"instance_allow", plan.instance_allow},
                                 {"resolve", resolve}};
  fs::atomic_write(plan.state_dir / kPolicyFile, policy.dump(2) + "\n", 0600);
}

// Whether one of `args` holds `text`.
bool mentions(const std::vector<std::string>& args, std::string_view text) {
  return std::any_of(args.begin(), args.end(), [&](const std::string& arg) { return arg.find(text) != std::string::npos; });
}

// A process recorded in `pid_file` that still runs `command` with `marker` in its arguments.
UniqueFd find_recorded(const stdfs::path& pid_file, std::string_view command, const std::string& marker) {
  std::ifstream in(pid_file);
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 1) return {};
  UniqueFd fd = open_pidfd(pid);
  if (!fd) return {};
  const std::vector<std::string> args = proc::read_cmdline(pid);
  if (!mentions(args, command) || !mentions(args, marker)) return {};
  return fd;
}

// The proxy on record, when it still runs (its pid, and its command line naming this policy).
UniqueFd find_proxy(const NetworkPlan& plan) {
  return find_recorded(plan.state_dir / kProxyPidFile, network::kProxyCommand, (plan.state_dir / kPolicyFile).string());
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
               "--audit-rotation",
               audit::rotation_argument(plan.audit_rotation),
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

UniqueFd find_forwarder(const NetworkPlan& plan, std::uint16_t port) {
  return find_recorded(forward_pid_file(plan, port), network::kForwardCommand, forward_pid_file(plan, port).string());
}

std::map<std::uint16_t, std::uint16_t> read_ports(const NetworkPlan& plan) {
  std::map<std::uint16_t, std::uint16_t> ports;
  const auto text = fs::read_file(plan.state_dir / kPortsFile);
  if (!text) return ports;
  try {
    const nlohmann::json doc = parse_json(*text);
    for (const auto& entry : doc.at("ports"))
      ports[entry.at("port").get<std::uint16_t>()] = entry.at("host_port").get<std::uint16_t>();
  } catch (const std::exception& e) {
    throw Error(fmt::format("{} is damaged ({}); expose the instance's ports again", (plan.state_dir / kPortsFile).string(),
                            e.what()));
  }
  return ports;
}

void write_ports(const NetworkPlan& plan, const std::map<std::uint16_t, std::uint16_t>& ports) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [port, host_port] : ports) list.push_back({{"port", port}, {"host_port", host_port}});
  fs::atomic_write(plan.state_dir / kPortsFile, nlohmann::json{{"ports", list}}.dump(2) + "\n", 0600);
}

// Whom a forwarder binds and runs as: never root, so it can never take a privileged port. As
// root, the sandbox's own uid (nobody when the sandbox runs as root); otherwise this process's
// own uid (nullopt), without capabilities.
std::optional<users::Identity> forwarder_identity(const NetworkPlan& plan) {
  if (::geteuid() != 0) return std::nullopt;
  if (plan.runs_as && plan.runs_as->uid != 0) return plan.runs_as;
  return users::Identity{65534, 65534};
}

// Why `host_port` cannot be asked for; nullopt when it can.
std::optional<std::string> unusable_host_port(const NetworkPlan& plan, std::uint16_t host_port) {
  if (!plan.expose_ports.contains(host_port))
    return fmt::format("host port {} is outside the ports exposed ports may take here, {} ([network] "
                       "expose_port_range); give one in it, or 0 for a free one",
                       host_port, config::to_string(plan.expose_ports));
  if (host_port == plan.server_port)
    return fmt::format("host port {} is the ns-hpc server's own HTTP port ([server] port); give another in {}, or 0 "
                       "for a free one",
                       host_port, config::to_string(plan.expose_ports));
  return std::nullopt;
}

// A listening socket on the host's 127.0.0.1 at the first free one of `ports`, bound as the
// forwarder's identity. UsageError when every one is in use.
UniqueFd host_loopback_listener(const NetworkPlan& plan, const std::vector<std::uint16_t>& ports) {
  try {
    return network::listen_as(forwarder_identity(plan), "127.0.0.1", ports);
  } catch (const SysError& e) {
    if (e.code() != EADDRINUSE) throw;
    if (ports.size() == 1)
      throw UsageError(fmt::format("port {} of the host's loopback is in use; choose another host_port in {}, or 0 "
                                   "for a free one",
                                   ports.front(), config::to_string(plan.expose_ports)));
    throw UsageError(fmt::format("every free port of [network] expose_port_range ({}) on the host's loopback is in "
                                 "use; close exposed ports that are not needed, or widen the range",
                                 config::to_string(plan.expose_ports)));
  }
}

std::uint16_t bound_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// Starts the forwarder of `port` from `listener`; records its pid.
void start_forwarder(const NetworkPlan& plan, const network::NetnsFds& ns, pid_t init, std::uint16_t port,
                     const UniqueFd& listener, Leftovers& leftovers) {
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd) throw SysError(errno, "open", "/dev/null");
  const stdfs::path log_path = plan.state_dir / kForwardLog;
  UniqueFd log_fd(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!log_fd) throw SysError(errno, "open", log_path.string());
  SpawnSpec spec;
  spec.program = fs::self_program("the forwarder of an exposed port");
  spec.argv = {spec.program,  std::string(network::kForwardCommand), "--port", std::to_string(port),
               "--audit",     plan.audit_log.string(),              "--instance", plan.instance_id,
               "--watch-pid", std::to_string(init),                  "--record", forward_pid_file(plan, port).string()};
  // It joins the namespace as root, then becomes the identity its socket was bound as.
  if (const auto identity = forwarder_identity(plan))
    spec.argv.insert(spec.argv.end(), {"--uid", std::to_string(identity->uid), "--gid", std::to_string(identity->gid)});
  spec.fds = {{null_fd.get(), 0}, {null_fd.get(), 1}, {log_fd.get(), 2}, {listener.get(), 3}, {ns.net.get(), 4}};
  if (::geteuid() != 0 && ns.userns) spec.fds.emplace_back(ns.userns.get(), 5);
  spec.new_session = true;
  SpawnedChild forwarder = spawn(spec);
  fs::atomic_write(forward_pid_file(plan, port), std::to_string(forwarder.pid()) + "\n", 0600);
  leftovers.add(UniqueFd(::fcntl(forwarder.pidfd(), F_DUPFD_CLOEXEC, 3)));
  forwarder.release();
}

void end_forwarders(const NetworkPlan& plan) {
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(plan.state_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("network.forward.") || !name.ends_with(".pid")) continue;
    const UniqueFd fd = find_recorded(entry.path(), network::kForwardCommand, entry.path().string());
    if (fd) signal_pidfd(fd.get(), SIGTERM);
    ::unlink(entry.path().c_str());
  }
}

// The recorded ports whose forwarder does not run get one (the same host port; one that is
// taken now is left for a later start and said in the log).
void restore_ports(const NetworkPlan& plan, const network::NetnsFds& ns, pid_t init, Leftovers& leftovers) {
  for (const auto& [port, host_port] : read_ports(plan)) {
    if (find_forwarder(plan, port)) continue;
    try {
      // A port recorded before the range was what it is now stays closed until exposed again.
      if (const auto why = unusable_host_port(plan, host_port)) throw UsageError(*why);
      start_forwarder(plan, ns, init, port, host_loopback_listener(plan, {host_port}), leftovers);
    } catch (const std::exception& e) {
      log::warn("instance {}: port {} is not exposed again on 127.0.0.1:{}: {}", plan.instance_id, port, host_port,
                e.what());
    }
  }
}

void leave_nat(const NetworkPlan& plan, const network::Netns& ns) {
  network::detach_pasta(plan.state_dir / kPastaPidFile);
  network::destroy_sockets(ns);
}

void enter_nat(const NetworkPlan& plan, const network::Netns& ns, pid_t init, Leftovers& leftovers) {
  if (auto why = network::nat_unavailable())
    throw NeedsAction(NeedsAction::Action::choose_network,
                      fmt::format("instance '{}': network 'nat' cannot work here: {}", plan.instance_id, *why),
                      plan.instance_id);
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

std::optional<stdfs::path> network_helper_folder(const std::vector<std::string>& argv) {
  // Each helper's command (argv[1]; pasta: its program) and the option naming a file in its folder.
  static const std::pair<std::string_view, std::string_view> kRecordOption[] = {
      {network::kHoldCommand, "--record"},
      {network::kProxyCommand, "--policy"},
      {network::kWatchCommand, "--pasta-pid-file"},
      {network::kForwardCommand, "--record"},
  };
  if (argv.size() < 2) return std::nullopt;
  std::string_view option;
  if (stdfs::path(argv[0]).filename().string().starts_with("pasta")) option = "--pid";
  for (const auto& [command, record] : kRecordOption)
    if (argv[1] == command) option = record;
  if (option.empty()) return std::nullopt;
  for (std::size_t i = 1; i + 1 < argv.size(); ++i)
    if (argv[i] == option && stdfs::path(argv[i + 1]).is_absolute()) return stdfs::path(argv[i + 1]).parent_path();
  return std::nullopt;
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
  restore_ports(plan, ns, init, leftovers);
}

ExposedPort expose_port(const NetworkPlan& plan, pid_t init, std::uint16_t port, std::uint16_t host_port,
                        Leftovers& leftovers) {
  if (host_port != 0)
    if (const auto why = unusable_host_port(plan, host_port)) throw UsageError(*why);
  std::map<std::uint16_t, std::uint16_t> ports = read_ports(plan);
  const auto known = ports.find(port);
  const bool known_usable = known != ports.end() && !unusable_host_port(plan, known->second);
  if (known_usable && (host_port == 0 || host_port == known->second))
    if (find_forwarder(plan, port)) return {port, known->second, true};
  // The host ports to try, in order: the one asked for; else the one it had, then the range
  // (without the server's port, and without those the instance's other exposed ports keep for
  // when their forwarders start again).
  std::vector<std::uint16_t> candidates;
  if (host_port != 0) {
    candidates.push_back(host_port);
  } else {
    if (known_usable) candidates.push_back(known->second);
    for (std::uint32_t p = plan.expose_ports.first; p <= plan.expose_ports.last; ++p) {
      const auto candidate = static_cast<std::uint16_t>(p);
      const bool kept = std::any_of(ports.begin(), ports.end(), [&](const auto& entry) {
        return entry.first != port && entry.second == candidate;
      });
      if (candidate != plan.server_port && !kept && (!known_usable || candidate != known->second))
        candidates.push_back(candidate);
    }
    if (candidates.empty())
      throw UsageError(fmt::format("[network] expose_port_range ({}) has no port left for this instance; close "
                                   "exposed ports that are not needed, or widen the range",
                                   config::to_string(plan.expose_ports)));
  }
  if (known != ports.end()) unexpose_port(plan, port);
  UniqueFd listener = host_loopback_listener(plan, candidates);
  const network::NetnsFds ns = network::open_netns(init);
  start_forwarder(plan, ns, init, port, listener, leftovers);
  ports = read_ports(plan);
  ports[port] = bound_port(listener.get());
  write_ports(plan, ports);
  return {port, ports[port], true};
}

bool unexpose_port(const NetworkPlan& plan, std::uint16_t port) {
  std::map<std::uint16_t, std::uint16_t> ports = read_ports(plan);
  if (const UniqueFd fd = find_forwarder(plan, port)) signal_pidfd(fd.get(), SIGTERM);
  ::unlink(forward_pid_file(plan, port).c_str());
  if (ports.erase(port) == 0) return false;
  write_ports(plan, ports);
  return true;
}

std::vector<ExposedPort> exposed_ports(const NetworkPlan& plan) {
  std::vector<ExposedPort> out;
  for (const auto& [port, host_port] : read_ports(plan))
    out.push_back({port, host_port, static_cast<bool>(find_forwarder(plan, port))});
  return out;
}

stdfs::path held_network_dir(const stdfs::path& state_dir) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  std::string name(host);
  for (char& c : name)
    if (c == '/') c = '_';
  return state_dir / ("network-" + name);
}

std::optional<HeldNetwork> find_held_network(const NetworkPlan& plan) {
  std::ifstream in(plan.state_dir / kHolderPidFile);
  pid_t pid = 0;
  if (!(in >> pid) || pid <= 1) return std::nullopt;
  HeldNetwork held;
  held.pid = pid;
  held.pidfd = open_pidfd(pid);
  if (!held.pidfd) return std::nullopt;
  // The pid is the holder of this folder (its command line, which names it), and its namespaces
  // are opened while the pidfd says it still lives.
  const std::vector<std::string> args = proc::read_cmdline(pid);
  if (!mentions(args, network::kHoldCommand) || !mentions(args, (plan.state_dir / kHolderPidFile).string()))
    return std::nullopt;
  try {
    held.ns = network::open_netns(pid);
  } catch (const SysError& e) {
    if (e.code() == ESRCH || e.code() == ENOENT) return std::nullopt;
    throw;
  }
  if (wait_pidfd(held.pidfd.get(), std::chrono::milliseconds(0))) return std::nullopt;
  return held;
}

namespace {

// Holds an exclusive lock on the folder's lock file for its lifetime (other server processes of
// this host wait).
UniqueFd lock_held_dir(const stdfs::path& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw SysError(errno, "mkdir", dir.string());
  const stdfs::path path = dir / kHolderLock;
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw SysError(errno, "open", path.string());
  while (::flock(fd.get(), LOCK_EX) != 0)
    if (errno != EINTR) throw SysError(errno, "lock", path.string());
  return fd;
}

HeldNetwork start_holder(const NetworkPlan& plan, std::chrono::seconds idle, Leftovers& leftovers) {
  Pipe ready = make_pipe();
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd) throw SysError(errno, "open", "/dev/null");
  SpawnSpec spec;
  spec.program = fs::self_program("the holder of an instance's network namespace");
  // The pid file's path in its arguments names the folder it holds for (find_held_network).
  spec.argv = {spec.program, std::string(network::kHoldCommand), "--idle", std::to_string(idle.count()),
               "--record", (plan.state_dir / kHolderPidFile).string()};
  spec.fds = {{null_fd.get(), 0}, {null_fd.get(), 1}, {null_fd.get(), 2}, {ready.write.get(), 3}};
  spec.new_session = true;
  SpawnedChild holder = spawn(spec);
  ready.write.reset();
  std::string said;
  char buf[512];
  for (;;) {
    pollfd p{ready.read.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, 10000);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw Error("the holder of the instance's network namespace did not come up within 10 s");
    const ssize_t got = ::read(ready.read.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    said.append(buf, static_cast<std::size_t>(got));
  }
  if (said != "ready\n")
    throw Error(fmt::format("the instance's network namespace could not be made: {}",
                            said.empty() ? std::string("its holder ended without a word") : std::string(text::trim(said))));
  HeldNetwork held;
  held.pid = holder.pid();
  held.ns = network::open_netns(held.pid);
  held.pidfd.reset(::fcntl(holder.pidfd(), F_DUPFD_CLOEXEC, 3));
  fs::atomic_write(plan.state_dir / kHolderPidFile, std::to_string(held.pid) + "\n", 0600);
  leftovers.add(UniqueFd(::fcntl(holder.pidfd(), F_DUPFD_CLOEXEC, 3)));
  holder.release();
  return held;
}

}  // namespace

HeldNetwork hold_network(const NetworkPlan& plan, std::chrono::seconds idle, Leftovers& leftovers, bool again) {
  const UniqueFd lock = lock_held_dir(plan.state_dir);
  if (std::optional<HeldNetwork> held = find_held_network(plan)) {
    if (again || served_network(plan.state_dir) != plan.mode) serve_network(plan, held->pid, leftovers);
    return std::move(*held);
  }
  end_network(plan);  // what served an earlier holder
  HeldNetwork held = start_holder(plan, idle, leftovers);
  {
    // A namespace whose network is not what the instance asks for is never used.
    RollbackOnFailure stop_holder([&] {
      signal_pidfd(held.pidfd.get(), SIGTERM);
      end_network(plan);
    });
    serve_network(plan, held.pid, leftovers);
  }
  log::info("instance {}: network namespace held for its commands (holder pid {}, {})", plan.instance_id, held.pid,
            config::to_string(plan.mode));
  return held;
}

bool release_held_network(const NetworkPlan& plan) {
  std::error_code ec;
  if (!stdfs::exists(plan.state_dir, ec)) return false;
  const UniqueFd lock = lock_held_dir(plan.state_dir);
  std::optional<HeldNetwork> held = find_held_network(plan);
  if (held) signal_pidfd(held->pidfd.get(), SIGTERM);
  end_network(plan);
  ::unlink((plan.state_dir / kHolderPidFile).c_str());
  return held.has_value();
}

void end_network(const NetworkPlan& plan) {
  network::detach_pasta(plan.state_dir / kPastaPidFile);
  end_forwarders(plan);
  if (UniqueFd proxy = find_proxy(plan)) signal_pidfd(proxy.get(), SIGTERM);
  for (const char* name : {kModeFile, kProxyPidFile})
    if (::unlink((plan.state_dir / name).c_str()) < 0 && errno != ENOENT)
      throw SysError(errno, "remove", (plan.state_dir / name).string());
}

}  // namespace nshpc::sandbox
