// The computer's file tools (read_file, write_file, edit_file of `ns-hpc computer`) as an agent
// meets them, and as an attacker inside the computer would try them: the seed's contract anywhere
// in the computer, images shown as images, and never more than the computer's own root could do
// from inside — no kernel interface (its /proc, /proc/sys, devices), no file of another uid, no
// FIFO or device opened, no write through a link, nothing of the host or of another instance,
// however the computer swaps its files meanwhile. Computers run on make test's image 'test'
// (scripts/test-image.sh); without it these skip.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "harness.hpp"

using namespace nshpc::test;
using nlohmann::json;

namespace {

const fs::path kCache = test_image_cache();
const bool kRoot = ::geteuid() == 0;

// A 1x1 PNG.
constexpr const char* kDotPng =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

std::uint32_t crc32(const std::string& data) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A grey `width` x `height` PNG (8-bit greyscale, stored deflate blocks: no zlib needed).
std::string grey_png(std::uint32_t width, std::uint32_t height) {
  std::string raw;
  for (std::uint32_t y = 0; y < height; ++y) {
    raw += '\0';  // filter: none
    for (std::uint32_t x = 0; x < width; ++x) raw += static_cast<char>((x * 7 + y * 3) & 0xff);
  }
  std::string z = "\x78\x01";
  for (std::size_t at = 0; at < raw.size();) {
    const std::size_t n = std::min<std::size_t>(65535, raw.size() - at);
    const bool last = at + n == raw.size();
    z += static_cast<char>(last ? 1 : 0);
    z += static_cast<char>(n & 0xff);
    z += static_cast<char>(n >> 8);
    z += static_cast<char>(~n & 0xff);
    z += static_cast<char>((~n >> 8) & 0xff);
    z.append(raw, at, n);
    at += n;
  }
  std::uint32_t a = 1, b = 0;
  for (unsigned char ch : raw) {
    a = (a + ch) % 65521;
    b = (b + a) % 65521;
  }
  z += be32((b << 16) | a);
  auto chunk = [](const std::string& type, const std::string& data) {
    return be32(static_cast<std::uint32_t>(data.size())) + type + data + be32(crc32(type + data));
  };
  std::string ihdr = be32(width) + be32(height) + std::string("\x08\x00\x00\x00\x00", 5);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", z) + chunk("IEND", "");
}

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const std::uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8) |
                            static_cast<unsigned char>(in[i + 2]);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], t[v & 63]};
  }
  if (i + 1 == in.size()) {
    const std::uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    out += {t[v >> 18], t[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const std::uint32_t v = (static_cast<unsigned char>(in[i]) << 16) | (static_cast<unsigned char>(in[i + 1]) << 8);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
  }
  return out;
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// One tool call's answer: the seed's JSON object (the text) and the whole result.
struct Answer {
  bool error = false;
  json body;    // the text, parsed
  json result;  // the JSON-RPC result
  std::string error_text() const { return body.value("error", std::string()); }
};

// `ns-hpc computer` on stdio (COMPUTER_ID=`id`, network off), spoken to line by line.
class ComputerServer {
 public:
  ComputerServer(const Env& env, const std::string& id) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) || ::pipe2(out, O_CLOEXEC)) throw std::runtime_error("pipe");
    std::vector<std::string> argv = env.argv_for({"computer", "--no-network"});
    std::vector<std::string> vars = env.env_for({"COMPUTER_ID=" + id});
    auto c_strings = [](std::vector<std::string>& v) {
      std::vector<char*> p;
      for (auto& s : v) p.push_back(s.data());
      p.push_back(nullptr);
      return p;
    };
    auto argv_c = c_strings(argv);
    auto env_c = c_strings(vars);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execve(argv_c[0], argv_c.data(), env_c.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    const int init = send_request("initialize", {{"protocolVersion", "2025-06-18"},
                                                 {"capabilities", json::object()},
                                                 {"clientInfo", {{"name", "computer-files"}, {"version", "1"}}}});
    if (!wait_for(init).is_object()) ADD_FAILURE() << "ns-hpc computer did not answer initialize";
    write_line({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  }
  ~ComputerServer() {
    ::close(to_);
    if (wait_child(pid_, std::chrono::seconds(20)) < 0) {
      ADD_FAILURE() << "the server did not stop at the end of its input";
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(from_);
  }
  ComputerServer(const ComputerServer&) = delete;
  ComputerServer& operator=(const ComputerServer&) = delete;

  // Sends a tools/call; its id.
  int start(const std::string& tool, const json& args) {
    return send_request("tools/call", {{"name", tool}, {"arguments", args}});
  }
  Answer answer(int id, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const json response = wait_for(id, timeout);
    Answer a;
    if (!response.is_object() || !response.contains("result")) {
      ADD_FAILURE() << "no answer to request " << id << ": " << response.dump();
      a.error = true;
      return a;
    }
    a.result = response["result"];
    a.error = a.result.value("isError", false);
    for (const auto& c : a.result["content"])
      if (c.value("type", "") == "text") {
        a.body = nshpc::parse_json_or_discarded(c.value("text", ""));
        break;
      }
    return a;
  }
  Answer call(const std::string& tool, const json& args, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    return answer(start(tool, args), timeout);
  }
  // A call that must succeed: its body.
  json ok(const std::string& tool, const json& args) {
    const Answer a = call(tool, args);
    EXPECT_FALSE(a.error) << tool << " " << args.dump() << ": " << a.result.dump();
    return a.body;
  }
  // terminal_execute that must exit 0: its stdout.
  std::string sh(const std::string& command) {
    const json r = ok("terminal_execute", {{"command", command}});
    EXPECT_EQ(r.value("exit_code", -1), 0) << command << ": " << r.dump();
    return r.value("stdout", std::string());
  }

 private:
  void write_line(const json& message) {
    const std::string line = message.dump() + "\n";
    if (::write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ADD_FAILURE() << "write";
  }
  int send_request(const std::string& method, const json& params) {
    const int id = ++next_id_;
    write_line({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    return id;
  }
  json wait_for(int id, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it)
        if (it->contains("id") && (*it)["id"] == id) {
          json found = std::move(*it);
          pending_.erase(it);
          return found;
        }
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        json message = nshpc::parse_json_or_discarded(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
        if (message.is_object()) pending_.push_back(std::move(message));
        continue;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return nullptr;
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::read(from_, buf, sizeof buf);
      if (n <= 0) return nullptr;
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int next_id_ = 0;
  std::string buffer_;
  std::vector<json> pending_;
};

class ComputerFiles : public ::testing::Test {
 protected:
  ComputerFiles() : env_("images_dir = \"" + (kCache / "images").string() + "\"\ndefault_image = \"test\"\n") {}

  void SetUp() override {
    if (!fs::exists(kCache / "images/test/current"))
      GTEST_SKIP() << "no test image in " << kCache << " (scripts/test-image.sh, run by make test, builds it)";
  }
  void TearDown() override {
    // Computers never stop for idleness: their sandboxes end here, with the test.
    for (const char* id : {kId, "other"})
      if (fs::exists(env_.instances() / id)) env_.run({"instance", "stop", id});
  }

  fs::path workspace() const { return env_.instances() / kId / "workspace"; }
  uid_t computer_root() const {
    const json meta = nshpc::parse_json(read_text(env_.instances() / kId / "metadata.json"));
    return meta["ids"]["host_base"].get<uid_t>();
  }

  static constexpr const char* kId = "files-test";
  Env env_;
};

}  // namespace

TEST_F(ComputerFiles, KeepTheSeedsContractAnywhereInTheComputer) {
  ComputerServer c(env_, kId);
  // Relative to /workspace, parents made, given to the computer's root.
  json w = c.ok("write_file", {{"path", "notes/a.txt"}, {"content", "one\ntwo\n"}});
  EXPECT_EQ(w["path"], "/workspace/notes/a.txt");
  EXPECT_EQ(w["created_parent_directories"], true);
  EXPECT_EQ(w["size_bytes"], 8);
  EXPECT_EQ(w["operation"], "write_file");
  EXPECT_EQ(w["computer_id"], kId);
  EXPECT_EQ(w["workspace_directory"], "/workspace");
  struct stat st {};
  ASSERT_EQ(::stat((workspace() / "notes/a.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, computer_root());
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  json r = c.ok("read_file", {{"path", "/workspace/notes/a.txt"}});
  EXPECT_EQ(r["content"], "one\ntwo\n");
  EXPECT_EQ(r["sha256"], w["sha256"]);
  EXPECT_TRUE(r["visualization_warning"].is_null());
  EXPECT_EQ(r.size(), 11u) << r.dump();  // the seed's fields, no more
  EXPECT_EQ(c.ok("write_file", {{"path", "notes/b.txt"}, {"content", ""}})["created_parent_directories"], false);

  // Anywhere in the computer, as its root: its own /etc, a new folder under /opt.
  EXPECT_EQ(c.ok("read_file", {{"path", "/etc/hostname"}})["content"], c.sh("cat /etc/hostname"));
  c.ok("write_file", {{"path", "/opt/tool/conf.ini"}, {"content", "x=1\n"}});
  EXPECT_EQ(c.sh("stat -c '%u %g %a' /opt/tool/conf.ini; cat /opt/tool/conf.ini"), "0 0 644\nx=1\n");
  // A replaced file keeps its mode (and owner); the edit is guarded and exact.
  c.sh("chmod 751 /opt/tool/conf.ini");
  json e = c.ok("edit_file", {{"path", "/opt/tool/conf.ini"}, {"old_text", "x=1"}, {"new_text", "x=2"}});
  EXPECT_EQ(e["replacements"], 1);
  EXPECT_EQ(e["old_text"], "x=1");
  EXPECT_EQ(c.sh("stat -c '%u %g %a' /opt/tool/conf.ini; cat /opt/tool/conf.ini"), "0 0 751\nx=2\n");
  c.ok("write_file", {{"path", "notes/c.txt"}, {"content", "a a a"}});
  EXPECT_EQ(c.ok("edit_file", {{"path", "notes/c.txt"}, {"old_text", "a"}, {"new_text", "b"}, {"replace_all", true}})
                ["replacements"],
            3);

  // The seed's messages.
  auto error_of = [&](const std::string& tool, const json& args) {
    const Answer a = c.call(tool, args);
    EXPECT_TRUE(a.error) << tool << " " << args.dump() << ": " << a.result.dump();
    EXPECT_EQ(a.body["operation"], tool);
    EXPECT_EQ(a.body["computer_id"], kId);
    return a.error_text();
  };
  EXPECT_EQ(error_of("read_file", {{"path", "nope.txt"}}), "File does not exist: /workspace/nope.txt");
  EXPECT_EQ(error_of("read_file", {{"path", "/workspace"}}), "Path is not a regular file: /workspace");
  c.sh("printf 'a\\377b' > /workspace/bin.dat; head -c 1048577 /dev/zero | tr '\\0' x > /workspace/big.txt");
  EXPECT_EQ(error_of("read_file", {{"path", "bin.dat"}}), "File is not valid UTF-8 text at byte 1: /workspace/bin.dat");
  // Past the seed's 1 MiB a text comes in pages (--whole-output keeps the seed's refusal:
  // tests/e2e/computer.test.mjs).
  EXPECT_EQ(c.ok("read_file", {{"path", "big.txt"}})["lines"], (json{{"first", 1}, {"last", 1}, {"total", 1}}));
  EXPECT_EQ(error_of("write_file", {{"path", "none/x.txt"}, {"content", "x"}, {"create_parent_directories", false}}),
            "Parent directory does not exist: /workspace/none/x.txt");
  EXPECT_EQ(error_of("write_file", {{"path", "notes"}, {"content", "x"}}), "Path is not a regular file: /workspace/notes");
  EXPECT_EQ(error_of("edit_file", {{"path", "notes/a.txt"}, {"old_text", "three"}, {"new_text", "3"}}),
            "old_text was not found in /workspace/notes/a.txt");
  c.ok("write_file", {{"path", "notes/d.txt"}, {"content", "x x"}});
  EXPECT_EQ(error_of("edit_file", {{"path", "notes/d.txt"}, {"old_text", "x"}, {"new_text", "y"}}),
            "old_text occurs 2 times in /workspace/notes/d.txt; provide more surrounding text or set replace_all=true");
}

// A text too long for one result comes in pages of whole lines, each result under 64 KB (the
// seed returned up to 1 MiB, twice over); following next_offset gives back the file exactly.
TEST_F(ComputerFiles, ALongTextComesInPagesThatFitAResult) {
  ComputerServer c(env_, kId);
  c.sh("seq -f 'line %g \"quoted\" and a tab:here' 1 20000 | sed 's/:/\\t/' > /workspace/long.txt; "
       "head -c 100000 /dev/zero | tr '\\0' y > /workspace/one.txt");
  const std::string whole = read_text(workspace() / "long.txt");
  std::string joined;
  std::size_t offset = 1, pages = 0;
  json page;
  for (;;) {
    json args = {{"path", "long.txt"}};
    if (offset > 1) args["offset"] = offset;
    const Answer a = c.call("read_file", args);
    ASSERT_FALSE(a.error) << a.result.dump().substr(0, 400);
    EXPECT_LE(a.result.dump().size(), 65536u);
    page = a.body;
    EXPECT_EQ(page["size_bytes"], whole.size());  // the whole file's, as its sha256
    EXPECT_EQ(page["lines"]["first"], offset);
    EXPECT_EQ(page["lines"]["total"], 20000);
    joined += page["content"].get<std::string>();
    ++pages;
    if (!page.contains("next_offset")) break;
    EXPECT_EQ(page["next_offset"], page["lines"]["last"].get<std::size_t>() + 1);
    offset = page["next_offset"];
    ASSERT_LT(pages, 100u);
  }
  EXPECT_EQ(joined, whole);
  EXPECT_GT(pages, 10u);
  EXPECT_EQ(page["lines"]["last"], 20000);
  // A page further in; past the end is said.
  EXPECT_EQ(c.ok("read_file", {{"path", "long.txt"}, {"offset", 19999}})["content"],
            "line 19999 \"quoted\" and a tab\there\nline 20000 \"quoted\" and a tab\there\n");
  const Answer past = c.call("read_file", {{"path", "long.txt"}, {"offset", 20002}});
  EXPECT_TRUE(past.error);
  EXPECT_EQ(past.error_text(), "offset 20002 is past the end: the file has 20000 line(s)");
  // One line longer than a page: as much as fits, said so.
  const Answer one = c.call("read_file", {{"path", "one.txt"}});
  ASSERT_FALSE(one.error);
  EXPECT_LE(one.result.dump().size(), 65536u);
  EXPECT_EQ(one.body["line_cut"], true);
  EXPECT_GT(one.body["content"].get<std::string>().size(), 10000u);
}

TEST_F(ComputerFiles, ReadFileShowsAnImage) {
  ComputerServer c(env_, kId);
  const json put = c.ok("terminal_execute", {{"command", "base64 -d > /workspace/dot.png"}, {"stdin", kDotPng}});
  ASSERT_EQ(put.value("exit_code", -1), 0) << put.dump();
  const Answer dot = c.call("read_file", {{"path", "dot.png"}});
  ASSERT_FALSE(dot.error) << dot.result.dump();
  // The seed's fields (content empty: an image has no text), `image` saying what it is, and an
  // image block.
  EXPECT_EQ(dot.body["content"], "");
  EXPECT_EQ(dot.body["path"], "/workspace/dot.png");
  EXPECT_EQ(dot.body["image"]["mime"], "image/png");
  EXPECT_EQ(dot.body["image"]["width"], 1);
  EXPECT_EQ(dot.body["image"]["height"], 1);
  EXPECT_EQ(dot.body["image"]["scaled"], false);
  EXPECT_EQ(dot.body, dot.result["structuredContent"]);
  ASSERT_EQ(dot.result["content"].size(), 2u) << dot.result.dump();
  EXPECT_EQ(dot.result["content"][1]["type"], "image");
  EXPECT_EQ(dot.result["content"][1]["mimeType"], "image/png");
  EXPECT_EQ(dot.result["content"][1]["data"], kDotPng);

  // A wide one is shown scaled to 1568 pixels; the text stays small, the image block bounded.
  const std::string wide = grey_png(3000, 40);
  const json big = c.ok("terminal_execute", {{"command", "base64 -d > /workspace/wide.png"}, {"stdin", base64(wide)}});
  ASSERT_EQ(big.value("exit_code", -1), 0) << big.dump();
  const Answer shown = c.call("read_file", {{"path", "/workspace/wide.png"}});
  ASSERT_FALSE(shown.error) << shown.result.dump();
  EXPECT_EQ(shown.body["size_bytes"], wide.size());
  EXPECT_EQ(shown.body["image"]["width"], 3000);
  EXPECT_EQ(shown.body["image"]["scaled"], true);
  EXPECT_EQ(shown.body["image"]["shown_width"], 1568);
  EXPECT_LT(shown.result["content"][0]["text"].get<std::string>().size(), 1024u);
  EXPECT_LE(shown.result["content"][1]["data"].get<std::string>().size(), 2u << 20);
  // Not text: an edit refuses it as the seed does.
  const Answer edit = c.call("edit_file", {{"path", "dot.png"}, {"old_text", "PNG"}, {"new_text", "GIF"}});
  EXPECT_TRUE(edit.error);
  EXPECT_EQ(edit.error_text().rfind("File is not valid UTF-8 text at byte 0: /workspace/dot.png", 0), 0u)
      << edit.error_text();
}

TEST_F(ComputerFiles, NeverReachKernelInterfacesTheHostOrAnotherInstance) {
  ComputerServer c(env_, kId);
  const std::string hostname = host_name();
  auto refused = [&](const std::string& tool, const json& args) {
    const Answer a = c.call(tool, args);
    EXPECT_TRUE(a.error) << tool << " " << args.dump() << ": " << a.result.dump();
    return a.error_text();
  };
  // The computer's /proc (its own processes' files are regular files there, and the computer's
  // uid's) and the host's /proc/sys, bound read-only.
  for (const char* path : {"/proc/1/environ", "/proc/1/status", "/proc/sys/kernel/hostname", "/proc/version"})
    EXPECT_NE(refused("read_file", {{"path", path}}).find("on proc, a kernel interface"), std::string::npos) << path;
  EXPECT_NE(refused("write_file", {{"path", "/proc/sys/kernel/hostname"}, {"content", "pwned"}}).find("kernel interface"),
            std::string::npos);
  EXPECT_NE(refused("write_file", {{"path", "/proc/sys/kernel/new-file"}, {"content", "x"}}).find("kernel interface"),
            std::string::npos);
  EXPECT_NE(refused("write_file", {{"path", "/proc/1/x/y"}, {"content", "x"}}), "");
  EXPECT_NE(refused("edit_file", {{"path", "/proc/sys/kernel/hostname"}, {"old_text", hostname}, {"new_text", "pwned"}})
                .find("kernel interface"),
            std::string::npos);
  // Through the computer's links: to them, to magic links, and out of the computer.
  const fs::path outside = env_.root() / "host-secret.txt";
  std::ofstream(outside) << "host secret\n";
  c.sh("ln -s /proc/sys/kernel/hostname /workspace/hn; ln -s /proc/1/environ /workspace/env; "
       "ln -s /proc/1/root/etc/hostname /workspace/magic; ln -s '" + outside.string() + "' /workspace/out; "
       "ln -s ../../../../../../../../../.. /workspace/up");
  for (const char* link : {"hn", "env"})
    EXPECT_NE(refused("read_file", {{"path", link}}).find("kernel interface"), std::string::npos) << link;
  EXPECT_NE(refused("read_file", {{"path", "magic"}}), "");
  EXPECT_EQ(refused("read_file", {{"path", "out"}}), "Path is not a regular file: /workspace/out");
  EXPECT_EQ(refused("read_file", {{"path", "up" + outside.string()}}), "File does not exist: /workspace/up" + outside.string());
  EXPECT_EQ(refused("read_file", {{"path", "../../../../.." + outside.string()}}),
            "File does not exist: /workspace/../../../../.." + outside.string());
  // ".." stays in the computer: its own /etc/hostname.
  EXPECT_EQ(c.ok("read_file", {{"path", "../../../../../../etc/hostname"}})["content"], c.sh("cat /etc/hostname"));
  // /etc/shadow through a link is the computer's own, never the host's.
  c.sh("ln -s /etc/shadow /workspace/shadow");
  const std::string shadow = c.ok("read_file", {{"path", "shadow"}}).value("content", std::string());
  EXPECT_EQ(shadow, c.sh("cat /etc/shadow"));
  if (kRoot) {
    EXPECT_NE(shadow, read_text("/etc/shadow"));
  }
  // A write through a link to a kernel interface replaces the link; the host is untouched.
  c.ok("write_file", {{"path", "hn"}, {"content", "pwned"}});
  EXPECT_EQ(c.sh("test -f /workspace/hn && ! test -L /workspace/hn && cat /workspace/hn"), "pwned");
  EXPECT_EQ(host_name(), hostname);
  EXPECT_EQ(read_text(outside), "host secret\n");

  // Another instance's files: not by its host path, not by its id (no computer), not through /proc.
  env_.create("other", {"--image", "test"});
  std::ofstream(env_.instances() / "other/workspace/secret.txt") << "other secret\n";
  const std::string theirs = (env_.instances() / "other/workspace/secret.txt").string();
  EXPECT_EQ(refused("read_file", {{"path", theirs}}), "File does not exist: " + theirs);
  c.sh("ln -s '" + theirs + "' /workspace/theirs");
  EXPECT_EQ(refused("read_file", {{"path", "theirs"}}), "Path is not a regular file: /workspace/theirs");
  EXPECT_NE(refused("read_file", {{"path", "/workspace/secret.txt"}, {"computer_id", "other"}}), "");
  ASSERT_EQ(env_.run({"bwrap", "other", "--", "true"}).exit_code, 0);  // its sandbox runs
  for (const char* path : {"/proc/1/root/workspace/secret.txt", "/proc/2/root/workspace/secret.txt"})
    EXPECT_EQ(refused("read_file", {{"path", path}}).find("other secret"), std::string::npos);
}

TEST_F(ComputerFiles, NeverOpenFifosOrDevicesNorWriteThroughALink) {
  ComputerServer c(env_, kId);
  auto refused = [&](const std::string& tool, const json& args) {
    const Answer a = c.call(tool, args, std::chrono::seconds(20));  // a FIFO opened would block: no answer
    EXPECT_TRUE(a.error) << tool << " " << args.dump() << ": " << a.result.dump();
    return a.error_text();
  };
  c.sh("mkfifo /workspace/fifo && ln -s /workspace/fifo /workspace/to-fifo && ln -s /dev/zero /workspace/zero");
  for (const char* path : {"fifo", "to-fifo", "zero", "/dev/zero", "/dev/null", "/dev/pts/ptmx"}) {
    const std::string shown = path[0] == '/' ? path : std::string("/workspace/") + path;
    EXPECT_EQ(refused("read_file", {{"path", path}}), "Path is not a regular file: " + shown);
    EXPECT_EQ(refused("edit_file", {{"path", path}, {"old_text", "a"}, {"new_text", "b"}}),
              "Path is not a regular file: " + shown);
  }
  EXPECT_EQ(refused("write_file", {{"path", "fifo"}, {"content", "x"}}), "Path is not a regular file: /workspace/fifo");
  EXPECT_EQ(refused("write_file", {{"path", "to-fifo"}, {"content", "x"}}),
            "Path is not a regular file: /workspace/to-fifo");
  EXPECT_EQ(c.sh("test -p /workspace/fifo && echo fifo"), "fifo\n");
  if (kRoot) {
    // A device node (only the host can make one there): never opened, never replaced.
    ASSERT_EQ(::mknod((workspace() / "dev").c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0);
    ::chown((workspace() / "dev").c_str(), computer_root(), computer_root());
    EXPECT_EQ(refused("read_file", {{"path", "dev"}}), "Path is not a regular file: /workspace/dev");
    EXPECT_EQ(refused("write_file", {{"path", "dev"}, {"content", "x"}}), "Path is not a regular file: /workspace/dev");
  }
  // A link at the last component is replaced, never written through.
  c.sh("echo original > /etc/motd.orig && ln -s /etc/motd.orig /workspace/link");
  c.ok("write_file", {{"path", "link"}, {"content", "new"}});
  EXPECT_EQ(c.sh("cat /etc/motd.orig; test -L /workspace/link || cat /workspace/link"), "original\nnew");
}

TEST_F(ComputerFiles, FilesOfTheComputersAccountsAreItsOwnButNoOneElses) {
  ComputerServer c(env_, kId);
  c.sh("true");  // the computer is made
  const json meta = nshpc::parse_json(read_text(env_.instances() / kId / "metadata.json"));
  const bool accounts = meta["ids"].value("map", "") != "single";
  if (accounts) {
    // A closed file of an account made inside: read and edited as the computer's root may, its
    // owner and mode kept.
    c.sh("mkdir -p /home/ann && echo 'secret of ann' > /home/ann/s && chown -R 1000:1000 /home/ann && "
         "chmod 700 /home/ann && chmod 600 /home/ann/s");
    EXPECT_EQ(c.ok("read_file", {{"path", "/home/ann/s"}})["content"], "secret of ann\n");
    c.ok("edit_file", {{"path", "/home/ann/s"}, {"old_text", "secret"}, {"new_text", "note"}});
    EXPECT_EQ(c.sh("stat -c '%u %g %a' /home/ann/s; cat /home/ann/s"), "1000 1000 600\nnote of ann\n");
    c.ok("write_file", {{"path", "/home/ann/new/t.txt"}, {"content", "t"}});
    EXPECT_EQ(c.sh("stat -c '%u' /home/ann/new/t.txt"), "0\n");
  }
  if (kRoot) {
    // A file of the host's (uid 0 outside: nobody inside), even world-readable: not the computer's.
    std::ofstream(workspace() / "hosts.txt") << "host's\n";
    ::chown((workspace() / "hosts.txt").c_str(), 0, 0);
    ::chmod((workspace() / "hosts.txt").c_str(), 0644);
    const Answer read = c.call("read_file", {{"path", "hosts.txt"}});
    EXPECT_TRUE(read.error);
    EXPECT_NE(read.error_text().find("belongs to uid 0"), std::string::npos) << read.error_text();
    const Answer write = c.call("write_file", {{"path", "hosts.txt"}, {"content", "mine"}});
    EXPECT_TRUE(write.error);
    EXPECT_EQ(read_text(workspace() / "hosts.txt"), "host's\n");
    // Nor a folder of the host's, to write in.
    fs::create_directory(workspace() / "hosts");
    ::chown((workspace() / "hosts").c_str(), 0, 0);
    ::chmod((workspace() / "hosts").c_str(), 0777);
    EXPECT_TRUE(c.call("write_file", {{"path", "hosts/x.txt"}, {"content", "x"}}).error);
    EXPECT_FALSE(fs::exists(workspace() / "hosts/x.txt"));
  }
}

TEST_F(ComputerFiles, AFileSwappedForALinkMeanwhileNeverLeadsOut) {
  ComputerServer c(env_, kId);
  c.sh("echo ok > /workspace/swap");
  // While a command in the computer swaps the file for links to a kernel interface, to the host
  // and to a FIFO, every read is the file or a refusal, never anything else, and never blocks.
  const int swapper = c.start(
      "terminal_execute",
      {{"command",
        "mkfifo /workspace/p; cd /workspace; for i in $(seq 400); do "
        "ln -sfn /proc/1/environ s.1 && mv -T s.1 swap; echo ok > s.2 && mv -T s.2 swap; "
        "ln -sfn /proc/sys/kernel/hostname s.3 && mv -T s.3 swap; ln -sfn p s.4 && mv -T s.4 swap; "
        "ln -sfn /etc/shadow s.5 && mv -T s.5 swap; done; rm swap; echo ok > swap"},
       {"timeout", 120}});
  const std::string hostname = host_name();
  const std::string shadow = c.sh("sha256sum < /etc/shadow");
  int answered = 0;
  for (int i = 0; i < 300; ++i) {
    const Answer a = c.call("read_file", {{"path", "swap"}}, std::chrono::seconds(20));
    if (!a.error) {
      ++answered;
      const std::string content = a.body.value("content", std::string());
      // The computer's own /etc/shadow is its own file: allowed.
      EXPECT_TRUE(content == "ok\n" || content.rfind("root:", 0) == 0) << content;
    }
    // A write meanwhile replaces whatever is there, never writing through a link.
    c.call("write_file", {{"path", "swap"}, {"content", "ok\n"}}, std::chrono::seconds(20));
  }
  const Answer done = c.answer(swapper, std::chrono::seconds(120));
  EXPECT_FALSE(done.error) << done.result.dump();
  EXPECT_GT(answered, 0);
  EXPECT_EQ(host_name(), hostname);
  EXPECT_EQ(c.sh("sha256sum < /etc/shadow"), shadow);
  EXPECT_EQ(c.sh("test -p /workspace/p && echo fifo"), "fifo\n");
  EXPECT_EQ(c.ok("read_file", {{"path", "swap"}})["content"], "ok\n");
}
