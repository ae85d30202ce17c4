// Units of WebDAV (src/dav): the If header, the lock manager, the XML reader and writer; and the
// HTTP transport's streaming routes that WebDAV runs on (streamed bodies, 100-continue, limits,
// sendfile answers, Basic auth), driven in-process through transport::testing::exchange.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "dav/if_header.hpp"
#include "dav/locks.hpp"
#include "dav/xml.hpp"
#include "mcp/server.hpp"
#include "transport/http.hpp"

namespace dav = nshpc::dav;
namespace transport = nshpc::transport;
using namespace std::chrono_literals;

// ---- If header --------------------------------------------------------------------------------

TEST(DavIfHeader, ParsesTaggedListsNotAndEtags) {
  const auto lists = dav::parse_if_header(
      "<http://h/dav/a> (<opaquelocktoken:1> [\"e1\"]) (Not <DAV:no-lock> [W/\"e2\"]) </dav/b> (<urn:x>)");
  ASSERT_EQ(lists.size(), 3u);
  EXPECT_EQ(*lists[0].resource, "http://h/dav/a");
  ASSERT_EQ(lists[0].conditions.size(), 2u);
  EXPECT_FALSE(lists[0].conditions[0].is_etag);
  EXPECT_EQ(lists[0].conditions[0].value, "opaquelocktoken:1");
  EXPECT_TRUE(lists[0].conditions[1].is_etag);
  EXPECT_EQ(lists[0].conditions[1].value, "\"e1\"");
  EXPECT_EQ(*lists[1].resource, "http://h/dav/a");
  EXPECT_TRUE(lists[1].conditions[0].negated);
  EXPECT_EQ(lists[1].conditions[1].value, "W/\"e2\"");
  EXPECT_EQ(*lists[2].resource, "/dav/b");
  EXPECT_EQ(dav::submitted_tokens(lists), (std::vector<std::string>{"opaquelocktoken:1", "urn:x"}));
}

TEST(DavIfHeader, RefusesMalformedHeaders) {
  for (const char* bad : {"", "(", "()", "(<a>", "<a>", "(<a>) <b> (<c>)", "([x)", "(foo)", "<> (<a>)", "(Not)"})
    EXPECT_THROW(dav::parse_if_header(bad), std::invalid_argument) << bad;
}

TEST(DavIfHeader, EvaluatesListsAgainstLocksAndEtags) {
  dav::IfFacts facts;
  facts.etag = [](const std::string& p) -> std::optional<std::string> {
    if (p == "/dav/f") return "\"e1\"";
    return std::nullopt;
  };
  facts.locked_by = [](const std::string& p, const std::string& t) { return p == "/dav/f" && t == "opaquelocktoken:good"; };
  facts.path_of = [](const std::string& uri) -> std::optional<std::string> {
    if (uri.rfind("http://other/", 0) == 0) return std::nullopt;
    return uri.substr(uri.find("/dav"));
  };
  auto holds = [&](const char* header) { return dav::evaluate_if(dav::parse_if_header(header), "/dav/f", facts); };
  EXPECT_TRUE(holds("(<opaquelocktoken:good>)"));
  EXPECT_FALSE(holds("(<opaquelocktoken:bad>)"));
  EXPECT_TRUE(holds("(<opaquelocktoken:good> [\"e1\"])"));
  EXPECT_FALSE(holds("(<opaquelocktoken:good> [\"bogus\"])"));
  EXPECT_TRUE(holds("(<opaquelocktoken:bad>) (Not <DAV:no-lock>)"));  // the second list holds
  EXPECT_TRUE(holds("(Not <DAV:no-lock> [W/\"e1\"])"));                 // weak comparison
  EXPECT_FALSE(holds("(Not <DAV:no-lock> [\"bogus\"])"));
  EXPECT_TRUE(holds("<http://h/dav/f> (<opaquelocktoken:good>)"));
  EXPECT_FALSE(holds("<http://h/dav/g> (<opaquelocktoken:good>)"));  // the tag names another resource
  EXPECT_FALSE(holds("<http://other/dav/f> (<opaquelocktoken:good>)"));
}

// ---- locks ------------------------------------------------------------------------------------

TEST(DavLocks, ExclusiveSharedAndDepthConflicts) {
  dav::LockManager locks;
  auto a = locks.acquire("/dav/x/a", true, false, "", 60s);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->token.rfind("opaquelocktoken:", 0), 0u);
  EXPECT_FALSE(locks.acquire("/dav/x/a", true, false, "", 60s));   // exclusive vs exclusive
  EXPECT_FALSE(locks.acquire("/dav/x/a", false, false, "", 60s));  // shared vs exclusive
  EXPECT_FALSE(locks.acquire("/dav/x", true, true, "", 60s));      // infinity over a locked member
  EXPECT_TRUE(locks.acquire("/dav/x", true, false, "", 60s));      // depth 0 on the parent does not cover it
  EXPECT_TRUE(locks.acquire("/dav/x/ab", true, false, "", 60s));   // a sibling whose name starts alike
  auto s1 = locks.acquire("/dav/y", false, true, "<D:href>me</D:href>", 60s);
  auto s2 = locks.acquire("/dav/y", false, true, "", 60s);
  ASSERT_TRUE(s1 && s2);
  EXPECT_FALSE(locks.acquire("/dav/y/deep/file", true, false, "", 60s));  // covered by the shared ones
  EXPECT_EQ(locks.covering("/dav/y/deep/file").size(), 2u);
  EXPECT_TRUE(locks.covers(s1->token, "/dav/y/deep/file"));
  EXPECT_FALSE(locks.covers(a->token, "/dav/x/a/b"));  // depth 0
  EXPECT_EQ(locks.covering("/dav/x", true).size(), 3u);  // with the members below
  EXPECT_FALSE(locks.release(s1->token, "/dav/z"));
  EXPECT_TRUE(locks.release(s1->token, "/dav/y/deep"));  // any resource the lock covers
  EXPECT_FALSE(locks.release(s1->token, "/dav/y"));
  locks.remove_below("/dav/x");
  EXPECT_TRUE(locks.covering("/dav/x/a").empty());
}

TEST(DavLocks, TimeoutsExpireAndRefresh) {
  auto now = std::make_shared<dav::LockManager::Clock::time_point>(dav::LockManager::Clock::now());
  dav::LockManager locks(10, [now] { return *now; });
  auto l = locks.acquire("/dav/a", true, false, "", 100s);
  ASSERT_TRUE(l);
  *now += 90s;
  ASSERT_TRUE(locks.refresh(l->token, "/dav/a", 100s));
  *now += 90s;
  EXPECT_EQ(locks.covering("/dav/a").size(), 1u);  // refreshed: still held
  *now += 20s;
  EXPECT_TRUE(locks.covering("/dav/a").empty());  // expired
  EXPECT_FALSE(locks.refresh(l->token, "/dav/a", 100s));
  EXPECT_TRUE(locks.acquire("/dav/a", true, false, "", 100s));
  EXPECT_EQ(dav::parse_timeout("Second-30", 5s, 3600s), 30s);
  EXPECT_EQ(dav::parse_timeout("Infinite, Second-4100000000", 5s, 3600s), 3600s);
  EXPECT_EQ(dav::parse_timeout("Second-99999999", 5s, 3600s), 3600s);
  EXPECT_EQ(dav::parse_timeout("garbage", 5s, 3600s), 5s);
}

TEST(DavLocks, CapsHowManyAreHeld) {
  dav::LockManager locks(2);
  EXPECT_TRUE(locks.acquire("/dav/1", true, false, "", 60s));
  EXPECT_TRUE(locks.acquire("/dav/2", true, false, "", 60s));
  EXPECT_FALSE(locks.acquire("/dav/3", true, false, "", 60s));
}

// ---- XML --------------------------------------------------------------------------------------

TEST(DavXml, ParsesNamespacesAndWritesThemBack) {
  const auto doc = dav::xml::parse(
      "<?xml version=\"1.0\"?><D:propertyupdate xmlns:D=\"DAV:\" xmlns:Z=\"http://ex/ns\"><D:set><D:prop>"
      "<Z:p xml:lang=\"en\">a &amp; <Z:b attr=\"1\">c</Z:b><e xmlns=\"\">f</e></Z:p></D:prop></D:set></D:propertyupdate>");
  ASSERT_TRUE(doc->is("DAV:", "propertyupdate"));
  const auto* prop = doc->find("DAV:", "set")->find("DAV:", "prop");
  ASSERT_NE(prop, nullptr);
  const auto& p = *prop->children.at(0);
  EXPECT_EQ(p.name.ns, "http://ex/ns");
  EXPECT_EQ(p.lang, "en");
  const std::string inner = dav::xml::inner_xml(p);
  EXPECT_EQ(inner, "a &amp; <x0:b xmlns:x0=\"http://ex/ns\" attr=\"1\">c</x0:b><e xmlns=\"\">f</e>");
  // What was written parses back to the same names.
  const auto again = dav::xml::parse("<w xmlns=\"urn:w\">" + inner + "</w>");
  EXPECT_EQ(again->children.at(0)->name.ns, "http://ex/ns");
  EXPECT_EQ(again->children.at(1)->name.ns, "");
  EXPECT_EQ(dav::xml::element_xml({"urn:q", "n"}, ""), "<P:n xmlns:P=\"urn:q\"/>");
  EXPECT_EQ(dav::xml::element_xml({"", "n"}, "v"), "<n xmlns=\"\">v</n>");
}

TEST(DavXml, RefusesWhatIsNotNamespaceWellFormedOrDeclaresEntities) {
  for (const char* bad : {"<a>", "<D:a/>", "<a xmlns:b=\"\"><b:c/></a>", "<?xml version=\"1.0\"?><!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>",
                          "<!DOCTYPE a SYSTEM \"file:///etc/passwd\"><a/>", "", "text"})
    EXPECT_THROW(dav::xml::parse(bad), std::runtime_error) << bad;
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  for (int i = 0; i < 100; ++i) deep += "</a>";
  EXPECT_THROW(dav::xml::parse(deep), std::runtime_error);
}

// ---- the transport's streaming routes ----------------------------------------------------------

namespace {

constexpr const char* kToken = "stream-token-0123456789abcdef";

struct StreamRouteTest : ::testing::Test {
  std::unique_ptr<nshpc::mcp::Server> server = std::make_unique<nshpc::mcp::Server>(
      nshpc::mcp::ServerInfo{}, nshpc::mcp::ServerOptions{});
  transport::HttpOptions options;
  std::atomic<std::size_t> bytes_read{0};
  std::atomic<int> calls{0};

  void SetUp() override {
    options.token = kToken;
    options.read_timeout = 2s;
    transport::StreamRoute route;
    route.prefix = "/dav";
    route.max_body_bytes = 1000;
    route.answers_root_options = true;
    route.handler = [this](const transport::HttpRequest& req, transport::BodyReader& body) {
      ++calls;
      transport::StreamResponse r;
      if (req.method == "PUT") {
        char buf[7];
        std::size_t n, total = 0;
        while ((n = body.read(buf, sizeof buf)) > 0) total += n;
        bytes_read = total;
        r.status = 201;
        r.body = "got " + std::to_string(total);
      } else if (req.method == "GET") {
        std::FILE* f = std::tmpfile();
        std::fputs("0123456789", f);
        std::fflush(f);
        r.file = nshpc::UniqueFd(::dup(::fileno(f)));
        std::fclose(f);
        r.file_offset = 2;
        r.file_length = 5;
        r.status = 206;
      } else {
        r.status = 403;  // refused without reading the body
        r.body = "no";
      }
      return r;
    };
    options.stream_routes.push_back(route);
  }
  std::string exchange(const std::string& bytes) { return transport::testing::exchange(*server, options, bytes, 3000ms); }
};

std::string auth() { return std::string("Authorization: Bearer ") + kToken + "\r\n"; }

}  // namespace

TEST_F(StreamRouteTest, ChunkedBodyWithExpectContinueIsStreamedToTheHandler) {
  const std::string out = exchange("PUT /dav/f HTTP/1.1\r\nHost: localhost\r\n" + auth() +
                                   "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
                                   "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 100 Continue\r\n", 0), 0u) << out;
  EXPECT_NE(out.find("HTTP/1.1 201"), std::string::npos) << out;
  EXPECT_NE(out.find("got 11"), std::string::npos) << out;
  EXPECT_EQ(bytes_read.load(), 11u);
}

TEST_F(StreamRouteTest, ARefusedRequestGetsNoContinueAndItsBodyIsNotRead) {
  const std::string out = exchange("DELETE /dav/f HTTP/1.1\r\nHost: localhost\r\n" + auth() +
                                   "Content-Length: 500\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(out.find("100 Continue"), std::string::npos) << out;
  EXPECT_EQ(out.rfind("HTTP/1.1 403", 0), 0u) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos) << out;  // the unread body ends the connection
}

TEST_F(StreamRouteTest, BodiesOverTheRouteLimitGet413) {
  std::string out = exchange("PUT /dav/f HTTP/1.1\r\nHost: localhost\r\n" + auth() + "Content-Length: 5000\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << out;
  EXPECT_EQ(calls.load(), 0);
  std::string chunks;
  for (int i = 0; i < 30; ++i) chunks += "64\r\n" + std::string(100, 'x') + "\r\n";
  out = exchange("PUT /dav/f HTTP/1.1\r\nHost: localhost\r\n" + auth() + "Transfer-Encoding: chunked\r\n\r\n" + chunks + "0\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << out;
  EXPECT_NE(out.find("the limit is 1000 bytes"), std::string::npos) << out;
}

TEST_F(StreamRouteTest, FileAnswersAreSentFromTheFile) {
  const std::string out = exchange("GET /dav/f HTTP/1.1\r\nHost: localhost\r\n" + auth() + "Connection: close\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 206", 0), 0u) << out;
  EXPECT_NE(out.find("Content-Length: 5\r\n"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 5), "23456") << out;
}

TEST_F(StreamRouteTest, BasicAuthCarriesTheTokenAsPassword) {
  auto basic = [](const std::string& user_pass) {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    std::size_t i = 0;
    for (; i + 2 < user_pass.size(); i += 3) {
      const unsigned v = (static_cast<unsigned char>(user_pass[i]) << 16) | (static_cast<unsigned char>(user_pass[i + 1]) << 8) |
                         static_cast<unsigned char>(user_pass[i + 2]);
      out += {k[(v >> 18) & 63], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
    }
    if (user_pass.size() - i == 1) {
      const unsigned v = static_cast<unsigned char>(user_pass[i]) << 16;
      out += {k[(v >> 18) & 63], k[(v >> 12) & 63], '=', '='};
    } else if (user_pass.size() - i == 2) {
      const unsigned v = (static_cast<unsigned char>(user_pass[i]) << 16) | (static_cast<unsigned char>(user_pass[i + 1]) << 8);
      out += {k[(v >> 18) & 63], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
    }
    return "Authorization: Basic " + out + "\r\n";
  };
  std::string out = exchange("GET /dav/f HTTP/1.1\r\nHost: localhost\r\n" + basic(std::string("anybody:") + kToken) + "Connection: close\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 206", 0), 0u) << out;
  out = exchange("GET /dav/f HTTP/1.1\r\nHost: localhost\r\n" + basic("anybody:wrong") + "Connection: close\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 401", 0), 0u) << out;
  EXPECT_NE(out.find("Basic realm"), std::string::npos) << out;
  // Basic is for the routes that WebDAV clients use: the token as password works elsewhere too
  // (it is the same secret), but nothing without it.
  out = exchange("GET /dav/f HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 401", 0), 0u) << out;
  // OPTIONS / is answered without a token, by the route.
  out = exchange("OPTIONS / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 403", 0), 0u) << out;  // this test route answers 403 to anything else
  EXPECT_EQ(calls.load(), 2);
}
