// The allow-list proxy of the `filtered` network mode: a process of its own per instance, the
// ns-hpc binary itself, run as
//   ns-hpc __net-proxy --policy FILE --audit FILE [--audit-rotation MAX_BYTES,KEEP] [--watch-pid PID]
// with a listening TCP socket on descriptor 3. The server makes that socket inside the sandbox's
// network namespace (127.0.0.1:3128); the proxy runs in the host's, so the connections it opens
// are the host's. Sandbox programs reach it through HTTP_PROXY/HTTPS_PROXY.
//
// It serves, on one io_context:
//   - CONNECT host:port          → policy → connect → "200 Connection established" → a tunnel;
//   - GET http://host[:port]/p   → policy → connect → the request in origin-form (Host from the
//     URI, Proxy-* and hop-by-hop headers removed, Connection: close), then bytes both ways;
//   - anything else              → 400 with a one-line reason.
// A plain request is forwarded with its body as its own framing says (Content-Length or chunked)
// and the answer comes back under a head the proxy writes (the origin's hop-by-hop headers
// removed); the client connection then stays open for its next request, which is checked again
// from the start (pipelined ones too: each goes to the destination it names, or is refused).
// Each request gets a connection of its own to its origin. A CONNECT tunnel is opaque: what goes
// through it (a TLS ClientHello naming another server, SNI) reaches only the address that was
// checked for the CONNECT target.
// Refusals are 403 with a text body that says what was refused and why. Every refusal is audited
// (network.denied, at most kDeniedPerWindow lines a minute, then one network.denied_suppressed),
// every connection that was made is audited when it ends (network.allowed).
//
// A name is resolved once, and the connection goes to an address that was checked, never to the
// name again (a name that resolves differently a moment later changes nothing). The host's own
// addresses (loopback, the unspecified address, and every address of its interfaces, followed
// as they change: network/netns.hpp HostAddressWatch) are refused whatever name leads there; only
// an address entry of the server's configuration ([network] allow) opens one, never an
// instance's own addition (network_allow), which an agent writes.
//
// The policy (a JSON file the server writes atomically) is read at start and again on SIGHUP;
// a policy that cannot be read on SIGHUP leaves the old one in force. Connections the new policy
// forbids are closed. The proxy ends on SIGTERM, when the --watch-pid process ends, and when the
// policy's folder (the instance's state folder) is removed (fs::removed).
//
// The policy's decisions are pure functions below (unit-tested); the process is proxy_main().
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "audit/audit.hpp"

namespace nshpc::network {

// argv[1] that makes ns-hpc the proxy (dispatched in main() before anything else is set up).
inline constexpr std::string_view kProxyCommand = "__net-proxy";

using IpAddress = boost::asio::ip::address;

// One entry of the allow list:
//   name           exact host name (case-insensitive; a trailing dot is ignored)
//   *.domain       any name below domain, not domain itself
//   10.1.2.3       an address (also `[fd00::1]`, or `fd00::1` without a port)
// each optionally followed by `:port`; an entry without a port allows ports 80 and 443 only.
// An address entry allows that destination even when it is private, link-local...; one of the
// host's own addresses only when the entry is the server configuration's (not `instance`).
struct AllowEntry {
  enum class Kind { name, subdomains, address };
  Kind kind = Kind::name;
  bool instance = false;              // an instance's own addition (network_allow), not [network] allow
  std::string name;                   // lower case; for `subdomains` the domain without "*."
  IpAddress address;                  // for `address` (an IPv4-mapped IPv6 address is kept as IPv4)
  std::optional<std::uint16_t> port;  // nullopt: 80 and 443
  std::string text;                   // as written, for messages
};

// Parses one entry; nullopt with `*error` set to why not.
std::optional<AllowEntry> parse_allow_entry(std::string_view text, std::string* error);

enum class Mode { off, filtered };

struct Policy {
  Mode mode = Mode::off;
  std::vector<AllowEntry> allow;
  // Resolver override: lower-case name → addresses, used instead of DNS for those names.
  std::map<std::string, std::vector<IpAddress>> resolve;
};

// The policy file's format (unknown keys are errors, so a misspelt key never widens or narrows
// anything silently):
//   {"mode": "filtered" | "off",
//    "allow": ["example.com", "*.example.org:8443", "10.1.2.3:8080", "[fd00::1]:443"],
//    "instance_allow": ["pypi.org"],
//    "resolve": {"allowed.test": ["127.0.0.1", "::1"]}}
// "allow" is the server's configuration, "instance_allow" the instance's own additions (entries
// with `instance` set). Each of "allow", "instance_allow" and "resolve" may be left out (empty).
// Throws UsageError naming every problem at once.
Policy parse_policy(std::string_view json_text);

// A host as a request names it: a lower-case name without a trailing dot, or an address.
struct Host {
  std::string name;                  // empty for an address literal
  std::optional<IpAddress> address;  // set for an address literal (IPv4-mapped → IPv4)
  std::string shown() const;         // "example.com", "10.0.0.1", "[::1]"
};

// Parses a request's host ("Example.COM", "10.0.0.1", "[::1]"); nullopt when it is neither a
// valid name nor an address literal. A name whose last label is all digits ("127.1",
// "2130706433": forms a resolver would take as an address) is not valid.
std::optional<Host> parse_host(std::string_view text);

// Why an address is not a public destination; `none` for a public one. An IPv4-mapped IPv6
// address is classified as the IPv4 address it maps.
enum class AddressClass { none, loopback, unspecified, link_local, metadata, private_net, cgnat, multicast, broadcast };
AddressClass classify(const IpAddress& address);
std::string_view describe(AddressClass c);  // "a loopback address", ...

// The policy's verdict on a destination; `reason` (the 403 body, without a line end) when refused.
struct Verdict {
  bool allowed = false;
  std::string reason;
};

// Whether a request for `host`:`port` may go on to resolution (mode, allow list).
Verdict check_destination(const Policy& policy, const Host& host, std::uint16_t port);

// Whether `address` (a candidate for `host`:`port`) may be connected to. One of the host's own
// (a loopback or unspecified address, or one of `host_addresses`: the addresses of the host's
// interfaces) only when an address entry of the server's configuration allows it for that port;
// any other: a public address, or one an address entry allows for that port.
Verdict check_address(const Policy& policy, const Host& host, std::uint16_t port, const IpAddress& address,
                      const std::vector<IpAddress>& host_addresses);

// The addresses as host_addresses() (network/netns.hpp) lists them, parsed; one that is not an
// address is left out.
std::vector<IpAddress> parse_addresses(const std::vector<std::string>& texts);

// The audit's network.denied lines: at most `limit` a window; the ones over it are counted and
// reported once the window has ended.
class DeniedLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit DeniedLimiter(int limit = 20, Clock::duration window = std::chrono::minutes(1))
      : limit_(limit), window_(window) {}
  // Whether a line may be written now (a window starts at the first line after the last one).
  bool admit(Clock::time_point now);
  // When the current window ends (nullopt: none open).
  std::optional<Clock::time_point> window_end() const;
  // At or after window_end(): how many lines were suppressed in it (0: none), and the window is
  // closed.
  int close_window();

 private:
  int limit_;
  Clock::duration window_;
  std::optional<Clock::time_point> start_;
  int written_ = 0;
  int suppressed_ = 0;
};

struct ProxyOptions {
  std::string policy_file;
  std::string audit_file;
  audit::Rotation audit_rotation;  // --audit-rotation MAX_BYTES,KEEP; the default when not given
  int watch_pid = 0;  // 0: none
};

// Reads `ns-hpc __net-proxy --policy FILE --audit FILE [--audit-rotation MAX_BYTES,KEEP]
// [--watch-pid PID]` (argv[0] included).
// Throws UsageError.
ProxyOptions parse_proxy_argv(const std::vector<std::string>& argv);

// `ns-hpc __net-proxy ...`: serves descriptor 3 until SIGTERM or the watched process ends (0);
// 2 for bad arguments, a broken policy file or a descriptor 3 that is not a listening socket.
int proxy_main(int argc, char** argv);

}  // namespace nshpc::network
