// ns-hpc doctor: each prerequisite checked for real, with a fix hint; Slurm and cgroups optional.
#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sys/vfs.h>

#include <map>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/safe_path.hpp"
#include "base/text.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "network/netns.hpp"
#include "cli/output.hpp"
#include "desktop/session.hpp"
#include "sandbox/capture.hpp"
#include "sandbox/cgroups.hpp"
#include "sandbox/images.hpp"
#include "sandbox/layers.hpp"
#include "sandbox/seccomp.hpp"

namespace nshpc::cli {

namespace {

namespace stdfs = std::filesystem;

struct Check {
  std::string name;
  bool ok = false;
  bool required = true;
  std::string detail;
  std::string fix;
};

// Runs `body` in a forked child; its return value is the child's exit code.
template <typename F>
int in_child(F body) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) ::_exit(body());
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Sandboxes that no record names (an instance deleted, archived or removed behind a running
// sandbox's back) and the network helpers of instances whose folder is gone are ended here, as at
// every server start.
Check check_living(Invocation& inv) {
  Check c{"no stray sandboxes or network helpers", true, false};
  try {
    const std::vector<std::string> ended = inv.instances().end_strays();
    c.detail = ended.empty() ? "every running sandbox and network helper belongs to an instance"
                             : fmt::format("{}", fmt::join(ended, "; "));
    c.detail += inv.instances().commands_share_pids()
                    ? "; commands of a living instance share its pid namespace (cgroup v2 kill)"
                    : "; each command of a living instance has a pid namespace of its own (no cgroup kill here)";
  } catch (const std::exception& e) {
    c.ok = false;
    c.detail = e.what();
  }
  return c;
}

Check check_config(Invocation& inv, const config::Config*& cfg, std::optional<config::Config>& fallback) {
  Check c{"config is valid"};
  try {
    cfg = &inv.config();
    c.ok = true;
    c.detail = cfg->sources.empty() ? "defaults only" : "";
    for (const auto& s : cfg->sources) c.detail += (c.detail.empty() ? "" : ", ") + s.string();
    if (!inv.config_warnings().empty())
      c.detail += fmt::format(" ({} warning(s) above)", inv.config_warnings().size());
  } catch (const config::ConfigError& e) {
    c.detail = e.what();
    c.fix = "correct the lines named above ('ns-hpc config check FILE' re-checks one file)";
    fallback = config::built_in();
    cfg = &*fallback;
  }
  return c;
}

Check check_bwrap(const config::Config& cfg) {
  Check c{"bwrap found"};
  const std::string& program = cfg.ns.bwrap_command.at(0);
  auto path = fs::find_program(program);
  if (!path) {
    c.detail = fmt::format("'{}' is not on PATH", program);
    c.fix = "install bubblewrap: apt-get install bubblewrap (0.8 or newer)";
    return c;
  }
  const CommandResult version = run_command({*path, "--version"}, {}, std::chrono::seconds(10));
  const int rc = version.exit_code;
  const std::string out(text::trim(version.out + version.err));
  int major = 0, minor = 0, patch = 0;
  std::sscanf(out.c_str(), "bubblewrap %d.%d.%d", &major, &minor, &patch);
  c.detail = fmt::format("{} ({})", *path, out.empty() ? "no version" : out);
  c.ok = rc == 0 && (major > 0 || minor >= 8);
  if (!c.ok) c.fix = "ns-hpc needs bubblewrap 0.8 or newer (--disable-userns, --bind-fd)";
  return c;
}

Check check_userns(const config::Config& cfg) {
  Check c{"user namespaces"};
  auto max = fs::read_file("/proc/sys/user/max_user_namespaces");
  std::string value = max ? std::string(text::trim(*max)) : "?";
  const auto owner = users::sandbox_owner(cfg.ns.sandbox_uid, cfg.ns.sandbox_gid);
  int rc = in_child([&] {
    if (owner && (::setgroups(0, nullptr) < 0 || ::setresgid(owner->gid, owner->gid, owner->gid) < 0 ||
                  ::setresuid(owner->uid, owner->uid, owner->uid) < 0))
      return 2;
    return ::unshare(CLONE_NEWUSER) == 0 ? 0 : 1;
  });
  c.ok = rc == 0;
  c.detail = fmt::format("max_user_namespaces={}; unprivileged unshare(CLONE_NEWUSER) {}", value,
                         c.ok ? "works" : "fails");
  if (!c.ok)
    c.fix = "enable user namespaces: sysctl -w user.max_user_namespaces=15000 (and "
            "kernel.unprivileged_userns_clone=1 where that sysctl exists)";
  return c;
}

Check check_seccomp() {
  Check c{"seccomp filter loads"};
  try {
    std::string bpf = sandbox::build_seccomp_bpf();
    int rc = in_child([] {
      try {
        if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return 2;
        sandbox::load_seccomp_filter_into_self();
      } catch (...) {
        return 3;
      }
      errno = 0;
      bool ptrace_blocked = ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) < 0 && errno == EPERM;
      bool unshare_blocked = ::unshare(CLONE_NEWUSER) < 0 && errno == EPERM;
      return ptrace_blocked && unshare_blocked ? 0 : 4;
    });
    c.ok = rc == 0;
    c.detail = fmt::format("{} BPF instructions; in a test process ptrace and unshare {}", bpf.size() / 8,
                           c.ok ? "were refused" : fmt::format("were not refused (code {})", rc));
    if (!c.ok) c.fix = "the kernel must support seccomp filters (CONFIG_SECCOMP_FILTER)";
  } catch (const std::exception& e) {
    c.detail = e.what();
    c.fix = "install libseccomp2";
  }
  return c;
}

Check check_sandbox_user(const config::Config& cfg) {
  Check c{"sandbox identity"};
  if (auto owner = users::sandbox_owner(cfg.ns.sandbox_uid, cfg.ns.sandbox_gid)) {
    c.ok = true;
    c.detail = fmt::format("root: bwrap drops to uid {} gid {} (namespace.sandbox_uid/gid)", owner->uid,
                           owner->gid);
  } else if (::geteuid() != 0) {
    c.ok = true;
    c.detail = fmt::format("not root: bwrap runs as your uid {}", ::getuid());
  } else {
    c.detail = "running as root with namespace.sandbox_uid = 0: sandboxes would map to host root";
    c.fix = "set namespace.sandbox_uid (and sandbox_gid) to an unprivileged uid, e.g. 65534";
  }
  return c;
}

constexpr std::chrono::seconds kSmokeTimeout{30};
constexpr std::size_t kSmokeOutputCap = 4096;

Check check_smoke(Invocation& inv, const config::Config& cfg) {
  Check c{"sandbox smoke run (configured bwrap_command)"};
  stdfs::path tmp;
  try {
    // A throw-away instance-like folder inside the real instances dir, so the smoke run also
    // proves the sandbox uid can reach workspaces there.
    fs::make_dirs(cfg.ns.instances_dir, 0755);
    std::string tmpl = (cfg.ns.instances_dir / ".doctor-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw SysError(errno, "mkdtemp", tmpl);
    tmp = tmpl;
    ::chmod(tmp.c_str(), 0711);
    for (const char* dir : {"workspace", "output"}) {
      stdfs::path p = tmp / dir;
      check_sys(::mkdir(p.c_str(), 0700), "mkdir", p.string());
      if (auto owner = users::sandbox_owner(cfg.ns.sandbox_uid, cfg.ns.sandbox_gid))
        check_sys(::chown(p.c_str(), owner->uid, owner->gid), "chown", p.string());
    }
    sandbox::ExecSpec spec;
    spec.target.instance_id = "doctor";
    spec.target.workspace = tmp / "workspace";
    spec.target.output = tmp / "output";
    spec.target.shared_output_root = tmp;
    // The sandbox itself, not its network (a mode of its own needs an instance to serve it).
    spec.target.network = config::resolve_default_network(cfg.ns.default_network, cfg.ns.bwrap_shares_net, true) ==
                                  config::Network::host
                              ? config::Network::host
                              : config::Network::off;
    spec.argv = {"/bin/sh", "-c",
                 "echo ok > \"$HOME/smoke\" && echo ok > \"" + cfg.ns.output_mount + "/smoke\" && "
                 "grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status && exit 7"};
    // A sandbox that hangs (a stuck mount, a bwrap waiting on something) fails the check instead
    // of hanging doctor; what it says is kept, up to a page.
    sandbox::CaptureOptions options;
    options.timeout = kSmokeTimeout;
    options.output_cap = kSmokeOutputCap;
    const sandbox::CaptureResult run = sandbox::capture(inv.instances().backend(), std::move(spec), options);
    const sandbox::ExitStatus& st = run.status;
    const std::string messages = run.out + run.err;
    // Written by the sandbox: read beneath the folder, never through a link or from a FIFO.
    auto sandbox_wrote = [](const stdfs::path& dir) {
      UniqueFd folder = fs::open_dir_path(dir);
      UniqueFd file = fs::open_untrusted_file(folder.get(), "smoke", {.single_link = true});
      char buf[8] = {};
      return file && ::read(file.get(), buf, sizeof buf) == 3 && std::string_view(buf, 3) == "ok\n";
    };
    const bool wrote = sandbox_wrote(tmp / "workspace") && sandbox_wrote(tmp / "output");
    c.ok = st.started && st.exit_code == 7 && wrote;
    if (c.ok) {
      c.detail = "ran a command with no capabilities; workspace and output writable";
    } else {
      c.detail = run.ending == sandbox::Ending::timed_out
                     ? fmt::format("the smoke run did not end within {} s; it was killed", kSmokeTimeout.count())
                 : st.started ? fmt::format("command exited {}{}", st.exit_code,
                                            wrote ? "" : "; workspace/output not writable")
                              : st.error;
      if (!messages.empty()) c.detail += fmt::format(": {}", text::trim(messages));
      c.fix = "check namespace.bwrap_command and namespace.sandbox_uid; try: ns-hpc bwrap ID -- true";
    }
  } catch (const std::exception& e) {
    c.detail = e.what();
    c.fix = "check namespace.bwrap_command (ns-hpc config show)";
  }
  if (!tmp.empty()) {
    try {
      fs::remove_tree(tmp);
    } catch (...) {
    }
  }
  return c;
}

Check check_instances_dir(const config::Config& cfg) {
  Check c{"instances dir writable"};
  const stdfs::path dir = cfg.ns.instances_dir;
  try {
    fs::make_dirs(dir, 0755);
    const stdfs::path probe = dir / fmt::format(".doctor-{}", ::getpid());
    fs::atomic_write(probe, "ok\n", 0600);
    ::unlink(probe.c_str());
    c.ok = true;
    c.detail = dir.string();
  } catch (const std::exception& e) {
    c.detail = e.what();
    c.fix = "set namespace.instances_dir to a folder you can write";
  }
  return c;
}

// What the job engine can enforce here: the cgroups module really creates a test group in each
// hierarchy (v1 controllers and the v2 tree) and removes it.
Check check_cgroups() {
  Check c{"cgroups for job limits (memory, cpu, pids, whole-tree kill)"};
  c.required = false;
  const sandbox::CgroupSupport support = sandbox::probe_cgroups();
  std::vector<std::string> missing;
  if (!support.memory) missing.emplace_back("memory");
  if (!support.cpu) missing.emplace_back("cpu");
  if (!support.pids) missing.emplace_back("pids");
  if (!support.kill) missing.emplace_back("kill");
  c.ok = missing.empty();
  c.detail = support.detail;
  if (!c.ok)
    c.fix = fmt::format("{} cannot be enforced: jobs run anyway and list it under 'unenforced'; run as root or "
                        "delegate a cgroup subtree to this user",
                        fmt::join(missing, ", "));
  return c;
}

Check check_slurm() {
  Check c{"Slurm tools"};
  c.required = false;
  std::vector<std::string> found, missing;
  for (const char* tool : {"sbatch", "squeue", "sacct", "scancel"})
    (fs::find_program(tool) ? found : missing).emplace_back(tool);
  c.ok = missing.empty();
  c.detail = c.ok ? fmt::format("{} on PATH", fmt::join(found, ", "))
                  : fmt::format("missing {} (needed only for Slurm jobs)", fmt::join(missing, ", "));
  if (!c.ok) c.fix = "install slurm-client, or ignore this on a machine without Slurm";
  return c;
}

// The controller answers: squeue asked for the caller's own jobs (a read that needs slurmctld and
// nothing else). Without it, submit_job in mode "slurm" fails.
Check check_slurm_controller(const config::Config& cfg) {
  Check c{"Slurm controller answers"};
  c.required = false;
  std::vector<std::string> argv = cfg.jobs.slurm.squeue_command;
  if (argv.empty()) argv = {"squeue"};
  argv.insert(argv.end(), {"--noheader", "--format=%i", "--me"});
  try {
    const CommandResult r = run_command(argv, {}, std::chrono::seconds(20));
    c.ok = r.exit_code == 0 && !r.timed_out;
    std::string said(text::trim(r.err));
    c.detail = c.ok ? fmt::format("{} answered", argv.front())
                    : r.timed_out ? fmt::format("{} did not answer within 20 s", argv.front())
                                  : fmt::format("{} failed: {}", argv.front(), said.substr(0, 300));
  } catch (const std::exception& e) {
    c.ok = false;
    c.detail = e.what();
  }
  if (!c.ok)
    c.fix = "start slurmctld (and munge), or check SlurmctldHost in slurm.conf; Slurm jobs fail until it answers";
  return c;
}

// Batch jobs run `ns-hpc bwrap` on a compute node: the node must see this binary and the
// instances folder at the same paths. A network filesystem is a good sign; a local one works
// only when the cluster is this machine.
Check check_slurm_shared(const config::Config& cfg) {
  Check c{"Slurm jobs can reach ns-hpc and the instances (shared filesystem)"};
  c.required = false;
  static const std::map<long, std::string> kShared = {
      {0x6969, "nfs"},          {0x0BD00BD0, "lustre"},  {0x47504653, "gpfs"},  {0x19830326, "beegfs"},
      {0x00C36400, "cephfs"},   {static_cast<long>(0xFF534D42), "cifs"}, {static_cast<long>(0xFE534D42), "smb2"},
      {0x013111A8, "ibrix"},    {0x5346414F, "afs"},     {0x65735546, "fuse"}};
  std::vector<std::string> local, shared;
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  for (const auto& [what, path] : {std::pair<std::string, std::string>{"ns-hpc", self},
                                   {"instances", cfg.ns.instances_dir.string()}}) {
    struct statfs st {};
    std::string p = path;
    while (::statfs(p.c_str(), &st) != 0 && p.size() > 1) p = std::filesystem::path(p).parent_path().string();
    auto it = kShared.find(static_cast<long>(st.f_type));
    (it != kShared.end() ? shared : local).push_back(fmt::format("{} on {}", what, it != kShared.end() ? it->second : fmt::format("a local filesystem (type {:#x})", static_cast<unsigned long>(st.f_type))));
  }
  c.ok = local.empty();
  c.detail = fmt::format("{}", fmt::join(local.empty() ? shared : local, "; "));
  if (!c.ok)
    c.fix = "fine when the Slurm cluster is this machine; otherwise put ns-hpc and [namespace] instances_dir on the "
            "cluster's shared filesystem (or set [jobs.slurm] ns_hpc_command to the path the nodes see)";
  return c;
}

// Which network modes work here (sandbox/network.hpp): off and filtered need only a network
// namespace; nat needs pasta and /dev/net/tun; host always works (the weakest).
Check check_network_modes(const config::Config& cfg) {
  Check c{"network modes"};
  c.required = false;
  const config::Network chosen =
      config::resolve_default_network(cfg.ns.default_network, cfg.ns.bwrap_shares_net, !network::nat_unavailable());
  const std::string fallback =
      cfg.ns.default_network == config::DefaultNetwork::automatic
          ? fmt::format("new instances get '{}': [namespace] default_network = \"auto\"{}", config::to_string(chosen),
                        cfg.ns.bwrap_shares_net ? ", and your bwrap_command has --share-net" : "")
          : fmt::format("new instances get '{}': [namespace] default_network", config::to_string(chosen));
  if (auto why = network::nat_unavailable()) {
    c.detail = fmt::format("off, filtered and host work; nat does not: {} ({})", *why, fallback);
    c.fix = "use network 'filtered' (an allow list: [network] allow) or 'off'";
    if (fs::find_program("pasta") == std::nullopt) c.fix = "apt-get install passt (for nat), or use 'filtered' or 'off'";
    return c;
  }
  c.ok = true;
  c.detail = fmt::format("off, nat, filtered and host work (nat: pasta; filtered: {} allow-list entries) ({})",
                         cfg.network.allow.size(), fallback);
  return c;
}

// search_files runs ripgrep inside the sandbox (from the host's /usr).
Check check_search() {
  Check c{"file search (ripgrep)"};
  c.required = false;
  if (const auto rg = fs::find_program("rg")) {
    c.ok = true;
    c.detail = fmt::format("{}: search_files works", *rg);
  } else {
    c.detail = "rg is not installed: search_files fails until it is";
    c.fix = "apt-get install ripgrep";
  }
  return c;
}

// `ns-hpc image build`: mmdebstrap, and how a build runs for this user (sandbox/images.hpp).
Check check_image_builds() {
  Check c{"image builds (mmdebstrap)"};
  c.required = false;
  const auto mmdebstrap = fs::find_program("mmdebstrap");
  if (!mmdebstrap) {
    c.detail = "mmdebstrap is not installed";
    c.fix = "apt-get install mmdebstrap uidmap fakechroot fakeroot dpkg-dev";
    return c;
  }
  try {
    const sandbox::ImageBuildMethod method = sandbox::image_build_method();
    const std::vector<std::string> tools =
        method.owners == sandbox::ImageOwners::subordinate ? std::vector<std::string>{"newuidmap", "newgidmap", "unshare"}
        : method.owners == sandbox::ImageOwners::user      ? std::vector<std::string>{"fakechroot", "fakeroot"}
                                                           : std::vector<std::string>{};
    for (const auto& tool : tools)
      if (!fs::find_program(tool)) {
        c.detail = fmt::format("{}; {} is not installed", sandbox::describe_build_method(method), tool);
        c.fix = fmt::format("ask an administrator: apt-get install {}",
                            tool == "unshare" ? "util-linux" : tool.starts_with("new") ? "uidmap" : tool);
        return c;
      }
    c.ok = true;
    c.detail = fmt::format("{}: {}", *mmdebstrap, sandbox::describe_build_method(method));
  } catch (const UsageError& e) {  // a range in only one of /etc/subuid and /etc/subgid
    c.detail = fmt::format("{}: a normal user's build cannot map its ids", *mmdebstrap);
    c.fix = e.what();
  }
  return c;
}

// A writable layer over an image, tried for real (sandbox/layers.hpp).
Check check_image_layers(const config::Config& cfg) {
  Check c{"image roots (a writable layer over a shared image)"};
  c.required = false;
  std::error_code ec;
  stdfs::create_directories(cfg.ns.images_dir, ec);
  const sandbox::LayerSupport support = sandbox::probe_layers(cfg.ns.images_dir);
  c.ok = support.ok;
  c.detail = support.detail;
  c.fix = support.fix;
  return c;
}

// The image `--image` without a name and the mcp-virtual-computer entry point use; with --fix
// built now when it is missing (a minute or two, from the mirror the host's apt uses).
Check check_default_image(const config::Config& cfg, bool fix, bool background) {
  Check c{"default image ([namespace] default_image)"};
  c.required = false;
  const std::string& name = cfg.ns.default_image;
  if (name.empty()) {
    c.ok = true;
    c.detail = "none configured";
    return c;
  }
  try {
    const sandbox::ImageStore images(cfg.ns.images_dir);
    if (auto v = images.current(name)) {
      c.ok = true;
      c.detail = fmt::format("'{}' version {} in {}", name, v->version, cfg.ns.images_dir.string());
      return c;
    }
    if (auto b = images.building(name)) {
      c.detail = fmt::format("'{}' is being built now (pid {}; now: {})", name, b->pid, b->line);
      c.fix = "wait a minute or two: 'ns-hpc image list' shows how far it is";
      return c;
    }
    if (fix && background) {
      // As the server does at its first tool call: the build goes on after this process ends.
      sandbox::BackgroundBuilds builds(images, config::self_command(cfg, "for a background image build"));
      const sandbox::BuildProgress progress = builds.start({.name = name, .only_if_missing = true});
      c.detail = fmt::format("'{}' is being built in the background now (pid {}; log: {}/.building/{}.log)", name,
                             progress.pid, cfg.ns.images_dir.string(), name);
      c.fix = "wait a minute or two: 'ns-hpc image list' shows how far it is";
      return c;
    }
    if (fix) {
      const sandbox::ImageVersion v = build_image(images, {.name = name, .only_if_missing = true});
      c.ok = true;
      c.detail = fmt::format("'{}' version {} built now in {}", name, v.version, cfg.ns.images_dir.string());
      return c;
    }
    c.detail = fmt::format("'{}' is not built yet (the server builds it in the background from its first tool call on)", name);
    c.fix = fmt::format("ns-hpc doctor --fix, or ns-hpc image build {} (a minute or two, from the mirror the host's apt "
                        "uses)", name);
  } catch (const std::exception& e) {
    c.detail = fmt::format("'{}': {}", name, e.what());
    c.fix = "see 'ns-hpc image build --help'";
  }
  return c;
}

// The image desktop computers are made on ([desktop] image, an image built with --desktop); with
// --fix --desktop built now when it is missing or has no desktop (a minute or two, about 1 GB).
Check check_desktop_image(const config::Config& cfg, bool fix) {
  Check c{"desktop image ([desktop] image)"};
  c.required = false;
  const std::string& name = cfg.desktop.image;
  const std::string build_line = fmt::format("ns-hpc doctor --fix --desktop, or ns-hpc image build {} --desktop "
                                             "(a minute or two and about 1 GB, from the mirror the host's apt uses)",
                                             name);
  try {
    const sandbox::ImageStore images(cfg.ns.images_dir);
    const auto current = images.current(name);
    if (current && current->desktop) {
      c.ok = true;
      c.detail = fmt::format("'{}' version {} in {}", name, current->version, cfg.ns.images_dir.string());
      return c;
    }
    if (auto b = images.building(name)) {
      c.detail = fmt::format("'{}' is being built now (pid {}; now: {})", name, b->pid, b->line);
      c.fix = "wait a minute or two: 'ns-hpc image list' shows how far it is";
      return c;
    }
    if (fix) {
      // A current version without the desktop gets a new one with it (its instances keep theirs).
      const sandbox::ImageVersion v =
          build_image(images, {.name = name, .only_if_missing = !current, .desktop = true});
      c.ok = v.desktop;
      c.detail = fmt::format("'{}' version {} built now in {}", name, v.version, cfg.ns.images_dir.string());
      return c;
    }
    c.detail = current ? fmt::format("'{}' version {} was built without --desktop", name, current->version)
                       : fmt::format("'{}' is not built yet (desktops on images need it)", name);
    c.fix = build_line;
  } catch (const std::exception& e) {
    c.detail = fmt::format("'{}': {}", name, e.what());
    c.fix = "see 'ns-hpc image build --help'";
  }
  return c;
}

// A desktop on the host's root ([desktop] host_root) runs the host's programs: those the session
// starts, found on the sandbox's PATH, and pyatspi for the accessibility tree.
Check check_desktop_host(const config::Config& cfg) {
  Check c{"desktop programs on the host ([desktop] host_root)"};
  c.required = false;
  std::vector<std::string> missing;
  auto on_sandbox_path = [&](const std::string& program) -> std::optional<std::string> {
    if (program.find('/') != std::string::npos) return fs::find_program(program);
    for (const std::string_view dir : text::split(cfg.ns.path, ':')) {
      const std::string candidate = fmt::format("{}/{}", dir, program);
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return std::nullopt;
  };
  for (const std::string& program : desktop::required_programs())
    if (!on_sandbox_path(program)) missing.push_back(program);
  bool atspi = false;
  if (const auto python = on_sandbox_path("python3")) {
    try {
      atspi = run_command({*python, "-c", "import gi; gi.require_version('Atspi', '2.0'); import pyatspi"}, {},
                          std::chrono::seconds(20))
                  .exit_code == 0;
    } catch (const std::exception& e) {
      log::debug("python3 could not be run: {}", e.what());
    }
  }
  if (!atspi) missing.emplace_back("python3's pyatspi");
  c.ok = missing.empty();
  const std::string setting = fmt::format("desktop.host_root = {}", cfg.desktop.host_root ? "true" : "false");
  if (c.ok) {
    c.detail = fmt::format("Xvfb, Xfce, the session bus and AT-SPI are installed ({})", setting);
    return c;
  }
  c.detail = fmt::format("missing {} ({}{})", fmt::join(missing, ", "), setting,
                         cfg.desktop.host_root ? ": desktops on the host's root fail to start" : "; needed only with it on");
  std::vector<std::string> packages = desktop::required_packages();
  packages.insert(packages.end(), {"python3-pyatspi", "python3-gi", "gir1.2-atspi-2.0"});
  c.fix = fmt::format("apt-get install {} (make deps installs them)", fmt::join(packages, " "));
  return c;
}

void print_text(const std::vector<Check>& checks, bool ok) {
  std::puts("ns-hpc doctor\n");
  for (const auto& c : checks) {
    std::string line = fmt::format("  {} {}", c.ok ? "✓" : "✗", c.name);
    if (!c.required && !c.ok) line += " (optional)";
    if (!c.detail.empty()) line += ": " + c.detail;
    std::puts(line.c_str());
    if (!c.ok && !c.fix.empty()) std::printf("      fix: %s\n", c.fix.c_str());
  }
  std::puts(ok ? "\nAll required checks passed." : "\nSome checks failed. See above for details.");
}

}  // namespace

// --fix: a state folder made 0700 (by a release before the one that makes it 0711) shuts the
// sandbox uid out of an instances folder inside it (as root, the default): it gets the search
// bit for others back. Returns what was done, or "".
std::string fix_state_dir(const config::Config& cfg) {
  const stdfs::path& state = cfg.server.state_dir;
  const std::string inside = cfg.ns.instances_dir.lexically_relative(state).string();
  if (inside.empty() || inside == "." || inside.starts_with("..")) return "";
  struct stat st{};
  if (::stat(state.c_str(), &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & S_IXOTH) != 0) return "";
  if (::chmod(state.c_str(), (st.st_mode & 07777) | S_IXOTH) != 0) return "";
  return fmt::format("{} (the state folder, holding the instances) can be passed through again (mode {:04o})",
                     state.string(), (st.st_mode & 07777) | S_IXOTH);
}

void add_doctor_command(CLI::App& app, Invocation& inv) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("doctor", "Check that this machine can run ns-hpc sandboxes");
  cmd->add_flag("--json", *json, "Print JSON");
  auto fix = std::make_shared<bool>(false);
  cmd->add_flag("--fix", *fix,
                "Fix what ns-hpc can itself: build the default image when it is missing; give a state folder that "
                "holds the instances the search bit back");
  auto fix_desktop = std::make_shared<bool>(false);
  cmd->add_flag("--desktop", *fix_desktop,
                "With --fix: also build the desktop image ([desktop] image, image build --desktop) when it is missing");
  auto background = std::make_shared<bool>(false);
  cmd->add_flag("--background", *background,
                "With --fix: start the default image's build in the background (as the server does) instead of "
                "waiting for it");
  cmd->callback([&inv, json, fix, fix_desktop, background] {
    std::vector<Check> checks;
    const config::Config* cfg = nullptr;
    std::optional<config::Config> fallback;
    checks.push_back(check_config(inv, cfg, fallback));
    checks.push_back(check_bwrap(*cfg));
    checks.push_back(check_userns(*cfg));
    checks.push_back(check_seccomp());
    checks.push_back(check_sandbox_user(*cfg));
    if (*fix)
      if (const std::string done = fix_state_dir(*cfg); !done.empty()) std::fprintf(stderr, "fixed: %s\n", done.c_str());
    if (checks[0].ok && checks[1].ok) {
      checks.push_back(check_smoke(inv, *cfg));
    } else {
      Check skipped{"sandbox smoke run (configured bwrap_command)"};
      skipped.detail = "skipped: needs a valid config and bwrap";
      checks.push_back(skipped);
    }
    checks.push_back(check_instances_dir(*cfg));
    checks.push_back(check_cgroups());
    checks.push_back(check_living(inv));
    checks.push_back(check_network_modes(*cfg));
    checks.push_back(check_search());
    checks.push_back(check_image_builds());
    checks.push_back(check_image_layers(*cfg));
    checks.push_back(check_default_image(*cfg, *fix, *background));
    checks.push_back(check_desktop_image(*cfg, *fix && *fix_desktop));
    checks.push_back(check_desktop_host(*cfg));
    checks.push_back(check_slurm());
    if (checks.back().ok) {
      checks.push_back(check_slurm_controller(*cfg));
      checks.push_back(check_slurm_shared(*cfg));
    }

    bool ok = true;
    for (const auto& c : checks) ok = ok && (c.ok || !c.required);
    if (*json) {
      nlohmann::json out = {{"ok", ok}, {"checks", nlohmann::json::array()}};
      for (const auto& c : checks)
        out["checks"].push_back({{"name", c.name}, {"ok", c.ok}, {"required", c.required},
                                 {"detail", c.detail}, {"fix", c.fix}});
      print_json(out);
    } else {
      print_text(checks, ok);
    }
    inv.exit_code = ok ? 0 : 1;
  });
}

}  // namespace nshpc::cli
