// ns-hpc configuration: three TOML layers merged into one validated, immutable Config.
//
// Layers (later wins): built-in defaults -> ${XDG_CONFIG_HOME:-~/.config}/ns-hpc/config.toml
// -> the explicit file (--config, else NS_HPC_CONFIG). Tables merge deeply; every other value,
// lists included, is replaced whole. An entry of a named table (proxied_mcps.X, host_commands.X,
// dav.extras.X, jobs.*.limit.X) with `enabled = false` is removed from the effective config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nshpc::config {

enum class ResultType { text, structured, both };
enum class Network { host, off };

std::string_view to_string(ResultType);
std::string_view to_string(Network);
std::optional<Network> parse_network(std::string_view);

// A resource limit in the style of Slurm's: used when a job does not ask, and the most it may ask.
struct Limit {
  std::int64_t default_value = 0;
  std::int64_t max = 0;
  std::int64_t min = 0;  // the least a job may ask for (set by the table: see local_limit_minimum)
};

// The least value of a [jobs.local.limit] / [terminal.limits] limit that ns-hpc enforces (cpus,
// memory, pids, time, output): a local limit can never be switched off by asking for 0. nullopt
// for other names. Slurm resources have no such minimum (gpus = 0 means something there).
std::optional<std::int64_t> local_limit_minimum(std::string_view name);

struct Namespace {
  std::filesystem::path instances_dir;     // absolute, ~ and $VAR expanded
  std::vector<std::string> bwrap_command;  // base argv; [0] is the bwrap program
  std::string workspace_mount = "/workspace";
  std::string output_mount = "/output";
  std::string shared_output_mount = "/shared-output";
  bool shared_output = false;  // opt-in: bind every instance's output read-only (the seed's default)
  int status_fd = 3;           // accepted for compatibility; ns-hpc numbers its descriptors itself
  bool hardening = true;       // add the hardening flags to bwrap_command
  bool seccomp = true;         // pass the built-in seccomp filter (only when hardening is on)
  // Host uid/gid bwrap is started as when ns-hpc runs as root. 0 keeps root (unsafe; doctor warns).
  std::uint32_t sandbox_uid = 65534;
  std::uint32_t sandbox_gid = 65534;
  Network default_network = Network::host;  // network of new instances
  std::string path = "/usr/local/bin:/usr/bin:/bin";  // PATH inside the sandbox
  std::map<std::string, std::string> env;             // extra variables set in the sandbox
  std::vector<std::string> pass_env;                  // host variables passed through by name
  std::int64_t tmp_size = 1024;  // MiB of the sandbox's private /tmp and of its /dev/shm, each
};

// terminal_execute: the limits every synchronous command runs under (as [jobs.local.limit]'s
// defaults; a call cannot ask for other values). cpus, memory (MiB), pids, output (MiB).
struct Terminal {
  std::map<std::string, std::int64_t> limits;
};

// The host-side audit logs (per instance and the store's): each rotated at max_size MiB into
// <log>.1 … <log>.<keep>, the oldest dropped.
struct Audit {
  std::int64_t max_size = 64;
  std::int64_t keep = 3;
};

struct JobsLocal {
  bool use_cgroups = true;
  std::vector<std::string> cgroups_command;  // optional prefix (e.g. systemd-run); empty = none
  bool proc_check = true;
  std::map<std::string, Limit> limit;
};

struct JobsSlurm {
  std::vector<std::string> sbatch_command;
  std::map<std::string, Limit> limit;
  // The other scheduler commands (argv prefixes; a wrapper can stand in for any of them).
  std::vector<std::string> squeue_command = {"squeue"};
  std::vector<std::string> sacct_command = {"sacct"};
  std::vector<std::string> scancel_command = {"scancel"};
  double poll_interval = 2.0;       // seconds between the status queries of all tracked jobs
  std::string status_source = "auto";  // auto | sacct | squeue (ends of jobs the controller forgot)
  // How a batch job runs ns-hpc on the compute node ([] = this binary's absolute path, with
  // the same --config); it must see the same instances folder (shared filesystem).
  std::vector<std::string> ns_hpc_command;
};

struct Jobs {
  std::int64_t max_timeout = 3600;
  std::int64_t max_running_per_instance = 256;
  std::int64_t max_running = 512;
  std::int64_t cancel_grace = 5;  // seconds between SIGTERM and SIGKILL
  JobsLocal local;
  JobsSlurm slurm;
};

struct Resource {
  std::vector<std::filesystem::path> context_dirs;  // absolute; relative ones resolved against the
                                                     // folder of the file that set them
  std::vector<std::string> resource_patterns;
};

struct Mcp {
  ResultType result_type = ResultType::both;
  std::int64_t max_message_bytes = 8 * 1024 * 1024;  // larger messages are refused
  std::int64_t page_size = 100;                      // list results per page
  std::string default_instance;  // instance used when a tool call names none ("" = must name one)
};

// The HTTP transports (ns-hpc run --transport streamable-http|sse); command-line flags override.
struct Server {
  std::string host = "127.0.0.1";
  std::int64_t port = 8000;
  std::string path = "/mcp";
  std::string auth_token;                 // "" = NS_HPC_AUTH_TOKEN, else the stored/generated one
  std::filesystem::path state_dir;        // holds http-token (0600)
  std::vector<std::string> allowed_hosts;    // extra Host names (DNS-rebinding protection)
  std::vector<std::string> allowed_origins;  // extra Origins
  std::int64_t session_idle_timeout = 300;   // seconds
  std::int64_t max_sessions = 256;
  std::int64_t read_timeout = 30;            // seconds, per request body and per stalled write
  std::int64_t header_timeout = 10;          // seconds to send a request's header block
  std::int64_t shutdown_grace = 5;           // seconds for requests in flight at SIGTERM
  std::int64_t sse_buffer_bytes = 8 * 1024 * 1024;
  // Caps, so that no client, sandbox or local user can starve the others. A peer is the remote
  // address, or the uid of a loopback or Unix-socket client.
  std::int64_t max_connections = 1024;
  std::int64_t max_connections_per_peer = 256;
  std::int64_t max_sessions_per_peer = 32;
  std::int64_t max_requests_per_session = 16;  // running or queued
  std::int64_t max_requests_per_peer = 128;
  std::int64_t max_session_buffer_bytes = 32 * 1024 * 1024;  // held for clients: unsent + for resume
  std::int64_t max_buffer_bytes = 256 * 1024 * 1024;         // the same, in the whole server
};

struct DavExtra {
  std::filesystem::path path;
  bool ro = true;
};

struct Dav {
  bool enabled = false;
  std::map<std::string, DavExtra> extras;
};

struct ProxiedMcp {
  std::string command;
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  double idle_timeout = 0.0;
};

struct HostCommand {
  std::string command;
  std::string description;
  double timeout = 30.0;
};

struct Config {
  Namespace ns;
  Jobs jobs;
  Terminal terminal;
  Audit audit;
  Resource resource;
  Mcp mcp;
  Server server;
  Dav dav;
  std::map<std::string, ProxiedMcp> proxied_mcps;
  std::map<std::string, HostCommand> host_commands;
  std::vector<std::filesystem::path> sources;  // the files that were read, in layer order
  std::optional<std::filesystem::path> explicit_file;  // --config / NS_HPC_CONFIG, if any
};

// Refusal to load: every problem is one line "file:line:col: key: what is wrong and what is allowed".
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const noexcept { return problems_; }

 private:
  std::vector<std::string> problems_;
};

using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;
EnvLookup process_env();  // reads the real environment
bool running_as_root();   // geteuid() == 0

// Default namespace.instances_dir when running as root (instead of ~/.local/share/...): the
// sandbox uid must be able to traverse the path to the workspaces, and /root is private.
inline constexpr std::string_view kRootInstancesDir = "/var/lib/ns-hpc/instances";
inline constexpr std::string_view kRootStateDir = "/var/lib/ns-hpc";

struct LoadOptions {
  std::optional<std::filesystem::path> explicit_path;  // --config; falls back to NS_HPC_CONFIG
  bool read_user_file = true;                          // the XDG layer
  EnvLookup env = process_env();
  bool as_root = running_as_root();                    // selects kRootInstancesDir as default
};

struct Loaded {
  Config config;
  std::vector<std::string> warnings;  // e.g. "file:3:1: unknown key 'namespace.foo' ignored"
};

// Loads and validates the layers. Throws ConfigError (never returns a half-valid Config).
Loaded load(const LoadOptions& options = {});

// Validates one file on top of the defaults (for `ns-hpc config check FILE`).
Loaded check_file(const std::filesystem::path& file, const EnvLookup& env = process_env());

// The effective configuration, for `ns-hpc config show [--json]`.
nlohmann::json to_json(const Config&);
std::string to_toml(const Config&);

// The built-in defaults as TOML text (documented in the README).
std::string_view default_toml();

}  // namespace nshpc::config
