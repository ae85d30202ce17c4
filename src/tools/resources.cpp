// MCP resources: context documents (built in, plus [resource] context_dirs) and one resource
// per active instance.
#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <filesystem>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "store/store.hpp"
#include "tools/app.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

// Generated at build time from the repository's context/*.md.
extern const std::pair<std::string_view, std::string_view> kBuiltinContext[];
extern const std::size_t kBuiltinContextCount;

namespace {

namespace stdfs = std::filesystem;

constexpr std::string_view kContextPrefix = "resource://ns-hpc/context/";
constexpr std::string_view kInstancePrefix = "resource://ns-hpc/instances/";
constexpr std::int64_t kMaxDocumentBytes = 4 * 1024 * 1024;

std::string mime_for(const std::string& name) {
  if (name.ends_with(".md")) return "text/markdown";
  if (name.ends_with(".json")) return "application/json";
  return "text/plain";
}

struct Document {
  std::string name;
  std::optional<stdfs::path> file;     // from a context dir
  std::optional<std::string_view> text;  // built in
  std::int64_t size = 0;
};

// What each built-in guide is for, as the resource's description (the agent picks by it).
std::string guide_description(const std::string& name) {
  static const std::map<std::string, std::string, std::less<>> kGuides = {
      {"ns-hpc.md", "Start here: instances, their workspace and output, which tool does what, network modes."},
      {"jobs.md", "terminal_execute or a job: when to wait and when to submit, polling, limits, cancelling, Slurm mode."},
      {"sandbox.md", "Inside the sandbox: which files persist, your identity and limits, good habits."},
      {"slurm.md", "Slurm basics for cluster jobs: compute nodes, resources, why a job is pending."},
  };
  auto it = kGuides.find(name);
  return it != kGuides.end() ? it->second : "Built-in guide to using ns-hpc: " + name;
}

class Resources final : public mcp::ResourceProvider {
 public:
  explicit Resources(ToolContext ctx) : ctx_(std::move(ctx)) {}

  std::vector<mcp::Resource> list() override {
    std::size_t total = 0;
    return list_range(0, 0, total);
  }

  // The documents, then the instances by id: one page of them from the store's index.
  std::vector<mcp::Resource> list_range(std::size_t start, std::size_t count, std::size_t& total) override {
    std::vector<mcp::Resource> out;
    const auto docs = documents();
    std::size_t position = 0;
    for (const auto& [name, doc] : docs) {
      if (position++ < start || (count != 0 && out.size() >= count)) continue;
      out.push_back({std::string(kContextPrefix) + name, name, title_of(name),
                     doc.file ? "Context document from " + doc.file->parent_path().string() : guide_description(name),
                     mime_for(name), doc.size});
    }
    store::ListQuery query;
    query.sort = store::SortBy::id;
    query.offset = start > docs.size() ? start - docs.size() : 0;
    query.limit = count == 0 ? 0 : count - out.size();
    store::Page page;
    if (count == 0 || query.limit > 0) {
      page = ctx_.services.instances.store().list_page(query);
    } else {
      query.limit = 1;  // only the total is needed
      page = ctx_.services.instances.store().list_page(query);
      page.instances.clear();
    }
    for (const auto& inst : page.instances) {
      out.push_back({instance_uri(inst.id), "instance " + inst.id, "Instance " + inst.id,
                     inst.meta.description().empty() ? "An ns-hpc instance" : inst.meta.description(),
                     "application/json", std::nullopt});
    }
    total = docs.size() + page.total;
    return out;
  }

  std::vector<mcp::ResourceTemplate> templates() override {
    return {{std::string(kInstancePrefix) + "{id}", "instance", "An instance",
             "Metadata of an instance: description, times, network, sandbox paths", "application/json"},
            {std::string(kInstancePrefix) + "{id}/files/{path}", "instance file", "A file of an instance",
             "Any file of an instance's workspace or output (path like workspace/notes.txt), as text or a blob",
             ""}};
  }

  std::optional<std::vector<mcp::ResourceContents>> read(const std::string& uri) override {
    if (uri.starts_with(kContextPrefix)) return read_document(uri, uri.substr(kContextPrefix.size()));
    if (uri.starts_with(kInstancePrefix)) {
      const std::string rest = uri.substr(kInstancePrefix.size());
      const auto files = rest.find("/files/");
      if (files != std::string::npos)
        return read_file_resource(ctx_, uri, rest.substr(0, files), rest.substr(files + 7));
      return read_instance(uri, rest);
    }
    return std::nullopt;
  }

 private:
  static std::string title_of(const std::string& name) {
    std::string stem = name.substr(0, name.rfind('.'));
    return stem.empty() ? name : stem;
  }

  // Documents by name: files from the configured folders (the first folder with a name wins),
  // then the built-in ones not overridden.
  std::map<std::string, Document> documents() const {
    std::map<std::string, Document> docs;
    const auto& cfg = ctx_.services.config.resource;
    for (const stdfs::path& dir : cfg.context_dirs) {
      std::error_code ec;
      for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (!entry.is_regular_file(ec) || docs.count(name)) continue;
        const bool wanted = std::any_of(cfg.resource_patterns.begin(), cfg.resource_patterns.end(),
                                        [&](const std::string& p) { return ::fnmatch(p.c_str(), name.c_str(), 0) == 0; });
        if (!wanted) continue;
        docs[name] = Document{name, entry.path(), std::nullopt, static_cast<std::int64_t>(entry.file_size(ec))};
      }
    }
    for (std::size_t i = 0; i < kBuiltinContextCount; ++i) {
      const std::string name(kBuiltinContext[i].first);
      if (!docs.count(name))
        docs[name] = Document{name, std::nullopt, kBuiltinContext[i].second,
                              static_cast<std::int64_t>(kBuiltinContext[i].second.size())};
    }
    return docs;
  }

  std::optional<std::vector<mcp::ResourceContents>> read_document(const std::string& uri, const std::string& name) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return std::nullopt;
    auto docs = documents();
    auto it = docs.find(name);
    if (it == docs.end()) return std::nullopt;
    const Document& doc = it->second;
    std::string text;
    if (doc.text) {
      text = std::string(*doc.text);
    } else {
      if (doc.size > kMaxDocumentBytes)
        throw mcp::ProtocolError(mcp::kInternalError,
                                 fmt::format("context document {} is larger than {} bytes", name, kMaxDocumentBytes));
      auto content = fs::read_file(*doc.file);
      if (!content) return std::nullopt;
      text = std::move(*content);
    }
    return std::vector<mcp::ResourceContents>{{uri, mime_for(name), std::move(text), std::nullopt}};
  }

  std::optional<std::vector<mcp::ResourceContents>> read_instance(const std::string& uri, const std::string& id) {
    try {
      if (!ctx_.services.instances.store().exists(id)) return std::nullopt;
      store::Instance inst = ctx_.services.instances.store().get(id);
      return std::vector<mcp::ResourceContents>{
          {uri, "application/json", agent_instance_json(ctx_, inst).dump(2), std::nullopt}};
    } catch (const UsageError&) {
      return std::nullopt;  // an invalid id names no resource
    }
  }

  ToolContext ctx_;
};

}  // namespace

// With the dashboard's MCP App (ui://ns-hpc/dashboard) listed first.
std::shared_ptr<mcp::ResourceProvider> make_resources(const ToolContext& ctx) {
  return app::with_app(std::make_shared<Resources>(ctx));
}

LivingStateWatch::LivingStateWatch(mcp::Server& server, Services services, std::chrono::milliseconds interval)
    : server_(server), services_(services), interval_(interval), thread_([this](std::stop_token stop) { run(stop); }) {}

LivingStateWatch::~LivingStateWatch() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void LivingStateWatch::run(std::stop_token stop) {
  const std::string prefix = instance_uri("");
  std::mutex mu;
  std::condition_variable_any cv;
  while (!stop.stop_requested()) {
    for (const std::string& uri : server_.subscribed_uris()) {
      if (!uri.starts_with(prefix)) continue;
      std::string state = "gone";
      try {
        const store::Instance inst = services_.instances.store().get(uri.substr(prefix.size()));
        if (!inst.persistent) continue;
        const sandbox::LivingStatus st = services_.instances.living_status(inst);
        state = st.running ? fmt::format("running {}", st.since ? st.since->time_since_epoch().count() : 0) : "stopped";
      } catch (const std::exception&) {
      }
      auto [it, fresh] = last_.try_emplace(uri, state);
      if (!fresh && it->second != state) {
        it->second = state;
        server_.notify_resource_updated(uri);
      }
    }
    std::unique_lock lock(mu);
    cv.wait_for(lock, stop, interval_, [] { return false; });
  }
}

}  // namespace nshpc::tools
