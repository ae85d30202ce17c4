// The network proxy's pure decisions (network/proxy.hpp): allow entries, hosts, the forbidden
// address classes, the policy file's errors, the audit's rate limit, the process's arguments.
#include <gtest/gtest.h>

#include <fstream>

#include "base/error.hpp"
#include "common/temp_dir.hpp"
#include "config/config.hpp"
#include "network/proxy.hpp"
#include "sandbox/network.hpp"

namespace nshpc::network {
namespace {

IpAddress ip(const char* text) { return boost::asio::ip::make_address(text); }

AllowEntry entry(const char* text) {
  std::string why;
  auto e = parse_allow_entry(text, &why);
  EXPECT_TRUE(e) << text << ": " << why;
  return e.value_or(AllowEntry{});
}

std::string entry_error(const char* text) {
  std::string why;
  EXPECT_FALSE(parse_allow_entry(text, &why)) << text;
  return why;
}

Policy policy_of(std::initializer_list<const char*> allow, Mode mode = Mode::filtered,
                 std::initializer_list<const char*> instance_allow = {}) {
  Policy p;
  p.mode = mode;
  for (const char* a : allow) p.allow.push_back(entry(a));
  for (const char* a : instance_allow) {
    p.allow.push_back(entry(a));
    p.allow.back().instance = true;
  }
  return p;
}

Host host(const char* text) {
  auto h = parse_host(text);
  EXPECT_TRUE(h) << text;
  return h.value_or(Host{});
}

bool allowed(const Policy& p, const char* h, std::uint16_t port) { return check_destination(p, host(h), port).allowed; }

// The host's own addresses as a test host has them (besides loopback): a "public" one, as the
// TEST-NET address of the machine the issue was found on, and a private IPv6 one.
const std::vector<IpAddress> kHostAddresses = {boost::asio::ip::make_address("192.0.2.2"),
                                               boost::asio::ip::make_address("fd00::2")};

bool reachable(const Policy& p, const char* h, std::uint16_t port, const char* address) {
  return check_address(p, host(h), port, ip(address), kHostAddresses).allowed;
}

TEST(NetworkAllowEntry, ParsesNamesSubdomainsAddressesAndPorts) {
  const auto name = entry("Example.COM.");
  EXPECT_EQ(name.kind, AllowEntry::Kind::name);
  EXPECT_EQ(name.name, "example.com");
  EXPECT_FALSE(name.port);

  const auto sub = entry("*.example.org:8443");
  EXPECT_EQ(sub.kind, AllowEntry::Kind::subdomains);
  EXPECT_EQ(sub.name, "example.org");
  EXPECT_EQ(sub.port, 8443);

  const auto v4 = entry("10.1.2.3:8080");
  EXPECT_EQ(v4.kind, AllowEntry::Kind::address);
  EXPECT_EQ(v4.address, ip("10.1.2.3"));
  EXPECT_EQ(v4.port, 8080);

  const auto v6 = entry("[fd00::1]:443");
  EXPECT_EQ(v6.kind, AllowEntry::Kind::address);
  EXPECT_EQ(v6.address, ip("fd00::1"));
  EXPECT_EQ(v6.port, 443);

  EXPECT_EQ(entry("fd00::1").address, ip("fd00::1"));
  EXPECT_FALSE(entry("[::1]").port);
  // A mapped address is the IPv4 address it maps.
  EXPECT_EQ(entry("[::ffff:127.0.0.1]:80").address, ip("127.0.0.1"));
}

TEST(NetworkAllowEntry, RefusesWhatIsNotAnEntry) {
  EXPECT_NE(entry_error("").find("empty"), std::string::npos);
  EXPECT_NE(entry_error("example.com:0").find("port \"0\""), std::string::npos);
  EXPECT_NE(entry_error("example.com:65536").find("1 to 65535"), std::string::npos);
  EXPECT_NE(entry_error("example.com:http").find("port"), std::string::npos);
  EXPECT_NE(entry_error("ex*mple.com").find("'*'"), std::string::npos);
  EXPECT_NE(entry_error("*").find("'*'"), std::string::npos);
  EXPECT_NE(entry_error("*.*.example.com").find("after '*.'"), std::string::npos);
  EXPECT_NE(entry_error("[fd00::1").find("']'"), std::string::npos);
  EXPECT_NE(entry_error("[10.0.0.1]:80").find("IPv6"), std::string::npos);
  EXPECT_NE(entry_error("[::1]443").find("':port'"), std::string::npos);
  EXPECT_NE(entry_error("fe80::1%eth0").find("IPv6"), std::string::npos);
  EXPECT_NE(entry_error("bad host.com").find("not a valid host name"), std::string::npos);
  EXPECT_NE(entry_error("a..b").find("not a valid host name"), std::string::npos);
  // Forms a resolver would read as an address are neither names nor addresses.
  EXPECT_NE(entry_error("127.1").find("not a valid host name"), std::string::npos);
  EXPECT_NE(entry_error("2130706433").find("not a valid host name"), std::string::npos);
  EXPECT_NE(entry_error("0x7f000001").find("not a valid host name"), std::string::npos);
  EXPECT_NE(entry_error(("x." + std::string(64, 'a') + ".com").c_str()).find("not a valid host name"),
            std::string::npos);
}

TEST(NetworkAllowEntry, MatchesNamesCaseInsensitivelyOnTheirPorts) {
  const Policy p = policy_of({"example.com", "*.example.org", "api.test:8443"});
  EXPECT_TRUE(allowed(p, "example.com", 443));
  EXPECT_TRUE(allowed(p, "EXAMPLE.com.", 80));
  EXPECT_FALSE(allowed(p, "example.com", 8080));  // no port: 80 and 443 only
  EXPECT_FALSE(allowed(p, "www.example.com", 443));
  EXPECT_FALSE(allowed(p, "badexample.com", 443));

  EXPECT_TRUE(allowed(p, "a.example.org", 443));
  EXPECT_TRUE(allowed(p, "a.b.example.org", 80));
  EXPECT_FALSE(allowed(p, "example.org", 443));  // the domain itself is not a subdomain
  EXPECT_FALSE(allowed(p, "aexample.org", 443));

  EXPECT_TRUE(allowed(p, "api.test", 8443));
  EXPECT_FALSE(allowed(p, "api.test", 443));

  const Verdict v = check_destination(p, host("other.test"), 443);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason,
            "ns-hpc: other.test:443 is not in this instance's network allow list: add \"other.test\" to it with "
            "update_instance network_allow (the instance's whole list), or ask the server's operator to add it to "
            "[network] allow in ns-hpc's config");
  // Another port: the entry names it.
  EXPECT_NE(check_destination(p, host("other.test"), 8443).reason.find("add \"other.test:8443\" to it with update_instance"),
            std::string::npos);
}

TEST(NetworkAllowEntry, AddressLiteralsNeedAnAddressEntry) {
  const Policy p = policy_of({"10.1.2.3:8080", "[fd00::1]:443", "192.168.1.1", "example.com"});
  EXPECT_TRUE(allowed(p, "10.1.2.3", 8080));
  EXPECT_FALSE(allowed(p, "10.1.2.3", 80));
  EXPECT_TRUE(allowed(p, "[fd00::1]", 443));
  EXPECT_TRUE(allowed(p, "192.168.1.1", 443));
  EXPECT_FALSE(allowed(p, "192.168.1.1", 22));
  EXPECT_TRUE(allowed(p, "[::ffff:10.1.2.3]", 8080));  // the same destination, mapped
  EXPECT_FALSE(allowed(p, "93.184.216.34", 443));      // a public address not in the list
}

TEST(NetworkAllowEntry, ModeOffRefusesEverything) {
  const Policy p = policy_of({"example.com", "127.0.0.1:80"}, Mode::off);
  const Verdict v = check_destination(p, host("example.com"), 443);
  EXPECT_FALSE(v.allowed);
  EXPECT_NE(v.reason.find("network mode \"off\""), std::string::npos);
  EXPECT_FALSE(allowed(p, "127.0.0.1", 80));
  EXPECT_FALSE(check_address(p, host("example.com"), 443, ip("93.184.216.34"), {}).allowed);
}

TEST(NetworkHost, ParsesNamesAndLiterals) {
  EXPECT_EQ(host("Allowed.Test.").name, "allowed.test");
  EXPECT_EQ(host("127.0.0.1").address, ip("127.0.0.1"));
  EXPECT_EQ(host("[::1]").address, ip("::1"));
  EXPECT_EQ(host("[::1]").shown(), "[::1]");
  EXPECT_EQ(host("[::ffff:127.0.0.1]").address, ip("127.0.0.1"));
  EXPECT_FALSE(parse_host("::1"));  // IPv6 only in brackets
  EXPECT_FALSE(parse_host("[10.0.0.1]"));
  EXPECT_FALSE(parse_host("127.1"));
  EXPECT_FALSE(parse_host("0x7f000001"));  // inet_aton reads it as 127.0.0.1
  EXPECT_FALSE(parse_host("0x7f.1"));
  EXPECT_TRUE(parse_host("0x7f.example"));
}

TEST(NetworkAddressClass, ClassifiesIPv4) {
  EXPECT_EQ(classify(ip("127.0.0.1")), AddressClass::loopback);
  EXPECT_EQ(classify(ip("127.255.0.9")), AddressClass::loopback);
  EXPECT_EQ(classify(ip("0.0.0.0")), AddressClass::unspecified);
  EXPECT_EQ(classify(ip("0.1.2.3")), AddressClass::unspecified);
  EXPECT_EQ(classify(ip("169.254.169.254")), AddressClass::metadata);
  EXPECT_EQ(classify(ip("169.254.1.1")), AddressClass::link_local);
  EXPECT_EQ(classify(ip("10.0.0.1")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("172.16.0.1")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("172.31.255.255")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("172.32.0.1")), AddressClass::none);
  EXPECT_EQ(classify(ip("192.168.0.1")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("100.64.0.1")), AddressClass::cgnat);
  EXPECT_EQ(classify(ip("100.127.255.255")), AddressClass::cgnat);
  EXPECT_EQ(classify(ip("100.128.0.1")), AddressClass::none);
  EXPECT_EQ(classify(ip("224.0.0.1")), AddressClass::multicast);
  EXPECT_EQ(classify(ip("239.255.255.250")), AddressClass::multicast);
  EXPECT_EQ(classify(ip("255.255.255.255")), AddressClass::broadcast);
  EXPECT_EQ(classify(ip("93.184.216.34")), AddressClass::none);
  EXPECT_EQ(classify(ip("8.8.8.8")), AddressClass::none);
}

TEST(NetworkAddressClass, ClassifiesIPv6AndMappedForms) {
  EXPECT_EQ(classify(ip("::1")), AddressClass::loopback);
  EXPECT_EQ(classify(ip("::")), AddressClass::unspecified);
  EXPECT_EQ(classify(ip("fe80::1")), AddressClass::link_local);
  EXPECT_EQ(classify(ip("febf::1")), AddressClass::link_local);
  EXPECT_EQ(classify(ip("fd00:ec2::254")), AddressClass::metadata);
  EXPECT_EQ(classify(ip("fd00::1")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("fc00::1")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("ff02::1")), AddressClass::multicast);
  EXPECT_EQ(classify(ip("2606:2800:220:1::1")), AddressClass::none);
  // IPv4-mapped, NAT64 and 6to4 forms are judged as the IPv4 address inside.
  EXPECT_EQ(classify(ip("::ffff:127.0.0.1")), AddressClass::loopback);
  EXPECT_EQ(classify(ip("::ffff:169.254.169.254")), AddressClass::metadata);
  EXPECT_EQ(classify(ip("::ffff:10.0.0.1")), AddressClass::private_net);
  EXPECT_EQ(classify(ip("::ffff:8.8.8.8")), AddressClass::none);
  EXPECT_EQ(classify(ip("64:ff9b::7f00:1")), AddressClass::loopback);
  EXPECT_EQ(classify(ip("2002:a9fe:a9fe::")), AddressClass::metadata);
}

TEST(NetworkAddressClass, ForbiddenAddressesPassOnlyWhenListed) {
  const Policy p = policy_of({"allowed.test:8080", "10.1.2.3:8080", "fd00::1", "localhost"});
  const Host h = host("allowed.test");
  EXPECT_TRUE(check_address(p, h, 8080, ip("10.1.2.3"), kHostAddresses).allowed);
  EXPECT_TRUE(check_address(p, h, 8080, ip("::ffff:10.1.2.3"), kHostAddresses).allowed);
  EXPECT_TRUE(check_address(p, h, 8080, ip("93.184.216.34"), kHostAddresses).allowed);
  const Verdict v = check_address(p, h, 8080, ip("10.1.2.4"), kHostAddresses);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason,
            "ns-hpc: allowed.test:8080 resolved to 10.1.2.4, a private address, which is refused unless that address "
            "is itself in the network allow list (e.g. 10.1.2.4:8080)");
  EXPECT_FALSE(check_address(p, h, 8080, ip("::ffff:169.254.169.254"), kHostAddresses).allowed);
  // A portless address entry: ports 80 and 443, as every entry without a port.
  EXPECT_TRUE(check_address(p, h, 443, ip("fd00::1"), kHostAddresses).allowed);
  EXPECT_FALSE(check_address(p, h, 8080, ip("fd00::1"), kHostAddresses).allowed);
  // A listed name gives no pass to a forbidden address.
  EXPECT_FALSE(check_address(p, host("localhost"), 443, ip("127.0.0.1"), kHostAddresses).allowed);
}

// The host itself: its loopback, the unspecified address and every address of its interfaces,
// the "public" ones included, whatever name leads there. Only an address entry of the server's
// configuration opens one; an instance's own entries (network_allow, written by an agent) never.
TEST(NetworkHostAddresses, AreRefusedUnlessTheConfigurationListsTheAddress) {
  const Policy named = policy_of({"allowed.test:8080", "*.allowed.test", "allowed.test"});
  const Verdict v = check_address(named, host("allowed.test"), 8080, ip("192.0.2.2"), kHostAddresses);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason,
            "ns-hpc: allowed.test:8080 resolved to 192.0.2.2, an address of this host itself, which is refused "
            "unless ns-hpc's own configuration lists that address ([network] allow, e.g. 192.0.2.2:8080); an "
            "instance's network_allow cannot open the host's addresses");
  EXPECT_EQ(classify(ip("192.0.2.2")), AddressClass::none);  // public by its range: refused as the host's
  EXPECT_FALSE(reachable(named, "x.allowed.test", 443, "192.0.2.2"));
  EXPECT_FALSE(reachable(named, "allowed.test", 443, "::ffff:192.0.2.2"));  // mapped: the same address
  EXPECT_FALSE(reachable(named, "allowed.test", 443, "fd00::2"));
  EXPECT_FALSE(reachable(named, "allowed.test", 443, "0.0.0.0"));
  EXPECT_FALSE(reachable(named, "allowed.test", 443, "::"));
  EXPECT_NE(check_address(named, host("allowed.test"), 443, ip("0.0.0.0"), kHostAddresses).reason.find(
                "the unspecified address (this host)"),
            std::string::npos);
  EXPECT_NE(check_address(named, host("allowed.test"), 443, ip("127.0.0.1"), kHostAddresses).reason.find(
                "a loopback address of this host"),
            std::string::npos);
  EXPECT_TRUE(reachable(named, "allowed.test", 443, "192.0.2.3"));  // a neighbour is not the host

  // An instance's own entries: the addresses, loopback included, and the names stay refused.
  const Policy added = policy_of({}, Mode::filtered,
                                 {"192.0.2.2:8080", "127.0.0.1:8080", "[fd00::2]:8080", "0.0.0.0:8080", "self.test:8080",
                                  "10.1.2.3:8080"});
  for (const char* address : {"192.0.2.2", "127.0.0.1", "fd00::2", "0.0.0.0"}) {
    const Host literal = address == std::string("fd00::2") ? host("[fd00::2]") : host(address);
    EXPECT_TRUE(check_destination(added, literal, 8080).allowed) << address;  // listed...
    EXPECT_FALSE(check_address(added, literal, 8080, ip(address), kHostAddresses).allowed) << address;  // ...refused
  }
  EXPECT_FALSE(reachable(added, "self.test", 8080, "192.0.2.2"));
  EXPECT_TRUE(reachable(added, "10.1.2.3", 8080, "10.1.2.3"));  // a private address it lists is its to reach

  // The server's configuration may list one (a service of the host given to sandboxes on purpose).
  const Policy configured = policy_of({"192.0.2.2:8080", "127.0.0.1:5432", "svc.test:8080"});
  EXPECT_TRUE(reachable(configured, "192.0.2.2", 8080, "192.0.2.2"));
  EXPECT_TRUE(reachable(configured, "svc.test", 8080, "192.0.2.2"));
  EXPECT_FALSE(reachable(configured, "192.0.2.2", 8081, "192.0.2.2"));  // that port only
  EXPECT_TRUE(reachable(configured, "127.0.0.1", 5432, "127.0.0.1"));
  EXPECT_FALSE(reachable(configured, "svc.test", 8080, "127.0.0.2"));
  // An address that stops being the host's is judged by its range again.
  EXPECT_TRUE(check_address(named, host("allowed.test"), 8080, ip("192.0.2.2"), {}).allowed);
}

TEST(NetworkHostAddresses, ParsesTheHostsList) {
  EXPECT_EQ(parse_addresses({"192.0.2.2", "fd00::2", "::ffff:10.0.0.1", "not an address", "fe80::1%eth0"}),
            (std::vector<IpAddress>{ip("192.0.2.2"), ip("fd00::2"), ip("10.0.0.1")}));
}

TEST(NetworkPolicy, ParsesTheFile) {
  const Policy p = parse_policy(R"({"mode": "filtered", "allow": ["allowed.test:8080", "127.0.0.1:8080"],
                                    "resolve": {"Allowed.Test": ["127.0.0.1", "::ffff:127.0.0.2", "::1"]}})");
  EXPECT_EQ(p.mode, Mode::filtered);
  ASSERT_EQ(p.allow.size(), 2u);
  ASSERT_EQ(p.resolve.count("allowed.test"), 1u);
  EXPECT_EQ(p.resolve.at("allowed.test"), (std::vector<IpAddress>{ip("127.0.0.1"), ip("127.0.0.2"), ip("::1")}));
  EXPECT_EQ(parse_policy(R"({"mode": "off"})").mode, Mode::off);
  // The instance's own additions come marked as such.
  const Policy q = parse_policy(R"({"mode": "filtered", "allow": ["a.test"], "instance_allow": ["b.test", "10.0.0.1"]})");
  ASSERT_EQ(q.allow.size(), 3u);
  EXPECT_FALSE(q.allow[0].instance);
  EXPECT_TRUE(q.allow[1].instance);
  EXPECT_EQ(q.allow[1].name, "b.test");
  EXPECT_TRUE(q.allow[2].instance);
}

std::string policy_error(const char* text) {
  try {
    parse_policy(text);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

TEST(NetworkPolicy, NamesEveryProblem) {
  EXPECT_NE(policy_error("{\"mode\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(policy_error("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(policy_error("{}").find("\"mode\" is missing"), std::string::npos);
  EXPECT_NE(policy_error(R"({"mode": "on"})").find("\"mode\" is \"on\""), std::string::npos);
  EXPECT_NE(policy_error(R"({"mode": "off", "alow": []})").find("unknown key \"alow\""), std::string::npos);
  EXPECT_NE(policy_error(R"({"mode": "off", "allow": "example.com"})").find("\"allow\" is not a list"),
            std::string::npos);
  EXPECT_NE(policy_error(R"({"mode": "off", "resolve": {"a.test": "1.2.3.4"}})").find("not a non-empty list"),
            std::string::npos);
  EXPECT_NE(policy_error(R"({"mode": "off", "resolve": {"1.2.3.4": ["1.2.3.4"]}})").find("is not a host name"),
            std::string::npos);
  // Every problem at once.
  const std::string all =
      policy_error(R"({"mode": "filtered", "allow": ["ok.test", "bad host", 7, "x:99999"],
                       "resolve": {"a.test": ["1.2.3.400"]}})");
  EXPECT_NE(all.find("allow entry \"bad host\""), std::string::npos) << all;
  EXPECT_NE(all.find("allow entry 7 is not a string"), std::string::npos) << all;
  EXPECT_NE(all.find("allow entry \"x:99999\""), std::string::npos) << all;
  EXPECT_NE(all.find("\"1.2.3.400\" is not an IP address"), std::string::npos) << all;
  EXPECT_NE(policy_error(R"({"mode": "off", "instance_allow": ["bad host"]})").find("instance_allow: allow entry"),
            std::string::npos);
}

TEST(NetworkDeniedLimiter, AdmitsTwentyAWindowThenCounts) {
  using Clock = DeniedLimiter::Clock;
  DeniedLimiter limiter(20, std::chrono::minutes(1));
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(limiter.admit(t0 + std::chrono::seconds(i)));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.admit(t0 + std::chrono::seconds(30)));
  EXPECT_EQ(limiter.window_end(), t0 + std::chrono::minutes(1));
  // Past the end, nothing is admitted until the window is closed and its count reported.
  EXPECT_FALSE(limiter.admit(t0 + std::chrono::seconds(61)));
  EXPECT_EQ(limiter.close_window(), 6);
  EXPECT_FALSE(limiter.window_end());
  EXPECT_TRUE(limiter.admit(t0 + std::chrono::seconds(62)));
  // A window without suppressions simply ends.
  EXPECT_TRUE(limiter.admit(t0 + std::chrono::minutes(5)));
  EXPECT_EQ(limiter.window_end(), t0 + std::chrono::minutes(6));
  EXPECT_EQ(limiter.close_window(), 0);
}

TEST(NetworkProxyArgv, ReadsAndRefuses) {
  const auto o = parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p.json", "--audit", "/a.log", "--watch-pid", "42"});
  EXPECT_EQ(o.policy_file, "/p.json");
  EXPECT_EQ(o.audit_file, "/a.log");
  EXPECT_EQ(o.watch_pid, 42);
  EXPECT_EQ(o.audit_rotation.max_bytes, audit::Rotation{}.max_bytes);  // not given: the default
  const auto r = parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p", "--audit", "/a", "--audit-rotation", "1048576,2"});
  EXPECT_EQ(r.audit_rotation.max_bytes, 1048576u);
  EXPECT_EQ(r.audit_rotation.keep, 2);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p", "--audit", "/a", "--audit-rotation", "1M,2"}),
               UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--audit", "/a"}), UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p"}), UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p", "--audit", "/a", "--watch-pid", "x"}),
               UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p", "--audit", "/a", "--watch-pid", "0"}),
               UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p", "--policy", "/q", "--audit", "/a"}),
               UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy", "/p", "--audit", "/a", "--verbose"}), UsageError);
  EXPECT_THROW(parse_proxy_argv({"ns-hpc", "__net-proxy", "--policy"}), UsageError);
}

// What `doctor` reads from a command line to tell whose network helper a process is: the folder
// of the file each helper (and pasta) names; nothing for anything else.
TEST(NetworkHelperFolder, ReadsTheFolderEachHelperNames) {
  using sandbox::network_helper_folder;
  const std::string s = "/srv/i/a/status";
  const std::filesystem::path folder(s);
  EXPECT_EQ(network_helper_folder({"/usr/bin/ns-hpc", "__net-hold", "--idle", "600", "--record",
                                   s + "/network-h/network.holder.pid"}),
            folder / "network-h");
  EXPECT_EQ(network_helper_folder({"ns-hpc", "__net-proxy", "--policy", s + "/network.policy.json", "--audit", "/a"}),
            folder);
  EXPECT_EQ(network_helper_folder({"ns-hpc", "__net-watch", "--watch-pid", "7", "--pasta-pid-file",
                                   s + "/network.pasta.pid"}),
            folder);
  EXPECT_EQ(network_helper_folder({"ns-hpc", "__port-forward", "--port", "80", "--audit", "/a", "--record",
                                   s + "/network.forward.80.pid"}),
            folder);
  EXPECT_EQ(network_helper_folder({"pasta", "--quiet", "--netns", "/proc/self/fd/3", "--pid", s + "/network.pasta.pid"}),
            folder);
  EXPECT_FALSE(network_helper_folder({"ns-hpc", "__keeper", "--status-fd", "3", "--", "bwrap"}));
  EXPECT_FALSE(network_helper_folder({"ns-hpc", "__net-proxy", "--policy", "relative/network.policy.json"}));
  EXPECT_FALSE(network_helper_folder({"sleep", "--record", "/srv/i/a/status/x"}));
  EXPECT_FALSE(network_helper_folder({}));
}

// [network] expose_port_range: "FIRST-LAST", unprivileged ports; anything else is refused with
// the file, line and key.
TEST(NetworkExposePortRange, IsReadAndAMalformedOneIsAConfigError) {
  const nshpc::tests::TempDir dir("nshpc-port-range");
  const auto env = [home = dir.path().string()](std::string_view name) -> std::optional<std::string> {
    if (name == "HOME") return home;
    return std::nullopt;
  };
  EXPECT_EQ(config::built_in(env, false).network.expose_port_range, (config::PortRange{40000, 40999}));
  const auto file = dir.path() / "c.toml";
  const auto with = [&](const std::string& value) {
    std::ofstream(file) << "[network]\nallow = []\nexpose_port_range = " << value << "\n";
    return file;
  };
  EXPECT_EQ(config::check_file(with("\"50000-50009\""), env).config.network.expose_port_range,
            (config::PortRange{50000, 50009}));
  EXPECT_EQ(config::check_file(with("\"50000-50000\""), env).config.network.expose_port_range,
            (config::PortRange{50000, 50000}));
  for (const char* bad : {"\"40999-40000\"", "\"80-90\"", "\"40000\"", "\"40000-70000\"", "\"a-b\"",
                          "\"40000-\"", "\" 40000-40999\"", "40000"}) {
    try {
      config::check_file(with(bad), env);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const config::ConfigError& e) {
      ASSERT_EQ(e.problems().size(), 1u) << bad;
      EXPECT_TRUE(e.problems()[0].starts_with(file.string() + ":3:")) << e.problems()[0];
      EXPECT_NE(e.problems()[0].find("network.expose_port_range"), std::string::npos) << e.problems()[0];
      EXPECT_NE(e.problems()[0].find("FIRST-LAST"), std::string::npos) << e.problems()[0];
    }
  }
}

}  // namespace
}  // namespace nshpc::network
