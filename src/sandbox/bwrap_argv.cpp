#include "sandbox/bwrap_argv.hpp"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "base/error.hpp"
#include "sandbox/network.hpp"

namespace nshpc::sandbox {

namespace {

constexpr std::string_view kImagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

constexpr std::string_view kNoArg[] = {
    "--unshare-all", "--share-net",    "--unshare-user",   "--unshare-user-try", "--unshare-ipc",
    "--unshare-pid", "--unshare-net",  "--unshare-uts",    "--unshare-cgroup",   "--unshare-cgroup-try",
    "--disable-userns", "--assert-userns-disabled", "--clearenv", "--new-session",
    "--die-with-parent", "--as-pid-1", "--level-prefix"};
constexpr std::string_view kOneArg[] = {
    "--args",        "--userns",       "--userns2",   "--pidns",      "--uid",         "--gid",
    "--hostname",    "--chdir",        "--unsetenv",  "--lock-file",  "--sync-fd",     "--remount-ro",
    "--exec-label",  "--file-label",   "--proc",      "--dev",        "--tmpfs",       "--mqueue",
    "--dir",         "--seccomp",      "--add-seccomp-fd", "--block-fd", "--userns-block-fd",
    "--info-fd",     "--json-status-fd", "--cap-add", "--cap-drop",   "--perms",       "--size",
    "--overlay-src", "--tmp-overlay", "--ro-overlay"};
constexpr std::string_view kTwoArgs[] = {
    "--setenv",   "--bind",       "--bind-try",      "--dev-bind",   "--dev-bind-try",
    "--ro-bind",  "--ro-bind-try", "--bind-fd",      "--ro-bind-fd", "--file",
    "--bind-data", "--ro-bind-data", "--symlink",    "--chmod",      "--overlay"};

template <size_t N>
bool contains(const std::string_view (&list)[N], std::string_view s) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

bool is_bind(std::string_view opt) {
  return opt == "--bind" || opt == "--bind-try" || opt == "--ro-bind" || opt == "--ro-bind-try";
}

// "/bin" bound onto itself while /bin is a relative symlink such as "usr/bin" (Debian's merged
// /usr): bwrap would follow the link and make a real folder; a symlink reproduces the host.
std::optional<std::string> merged_usr_link(std::string_view src, std::string_view dest,
                                           const ArgvOptions& options) {
  if (src != dest || src.size() < 2 || src[0] != '/' || src.find('/', 1) != std::string_view::npos)
    return std::nullopt;
  if (!options.read_symlink) return std::nullopt;
  auto target = options.read_symlink(std::string(src));
  if (!target || target->empty() || (*target)[0] == '/') return std::nullopt;
  return target;
}

struct BaseScan {
  std::vector<std::string> args;  // without argv[0]
  bool has_proc = false;
  bool has_unshare_all = false;
};

// `tmp_bytes` sizes every --tmpfs of the base that has no --size of its own, and a /dev made by
// --dev gets a /dev/shm of that size (else it is a folder of the unlimited /dev tmpfs).
BaseScan scan_base(const std::vector<std::string>& base, const ArgvOptions& options, std::uint64_t tmp_bytes) {
  BaseScan scan;
  bool sized = false;  // the previous option was --size
  for (size_t i = 1; i < base.size(); ++i) {
    const std::string& opt = base[i];
    if (opt == "--")
      throw Error("namespace.bwrap_command must not contain '--': ns-hpc appends the command itself");
    auto arity = bwrap_option_arity(opt);
    if (!arity)
      throw Error(fmt::format(
          "namespace.bwrap_command: '{}' is not a bwrap option ns-hpc knows; check the spelling "
          "(see 'bwrap --help')",
          opt));
    if (i + static_cast<size_t>(*arity) >= base.size())
      throw Error(fmt::format("namespace.bwrap_command: '{}' needs {} argument(s)", opt, *arity));
    if (opt == "--share-net" || opt == "--unshare-net") continue;  // the instance decides
    if (opt == "--proc") scan.has_proc = true;
    if (opt == "--unshare-all") scan.has_unshare_all = true;
    if (is_bind(opt)) {
      if (auto link = merged_usr_link(base[i + 1], base[i + 2], options)) {
        scan.args.insert(scan.args.end(), {"--symlink", *link, base[i + 2]});
        i += 2;
        continue;
      }
    }
    if (opt == "--tmpfs" && !sized && tmp_bytes > 0) scan.args.insert(scan.args.end(), {"--size", std::to_string(tmp_bytes)});
    sized = opt == "--size";
    scan.args.push_back(opt);
    for (int k = 0; k < *arity; ++k) scan.args.push_back(base[++i]);
    if (opt == "--dev" && tmp_bytes > 0)
      scan.args.insert(scan.args.end(), {"--size", std::to_string(tmp_bytes), "--tmpfs", base[i] + "/shm"});
  }
  return scan;
}

}  // namespace

std::optional<std::string> shell_script_of(const std::vector<std::string>& argv) {
  if (argv.size() != 3 || argv[1] != "-c") return std::nullopt;
  if (argv[0] != "/bin/sh" && argv[0] != "/bin/bash") return std::nullopt;
  return argv[2];
}

void check_command(const std::vector<std::string>& argv, std::string_view cwd) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (argv[i].find('\0') != std::string::npos)
      throw UsageError(fmt::format("argument {} of the command contains a NUL byte, which no program can receive; "
                                   "remove it (pass binary data through stdin or a file)",
                                   i + 1));
  }
  if (cwd.find('\0') != std::string_view::npos)
    throw UsageError("the working directory contains a NUL byte; give a plain absolute path");
}

std::optional<int> bwrap_option_arity(std::string_view option) {
  if (contains(kNoArg, option)) return 0;
  if (contains(kOneArg, option)) return 1;
  if (contains(kTwoArgs, option)) return 2;
  return std::nullopt;
}

std::uint64_t image_capability_mask() {
  static constexpr std::pair<std::string_view, int> kNumbers[] = {
      {"CAP_CHOWN", 0},   {"CAP_DAC_OVERRIDE", 1}, {"CAP_FOWNER", 3},           {"CAP_FSETID", 4},
      {"CAP_KILL", 5},    {"CAP_SETGID", 6},       {"CAP_SETUID", 7},           {"CAP_SETPCAP", 8},
      {"CAP_NET_BIND_SERVICE", 10}, {"CAP_SYS_CHROOT", 18}, {"CAP_MKNOD", 27}, {"CAP_AUDIT_WRITE", 29},
      {"CAP_SETFCAP", 31}};
  std::uint64_t mask = 0;
  for (std::string_view name : kImageCapabilities)
    for (const auto& [known, number] : kNumbers)
      if (known == name) mask |= std::uint64_t{1} << number;
  return mask;
}

namespace {

// An image instance's sandbox: bwrap already runs as uid 0 of the instance's user namespace
// (its starter made it, sandbox/layers.hpp), on the instance's root. No user namespace of its
// own; the capabilities of kImageCapabilities, inside only.
std::vector<std::string> image_bwrap_argv(const config::Namespace& ns, const RunSpec& spec, const FdNumbers& fds,
                                          const ArgvOptions& options) {
  const std::string tmp = std::to_string(static_cast<std::uint64_t>(ns.tmp_size) * 1024 * 1024);
  std::vector<std::string> argv{options.bwrap_path,
                                "--bind-fd", std::to_string(fds.root), "/",
                                "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
                                "--dev", "/dev", "--perms", "1777", "--size", tmp, "--tmpfs", "/dev/shm",
                                "--perms", "1777", "--size", tmp, "--tmpfs", "/tmp",
                                "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
                                "--hostname", spec.target.instance_id, "--cap-drop", "ALL"};
  for (std::string_view cap : kImageCapabilities) argv.insert(argv.end(), {"--cap-add", std::string(cap)});
  if (!spec.terminal) argv.push_back("--new-session");
  if (spec.target.network != config::Network::host) argv.push_back("--unshare-net");
  return argv;
}

std::vector<std::string> host_root_bwrap_argv(const config::Namespace& ns, const RunSpec& spec, const ArgvOptions& options) {
  BaseScan base = scan_base(ns.bwrap_command, options, static_cast<std::uint64_t>(ns.tmp_size) * 1024 * 1024);

  std::vector<std::string> argv{options.bwrap_path};
  argv.insert(argv.end(), base.args.begin(), base.args.end());

  const bool unshare_all = base.has_unshare_all || ns.hardening;
  if (ns.hardening) {
    argv.insert(argv.end(), {"--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop",
                             "ALL", "--hostname", spec.target.instance_id});
    if (!spec.terminal) argv.push_back("--new-session");
    // Sysctls stay read-only even for a sandbox whose uid maps to a privileged host uid.
    if (base.has_proc) argv.insert(argv.end(), {"--ro-bind", "/proc/sys", "/proc/sys"});
  }
  if (spec.target.network != config::Network::host && !spec.network_joined)
    argv.push_back("--unshare-net");
  else if (unshare_all)
    argv.push_back("--share-net");
  return argv;
}

std::vector<std::string> finish_bwrap_argv(std::vector<std::string> argv, const config::Namespace& ns,
                                           const RunSpec& spec, const FdNumbers& fds) {
  if (spec.die_with_caller) argv.push_back("--die-with-parent");
  if (spec.living_main) argv.push_back("--as-pid-1");

  argv.insert(argv.end(), {"--bind-fd", std::to_string(fds.workspace), ns.workspace_mount});
  argv.insert(argv.end(), {"--bind-fd", std::to_string(fds.output), ns.output_mount});
  if (fds.shared_output >= 0)
    argv.insert(argv.end(), {"--ro-bind-fd", std::to_string(fds.shared_output), ns.shared_output_mount});
  if (fds.seccomp >= 0) argv.insert(argv.end(), {"--seccomp", std::to_string(fds.seccomp)});
  argv.insert(argv.end(), {"--json-status-fd", std::to_string(fds.status)});
  argv.insert(argv.end(), {"--chdir", spec.cwd.empty() ? ns.workspace_mount : spec.cwd});
  argv.push_back("--");
  if (fds.script >= 0 && shell_script_of(spec.argv)) {
    // The shell reads the command from the descriptor: `sh -c '. /dev/fd/N'` runs it in the
    // same shell, as -c would ($0, exit, the exit status as before).
    argv.insert(argv.end(), {spec.argv[0], "-c", fmt::format(". /dev/fd/{}", fds.script)});
  } else {
    argv.insert(argv.end(), spec.argv.begin(), spec.argv.end());
  }
  return argv;
}


}  // namespace

std::vector<std::string> build_bwrap_argv(const config::Namespace& ns, const RunSpec& spec,
                                          const FdNumbers& fds, const ArgvOptions& options) {
  if (ns.bwrap_command.empty()) throw Error("namespace.bwrap_command is empty");
  if (spec.argv.empty()) throw UsageError("no command given to run in the sandbox");
  check_command(spec.argv, spec.cwd);
  std::vector<std::string> argv;
  if (spec.target.image) {
    if (fds.root < 0) throw Error("an image instance's sandbox needs its root (FdNumbers::root)");
    argv = image_bwrap_argv(ns, spec, fds, options);
  } else {
    argv = host_root_bwrap_argv(ns, spec, options);
  }
  return finish_bwrap_argv(std::move(argv), ns, spec, fds);
}

std::vector<std::string> build_sandbox_env(
    const config::Namespace& ns, const RunSpec& spec,
    const std::function<std::optional<std::string>(std::string_view)>& host_env) {
  std::vector<std::pair<std::string, std::string>> vars;
  auto set = [&vars](const std::string& name, const std::string& value) {
    for (auto& [n, v] : vars) {
      if (n == name) {
        v = value;
        return;
      }
    }
    vars.emplace_back(name, value);
  };
  // An image instance's commands run as its root: the system folders on PATH, and apt never
  // waits for an answer no one can give.
  set("PATH", spec.target.image ? std::string(kImagePath) : ns.path);
  set("HOME", ns.workspace_mount);
  if (spec.target.image) set("DEBIAN_FRONTEND", "noninteractive");
  set("LANG", "C.UTF-8");
  set("TERM", host_env("TERM").value_or("dumb"));
  set("NS_HPC_INSTANCE", spec.target.instance_id);
  if (spec.target.network == config::Network::filtered) {
    // The allow-list proxy, listening on the sandbox's own loopback (sandbox/network.hpp); a
    // program that ignores these has no route out at all.
    const std::string proxy = fmt::format("http://127.0.0.1:{}", kProxyPort);
    for (const char* name : {"http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"})
      set(name, proxy);
    set("no_proxy", "localhost,127.0.0.1,::1");
    set("NO_PROXY", "localhost,127.0.0.1,::1");
  }
  for (const auto& [name, value] : spec.target.env) set(name, value);
  for (const auto& [name, value] : ns.env) set(name, value);
  for (const auto& name : ns.pass_env) {
    if (auto value = host_env(name)) set(name, *value);
  }
  for (const auto& [name, value] : spec.env) {
    if (name.empty() || name.find('=') != std::string::npos || name.find('\0') != std::string::npos)
      throw UsageError(fmt::format("invalid environment variable name '{}'", name));
    if (value.find('\0') != std::string::npos)
      throw UsageError(fmt::format("environment variable {} contains a NUL byte", name));
    set(name, value);
  }
  std::vector<std::string> env;
  env.reserve(vars.size());
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

}  // namespace nshpc::sandbox
