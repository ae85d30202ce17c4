// libFuzzer target over WebDAV requests, straight into the handler (src/dav) with ASan and UBSan:
// the method, the path, the If, Depth, Destination, Overwrite, Range, Timeout and Lock-Token
// headers and an XML body come from the input, against a real store with one instance whose
// workspace holds files, a folder and a symlink out. Whatever arrives, the handler must answer
// with a status (never a crash, never 500: bad input is the client's error) and never touch
// anything outside the workspace.
//
// Input: one byte picks the method, then newline-separated fields
//   path \n If \n Depth \n Destination \n Overwrite \n Range \n Timeout \n Lock-Token \n body...
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "config/config.hpp"
#include "dav/handler.hpp"
#include "instances/instances.hpp"

namespace stdfs = std::filesystem;
using namespace nshpc;

namespace {

constexpr const char* kMethods[] = {"GET", "HEAD", "PUT", "DELETE", "MKCOL", "COPY", "MOVE", "PROPFIND",
                                    "PROPPATCH", "LOCK", "UNLOCK", "OPTIONS", "POST", "TRACE"};

class MemoryBody final : public transport::BodyReader {
 public:
  explicit MemoryBody(std::string_view data) : data_(data) {}
  std::size_t read(char* into, std::size_t n) override {
    const std::size_t take = std::min(n, data_.size());
    std::copy_n(data_.data(), take, into);
    data_.remove_prefix(take);
    return take;
  }
  bool too_large() const override { return false; }

 private:
  std::string_view data_;
};

struct World {
  stdfs::path root;
  config::Config config = config::built_in();
  std::unique_ptr<nshpc::instances::Service> instances;
  std::unique_ptr<dav::DavHandler> handler;
  stdfs::path outside;

  World() {
    char tmpl[] = "/tmp/nshpc-fuzz-dav-XXXXXX";
    root = ::mkdtemp(tmpl);
    config.ns.instances_dir = root / "instances";
    config.ns.sandbox_uid = static_cast<std::uint32_t>(::getuid());
    config.ns.sandbox_gid = static_cast<std::uint32_t>(::getgid());
    config.server.state_dir = root / "state";
    stdfs::create_directories(config.server.state_dir);
    instances = std::make_unique<nshpc::instances::Service>(config);
    const store::Instance inst = instances->create("fz", {}, "fuzz");
    std::ofstream(inst.workspace / "a.txt") << "alpha";
    stdfs::create_directories(inst.workspace / "dir/sub");
    std::ofstream(inst.workspace / "dir/b.txt") << "beta";
    outside = root / "outside.txt";
    std::ofstream(outside) << "outside";
    stdfs::create_symlink(outside, inst.workspace / "link");
    dav::DavSettings settings = dav::DavHandler::settings_from(config);
    handler = std::make_unique<dav::DavHandler>(*instances, settings);
  }
};

World& world() {
  static World w;
  return w;
}

std::string_view next_field(std::string_view& rest) {
  const auto nl = rest.find('\n');
  std::string_view field = rest.substr(0, nl);
  rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  return field;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  World& w = world();
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  transport::HttpRequest req;
  req.method = kMethods[data[0] % (sizeof kMethods / sizeof *kMethods)];
  const std::string_view path = next_field(rest);
  req.target = !path.empty() && path.front() == '/' ? std::string(path) : "/dav/instances/fz/workspace/" + std::string(path);
  static constexpr const char* kHeaders[] = {"if", "depth", "destination", "overwrite", "range", "timeout", "lock-token"};
  for (const char* name : kHeaders) {
    const std::string_view value = next_field(rest);
    if (!value.empty()) req.headers[name] = std::string(value);
  }
  if (const auto d = req.headers.find("destination"); d != req.headers.end() && d->second.front() != '/' &&
                                                      d->second.find("://") == std::string::npos)
    d->second = "/dav/instances/fz/workspace/" + d->second;
  if (!rest.empty()) req.headers["content-length"] = std::to_string(rest.size());
  MemoryBody body(rest);
  const transport::StreamResponse r = w.handler->handle(req, body);
  if (r.status < 100 || r.status > 599 || r.status == 500) {
    std::fprintf(stderr, "%s %s -> %d: %s\n", req.method.c_str(), req.target.c_str(), r.status, r.body.c_str());
    std::abort();
  }
  // The symlink's target outside the workspace is never changed.
  std::ifstream in(w.outside);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (content != "outside") std::abort();
  return 0;
}
