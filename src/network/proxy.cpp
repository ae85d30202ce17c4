// The allow-list proxy (see proxy.hpp): the policy's pure decisions first, then the process.
//
// Requests and answers are read with Beast's parsers: their tokenizer is strict (a bad method,
// target, version, header name or obs-fold is an error, not a guess), they enforce the head
// limits themselves, and they frame a body (Content-Length, chunked, or to the end of an answer)
// without keeping it: the body type below only counts the bytes, which are passed on raw, so
// what follows a request (the client's next one, a TLS ClientHello sent early) stays in the
// buffer to be judged on its own. A hand parser would have to get all of that right again; the
// Beast one is already compiled into nshpc_transport.
#include "network/proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <memory>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <fmt/format.h>

#include "audit/audit.hpp"
#include "base/json.hpp"
#include "base/users.hpp"
#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/pidfd.hpp"
#include "base/text.hpp"
#include "network/netns.hpp"

// GCC 12 takes an Asio coroutine frame's own operator delete, inlined where one coroutine awaits
// another, for a mismatch with the operator new that made the frame (a known false positive of
// -Wmismatched-new-delete with C++20 coroutines; both are awaitable_frame_base's).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace nshpc::network {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c); });
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A port written in decimal, 1..65535.
std::optional<std::uint16_t> parse_port(std::string_view text) {
  unsigned value = 0;
  if (text.empty() || text.size() > 5 || !std::all_of(text.begin(), text.end(), is_digit)) return std::nullopt;
  std::from_chars(text.data(), text.data() + text.size(), value);
  if (value == 0 || value > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(value);
}

// An address literal, strictly (inet_pton: no "127.1", no hex, no scope ids). IPv4-mapped IPv6
// comes back as IPv4, so one destination has one spelling everywhere.
IpAddress unmap(const IpAddress& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  return a;
}

std::optional<IpAddress> parse_address(std::string_view text, bool v6_only = false) {
  if (text.empty() || text.find('%') != std::string_view::npos) return std::nullopt;
  boost::system::error_code ec;
  const IpAddress a = boost::asio::ip::make_address(std::string(text), ec);
  if (ec || (v6_only && !a.is_v6())) return std::nullopt;
  return unmap(a);
}

// A host name, lower-cased, without its trailing dot: labels of letters, digits, '-' and '_'
// (1..63 bytes each, 253 in all), the last one not all digits, and nothing inet_aton(3) (so
// getaddrinfo) would read as an IPv4 address ("0x7f000001", "127.1").
std::optional<std::string> normalize_name(std::string_view text) {
  if (!text.empty() && text.back() == '.') text.remove_suffix(1);
  if (text.empty() || text.size() > 253) return std::nullopt;
  if (in_addr ignored{}; ::inet_aton(std::string(text).c_str(), &ignored) != 0) return std::nullopt;
  const auto labels = text::split(text, '.');
  for (const auto label : labels) {
    if (label.empty() || label.size() > 63) return std::nullopt;
    for (const char c : label)
      if (!(is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_'))
        return std::nullopt;
  }
  if (std::all_of(labels.back().begin(), labels.back().end(), is_digit)) return std::nullopt;
  return lower(text);
}

bool port_matches(const std::optional<std::uint16_t>& entry, std::uint16_t port) {
  return entry ? *entry == port : (port == 80 || port == 443);
}

bool name_matches(const AllowEntry& e, std::string_view name) {
  if (e.kind == AllowEntry::Kind::name) return name == e.name;
  if (e.kind == AllowEntry::Kind::subdomains)
    return name.size() > e.name.size() + 1 && name.ends_with(e.name) && name[name.size() - e.name.size() - 1] == '.';
  return false;
}

// Whether an address entry allows `address`:`port`; with `configured_only`, only one of the
// server's configuration.
bool address_listed(const Policy& policy, const IpAddress& address, std::uint16_t port, bool configured_only = false) {
  const IpAddress a = unmap(address);
  return std::any_of(policy.allow.begin(), policy.allow.end(), [&](const AllowEntry& e) {
    return e.kind == AllowEntry::Kind::address && !(configured_only && e.instance) && e.address == a &&
           port_matches(e.port, port);
  });
}

std::string host_port(const Host& host, std::uint16_t port) { return fmt::format("{}:{}", host.shown(), port); }

std::string address_port(const IpAddress& a, std::uint16_t port) {
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), port) : fmt::format("{}:{}", a.to_string(), port);
}

AddressClass classify_v4(std::uint32_t u) {
  const auto in = [u](std::uint32_t net, int bits) { return (u >> (32 - bits)) == (net >> (32 - bits)); };
  if (in(0x00000000, 8)) return AddressClass::unspecified;
  if (in(0x7f000000, 8)) return AddressClass::loopback;
  if (u == 0xa9fea9fe) return AddressClass::metadata;  // 169.254.169.254
  if (in(0xa9fe0000, 16)) return AddressClass::link_local;
  if (in(0x0a000000, 8) || in(0xac100000, 12) || in(0xc0a80000, 16)) return AddressClass::private_net;
  if (in(0x64400000, 10)) return AddressClass::cgnat;
  if (in(0xe0000000, 4)) return AddressClass::multicast;
  if (in(0xf0000000, 4)) return AddressClass::broadcast;  // 240/4 (reserved) and 255.255.255.255
  return AddressClass::none;
}

}  // namespace

std::string Host::shown() const {
  if (!address) return name;
  return address->is_v6() ? "[" + address->to_string() + "]" : address->to_string();
}

std::optional<Host> parse_host(std::string_view text) {
  if (text.size() > 2 && text.front() == '[' && text.back() == ']') {
    const auto a = parse_address(text.substr(1, text.size() - 2), true);
    if (!a) return std::nullopt;
    return Host{"", *a};
  }
  if (const auto a = parse_address(text); a && a->is_v4()) return Host{"", *a};
  if (auto name = normalize_name(text)) return Host{std::move(*name), std::nullopt};
  return std::nullopt;
}

std::optional<AllowEntry> parse_allow_entry(std::string_view text, std::string* error) {
  const auto fail = [&](std::string why) -> std::optional<AllowEntry> {
    if (error) *error = fmt::format("allow entry \"{}\": {}", text, why);
    return std::nullopt;
  };
  AllowEntry entry;
  entry.text = std::string(text);
  if (text.empty()) return fail("empty");
  std::string_view host = text;
  std::optional<std::string_view> port;
  if (text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return fail("'[' without ']'");
    host = text.substr(1, close - 1);
    const auto rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return fail("expected ':port' after ']'");
      port = rest.substr(1);
    }
    const auto a = parse_address(host, true);
    if (!a) return fail("not an IPv6 address between '[' and ']'");
    entry.kind = AllowEntry::Kind::address;
    entry.address = *a;
  } else if (std::count(text.begin(), text.end(), ':') >= 2) {
    const auto a = parse_address(text, true);
    if (!a) return fail("not an IPv6 address (write [address]:port for one with a port)");
    entry.kind = AllowEntry::Kind::address;
    entry.address = *a;
  } else {
    if (const auto colon = text.find(':'); colon != std::string_view::npos) {
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
    }
    if (const auto a = parse_address(host); a && a->is_v4()) {
      entry.kind = AllowEntry::Kind::address;
      entry.address = *a;
    } else if (host.starts_with("*.")) {
      const auto name = normalize_name(host.substr(2));
      if (!name || host.find('*', 1) != std::string_view::npos) return fail("not a valid domain after '*.'");
      entry.kind = AllowEntry::Kind::subdomains;
      entry.name = *name;
    } else if (host.find('*') != std::string_view::npos) {
      return fail("'*' is allowed only as a whole first label (*.example.com)");
    } else {
      const auto name = normalize_name(host);
      if (!name) return fail("not a valid host name or IPv4 address");
      entry.kind = AllowEntry::Kind::name;
      entry.name = *name;
    }
  }
  if (port) {
    entry.port = parse_port(*port);
    if (!entry.port) return fail(fmt::format("port \"{}\" is not a number from 1 to 65535", *port));
  }
  return entry;
}

Policy parse_policy(std::string_view json_text) {
  nlohmann::json doc;
  try {
    doc = parse_json(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string_view what = e.what();
    if (const auto end = what.find("] "); end != std::string_view::npos) what.remove_prefix(end + 2);
    throw UsageError(fmt::format("not valid JSON: {}", what));
  }
  if (!doc.is_object()) throw UsageError("not a JSON object ({\"mode\": ..., \"allow\": [...], \"resolve\": {...}})");
  Policy policy;
  std::vector<std::string> problems;
  for (const auto& [key, value] : doc.items())
    if (key != "mode" && key != "allow" && key != "instance_allow" && key != "resolve")
      problems.push_back(fmt::format("unknown key \"{}\" (known: mode, allow, instance_allow, resolve)", key));
  if (!doc.contains("mode")) {
    problems.push_back("\"mode\" is missing (\"filtered\" or \"off\")");
  } else if (doc["mode"] == "filtered") {
    policy.mode = Mode::filtered;
  } else if (doc["mode"] == "off") {
    policy.mode = Mode::off;
  } else {
    problems.push_back(fmt::format("\"mode\" is {}; expected \"filtered\" or \"off\"", doc["mode"].dump()));
  }
  for (const bool instance : {false, true}) {
    const char* key = instance ? "instance_allow" : "allow";
    if (!doc.contains(key)) continue;
    if (!doc[key].is_array()) {
      problems.push_back(fmt::format("\"{}\" is not a list of strings", key));
      continue;
    }
    for (const auto& item : doc[key]) {
      if (!item.is_string()) {
        problems.push_back(fmt::format("{} entry {} is not a string", key, item.dump()));
        continue;
      }
      std::string why;
      if (auto entry = parse_allow_entry(item.get<std::string>(), &why)) {
        entry->instance = instance;
        policy.allow.push_back(std::move(*entry));
      } else {
        problems.push_back(instance ? "instance_allow: " + why : why);
      }
    }
  }
  if (doc.contains("resolve")) {
    if (!doc["resolve"].is_object()) {
      problems.push_back("\"resolve\" is not an object of name → list of addresses");
    } else {
      for (const auto& [name, list] : doc["resolve"].items()) {
        const auto host = parse_host(name);
        if (!host || host->address) {
          problems.push_back(fmt::format("resolve: \"{}\" is not a host name", name));
          continue;
        }
        if (!list.is_array() || list.empty()) {
          problems.push_back(fmt::format("resolve: \"{}\" is not a non-empty list of addresses", name));
          continue;
        }
        auto& addresses = policy.resolve[host->name];
        for (const auto& item : list) {
          const auto a = item.is_string() ? parse_address(item.get<std::string>()) : std::nullopt;
          if (!a)
            problems.push_back(fmt::format("resolve: \"{}\": {} is not an IP address", name, item.dump()));
          else
            addresses.push_back(*a);
        }
      }
    }
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw UsageError(all);
  }
  return policy;
}

AddressClass classify(const IpAddress& address) {
  const IpAddress a = unmap(address);
  if (a.is_v4()) return classify_v4(a.to_v4().to_uint());
  const auto b = a.to_v6().to_bytes();
  const auto v4_at = [&b](int i) {
    return (std::uint32_t{b[i]} << 24) | (std::uint32_t{b[i + 1]} << 16) | (std::uint32_t{b[i + 2]} << 8) | b[i + 3];
  };
  const auto prefix = [&b](std::initializer_list<std::uint8_t> bytes) {
    return std::equal(bytes.begin(), bytes.end(), b.begin());
  };
  const auto v6 = a.to_v6();
  if (v6.is_loopback()) return AddressClass::loopback;
  if (v6.is_unspecified()) return AddressClass::unspecified;
  if (v6 == boost::asio::ip::make_address_v6("fd00:ec2::254")) return AddressClass::metadata;
  if ((b[0] == 0xfe && (b[1] & 0xc0) == 0x80)) return AddressClass::link_local;  // fe80::/10
  if ((b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) || (b[0] & 0xfe) == 0xfc)  // fec0::/10 (site-local), fc00::/7
    return AddressClass::private_net;
  if (b[0] == 0xff) return AddressClass::multicast;
  // IPv4 embedded by NAT64 (64:ff9b::/96) and 6to4 (2002::/16): judged as that IPv4 address.
  if (prefix({0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0})) return classify_v4(v4_at(12));
  if (prefix({0x20, 0x02})) return classify_v4(v4_at(2));
  return AddressClass::none;
}

std::string_view describe(AddressClass c) {
  switch (c) {
    case AddressClass::none: return "a public address";
    case AddressClass::loopback: return "a loopback address";
    case AddressClass::unspecified: return "an unspecified address";
    case AddressClass::link_local: return "a link-local address";
    case AddressClass::metadata: return "a cloud metadata address";
    case AddressClass::private_net: return "a private address";
    case AddressClass::cgnat: return "a carrier-grade NAT address";
    case AddressClass::multicast: return "a multicast address";
    case AddressClass::broadcast: return "a broadcast or reserved address";
  }
  return "an address";
}

Verdict check_destination(const Policy& policy, const Host& host, std::uint16_t port) {
  if (policy.mode == Mode::off)
    return {false, fmt::format("ns-hpc: {} was refused: this instance's network is off (network mode \"off\")",
                               host_port(host, port))};
  const bool listed =
      host.address ? address_listed(policy, *host.address, port)
                   : std::any_of(policy.allow.begin(), policy.allow.end(), [&](const AllowEntry& e) {
                       return name_matches(e, host.name) && port_matches(e.port, port);
                     });
  if (listed) return {true, ""};
  // What the agent can do first (its instance's own allow list), then what the operator can. An
  // entry without a port allows 80 and 443.
  const std::string entry = port == 80 || port == 443 ? host.shown() : host_port(host, port);
  return {false, fmt::format("ns-hpc: {} is not in this instance's network allow list: add \"{}\" to it with "
                             "update_instance network_allow (the instance's whole list), or ask the server's "
                             "operator to add it to [network] allow in ns-hpc's config",
                             host_port(host, port), entry)};
}

Verdict check_address(const Policy& policy, const Host& host, std::uint16_t port, const IpAddress& address,
                      const std::vector<IpAddress>& host_addresses) {
  if (policy.mode == Mode::off) return check_destination(policy, host, port);
  const IpAddress a = unmap(address);
  const AddressClass c = classify(a);
  // The host itself: its loopback, the unspecified address (a connection to it reaches this
  // host), every address of its interfaces, whatever range it is in. The proxy runs in the
  // host's network namespace, so each of them leads to the host's own services.
  const bool own = c == AddressClass::loopback || c == AddressClass::unspecified ||
                   std::find(host_addresses.begin(), host_addresses.end(), a) != host_addresses.end();
  if (own) {
    if (address_listed(policy, a, port, /*configured_only=*/true)) return {true, ""};
    const std::string_view what = c == AddressClass::loopback      ? "a loopback address of this host"
                                  : c == AddressClass::unspecified ? "the unspecified address (this host)"
                                                                   : "an address of this host itself";
    return {false, fmt::format("ns-hpc: {} resolved to {}, {}, which is refused unless ns-hpc's own configuration "
                               "lists that address ([network] allow, e.g. {}); an instance's network_allow cannot "
                               "open the host's addresses",
                               host_port(host, port), a.to_string(), what, address_port(a, port))};
  }
  if (address_listed(policy, a, port)) return {true, ""};
  if (c == AddressClass::none) return {true, ""};
  return {false, fmt::format("ns-hpc: {} resolved to {}, {}, which is refused unless that address is itself in the "
                             "network allow list (e.g. {})",
                             host_port(host, port), a.to_string(), describe(c), address_port(a, port))};
}

std::vector<IpAddress> parse_addresses(const std::vector<std::string>& texts) {
  std::vector<IpAddress> out;
  for (const std::string& text : texts)
    if (const auto a = parse_address(text)) out.push_back(*a);
  return out;
}

bool DeniedLimiter::admit(Clock::time_point now) {
  if (!start_ || (now >= *start_ + window_ && suppressed_ == 0)) {
    start_ = now;
    written_ = 0;
  }
  if (written_ < limit_) {
    ++written_;
    return true;
  }
  ++suppressed_;
  return false;
}

std::optional<DeniedLimiter::Clock::time_point> DeniedLimiter::window_end() const {
  if (!start_) return std::nullopt;
  return *start_ + window_;
}

int DeniedLimiter::close_window() {
  const int n = suppressed_;
  start_.reset();
  written_ = 0;
  suppressed_ = 0;
  return n;
}

ProxyOptions parse_proxy_argv(const std::vector<std::string>& argv) {
  ProxyOptions options;
  bool policy = false, audit = false, rotation = false, watch = false;
  for (std::size_t i = 2; i < argv.size(); ++i) {
    const std::string& flag = argv[i];
    if (flag != "--policy" && flag != "--audit" && flag != "--audit-rotation" && flag != "--watch-pid")
      throw UsageError(fmt::format("unknown argument \"{}\"", flag));
    if (i + 1 >= argv.size()) throw UsageError(fmt::format("{} needs a value", flag));
    const std::string& value = argv[++i];
    bool& seen = flag == "--policy" ? policy : flag == "--audit" ? audit : flag == "--audit-rotation" ? rotation : watch;
    if (seen) throw UsageError(fmt::format("{} is given twice", flag));
    seen = true;
    if (value.empty()) throw UsageError(fmt::format("{} is empty", flag));
    if (flag == "--policy") {
      options.policy_file = value;
    } else if (flag == "--audit") {
      options.audit_file = value;
    } else if (flag == "--audit-rotation") {
      const auto parsed = audit::parse_rotation_argument(value);
      if (!parsed) throw UsageError(fmt::format("--audit-rotation \"{}\" is not MAX_BYTES,KEEP", value));
      options.audit_rotation = *parsed;
    } else {
      int pid = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), pid);
      if (ec != std::errc() || end != value.data() + value.size() || pid <= 0)
        throw UsageError(fmt::format("--watch-pid \"{}\" is not a process id", value));
      options.watch_pid = pid;
    }
  }
  if (!policy) throw UsageError("--policy FILE is missing");
  if (!audit) throw UsageError("--audit FILE is missing");
  return options;
}

// ---------------------------------------------------------------------------------------------
// The process

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using asio::awaitable;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

constexpr int kListenFd = 3;
constexpr std::uint32_t kMaxHead = 16 * 1024;
constexpr std::size_t kMaxConnections = 256;
constexpr auto kHeadTimeout = std::chrono::seconds(10);
// A kept-alive client connection may stay silent this long before its next request.
constexpr auto kKeepAliveTimeout = std::chrono::seconds(30);
constexpr auto kConnectTimeout = std::chrono::seconds(10);  // resolution and connection together
constexpr auto kIdleTimeout = std::chrono::minutes(10);
// Once one side has ended (its end passed on as a half-close), the other gets this long without
// a byte: enough to finish an answer, short enough that abandoned connections do not pile up.
constexpr auto kHalfClosedTimeout = std::chrono::seconds(30);
constexpr auto kReplyTimeout = std::chrono::seconds(5);     // writing a refusal, and the lingering close
constexpr auto kStopGrace = std::chrono::seconds(3);        // for the connections' last audit lines

void say(std::string_view message) { fmt::print(stderr, "ns-hpc {}: {}\n", kProxyCommand, message); }

Policy load_policy(const std::string& file) {
  std::optional<std::string> text;
  try {
    text = fs::read_file(file);
  } catch (const SysError& e) {
    throw e.wrapped(fmt::format("the policy file {}", file));
  }
  if (!text) throw UsageError(fmt::format("the policy file {} does not exist", file));
  try {
    return parse_policy(*text);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("the policy file {}: {}", file, e.what()));
  }
}

class Session;

class Proxy {
 public:
  Proxy(asio::io_context& io, ProxyOptions options, Policy policy, tcp::acceptor acceptor,
        std::optional<HostAddressWatch> address_watch)
      : io_(io), options_(std::move(options)), policy_(std::make_shared<const Policy>(std::move(policy))),
        acceptor_(std::move(acceptor)), signals_(io, SIGHUP, SIGTERM, SIGINT), suppressed_timer_(io), watch_(io),
        address_watch_(std::move(address_watch)), address_events_(io), folder_timer_(io) {}

  // `watched`: the --watch-pid process's pidfd (or none); `folder`: the policy's folder (the
  // instance's state folder), whose removal ends the proxy too.
  void start(UniqueFd watched, UniqueFd folder);
  const Policy& policy() const { return *policy_; }
  bool stopping() const { return stopping_; }
  void forget(std::uint64_t id) { sessions_.erase(id); }
  void audit(std::string_view event, nlohmann::json fields);
  void denied(const Host& host, std::uint16_t port, const std::string& reason);
  // The host's own addresses as they are now: read again whenever the kernel has announced a
  // change since the last reading (HostAddressWatch), so an address added a moment ago is in.
  // nullptr when they cannot be read (*why says why): nothing may be connected then.
  const std::vector<IpAddress>* host_addresses(std::string* why);

 private:
  awaitable<void> accept_loop();
  awaitable<void> signal_loop();
  awaitable<void> watch_loop();
  awaitable<void> folder_loop();
  awaitable<void> addresses_loop();
  void reload();
  void recheck_sessions(std::string_view by);
  void stop(std::string_view why);
  void arm_suppressed_timer();
  void flush_suppressed();

  asio::io_context& io_;
  ProxyOptions options_;
  std::shared_ptr<const Policy> policy_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  asio::steady_timer suppressed_timer_;
  asio::posix::stream_descriptor watch_;
  std::optional<HostAddressWatch> address_watch_;  // nullopt: the addresses are read for every check
  asio::posix::stream_descriptor address_events_;  // the watch's socket, to wake up on a change
  UniqueFd folder_;
  asio::steady_timer folder_timer_;
  std::vector<IpAddress> host_addresses_;
  bool host_addresses_read_ = false;
  std::map<std::uint64_t, std::weak_ptr<Session>> sessions_;
  std::uint64_t next_id_ = 1;
  DeniedLimiter limiter_;
  bool stopping_ = false;
  friend class Session;
};

// A body the parsers only frame: the bytes the parser takes are passed on raw by the caller and
// never kept (a chunked body keeps its chunks and trailers as the client wrote them).
struct FramedBody {
  struct value_type {};
  struct reader {
    template <bool isRequest, class Fields>
    reader(bhttp::header<isRequest, Fields>&, value_type&) {}
    void init(const boost::optional<std::uint64_t>&, boost::system::error_code& ec) { ec = {}; }
    template <class Buffers>
    std::size_t put(const Buffers& buffers, boost::system::error_code& ec) {
      ec = {};
      return asio::buffer_size(buffers);
    }
    void finish(boost::system::error_code& ec) { ec = {}; }
  };
};
using RequestParser = bhttp::request_parser<FramedBody>;
using ResponseParser = bhttp::response_parser<FramedBody>;

// One client connection: its requests one after the other (or one CONNECT tunnel), the policy's
// verdict on each, the origin connection of each. A single deadline timer covers each phase
// (head, resolve + connect, reply, exchange or tunnel).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Proxy& proxy, tcp::socket client, std::uint64_t id)
      : id_(id), proxy_(proxy), client_(std::move(client)), upstream_(client_.get_executor()),
        resolver_(client_.get_executor()), deadline_(client_.get_executor(), Clock::time_point::max()) {}

  std::uint64_t id() const { return id_; }

  void start() {
    auto self = shared_from_this();
    asio::co_spawn(client_.get_executor(), watchdog(self), asio::detached);
    asio::co_spawn(client_.get_executor(), run(self), asio::detached);
  }

  void abort() {
    aborted_ = true;
    boost::system::error_code ignored;
    client_.close(ignored);
    upstream_.close(ignored);
    resolver_.cancel();
  }

  // Closes the connection when `policy` (or the host's addresses now) no longer allows its
  // destination (after a reload, or a new address of the host); `by` says which, for the audit.
  void recheck(const Policy& policy, std::string_view by) {
    if (!connected_ || aborted_) return;
    const Verdict v = verdict_on_connection(policy);
    if (v.allowed) return;
    proxy_.denied(host_, port_, fmt::format("an open connection was closed by {}: {}", by, v.reason));
    abort();
  }

 private:
  enum class Phase { head, connect, reply, tunnel };

  void arm(Clock::duration d) { deadline_.expires_after(d); }

  static awaitable<void> watchdog(std::shared_ptr<Session> self) {
    while (!self->done_) {
      auto [ec] = co_await self->deadline_.async_wait(kTuple);
      if (self->done_) break;
      if (ec || self->deadline_.expiry() > Clock::now()) continue;  // re-armed
      self->deadline_.expires_at(Clock::time_point::max());
      self->expired_ = true;
      if (self->phase_ == Phase::head || self->phase_ == Phase::connect) {
        // The waiting step fails and serve() answers (400 or 504).
        boost::system::error_code ignored;
        self->client_.cancel(ignored);
        self->upstream_.close(ignored);
        self->resolver_.cancel();
      } else {
        self->abort();
      }
    }
  }

  static awaitable<void> run(std::shared_ptr<Session> self) {
    try {
      co_await self->serve();
    } catch (const std::exception& e) {
      say(fmt::format("a connection ended: {}", e.what()));
    }
    self->done_ = true;
    self->deadline_.cancel();
    self->finish_upstream();
    self->abort();
    self->proxy_.forget(self->id_);
  }

  // The policy's verdict on the connection made now (its name and the address it went to).
  Verdict verdict_on_connection(const Policy& policy) {
    Verdict v = check_destination(policy, host_, port_);
    if (!v.allowed) return v;
    std::string why;
    const std::vector<IpAddress>* own = proxy_.host_addresses(&why);
    if (!own) return {false, why};
    return check_address(policy, host_, port_, address_, *own);
  }

  awaitable<void> serve();
  awaitable<bool> open_upstream();
  awaitable<void> tunnel(beast::flat_buffer& buffer);
  awaitable<bool> exchange(RequestParser& request, beast::flat_buffer& buffer, const std::string& head);
  awaitable<bool> send_request_body(RequestParser& request, beast::flat_buffer& buffer);
  awaitable<bool> receive_response(bool head_request, bool client_keeps);
  template <class Parser>
  awaitable<bool> pass_body(tcp::socket& from, beast::flat_buffer& buffer, Parser& parser, tcp::socket& to,
                            std::uint64_t& counter);
  awaitable<void> reply(unsigned status, std::string_view phrase, std::string_view body);
  awaitable<void> linger();
  awaitable<void> relay(tcp::socket& from, tcp::socket& to, std::uint64_t& counter);
  void finish_upstream();

  std::uint64_t id_;
  Proxy& proxy_;
  tcp::socket client_;
  tcp::socket upstream_;
  tcp::resolver resolver_;
  asio::steady_timer deadline_;
  Phase phase_ = Phase::head;
  bool expired_ = false;
  bool aborted_ = false;
  bool done_ = false;
  bool connected_ = false;    // upstream_ is a connection that was made (and is audited at its end)
  bool half_closed_ = false;  // one direction of the tunnel has ended
  bool body_sent_ = false;    // the request's body has gone to the origin
  bool answered_ = false;     // the origin's final answer has gone to the client
  Host host_;
  std::uint16_t port_ = 0;
  IpAddress address_;
  Clock::time_point connected_at_;
  std::uint64_t bytes_up_ = 0;
  std::uint64_t bytes_down_ = 0;
};

// The authority of a request target ("host:port", "[v6]:port", "host"): host and port.
struct Authority {
  std::optional<Host> host;
  std::optional<std::uint16_t> port;
  bool port_given = false;
};

Authority parse_authority(std::string_view text) {
  Authority out;
  std::string_view host = text, port;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return out;
    host = text.substr(0, close + 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return out;
      port = text.substr(close + 2);
      out.port_given = true;
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    out.port_given = true;
  }
  out.host = parse_host(host);
  if (out.port_given && !port.empty()) out.port = parse_port(port);
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && lower(a) == lower(b);
}

// Hop-by-hop headers, never forwarded (Connection: close is added; Host is taken from the URI).
bool hop_by_hop(std::string_view name, const std::vector<std::string>& connection_tokens) {
  const std::string n = lower(name);
  if (n == "host" || n == "connection" || n == "keep-alive" || n == "upgrade" || n == "te" || n.starts_with("proxy-"))
    return true;
  // Headers the client marked hop-by-hop, except those that frame the body: dropping one of
  // those would make the origin read the bytes that follow differently from the client.
  if (n == "content-length" || n == "transfer-encoding") return false;
  return std::find(connection_tokens.begin(), connection_tokens.end(), n) != connection_tokens.end();
}

// The tokens of a message's Connection headers, lower-cased.
template <class Fields>
std::vector<std::string> connection_tokens(const Fields& fields) {
  std::vector<std::string> tokens;
  for (const auto& f : fields)
    if (iequals(std::string_view(f.name_string().data(), f.name_string().size()), "connection"))
      for (const auto token : text::split(std::string_view(f.value().data(), f.value().size()), ','))
        tokens.push_back(lower(text::trim(token)));
  return tokens;
}

// `fields` without the hop-by-hop ones, as header lines.
template <class Fields>
void append_end_to_end(std::string& out, const Fields& fields) {
  const std::vector<std::string> tokens = connection_tokens(fields);
  for (const auto& f : fields) {
    const std::string_view name(f.name_string().data(), f.name_string().size());
    if (hop_by_hop(name, tokens)) continue;
    fmt::format_to(std::back_inserter(out), "{}: {}\r\n", name, std::string_view(f.value().data(), f.value().size()));
  }
}

std::string text_answer(unsigned status, std::string_view phrase, std::string_view body) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n"
                     "Connection: close\r\n\r\n{}\n",
                     status, phrase, body.size() + 1, body);
}

awaitable<void> Session::serve() {
  // What the client sent beyond the request being served: the start of its next one.
  beast::flat_buffer buffer;
  for (bool first = true;; first = false) {
    phase_ = Phase::head;
    arm(first ? Clock::duration(kHeadTimeout) : Clock::duration(kKeepAliveTimeout));
    RequestParser parser;
    parser.header_limit(kMaxHead);
    parser.body_limit(boost::none);  // bodies pass through, never kept
    auto [ec, n] = co_await bhttp::async_read_header(client_, buffer, parser, kTuple);
    if (aborted_) co_return;
    if (expired_) {
      if (!first && buffer.size() == 0) co_return;  // a kept-alive connection left idle: closed quietly
      co_return co_await reply(400, "Bad Request",
                               fmt::format("ns-hpc: no complete request head within {} s",
                                           std::chrono::duration_cast<std::chrono::seconds>(
                                               first ? Clock::duration(kHeadTimeout) : kKeepAliveTimeout)
                                               .count()));
    }
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset)
      co_return;  // connected and left
    if (ec == bhttp::error::header_limit)
      co_return co_await reply(400, "Bad Request", "ns-hpc: the request head is larger than 16 KiB");
    if (ec)
      co_return co_await reply(400, "Bad Request",
                               fmt::format("ns-hpc: this is not an HTTP proxy request ({})", ec.message()));

    const auto& request = parser.get();
    const std::string_view target(request.target().data(), request.target().size());
    const bool connect = request.method() == bhttp::verb::connect;
    std::string origin_form, authority_text;
    if (connect) {
      authority_text = std::string(target);
    } else {
      const std::string_view scheme = target.substr(0, std::min<std::size_t>(target.size(), 8));
      if (target.starts_with('/'))
        co_return co_await reply(400, "Bad Request",
                                 "ns-hpc: this is a proxy; ask it for an absolute URL (GET http://host/path) or "
                                 "CONNECT host:port (HTTP_PROXY/HTTPS_PROXY point programs at it)");
      if (iequals(scheme, "https://"))
        co_return co_await reply(400, "Bad Request",
                                 "ns-hpc: https:// URLs go through CONNECT (HTTPS_PROXY), not as a plain request");
      if (!iequals(target.substr(0, std::min<std::size_t>(target.size(), 7)), "http://"))
        co_return co_await reply(400, "Bad Request",
                                 "ns-hpc: the request target is neither http://... nor CONNECT host:port");
      const std::string_view rest = target.substr(7);
      const auto path_at = rest.find_first_of("/?#");
      authority_text = std::string(rest.substr(0, path_at));
      origin_form = path_at == std::string_view::npos ? "/" : std::string(rest.substr(path_at));
      if (origin_form.starts_with('?')) origin_form.insert(0, "/");
      if (origin_form.starts_with('#'))
        co_return co_await reply(400, "Bad Request", "ns-hpc: a request target may not hold a #fragment");
    }
    if (authority_text.find('@') != std::string::npos)
      co_return co_await reply(400, "Bad Request", "ns-hpc: user info (user@host) in a proxy request is not supported");
    const Authority authority = parse_authority(authority_text);
    if (!authority.host)
      co_return co_await reply(400, "Bad Request",
                               fmt::format("ns-hpc: \"{}\" does not name a valid host", text::sanitize_utf8(authority_text)));
    if (authority.port_given ? !authority.port : connect)
      co_return co_await reply(400, "Bad Request", fmt::format("ns-hpc: \"{}\" needs a port from 1 to 65535",
                                                               text::sanitize_utf8(authority_text)));
    // Every request is judged on its own, a later one on a kept-alive connection as the first.
    host_ = *authority.host;
    port_ = authority.port.value_or(80);
    if (const Verdict v = check_destination(proxy_.policy(), host_, port_); !v.allowed) {
      proxy_.denied(host_, port_, v.reason);
      co_return co_await reply(403, "Forbidden", v.reason);
    }
    if (!co_await open_upstream()) co_return;
    if (connect) co_return co_await tunnel(buffer);

    std::string head = fmt::format("{} {} HTTP/{}.{}\r\nHost: {}\r\n", std::string_view(request.method_string()),
                                   origin_form, request.version() / 10, request.version() % 10, authority_text);
    append_end_to_end(head, request);
    head += "Connection: close\r\n\r\n";
    const bool keep = co_await exchange(parser, buffer, head);
    finish_upstream();
    if (!keep) co_return co_await linger();
  }
}

// CONNECT: the answer, then whatever followed the request head (a TLS ClientHello sent early),
// then bytes both ways. What the bytes say (a ClientHello's server name, a request for another
// host inside) is the origin's business: they reach only the address that was checked.
awaitable<void> Session::tunnel(beast::flat_buffer& buffer) {
  phase_ = Phase::tunnel;
  arm(kIdleTimeout);
  static constexpr std::string_view kEstablished = "HTTP/1.1 200 Connection established\r\n\r\n";
  auto [wec, wn] = co_await asio::async_write(client_, asio::buffer(kEstablished), kTuple);
  if (wec) co_return;
  if (buffer.size() > 0) {
    auto [uec, un] = co_await asio::async_write(upstream_, buffer.data(), kTuple);
    bytes_up_ += un;
    if (uec) co_return;
    buffer.consume(buffer.size());
  }
  using namespace asio::experimental::awaitable_operators;
  co_await (relay(client_, upstream_, bytes_up_) && relay(upstream_, client_, bytes_down_));
}

// A plain request on the origin connection just made: its head, its body as its framing says
// (not a byte more: what follows is the client's next request), and the origin's answer back.
// True when the client connection can carry its next request.
awaitable<bool> Session::exchange(RequestParser& request, beast::flat_buffer& buffer, const std::string& head) {
  phase_ = Phase::tunnel;
  arm(kIdleTimeout);
  body_sent_ = answered_ = false;
  auto [wec, wn] = co_await asio::async_write(upstream_, asio::buffer(head), kTuple);
  bytes_up_ += wn;
  if (wec) co_return false;
  const bool head_request = request.get().method() == bhttp::verb::head;
  const bool client_keeps = request.get().keep_alive();
  using namespace asio::experimental::awaitable_operators;
  const auto [sent, answered] =
      co_await (send_request_body(request, buffer) && receive_response(head_request, client_keeps));
  co_return sent && answered && client_keeps && !aborted_;
}

awaitable<bool> Session::send_request_body(RequestParser& request, beast::flat_buffer& buffer) {
  const bool sent = co_await pass_body(client_, buffer, request, upstream_, bytes_up_);
  body_sent_ = sent;
  // The client ended or broke its body before any answer: the origin cannot answer what it did
  // not get.
  if (!sent && !answered_ && !aborted_) abort();
  co_return sent;
}

// The origin's answer: interim answers (100 Continue) and the final one, each under a head of our
// own (HTTP/1.1, the origin's end-to-end headers, `Connection: close` when the client connection
// ends with it), each body raw as its framing says. True when the client connection goes on.
awaitable<bool> Session::receive_response(bool head_request, bool client_keeps) {
  beast::flat_buffer from_origin;
  bool answered_any = false;
  for (;;) {
    ResponseParser parser;
    parser.header_limit(4 * kMaxHead);
    parser.body_limit(boost::none);
    if (head_request) parser.skip(true);
    auto [ec, n] = co_await bhttp::async_read_header(upstream_, from_origin, parser, kTuple);
    if (aborted_) co_return false;
    if (ec) {
      if (!answered_any) {
        const std::string body = ec == asio::error::eof || ec == bhttp::error::end_of_stream
                                     ? fmt::format("ns-hpc: {} closed the connection without an answer",
                                                   host_port(host_, port_))
                                     : fmt::format("ns-hpc: the answer of {} is not HTTP/1.1 ({})",
                                                   host_port(host_, port_), ec.message());
        const std::string message = text_answer(502, "Bad Gateway", body);
        co_await asio::async_write(client_, asio::buffer(message), kTuple);
      }
      abort();
      co_return false;
    }
    const auto& answer = parser.get();
    const unsigned status = answer.result_int();
    const bool interim = status / 100 == 1 && status != 101;
    // A body that ends with the connection, a client that asked to close, or a 101 (the request
    // never asked to switch protocols: Upgrade is not forwarded), and the client connection ends.
    const bool last = !interim && (parser.need_eof() || !client_keeps || status == 101);
    std::string head = fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(answer.reason()));
    append_end_to_end(head, answer);
    if (last) head += "Connection: close\r\n";
    head += "\r\n";
    auto [wec, wn] = co_await asio::async_write(client_, asio::buffer(head), kTuple);
    bytes_down_ += wn;
    answered_any = true;
    if (wec) co_return false;
    if (status == 101) co_return false;
    if (!co_await pass_body(upstream_, from_origin, parser, client_, bytes_down_)) co_return false;
    if (interim) continue;
    answered_ = true;
    if (!body_sent_) {
      // The origin answered before it had the whole body (a refusal, a redirect): the rest of
      // the body is never read, so the client connection cannot carry another request.
      boost::system::error_code ignored;
      client_.cancel(ignored);
      upstream_.close(ignored);
      co_return false;
    }
    co_return !last;
  }
}

// Moves the body `parser` frames from `from` to `to`, raw, starting with what `buffer` holds;
// leaves in `buffer` what follows it. A body that ends with the connection (an answer without
// a length) ends at `from`'s end. False when it did not arrive whole.
template <class Parser>
awaitable<bool> Session::pass_body(tcp::socket& from, beast::flat_buffer& buffer, Parser& parser, tcp::socket& to,
                                   std::uint64_t& counter) {
  parser.eager(true);
  while (!parser.is_done()) {
    boost::system::error_code ec = bhttp::error::need_more;
    std::size_t used = 0;
    if (buffer.size() > 0) used = parser.put(buffer.data(), ec);
    if (used > 0) {
      auto [wec, wn] = co_await asio::async_write(to, asio::buffer(buffer.data().data(), used), kTuple);
      counter += wn;
      buffer.consume(used);
      if (wec) co_return false;
      arm(kIdleTimeout);
    }
    if (!ec || (ec == bhttp::error::need_more && used > 0)) continue;
    if (ec != bhttp::error::need_more) co_return false;
    auto [rec, rn] = co_await from.async_read_some(buffer.prepare(16 * 1024), kTuple);
    buffer.commit(rn);
    if (rn > 0) continue;
    if (rec == asio::error::eof) {
      boost::system::error_code end;
      parser.put_eof(end);
      co_return !end;
    }
    co_return false;
  }
  co_return true;
}

// Resolves host_ (or takes the override, or the literal) once, keeps the addresses the policy
// allows and connects to the first that answers: the address checked is the address connected
// to, whatever the name resolves to a moment later. On failure the client has its answer: false.
awaitable<bool> Session::open_upstream() {
  phase_ = Phase::connect;
  arm(kConnectTimeout);
  std::vector<IpAddress> candidates;
  if (host_.address) {
    candidates.push_back(*host_.address);
  } else if (const auto it = proxy_.policy().resolve.find(host_.name); it != proxy_.policy().resolve.end()) {
    candidates = it->second;
  } else {
    auto [ec, results] = co_await resolver_.async_resolve(host_.name, std::to_string(port_),
                                                         tcp::resolver::numeric_service, kTuple);
    if (aborted_) co_return false;
    if (expired_) {
      co_await reply(504, "Gateway Timeout", fmt::format("ns-hpc: resolving {} took longer than 10 s", host_.name));
      co_return false;
    }
    if (ec) {
      co_await reply(502, "Bad Gateway", fmt::format("ns-hpc: {} could not be resolved: {}", host_.name, ec.message()));
      co_return false;
    }
    for (const auto& r : results) {
      const IpAddress a = unmap(r.endpoint().address());
      if (std::find(candidates.begin(), candidates.end(), a) == candidates.end()) candidates.push_back(a);
    }
  }
  std::string why;
  const std::vector<IpAddress>* own = proxy_.host_addresses(&why);
  if (!own) {
    co_await reply(503, "Service Unavailable", why);
    co_return false;
  }
  std::vector<IpAddress> acceptable;
  std::string refusal;
  for (const auto& a : candidates) {
    const Verdict v = check_address(proxy_.policy(), host_, port_, a, *own);
    if (v.allowed)
      acceptable.push_back(unmap(a));
    else if (refusal.empty())
      refusal = v.reason;
  }
  if (acceptable.empty()) {
    if (refusal.empty()) refusal = fmt::format("ns-hpc: {} resolved to no address", host_.shown());
    proxy_.denied(host_, port_, refusal);
    co_await reply(403, "Forbidden", refusal);
    co_return false;
  }
  boost::system::error_code last;
  bool made = false;
  for (const auto& a : acceptable) {
    boost::system::error_code ignored;
    upstream_.close(ignored);
    auto [ec] = co_await upstream_.async_connect(tcp::endpoint(a, port_), kTuple);
    if (aborted_) co_return false;
    if (expired_) {
      co_await reply(504, "Gateway Timeout",
                     fmt::format("ns-hpc: connecting to {} ({}) took longer than 10 s", host_port(host_, port_),
                                 a.to_string()));
      co_return false;
    }
    if (!ec) {
      address_ = a;
      made = true;
      break;
    }
    last = ec;
  }
  if (!made) {
    co_await reply(502, "Bad Gateway",
                   fmt::format("ns-hpc: cannot connect to {} ({}): {}", host_port(host_, port_),
                               acceptable.back().to_string(), last.message()));
    co_return false;
  }
  // The policy, or the host's addresses, may have changed while this connection was being made
  // (a reload and an address change check only the connections already made).
  if (const Verdict v = verdict_on_connection(proxy_.policy()); !v.allowed) {
    proxy_.denied(host_, port_, v.reason);
    co_await reply(403, "Forbidden", v.reason);
    co_return false;
  }
  connected_ = true;
  connected_at_ = Clock::now();
  deadline_.expires_at(Clock::time_point::max());
  co_return true;
}

// The connection to the origin has served its request (or tunnel): audited, closed.
void Session::finish_upstream() {
  boost::system::error_code ignored;
  upstream_.close(ignored);
  if (!connected_) return;
  connected_ = false;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - connected_at_);
  proxy_.audit("network.allowed", {{"host", host_.address ? address_.to_string() : host_.name},
                                   {"port", port_},
                                   {"address", address_.to_string()},
                                   {"bytes_up", bytes_up_},
                                   {"bytes_down", bytes_down_},
                                   {"duration_ms", ms.count()}});
  bytes_up_ = bytes_down_ = 0;
}

// Answers with a short text and closes (lingering).
awaitable<void> Session::reply(unsigned status, std::string_view phrase, std::string_view body) {
  phase_ = Phase::reply;
  arm(kReplyTimeout);
  boost::system::error_code ignored;
  upstream_.close(ignored);
  const std::string message = text_answer(status, phrase, body);
  auto [ec, n] = co_await asio::async_write(client_, asio::buffer(message), kTuple);
  if (ec) co_return;
  co_await linger();
}

// A lingering close: the end of what was sent, then what the client still sends is read and
// dropped (closing with unread data would reset the connection, and the client could lose the
// last answer).
awaitable<void> Session::linger() {
  phase_ = Phase::reply;
  arm(kReplyTimeout);
  boost::system::error_code ignored;
  client_.shutdown(tcp::socket::shutdown_send, ignored);
  std::array<char, 4096> sink;
  for (std::size_t drained = 0; drained < 256 * 1024;) {
    auto [rec, rn] = co_await client_.async_read_some(asio::buffer(sink), kTuple);
    if (rec) break;
    drained += rn;
  }
}

// Copies one direction until its end; an end is passed on as a half-close, so the other
// direction can still finish (within kHalfClosedTimeout of its last byte). An error ends both.
awaitable<void> Session::relay(tcp::socket& from, tcp::socket& to, std::uint64_t& counter) {
  std::array<char, 16 * 1024> chunk;
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(chunk), kTuple);
    if (n > 0) {
      arm(half_closed_ ? Clock::duration(kHalfClosedTimeout) : Clock::duration(kIdleTimeout));
      auto [wec, wn] = co_await asio::async_write(to, asio::buffer(chunk.data(), n), kTuple);
      counter += wn;
      if (wec) {
        abort();
        co_return;
      }
    }
    if (ec) {
      boost::system::error_code ignored;
      if (ec != asio::error::eof) {
        abort();
      } else {
        to.shutdown(tcp::socket::shutdown_send, ignored);
        if (!std::exchange(half_closed_, true)) arm(kHalfClosedTimeout);
      }
      co_return;
    }
  }
}

void Proxy::start(UniqueFd watched, UniqueFd folder) {
  asio::co_spawn(io_, accept_loop(), asio::detached);
  asio::co_spawn(io_, signal_loop(), asio::detached);
  if (watched) {
    watch_.assign(watched.release());
    asio::co_spawn(io_, watch_loop(), asio::detached);
  }
  if (folder) {
    folder_ = std::move(folder);
    asio::co_spawn(io_, folder_loop(), asio::detached);
  }
  if (address_watch_) {
    address_events_.assign(::fcntl(address_watch_->fd(), F_DUPFD_CLOEXEC, 3));
    asio::co_spawn(io_, addresses_loop(), asio::detached);
  }
}

const std::vector<IpAddress>* Proxy::host_addresses(std::string* why) {
  // Without a watch every check reads them; with one, only after the kernel said they changed.
  const bool changed = address_watch_ ? address_watch_->changed() : true;
  if (!changed && host_addresses_read_) return &host_addresses_;
  try {
    host_addresses_ = parse_addresses(network::host_addresses());
  } catch (const std::exception& e) {
    host_addresses_read_ = false;
    if (why)
      *why = fmt::format("ns-hpc: this host's own addresses cannot be read ({}), so no connection is made (they "
                         "are refused); try again",
                         e.what());
    return nullptr;
  }
  const bool first = !host_addresses_read_;
  host_addresses_read_ = true;
  // Connections already made to an address that is the host's now are closed (after this check).
  if (changed && !first) asio::post(io_, [this] { recheck_sessions("a change of the host's addresses"); });
  return &host_addresses_;
}

// Wakes up when the kernel announces an address change, so that open connections to a new
// address of the host are closed without waiting for the next request.
awaitable<void> Proxy::addresses_loop() {
  while (!stopping_) {
    auto [ec] = co_await address_events_.async_wait(asio::posix::stream_descriptor::wait_read, kTuple);
    if (ec || stopping_) break;
    host_addresses(nullptr);
  }
}

void Proxy::recheck_sessions(std::string_view by) {
  std::vector<std::shared_ptr<Session>> open;
  for (const auto& [id, weak] : sessions_)
    if (auto s = weak.lock()) open.push_back(std::move(s));
  for (const auto& s : open) s->recheck(*policy_, by);
}

awaitable<void> Proxy::accept_loop() {
  while (!stopping_) {
    auto [ec, socket] = co_await acceptor_.async_accept(kTuple);
    if (stopping_) break;
    if (ec) {
      // Out of descriptors, or a connection reset before it was taken: wait a little, go on.
      asio::steady_timer pause(io_, std::chrono::milliseconds(100));
      co_await pause.async_wait(kTuple);
      continue;
    }
    if (sessions_.size() >= kMaxConnections) {
      // Answered without a session of its own (best effort: a fresh socket takes these bytes).
      static const std::string busy = [] {
        const std::string body = fmt::format(
            "ns-hpc: this instance's network proxy already has {} connections open; try again later\n", kMaxConnections);
        return fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                           "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                           body.size(), body);
      }();
      ::send(socket.native_handle(), busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      boost::system::error_code ignored;
      socket.shutdown(tcp::socket::shutdown_send, ignored);
      continue;
    }
    auto session = std::make_shared<Session>(*this, std::move(socket), next_id_++);
    sessions_[session->id()] = session;
    session->start();
  }
}

awaitable<void> Proxy::signal_loop() {
  while (!stopping_) {
    auto [ec, signal] = co_await signals_.async_wait(kTuple);
    if (ec) break;
    if (signal == SIGHUP)
      reload();
    else
      stop(signal == SIGTERM ? "SIGTERM" : "SIGINT");
  }
}

awaitable<void> Proxy::watch_loop() {
  auto [ec] = co_await watch_.async_wait(asio::posix::stream_descriptor::wait_read, kTuple);
  if (!ec) stop(fmt::format("process {} ended", options_.watch_pid));
}

awaitable<void> Proxy::folder_loop() {
  while (!stopping_) {
    folder_timer_.expires_after(fs::kRemovedCheck);
    auto [ec] = co_await folder_timer_.async_wait(kTuple);
    if (ec || stopping_) break;
    if (fs::removed(folder_.get())) stop("the instance's state folder was removed");
  }
}

void Proxy::reload() {
  try {
    policy_ = std::make_shared<const Policy>(load_policy(options_.policy_file));
  } catch (const std::exception& e) {
    say(fmt::format("the policy was not reloaded, the previous one stays in force: {}", e.what()));
    return;
  }
  recheck_sessions("a new policy");
}

void Proxy::stop(std::string_view why) {
  if (stopping_) return;
  stopping_ = true;
  say(fmt::format("stopping: {}", why));
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  signals_.cancel(ignored);
  watch_.close(ignored);
  folder_timer_.cancel();
  address_events_.close(ignored);
  std::vector<std::shared_ptr<Session>> open;
  for (const auto& [id, weak] : sessions_)
    if (auto s = weak.lock()) open.push_back(std::move(s));
  for (const auto& s : open) s->abort();
  suppressed_timer_.cancel();
  flush_suppressed();
  // The connections write their network.allowed lines as they unwind; then the loop runs dry.
  // A name being resolved cannot be interrupted (getaddrinfo): the grace bounds the wait.
  asio::co_spawn(
      io_,
      [this]() -> awaitable<void> {
        const auto until = Clock::now() + kStopGrace;
        asio::steady_timer tick(io_);
        while (!sessions_.empty() && Clock::now() < until) {
          tick.expires_after(std::chrono::milliseconds(20));
          co_await tick.async_wait(kTuple);
        }
        io_.stop();
      },
      asio::detached);
}

void Proxy::audit(std::string_view event, nlohmann::json fields) {
  try {
    audit::append(options_.audit_file, event, "network", std::move(fields), options_.audit_rotation);
  } catch (const std::exception& e) {
    say(fmt::format("cannot write the audit log: {}", e.what()));
  }
}

void Proxy::denied(const Host& host, std::uint16_t port, const std::string& reason) {
  const auto now = Clock::now();
  if (limiter_.admit(now)) {
    audit("network.denied",
          {{"host", host.address ? host.address->to_string() : host.name}, {"port", port}, {"reason", reason}});
    return;
  }
  arm_suppressed_timer();
}

void Proxy::arm_suppressed_timer() {
  const auto end = limiter_.window_end();
  if (!end || suppressed_timer_.expiry() == *end) return;
  suppressed_timer_.expires_at(*end);
  suppressed_timer_.async_wait([this, end = *end](const boost::system::error_code& ec) {
    if (!ec && limiter_.window_end() == end) flush_suppressed();
  });
}

void Proxy::flush_suppressed() {
  if (const int n = limiter_.close_window(); n > 0) audit("network.denied_suppressed", {{"count", n}});
}

// Descriptor 3 as a listening TCP socket; throws UsageError when it is not one.
tcp::acceptor listening_socket(asio::io_context& io) {
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  sockaddr_storage addr{};
  socklen_t addr_len = sizeof addr;
  const bool ok = ::getsockopt(kListenFd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
                  (len = sizeof listening, ::getsockopt(kListenFd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0) &&
                  listening == 1 && ::getsockname(kListenFd, reinterpret_cast<sockaddr*>(&addr), &addr_len) == 0 &&
                  (addr.ss_family == AF_INET || addr.ss_family == AF_INET6);
  if (!ok)
    throw UsageError(
        "descriptor 3 is not a listening TCP socket; this command is started by the ns-hpc server, which passes "
        "the socket it listens on inside the sandbox's network namespace");
  ::fcntl(kListenFd, F_SETFD, FD_CLOEXEC);
  tcp::acceptor acceptor(io);
  acceptor.assign(addr.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), kListenFd);
  return acceptor;
}

}  // namespace

int proxy_main(int argc, char** argv) {
  // A SIGHUP before the signal set below is in place would end the process; the policy is read
  // after this anyway, so one sent that early has nothing to reload.
  ::signal(SIGHUP, SIG_IGN);
  // Nothing may attach to it or read its memory (it holds the host's network for the sandbox).
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  ::signal(SIGPIPE, SIG_IGN);
  // Two descriptors a connection: take what the hard limit allows, up to a little over the cap.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < 4096) {
    nofile.rlim_cur = std::min<rlim_t>(4096, nofile.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  asio::io_context io(1);
  ProxyOptions options;
  Policy policy;
  UniqueFd watched, folder;
  std::optional<tcp::acceptor> acceptor;
  try {
    options = parse_proxy_argv(std::vector<std::string>(argv, argv + argc));
    policy = load_policy(options.policy_file);
    folder = fs::open_dir_path(std::filesystem::absolute(options.policy_file).parent_path());
    UniqueFd log(::open(options.audit_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!log) throw SysError(errno, "open the audit log", options.audit_file);
    acceptor.emplace(listening_socket(io));
    if (options.watch_pid > 0) {
      int err = 0;
      watched = open_pidfd(options.watch_pid, &err);
      if (!watched && err == ESRCH) {
        say(fmt::format("process {} has ended already; nothing to serve", options.watch_pid));
        return 0;
      }
      if (!watched) throw SysError(err, "pidfd_open of the process to watch", std::to_string(options.watch_pid));
    }
    // What a sandbox sends is parsed here: no capability of root's (its own files stay its own).
    users::drop_capabilities();
  } catch (const std::exception& e) {
    say(fmt::format("{}\nusage: ns-hpc {} --policy FILE --audit FILE [--watch-pid PID], with a listening socket on "
                    "descriptor 3 (started by the ns-hpc server)",
                    e.what(), kProxyCommand));
    return 2;
  }
  // The host's addresses are followed from before the first connection is taken (without the
  // subscription they are read again for every check).
  std::optional<HostAddressWatch> address_watch;
  try {
    address_watch.emplace();
  } catch (const std::exception& e) {
    say(fmt::format("the host's addresses are read for every connection: {}", e.what()));
  }
  Proxy proxy(io, std::move(options), std::move(policy), std::move(*acceptor), std::move(address_watch));
  proxy.start(std::move(watched), std::move(folder));
  io.run();
  std::fflush(stderr);
  // A resolver thread may still be inside getaddrinfo, which nothing can interrupt; the io_context's
  // destructor would join it. Everything worth keeping (audit lines) is written: end here.
  ::_exit(0);
}

}  // namespace nshpc::network
