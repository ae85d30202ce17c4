// Building the bwrap command line (pure: no system calls beyond reading symlinks).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "sandbox/sandbox.hpp"

namespace nshpc::sandbox {

// Descriptor numbers as the bwrap process will see them.
struct FdNumbers {
  int status = -1;          // --json-status-fd
  int seccomp = -1;         // --seccomp (-1: none)
  int workspace = -1;       // --bind-fd
  int output = -1;          // --bind-fd
  int shared_output = -1;   // --ro-bind-fd (-1: not bound)
  int busy = -1;            // a living instance's busy file, for its keeper (not bwrap's)
  int script = -1;          // a shell command handed over on this descriptor (-1: in the argv)
  int root = -1;            // an image instance's root (--bind-fd ... /), made by its sandbox's starter
};

// The capabilities an image instance's commands have, inside its own user namespace only (none
// on the host): what apt, dpkg, useradd, chown and su need, as container runtimes give by
// default, less NET_RAW (so no packet of its own making gets past the network policy), and never
// SYS_ADMIN or NET_ADMIN.
inline constexpr std::string_view kImageCapabilities[] = {
    "CAP_CHOWN",  "CAP_DAC_OVERRIDE", "CAP_FOWNER",           "CAP_FSETID",     "CAP_KILL",
    "CAP_SETGID", "CAP_SETUID",       "CAP_SETPCAP",          "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
    "CAP_MKNOD",  "CAP_AUDIT_WRITE",  "CAP_SETFCAP"};
// The same set as bits by number (JoinSetup::keep_caps).
std::uint64_t image_capability_mask();

// The command of a shell-mode argv ({"/bin/sh" or "/bin/bash", "-c", COMMAND}), which is handed
// to the sandbox on a descriptor instead of in an argv every local user can read in ps; nullopt
// for any other argv (kept word for word).
std::optional<std::string> shell_script_of(const std::vector<std::string>& argv);

struct ArgvOptions {
  std::string bwrap_path;  // resolved program path (argv[0])
  // Reads a top-level symlink such as /bin -> usr/bin; nullopt when not a symlink.
  std::function<std::optional<std::string>(const std::string&)> read_symlink;
};

// Refuses (UsageError) a command or working directory that a C program cannot receive whole
// (a NUL byte would silently cut it).
void check_command(const std::vector<std::string>& argv, std::string_view cwd = {});

// Number of arguments each bwrap option takes (0, 1 or 2); nullopt for an unknown option.
std::optional<int> bwrap_option_arity(std::string_view option);

// The full bwrap argv: the configured base (network flags removed, merged-/usr symlinks
// reproduced), the hardening flags unless namespace.hardening is false, the network flag, the
// instance mounts, status/seccomp descriptors, --chdir, "--" and the command.
// Throws Error when the base command is unusable (contains "--", unknown option, ...).
std::vector<std::string> build_bwrap_argv(const config::Namespace& ns, const RunSpec& spec,
                                          const FdNumbers& fds, const ArgvOptions& options);

// The sandbox's environment: PATH, HOME, LANG, TERM, NS_HPC_INSTANCE, namespace.env,
// namespace.pass_env from `host_env`, then spec.env. "NAME=value" strings.
std::vector<std::string> build_sandbox_env(
    const config::Namespace& ns, const RunSpec& spec,
    const std::function<std::optional<std::string>(std::string_view)>& host_env);

}  // namespace nshpc::sandbox
