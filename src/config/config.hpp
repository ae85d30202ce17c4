// ns-hpc configuration: three TOML layers merged into one validated, immutable Config.
//
// Layers (later wins): built-in defaults -> ${XDG_CONFIG_HOME:-~/.config}/ns-hpc/config.toml
// -> the explicit file (--config, else NS_HPC_CONFIG). Tables merge deeply; every other value,
// lists included, is replaced whole. An entry of a named table (proxied_mcps.X, host_commands.X,
// dav.extras.X, jobs.*.limit.X) with `enabled = false` is removed from the effective config.
//
// Every key (its name, type, bounds, default and meaning) is defined once, in src/config/keys.cpp;
// the structs below only hold the values. A Config comes from load() or built_in(), never from
// its members' initial values (which are zero/empty).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nshpc::config {

// The enumerations of the configuration, each value with its TOML/JSON name.
enum class ResultType { text, structured, both };

// An instance's network (sandbox/network: how each is made). Every mode but `host` gives the
// sandbox a network namespace of its own.
enum class Network { host, off, nat, filtered };

// [namespace] default_network: a mode, or `auto` (resolve_default_network).
enum class DefaultNetwork { automatic, host, off, nat, filtered };

// Where the ends of Slurm jobs that the controller has forgotten come from.
enum class StatusSource { automatic, sacct, squeue };

// Their names as JSON (config.cpp), and as text: the name of a value, and the value named `name`
// (nullopt for any other name), for the enumerations above.
void to_json(nlohmann::json& out, const ResultType& value);
void from_json(const nlohmann::json& in, ResultType& value);
void to_json(nlohmann::json& out, const Network& value);
void from_json(const nlohmann::json& in, Network& value);
void to_json(nlohmann::json& out, const DefaultNetwork& value);
void from_json(const nlohmann::json& in, DefaultNetwork& value);
void to_json(nlohmann::json& out, const StatusSource& value);
void from_json(const nlohmann::json& in, StatusSource& value);

template <class E>
  requires std::is_enum_v<E>
std::string to_string(E value);

template <class E>
  requires std::is_enum_v<E>
std::optional<E> from_string(std::string_view name);

inline std::optional<Network> parse_network(std::string_view name) { return from_string<Network>(name); }

// The network of new instances: [namespace] default_network when it names a mode; for `auto`,
// the safest that lets an agent work here: `host` when the user's own bwrap_command asks for
// --share-net, else `nat` where it works (`nat_works`: network::nat_unavailable() says none is
// missing), else `filtered`.
Network resolve_default_network(DefaultNetwork configured, bool bwrap_shares_net, bool nat_works);

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
  std::filesystem::path images_dir;        // the images instances can run on (sandbox/images.hpp)
  std::string default_image;               // the image `--image` without a name means; "" = none
  std::vector<std::string> bwrap_command;  // base argv; [0] is the bwrap program
  std::string workspace_mount;
  std::string output_mount;
  std::string shared_output_mount;
  bool shared_output = false;
  int status_fd = 0;
  bool hardening = false;
  bool seccomp = false;
  std::uint32_t sandbox_uid = 0;
  std::uint32_t sandbox_gid = 0;
  DefaultNetwork default_network = DefaultNetwork::automatic;
  // A user's own layer (the user file or --config) sets bwrap_command with --share-net: the
  // original's way to ask for the host's network (the built-in list has it and does not count).
  bool bwrap_shares_net = false;
  std::string path;                       // PATH inside the sandbox
  std::map<std::string, std::string> env;
  std::vector<std::string> pass_env;
  std::int64_t tmp_size = 0;  // MiB
  bool persistent = false;      // new instances are living instances (one long-lived sandbox)
  std::int64_t idle_stop = 0;   // seconds without activity before a living instance stops; 0 = never
  // [namespace] limits: cpus, memory (MiB), pids of a whole instance (every execution of it
  // together); absent or 0 = no limit. sandbox/limits.hpp says how they nest.
  std::map<std::string, std::int64_t> limits;
};

// terminal_execute: cpus, memory (MiB), pids, output (MiB).
struct Terminal {
  std::map<std::string, std::int64_t> limits;
  std::string shell;  // runs every shell command (terminal_execute, jobs): shell -c COMMAND
};

struct Audit {
  std::int64_t max_size = 0;  // MiB
  std::int64_t keep = 0;
};

struct JobsLocal {
  bool use_cgroups = false;
  std::vector<std::string> cgroups_command;  // optional prefix; empty = none
  bool proc_check = false;
  std::map<std::string, Limit> limit;
};

struct JobsSlurm {
  std::vector<std::string> sbatch_command;
  std::map<std::string, Limit> limit;
  std::vector<std::string> squeue_command;
  std::vector<std::string> sacct_command;
  std::vector<std::string> scancel_command;
  double poll_interval = 0;  // seconds
  StatusSource status_source = StatusSource::automatic;
  std::vector<std::string> ns_hpc_command;  // [] = this binary with the same --config
};

struct Jobs {
  std::int64_t max_timeout = 0;  // seconds
  std::int64_t max_running_per_instance = 0;
  std::int64_t max_running = 0;
  std::int64_t cancel_grace = 0;  // seconds between SIGTERM and SIGKILL
  JobsLocal local;
  JobsSlurm slurm;
};

struct Resource {
  std::vector<std::filesystem::path> context_dirs;  // absolute
  std::vector<std::string> resource_patterns;
};

struct Mcp {
  ResultType result_type = ResultType::both;
  std::int64_t max_message_bytes = 0;
  std::int64_t page_size = 0;
  std::string default_instance;  // "" = a tool call must name one
  std::int64_t max_result_chars = 0;  // characters of a tool result (output cut in the middle beyond)
  bool confirm_destructive = false;   // ask before what cannot be undone (tools/confirm.hpp)
  double confirm_slurm_cpu_hours = 0;  // a Slurm job above cpus × hours asks too; 0 = never
};

// The HTTP transports (ns-hpc run --transport streamable-http|sse); command-line flags override.
struct Server {
  std::string host;
  std::int64_t port = 0;
  std::string path;
  std::string auth_token;                 // "" = NS_HPC_AUTH_TOKEN, else the stored/generated one
  std::filesystem::path state_dir;        // holds http-token (0600)
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> allowed_origins;
  std::int64_t session_idle_timeout = 0;  // seconds
  std::int64_t max_sessions = 0;
  std::int64_t read_timeout = 0;    // seconds
  std::int64_t header_timeout = 0;  // seconds
  std::int64_t shutdown_grace = 0;  // seconds
  std::int64_t sse_buffer_bytes = 0;
  std::int64_t max_connections = 0;
  std::int64_t max_connections_per_peer = 0;
  std::int64_t max_sessions_per_peer = 0;
  std::int64_t max_requests_per_session = 0;
  std::int64_t max_requests_per_peer = 0;
  std::int64_t max_session_buffer_bytes = 0;
  std::int64_t max_buffer_bytes = 0;
};

// WebDAV (dav/handler.hpp).
struct DavExtra {
  std::filesystem::path path;
  bool ro = false;
};

struct Dav {
  bool enabled = false;
  std::int64_t max_upload_bytes = 0;
  std::map<std::string, DavExtra> extras;
};

// The web dashboard (dashboard/dashboard.hpp).
struct Dashboard {
  bool enabled = true;
};

// The mcp-virtual-computer entry point (`ns-hpc computer`).
struct Computer {
  bool expose_lifecycle_tools = true;
};

// The desktop of a living instance (desktop/).
struct Desktop {
  std::string image;            // the image desktops are made on (built with image build --desktop)
  std::int64_t width = 0;       // the screen, pixels
  std::int64_t height = 0;
  bool host_root = false;       // instances on the host's root may run one (its packages)
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
  double timeout = 0.0;
};

// A range of TCP ports, both ends included; written "FIRST-LAST".
struct PortRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  bool contains(std::uint16_t port) const { return port >= first && port <= last; }
  bool operator==(const PortRange&) const = default;
};
inline std::string to_string(const PortRange& range) {
  return std::to_string(range.first) + "-" + std::to_string(range.last);
}
void to_json(nlohmann::json& out, const PortRange& range);

// [network]: what `filtered` instances may reach, and the host ports exposed ones may take.
struct NetworkPolicy {
  std::vector<std::string> allow;    // "name", "*.domain", "10.1.2.3", each optionally ":port"
  std::vector<std::string> resolve;  // "name=address": used instead of DNS for that name
  PortRange expose_port_range;       // expose_port's host ports (never [server] port)
};

struct Config {
  Namespace ns;
  NetworkPolicy network;
  Jobs jobs;
  Terminal terminal;
  Audit audit;
  Resource resource;
  Mcp mcp;
  Server server;
  Dav dav;
  Dashboard dashboard;
  Computer computer;
  Desktop desktop;
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
inline constexpr std::string_view kRootImagesDir = "/var/lib/ns-hpc/images";

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

// How another process runs this ns-hpc with the same configuration: this binary's path, and
// --config FILE when one was given (a batch job's, a background image build's).
std::vector<std::string> self_command(const Config& config, std::string_view why);

// The built-in defaults alone (no file read, NS_HPC_CONFIG ignored).
Config built_in(const EnvLookup& env = process_env(), bool as_root = running_as_root());

// The effective configuration, for `ns-hpc config show [--json]`.
nlohmann::json to_json(const Config&);
std::string to_toml(const Config&);

// Every key with its type, default and meaning (`ns-hpc config keys [--markdown]`): a Markdown
// table (the README's, between its config-keys markers) or plain text, one key per paragraph.
std::string keys_markdown();
std::string keys_text();

}  // namespace nshpc::config
