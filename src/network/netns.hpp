// Tools for a sandbox's network namespace, driven from outside it by descriptors: a listening
// socket made inside it, a program (ip, ss) run inside it, addresses made unreachable, TCP
// connections cut, and NAT to the host's network with pasta attached and detached at run time.
// Nothing here knows instances, MCP or the store: every function takes the namespace's
// descriptors.
//
// The caller holds the network namespace and the user namespace that owns it (bwrap's outer one,
// or an image instance's); a server running as root may join the network namespace directly
// (userns_fd -1). Every step that enters the namespace does so in a forked child (setns of a user
// namespace needs a single-threaded process, and the server has threads); the server's own
// threads never change namespace.
//
// What the sandbox may undo: routes and connections inside the namespace belong to it. A
// sandbox whose processes keep CAP_NET_ADMIN in their user namespace could delete the
// `prohibit` routes of block_addresses(); bwrap sandboxes here drop every capability, so they
// cannot.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/fd.hpp"
#include "base/process.hpp"
#include "base/users.hpp"

namespace nshpc::network {

// A network namespace to act in, by descriptors the caller owns (borrowed, not closed here).
struct Netns {
  int net_fd = -1;     // /proc/PID/ns/net (or any descriptor of the namespace)
  int userns_fd = -1;  // the user namespace that owns it; -1: join the network namespace directly (root)
};

// The owned descriptors of a process's network namespace and of the user namespace that owns it.
struct NetnsFds {
  UniqueFd net;
  UniqueFd userns;  // invalid when that is this process's own user namespace (nothing to join)
  Netns view() const { return {net.get(), userns.get()}; }
};

// Opens /proc/PID/ns/net and its owning user namespace (ioctl NS_GET_USERNS). The caller makes
// sure `pid` is still the process it means (e.g. a pidfd checked after this returns). Throws
// SysError (ENOENT/ESRCH: the process is gone; EACCES/EPERM: not ours to open).
NetnsFds open_netns(pid_t pid);

// A TCP socket bound to address:port (IPv4 or IPv6 literal; port 0: any free port) and listening
// inside the namespace, with SO_REUSEADDR; close-on-exec. Made by a forked child that joins the
// namespace and passes the socket back over SCM_RIGHTS. Throws SysError naming the failing step
// (e.g. "bind 127.0.0.1:3128 in the sandbox's network namespace: Address already in use").
UniqueFd listen_in(const Netns& ns, const std::string& address, std::uint16_t port, int backlog = 128);

// A TCP socket listening on `address` in this process's own network namespace (the host's), at
// the first of `ports` that is free, with SO_REUSEADDR; close-on-exec. Bound by a forked child
// that first becomes `identity` (its uid and gid, no supplementary group: no capability is left)
// when one is given (root only), or else gives up every capability of its own: the kernel refuses
// it a privileged port (below net.ipv4.ip_unprivileged_port_start) as it would any user. Throws
// SysError naming the failing step: EADDRINUSE when every port is taken, EACCES for a privileged
// one.
UniqueFd listen_as(const std::optional<users::Identity>& identity, const std::string& address,
                   const std::vector<std::uint16_t>& ports, int backlog = 128);

// Runs argv (looked up in the host's PATH) inside the namespace, as run_command does (stdin from
// `input`, stdout and stderr apart, killed after `timeout`). Joining the namespace happens in the
// child before exec; a failure there is SysError "join the sandbox's network namespace failed: ...".
CommandResult run_in(const Netns& ns, const std::vector<std::string>& argv, const std::string& input = {},
                     std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Makes `addresses` (IPv4 or IPv6 literals; a "%scope" suffix is ignored) unreachable from inside
// the namespace with `prohibit` routes (/32, /128) in its main table: a connect() there fails with
// EACCES. Replaces what an earlier call installed: prohibit host routes not in `addresses` are
// deleted, so the call is idempotent and an empty list removes them all. Throws UsageError on a
// string that is no address, Error when ip fails.
void block_addresses(const Netns& ns, const std::vector<std::string>& addresses);

// Every address of this host's own interfaces (getifaddrs), IPv4 and IPv6, without loopback
// (127.0.0.0/8, ::1) and without scope suffixes: what pasta would otherwise let a sandbox reach
// on the host itself. Sorted, without duplicates.
std::vector<std::string> host_addresses();

// The host's address changes as the kernel announces them (rtnetlink: the IPv4 and IPv6 address
// groups), subscribed to when made. The kernel queues an announcement before the call that added
// or removed the address returns, so reading host_addresses() again whenever changed() says so
// never misses an address that exists by then. Followed by __net-watch (the blocked set of `nat`)
// and by the `filtered` proxy (the addresses it refuses).
class HostAddressWatch {
 public:
  HostAddressWatch();  // throws SysError when the subscription cannot be made
  int fd() const { return socket_.get(); }  // readable when something was announced (for poll)
  // Takes what was announced, without waiting: true when anything was, or when announcements were
  // lost (the socket's queue overflowed), i.e. host_addresses() may differ from the last reading.
  bool changed();

 private:
  UniqueFd socket_;
};

// Closes every TCP connection in the namespace whose peer is not loopback (127.0.0.0/8, ::1,
// ::ffff:127.0.0.0/104): `ss -K` inside it, which uses sock_diag's SOCK_DESTROY (the kernel needs
// CONFIG_INET_DIAG_DESTROY). Listening sockets and loopback connections stay. The programs in
// the sandbox see their connections reset (ECONNABORTED/ECONNRESET). Returns how many were
// closed. Throws Error when connections that should be gone are still established afterwards
// (the message says the kernel option is missing when /proc/config.gz says so).
int destroy_sockets(const Netns& ns);

// NAT for a sandbox: pasta (package passt) attached to its namespace, with --config-net (the
// host's addresses and routes copied inside, IPv4 and IPv6 as the host has them), --no-map-gw
// (the gateway address leads to the real gateway, never to the host), and no port forwarding in
// either direction (-t/-u/-T/-U none).
//
// Measured with passt 0.0~git20230309 (Debian 12), kernel 6.18:
// - pasta is passed the namespaces as descriptors (--netns /proc/self/fd/3 --userns
//   /proc/self/fd/4) and, as root, --runas 0: without it pasta drops to nobody before it opens
//   them and fails. Passing the pid form fails against hardened bwrap sandboxes.
// - pasta daemonizes (new session, reparented to init or the nearest subreaper): it outlives the
//   process that attached it, and attach returns once the namespace is configured (the parent
//   pasta exits after writing the pid file). Measured (test Netns.PastaAttachTime, 2 vCPU shared
//   with other builds, load average 4-7): 20-125 ms per attach, medians 28-115 ms; pasta alone
//   from a shell 65-125 ms at load 7. Expect less on an idle host.
// - pasta does NOT end when the sandbox's last process ends: it watches for the namespace's path
//   being deleted only (inotify), which /proc paths never report, and its own sockets and tap
//   device keep the namespace alive. The caller must detach when the sandbox ends (and may do so
//   after the sandbox is gone; detach_pasta by pid file also works after a server restart).
// - Killing pasta removes its interface: the namespace is left with loopback only, and
//   connections through it are gone.
// - Only addresses pasta can reach on the host need blocking: with --no-map-gw the sandbox's
//   127.0.0.1 is its own loopback, but the host's other addresses (its interfaces, a veth) are
//   reached as the host; block them with block_addresses(ns, host_addresses()).
struct PastaOptions {
  // Where pasta writes its pid (it must be writable by this process); detach_pasta reads it.
  std::filesystem::path pid_file;
  std::chrono::milliseconds timeout = std::chrono::seconds(10);
};

struct PastaProcess {
  pid_t pid = -1;
  UniqueFd pidfd;  // of the daemonized pasta
  // It became this process's child: this process is a child subreaper (the MCP server is), so
  // pasta was reparented to it when it daemonized. It must then be reaped if it ends other than
  // by detach_pasta (which reaps it), e.g. by Leftovers::add(pidfd).
  bool adopted = false;
  std::chrono::microseconds took{0};  // from start to a configured namespace (attach_pasta only)
};

// Starts pasta for the namespace. Throws UsageError when the pid file names a pasta that is still
// running (detach first), Error with pasta's own message when it fails (e.g. /dev/net/tun not
// accessible), SysError(ENOENT) when pasta is not installed.
PastaProcess attach_pasta(const Netns& ns, const PastaOptions& options);

// The pasta recorded in `pid_file`, if it is running: a pidfd opened for the pid in the file,
// checked to be a pasta started with that pid file while the pidfd's process was still alive.
std::optional<PastaProcess> find_pasta(const std::filesystem::path& pid_file);

// Ends the pasta recorded in `pid_file` (SIGTERM, SIGKILL after `grace`) through a pidfd checked
// as find_pasta does, waits until it is gone, and removes the pid file. Returns false when there
// was nothing running to end (a stale or missing file is removed too).
bool detach_pasta(const std::filesystem::path& pid_file, std::chrono::milliseconds grace = std::chrono::seconds(2));

// nullopt when NAT can be offered to this process: pasta is installed and /dev/net/tun can be
// opened read-write. Otherwise one sentence saying what is missing and the fix.
std::optional<std::string> nat_unavailable();

// pasta does not end with its namespace, so a living sandbox's pasta gets a watcher: the ns-hpc
// binary itself, run as
//   ns-hpc __net-watch --watch-pid INIT --pasta-pid-file FILE
// (own session, /dev/null for its standard descriptors, the server's uid), which detaches the
// pasta of FILE once INIT (the sandbox's init) has ended or FILE's folder has been removed (the
// instance's folder was: fs::removed), and ends by itself when that pasta ends first (a switch
// to another mode detached it). Meanwhile it follows the host's addresses
// (rtnetlink): when one is added or removed, block_addresses() sets the sandbox's blocked set
// again (a new address is reachable from the sandbox for the moments this takes).
inline constexpr std::string_view kWatchCommand = "__net-watch";
int watch_main(int argc, char** argv);

// An instance whose commands each get a fresh sandbox still has one network namespace, made and
// kept by a holder that every command's sandbox joins (so a command pays no pasta start). The
// holder is the ns-hpc binary itself, run as
//   ns-hpc __net-hold --idle SECONDS --record FILE
// (own session, /dev/null for 0-2, fd 3 a pipe; FILE its pid file, which the server writes): it
// unshares a network namespace (as a normal user with a user namespace of its own that maps only
// its uid, to 0, and owns it), brings its loopback up, writes "ready\n" to fd 3 and closes it. It
// then ends on SIGTERM, once FILE's folder has been removed (the instance's folder was:
// fs::removed), or once no other process has been in its namespace for SECONDS (0: never); what
// serves the namespace (pasta's watcher, the proxy, the forwarders) watches its pid and ends
// with it.
inline constexpr std::string_view kHoldCommand = "__net-hold";
int hold_main(int argc, char** argv);

}  // namespace nshpc::network
