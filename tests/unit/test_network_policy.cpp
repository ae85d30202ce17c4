// The network proxy's pure decisions (network/proxy.hpp): allow entries, hosts, the forbidden
// address classes, the policy file's errors, the audit's rate limit, the process's arguments.
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "network/proxy.hpp"

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

Policy policy_of(std::initializer_list<const char*> allow, Mode mode = Mode::filtered) {
  Policy p;
  p.mode = mode;
  for (const char* a : allow) p.allow.push_back(entry(a));
  return p;
}

Host host(const char* text) {
  auto h = parse_host(text);
  EXPECT_TRUE(h) << text;
  return h.value_or(Host{});
}

bool allowed(const Policy& p, const char* h, std::uint16_t port) { return check_destination(p, host(h), port).allowed; }

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
            "ns-hpc: other.test:443 is not in this instance's network allow list ([network] allow in ns-hpc's "
            "config)");
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
  EXPECT_FALSE(check_address(p, host("example.com"), 443, ip("93.184.216.34")).allowed);
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
  const Policy p = policy_of({"allowed.test:8080", "127.0.0.1:8080", "fd00::1", "localhost"});
  const Host h = host("allowed.test");
  EXPECT_TRUE(check_address(p, h, 8080, ip("127.0.0.1")).allowed);
  EXPECT_TRUE(check_address(p, h, 8080, ip("::ffff:127.0.0.1")).allowed);
  EXPECT_TRUE(check_address(p, h, 8080, ip("93.184.216.34")).allowed);
  const Verdict v = check_address(p, h, 8080, ip("127.0.0.2"));
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason,
            "ns-hpc: allowed.test:8080 resolved to 127.0.0.2, a loopback address, which is refused unless that address "
            "is itself in the network allow list (e.g. 127.0.0.2:8080)");
  EXPECT_FALSE(check_address(p, h, 8080, ip("::1")).allowed);
  EXPECT_FALSE(check_address(p, h, 8080, ip("::ffff:169.254.169.254")).allowed);
  // A portless address entry: ports 80 and 443, as every entry without a port.
  EXPECT_TRUE(check_address(p, h, 443, ip("fd00::1")).allowed);
  EXPECT_FALSE(check_address(p, h, 8080, ip("fd00::1")).allowed);
  // A listed name gives no pass to a forbidden address.
  EXPECT_FALSE(check_address(p, host("localhost"), 443, ip("127.0.0.1")).allowed);
}

TEST(NetworkPolicy, ParsesTheFile) {
  const Policy p = parse_policy(R"({"mode": "filtered", "allow": ["allowed.test:8080", "127.0.0.1:8080"],
                                    "resolve": {"Allowed.Test": ["127.0.0.1", "::ffff:127.0.0.2", "::1"]}})");
  EXPECT_EQ(p.mode, Mode::filtered);
  ASSERT_EQ(p.allow.size(), 2u);
  ASSERT_EQ(p.resolve.count("allowed.test"), 1u);
  EXPECT_EQ(p.resolve.at("allowed.test"), (std::vector<IpAddress>{ip("127.0.0.1"), ip("127.0.0.2"), ip("::1")}));
  EXPECT_EQ(parse_policy(R"({"mode": "off"})").mode, Mode::off);
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

}  // namespace
}  // namespace nshpc::network
