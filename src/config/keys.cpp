// The key table: every key of the configuration, defined once. One entry per key: its TOML name,
// the member that holds it, its type with bounds, its default as written in TOML, and its help
// (the README's text). Reading, `config show`, the built-in defaults and the README's table are
// derived from here (keys.hpp says how); change a key here and nowhere else.
#include "config/keys.hpp"

#include <array>
#include <charconv>
#include <limits>

namespace nshpc::config {

namespace {

// memory: a sandbox with its shell needs a few MiB; pids: bwrap, its init and a shell.
constexpr std::pair<std::string_view, std::int64_t> kLocalLimitMinimums[] = {
    {"cpus", 1}, {"memory", 16}, {"pids", 8}, {"time", 1}, {"output", 1}};

}  // namespace

std::optional<std::int64_t> local_limit_minimum(std::string_view name) {
  for (const auto& [limit, min] : kLocalLimitMinimums)
    if (limit == name) return min;
  return std::nullopt;
}

namespace detail {

namespace {

// ---- names of entries -----------------------------------------------------------------------

constexpr NameRule kLimitNames{
    [](std::string_view name) {
      return matches(name, is_lower, [](char c) { return is_lower(c) || is_digit(c) || c == '_'; });
    },
    "lowercase letters, digits and _ (starting with a letter)"};

constexpr NameRule kDavExtraNames{
    [](std::string_view name) {
      return name != "instances" &&
             matches(name, is_alnum, [](char c) { return is_alnum(c) || c == '_' || c == '.' || c == '-'; });
    },
    "letters, digits, _, . and - (starting with a letter or digit; not \"instances\")"};

constexpr NameRule kMcpNames{
    [](std::string_view name) {
      return name.find("__") == std::string_view::npos &&
             matches(name, is_alnum, [](char c) { return is_alnum(c) || c == '_' || c == '-'; });
    },
    "letters, digits, _ and - (starting with a letter or digit; no \"__\", which separates the server "
    "from the tool name)"};

constexpr NameRule kHostCommandNames{[](std::string_view name) { return !name.empty(); }, "a non-empty name"};

// ---- rules across keys ----------------------------------------------------------------------

// The three sandbox mounts must differ; reported at the later one a file gives.
void check_mounts(Section& section, Namespace& ns) {
  const std::array<std::pair<std::string_view, const std::string*>, 3> mounts{{
      {"workspace_mount", &ns.workspace_mount},
      {"output_mount", &ns.output_mount},
      {"shared_output_mount", &ns.shared_output_mount},
  }};
  for (std::size_t later = 1; later < mounts.size(); ++later) {
    for (std::size_t earlier = 0; earlier < later; ++earlier) {
      const std::string& value = *mounts[later].second;
      if (value.empty() || value != *mounts[earlier].second) continue;  // empty: bad, reported already
      const bool later_given = section.find(mounts[later].first).has_value();
      const auto field = section.find(mounts[later_given ? later : earlier].first);
      if (!field) continue;  // both defaults, which differ
      const std::string_view other = mounts[later_given ? earlier : later].first;
      section.state().error(*field, fmt::format("{:?} is also {}; the three mounts must differ", value,
                                                join_key(section.key(), other)));
    }
  }
}

constexpr std::int64_t kUnset = -1;  // below any valid limit value
const Limit kBlankLimit{kUnset, kUnset, 0};
constexpr std::string_view kLimitHint = "a limit needs both default and max (integers, 0 <= default <= max)";

// 0 <= default <= max.
void check_limit(Section& entry, Limit& limit) {
  if (limit.default_value != kUnset && limit.max != kUnset && limit.default_value > limit.max) {
    entry.state().error(*entry.find("default"), fmt::format("{} is larger than max ({}); use 0 <= default <= max",
                                                            limit.default_value, limit.max));
  }
}

// A local job limit: as check_limit, and never below the minimum ns-hpc enforces for its name.
void check_local_limit(Section& entry, Limit& limit) {
  check_limit(entry, limit);
  const std::string_view name = entry.name();
  const auto min = local_limit_minimum(name);
  if (!min) return;
  limit.min = *min;
  for (auto [key, value] : {std::pair<const char*, std::int64_t>{"default", limit.default_value}, {"max", limit.max}}) {
    if (value >= 0 && value < *min)
      entry.state().error(*entry.find(key), fmt::format("{} is below the minimum of {} for {}; a local limit cannot "
                                                        "be switched off (give a large max instead)",
                                                        value, *min, name));
  }
}

std::vector<Key<Limit>> limit_fields() {
  const IntRule rule{0, std::numeric_limits<std::int64_t>::max(), "", true};
  return {
      value("default", &Limit::default_value, integer(rule),
            {.help = "Used when a job does not ask.", .required = std::string(kLimitHint)}),
      value("max", &Limit::max, integer(rule),
            {.help = "The most a job may ask for.", .required = std::string(kLimitHint)}),
  };
}

std::int64_t minimum(std::string_view local_limit) { return *local_limit_minimum(local_limit); }

// An instance limit: 0 (no limit), or from the limit's local minimum up to `max`. Below the
// minimum is refused rather than rounded: a sandbox cannot even start under it.
Type<std::int64_t> zero_or_local_limit(std::string_view name, std::int64_t max, std::string_view meaning) {
  const std::int64_t min = minimum(name);
  const Type<std::int64_t> any = integer({0, max, meaning});
  std::string expected = fmt::format("an integer ({}, 0 = no limit, else {}..{})", meaning, min, max);
  return {expected, [any, min, name, expected](const Field& field, LoadState& state) -> std::optional<std::int64_t> {
            auto value = any.read(field, state);
            if (value && *value > 0 && *value < min) {
              state.error(field, fmt::format("{} is below the minimum of {} for {}; use 0 for no limit, or {} or more",
                                             *value, min, name, min));
              return std::nullopt;
            }
            return value;
          }};
}

// "FIRST-LAST", unprivileged ports (a forwarder binds as an unprivileged user, so it could never
// take a port below 1024 anyway).
Type<PortRange> port_range() {
  static constexpr std::string_view kExpected = "a port range \"FIRST-LAST\", 1024 <= FIRST <= LAST <= 65535";
  const Type<std::string> base = text({kExpected});
  return {base.expected, [base](const Field& field, LoadState& state) -> std::optional<PortRange> {
            const auto value = base.read(field, state);
            if (!value) return std::nullopt;
            const auto port = [](std::string_view digits) -> std::optional<std::uint16_t> {
              unsigned n = 0;
              const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
              if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || n > 65535)
                return std::nullopt;
              return static_cast<std::uint16_t>(n);
            };
            const auto dash = value->find('-');
            const std::string_view text(*value);
            const auto first = dash == std::string::npos ? std::nullopt : port(text.substr(0, dash));
            const auto last = dash == std::string::npos ? std::nullopt : port(text.substr(dash + 1));
            if (!first || !last || *first < 1024 || *first > *last) {
              state.error(field, fmt::format("{:?} is not {}", *value, kExpected));
              return std::nullopt;
            }
            return PortRange{*first, *last};
          }};
}

// ---- the table ------------------------------------------------------------------------------

constexpr IntRule kGrace{0, 600, "seconds"};
constexpr IntRule kIdleSeconds{1, 31536000, "seconds, at least 1"};
constexpr IntRule kJobs{1, 100000, "jobs"};
constexpr IntRule kSessions{1, 100000, "sessions"};
constexpr IntRule kConnections{1, 1000000, "connections"};
constexpr IntRule kRequests{1, 100000, "requests"};
constexpr IntRule kHeldBytes{1048576, 68719476736, "bytes (1 MiB to 64 GiB)"};
constexpr IntRule kHostId{0, 4294967294, "a host uid/gid"};

Keys<Config> make_config_keys() {
  return {{
      table("namespace", &Config::ns, {
          value("instances_dir", &Namespace::instances_dir, folder(), {
              .defaults_to = R"("${HOME}/.local/share/ns-hpc/instances")",
              .as_root = fmt::format("{:?}", kRootInstancesDir),
              .help = "Root of all instance state. As root, the sandbox uid must be able to pass through "
                      "every folder on the way (doctor checks it)."}),
          value("images_dir", &Namespace::images_dir, folder(), {
              .defaults_to = R"("${HOME}/.local/share/ns-hpc/images")",
              .as_root = fmt::format("{:?}", kRootImagesDir),
              .help = "Where `ns-hpc image build` keeps the Debian images instances can run on, each "
                      "version read-only (a few hundred MB each; a local file system)."}),
          value("default_image", &Namespace::default_image, text({"an image name, or \"\" for none"}), {
              .defaults_to = R"("debian")",
              .help = "The image an instance gets when it asks for one without a name (and the "
                      "mcp-virtual-computer entry point's). Built with `ns-hpc image build` (`doctor --fix` builds it; "
                      "the server and `doctor --fix --background` start its build in the background)."}),
          value("bwrap_command", &Namespace::bwrap_command, argv(), {
              .defaults_to = R"(["bwrap", "--unshare-all", "--share-net", "--proc", "/proc", "--dev", "/dev", )"
                             R"("--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr", "--ro-bind", "/lib", "/lib", )"
                             R"("--ro-bind", "/lib64", "/lib64", "--ro-bind", "/bin", "/bin", "--ro-bind", )"
                             R"("/sbin", "/sbin", "--ro-bind", "/etc", "/etc"])",
              .help = "Base argv; element 0 is the bwrap program. ns-hpc adds the hardening flags, the "
                      "instance mounts and the command. `--share-net`/`--unshare-net` here are ignored: the "
                      "instance's network setting decides (but a `--share-net` in a list of your own makes `host` "
                      "the `auto` default_network). `--ro-bind /bin /bin` where `/bin` is a "
                      "merged-/usr symlink becomes `--symlink usr/bin /bin`."}),
          value("workspace_mount", &Namespace::workspace_mount, sandbox_path(), {
              .defaults_to = R"("/workspace")",
              .help = "Sandbox path of the instance's workspace, also the working directory. The three "
                      "mounts must differ."}),
          value("output_mount", &Namespace::output_mount, sandbox_path(), {
              .defaults_to = R"("/output")", .help = "Sandbox path of the instance's output folder."}),
          value("shared_output_mount", &Namespace::shared_output_mount, sandbox_path(), {
              .defaults_to = R"("/shared-output")",
              .help = "Sandbox path of the read-only view of every instance's output (with `shared_output`)."}),
          value("shared_output", &Namespace::shared_output, boolean(), {
              .defaults_to = "false",
              .help = "Opt in to the original's read-only view of *every* instance's output at "
                      "`shared_output_mount`."}),
          value("status_fd", &Namespace::status_fd,
                integer({3, std::numeric_limits<int>::max(), "a file descriptor number", true}), {
              .defaults_to = "3",
              .help = "Accepted for compatibility; ns-hpc numbers its descriptors itself."}),
          value("hardening", &Namespace::hardening, boolean(), {
              .defaults_to = "true", .help = "Add ns-hpc's hardening flags to `bwrap_command`."}),
          value("seccomp", &Namespace::seccomp, boolean(), {
              .defaults_to = "true", .help = "Pass ns-hpc's seccomp filter (with `hardening`)."}),
          value("sandbox_uid", &Namespace::sandbox_uid, integer(kHostId), {
              .defaults_to = "65534",
              .help = "Host uid bwrap runs as when ns-hpc runs as root. `0` keeps root (doctor fails it)."}),
          value("sandbox_gid", &Namespace::sandbox_gid, integer(kHostId), {
              .defaults_to = "65534", .help = "Host gid bwrap runs as when ns-hpc runs as root."}),
          value("default_network", &Namespace::default_network,
                choice<DefaultNetwork>({DefaultNetwork::automatic, DefaultNetwork::host, DefaultNetwork::off,
                                        DefaultNetwork::nat, DefaultNetwork::filtered}), {
              .defaults_to = R"("auto")",
              .help = "Network of new instances: `off` (own loopback only), `nat` (own network namespace with "
                      "user-mode NAT: the outside world, not the host's own addresses), `filtered` (only "
                      "[network] allow, through ns-hpc's proxy), `host` (shared with the host, its loopback "
                      "services included: the weakest), or `auto`: `nat` where it works, else `filtered`; "
                      "`host` when your own `bwrap_command` has `--share-net`."}),
          value("path", &Namespace::path, text({"the PATH inside the sandbox, e.g. \"/usr/bin:/bin\"", true}), {
              .defaults_to = R"("/usr/local/bin:/usr/bin:/bin")", .help = "`PATH` inside the sandbox."}),
          value("env", &Namespace::env, variables({.reserve_path_and_home = true}), {
              .defaults_to = "{}",
              .help = "Extra variables set in the sandbox (not `PATH` or `HOME`)."}),
          value("pass_env", &Namespace::pass_env, var_names(), {
              .defaults_to = "[]", .help = "Host variables passed into the sandbox by name."}),
          value("tmp_size", &Namespace::tmp_size, integer({1, 1048576, "MiB"}), {
              .defaults_to = "1024",
              .help = "MiB of the sandbox's private `/tmp` and of its `/dev/shm`, each (every `--tmpfs` of "
                      "`bwrap_command` without a `--size` of its own, and a `/dev/shm` tmpfs in the `--dev` "
                      "it makes)."}),
          value("persistent", &Namespace::persistent, boolean(), {
              .defaults_to = "false",
              .help = "New instances are living: one long-lived sandbox that every command and local job "
                      "joins, so background processes, `/tmp` and loopback servers stay between commands "
                      "(per instance: `persistent`). `false`: a fresh sandbox per command, as the original."}),
          value("idle_stop", &Namespace::idle_stop, integer({0, 31536000, "seconds"}), {
              .defaults_to = "900",
              .help = "Seconds without a command, job or session before a living instance stops itself "
                      "(files are kept; its processes end). `0`: never."}),
          table<Namespace>("limits", {
              map_value("cpus", &Namespace::limits, zero_or_local_limit("cpus", 1024, "cores"), {
                  .defaults_to = "0",
                  .help = "Cores of a whole instance: all its commands, local jobs and living sandbox together "
                          "(a cgroup per instance; each command or job also keeps its own limits, so it gets "
                          "the smaller of its own and what the instance has left). `0`: no limit. Enforced "
                          "only where ns-hpc can write cgroups (root, or a delegated subtree, with `[jobs.local] "
                          "use_cgroups`); elsewhere `describe_instance` lists them as unenforced."}),
              map_value("memory", &Namespace::limits, zero_or_local_limit("memory", 16777216, "MiB"), {
                  .defaults_to = "0",
                  .help = "Memory of a whole instance (MiB; swap not allowed beyond it): past it the kernel's "
                          "OOM killer ends a process of the instance. `0`: no limit."}),
              map_value("pids", &Namespace::limits, zero_or_local_limit("pids", 4194304, "processes"), {
                  .defaults_to = "0",
                  .help = "Processes and threads of a whole instance, its living sandbox's own included. `0`: "
                          "no limit."}),
          }),
      }, check_mounts),

      table("jobs", &Config::jobs, {
          value("max_timeout", &Jobs::max_timeout, integer({1, 604800, "seconds"}), {
              .defaults_to = "3600",
              .help = "Cap on any job timeout or wait (tool `timeout`s above it are refused, not cut)."}),
          value("max_running_per_instance", &Jobs::max_running_per_instance, integer(kJobs), {
              .defaults_to = "256", .help = "Jobs running at once in one instance; past it `submit_job` says so."}),
          value("max_running", &Jobs::max_running, integer(kJobs), {
              .defaults_to = "512", .help = "Jobs running at once in all instances of this server."}),
          value("cancel_grace", &Jobs::cancel_grace, integer(kGrace), {
              .defaults_to = "5",
              .help = "Seconds between SIGTERM and SIGKILL on cancel or at the time limit."}),
          table("local", &Jobs::local, {
              value("use_cgroups", &JobsLocal::use_cgroups, boolean(), {
                  .defaults_to = "true",
                  .help = "Limit jobs with cgroups (v1 memory/cpu/pids, v2 where delegated, `cgroup.kill` for "
                          "the whole tree). A limit this host cannot enforce is listed in the job's "
                          "`unenforced` field and by `doctor`, never silently dropped."}),
              value("cgroups_command", &JobsLocal::cgroups_command, strings(), {
                  .defaults_to = "[]",
                  .help = "Optional prefix put in front of bwrap for jobs (e.g. `[\"systemd-run\", \"--user\", "
                          "\"--scope\", \"-p\", \"MemoryMax=8G\", \"--\"]` where systemd user scopes work); "
                          "ns-hpc's own cgroups apply either way."}),
              value("proc_check", &JobsLocal::proc_check, boolean(), {
                  .defaults_to = "true",
                  .help = "Accepted for compatibility (ns-hpc always checks a job's processes safely: pid "
                          "plus pid-namespace inode)."}),
              named("limit", &JobsLocal::limit, kLimitNames,
                    limit_fields(), {
                  .defaults_to = "cpus = { default = 2, max = 64 }\n"
                                 "memory = { default = 4096, max = 262144 }\n"
                                 "pids = { default = 1024, max = 65536 }\n"
                                 "time = { default = 3600, max = 604800 }\n"
                                 "output = { default = 1024, max = 1048576 }",
                  .help = "`{default, max}` of each job limit; a job may ask for up to `max` and no less than "
                          "the limit's minimum (`cpus` 1, `memory` 16, `pids` 8, `time` 1, `output` 1: asking "
                          "for `0` never switches a limit off, and a `default`/`max` below it is a config "
                          "error). cpus: cores (cgroup cpu quota); memory: MiB; pids: processes and threads; "
                          "time: wall-clock seconds; `output`: MiB, the largest file the job may write "
                          "(RLIMIT_FSIZE: stdout and stderr files included)."},
                    check_local_limit, kBlankLimit),
          }),
          table("slurm", &Jobs::slurm, {
              value("sbatch_command", &JobsSlurm::sbatch_command, argv(), {
                  .defaults_to = R"(["sbatch", "--partition", "cpu", "--cpus-per-task={cpus}", "--mem={memory}M"])",
                  .help = "Base sbatch argv; `{name}` is replaced by the job's value of resource `name` (a "
                          "placeholder naming no resource is refused). ns-hpc adds `--export=PATH,HOME,LANG` "
                          "(the server's other variables, secrets included, stay out of the job), "
                          "`--parsable`, `--job-name=ns-hpc-<job>`, `--output`/`--error` (Slurm's own "
                          "messages, kept in the instance's private `.ns_hpc_jobs/<job>.slurm.out|err` and "
                          "shown after the job's stderr tail; the job's output itself is written by `ns-hpc "
                          "bwrap --stdout/--stderr` on the node into the workspace, never by a path Slurm "
                          "follows) and `--chdir`."}),
              named("limit", &JobsSlurm::limit, kLimitNames,
                    limit_fields(), {
                  .defaults_to = "cpus = { default = 1, max = 8 }\n"
                                 "memory = { default = 4096, max = 32768 }",
                  .help = "Slurm resources: integers, `0 <= default <= max` (0 is allowed here: `gpus = 0` "
                          "means something to Slurm); add any others your `sbatch_command` uses (`gpus`, "
                          "`time`). Defaults are filled in and maxima checked before anything is submitted."},
                    check_limit, kBlankLimit),
              value("squeue_command", &JobsSlurm::squeue_command, argv(), {
                  .defaults_to = R"(["squeue"])",
                  .help = "The scheduler's squeue (a wrapper can stand in for it, as for the two below)."}),
              value("sacct_command", &JobsSlurm::sacct_command, argv(), {
                  .defaults_to = R"(["sacct"])", .help = "The scheduler's sacct."}),
              value("scancel_command", &JobsSlurm::scancel_command, argv(), {
                  .defaults_to = R"(["scancel"])", .help = "The scheduler's scancel."}),
              value("poll_interval", &JobsSlurm::poll_interval, number({0.1, true, "seconds"}), {
                  .defaults_to = "2.0",
                  .help = "Seconds between status queries. Each query is one `squeue -t all -j <all tracked "
                          "ids>` (state, pending reason, exit status); `sacct` is asked only about jobs the "
                          "controller has already forgotten."}),
              value("status_source", &JobsSlurm::status_source,
                    choice<StatusSource>({StatusSource::automatic, StatusSource::sacct, StatusSource::squeue}), {
                  .defaults_to = R"("auto")",
                  .help = "Where the ends of forgotten jobs (MinJobAge after their end) come from: `sacct` "
                          "(accounting), or `squeue` (no accounting: such jobs are reported `lost`); `auto` "
                          "uses sacct where the cluster keeps accounting (decided once)."}),
              value("ns_hpc_command", &JobsSlurm::ns_hpc_command, strings(), {
                  .defaults_to = "[]",
                  .help = "How the batch job runs ns-hpc on the node: `[]` = this binary's absolute path with "
                          "the same `--config`. The node must see the same instances folder (a shared "
                          "filesystem)."}),
          }),
      }),

      table("terminal", &Config::terminal, {
          value("shell", &Terminal::shell, text({"an absolute path of a shell in the sandbox", true}), {
              .defaults_to = R"("/bin/bash")",
              .help = "The shell that runs a `command` of `terminal_execute` and of `submit_job` (and a one-word "
                      "`instance run` command): `<shell> -c COMMAND`."}),
          table<Terminal>("limits", {
              map_value("cpus", &Terminal::limits, integer({minimum("cpus"), 1024, "cores"}), {
                  .defaults_to = "2",
                  .help = "Cores of every `terminal_execute` command. The terminal limits are enforced as a "
                          "job's are (a cgroup of its own for cpus/memory/pids where this host lets ns-hpc "
                          "write cgroups, RLIMIT_FSIZE for output); a call cannot ask for others."}),
              map_value("memory", &Terminal::limits, integer({minimum("memory"), 16777216, "MiB"}), {
                  .defaults_to = "4096", .help = "Memory of every `terminal_execute` command."}),
              map_value("pids", &Terminal::limits, integer({minimum("pids"), 4194304, "processes"}), {
                  .defaults_to = "1024", .help = "Processes and threads of every `terminal_execute` command."}),
              map_value("output", &Terminal::limits, integer({minimum("output"), 1048576, "MiB"}), {
                  .defaults_to = "1024",
                  .help = "The largest file a `terminal_execute` command may write."}),
          }),
      }),

      table("audit", &Config::audit, {
          value("max_size", &Audit::max_size, integer({1, 1048576, "MiB"}), {
              .defaults_to = "64",
              .help = "Each audit log (per instance, and the store's) is rotated at `max_size` into "
                      "`<log>.1` … `<log>.<keep>` (the oldest dropped)."}),
          value("keep", &Audit::keep, integer({1, 100, "rotated files"}), {
              .defaults_to = "3", .help = "Rotated files kept of each audit log."}),
      }),

      table("resource", &Config::resource, {
          value("context_dirs", &Resource::context_dirs, folders(), {
              .defaults_to = R"(["context"])",
              .help = "Folders of extra MCP context documents: their top-level files matching "
                      "`resource_patterns`. The default is below `${XDG_CONFIG_HOME:-~/.config}/ns-hpc`."}),
          value("resource_patterns", &Resource::resource_patterns, strings(), {
              .defaults_to = R"(["*.md"])", .help = "File name patterns of the context documents."}),
      }),

      table("mcp", &Config::mcp, {
          value("result_type", &Mcp::result_type,
                choice<ResultType>({ResultType::text, ResultType::structured, ResultType::both}), {
              .defaults_to = R"("both")",
              .help = "Result shape of the tools: `text` (no `outputSchema` advertised), `structured` or "
                      "`both`."}),
          value("max_message_bytes", &Mcp::max_message_bytes, integer({1024, 1073741824, "bytes (1 KiB to 1 GiB)"}), {
              .defaults_to = "8388608",
              .help = "Largest MCP message accepted; a bigger one is refused and reading resumes after it."}),
          value("page_size", &Mcp::page_size, integer({1, 10000, "items per page"}), {
              .defaults_to = "100", .help = "Items per page of `tools/list`, `resources/list` and `prompts/list`."}),
          value("default_instance", &Mcp::default_instance, text({"an instance id"}), {
              .defaults_to = R"("")",
              .help = "Instance that `terminal_execute` and the job tools use when a call names none (then "
                      "`instance_id` is optional in their schemas); `\"\"`: none."}),
          value("max_result_chars", &Mcp::max_result_chars, integer({1000, 10000000, "characters"}), {
              .defaults_to = "30000",
              .help = "Most characters a tool result carries (`terminal_execute` and the job tools cut their "
                      "output to fit, listings end their page; with `result_type = \"both\"` the text and "
                      "`structuredContent` share it): longer output keeps its head and tail with a marker "
                      "saying how much was cut, and the whole of a cut `terminal_execute` output is kept in "
                      "`/workspace/.ns_hpc_output/term-*` (the last 5 per instance)."}),
          value("confirm_destructive", &Mcp::confirm_destructive, boolean(), {
              .defaults_to = "false",
              .help = "Ask the user before what cannot be undone (deleting an instance, archive, snapshot or "
                      "computer, a factory reset, restoring a snapshot over an instance, a Slurm job above "
                      "`confirm_slurm_cpu_hours`): through the client's elicitation where it declared it "
                      "(2025-11-25 `elicitation/create`, 2026-07-28 `input_required`), else the call must pass "
                      "`confirm: true`. Off by default so unattended scripts and clients keep working."}),
          value("confirm_slurm_cpu_hours", &Mcp::confirm_slurm_cpu_hours, number({0, true, "CPU hours"}), {
              .defaults_to = "0",
              .help = "With `confirm_destructive` on, a Slurm job whose CPUs × time limit in hours exceeds "
                      "this asks first; `0`: never."}),
      }),

      table("server", &Config::server, {
          value("host", &Server::host, text({"a listen address such as 127.0.0.1", true}), {
              .defaults_to = R"("127.0.0.1")",
              .help = "HTTP listen address (`ns-hpc run --transport streamable-http` or `sse`; the `run` "
                      "flags override the `server` keys)."}),
          value("port", &Server::port, integer({0, 65535, "a TCP port, 0 = any free port"}), {
              .defaults_to = "8000", .help = "HTTP port."}),
          value("path", &Server::path, url_path(), {
              .defaults_to = R"("/mcp")", .help = "Path of the MCP endpoint."}),
          value("auth_token", &Server::auth_token, text({"a bearer token, or \"\" for the generated one"}), {
              .defaults_to = R"("")",
              .help = "Bearer token required on every HTTP route but `/healthz`. When `\"\"`: "
                      "`NS_HPC_AUTH_TOKEN`, else the one ns-hpc generates and keeps in "
                      "`<state_dir>/http-token` (mode 0600). `config show` hides it.",
              .secret = true}),
          value("state_dir", &Server::state_dir, folder(), {
              .defaults_to = R"("${HOME}/.local/state/ns-hpc")",
              .as_root = fmt::format("{:?}", kRootStateDir),
              .help = "A local folder (not on NFS) for the generated token, `http-token` (0600), and the "
                      "instance listing index, `index/<hash>.sqlite` (rebuilt from the instances when missing). "
                      "Made 0711 when missing: the instances folder may lie inside it (as root by default)."}),
          value("allowed_hosts", &Server::allowed_hosts, strings(), {
              .defaults_to = "[]",
              .help = "Host header names accepted besides `localhost`, `127.0.0.1`, `[::1]` and the listen "
                      "address (DNS-rebinding protection); `\"*\"` accepts any."}),
          value("allowed_origins", &Server::allowed_origins, strings(), {
              .defaults_to = "[]",
              .help = "Origin header values accepted besides `http(s)://<an accepted host>`; `\"*\"` accepts any."}),
          value("session_idle_timeout", &Server::session_idle_timeout, integer(kIdleSeconds), {
              .defaults_to = "300",
              .help = "Seconds after which an unused HTTP session is closed and everything it held released."}),
          value("max_sessions", &Server::max_sessions, integer(kSessions), {
              .defaults_to = "256", .help = "HTTP sessions at once."}),
          value("read_timeout", &Server::read_timeout, integer(kIdleSeconds), {
              .defaults_to = "30",
              .help = "Seconds a client may take to send a request's body or to take a stalled response."}),
          value("header_timeout", &Server::header_timeout, integer({1, 3600, "seconds (1 to 3600)"}), {
              .defaults_to = "10",
              .help = "Seconds to send a request's header block (also how long a kept-alive connection may "
                      "stay silent)."}),
          value("shutdown_grace", &Server::shutdown_grace, integer(kGrace), {
              .defaults_to = "5", .help = "Seconds requests in flight get after SIGTERM/SIGINT."}),
          value("sse_buffer_bytes", &Server::sse_buffer_bytes, integer({65536, 1073741824, "bytes (64 KiB to 1 GiB)"}), {
              .defaults_to = "8388608",
              .help = "Unsent bytes an SSE stream keeps for a slow reader before dropping notifications."}),
          value("max_connections", &Server::max_connections, integer(kConnections), {
              .defaults_to = "1024",
              .help = "Open connections in all (kept below the open-file limit, which ns-hpc raises to the "
                      "maximum). At a cap the connection that waited longest for its header makes room."}),
          value("max_connections_per_peer", &Server::max_connections_per_peer, integer(kConnections), {
              .defaults_to = "256",
              .help = "Open connections of one peer: the client's address, or the uid of a loopback or "
                      "Unix-socket client."}),
          value("max_sessions_per_peer", &Server::max_sessions_per_peer, integer(kSessions), {
              .defaults_to = "32", .help = "HTTP sessions of one peer (of `max_sessions`)."}),
          value("max_requests_per_session", &Server::max_requests_per_session, integer(kRequests), {
              .defaults_to = "16",
              .help = "Requests one session may have running or queued; more get a JSON-RPC error naming "
                      "this key."}),
          value("max_requests_per_peer", &Server::max_requests_per_peer, integer(kRequests), {
              .defaults_to = "128", .help = "Requests one peer may have running or queued in all its sessions."}),
          value("max_session_buffer_bytes", &Server::max_session_buffer_bytes, integer(kHeldBytes), {
              .defaults_to = "33554432",
              .help = "Bytes held for one session's client: unsent, or kept for a resume (`Last-Event-ID`). "
                      "Beyond it the resume copies go first, then answers and new requests are refused "
                      "until the client reads."}),
          value("max_buffer_bytes", &Server::max_buffer_bytes, integer(kHeldBytes), {
              .defaults_to = "268435456", .help = "The same for all clients of the server together."}),
      }),

      table("network", &Config::network, {
          value("allow", &NetworkPolicy::allow, network_entries(false), {
              .defaults_to = "[]",
              .help = "What instances in the `filtered` network mode may reach, through ns-hpc's proxy: "
                      "`\"pypi.org\"`, `\"*.debian.org\"` (subdomains), an address `\"10.1.2.3\"`, each optionally "
                      "with `:port` (else ports 80 and 443). A name that resolves to a link-local, metadata or "
                      "private address is refused unless that address is listed too; one of the host's own "
                      "(loopback, any address of its interfaces) unless it is listed here (an instance's "
                      "`network_allow` never opens those)."}),
          value("resolve", &NetworkPolicy::resolve, network_entries(true), {
              .defaults_to = "[]",
              .help = "`\"name=address\"` pairs the proxy uses instead of DNS (pinning, tests)."}),
          value("expose_port_range", &NetworkPolicy::expose_port_range, port_range(), {
              .defaults_to = R"("40000-40999")",
              .help = "The host ports `expose_port` may take on `127.0.0.1` (`host_port` 0: a free one in it; "
                      "one outside it is refused), never `[server] port`. Keep it clear of the ports your own "
                      "services use: a forwarded port belongs to the sandbox."}),
      }),

      table("dav", &Config::dav, {
          value("enabled", &Dav::enabled, boolean(), {
              .defaults_to = "false",
              .help = "Serve WebDAV at `/dav` (HTTP transports only): `/dav/instances/<id>/workspace/`, "
                      "`/dav/instances/<id>/output/` and the extras, behind the same token (also accepted as "
                      "the password of Basic auth)."}),
          value("max_upload_bytes", &Dav::max_upload_bytes, integer({1, 1099511627776, "bytes (1 B to 1 TiB)"}), {
              .defaults_to = "17179869184", .help = "The largest file a WebDAV PUT may write (larger: 413)."}),
          named("extras", &Dav::extras, kDavExtraNames, {
              value("path", &DavExtra::path, folder(), {
                  .help = "The folder to serve; it must exist and be readable when the server starts.",
                  .required = "give the folder to serve (a string)"}),
              value("ro", &DavExtra::ro, boolean(), {.defaults_to = "true", .help = "Read-only (every write gets 403)."}),
          }, {.help = "Extra folders served at `/dav/<name>/`."}),
      }),

      table("dashboard", &Config::dashboard, {
          value("enabled", &Dashboard::enabled, boolean(), {
              .defaults_to = "true",
              .help = "Serve the web dashboard at `/` and its JSON API at `/api/` (HTTP transports only), behind "
                      "the same token or the cookie of the one-time login link the server prints."}),
      }),

      table("computer", &Config::computer, {
          value("expose_lifecycle_tools", &Computer::expose_lifecycle_tools, boolean(), {
              .defaults_to = "true",
              .help = "`ns-hpc computer` offers the model computer_list, computer_create, computer_restart, "
                      "computer_factory_reset, computer_delete, set_network_access and set_desktop_environment; "
                      "false keeps to "
                      "mcp-virtual-computer 0.2.3's terminal_execute and file tools, with expose_port and the job "
                      "tools."}),
      }),

      table("desktop", &Config::desktop, {
          value("image", &Desktop::image, text({"an image name"}), {
              .defaults_to = R"("debian-desktop")",
              .help = "The image a desktop computer is made on (`ns-hpc image build NAME --desktop`; "
                      "`doctor --fix --desktop` builds it). Only instances on an image built with --desktop "
                      "can switch their desktop on."}),
          value("width", &Desktop::width, integer({320, 7680, "pixels (320 to 7680)"}), {
              .defaults_to = "1280",
              .help = "Screen width of a desktop. Screenshots above 1568 pixels on a side or 1568 tiles of 28x28 "
                      "are scaled down for the model, and the scale is stated."}),
          value("height", &Desktop::height, integer({200, 4320, "pixels (200 to 4320)"}), {
              .defaults_to = "800", .help = "Screen height of a desktop."}),
          value("host_root", &Desktop::host_root, boolean(), {
              .defaults_to = "false",
              .help = "Instances on the host's root may switch a desktop on, run from the host's packages "
                      "(Xvfb, Xfce, AT-SPI: `make deps` installs them). Off: only desktop images can."}),
      }),

      named("proxied_mcps", &Config::proxied_mcps, kMcpNames, {
          value("command", &ProxiedMcp::command, program(), {
              .help = "The program to run.", .required = "give the program to run (a non-empty string)"}),
          value("args", &ProxiedMcp::args, strings(), {.defaults_to = "[]", .help = "Its arguments."}),
          value("env", &ProxiedMcp::env, variables({.reserve_path_and_home = false}), {
              .defaults_to = "{}", .help = "Variables set for it."}),
          value("include", &ProxiedMcp::include, strings(), {
              .defaults_to = "[]", .help = "Globs of the tool names proxied (`[]`: all)."}),
          value("exclude", &ProxiedMcp::exclude, strings(), {
              .defaults_to = "[]", .help = "Globs of tool names not proxied."}),
          value("idle_timeout", &ProxiedMcp::idle_timeout, number({0, true, "seconds; 0 = never closed"}), {
              .defaults_to = "0.0", .help = "Seconds unused after which it is stopped."}),
      }, {.help = "MCP servers started inside an instance and proxied as `<name>__<tool>`.",
          .reserved = "proxied MCP servers are not there yet"}),

      named("host_commands", &Config::host_commands, kHostCommandNames, {
          value("command", &HostCommand::command, text({"a shell command", true}), {
              .help = "The shell command.", .required = "give the shell command to run (a non-empty string)"}),
          value("description", &HostCommand::description, text({"a description"}), {
              .defaults_to = R"("")", .help = "What it does, for the agent."}),
          value("timeout", &HostCommand::timeout, number({0, false, "seconds"}), {
              .defaults_to = "30.0", .help = "Seconds it may run."}),
      }, {.help = "Shell commands run on the host.", .reserved = "host commands are not there yet"}),
  }};
}

// ---- keys of the original's old schema ------------------------------------------------------

struct LegacyKey {
  std::string_view key;          // dotted; also matches the keys below it
  std::string_view replacement;  // what to use now
};

constexpr auto kLegacyKeys = std::to_array<LegacyKey>({
    {"instances_dir", "namespace.instances_dir"},
    {"namespace_defaults", "the [namespace] table"},
    {"namespace_defaults.bind_ro", "namespace.bwrap_command"},
    {"namespace_defaults.flags", "namespace.bwrap_command"},
    {"namespace_defaults.workspace_mount", "namespace.workspace_mount"},
    {"namespace_defaults.output_mount", "namespace.output_mount"},
    {"namespace_defaults.status_fd", "namespace.status_fd"},
    {"resource_defaults", "the [resource] table"},
    {"resource_defaults.context_dirs", "resource.context_dirs"},
    {"resource_defaults.resource_patterns", "resource.resource_patterns"},
    {"resources", "jobs.local.cgroups_command"},
    {"resources.use_systemd", "jobs.local.use_cgroups"},
    {"slurm", "the [jobs.slurm] table"},
    {"slurm.partition", "jobs.slurm.sbatch_command"},
    {"slurm.default_cpus", "jobs.slurm.limit.cpus.default"},
    {"slurm.default_memory_gb", "jobs.slurm.limit.memory.default (in MiB)"},
    {"slurm.default_timeout", "jobs.max_timeout"},
    {"slurm.resources", "jobs.slurm.limit"},
    {"job", "the [jobs] table"},
    {"job.proc_check", "jobs.local.proc_check"},
    {"resource_limits", "jobs.max_timeout"},
});

bool is_within(std::string_view key, std::string_view prefix) {
  return key.starts_with(prefix) && (key.size() == prefix.size() || key[prefix.size()] == '.');
}

}  // namespace

std::optional<std::string_view> legacy_replacement(std::string_view key) {
  std::optional<LegacyKey> best;  // the most specific legacy key that `key` is or is under
  for (const LegacyKey& legacy : kLegacyKeys) {
    if (is_within(key, legacy.key) && (!best || legacy.key.size() > best->key.size())) best = legacy;
  }
  if (!best) return std::nullopt;
  return best->replacement;
}

const Keys<Config>& config_keys() {
  static const Keys<Config> keys = make_config_keys();
  return keys;
}

const KeyDoc& config_doc() {
  static const KeyDoc doc{"", KeyKind::table, "a table", {}, docs_of(config_keys().keys)};
  return doc;
}

}  // namespace detail

}  // namespace nshpc::config
