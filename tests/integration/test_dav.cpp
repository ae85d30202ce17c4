// WebDAV at /dav against the real ns-hpc binary on 127.0.0.1, driven by the clients people use:
// litmus (the WebDAV conformance suite), rclone, curl; and by hostile requests and a hostile
// sandbox (symlinks planted in the workspace). OneFileIdentity: WebDAV and the file tools side by
// side on the same files, with one identity regime (what the instance's own user could do).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/loopback.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using namespace std::chrono_literals;
using nshpc::tests::free_port;

namespace {

constexpr const char* kToken = "dav-test-token-0123456789abcdef01234567";

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

// Runs a shell command line; its output (stdout and stderr) and exit code.
Result shell(const std::string& command, const std::string& cwd = "") {
  Result r;
  const std::string line = (cwd.empty() ? "" : "cd " + quote(cwd) + " && ") + "timeout 600 " + command + " 2>&1";
  FILE* p = ::popen(line.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

struct Reply {
  int status = 0;
  std::string headers;
  std::string body;
};

class DavServer {
 public:
  explicit DavServer(const Env& env) : port_(free_port()) {
    pid_ = env.start({"run", "-t", "http", "--port", std::to_string(port_)});
    ready_ = eventually(
        [&] {
          Result r = shell("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:" + std::to_string(port_) + "/healthz");
          return r.out == "200";
        },
        20s);
  }
  ~DavServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      wait_child(pid_, 30s);
    }
  }
  bool ready() const { return ready_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::uint16_t port() const { return port_; }

  // curl with Basic auth (the token as password) unless `auth` says otherwise; --path-as-is so
  // that hostile paths reach the server as written.
  Reply curl(const std::string& args, const std::string& auth = std::string("-u anyone:") + kToken) const {
    char dir[] = "/tmp/nshpc-dav-curl-XXXXXX";
    const std::string tmp = ::mkdtemp(dir);
    const Result r = shell("curl -s --path-as-is " + auth + " -D " + quote(tmp + "/h") + " -o " + quote(tmp + "/b") +
                           " -w '%{http_code}' " + args);
    Reply reply;
    reply.status = std::atoi(r.out.c_str());
    reply.headers = read_text(tmp + "/h");
    reply.body = read_text(tmp + "/b");
    std::filesystem::remove_all(tmp);
    return reply;
  }

 private:
  std::uint16_t port_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

struct DavEnv {
  // `extra`: TOML after [dav]; `namespace_keys`: keys of [namespace].
  explicit DavEnv(const std::string& extra = "", const std::string& namespace_keys = "")
      : env(config(extra, namespace_keys)) {}
  static std::string config(const std::string& extra, const std::string& namespace_keys) {
    // The state folder goes in a folder of its own, made before the Env (which picks its root).
    char dir[] = "/tmp/nshpc-dav-state-XXXXXX";
    state = ::mkdtemp(dir);
    return namespace_keys + std::string("[server]\nauth_token = \"") + kToken + "\"\nstate_dir = \"" + state +
           "\"\n[dav]\nenabled = true\n" + extra;
  }
  ~DavEnv() { std::filesystem::remove_all(state); }
  static inline std::string state;
  Env env;
};

// A file as a sandbox would make it: owned by the sandbox user (65534 when the server runs as
// root; WebDAV serves no file of another owner, such as a hard link to someone else's file).
void sandbox_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream(path) << content;
  if (::geteuid() == 0) {
    [[maybe_unused]] const int rc = ::chown(path.c_str(), 65534, 65534);
  }
}

std::vector<nlohmann::json> audit_lines(const Env& env, const std::string& id, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(env.instances() / id / "audit.log");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nshpc::parse_json_or_discarded(line);
    if (j.is_object() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

}  // namespace

// litmus 0.13 (Debian): basic, copymove, props, locks and http, with no failure and no warning.
TEST(Dav, LitmusPassesEverySuiteWithoutWarnings) {
  DavEnv d;
  d.env.create("dav-litmus");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  char dir[] = "/tmp/nshpc-dav-litmus-XXXXXX";
  const std::string cwd = ::mkdtemp(dir);
  const Result r = shell("env TESTS='basic copymove props locks http' litmus -k " +
                             quote(server.base() + "/dav/instances/dav-litmus/workspace/") + " anyone " + kToken,
                         cwd);
  std::filesystem::remove_all(cwd);
  // Every suite ran and summed up with 0 failures; no warning anywhere.
  for (const char* suite : {"basic", "copymove", "props", "locks", "http"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("summary for `") + suite + "': of [0-9]+ tests run: [0-9]+ passed, 0 failed")))
        << suite << "\n" << r.out;
  EXPECT_EQ(r.out.find("WARNING"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// rclone's webdav backend: copy, sync and check, up and down.
TEST(Dav, RcloneCopySyncAndCheckBothWays) {
  DavEnv d;
  d.env.create("dav-rclone");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  char dir[] = "/tmp/nshpc-dav-rclone-XXXXXX";
  const std::string tmp = ::mkdtemp(dir);
  const std::string local = tmp + "/local", back = tmp + "/back";
  std::filesystem::create_directories(local + "/sub/deeper");
  std::ofstream(local + "/a.txt") << "alpha\n";
  std::ofstream(local + "/sub/b.bin") << std::string(3 * 1024 * 1024 + 7, 'b');
  std::ofstream(local + "/sub/deeper/c with space & ü.txt") << "gamma\n";
  std::ofstream(local + "/sub/100% sure #1 %41.txt") << "percent\n";  // '%' and '#' in names
  const Result obscured = shell(std::string("rclone obscure ") + kToken);
  ASSERT_EQ(obscured.exit_code, 0) << obscured.out;
  std::string pass = obscured.out;
  while (!pass.empty() && (pass.back() == '\n' || pass.back() == '\r')) pass.pop_back();
  const std::string env = "env RCLONE_CONFIG=/dev/null RCLONE_CONFIG_NSDAV_TYPE=webdav RCLONE_CONFIG_NSDAV_VENDOR=other "
                          "RCLONE_CONFIG_NSDAV_URL=" + quote(server.base() + "/dav/instances/dav-rclone/workspace") +
                          " RCLONE_CONFIG_NSDAV_USER=rclone RCLONE_CONFIG_NSDAV_PASS=" + quote(pass) + " rclone ";
  // Up.
  Result r = shell(env + "copy " + quote(local) + " nsdav:up");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = shell(env + "check " + quote(local) + " nsdav:up");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read_text(d.env.instances() / "dav-rclone/workspace/up/sub/deeper/c with space & ü.txt"), "gamma\n");
  EXPECT_EQ(read_text(d.env.instances() / "dav-rclone/workspace/up/sub/100% sure #1 %41.txt"), "percent\n");
  // Down.
  r = shell(env + "sync nsdav:up " + quote(back));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = shell(env + "check nsdav:up " + quote(back));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read_text(back + "/sub/b.bin").size(), 3u * 1024 * 1024 + 7);
  // A change on each side, synced across.
  std::filesystem::remove(local + "/a.txt");
  std::ofstream(local + "/new.txt") << "new\n";
  r = shell(env + "sync " + quote(local) + " nsdav:up");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(std::filesystem::exists(d.env.instances() / "dav-rclone/workspace/up/a.txt"));
  r = shell(env + "check " + quote(local) + " nsdav:up");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  sandbox_file(d.env.instances() / "dav-rclone/workspace/up/from-sandbox.txt", "made inside\n");
  r = shell(env + "sync nsdav:up " + quote(back));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read_text(back + "/from-sandbox.txt"), "made inside\n");
  EXPECT_FALSE(std::filesystem::exists(back + "/a.txt"));
  r = shell(env + "check nsdav:up " + quote(back));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::filesystem::remove_all(tmp);
}

// The original README's three curl commands (with the token as Basic password), and what a
// write leaves: the file of the sandbox user, one audit line.
TEST(Dav, ReadmeCurlCommandsWorkAndAreAuditedOnce) {
  DavEnv d;
  d.env.create("dav-curl");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  const std::string ws = server.base() + "/dav/instances/dav-curl/workspace/";
  char dir[] = "/tmp/nshpc-dav-curlsrc-XXXXXX";
  const std::string tmp = ::mkdtemp(dir);
  std::ofstream(tmp + "/data.csv") << "a,b\n1,2\n";
  sandbox_file(d.env.instances() / "dav-curl/workspace/file.txt", "hello from the workspace\n");

  Reply get = server.curl(quote(ws + "file.txt"));
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "hello from the workspace\n");

  Reply put = server.curl("-T " + quote(tmp + "/data.csv") + " " + quote(ws + "data.csv"));
  EXPECT_EQ(put.status, 201) << put.body;
  const auto written = d.env.instances() / "dav-curl/workspace/data.csv";
  EXPECT_EQ(read_text(written), "a,b\n1,2\n");
  struct stat st {};
  ASSERT_EQ(::stat(written.c_str(), &st), 0);
  const uid_t expected_owner = ::geteuid() == 0 ? 65534u : ::geteuid();  // the sandbox user
  EXPECT_EQ(st.st_uid, expected_owner) << "a file written through WebDAV belongs to the sandbox user";

  sandbox_file(d.env.instances() / "dav-curl/workspace/old.txt", "old\n");
  Reply del = server.curl("-X DELETE " + quote(ws + "old.txt"));
  EXPECT_EQ(del.status, 204);
  EXPECT_FALSE(std::filesystem::exists(d.env.instances() / "dav-curl/workspace/old.txt"));

  // Exactly one audit line per write, none for the read.
  const auto lines = audit_lines(d.env, "dav-curl", "dav.write");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["method"], "PUT");
  EXPECT_EQ(lines[0]["path"], "/dav/instances/dav-curl/workspace/data.csv");
  EXPECT_EQ(lines[1]["method"], "DELETE");
  EXPECT_EQ(lines[1]["path"], "/dav/instances/dav-curl/workspace/old.txt");

  // A chunked PUT (Finder) and Expect: 100-continue land whole.
  Reply chunked = server.curl("-H 'Transfer-Encoding: chunked' -H 'Expect: 100-continue' --data-binary @" +
                              quote(tmp + "/data.csv") + " -X PUT " + quote(ws + "chunked.csv"));
  EXPECT_EQ(chunked.status, 201);
  EXPECT_EQ(read_text(d.env.instances() / "dav-curl/workspace/chunked.csv"), "a,b\n1,2\n");
  // A body far over the MCP message limit (8 MiB) streams to disk whole.
  {
    std::ofstream big(tmp + "/big.bin", std::ios::binary);
    std::string block(1024 * 1024, 'z');
    for (int i = 0; i < 20; ++i) big << block;
  }
  Reply large = server.curl("-T " + quote(tmp + "/big.bin") + " " + quote(ws + "big.bin"));
  EXPECT_EQ(large.status, 201) << large.body;
  EXPECT_EQ(std::filesystem::file_size(d.env.instances() / "dav-curl/workspace/big.bin"), 20u * 1024 * 1024);
  // Range and conditional GET.
  Reply range = server.curl("-H 'Range: bytes=6-10' " + quote(ws + "file.txt"));
  EXPECT_EQ(range.status, 206);
  EXPECT_EQ(range.body, "from ");
  const std::smatch m = [&] {
    std::smatch sm;
    std::regex_search(get.headers, sm, std::regex("ETag: (\"[^\"]+\")", std::regex::icase));
    return sm;
  }();
  ASSERT_FALSE(m.empty()) << get.headers;
  Reply cached = server.curl("-H " + quote("If-None-Match: " + m[1].str()) + " " + quote(ws + "file.txt"));
  EXPECT_EQ(cached.status, 304);
  std::filesystem::remove_all(tmp);
}

// Token checks: Basic with the token as password, any user; a wrong one refused; OPTIONS at /
// answered without it (Windows asks before it authenticates) and telling nothing else.
TEST(Dav, BasicAuthCarriesTheToken) {
  DavEnv d;
  d.env.create("dav-auth");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  const std::string url = server.base() + "/dav/instances/dav-auth/workspace/";
  Reply none = server.curl("-X PROPFIND -H 'Depth: 0' " + quote(url), "");
  EXPECT_EQ(none.status, 401);
  EXPECT_NE(none.headers.find("Basic realm"), std::string::npos) << none.headers;
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' " + quote(url), "-u anyone:wrong-token").status, 401);
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' " + quote(url), "-u someone-else:" + std::string(kToken)).status, 207);
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' " + quote(url), "-H " + quote(std::string("Authorization: Bearer ") + kToken)).status, 207);
  Reply root = server.curl("-X OPTIONS " + quote(server.base() + "/"), "");
  EXPECT_EQ(root.status, 200);
  EXPECT_NE(root.headers.find("DAV: 1, 2"), std::string::npos) << root.headers;
  EXPECT_TRUE(root.body.empty());
  // Wherever the bearer token is accepted, so is Basic: the MCP endpoint too.
  const Reply init = server.curl(
      "-X POST -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' --data-binary " +
      quote(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})") +
      " " + quote(server.base() + "/mcp"));
  EXPECT_EQ(init.status, 200) << init.body;
  EXPECT_NE(init.body.find("serverInfo"), std::string::npos) << init.body;
  // Anything but OPTIONS at / still wants the token.
  EXPECT_EQ(server.curl("-X OPTIONS " + quote(server.base() + "/dav/"), "").status, 401);
}

// Paths that try to leave the served folder, and links a sandbox planted: 403 or 404, never 500,
// never followed.
TEST(Dav, HostilePathsAndPlantedLinksAreRefused) {
  DavEnv d("max_upload_bytes = 100000\n");
  d.env.create("dav-hostile");
  d.env.create("dav-victim");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  const auto ws = d.env.instances() / "dav-hostile/workspace";
  std::ofstream(d.env.instances() / "dav-victim/workspace/secret.txt") << "victim secret\n";
  std::filesystem::create_symlink("/etc/passwd", ws / "passwd-link");
  std::filesystem::create_symlink("/etc", ws / "etc-link");
  std::filesystem::create_symlink(d.env.instances() / "dav-victim/workspace", ws / "victim");
  const std::string base = server.base() + "/dav/instances/dav-hostile/workspace/";
  auto refused = [](int status) { return status == 403 || status == 404; };
  for (const std::string& path :
       {std::string("passwd-link"), std::string("etc-link/passwd"), std::string("victim/secret.txt"),
        std::string("../../dav-victim/workspace/secret.txt"), std::string("%2e%2e/%2e%2e/dav-victim/workspace/secret.txt"),
        std::string("..%2f..%2fdav-victim%2fworkspace%2fsecret.txt"), std::string("a%00b"), std::string("..%2F..%2Fmetadata.json"),
        std::string("../audit.log")}) {
    const Reply r = server.curl(quote(base + path));
    EXPECT_TRUE(refused(r.status)) << path << " -> " << r.status << " " << r.body;
    EXPECT_EQ(r.body.find("root:"), std::string::npos) << path;
    EXPECT_EQ(r.body.find("victim secret"), std::string::npos) << path;
  }
  // A file of another owner in the workspace (a hard link to someone else's file looks like
  // this) is not served.
  if (::geteuid() == 0) {
    std::ofstream(ws / "roots.txt") << "root's\n";
    const Reply r = server.curl(quote(base + "roots.txt"));
    EXPECT_TRUE(refused(r.status)) << r.status;
    EXPECT_EQ(r.body.find("root's"), std::string::npos);
  }
  // Writes through a planted link go nowhere.
  const Reply put = server.curl("-X PUT --data-binary pwned " + quote(base + "victim/secret.txt"));
  EXPECT_TRUE(refused(put.status) || put.status == 409) << put.status;
  EXPECT_EQ(read_text(d.env.instances() / "dav-victim/workspace/secret.txt"), "victim secret\n");
  const Reply mv = server.curl("-X MOVE -H " + quote("Destination: " + base + "victim/moved.txt") + " " + quote(base + "nothing"));
  EXPECT_NE(mv.status, 500);
  const Reply cp = server.curl("-X COPY -H " + quote("Destination: " + base + "stolen.txt") + " " + quote(base + "passwd-link"));
  EXPECT_TRUE(refused(cp.status)) << cp.status;
  EXPECT_FALSE(std::filesystem::exists(ws / "stolen.txt"));
  // Uploads over [dav] max_upload_bytes: 413, declared or chunked, and nothing is left behind.
  {
    std::ofstream(d.env.root() / "over.bin") << std::string(200000, 'o');
  }
  EXPECT_EQ(server.curl("-T " + quote((d.env.root() / "over.bin").string()) + " " + quote(base + "over.bin")).status, 413);
  EXPECT_EQ(server.curl("-H 'Transfer-Encoding: chunked' --data-binary @" + quote((d.env.root() / "over.bin").string()) +
                        " -X PUT " + quote(base + "over.bin")).status, 413);
  EXPECT_FALSE(std::filesystem::exists(ws / "over.bin"));
  for (const auto& entry : std::filesystem::directory_iterator(ws))
    EXPECT_EQ(entry.path().filename().string().find(".davput-"), std::string::npos) << entry.path();
  // Links are not listed.
  const Reply list = server.curl("-X PROPFIND -H 'Depth: 1' " + quote(base));
  EXPECT_EQ(list.status, 207);
  EXPECT_EQ(list.body.find("passwd-link"), std::string::npos);
  // PROPFIND Depth: infinity is refused as RFC 4918 allows.
  const Reply inf = server.curl("-X PROPFIND -H 'Depth: infinity' " + quote(base));
  EXPECT_EQ(inf.status, 403);
  EXPECT_NE(inf.body.find("propfind-finite-depth"), std::string::npos);
  // Malformed XML: 400.
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' --data-binary '<D:propfind xmlns:D=\"DAV:\"><D:prop>' " + quote(base)).status, 400);
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' --data-binary '<!DOCTYPE x [<!ENTITY a \"aaaa\">]><x>&a;</x>' " + quote(base)).status, 400);
}

// A read-only extra serves reads and refuses every write with 403; an archived instance is 404.
TEST(Dav, ReadOnlyExtraAndArchivedInstance) {
  char dir[] = "/tmp/nshpc-dav-extra-XXXXXX";
  const std::string extra = ::mkdtemp(dir);
  ::chmod(extra.c_str(), 0755);
  std::ofstream(extra + "/shared.txt") << "shared data\n";
  DavEnv d("[dav.extras.refdata]\npath = \"" + extra + "\"\nro = true\n");
  d.env.create("dav-gone");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  const std::string url = server.base() + "/dav/refdata/";
  const Reply get = server.curl(quote(url + "shared.txt"));
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "shared data\n");
  const Reply root = server.curl("-X PROPFIND -H 'Depth: 1' " + quote(server.base() + "/dav/"));
  EXPECT_EQ(root.status, 207);
  EXPECT_NE(root.body.find("/dav/refdata/"), std::string::npos) << root.body;
  EXPECT_NE(root.body.find("/dav/instances/"), std::string::npos);
  for (const std::string& args :
       {"-X PUT --data-binary x " + quote(url + "new.txt"), "-X DELETE " + quote(url + "shared.txt"), "-X MKCOL " + quote(url + "d"),
        "-X MOVE -H " + quote("Destination: " + url + "moved.txt") + " " + quote(url + "shared.txt"),
        "-X COPY -H " + quote("Destination: " + url + "copy.txt") + " " + quote(url + "shared.txt"),
        "-X PROPPATCH --data-binary '<D:propertyupdate xmlns:D=\"DAV:\"><D:set><D:prop><x xmlns=\"urn:x\">1</x></D:prop></D:set></D:propertyupdate>' " + quote(url + "shared.txt"),
        "-X LOCK --data-binary '<D:lockinfo xmlns:D=\"DAV:\"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>' " + quote(url + "shared.txt")}) {
    EXPECT_EQ(server.curl(args).status, 403) << args;
  }
  EXPECT_EQ(read_text(extra + "/shared.txt"), "shared data\n");
  EXPECT_FALSE(std::filesystem::exists(extra + "/new.txt"));

  const std::string gone = server.base() + "/dav/instances/dav-gone/workspace/";
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' " + quote(gone)).status, 207);
  const Result archived = d.env.run({"instance", "archive", "dav-gone", "--force"});
  ASSERT_EQ(archived.exit_code, 0) << archived.err;
  EXPECT_EQ(server.curl("-X PROPFIND -H 'Depth: 0' " + quote(gone)).status, 404);
  EXPECT_EQ(server.curl("-X PUT --data-binary x " + quote(gone + "f.txt")).status, 404);
  std::filesystem::remove_all(extra);
}

// Dead properties persist across a server restart and are kept out of the sandbox's reach.
TEST(Dav, DeadPropertiesPersistOutsideTheWorkspace) {
  DavEnv d;
  d.env.create("dav-props");
  sandbox_file(d.env.instances() / "dav-props/workspace/f.txt", "x");
  const std::string body = "<D:propertyupdate xmlns:D=\"DAV:\" xmlns:Z=\"urn:schemas-microsoft-com:\"><D:set><D:prop>"
                           "<Z:Win32FileAttributes>00000020</Z:Win32FileAttributes></D:prop></D:set></D:propertyupdate>";
  {
    DavServer server(d.env);
    ASSERT_TRUE(server.ready());
    const Reply r = server.curl("-X PROPPATCH --data-binary " + quote(body) + " " + quote(server.base() + "/dav/instances/dav-props/workspace/f.txt"));
    EXPECT_EQ(r.status, 207);
    EXPECT_NE(r.body.find("200 OK"), std::string::npos) << r.body;
    EXPECT_EQ(audit_lines(d.env, "dav-props", "dav.write").size(), 1u);
  }
  DavServer again(d.env);
  ASSERT_TRUE(again.ready());
  const Reply r = again.curl("-X PROPFIND -H 'Depth: 0' --data-binary " +
                             quote("<D:propfind xmlns:D=\"DAV:\"><D:prop><Z:Win32FileAttributes xmlns:Z=\"urn:schemas-microsoft-com:\"/></D:prop></D:propfind>") +
                             " " + quote(again.base() + "/dav/instances/dav-props/workspace/f.txt"));
  EXPECT_EQ(r.status, 207);
  EXPECT_NE(r.body.find(">00000020<"), std::string::npos) << r.body;
  // Nothing of it in the instance's folders.
  const Result grep = shell("grep -r Win32FileAttributes " + quote((d.env.instances() / "dav-props").string()));
  EXPECT_NE(grep.exit_code, 0) << grep.out;
}

// A depth-0 lock on a collection guards its membership (RFC 4918 §7.4): adding, deleting or
// moving away a member needs the collection's lock token; with it, each works.
TEST(Dav, ADepthZeroLockOnAFolderGuardsWhatIsInIt) {
  DavEnv d;
  d.env.create("dav-members");
  std::filesystem::create_directories(d.env.instances() / "dav-members/workspace/box");
  if (::geteuid() == 0) ::chown((d.env.instances() / "dav-members/workspace/box").c_str(), 65534, 65534);
  sandbox_file(d.env.instances() / "dav-members/workspace/box/old.txt", "x");
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  const std::string box = server.base() + "/dav/instances/dav-members/workspace/box";
  const Reply lock = server.curl(
      "-X LOCK -H 'Depth: 0' --data-binary '<D:lockinfo xmlns:D=\"DAV:\"><D:lockscope><D:exclusive/></D:lockscope>"
      "<D:locktype><D:write/></D:locktype></D:lockinfo>' " + quote(box + "/"));
  ASSERT_EQ(lock.status, 200) << lock.body;
  const auto at = lock.headers.find("opaquelocktoken:");
  ASSERT_NE(at, std::string::npos) << lock.headers;
  const std::string token = lock.headers.substr(at, lock.headers.find('>', at) - at);
  // Tagged with the folder: the token is the folder's, not the member's (RFC 4918 §10.4.2).
  const std::string with_token = "-H " + quote("If: <" + box + "/> (<" + token + ">)") + " ";

  EXPECT_EQ(server.curl("-X PUT --data-binary new " + quote(box + "/new.txt")).status, 423);
  EXPECT_EQ(server.curl("-X MKCOL " + quote(box + "/sub")).status, 423);
  EXPECT_EQ(server.curl("-X DELETE " + quote(box + "/old.txt")).status, 423);
  EXPECT_EQ(server.curl("-X MOVE -H " + quote("Destination: " + server.base() + "/dav/instances/dav-members/workspace/out.txt") +
                        " " + quote(box + "/old.txt")).status,
            423);
  EXPECT_FALSE(std::filesystem::exists(d.env.instances() / "dav-members/workspace/box/new.txt"));
  EXPECT_TRUE(std::filesystem::exists(d.env.instances() / "dav-members/workspace/box/old.txt"));
  // A member's content is not the collection's: an existing file is written without the token.
  EXPECT_EQ(server.curl("-X PUT --data-binary changed " + quote(box + "/old.txt")).status, 204);

  EXPECT_EQ(server.curl(with_token + "-X PUT --data-binary new " + quote(box + "/new.txt")).status, 201);
  EXPECT_EQ(server.curl(with_token + "-X MKCOL " + quote(box + "/sub")).status, 201);
  EXPECT_EQ(server.curl(with_token + "-X DELETE " + quote(box + "/old.txt")).status, 204);
  EXPECT_TRUE(std::filesystem::exists(d.env.instances() / "dav-members/workspace/box/new.txt"));
  EXPECT_FALSE(std::filesystem::exists(d.env.instances() / "dav-members/workspace/box/old.txt"));
}

// An image instance's files that the server cannot touch from outside as a normal user — a folder
// closed even to its owner (mode 000), an account's files in its 0700 folder (the user's
// subordinate uids) — are served, replaced (keeping their owner) and deleted like the rest.
TEST(ImageInstanceDav, FilesClosedToTheServerAreServedReplacedAndDeleted) {
  const std::filesystem::path cache = test_image_cache();
  if (!std::filesystem::exists(cache / "images/test/current"))
    GTEST_SKIP() << "no test image in " << cache << " (scripts/test-image.sh, run by make test, builds it)";
  DavEnv d("", "images_dir = \"" + (cache / "images").string() + "\"\n");
  d.env.create("dav-img", {"--image", "test"});
  const auto meta = nshpc::parse_json(read_text(d.env.instances() / "dav-img/metadata.json"));
  const bool range = meta["ids"]["map"] != "single";
  std::string setup = "mkdir shut && echo in > shut/x && chmod 000 shut";
  if (range)
    setup += " && useradd agent && mkdir private && echo secret > private/a.txt && chown -R agent: private"
             " && chmod 600 private/a.txt && chmod 700 private";
  const Result made = d.env.run({"bwrap", "dav-img", "--", "/bin/sh", "-c", setup});
  ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  const std::string ws = server.base() + "/dav/instances/dav-img/workspace/";
  char dir[] = "/tmp/nshpc-dav-img-XXXXXX";
  const std::string tmp = ::mkdtemp(dir);
  std::ofstream(tmp + "/new.txt") << "put by a person\n";

  Reply get = server.curl(quote(ws + "shut/x"));
  EXPECT_EQ(get.status, 200) << get.body;
  EXPECT_EQ(get.body, "in\n");
  EXPECT_EQ(server.curl("-T " + quote(tmp + "/new.txt") + " " + quote(ws + "shut/y")).status, 201);
  EXPECT_EQ(server.curl("-X DELETE " + quote(ws + "shut")).status, 204);
  std::string check = "ls shut 2>&1";
  if (range) {
    get = server.curl(quote(ws + "private/a.txt"));
    EXPECT_EQ(get.status, 200) << get.body;
    EXPECT_EQ(get.body, "secret\n");
    const Reply listing = server.curl("-X PROPFIND -H 'Depth: 1' " + quote(ws + "private/"));
    EXPECT_EQ(listing.status, 207);
    EXPECT_NE(listing.body.find("a.txt"), std::string::npos) << listing.body;
    EXPECT_EQ(server.curl("-T " + quote(tmp + "/new.txt") + " " + quote(ws + "private/a.txt")).status, 204);
    check += "; stat -c %U-%a private/a.txt; cat private/a.txt";
  }
  const Result seen = d.env.run({"bwrap", "dav-img", "--", "/bin/sh", "-c", check});
  EXPECT_NE(seen.out.find("No such file or directory"), std::string::npos) << seen.out << seen.err;
  if (range) {
    EXPECT_NE(seen.out.find("agent-600\nput by a person\n"), std::string::npos) << seen.out << seen.err;
  }
  std::filesystem::remove_all(tmp);
}

// Issue 31: one identity regime for an instance's files. The file tools and WebDAV touch them as
// the instance's own user could from inside (as root: with the sandbox user's filesystem
// identity; as a normal user: the server is that user), so for each case a file tool and a
// WebDAV request on the same file have the same outcome, the same errno (EACCES: "Permission
// denied" / 403), and the sandbox sees that nothing happened. (Before, as root, the file tools
// wrote a 0444 file, added to a 0555 folder, read a 0000 file and deleted in a 0555 folder.)
TEST(OneFileIdentity, FileToolsAndWebDavRefuseWhatTheSandboxUserMayNotDo) {
  DavEnv d;
  const std::string id = "same-rules";
  d.env.create(id);
  const Result made = d.env.run({"bwrap", id, "--", "/bin/sh", "-c",
                                 "echo frozen > ro.txt && chmod 444 ro.txt && echo closed > closed.txt && "
                                 "chmod 000 closed.txt && mkdir shut && echo kept > shut/keep.txt && chmod 555 shut && "
                                 "mkdir open && echo a > open/a.txt"});
  ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  McpSession mcp(d.env);
  const std::string ws = server.base() + "/dav/instances/" + id + "/workspace/";
  char dir[] = "/tmp/nshpc-dav-same-XXXXXX";
  const std::string tmp = ::mkdtemp(dir);
  std::ofstream(tmp + "/body.txt") << "changed\n";
  const std::string body = quote(tmp + "/body.txt");
  auto tool = [&](const std::string& name, nlohmann::json args) {
    args["instance_id"] = id;
    return mcp.call_and_wait(name, args);
  };
  // A tool refused with EACCES, as the sandbox's own command would be.
  auto tool_refused = [](const nlohmann::json& r) {
    return r.contains("result") && r["result"].value("isError", false) &&
           result_text(r).find("Permission denied") != std::string::npos;
  };
  auto dav_refused = [](const Reply& r) { return r.status == 403 && r.body.find("permission denied") != std::string::npos; };

  // Writing a 0444 file of the sandbox user.
  nlohmann::json r = tool("write_file", {{"path", "ro.txt"}, {"content", "changed\n"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  r = tool("edit_file", {{"path", "ro.txt"}, {"old_text", "frozen"}, {"new_text", "thawed"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  r = tool("copy_file", {{"source", "open/a.txt"}, {"destination", "ro.txt"}, {"overwrite", true}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  Reply put = server.curl("-T " + body + " " + quote(ws + "ro.txt"));
  EXPECT_TRUE(dav_refused(put)) << put.status << " " << put.body;
  // Creating a file (or folder) in a 0555 folder.
  r = tool("write_file", {{"path", "shut/new.txt"}, {"content", "new\n"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  r = tool("copy_file", {{"source", "open/a.txt"}, {"destination", "shut/a.txt"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  put = server.curl("-T " + body + " " + quote(ws + "shut/new.txt"));
  EXPECT_TRUE(dav_refused(put)) << put.status << " " << put.body;
  Reply dav = server.curl("-X COPY -H " + quote("Destination: " + ws + "shut/a.txt") + " " + quote(ws + "open/a.txt"));
  EXPECT_TRUE(dav_refused(dav)) << dav.status << " " << dav.body;
  dav = server.curl("-X MKCOL " + quote(ws + "shut/sub"));
  EXPECT_TRUE(dav_refused(dav)) << dav.status << " " << dav.body;
  // Reading a 0000 file.
  r = tool("read_file", {{"path", "closed.txt"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  EXPECT_EQ(r.dump().find("closed\\n"), std::string::npos);
  dav = server.curl(quote(ws + "closed.txt"));
  EXPECT_TRUE(dav_refused(dav)) << dav.status << " " << dav.body;
  EXPECT_EQ(dav.body.find("closed\n"), std::string::npos);
  // Deleting (or moving away) in a 0555 folder.
  r = tool("delete_file", {{"path", "shut/keep.txt"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  r = tool("move_file", {{"source", "shut/keep.txt"}, {"destination", "moved.txt"}});
  EXPECT_TRUE(tool_refused(r)) << r.dump();
  dav = server.curl("-X DELETE " + quote(ws + "shut/keep.txt"));
  EXPECT_TRUE(dav_refused(dav)) << dav.status << " " << dav.body;
  dav = server.curl("-X MOVE -H " + quote("Destination: " + ws + "moved.txt") + " " + quote(ws + "shut/keep.txt"));
  EXPECT_TRUE(dav_refused(dav)) << dav.status << " " << dav.body;

  // From inside: none of it happened.
  const Result seen = d.env.run({"bwrap", id, "--", "/bin/sh", "-c",
                                 "cat ro.txt; ls -A shut; ls moved.txt 2>&1; stat -c %a ro.txt closed.txt shut"});
  EXPECT_EQ(seen.out, "frozen\nkeep.txt\nls: cannot access 'moved.txt': No such file or directory\n444\n0\n555\n")
      << seen.err;
  // Once the sandbox's user allows it, both faces may.
  ASSERT_EQ(d.env.run({"bwrap", id, "--", "chmod", "644", "ro.txt"}).exit_code, 0);
  r = tool("write_file", {{"path", "ro.txt"}, {"content", "by the tool\n"}});
  EXPECT_FALSE(r["result"].value("isError", false)) << r.dump();
  put = server.curl("-T " + body + " " + quote(ws + "ro.txt"));
  EXPECT_EQ(put.status, 204) << put.body;
  std::filesystem::remove_all(tmp);
}

// What the sandbox's user may do, both faces do, and what they make is that user's.
TEST(OneFileIdentity, FileToolsAndWebDavWriteReadEditAndMoveAsTheSandboxUser) {
  DavEnv d;
  const std::string id = "same-work";
  d.env.create(id);
  ASSERT_EQ(d.env.run({"bwrap", id, "--", "/bin/sh", "-c", "mkdir open && echo a > open/a.txt"}).exit_code, 0);
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  McpSession mcp(d.env);
  const std::string ws = server.base() + "/dav/instances/" + id + "/workspace/";
  char dir[] = "/tmp/nshpc-dav-work-XXXXXX";
  const std::string tmp = ::mkdtemp(dir);
  std::ofstream(tmp + "/body.txt") << "put\n";
  auto ok = [&](const std::string& name, nlohmann::json args) {
    args["instance_id"] = id;
    const nlohmann::json r = mcp.call_and_wait(name, args);
    EXPECT_TRUE(r.contains("result") && !r["result"].value("isError", false)) << name << ": " << r.dump();
    return r;
  };
  ok("write_file", {{"path", "open/tool.txt"}, {"content", "tool\n"}});
  EXPECT_EQ(ok("read_file", {{"path", "open/a.txt"}})["result"]["structuredContent"]["content"], "a\n");
  ok("edit_file", {{"path", "open/tool.txt"}, {"old_text", "tool"}, {"new_text", "edited"}});
  ok("move_file", {{"source", "open/tool.txt"}, {"destination", "open/tool-moved.txt"}});
  ok("write_file", {{"path", "new/dir/deep.txt"}, {"content", "deep\n"}});
  EXPECT_EQ(server.curl("-T " + quote(tmp + "/body.txt") + " " + quote(ws + "open/put.txt")).status, 201);
  const Reply get = server.curl(quote(ws + "open/a.txt"));
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "a\n");
  EXPECT_EQ(server.curl("-X MOVE -H " + quote("Destination: " + ws + "open/put-moved.txt") + " " + quote(ws + "open/put.txt"))
                .status,
            201);
  EXPECT_EQ(server.curl("-X MKCOL " + quote(ws + "made")).status, 201);
  EXPECT_EQ(server.curl("-X DELETE " + quote(ws + "open/a.txt")).status, 204);
  // Inside: the files are there, the sandbox's own, and it may change them.
  const Result seen = d.env.run(
      {"bwrap", id, "--", "/bin/sh", "-c",
       "id -u; stat -c %u open/tool-moved.txt open/put-moved.txt new new/dir new/dir/deep.txt made; "
       "cat open/tool-moved.txt open/put-moved.txt; ls open; echo more >> open/put-moved.txt && echo appended"});
  std::istringstream lines(seen.out);
  std::string uid, line;
  std::getline(lines, uid);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(std::getline(lines, line)) << seen.out << seen.err;
    EXPECT_EQ(line, uid) << "not the sandbox user's: line " << i << "\n" << seen.out;
  }
  std::string rest((std::istreambuf_iterator<char>(lines)), {});
  EXPECT_EQ(rest, "edited\nput\nput-moved.txt\ntool-moved.txt\nappended\n") << seen.out << seen.err;
  std::filesystem::remove_all(tmp);
}

// In an image instance the sandbox's user is root of a namespace mapping the instance's ids: a
// 0444 file of its own is written and a 0000 one read, by both faces alike; a file of an id the
// instance does not map (planted from the host) is refused by both alike.
TEST(ImageInstanceDav, FileToolsAndWebDavTreatItsFilesAlike) {
  const std::filesystem::path cache = test_image_cache();
  if (!std::filesystem::exists(cache / "images/test/current"))
    GTEST_SKIP() << "no test image in " << cache << " (scripts/test-image.sh, run by make test, builds it)";
  DavEnv d("", "images_dir = \"" + (cache / "images").string() + "\"\n");
  const std::string id = "same-img";
  d.env.create(id, {"--image", "test"});
  const Result made = d.env.run({"bwrap", id, "--", "/bin/sh", "-c",
                                 "echo frozen > ro.txt && chmod 444 ro.txt && echo frozen > ro2.txt && chmod 444 ro2.txt"
                                 " && echo closed > closed.txt && chmod 000 closed.txt"});
  ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
  const std::filesystem::path foreign = d.env.instances() / id / "workspace" / "foreign.txt";
  if (::geteuid() == 0) {
    std::ofstream(foreign) << "not the instance's\n";
    ASSERT_EQ(::chown(foreign.c_str(), 12345, 12345), 0);  // below the instance's range: not mapped
  }
  DavServer server(d.env);
  ASSERT_TRUE(server.ready());
  McpSession mcp(d.env);
  const std::string ws = server.base() + "/dav/instances/" + id + "/workspace/";
  char dir[] = "/tmp/nshpc-dav-sameimg-XXXXXX";
  const std::string tmp = ::mkdtemp(dir);
  std::ofstream(tmp + "/body.txt") << "put\n";
  auto tool = [&](const std::string& name, nlohmann::json args) {
    args["instance_id"] = id;
    return mcp.call_and_wait(name, args);
  };
  auto failed = [](const nlohmann::json& r) { return !r.contains("result") || r["result"].value("isError", false); };

  nlohmann::json r = tool("write_file", {{"path", "ro.txt"}, {"content", "tool\n"}});
  EXPECT_FALSE(failed(r)) << r.dump();
  EXPECT_EQ(server.curl("-T " + quote(tmp + "/body.txt") + " " + quote(ws + "ro2.txt")).status, 204);
  r = tool("read_file", {{"path", "closed.txt"}});
  EXPECT_FALSE(failed(r)) << r.dump();
  const Reply get = server.curl(quote(ws + "closed.txt"));
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, "closed\n");
  if (::geteuid() == 0) {
    r = tool("read_file", {{"path", "foreign.txt"}});
    EXPECT_TRUE(failed(r)) << r.dump();
    EXPECT_NE(result_text(r).find("belongs to uid 12345"), std::string::npos) << r.dump();
    const Reply theirs = server.curl(quote(ws + "foreign.txt"));
    EXPECT_EQ(theirs.status, 403) << theirs.body;
    EXPECT_EQ(theirs.body.find("not the instance's"), std::string::npos);
  }
  const Result seen = d.env.run({"bwrap", id, "--", "/bin/sh", "-c", "cat ro.txt ro2.txt; stat -c %a ro.txt ro2.txt"});
  EXPECT_EQ(seen.out, "tool\nput\n444\n444\n") << seen.err;
  std::filesystem::remove_all(tmp);
}
