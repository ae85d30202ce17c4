// The built-in defaults layer and the names of the configuration's enumerations.
#include "config/config.hpp"

namespace nshpc::config {

namespace {

// Loaded as the lowest layer (source "<defaults>"); every key the schema knows has its default
// here, so this text doubles as the reference of the configuration format.
constexpr std::string_view kDefaultToml = R"toml(# ns-hpc built-in defaults.
# Layers, later wins: these defaults -> ${XDG_CONFIG_HOME:-~/.config}/ns-hpc/config.toml
# -> the file named by --config (else $NS_HPC_CONFIG). Tables merge key by key; any other value,
# lists included, replaces the lower layer's value whole. An entry of proxied_mcps, host_commands,
# dav.extras, jobs.slurm.limit or jobs.local.limit with `enabled = false` is removed.

[namespace]
# Root of all instance state. ~ and $VAR / ${VAR} are expanded; a relative path is resolved
# against the folder of the file that sets it.
instances_dir = "${HOME}/.local/share/ns-hpc/instances"
# Base bwrap argv; element 0 is the bwrap program. ns-hpc appends the binds, --chdir and the command.
bwrap_command = [
  "bwrap", "--unshare-all", "--share-net",
  "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
  "--ro-bind", "/usr", "/usr",
  "--ro-bind", "/lib", "/lib",
  "--ro-bind", "/lib64", "/lib64",
  "--ro-bind", "/bin", "/bin",
  "--ro-bind", "/sbin", "/sbin",
  "--ro-bind", "/etc", "/etc",
]
# Sandbox paths of the instance's workspace (also the working directory), of its output folder
# and of the read-only view of every instance's output. Absolute, distinct, not "/".
workspace_mount = "/workspace"
output_mount = "/output"
shared_output_mount = "/shared-output"
# Bind every instance's output read-only at shared_output_mount.
shared_output = false
# Accepted for compatibility; ns-hpc numbers its descriptors itself. 3 or more.
status_fd = 3
# Add ns-hpc's hardening flags to bwrap_command, and its seccomp filter (only with hardening).
hardening = true
seccomp = true
# Host uid/gid bwrap runs as when ns-hpc runs as root (0 keeps root, which is unsafe).
sandbox_uid = 65534
sandbox_gid = 65534
# Network of new instances: "host" or "off".
default_network = "host"
# PATH inside the sandbox.
path = "/usr/local/bin:/usr/bin:/bin"
# Host variables passed into the sandbox by name.
pass_env = []
# MiB of the sandbox's private /tmp and of its /dev/shm (each a tmpfs of at most this size).
tmp_size = 1024

# Extra variables set in the sandbox (NAME = "value"; not PATH or HOME).
[namespace.env]

[terminal]
# Limits of every terminal_execute command (cgroups where this host offers them, as for jobs):
# cpus: cores; memory: MiB; pids: processes and threads; output: MiB, the largest file it may write.
[terminal.limits]
cpus = 2
memory = 4096
pids = 1024
output = 1024

[audit]
# Each audit log (per instance, and the store's) is rotated at max_size MiB into <log>.1 … <log>.<keep>.
max_size = 64
keep = 3

[jobs]
# Hard cap, in seconds, of any job timeout or wait (1..604800).
max_timeout = 3600
# Jobs running at once: per instance, and in all instances of this server.
max_running_per_instance = 256
max_running = 512
# Seconds between SIGTERM and SIGKILL when a job is cancelled or runs out of time.
cancel_grace = 5

[jobs.local]
# Run local jobs under cgroups, with cgroups_command as an optional prefix (e.g. systemd-run).
use_cgroups = true
cgroups_command = []
# After a restart, check "running" local jobs against /proc.
proc_check = true

# Limits of local jobs: name = { default = int, max = int }; a job may ask for up to max.
# cpus: cores (cgroup cpu quota); memory: MiB (cgroup); pids: processes and threads (cgroup);
# time: wall-clock seconds; output: MiB, the largest file the job may write (stdout/stderr too).
[jobs.local.limit]
cpus = { default = 2, max = 64 }
memory = { default = 4096, max = 262144 }
pids = { default = 1024, max = 65536 }
time = { default = 3600, max = 604800 }
output = { default = 1024, max = 1048576 }

[jobs.slurm]
# Base sbatch argv; "{name}" in an element is replaced by the job's value of limit `name`.
sbatch_command = ["sbatch", "--partition", "cpu", "--cpus-per-task={cpus}", "--mem={memory}M"]
# The other scheduler commands (a wrapper script can stand in for any of them).
squeue_command = ["squeue"]
sacct_command = ["sacct"]
scancel_command = ["scancel"]
# Seconds between status queries; each query covers every tracked job at once.
poll_interval = 2.0
# Every poll asks squeue once about all tracked jobs. For jobs the controller has already
# forgotten (MinJobAge after their end), the end comes from "sacct" (accounting), or nowhere
# ("squeue": such jobs are reported lost); "auto" uses sacct when the cluster keeps accounting.
status_source = "auto"
# How a batch job runs ns-hpc on the compute node; [] = this ns-hpc's absolute path with the
# same --config. The node must see the same instances folder (a shared filesystem).
ns_hpc_command = []

# Limits of Slurm jobs: used when a job does not ask (default) and the most it may ask (max).
[jobs.slurm.limit]
cpus = { default = 1, max = 8 }
memory = { default = 4096, max = 32768 }  # MiB

[resource]
# Folders whose top-level files matching resource_patterns are served as MCP resources. A relative
# folder is resolved against the folder of the file that sets the list (for these defaults:
# ${XDG_CONFIG_HOME:-~/.config}/ns-hpc).
context_dirs = ["context"]
resource_patterns = ["*.md"]

[mcp]
# Result shape of ns-hpc's own tools: "text", "structured" or "both".
result_type = "both"
# Largest accepted MCP message; a bigger one is refused and reading resumes after it.
max_message_bytes = 8388608
# Items per page of tools/list, resources/list and prompts/list.
page_size = 100
# Instance that terminal_execute and the job tools use when a call names none ("": none).
default_instance = ""

[server]
# The HTTP transports: ns-hpc run --transport streamable-http (or sse). Flags override these.
host = "127.0.0.1"
port = 8000
path = "/mcp"
# Bearer token required on every HTTP route but /healthz. When "" (and NS_HPC_AUTH_TOKEN is
# unset), ns-hpc generates one, keeps it in <state_dir>/http-token (mode 0600) and prints it.
auth_token = ""
state_dir = "${HOME}/.local/state/ns-hpc"
# Host header names accepted besides localhost, 127.0.0.1, [::1] and the listen address
# (DNS-rebinding protection); "*" accepts any.
allowed_hosts = []
# Origin header values accepted besides http(s)://<an accepted host>; "*" accepts any.
allowed_origins = []
# An HTTP session nobody used for this many seconds is closed and everything it held released.
session_idle_timeout = 300
max_sessions = 256
# Seconds a client may take to send a request's body, or to take a stalled response.
read_timeout = 30
# Seconds a client may take to send a request's header block (also: a kept-alive connection
# that sends no new request for this long is closed).
header_timeout = 10
# Seconds that requests in flight get to finish after SIGTERM/SIGINT.
shutdown_grace = 5
# Unsent bytes one SSE stream may hold for a slow reader before notifications are dropped.
sse_buffer_bytes = 8388608
# A peer below is the client's address, or, for a loopback or Unix-socket client, its uid.
# Open connections at once (kept below the open-file limit, which ns-hpc raises to the maximum).
# At a cap, the connection that waited longest for its request header is closed to make room.
max_connections = 1024
# Open connections of one peer.
max_connections_per_peer = 256
# Sessions of one peer (of max_sessions).
max_sessions_per_peer = 32
# Requests one session may have running or queued; more are refused with an error naming this.
max_requests_per_session = 16
# Requests one peer may have running or queued in all its sessions.
max_requests_per_peer = 128
# Bytes held for one session's client: unsent, or kept for a resume (Last-Event-ID). Beyond it
# the resume copies go first, then new requests are refused until the client reads.
max_session_buffer_bytes = 33554432
# The same for all clients of the server together.
max_buffer_bytes = 268435456

[dav]
# Serve WebDAV at /dav (HTTP transports only).
enabled = false

# Extra folders served at /dav/<name>/: [dav.extras.<name>] path = "...", ro = true.
[dav.extras]

# MCP servers started inside an instance and proxied as <name>__<tool>:
# command (required), args, env, include, exclude (tool-name globs), idle_timeout (seconds, 0 = never).
[proxied_mcps.filesystem]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/"]

# Shell commands run on the host: [host_commands.<key>] command = "...", description = "",
# timeout = 30 (seconds).
[host_commands]
)toml";

}  // namespace

std::string_view default_toml() { return kDefaultToml; }

std::string_view to_string(ResultType type) {
  switch (type) {
    case ResultType::text:
      return "text";
    case ResultType::structured:
      return "structured";
    case ResultType::both:
      return "both";
  }
  return "both";
}

std::string_view to_string(Network network) {
  switch (network) {
    case Network::host:
      return "host";
    case Network::off:
      return "off";
  }
  return "host";
}

std::optional<std::int64_t> local_limit_minimum(std::string_view name) {
  // memory: a sandbox with its shell needs a few MiB; pids: bwrap, its init and a shell.
  static constexpr std::pair<std::string_view, std::int64_t> kMinimums[] = {
      {"cpus", 1}, {"memory", 16}, {"pids", 8}, {"time", 1}, {"output", 1}};
  for (const auto& [limit, min] : kMinimums)
    if (limit == name) return min;
  return std::nullopt;
}

std::optional<Network> parse_network(std::string_view name) {
  for (Network network : {Network::host, Network::off}) {
    if (to_string(network) == name) return network;
  }
  return std::nullopt;
}

}  // namespace nshpc::config
