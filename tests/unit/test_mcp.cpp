// The MCP server core (src/mcp): JSON-RPC handling, lifecycle, tools/resources/prompts,
// pagination, logging, progress, cancellation and concurrency, driven through Session with a
// recording Send and a real-thread (or synchronous, or manual) Executor.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/json.hpp"
#include "base/text.hpp"
#include "mcp/protocol.hpp"
#include "mcp/server.hpp"
#include "base/text.hpp"
#include "mcp/validate.hpp"

namespace mcp = nshpc::mcp;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Generous: only reached when something is broken.
constexpr auto kWait = std::chrono::milliseconds(30000);

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = kWait) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Everything a Session sends, in order.
class Sink {
 public:
  void push(const json& message) {
    std::lock_guard lock(mu_);
    if (closed_) ++after_close_;
    messages_.push_back(message);
    cv_.notify_all();
  }

  std::vector<json> messages() const {
    std::lock_guard lock(mu_);
    return messages_;
  }

  // The response (result or error) for `id`, waiting for it.
  json response(const json& id, std::chrono::milliseconds limit = kWait) {
    std::unique_lock lock(mu_);
    json found;
    cv_.wait_for(lock, limit, [&] {
      for (const auto& m : messages_)
        if (is_response(m) && m["id"] == id) {
          found = m;
          return true;
        }
      return false;
    });
    if (found.is_null()) ADD_FAILURE() << "no response for id " << id.dump();
    return found;
  }

  // Whether a response for `id` is there now (no waiting).
  bool answered(const json& id) const {
    std::lock_guard lock(mu_);
    return std::any_of(messages_.begin(), messages_.end(),
                       [&](const json& m) { return is_response(m) && m["id"] == id; });
  }

  std::vector<json> notifications(const std::string& method) const {
    std::lock_guard lock(mu_);
    std::vector<json> out;
    for (const auto& m : messages_)
      if (m.value("method", "") == method) out.push_back(m);
    return out;
  }

  std::size_t size() const {
    std::lock_guard lock(mu_);
    return messages_.size();
  }

  void clear() {
    std::lock_guard lock(mu_);
    messages_.clear();
  }

  void mark_closed() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  int sent_after_close() const {
    std::lock_guard lock(mu_);
    return after_close_;
  }

 private:
  static bool is_response(const json& m) {
    return m.contains("id") && (m.contains("result") || m.contains("error"));
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<json> messages_;
  bool closed_ = false;
  int after_close_ = 0;
};

// Runs each piece of work on its own std::thread; join() waits for all of them.
class ThreadExecutor {
 public:
  ~ThreadExecutor() { join(); }
  mcp::Session::Executor executor() {
    return [this](std::function<void()> work) {
      std::lock_guard lock(mu_);
      threads_.emplace_back(std::move(work));
    };
  }
  void join() {
    for (;;) {
      std::vector<std::thread> threads;
      {
        std::lock_guard lock(mu_);
        threads.swap(threads_);
      }
      if (threads.empty()) return;
      for (auto& t : threads) t.join();
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

// Keeps work until the test runs it.
class ManualExecutor {
 public:
  mcp::Session::Executor executor() {
    return [this](std::function<void()> work) { queue_.push_back(std::move(work)); };
  }
  std::size_t pending() const { return queue_.size(); }
  void run_all() {
    while (!queue_.empty()) {
      auto work = std::move(queue_.front());
      queue_.pop_front();
      work();
    }
  }

 private:
  std::deque<std::function<void()>> queue_;
};

// What the slow tool reports to the test.
struct Probe {
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  std::atomic<int> saw_cancel{0};
  std::atomic<int> steps_done{-1};
  std::atomic<int> handler_calls{0};
};

class FakeResources : public mcp::ResourceProvider {
 public:
  std::vector<mcp::Resource> list() override {
    return {{"mem://a", "a", "Alpha", "first", "text/plain", 5},
            {"mem://b", "b", "", "", "", std::nullopt},
            {"mem://bin", "bin", "", "", "application/octet-stream", 3}};
  }
  std::vector<mcp::ResourceTemplate> templates() override {
    return {{"mem://{id}", "item", "Item", "one item", "text/plain"},
            {"mem://logs/{id}", "log", "", "", ""},
            {"mem://other/{id}", "other", "", "", ""}};
  }
  std::optional<std::vector<mcp::ResourceContents>> read(const std::string& uri) override {
    if (uri == "mem://a")
      return std::vector<mcp::ResourceContents>{{uri, "text/plain", "alpha", {}}};
    if (uri == "mem://bin")
      return std::vector<mcp::ResourceContents>{{uri, "application/octet-stream", {}, "AAEC"}};
    return std::nullopt;
  }
};

struct ServerSetup {
  mcp::ServerOptions options;
  bool resources = true;
  bool prompts = true;
};

std::unique_ptr<mcp::Server> make_server(const std::shared_ptr<Probe>& probe,
                                         ServerSetup setup = {}) {
  auto server = std::make_unique<mcp::Server>(
      mcp::ServerInfo{"ns-hpc", "NS HPC", "1.2.3", "Use the tools."}, setup.options);

  server->add_tool({
      .name = "echo",
      .title = "Echo",
      .description = "Repeats text",
      .input_schema = {{"type", "object"},
                       {"properties",
                        {{"text", {{"type", "string"}, {"minLength", 1}}},
                         {"count", {{"type", "integer"}, {"minimum", 1}, {"maximum", 10}}},
                         {"mode", {{"type", "string"}, {"enum", {"plain", "loud"}}}}}},
                       {"required", {"text"}},
                       {"additionalProperties", false}},
      .annotations = json{{"readOnlyHint", true}},
      .handler =
          [](const json& args, mcp::RequestContext&) {
            std::string out;
            for (int i = 0; i < args.value("count", 1); ++i) out += args["text"].get<std::string>();
            return mcp::ToolResult::text(out, json{{"echo", out}});
          },
  });

  server->add_tool({
      .name = "slow",
      .description = "Takes steps of 10 ms until cancelled",
      .input_schema = {{"type", "object"},
                       {"properties", {{"steps", {{"type", "integer"}, {"minimum", 0}}}}}},
      .handler =
          [probe](const json& args, mcp::RequestContext& ctx) {
            ++probe->started;
            const int steps = args.value("steps", 100000);
            int i = 0;
            for (; i < steps; ++i) {
              if (ctx.wait_cancelled_for(10ms)) {
                ++probe->saw_cancel;
                break;
              }
              ctx.progress(i + 1, steps, "step");
            }
            probe->steps_done = i;
            ++probe->finished;
            return mcp::ToolResult::text("done after " + std::to_string(i));
          },
  });

  server->add_tool({
      .name = "fail",
      .description = "Throws",
      .handler = [](const json&, mcp::RequestContext&) -> mcp::ToolResult {
        throw std::runtime_error("disk on fire");
      },
  });

  server->add_tool({
      .name = "structured",
      .description = "Returns structured output",
      .output_schema = json{{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}},
      .handler =
          [](const json&, mcp::RequestContext&) {
            return mcp::ToolResult::text("n is 42", json{{"n", 42}});
          },
  });

  server->add_tool({
      .name = "protocol_fail",
      .description = "Throws a ProtocolError",
      .handler = [](const json&, mcp::RequestContext&) -> mcp::ToolResult {
        throw mcp::ProtocolError(mcp::kInvalidParams, "bad thing", json{{"field", "x"}});
      },
  });

  server->add_tool({
      .name = "wrapped",
      .description = "Accepts {input: {...}}",
      .input_schema = {{"type", "object"},
                       {"properties", {{"x", {{"type", "integer"}}}}},
                       {"required", {"x"}},
                       {"additionalProperties", false}},
      .accept_input_wrapper = true,
      .handler = [](const json& args, mcp::RequestContext&) {
        return mcp::ToolResult::text(args.dump());
      },
  });

  server->add_tool({
      .name = "logger",
      .description = "Logs at several levels",
      .handler =
          [](const json&, mcp::RequestContext& ctx) {
            ctx.log(mcp::LogLevel::debug, "d", "test");
            ctx.log(mcp::LogLevel::info, "i", "test");
            ctx.log(mcp::LogLevel::warning, json{{"w", 1}}, "test");
            ctx.log(mcp::LogLevel::error, "e");
            return mcp::ToolResult::text("logged");
          },
  });

  server->add_tool({
      .name = "progress_odd",
      .description = "Reports non-increasing progress",
      .handler =
          [](const json&, mcp::RequestContext& ctx) {
            ctx.progress(1);
            ctx.progress(1);
            ctx.progress(0.5);
            ctx.progress(2, 4, "half");
            return mcp::ToolResult::text("ok");
          },
  });

  server->add_tool({
      .name = "whoami",
      .description = "Context details",
      .handler =
          [](const json&, mcp::RequestContext& ctx) {
            return mcp::ToolResult::text(ctx.client_name() + "|" + ctx.session_id() + "|" +
                                         ctx.protocol_version());
          },
  });

  if (setup.prompts) {
    mcp::Prompt greet;
    greet.name = "greet";
    greet.title = "Greeting";
    greet.description = "Says hello";
    greet.arguments = {{"name", "who", true}, {"style", "", false}};
    greet.handler = [](const json& args) {
      return json{{"description", "greeting"},
                  {"messages",
                   {{{"role", "user"},
                     {"content",
                      {{"type", "text"}, {"text", "Hello " + args["name"].get<std::string>()}}}}}}};
    };
    server->add_prompt(greet);
    for (const char* name : {"p2", "p3"}) {
      mcp::Prompt p;
      p.name = name;
      p.handler = [](const json&) { return json{{"messages", json::array()}}; };
      server->add_prompt(p);
    }
  }
  if (setup.resources) server->set_resources(std::make_shared<FakeResources>());
  return server;
}

enum class Mode { threads, inline_, manual };

// One client connection: a Session plus what it sent.
class Client {
 public:
  Client(mcp::Server& server, Mode mode = Mode::threads, std::string id = "session-1") {
    mcp::Session::Executor executor;
    switch (mode) {
      case Mode::threads:
        executor = threads.executor();
        break;
      case Mode::inline_:
        executor = [](std::function<void()> work) { work(); };
        break;
      case Mode::manual:
        executor = manual.executor();
        break;
    }
    session = std::make_unique<mcp::Session>(
        server, std::move(id), [this](const json& m) { sink.push(m); }, std::move(executor));
  }
  ~Client() {
    session.reset();
    threads.join();
  }

  json send_request(const std::string& method, json params = nullptr) {
    json id = next_id++;
    json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    if (!params.is_null()) message["params"] = std::move(params);
    session->receive(message.dump());
    return id;
  }
  json call(const std::string& method, json params = nullptr) {
    return sink.response(send_request(method, std::move(params)));
  }
  void notify(const std::string& method, json params = nullptr) {
    json message = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) message["params"] = std::move(params);
    session->receive(message.dump());
  }
  json raw(const std::string& text) {
    const std::size_t before = sink.size();
    session->receive(text);
    EXPECT_EQ(sink.size(), before + 1) << "expected one reply to " << text;
    return sink.size() > before ? sink.messages()[before] : json();
  }
  json initialize(const std::string& version = "2025-11-25") {
    json r = call("initialize", {{"protocolVersion", version},
                                 {"capabilities", json::object()},
                                 {"clientInfo", {{"name", "claude-code"}, {"version", "1.2"}}}});
    notify("notifications/initialized");
    return r;
  }
  json tool(const std::string& name, json arguments = json::object(), json meta = nullptr) {
    json params = {{"name", name}, {"arguments", std::move(arguments)}};
    if (!meta.is_null()) params["_meta"] = std::move(meta);
    return call("tools/call", std::move(params));
  }

  Sink sink;
  ThreadExecutor threads;
  ManualExecutor manual;
  std::unique_ptr<mcp::Session> session;
  int next_id = 1;
};

std::string error_message(const json& response) {
  return response.at("error").at("message").get<std::string>();
}
int error_code(const json& response) { return response.at("error").at("code").get<int>(); }
std::string result_text(const json& response) {
  return response.at("result").at("content").at(0).at("text").get<std::string>();
}

std::string nested_arrays(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

class McpTest : public ::testing::Test {
 protected:
  void SetUp() override { server = make_server(probe); }
  std::shared_ptr<Probe> probe = std::make_shared<Probe>();
  std::unique_ptr<mcp::Server> server;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// protocol.hpp

TEST(McpProtocol, VersionsAndLogLevels) {
  for (auto v : mcp::kProtocolVersions) EXPECT_TRUE(mcp::is_supported_version(v));
  EXPECT_FALSE(mcp::is_supported_version("2026-07-28"));
  EXPECT_FALSE(mcp::is_supported_version(""));
  for (const char* name :
       {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}) {
    auto level = mcp::parse_log_level(name);
    ASSERT_TRUE(level) << name;
    EXPECT_EQ(mcp::to_string(*level), name);
  }
  EXPECT_FALSE(mcp::parse_log_level("Info"));
  EXPECT_LT(mcp::LogLevel::debug, mcp::LogLevel::emergency);
}

TEST(McpProtocol, Envelopes) {
  EXPECT_EQ(mcp::make_response(1, {{"a", 1}}),
            (json{{"jsonrpc", "2.0"}, {"id", 1}, {"result", {{"a", 1}}}}));
  auto err = mcp::make_error("x", mcp::kInvalidParams, "bad", json{{"uri", "u"}});
  EXPECT_EQ(err["id"], "x");
  EXPECT_EQ(err["error"]["code"], -32602);
  EXPECT_EQ(err["error"]["data"]["uri"], "u");
  EXPECT_FALSE(mcp::make_error(nullptr, -1, "m")["error"].contains("data"));
  EXPECT_TRUE(mcp::make_error(nullptr, -1, "m")["id"].is_null());
  EXPECT_FALSE(mcp::make_notification("notifications/tools/list_changed").contains("params"));
  EXPECT_EQ(mcp::make_notification("n", {{"k", 1}})["params"]["k"], 1);
  EXPECT_TRUE(mcp::is_valid_id(1));
  EXPECT_TRUE(mcp::is_valid_id(-5));
  EXPECT_TRUE(mcp::is_valid_id("abc"));
  EXPECT_FALSE(mcp::is_valid_id(nullptr));
  EXPECT_FALSE(mcp::is_valid_id(1.5));
  EXPECT_FALSE(mcp::is_valid_id(json::object()));
  EXPECT_FALSE(mcp::is_valid_id(true));
}

TEST(McpProtocol, ParseDepthCap) {
  EXPECT_NO_THROW(mcp::parse_message(nested_arrays(64)));
  try {
    mcp::parse_message(nested_arrays(65));
    FAIL() << "65 levels accepted";
  } catch (const mcp::ProtocolError& e) {
    EXPECT_EQ(e.code(), mcp::kParseError);
    EXPECT_TRUE(has(e.what(), "deeper than the limit of 64")) << e.what();
  }
  mcp::ParseLimits small{3};
  EXPECT_NO_THROW(mcp::parse_message(R"({"a":{"b":[1]}})", small));
  EXPECT_THROW(mcp::parse_message(R"({"a":{"b":[[1]]}})", small), mcp::ProtocolError);
  // Deep enough to hurt a recursive parser; refused quickly without building it.
  EXPECT_THROW(mcp::parse_message(nested_arrays(200000)), mcp::ProtocolError);
}

TEST(McpProtocol, ParseErrorsSayWhat) {
  try {
    mcp::parse_message("{\"a\": tru}");
    FAIL();
  } catch (const mcp::ProtocolError& e) {
    EXPECT_EQ(e.code(), mcp::kParseError);
    EXPECT_TRUE(has(e.what(), "parse error")) << e.what();
    EXPECT_FALSE(has(e.what(), "[json.exception")) << e.what();
  }
  EXPECT_THROW(mcp::parse_message(""), mcp::ProtocolError);
  EXPECT_THROW(mcp::parse_message("1e99999"), mcp::ProtocolError);
  EXPECT_EQ(mcp::parse_message("{\"s\":\"\xC3\xBC\xE2\x82\xAC\xF0\x9F\x98\x80\"}")["s"],
            "\xC3\xBC\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST(McpProtocol, InvalidUtf8IsNamed) {
  for (std::string bad :
       {std::string("{\"s\":\"\xFF\"}"), std::string("{\"s\":\"\xC0\x80\"}"),
        std::string("{\"s\":\"\xED\xA0\x80\"}"), std::string("{\"s\":\"\xF4\x90\x80\x80\"}"),
        std::string("{\"s\":\"\xE2\x82\"}"), std::string("\xFF{}")}) {
    try {
      mcp::parse_message(bad);
      FAIL() << "accepted " << nshpc::text::sanitize_utf8(bad);
    } catch (const mcp::ProtocolError& e) {
      EXPECT_EQ(e.code(), mcp::kParseError);
      EXPECT_TRUE(has(e.what(), "invalid UTF-8")) << e.what();
      // The message itself must be serialisable.
      EXPECT_NO_THROW(json(e.what()).dump());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// validate.hpp

TEST(McpValidate, MessagesNameTheFieldAndTheExpectation) {
  using mcp::detail::validate_arguments;
  const json schema = {
      {"type", "object"},
      {"properties",
       {{"instance_id", {{"type", "string"}, {"minLength", 2}, {"maxLength", 4}}},
        {"timeout", {{"type", "integer"}, {"minimum", 1}, {"maximum", 60}}},
        {"ratio", {{"type", "number"}, {"exclusiveMinimum", 0}}},
        {"mode", {{"enum", {"fast", "slow"}}}},
        {"label", {{"type", {"string", "null"}}}},
        {"paths", {{"type", "array"}, {"items", {{"type", "string"}}}, {"maxItems", 2}}},
        {"opts",
         {{"type", "object"},
          {"properties", {{"depth", {{"type", "integer"}}}}},
          {"required", {"depth"}}}}}},
      {"required", {"instance_id"}},
      {"additionalProperties", false}};
  auto check = [&](const json& args) { return validate_arguments(args, schema).value_or("OK"); };

  EXPECT_EQ(check({{"instance_id", "ab"}}), "OK");
  EXPECT_EQ(check(json::object()), "missing required argument 'instance_id'");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"timeout", "5"}}),
            "argument 'timeout': expected an integer, got a string");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"timeout", 2.5}}),
            "argument 'timeout': expected an integer, got a number");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"timeout", 5.0}}), "OK");  // integral number
  EXPECT_EQ(check({{"instance_id", "ab"}, {"timeout", 0}}),
            "argument 'timeout': expected a value >= 1, got 0");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"timeout", 61}}),
            "argument 'timeout': expected a value <= 60, got 61");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"ratio", 0}}),
            "argument 'ratio': expected a value > 0, got 0");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"ratio", 1}}), "OK");  // integer is a number
  EXPECT_EQ(check({{"instance_id", "a"}}),
            "argument 'instance_id': expected at least 2 characters, got 1");
  EXPECT_EQ(check({{"instance_id", "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"}}), "OK");  // 4 code points
  EXPECT_EQ(check({{"instance_id", "abcde"}}),
            "argument 'instance_id': expected at most 4 characters, got 5");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"mode", "medium"}}),
            R"(argument 'mode': expected one of "fast", "slow", got "medium")");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"label", nullptr}}), "OK");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"label", 3}}),
            "argument 'label': expected a string or null, got an integer");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"paths", {"a", 2}}}),
            "argument 'paths[1]': expected a string, got an integer");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"paths", {"a", "b", "c"}}}),
            "argument 'paths': expected at most 2 items, got 3");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"opts", json::object()}}),
            "missing required argument 'opts.depth'");
  EXPECT_EQ(check({{"instance_id", "ab"}, {"opts", {{"depth", true}}}}),
            "argument 'opts.depth': expected an integer, got a boolean");
  EXPECT_TRUE(has(check({{"instance_id", "ab"}, {"colour", "red"}}), "unknown argument 'colour'"));
  EXPECT_TRUE(has(check({{"instance_id", "ab"}, {"colour", "red"}}), "instance_id"));
  EXPECT_EQ(validate_arguments(json::array(), schema).value_or("OK"),
            "arguments: expected an object, got an array");
  // Additional properties are allowed unless forbidden; unknown keywords are ignored.
  EXPECT_FALSE(validate_arguments({{"x", 1}}, {{"type", "object"}, {"$defs", json::object()}}));
}

TEST(McpValidate, LocalReferencesAreFollowed) {
  using mcp::detail::validate_arguments;
  const json schema = nshpc::parse_json(R"({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}},
                          "additionalProperties": false}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": false})");
  auto check = [&](const json& args) { return validate_arguments(args, schema).value_or("OK"); };
  EXPECT_EQ(check({{"name", "a"}, {"address", {{"street", "Main"}}}}), "OK");
  EXPECT_EQ(check({{"address", 42}}), "argument 'address': expected an object, got an integer");
  EXPECT_EQ(check({{"address", {{"street", 5}}}}), "argument 'address.street': expected a string, got an integer");
  // A reference that does not resolve constrains nothing.
  EXPECT_FALSE(validate_arguments({{"a", 1}}, {{"type", "object"}, {"properties", {{"a", {{"$ref", "#/$defs/none"}}}}}}));
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

TEST_F(McpTest, InitializeEchoesSupportedVersionsAndFallsBackToLatest) {
  for (auto version : mcp::kProtocolVersions) {
    Client c(*server);
    auto r = c.initialize(std::string(version));
    EXPECT_EQ(r["result"]["protocolVersion"], version);
    auto who = c.tool("whoami");
    EXPECT_EQ(result_text(who), "claude-code/1.2|session-1|" + std::string(version));
  }
  Client c(*server);
  EXPECT_EQ(c.initialize("1999-01-01")["result"]["protocolVersion"], "2025-11-25");
}

TEST_F(McpTest, InitializeResultAndCapabilities) {
  Client c(*server);
  auto r = c.initialize()["result"];
  EXPECT_EQ(r["serverInfo"], (json{{"name", "ns-hpc"}, {"title", "NS HPC"}, {"version", "1.2.3"}}));
  EXPECT_EQ(r["instructions"], "Use the tools.");
  EXPECT_EQ(r["capabilities"]["tools"], (json{{"listChanged", true}}));
  EXPECT_EQ(r["capabilities"]["resources"], (json{{"subscribe", true}, {"listChanged", true}}));
  EXPECT_EQ(r["capabilities"]["prompts"], (json{{"listChanged", true}}));
  EXPECT_EQ(r["capabilities"]["logging"], json::object());

  auto bare = make_server(probe, {{}, false, false});
  Client b(*bare);
  auto caps = b.initialize()["result"]["capabilities"];
  EXPECT_FALSE(caps.contains("resources"));
  EXPECT_FALSE(caps.contains("prompts"));
  EXPECT_TRUE(caps.contains("tools"));
  auto list = b.call("resources/list");
  EXPECT_EQ(error_code(list), mcp::kMethodNotFound);
  EXPECT_TRUE(has(error_message(list), "resources/list"));
  EXPECT_EQ(error_code(b.call("resources/read", {{"uri", "mem://a"}})), mcp::kMethodNotFound);
}

TEST_F(McpTest, InitializeValidatesParams) {
  Client c(*server);
  auto missing = c.call("initialize", {{"capabilities", json::object()},
                                       {"clientInfo", {{"name", "x"}, {"version", "1"}}}});
  EXPECT_EQ(error_code(missing), mcp::kInvalidParams);
  EXPECT_EQ(error_message(missing), "params.protocolVersion: missing");
  auto wrong =
      c.call("initialize", {{"protocolVersion", 20251125}, {"clientInfo", {{"name", "x"}}}});
  EXPECT_TRUE(has(error_message(wrong), "params.protocolVersion: expected a string")) << wrong;
  auto caps = c.call(
      "initialize",
      {{"protocolVersion", "2025-11-25"}, {"capabilities", 3}, {"clientInfo", {{"name", "x"}}}});
  EXPECT_TRUE(has(error_message(caps), "params.capabilities: expected an object")) << caps;
  auto info = c.call("initialize", {{"protocolVersion", "2025-11-25"}});
  EXPECT_EQ(error_message(info), "params.clientInfo: missing");
  auto name =
      c.call("initialize", {{"protocolVersion", "2025-11-25"}, {"clientInfo", json::object()}});
  EXPECT_EQ(error_message(name), "params.clientInfo.name: missing");
  // Still not initialized; a valid one works, without capabilities and with a name only.
  auto ok =
      c.call("initialize", {{"protocolVersion", "2025-06-18"}, {"clientInfo", {{"name", "bare"}}}});
  EXPECT_EQ(ok["result"]["protocolVersion"], "2025-06-18");
  EXPECT_EQ(result_text(c.tool("whoami")), "bare|session-1|2025-06-18");
}

TEST_F(McpTest, OnlyPingBeforeInitializeAndInitializeOnce) {
  Client c(*server);
  auto early = c.call("tools/list");
  EXPECT_EQ(error_code(early), mcp::kInvalidRequest);
  EXPECT_EQ(error_message(early), "server not initialized: send initialize first");
  EXPECT_EQ(error_code(c.tool("echo", {{"text", "x"}})), mcp::kInvalidRequest);
  EXPECT_EQ(c.call("ping")["result"], json::object());
  c.initialize();
  // Served after the initialize response even before notifications/initialized: checked
  // implicitly by Client::initialize sending it afterwards; tools/list now works.
  EXPECT_TRUE(c.call("tools/list")["result"]["tools"].is_array());
  auto again =
      c.call("initialize", {{"protocolVersion", "2025-11-25"}, {"clientInfo", {{"name", "x"}}}});
  EXPECT_EQ(error_code(again), mcp::kInvalidRequest);
  EXPECT_TRUE(has(error_message(again), "initialize")) << again;
}

TEST_F(McpTest, RequestsServedBeforeInitializedNotification) {
  Client c(*server);
  c.call("initialize", {{"protocolVersion", "2025-11-25"}, {"clientInfo", {{"name", "x"}}}});
  EXPECT_TRUE(c.call("tools/list").contains("result"));
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC

TEST_F(McpTest, ParseErrorThenTheSessionGoesOn) {
  Client c(*server);
  auto r = c.raw("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ");
  EXPECT_TRUE(r["id"].is_null());
  EXPECT_EQ(r["jsonrpc"], "2.0");
  EXPECT_EQ(error_code(r), mcp::kParseError);
  EXPECT_EQ(c.call("ping")["result"], json::object());
}

TEST_F(McpTest, DepthCapAndInvalidUtf8ThroughTheSession) {
  Client c(*server);
  auto deep = c.raw(R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":)" +
                    nested_arrays(100) + "}}");
  EXPECT_EQ(error_code(deep), mcp::kParseError);
  EXPECT_TRUE(has(error_message(deep), "deeper than the limit of 64")) << deep;
  EXPECT_TRUE(deep["id"].is_null());
  auto utf =
      c.raw("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{\"x\":\"\xC3\x28\"}}");
  EXPECT_EQ(error_code(utf), mcp::kParseError);
  EXPECT_TRUE(has(error_message(utf), "invalid UTF-8")) << utf;
  EXPECT_EQ(c.call("ping")["result"], json::object());
}

TEST_F(McpTest, BatchesAreRefused) {
  Client c(*server);
  auto r = c.raw(R"([{"jsonrpc":"2.0","id":1,"method":"ping"}])");
  EXPECT_EQ(error_code(r), mcp::kInvalidRequest);
  EXPECT_TRUE(r["id"].is_null());
  EXPECT_TRUE(has(error_message(r), "batches are not supported"));
}

TEST_F(McpTest, InvalidRequestsNameWhatIsWrong) {
  Client c(*server);
  auto scalar = c.raw("42");
  EXPECT_EQ(error_code(scalar), mcp::kInvalidRequest);
  EXPECT_TRUE(has(error_message(scalar), "object"));

  auto no_version = c.raw(R"({"id":1,"method":"ping"})");
  EXPECT_EQ(error_code(no_version), mcp::kInvalidRequest);
  EXPECT_EQ(no_version["id"], 1);
  EXPECT_TRUE(has(error_message(no_version), "jsonrpc"));

  auto old = c.raw(R"({"jsonrpc":"1.0","id":"a","method":"ping"})");
  EXPECT_EQ(error_code(old), mcp::kInvalidRequest);
  EXPECT_EQ(old["id"], "a");
  EXPECT_TRUE(has(error_message(old), "\"2.0\""));

  auto null_id = c.raw(R"({"jsonrpc":"2.0","id":null,"method":"ping"})");
  EXPECT_EQ(error_code(null_id), mcp::kInvalidRequest);
  EXPECT_TRUE(null_id["id"].is_null());
  EXPECT_TRUE(has(error_message(null_id), "\"id\" must be a string or an integer"));

  auto float_id = c.raw(R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})");
  EXPECT_EQ(error_code(float_id), mcp::kInvalidRequest);
  EXPECT_TRUE(float_id["id"].is_null());

  auto object_id = c.raw(R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})");
  EXPECT_EQ(error_code(object_id), mcp::kInvalidRequest);

  auto bad_method = c.raw(R"({"jsonrpc":"2.0","id":7,"method":5})");
  EXPECT_EQ(error_code(bad_method), mcp::kInvalidRequest);
  EXPECT_EQ(bad_method["id"], 7);
  EXPECT_TRUE(has(error_message(bad_method), "\"method\" must be a string"));

  auto no_method = c.raw(R"({"jsonrpc":"2.0","id":8})");
  EXPECT_EQ(error_code(no_method), mcp::kInvalidRequest);
  EXPECT_EQ(no_method["id"], 8);

  c.initialize();
  auto params = c.call("tools/list", json::array({1}));
  EXPECT_EQ(error_code(params), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(params), "params: expected an object"));
}

TEST_F(McpTest, UnknownMethodsNotificationsAndClientResponses) {
  Client c(*server);
  c.initialize();
  auto r = c.call("tools/frobnicate");
  EXPECT_EQ(error_code(r), mcp::kMethodNotFound);
  EXPECT_TRUE(has(error_message(r), "tools/frobnicate"));
  // Unknown notifications and responses from the client get no answer at all.
  const std::size_t before = c.sink.size();
  c.notify("notifications/whatever", {{"x", 1}});
  c.session->receive(R"({"jsonrpc":"2.0","id":99,"result":{}})");
  c.session->receive(R"({"jsonrpc":"2.0","id":98,"error":{"code":-1,"message":"no"}})");
  c.session->receive(json{{"jsonrpc", "2.0"},
                          {"method", "notifications/cancelled"},
                          {"params", {{"requestId", 12345}}}});
  EXPECT_EQ(c.call("ping")["result"], json::object());
  EXPECT_EQ(c.sink.size(), before + 1);
}

TEST_F(McpTest, ReusedRequestIdsAreRefused) {
  Client c(*server);
  c.session->receive(R"({"jsonrpc":"2.0","id":7,"method":"ping"})");
  auto again = c.raw(R"({"jsonrpc":"2.0","id":7,"method":"ping"})");
  EXPECT_EQ(error_code(again), mcp::kInvalidRequest);
  EXPECT_EQ(again["id"], 7);
  EXPECT_EQ(error_message(again), "request id 7 was already used in this session");
  // "7" is a different id from 7.
  auto str = c.raw(R"({"jsonrpc":"2.0","id":"7","method":"ping"})");
  EXPECT_EQ(str["result"], json::object());
  auto str_again = c.raw(R"({"jsonrpc":"2.0","id":"7","method":"ping"})");
  EXPECT_EQ(error_message(str_again), "request id \"7\" was already used in this session");
  // Also when the first use failed.
  c.session->receive(R"({"jsonrpc":"2.0","id":20,"method":"nope"})");
  EXPECT_EQ(error_code(c.raw(R"({"jsonrpc":"2.0","id":20,"method":"ping"})")),
            mcp::kInvalidRequest);
  // Separate sessions have separate id spaces.
  Client other(*server, Mode::threads, "session-2");
  EXPECT_EQ(other.raw(R"({"jsonrpc":"2.0","id":7,"method":"ping"})")["result"], json::object());
}

TEST_F(McpTest, ALongSessionHoldsOnlyTheInFlightAndTheRecentRequestIds) {
  const std::size_t window = mcp::ServerOptions{}.remembered_request_ids;
  Client c(*server, Mode::manual);
  c.initialize();
  // Two calls stay queued (in flight) through the whole test.
  const json first = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "a"}}}});
  const json second = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "b"}}}});
  ASSERT_EQ(c.manual.pending(), 2u);
  constexpr int kAnswered = 100000;
  for (int i = 0; i < kAnswered; ++i) {
    c.session->receive(json{{"jsonrpc", "2.0"}, {"id", 1000 + i}, {"method", "ping"}});
    if (i % 10000 == 0) c.sink.clear();
  }
  EXPECT_EQ(c.sink.size(), static_cast<std::size_t>((kAnswered - 1) % 10000));  // every ping answered
  EXPECT_EQ(c.session->in_flight(), 2u);
  EXPECT_LE(c.session->request_ids_held(), window + 2);
  // An in-flight id is refused however many requests came since.
  auto dup = c.raw(json{{"jsonrpc", "2.0"}, {"id", first}, {"method", "ping"}}.dump());
  EXPECT_EQ(error_code(dup), mcp::kInvalidRequest);
  EXPECT_EQ(error_message(dup), "request id " + first.dump() + " was already used in this session");
  // So is a recent one; an id older than the window is forgotten and served again.
  EXPECT_EQ(error_code(c.raw(json{{"jsonrpc", "2.0"}, {"id", 1000 + kAnswered - 1}, {"method", "ping"}}.dump())),
            mcp::kInvalidRequest);
  EXPECT_EQ(c.raw(json{{"jsonrpc", "2.0"}, {"id", 1000}, {"method", "ping"}}.dump())["result"], json::object());
  // Once answered, the calls hold nothing more than their place in the window.
  c.manual.run_all();
  EXPECT_EQ(result_text(c.sink.response(second)), "b");
  EXPECT_EQ(c.session->in_flight(), 0u);
  EXPECT_LE(c.session->request_ids_held(), window);
}

TEST_F(McpTest, RequestIdWindowOfZeroRefusesOnlyInFlightIds) {
  ServerSetup setup;
  setup.options.remembered_request_ids = 0;
  auto forgetful = make_server(probe, setup);
  Client c(*forgetful, Mode::manual);
  c.initialize();
  const json call = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "a"}}}});
  EXPECT_EQ(error_code(c.raw(json{{"jsonrpc", "2.0"}, {"id", call}, {"method", "ping"}}.dump())),
            mcp::kInvalidRequest);
  EXPECT_EQ(c.raw(R"({"jsonrpc":"2.0","id":"p","method":"ping"})")["result"], json::object());
  EXPECT_EQ(c.raw(R"({"jsonrpc":"2.0","id":"p","method":"ping"})")["result"], json::object());
  EXPECT_EQ(c.session->request_ids_held(), 1u);
  c.manual.run_all();
  EXPECT_EQ(c.session->request_ids_held(), 0u);
}

// ---------------------------------------------------------------------------------------------
// The method table

TEST_F(McpTest, EveryMethodOtherThanPingAndInitializeWaitsForInitialize) {
  Client c(*server);
  // Unknown methods are unknown before initialize too.
  auto unknown = c.call("tools/frobnicate");
  EXPECT_EQ(error_code(unknown), mcp::kMethodNotFound);
  EXPECT_EQ(error_message(unknown), "method not found: tools/frobnicate");
  for (const char* method :
       {"logging/setLevel", "tools/list", "tools/call", "prompts/list", "prompts/get", "completion/complete",
        "resources/list", "resources/templates/list", "resources/subscribe", "resources/unsubscribe",
        "resources/read"}) {
    auto early = c.call(method);
    EXPECT_EQ(error_code(early), mcp::kInvalidRequest) << method;
    EXPECT_EQ(error_message(early), "server not initialized: send initialize first") << method;
  }
  // ping answers whatever its params are; initialize checks its own.
  EXPECT_EQ(c.raw(R"({"jsonrpc":"2.0","id":"p","method":"ping","params":5})")["result"], json::object());
  auto bad_init = c.raw(R"({"jsonrpc":"2.0","id":"i","method":"initialize","params":[1]})");
  EXPECT_EQ(error_code(bad_init), mcp::kInvalidParams);
  EXPECT_EQ(error_message(bad_init), "params: expected an object, got an array");
  c.initialize();
  auto bad_params = c.raw(R"({"jsonrpc":"2.0","id":"l","method":"tools/list","params":"x"})");
  EXPECT_EQ(error_code(bad_params), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(bad_params), "params: expected an object")) << bad_params;
}

TEST_F(McpTest, ToolAndPromptListsAnswerAtOnceAndHandlerCallsGoToTheExecutor) {
  auto completing = make_server(probe);
  completing->set_completion([](const json&, const json& argument, const json&) {
    json values = json::array();
    for (int i = 0; i < 150; ++i) values.push_back(argument["value"].get<std::string>() + std::to_string(i));
    return json{{"values", values}};
  });
  Client c(*completing, Mode::manual);
  c.initialize();
  // Answered on the thread that read them, with nothing queued.
  for (const char* method : {"ping", "tools/list", "prompts/list"})
    EXPECT_TRUE(c.call(method).contains("result")) << method;
  // A bad cursor of a resource list is refused there too, before anything is queued.
  EXPECT_EQ(error_code(c.call("resources/list", {{"cursor", "nope"}})), mcp::kInvalidParams);
  EXPECT_TRUE(c.call("logging/setLevel", {{"level", "debug"}}).contains("result"));
  EXPECT_TRUE(c.call("resources/subscribe", {{"uri", "mem://a"}}).contains("result"));
  EXPECT_TRUE(c.call("resources/unsubscribe", {{"uri", "mem://a"}}).contains("result"));
  EXPECT_EQ(c.manual.pending(), 0u);
  // Queued for the Executor, answered when it runs them.
  std::vector<json> ids = {
      c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "x"}}}}),
      c.send_request("prompts/get", {{"name", "greet"}, {"arguments", {{"name", "Ada"}}}}),
      c.send_request("resources/read", {{"uri", "mem://a"}}),
      // The resource lists come from a provider that may read a store: never on the I/O thread.
      c.send_request("resources/list"),
      c.send_request("resources/templates/list"),
      c.send_request("completion/complete",
                     {{"ref", {{"type", "ref/prompt"}, {"name", "greet"}}}, {"argument", {{"name", "name"}, {"value", "v"}}}}),
  };
  EXPECT_EQ(c.manual.pending(), ids.size());
  for (const json& id : ids) EXPECT_FALSE(c.sink.answered(id));
  c.manual.run_all();
  for (const json& id : ids) EXPECT_TRUE(c.sink.response(id).contains("result")) << id;
  const json completion = c.sink.response(ids.back())["result"]["completion"];
  EXPECT_EQ(completion["values"].size(), 100u);
  EXPECT_EQ(completion["total"], 150);
  EXPECT_EQ(completion["hasMore"], true);
}

TEST_F(McpTest, MethodsOfAnAbsentFeatureAreNotFoundNamingIt) {
  ServerSetup setup;
  setup.resources = false;
  auto bare = make_server(probe, setup);
  Client c(*bare);
  c.initialize();
  for (const char* method : {"resources/list", "resources/templates/list", "resources/subscribe",
                             "resources/unsubscribe", "resources/read"}) {
    auto r = c.call(method, {{"uri", "mem://a"}});
    EXPECT_EQ(error_code(r), mcp::kMethodNotFound) << method;
    EXPECT_EQ(error_message(r), std::string("method not found: ") + method + " (this server has no resources)");
  }
  auto complete = c.call("completion/complete");
  EXPECT_EQ(error_code(complete), mcp::kMethodNotFound);
  EXPECT_EQ(error_message(complete), "method not found: completion/complete (this server offers no completions)");
}

// ---------------------------------------------------------------------------------------------
// Tools

TEST_F(McpTest, ToolsListShape) {
  Client c(*server);
  c.initialize();
  auto tools = c.call("tools/list")["result"];
  EXPECT_FALSE(tools.contains("nextCursor"));
  ASSERT_EQ(tools["tools"].size(), 9u);
  const json& echo = tools["tools"][0];
  EXPECT_EQ(echo["name"], "echo");
  EXPECT_EQ(echo["title"], "Echo");
  EXPECT_EQ(echo["description"], "Repeats text");
  EXPECT_EQ(echo["inputSchema"]["required"], json::array({"text"}));
  EXPECT_EQ(echo["annotations"]["readOnlyHint"], true);
  EXPECT_FALSE(echo.contains("outputSchema"));
  const json& slow = tools["tools"][1];
  EXPECT_FALSE(slow.contains("title"));
  EXPECT_FALSE(slow.contains("annotations"));
  const json& structured = tools["tools"][3];
  EXPECT_EQ(structured["name"], "structured");
  EXPECT_EQ(structured["outputSchema"]["properties"]["n"]["type"], "integer");
  EXPECT_EQ(tools["tools"][2]["inputSchema"], (json{{"type", "object"}}));
}

TEST_F(McpTest, PaginationWalksEveryListAndRefusesBadCursors) {
  ServerSetup setup;
  setup.options.page_size = 2;
  auto paged = make_server(probe, setup);
  Client c(*paged);
  c.initialize();

  auto walk = [&](const std::string& method, const std::string& key, const std::string& field) {
    std::vector<std::string> names;
    json params = json::object();
    for (int pages = 0; pages < 20; ++pages) {
      auto r = c.call(method, params);
      EXPECT_TRUE(r.contains("result")) << r;
      if (!r.contains("result")) break;
      EXPECT_LE(r["result"][key].size(), 2u);
      for (const auto& item : r["result"][key]) names.push_back(item[field]);
      if (!r["result"].contains("nextCursor")) break;
      EXPECT_TRUE(r["result"]["nextCursor"].is_string());
      params = {{"cursor", r["result"]["nextCursor"]}};
    }
    return names;
  };
  EXPECT_EQ(walk("tools/list", "tools", "name"),
            (std::vector<std::string>{"echo", "slow", "fail", "structured", "protocol_fail",
                                      "wrapped", "logger", "progress_odd", "whoami"}));
  EXPECT_EQ(walk("resources/list", "resources", "uri"),
            (std::vector<std::string>{"mem://a", "mem://b", "mem://bin"}));
  EXPECT_EQ(walk("resources/templates/list", "resourceTemplates", "uriTemplate"),
            (std::vector<std::string>{"mem://{id}", "mem://logs/{id}", "mem://other/{id}"}));
  EXPECT_EQ(walk("prompts/list", "prompts", "name"),
            (std::vector<std::string>{"greet", "p2", "p3"}));

  for (const json& cursor : {json("garbage"), json(""), json("nshpc-page-x")}) {
    auto bad = c.call("tools/list", {{"cursor", cursor}});
    EXPECT_EQ(error_code(bad), mcp::kInvalidParams) << bad;
    EXPECT_TRUE(has(error_message(bad), "invalid cursor")) << bad;
  }
  auto typed = c.call("prompts/list", {{"cursor", 5}});
  EXPECT_EQ(error_code(typed), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(typed), "params.cursor"));
}

TEST_F(McpTest, ToolCallSuccessAndErrors) {
  Client c(*server);
  c.initialize();
  auto ok = c.tool("echo", {{"text", "ab"}, {"count", 2}});
  EXPECT_EQ(ok["result"]["content"], json::array({{{"type", "text"}, {"text", "abab"}}}));
  EXPECT_EQ(ok["result"]["structuredContent"], (json{{"echo", "abab"}}));
  EXPECT_FALSE(ok["result"].contains("isError"));

  // Arguments default to {} and then fail validation as a tool result, not a JSON-RPC error.
  auto none = c.call("tools/call", {{"name", "echo"}});
  EXPECT_EQ(none["result"]["isError"], true);
  EXPECT_EQ(result_text(none), "missing required argument 'text'");
  auto typed = c.tool("echo", {{"text", "a"}, {"count", "2"}});
  EXPECT_EQ(typed["result"]["isError"], true);
  EXPECT_EQ(result_text(typed), "argument 'count': expected an integer, got a string");
  auto extra = c.tool("echo", {{"text", "a"}, {"colour", 1}});
  EXPECT_TRUE(has(result_text(extra), "unknown argument 'colour'"));
  auto enumed = c.tool("echo", {{"text", "a"}, {"mode", "quiet"}});
  EXPECT_TRUE(has(result_text(enumed), "argument 'mode': expected one of"));

  auto unknown = c.tool("nope");
  EXPECT_EQ(error_code(unknown), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(unknown), "unknown tool 'nope'; the tools are: ")) << error_message(unknown);
  EXPECT_TRUE(has(error_message(unknown), "echo")) << error_message(unknown);
  auto near = c.tool("ecko");
  EXPECT_TRUE(has(error_message(near), "unknown tool 'ecko'; did you mean 'echo'?")) << error_message(near);
  auto no_name = c.call("tools/call", {{"arguments", json::object()}});
  EXPECT_EQ(error_message(no_name), "params.name: missing");
  auto num_name = c.call("tools/call", {{"name", 3}});
  EXPECT_TRUE(has(error_message(num_name), "params.name: expected a string")) << num_name;
  auto bad_args = c.call("tools/call", {{"name", "echo"}, {"arguments", "text"}});
  EXPECT_EQ(error_code(bad_args), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(bad_args), "params.arguments: expected an object"));

  auto thrown = c.tool("fail");
  EXPECT_EQ(thrown["result"]["isError"], true);
  EXPECT_EQ(result_text(thrown), "disk on fire");
  auto protocol = c.tool("protocol_fail");
  EXPECT_EQ(error_code(protocol), mcp::kInvalidParams);
  EXPECT_EQ(error_message(protocol), "bad thing");
  EXPECT_EQ(protocol["error"]["data"], (json{{"field", "x"}}));
}

TEST_F(McpTest, InputWrapperIsUnwrapped) {
  Client c(*server);
  c.initialize();
  EXPECT_EQ(result_text(c.tool("wrapped", {{"input", {{"x", 1}}}})), R"({"x":1})");
  EXPECT_EQ(result_text(c.tool("wrapped", {{"x", 2}})), R"({"x":2})");
  // Not for tools without the flag, nor when "input" is not an object.
  auto echo = c.tool("echo", {{"input", {{"text", "a"}}}});
  EXPECT_EQ(echo["result"]["isError"], true);
  auto scalar = c.tool("wrapped", {{"input", 3}});
  EXPECT_EQ(scalar["result"]["isError"], true);
}

TEST_F(McpTest, ResultShapeText) {
  ServerSetup setup;
  setup.options.result_shape = mcp::ResultShape::text;
  auto text_server = make_server(probe, setup);
  Client c(*text_server);
  c.initialize();
  const json tools = c.call("tools/list")["result"]["tools"];
  for (const auto& t : tools) EXPECT_FALSE(t.contains("outputSchema")) << t;
  auto r = c.tool("structured");
  EXPECT_FALSE(r["result"].contains("structuredContent"));
  EXPECT_EQ(result_text(r), "n is 42");
}

TEST_F(McpTest, ResultShapeStructured) {
  ServerSetup setup;
  setup.options.result_shape = mcp::ResultShape::structured;
  auto structured_server = make_server(probe, setup);
  Client c(*structured_server);
  c.initialize();
  EXPECT_TRUE(c.call("tools/list")["result"]["tools"][3].contains("outputSchema"));
  auto r = c.tool("structured");
  EXPECT_EQ(r["result"]["content"], json::array());
  EXPECT_EQ(r["result"]["structuredContent"], (json{{"n", 42}}));
  auto plain = c.tool("whoami");  // no structured output: content is kept
  EXPECT_TRUE(has(result_text(plain), "claude-code/1.2"));
  EXPECT_FALSE(plain["result"].contains("structuredContent"));
}

TEST_F(McpTest, ToolHelpers) {
  auto t = mcp::ToolResult::text("hi", json{{"a", 1}});
  EXPECT_EQ(t.content, json::array({{{"type", "text"}, {"text", "hi"}}}));
  EXPECT_EQ(*t.structured, (json{{"a", 1}}));
  EXPECT_FALSE(t.is_error);
  auto e = mcp::ToolResult::error("no");
  EXPECT_EQ(e.content[0]["text"], "no");
  EXPECT_TRUE(e.is_error);
  EXPECT_FALSE(e.structured);
}

TEST_F(McpTest, AddingToolsAndPromptsLaterNotifies) {
  Client c(*server);
  c.initialize();
  Client fresh(*server, Mode::threads, "uninitialized");
  server->add_tool({
      .name = "extra",
      .handler = [](const json&, mcp::RequestContext&) { return mcp::ToolResult::text("x"); },
  });
  EXPECT_EQ(c.sink.notifications("notifications/tools/list_changed").size(), 1u);
  EXPECT_EQ(fresh.sink.size(), 0u);
  EXPECT_EQ(c.call("tools/list")["result"]["tools"].back()["name"], "extra");
  mcp::Prompt p;
  p.name = "later";
  p.handler = [](const json&) { return json::object(); };
  server->add_prompt(p);
  EXPECT_EQ(c.sink.notifications("notifications/prompts/list_changed").size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Resources

TEST_F(McpTest, ResourcesListReadAndTemplates) {
  Client c(*server);
  c.initialize();
  auto list = c.call("resources/list")["result"]["resources"];
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0], (json{{"uri", "mem://a"},
                           {"name", "a"},
                           {"title", "Alpha"},
                           {"description", "first"},
                           {"mimeType", "text/plain"},
                           {"size", 5}}));
  EXPECT_EQ(list[1], (json{{"uri", "mem://b"}, {"name", "b"}}));
  auto templates = c.call("resources/templates/list")["result"]["resourceTemplates"];
  EXPECT_EQ(templates[0], (json{{"uriTemplate", "mem://{id}"},
                                {"name", "item"},
                                {"title", "Item"},
                                {"description", "one item"},
                                {"mimeType", "text/plain"}}));
  auto text = c.call("resources/read", {{"uri", "mem://a"}});
  EXPECT_EQ(text["result"]["contents"],
            json::array({{{"uri", "mem://a"}, {"mimeType", "text/plain"}, {"text", "alpha"}}}));
  auto blob = c.call("resources/read", {{"uri", "mem://bin"}});
  EXPECT_EQ(blob["result"]["contents"][0]["blob"], "AAEC");
  EXPECT_FALSE(blob["result"]["contents"][0].contains("text"));
  auto missing = c.call("resources/read", {{"uri", "mem://zzz"}});
  EXPECT_EQ(error_code(missing), mcp::kResourceNotFound);
  EXPECT_EQ(error_message(missing), "resource not found: mem://zzz");
  EXPECT_EQ(missing["error"]["data"], (json{{"uri", "mem://zzz"}}));
  auto no_uri = c.call("resources/read", json::object());
  EXPECT_EQ(error_code(no_uri), mcp::kInvalidParams);
  EXPECT_EQ(error_message(no_uri), "params.uri: missing");
}

TEST_F(McpTest, SubscriptionsAndListChanged) {
  Client a(*server, Mode::threads, "a");
  Client b(*server, Mode::threads, "b");
  Client idle(*server, Mode::threads, "idle");  // never initialized
  a.initialize();
  b.initialize();
  EXPECT_EQ(a.call("resources/subscribe", {{"uri", "mem://a"}})["result"], json::object());
  EXPECT_EQ(error_message(b.call("resources/subscribe", json::object())), "params.uri: missing");

  server->notify_resource_updated("mem://a");
  server->notify_resource_updated("mem://b");
  auto updates = a.sink.notifications("notifications/resources/updated");
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0]["params"], (json{{"uri", "mem://a"}}));
  EXPECT_TRUE(b.sink.notifications("notifications/resources/updated").empty());

  EXPECT_EQ(a.call("resources/unsubscribe", {{"uri", "mem://a"}})["result"], json::object());
  server->notify_resource_updated("mem://a");
  EXPECT_EQ(a.sink.notifications("notifications/resources/updated").size(), 1u);

  server->notify_resource_list_changed();
  EXPECT_EQ(a.sink.notifications("notifications/resources/list_changed").size(), 1u);
  EXPECT_EQ(b.sink.notifications("notifications/resources/list_changed").size(), 1u);
  EXPECT_EQ(idle.sink.size(), 0u);
  EXPECT_FALSE(a.sink.notifications("notifications/resources/list_changed")[0].contains("params"));

  a.session->close();
  a.sink.mark_closed();
  server->notify_resource_list_changed();
  EXPECT_EQ(a.sink.sent_after_close(), 0);
}

// ---------------------------------------------------------------------------------------------
// Prompts

TEST_F(McpTest, PromptsListAndGet) {
  Client c(*server);
  c.initialize();
  auto list = c.call("prompts/list")["result"]["prompts"];
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0], (json{{"name", "greet"},
                           {"title", "Greeting"},
                           {"description", "Says hello"},
                           {"arguments",
                            {{{"name", "name"}, {"description", "who"}, {"required", true}},
                             {{"name", "style"}, {"required", false}}}}}));
  EXPECT_EQ(list[1], (json{{"name", "p2"}, {"arguments", json::array()}}));

  auto got = c.call("prompts/get", {{"name", "greet"}, {"arguments", {{"name", "Ada"}}}});
  EXPECT_EQ(got["result"]["messages"][0]["content"]["text"], "Hello Ada");
  auto missing = c.call("prompts/get", {{"name", "greet"}});
  EXPECT_EQ(error_code(missing), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(missing), "missing required argument 'name'")) << missing;
  auto typed = c.call("prompts/get", {{"name", "greet"}, {"arguments", {{"name", 1}}}});
  EXPECT_EQ(error_message(typed), "params.arguments.name: expected a string, got an integer");
  auto unknown = c.call("prompts/get", {{"name", "nope"}});
  EXPECT_EQ(error_code(unknown), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(unknown), "nope"));
}

// ---------------------------------------------------------------------------------------------
// Logging and progress

TEST_F(McpTest, LoggingLevelFilters) {
  Client c(*server);
  c.initialize();
  c.tool("logger");
  auto logs = c.sink.notifications("notifications/message");
  ASSERT_EQ(logs.size(), 3u);  // default level: info
  EXPECT_EQ(logs[0]["params"], (json{{"level", "info"}, {"logger", "test"}, {"data", "i"}}));
  EXPECT_EQ(logs[1]["params"]["level"], "warning");
  EXPECT_EQ(logs[1]["params"]["data"], (json{{"w", 1}}));
  EXPECT_EQ(logs[2]["params"], (json{{"level", "error"}, {"data", "e"}}));

  EXPECT_EQ(c.call("logging/setLevel", {{"level", "error"}})["result"], json::object());
  c.sink.clear();
  c.tool("logger");
  logs = c.sink.notifications("notifications/message");
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0]["params"]["level"], "error");

  EXPECT_EQ(c.call("logging/setLevel", {{"level", "debug"}})["result"], json::object());
  c.sink.clear();
  c.tool("logger");
  EXPECT_EQ(c.sink.notifications("notifications/message").size(), 4u);

  auto bad = c.call("logging/setLevel", {{"level", "loud"}});
  EXPECT_EQ(error_code(bad), mcp::kInvalidParams);
  EXPECT_TRUE(
      has(error_message(bad), "debug, info, notice, warning, error, critical, alert, emergency"))
      << bad;
  EXPECT_TRUE(has(error_message(c.call("logging/setLevel")), "params.level: missing"));
}

TEST_F(McpTest, ProgressNotificationsCarryTheTokenAndIncrease) {
  Client c(*server);
  c.initialize();
  auto r = c.tool("slow", {{"steps", 5}}, {{"progressToken", "tok-1"}});
  EXPECT_EQ(result_text(r), "done after 5");
  auto messages = c.sink.messages();
  std::vector<double> seen;
  bool after_response = false;
  for (const auto& m : messages) {
    if (m.contains("id") && m["id"] == r["id"]) after_response = true;
    if (m.value("method", "") != "notifications/progress") continue;
    EXPECT_FALSE(after_response) << "progress after the response";
    EXPECT_EQ(m["params"]["progressToken"], "tok-1");
    EXPECT_EQ(m["params"]["total"], 5);
    EXPECT_EQ(m["params"]["message"], "step");
    seen.push_back(m["params"]["progress"].get<double>());
  }
  EXPECT_EQ(seen, (std::vector<double>{1, 2, 3, 4, 5}));

  c.sink.clear();
  c.tool("progress_odd", json::object(), {{"progressToken", 42}});
  auto odd = c.sink.notifications("notifications/progress");
  ASSERT_EQ(odd.size(), 2u);
  EXPECT_EQ(odd[0]["params"], (json{{"progressToken", 42}, {"progress", 1.0}}));
  EXPECT_EQ(odd[1]["params"],
            (json{{"progressToken", 42}, {"progress", 2.0}, {"total", 4.0}, {"message", "half"}}));

  c.sink.clear();
  c.tool("slow", {{"steps", 3}});                                    // no token: no progress
  c.tool("progress_odd", json::object(), {{"progressToken", 1.5}});  // unusable token
  EXPECT_TRUE(c.sink.notifications("notifications/progress").empty());
}

// ---------------------------------------------------------------------------------------------
// Cancellation, concurrency, close

TEST_F(McpTest, CancellationStopsTheHandlerAndSuppressesTheResponse) {
  Client c(*server);
  c.initialize();
  json id = c.send_request("tools/call", {{"name", "slow"}, {"_meta", {{"progressToken", "p"}}}});
  ASSERT_TRUE(eventually([&] { return probe->started == 1; }));
  EXPECT_EQ(c.session->in_flight(), 1u);
  EXPECT_FALSE(c.sink.answered(id));
  c.notify("notifications/cancelled", {{"requestId", id}, {"reason", "user abort"}});
  ASSERT_TRUE(eventually([&] { return probe->finished == 1; }));
  c.threads.join();  // whatever the worker was going to send has been sent
  EXPECT_EQ(probe->saw_cancel, 1);
  EXPECT_LT(probe->steps_done, 100000);
  EXPECT_FALSE(c.sink.answered(id));
  EXPECT_EQ(c.session->in_flight(), 0u);
  // The id stays used; the session goes on.
  auto reuse = c.raw(json{{"jsonrpc", "2.0"}, {"id", id}, {"method", "ping"}}.dump());
  EXPECT_EQ(error_code(reuse), mcp::kInvalidRequest);
  EXPECT_EQ(c.call("ping")["result"], json::object());
}

TEST_F(McpTest, CancellingQueuedWorkNeverRunsIt) {
  Client c(*server, Mode::manual);
  c.initialize();
  json id = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "x"}}}});
  ASSERT_EQ(c.manual.pending(), 1u);
  EXPECT_EQ(c.session->in_flight(), 1u);
  c.notify("notifications/cancelled", {{"requestId", id}});
  c.manual.run_all();
  EXPECT_FALSE(c.sink.answered(id));
  EXPECT_EQ(c.session->in_flight(), 0u);
  // Uncancelled queued work answers when it runs.
  json id2 = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "y"}}}});
  EXPECT_FALSE(c.sink.answered(id2));
  c.manual.run_all();
  EXPECT_EQ(result_text(c.sink.response(id2)), "y");
}

TEST_F(McpTest, TheTransportHearsOfRequestsThatEndUnanswered) {
  Sink sink;
  std::mutex mu;
  std::vector<json> unanswered;
  // An initialized session that reports unanswered requests, with `executor`.
  auto open = [&](const std::string& name, mcp::Session::Executor executor) {
    auto session = std::make_unique<mcp::Session>(
        *server, name, mcp::Session::RoutedSend([&](const json& m, const json&) { sink.push(m); }), std::move(executor),
        [&](const json& id) {
          std::lock_guard lock(mu);
          unanswered.push_back(id);
        });
    session->receive(json{{"jsonrpc", "2.0"},
                          {"id", 1},
                          {"method", "initialize"},
                          {"params", {{"protocolVersion", "2025-11-25"}, {"clientInfo", {{"name", "t"}}}}}});
    return session;
  };
  auto call = [](mcp::Session& session, const json& id, const std::string& tool) {
    session.receive(json{{"jsonrpc", "2.0"}, {"id", id}, {"method", "tools/call"}, {"params", {{"name", tool}, {"arguments", {{"text", "x"}}}}}});
  };
  auto cancel = [](mcp::Session& session, const json& id) {
    session.receive(json{{"jsonrpc", "2.0"}, {"method", "notifications/cancelled"}, {"params", {{"requestId", id}}}});
  };
  // Queued work cancelled before it runs.
  ManualExecutor queued;
  auto first = open("routed", queued.executor());
  call(*first, "answered", "echo");
  call(*first, "queued-then-cancelled", "echo");
  cancel(*first, "queued-then-cancelled");
  queued.run_all();
  EXPECT_TRUE(sink.answered("answered"));
  EXPECT_FALSE(sink.answered("queued-then-cancelled"));
  // A handler that was running when the cancellation came.
  ThreadExecutor threads;
  auto second = open("routed-2", threads.executor());
  call(*second, "slow", "slow");
  ASSERT_TRUE(eventually([&] { return probe->started == 1; }));
  cancel(*second, "slow");
  ASSERT_TRUE(eventually([&] { return probe->finished == 1; }));
  threads.join();
  EXPECT_FALSE(sink.answered("slow"));
  std::lock_guard lock(mu);
  EXPECT_EQ(unanswered, (std::vector<json>{"queued-then-cancelled", "slow"}));
}

TEST_F(McpTest, PingIsAnsweredWhileASlowCallRuns) {
  Client c(*server);
  c.initialize();
  json slow = c.send_request("tools/call", {{"name", "slow"}});
  ASSERT_TRUE(eventually([&] { return probe->started == 1; }));
  EXPECT_EQ(c.call("ping")["result"], json::object());
  EXPECT_EQ(c.call("tools/list")["result"]["tools"].size(), 9u);
  EXPECT_EQ(result_text(c.tool("echo", {{"text", "fast"}})), "fast");  // another call, in parallel
  EXPECT_EQ(probe->finished, 0);
  EXPECT_EQ(c.session->in_flight(), 1u);
  c.notify("notifications/cancelled", {{"requestId", slow}});
  ASSERT_TRUE(eventually([&] { return probe->finished == 1; }));
}

TEST_F(McpTest, MaxInFlightIsEnforced) {
  ServerSetup setup;
  setup.options.max_in_flight = 2;
  auto limited = make_server(probe, setup);
  Client c(*limited);
  c.initialize();
  json first = c.send_request("tools/call", {{"name", "slow"}});
  json second = c.send_request("tools/call", {{"name", "slow"}});
  ASSERT_TRUE(eventually([&] { return probe->started == 2; }));
  auto third = c.tool("echo", {{"text", "x"}});
  EXPECT_EQ(error_code(third), -32000);
  EXPECT_EQ(error_message(third), "too many requests in flight (limit 2); wait for some to finish");
  EXPECT_EQ(c.call("ping")["result"], json::object());  // inline requests are not limited
  c.notify("notifications/cancelled", {{"requestId", first}});
  ASSERT_TRUE(eventually([&] { return c.session->in_flight() == 1; }));
  EXPECT_EQ(result_text(c.tool("echo", {{"text", "x"}})), "x");
  c.notify("notifications/cancelled", {{"requestId", second}});
  ASSERT_TRUE(eventually([&] { return probe->finished == 2; }));
}

TEST_F(McpTest, CloseCancelsRunningCallsAndStopsSending) {
  Client c(*server);
  c.initialize();
  json id = c.send_request("tools/call", {{"name", "slow"}, {"_meta", {{"progressToken", 1}}}});
  json id2 = c.send_request("tools/call", {{"name", "slow"}});
  ASSERT_TRUE(eventually([&] { return probe->started == 2; }));
  c.session->close();
  // close() returned: both handlers saw the cancellation and returned.
  EXPECT_EQ(probe->finished, 2);
  EXPECT_EQ(probe->saw_cancel, 2);
  EXPECT_EQ(c.session->in_flight(), 0u);
  c.sink.mark_closed();
  c.session->receive(R"({"jsonrpc":"2.0","id":500,"method":"ping"})");
  c.session->receive("not json");
  server->notify_resource_list_changed();
  c.threads.join();
  EXPECT_EQ(c.sink.sent_after_close(), 0);
  EXPECT_FALSE(c.sink.answered(id));
  EXPECT_FALSE(c.sink.answered(id2));
  c.session->close();  // idempotent
}

TEST_F(McpTest, CloseWithQueuedWorkAndDestructorWhileRunning) {
  {
    Client c(*server, Mode::manual);
    c.initialize();
    json id = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "x"}}}});
    c.session->close();
    c.sink.mark_closed();
    c.manual.run_all();  // the work runs after close: nothing happens
    EXPECT_EQ(c.sink.sent_after_close(), 0);
    EXPECT_FALSE(c.sink.answered(id));
  }
  {
    Client c(*server);
    c.initialize();
    c.send_request("tools/call", {{"name", "slow"}});
    ASSERT_TRUE(eventually([&] { return probe->started == 1; }));
    c.session.reset();  // the destructor cancels and waits
    EXPECT_EQ(probe->finished, 1);
    EXPECT_EQ(probe->saw_cancel, 1);
  }
}

TEST_F(McpTest, InlineExecutorAnswersBeforeReceiveReturns) {
  Client c(*server, Mode::inline_);
  c.initialize();
  json id = c.send_request("tools/call", {{"name", "echo"}, {"arguments", {{"text", "now"}}}});
  EXPECT_TRUE(c.sink.answered(id));
  EXPECT_EQ(result_text(c.sink.response(id)), "now");
  json r = c.send_request("resources/read", {{"uri", "mem://a"}});
  EXPECT_TRUE(c.sink.answered(r));
}

TEST_F(McpTest, ReceiveNeverThrowsAndSendFailuresAreContained) {
  int calls = 0;
  mcp::Session s(
      *server, "throwing",
      [&](const json&) {
        ++calls;
        throw std::runtime_error("pipe closed");
      },
      nullptr);  // no executor: run inline
  EXPECT_NO_THROW(s.receive(std::string_view("{oops")));
  EXPECT_NO_THROW(s.receive(json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "ping"}}));
  EXPECT_NO_THROW(s.receive(json("just a string")));
  EXPECT_EQ(calls, 3);
}

TEST_F(McpTest, CloseFromInsideAHandlerDoesNotDeadlock) {
  Client* client = nullptr;
  server->add_tool({
      .name = "closer",
      .handler =
          [&](const json&, mcp::RequestContext& ctx) {
            client->session->close();
            return mcp::ToolResult::text(ctx.cancelled() ? "cancelled" : "not cancelled");
          },
  });
  Client c(*server);
  client = &c;
  c.initialize();
  json id = c.send_request("tools/call", {{"name", "closer"}});
  c.threads.join();
  EXPECT_FALSE(c.sink.answered(id));
  EXPECT_EQ(c.session->in_flight(), 0u);
}

TEST_F(McpTest, ManySessionsAndCallsConcurrently) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<Client>(*server, Mode::threads, "s" + std::to_string(i)));
    clients.back()->initialize();
  }
  std::vector<std::thread> drivers;
  for (auto& client : clients) {
    drivers.emplace_back([&c = *client, this] {
      for (int j = 0; j < 20; ++j) {
        auto r = c.tool("echo", {{"text", std::to_string(j)}});
        EXPECT_EQ(result_text(r), std::to_string(j));
        if (j % 5 == 0) server->notify_resource_list_changed();
      }
    });
  }
  for (auto& d : drivers) d.join();
  for (auto& client : clients)
    EXPECT_EQ(client->sink.notifications("notifications/resources/list_changed").size(), 16u);
}

// ---------------------------------------------------------------------------------------------
// MCP 2026-07-28 beside 2025-11-25: the era of each request, server/discover, the per-request
// envelope, result shapes, subscriptions/listen, MRTR.

json envelope(json extra = json::object()) {
  json meta = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
               {"io.modelcontextprotocol/clientInfo", {{"name", "modern-client"}, {"version", "2.4.0"}}},
               {"io.modelcontextprotocol/clientCapabilities", json::object()}};
  meta.update(extra);
  return meta;
}

json modern(json params = json::object(), json extra_meta = json::object()) {
  params["_meta"] = envelope(std::move(extra_meta));
  return params;
}

TEST_F(McpTest, ModernDiscoverDescribesTheServerAndFixesNoEra) {
  Client c(*server);
  json r = c.call("server/discover", modern());
  ASSERT_TRUE(r.contains("result")) << r.dump();
  const json& res = r["result"];
  EXPECT_EQ(res["resultType"], "complete");
  EXPECT_EQ(res["supportedVersions"][0], "2026-07-28");
  EXPECT_NE(std::find(res["supportedVersions"].begin(), res["supportedVersions"].end(), "2025-11-25"),
            res["supportedVersions"].end());
  EXPECT_EQ(res["capabilities"]["tools"]["listChanged"], true);
  EXPECT_EQ(res["capabilities"]["resources"]["subscribe"], true);
  EXPECT_EQ(res["instructions"], "Use the tools.");
  EXPECT_EQ(res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "ns-hpc");
  EXPECT_EQ(res["_meta"]["io.modelcontextprotocol/serverInfo"]["version"], "1.2.3");
  EXPECT_EQ(res["cacheScope"], "private");
  EXPECT_TRUE(res["ttlMs"].is_number_integer());
  // A client with the discover-then-initialize bug is served in the legacy era.
  json init = c.initialize();
  ASSERT_TRUE(init.contains("result")) << init.dump();
  EXPECT_EQ(init["result"]["protocolVersion"], "2025-11-25");
  json tools = c.call("tools/list");
  EXPECT_FALSE(tools["result"].contains("resultType")) << "legacy results stay as they were";
  // ... and a modern request on that legacy session is refused clearly.
  json mixed = c.call("tools/list", modern());
  EXPECT_EQ(error_code(mixed), mcp::kInvalidRequest);
  EXPECT_TRUE(has(error_message(mixed), "opened with initialize")) << error_message(mixed);
  // Discover stays answerable.
  EXPECT_TRUE(c.call("server/discover", modern()).contains("result"));
}

TEST_F(McpTest, ModernRequestsNeedNoHandshakeAndCarryTheirShape) {
  Client c(*server);
  json list = c.call("tools/list", modern());
  ASSERT_TRUE(list.contains("result")) << list.dump();
  EXPECT_EQ(list["result"]["resultType"], "complete");
  EXPECT_EQ(list["result"]["ttlMs"], 60000);
  EXPECT_EQ(list["result"]["cacheScope"], "private");
  EXPECT_EQ(list["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "ns-hpc");
  // Deterministic order: the same list twice.
  EXPECT_EQ(c.call("tools/list", modern())["result"]["tools"], list["result"]["tools"]);
  json call = c.call("tools/call", modern({{"name", "echo"}, {"arguments", {{"text", "hi"}}}}));
  EXPECT_EQ(result_text(call), "hi");
  EXPECT_EQ(call["result"]["resultType"], "complete");
  EXPECT_FALSE(call["result"].contains("ttlMs")) << "only lists and reads are cacheable";
  // The request's own identity reaches the tool; a modern request has no session.
  json who = c.call("tools/call", modern({{"name", "whoami"}}));
  EXPECT_EQ(result_text(who), "modern-client/2.4.0||2026-07-28");
  // Reads carry cache hints; an unknown URI is -32602 in this era (not -32002).
  json read = c.call("resources/read", modern({{"uri", "mem://a"}}));
  EXPECT_EQ(read["result"]["ttlMs"], 0);
  EXPECT_EQ(read["result"]["contents"][0]["text"], "alpha");
  json missing = c.call("resources/read", modern({{"uri", "mem://nope"}}));
  EXPECT_EQ(error_code(missing), mcp::kInvalidParams);
  for (const char* m : {"prompts/list", "resources/list", "resources/templates/list"}) {
    json r = c.call(m, modern());
    EXPECT_TRUE(r["result"].contains("ttlMs")) << m << ": " << r.dump();
  }
  // Once modern, a request without the envelope (or initialize) is refused, naming the field.
  json bare = c.call("tools/list");
  EXPECT_EQ(error_code(bare), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(bare), "io.modelcontextprotocol/protocolVersion")) << error_message(bare);
  json init = c.initialize();
  EXPECT_EQ(error_code(init), mcp::kInvalidRequest);
  EXPECT_TRUE(has(error_message(init), "2026-07-28")) << error_message(init);
}

TEST_F(McpTest, ModernEnvelopeErrors) {
  Client c(*server);
  json old = c.call("tools/list", modern({}, {{"io.modelcontextprotocol/protocolVersion", "1900-01-01"}}));
  EXPECT_EQ(error_code(old), mcp::kUnsupportedProtocolVersion);
  EXPECT_EQ(old["error"]["data"]["requested"], "1900-01-01");
  EXPECT_EQ(old["error"]["data"]["supported"][0], "2026-07-28");
  json legacy_in_meta = c.call("tools/list", modern({}, {{"io.modelcontextprotocol/protocolVersion", "2025-11-25"}}));
  EXPECT_EQ(error_code(legacy_in_meta), mcp::kUnsupportedProtocolVersion);
  json no_caps = c.call("tools/list", {{"_meta", {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"}}}});
  EXPECT_EQ(error_code(no_caps), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(no_caps), "clientCapabilities")) << error_message(no_caps);
  json bad_level = c.call("tools/list", modern({}, {{"io.modelcontextprotocol/logLevel", "loud"}}));
  EXPECT_EQ(error_code(bad_level), mcp::kInvalidParams);
  // Legacy-only methods with the modern envelope are method-not-found, saying what replaces them.
  json ping = c.call("logging/setLevel", modern({{"level", "debug"}}));
  EXPECT_EQ(error_code(ping), mcp::kMethodNotFound);
  EXPECT_TRUE(has(error_message(ping), "logLevel")) << error_message(ping);
  // server/discover without the envelope names what is missing.
  json probe = c.call("server/discover");
  EXPECT_EQ(error_code(probe), mcp::kInvalidParams);
  // None of these fixed the era: a legacy client can still open this connection.
  EXPECT_TRUE(c.initialize().contains("result"));
}

TEST_F(McpTest, ModernLogLevelIsPerRequest) {
  Client c(*server);
  c.call("tools/call", modern({{"name", "logger"}}));
  EXPECT_TRUE(c.sink.notifications("notifications/message").empty()) << "no logLevel: no log messages";
  json id = c.send_request("tools/call", modern({{"name", "logger"}}, {{"io.modelcontextprotocol/logLevel", "warning"}}));
  c.sink.response(id);
  auto logs = c.sink.notifications("notifications/message");
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_EQ(logs[0]["params"]["level"], "warning");
  EXPECT_EQ(logs[1]["params"]["level"], "error");
}

TEST_F(McpTest, ModernTraceContextReachesTheHandler) {
  std::string seen_parent, seen_state;
  server->add_tool({.name = "trace",
                    .description = "Trace context",
                    .handler = [&](const json&, mcp::RequestContext& ctx) {
                      seen_parent = ctx.traceparent();
                      seen_state = ctx.tracestate();
                      return mcp::ToolResult::text("ok");
                    }});
  Client c(*server);
  const std::string parent = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
  c.call("tools/call", modern({{"name", "trace"}}, {{"traceparent", parent}, {"tracestate", "congo=t61rcWkgMzE"}}));
  EXPECT_EQ(seen_parent, parent);
  EXPECT_EQ(seen_state, "congo=t61rcWkgMzE");
  // Malformed ones are dropped, never passed on (they end up in environments and logs).
  for (const char* bad : {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01\nX=1",
                          "ff-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01", "00-0AF7651916CD43DD8448EB211C80319C-00f067aa0ba902b7-01"}) {
    c.call("tools/call", modern({{"name", "trace"}}, {{"traceparent", bad}}));
    EXPECT_EQ(seen_parent, "") << bad;
  }
  // A legacy session's request may carry it too.
  Client legacy(*server, Mode::threads, "legacy");
  legacy.initialize();
  legacy.tool("trace", json::object(), {{"traceparent", parent}});
  EXPECT_EQ(seen_parent, parent);
}

TEST_F(McpTest, ModernInputRequiredAndRetry) {
  server->add_tool({.name = "ask",
                    .description = "Needs an answer",
                    .handler = [](const json&, mcp::RequestContext& ctx) -> mcp::ToolResult {
                      if (ctx.input_responses().contains("q1") && ctx.request_state() == "s1")
                        return mcp::ToolResult::text("answer: " + ctx.input_responses().at("q1").at("content").at("x").get<std::string>());
                      json requests = json::object();
                      requests["q1"] = {{"method", "elicitation/create"},
                                        {"params", {{"message", "x?"}, {"requestedSchema", {{"type", "object"}}}}}};
                      throw mcp::InputRequired{requests, "s1"};
                    }});
  Client c(*server);
  json first = c.call("tools/call", modern({{"name", "ask"}}));
  ASSERT_TRUE(first.contains("result")) << first.dump();
  EXPECT_EQ(first["result"]["resultType"], "input_required");
  EXPECT_EQ(first["result"]["requestState"], "s1");
  EXPECT_EQ(first["result"]["inputRequests"]["q1"]["method"], "elicitation/create");
  EXPECT_FALSE(first["result"].contains("content"));
  json retry = c.call("tools/call", modern({{"name", "ask"},
                                            {"inputResponses", {{"q1", {{"action", "accept"}, {"content", {{"x", "42"}}}}}}},
                                            {"requestState", "s1"}}));
  EXPECT_EQ(result_text(retry), "answer: 42");
  json bad = c.call("tools/call", modern({{"name", "ask"}, {"inputResponses", "yes"}}));
  EXPECT_EQ(error_code(bad), mcp::kInvalidParams);
}

TEST_F(McpTest, ModernSubscriptionsListen) {
  Client c(*server);
  json id = c.send_request("subscriptions/listen",
                           modern({{"notifications", {{"toolsListChanged", true}, {"resourceSubscriptions", {"mem://a"}}}}}));
  ASSERT_TRUE(eventually([&] { return !c.sink.notifications("notifications/subscriptions/acknowledged").empty(); }));
  json ack = c.sink.notifications("notifications/subscriptions/acknowledged")[0];
  EXPECT_EQ(ack["params"]["notifications"]["toolsListChanged"], true);
  EXPECT_EQ(ack["params"]["notifications"]["resourceSubscriptions"], json::array({"mem://a"}));
  EXPECT_EQ(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], id);
  EXPECT_EQ(server->subscribed_uris().count("mem://a"), 1u);
  server->notify_tool_list_changed();
  server->notify_resource_updated("mem://a");
  server->notify_resource_updated("mem://b");     // not asked for
  server->notify_resource_list_changed();          // not asked for
  auto tools = c.sink.notifications("notifications/tools/list_changed");
  ASSERT_EQ(tools.size(), 1u);
  EXPECT_EQ(tools[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], id);
  auto updated = c.sink.notifications("notifications/resources/updated");
  ASSERT_EQ(updated.size(), 1u);
  EXPECT_EQ(updated[0]["params"]["uri"], "mem://a");
  EXPECT_TRUE(c.sink.notifications("notifications/resources/list_changed").empty());
  EXPECT_FALSE(c.sink.answered(id));
  EXPECT_EQ(c.session->in_flight(), 1u);
  // A legacy session beside it hears list changes unsolicited, as before.
  Client legacy(*server, Mode::threads, "legacy");
  legacy.initialize();
  server->notify_tool_list_changed();
  EXPECT_EQ(legacy.sink.notifications("notifications/tools/list_changed").size(), 1u);
  EXPECT_EQ(c.sink.notifications("notifications/tools/list_changed").size(), 2u);
  // Cancelling ends the stream without a response.
  c.notify("notifications/cancelled", {{"requestId", id}});
  EXPECT_EQ(c.session->in_flight(), 0u);
  server->notify_tool_list_changed();
  EXPECT_EQ(c.sink.notifications("notifications/tools/list_changed").size(), 2u);
  EXPECT_FALSE(c.sink.answered(id));
  EXPECT_TRUE(server->subscribed_uris().empty());
  // A second stream, ended by the server: it gets a final result naming the subscription.
  json id2 = c.send_request("subscriptions/listen", modern({{"notifications", {{"promptsListChanged", true}}}}));
  ASSERT_TRUE(eventually([&] { return c.sink.notifications("notifications/subscriptions/acknowledged").size() == 2; }));
  c.session->close();
  json end = c.sink.response(id2);
  EXPECT_EQ(end["result"]["resultType"], "complete");
  EXPECT_EQ(end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], id2);
}

TEST_F(McpTest, ModernListenRefusesBadFiltersAndLegacyListenIsUnknown) {
  Client c(*server);
  EXPECT_EQ(error_code(c.call("subscriptions/listen", modern())), mcp::kInvalidParams);
  EXPECT_EQ(error_code(c.call("subscriptions/listen", modern({{"notifications", {{"toolsListChanged", "yes"}}}}))),
            mcp::kInvalidParams);
  json many = json::array();
  for (int i = 0; i < 1001; ++i) many.push_back("mem://" + std::to_string(i));
  EXPECT_EQ(error_code(c.call("subscriptions/listen", modern({{"notifications", {{"resourceSubscriptions", many}}}}))),
            mcp::kInvalidParams);
  Client legacy(*server, Mode::threads, "legacy");
  legacy.initialize();
  json r = legacy.call("subscriptions/listen", {{"notifications", {{"toolsListChanged", true}}}});
  EXPECT_EQ(error_code(r), mcp::kMethodNotFound);
}

TEST_F(McpTest, ModernRequestClientIsRefused) {
  std::string why;
  server->add_tool({.name = "sample",
                    .description = "Asks the client",
                    .handler = [&](const json&, mcp::RequestContext& ctx) {
                      try {
                        ctx.request_client("sampling/createMessage", json::object(), 1s);
                      } catch (const mcp::ProtocolError& e) {
                        why = e.what();
                      }
                      return mcp::ToolResult::text("ok");
                    }});
  Client c(*server);
  c.call("tools/call", modern({{"name", "sample"}}, {{"io.modelcontextprotocol/clientCapabilities", {{"sampling", json::object()}}}}));
  EXPECT_TRUE(has(why, "input_required")) << why;
  EXPECT_TRUE(c.sink.notifications("sampling/createMessage").empty());
}

TEST(McpEnvelope, ReadsEraAndFields) {
  EXPECT_EQ(mcp::read_envelope(json{{"method", "tools/list"}}).era, mcp::Era::legacy);
  EXPECT_EQ(mcp::read_envelope(json{{"params", {{"_meta", {{"progressToken", 1}}}}}}).era, mcp::Era::legacy);
  auto env = mcp::read_envelope(json{{"params", modern({}, {{"io.modelcontextprotocol/logLevel", "info"}})}});
  EXPECT_EQ(env.era, mcp::Era::modern);
  EXPECT_EQ(env.protocol_version, "2026-07-28");
  EXPECT_EQ(env.client_name, "modern-client/2.4.0");
  EXPECT_EQ(env.log_level, mcp::LogLevel::info);
  EXPECT_THROW(mcp::read_envelope(json{{"params", {{"_meta", {{"io.modelcontextprotocol/protocolVersion", 7}}}}}}),
               mcp::ProtocolError);
  EXPECT_TRUE(mcp::is_method("server/discover", mcp::Era::modern));
  EXPECT_FALSE(mcp::is_method("server/discover", mcp::Era::legacy));
  EXPECT_FALSE(mcp::is_method("initialize", mcp::Era::modern));
  EXPECT_TRUE(mcp::is_method("tools/call", mcp::Era::modern));
}

// ---------------------------------------------------------------------------------------------
// Tasks in both wires (the core's part: shapes, capabilities, methods), over a store in memory.

class MemoryTasks : public mcp::TaskStore {
 public:
  mcp::Task add(mcp::Task::Status status) {
    std::lock_guard lock(mu_);
    mcp::Task t;
    t.id = "t" + std::to_string(tasks_.size() + 1);
    t.status = status;
    t.created_at = "2026-12-07T10:00:00Z";
    t.last_updated_at = "2026-12-07T10:00:01Z";
    t.ttl_ms = 3'600'000;
    t.poll_interval_ms = 100;
    if (status == mcp::Task::Status::completed) t.result = mcp::ToolResult::text("done", json{{"exit_code", 0}});
    if (status == mcp::Task::Status::failed) t.error = json{{"code", -32603}, {"message", "broke"}};
    if (status == mcp::Task::Status::input_required)
      t.input_requests = {{"confirm", {{"method", "elicitation/create"}, {"params", {{"message", "ok?"}}}}}};
    tasks_.push_back(t);
    return t;
  }
  void finish(const std::string& id) {
    std::lock_guard lock(mu_);
    for (auto& t : tasks_)
      if (t.id == id) {
        t.status = mcp::Task::Status::completed;
        t.result = mcp::ToolResult::text("finished later");
      }
  }
  mcp::Task get(const std::string& id, mcp::RequestContext&) override {
    std::lock_guard lock(mu_);
    for (const auto& t : tasks_)
      if (t.id == id) return t;
    throw mcp::ProtocolError(mcp::kInvalidParams, "Failed to retrieve task: no task " + id);
  }
  mcp::Task cancel(const std::string& id, mcp::RequestContext& ctx) override {
    {
      std::lock_guard lock(mu_);
      for (auto& t : tasks_)
        if (t.id == id && t.status == mcp::Task::Status::working) t.status = mcp::Task::Status::cancelled;
    }
    return get(id, ctx);
  }
  void update(const std::string& id, const json& responses, mcp::RequestContext& ctx) override {
    get(id, ctx);
    std::lock_guard lock(mu_);
    updates.push_back(responses);
  }
  std::vector<mcp::Task> list(std::size_t start, std::size_t count, std::size_t& total, mcp::RequestContext&) override {
    std::lock_guard lock(mu_);
    total = tasks_.size();
    std::vector<mcp::Task> out;
    for (std::size_t i = start; i < tasks_.size() && (count == 0 || out.size() < count); ++i) out.push_back(tasks_[i]);
    return out;
  }
  std::vector<json> updates;

 private:
  std::mutex mu_;
  std::vector<mcp::Task> tasks_;
};

class McpTasksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mcp::ServerOptions options;
    options.page_size = 2;
    server = make_server(probe, {.options = options});
    tasks = std::make_shared<MemoryTasks>();
    server->set_tasks(tasks);
    server->add_tool({.name = "job",
                      .description = "Long work",
                      .handler =
                          [this](const json&, mcp::RequestContext& ctx) {
                            if (ctx.task_mode() == mcp::RequestContext::TaskMode::none)
                              return mcp::ToolResult::text("ran inline");
                            ttl_asked = ctx.requested_task_ttl();
                            return mcp::ToolResult::of_task(tasks->add(mcp::Task::Status::working));
                          },
                      .task_support = mcp::Tool::TaskSupport::optional});
  }
  std::shared_ptr<Probe> probe = std::make_shared<Probe>();
  std::unique_ptr<mcp::Server> server;
  std::shared_ptr<MemoryTasks> tasks;
  std::optional<std::int64_t> ttl_asked;
};

json with_tasks() { return {{"io.modelcontextprotocol/clientCapabilities", {{"extensions", {{"io.modelcontextprotocol/tasks", json::object()}}}}}}; }

TEST_F(McpTasksTest, ModernClientWithTheExtensionGetsATaskAndFollowsIt) {
  Client c(*server);
  json discover = c.call("server/discover", modern());
  EXPECT_TRUE(discover["result"]["capabilities"]["extensions"].contains("io.modelcontextprotocol/tasks"));
  EXPECT_FALSE(discover["result"]["capabilities"].contains("tasks")) << "the 2025 capability is not 2026's";
  json created = c.call("tools/call", modern({{"name", "job"}}, with_tasks()));
  ASSERT_TRUE(created.contains("result")) << created.dump();
  const json& r = created["result"];
  EXPECT_EQ(r["resultType"], "task");
  EXPECT_EQ(r["taskId"], "t1");
  EXPECT_EQ(r["status"], "working");
  EXPECT_EQ(r["ttlMs"], 3600000);
  EXPECT_EQ(r["pollIntervalMs"], 100);
  EXPECT_FALSE(r.contains("content"));
  json got = c.call("tasks/get", modern({{"taskId", "t1"}}, with_tasks()));
  EXPECT_EQ(got["result"]["resultType"], "complete");
  EXPECT_EQ(got["result"]["status"], "working");
  tasks->finish("t1");
  got = c.call("tasks/get", modern({{"taskId", "t1"}}, with_tasks()));
  EXPECT_EQ(got["result"]["status"], "completed");
  EXPECT_EQ(got["result"]["result"]["content"][0]["text"], "finished later");
  EXPECT_EQ(got["result"]["result"]["resultType"], "complete");
  // input_required and failed carry their payloads.
  tasks->add(mcp::Task::Status::input_required);
  tasks->add(mcp::Task::Status::failed);
  EXPECT_EQ(c.call("tasks/get", modern({{"taskId", "t2"}}, with_tasks()))["result"]["inputRequests"]["confirm"]["method"],
            "elicitation/create");
  EXPECT_EQ(c.call("tasks/get", modern({{"taskId", "t3"}}, with_tasks()))["result"]["error"]["message"], "broke");
  json upd = c.call("tasks/update", modern({{"taskId", "t2"}, {"inputResponses", {{"confirm", {{"action", "accept"}}}}}}, with_tasks()));
  EXPECT_EQ(upd["result"]["resultType"], "complete");
  ASSERT_EQ(tasks->updates.size(), 1u);
  // Cancel acknowledges with an empty result.
  tasks->add(mcp::Task::Status::working);
  json cancelled = c.call("tasks/cancel", modern({{"taskId", "t4"}}, with_tasks()));
  EXPECT_EQ(cancelled["result"]["resultType"], "complete");
  EXPECT_FALSE(cancelled["result"].contains("taskId"));
  EXPECT_EQ(c.call("tasks/get", modern({{"taskId", "t4"}}, with_tasks()))["result"]["status"], "cancelled");
  // Unknown ids are -32602 with the store's words.
  json unknown = c.call("tasks/get", modern({{"taskId", "nope"}}, with_tasks()));
  EXPECT_EQ(error_code(unknown), mcp::kInvalidParams);
  EXPECT_TRUE(has(error_message(unknown), "no task nope"));
  // 2025-only methods are not there in 2026.
  EXPECT_EQ(error_code(c.call("tasks/list", modern({}, with_tasks()))), mcp::kMethodNotFound);
  EXPECT_EQ(error_code(c.call("tasks/result", modern({{"taskId", "t1"}}, with_tasks()))), mcp::kMethodNotFound);
}

TEST_F(McpTasksTest, ModernClientWithoutTheExtensionNeverGetsATask) {
  Client c(*server);
  json plain = c.call("tools/call", modern({{"name", "job"}}));
  EXPECT_EQ(result_text(plain), "ran inline");
  EXPECT_EQ(plain["result"]["resultType"], "complete");
  json got = c.call("tasks/get", modern({{"taskId", "t1"}}));
  EXPECT_EQ(error_code(got), mcp::kMissingRequiredClientCapability);
  EXPECT_TRUE(got["error"]["data"]["requiredCapabilities"]["extensions"].contains("io.modelcontextprotocol/tasks"));
  // A tool that answers with a task where none is allowed is a server bug, said as such.
  server->add_tool({.name = "rogue",
                    .description = "Always a task",
                    .handler = [this](const json&, mcp::RequestContext&) {
                      return mcp::ToolResult::of_task(tasks->add(mcp::Task::Status::working));
                    }});
  EXPECT_EQ(error_code(c.call("tools/call", modern({{"name", "rogue"}}))), mcp::kInternalError);
}

TEST_F(McpTasksTest, LegacyExperimentalWire) {
  Client c(*server);
  json init = c.initialize();
  const json& caps = init["result"]["capabilities"];
  EXPECT_TRUE(caps["tasks"]["requests"]["tools"].contains("call"));
  EXPECT_TRUE(caps["tasks"].contains("list"));
  EXPECT_TRUE(caps["tasks"].contains("cancel"));
  json all_tools = json::array();
  for (json page = c.call("tools/list");; page = c.call("tools/list", {{"cursor", page["result"]["nextCursor"]}})) {
    for (const auto& t : page["result"]["tools"]) all_tools.push_back(t);
    if (!page["result"].contains("nextCursor")) break;
  }
  bool listed = false;
  for (const auto& t : all_tools)
    if (t["name"] == "job") {
      listed = true;
      EXPECT_EQ(t["execution"]["taskSupport"], "optional");
    } else {
      EXPECT_FALSE(t.contains("execution")) << t["name"];
    }
  EXPECT_TRUE(listed);
  // Without params.task: the plain result.
  EXPECT_EQ(result_text(c.tool("job")), "ran inline");
  // With it: {task: {...}} with ttl/pollInterval names.
  json created = c.call("tools/call", {{"name", "job"}, {"arguments", json::object()}, {"task", {{"ttl", 60000}}}});
  ASSERT_TRUE(created.contains("result")) << created.dump();
  EXPECT_EQ(created["result"]["task"]["taskId"], "t1");
  EXPECT_EQ(created["result"]["task"]["ttl"], 3600000);
  EXPECT_EQ(created["result"]["task"]["pollInterval"], 100);
  EXPECT_FALSE(created["result"].contains("resultType"));
  EXPECT_EQ(ttl_asked, 60000);
  // A tool that takes no tasks refuses params.task.
  EXPECT_EQ(error_code(c.call("tools/call", {{"name", "echo"}, {"arguments", {{"text", "x"}}}, {"task", json::object()}})),
            mcp::kInvalidParams);
  // tasks/get shows the task without its result; tasks/result blocks until it ends.
  json got = c.call("tasks/get", {{"taskId", "t1"}});
  EXPECT_EQ(got["result"]["status"], "working");
  EXPECT_FALSE(got["result"].contains("result"));
  json rid = c.send_request("tasks/result", {{"taskId", "t1"}});
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(c.sink.answered(rid));
  tasks->finish("t1");
  json result = c.sink.response(rid);
  EXPECT_EQ(result_text(result), "finished later");
  EXPECT_EQ(result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"], "t1");
  // tasks/list pages (page size 2 here); tasks/cancel answers with the task.
  tasks->add(mcp::Task::Status::working);
  tasks->add(mcp::Task::Status::failed);
  json page = c.call("tasks/list");
  EXPECT_EQ(page["result"]["tasks"].size(), 2u);
  ASSERT_TRUE(page["result"].contains("nextCursor"));
  json page2 = c.call("tasks/list", {{"cursor", page["result"]["nextCursor"]}});
  EXPECT_EQ(page2["result"]["tasks"].size(), 1u);
  json cancelled = c.call("tasks/cancel", {{"taskId", "t2"}});
  EXPECT_EQ(cancelled["result"]["status"], "cancelled");
  EXPECT_EQ(cancelled["result"]["taskId"], "t2");
  // A failed task's tasks/result is its JSON-RPC error.
  json failed = c.call("tasks/result", {{"taskId", "t3"}});
  EXPECT_EQ(error_code(failed), -32603);
  EXPECT_EQ(error_message(failed), "broke");
  // tasks/update is 2026's only.
  EXPECT_EQ(error_code(c.call("tasks/update", {{"taskId", "t1"}, {"inputResponses", json::object()}})), mcp::kMethodNotFound);
}

TEST_F(McpTest, NoTaskStoreNoTasks) {
  Client c(*server);
  json init = c.initialize();
  EXPECT_FALSE(init["result"]["capabilities"].contains("tasks"));
  EXPECT_EQ(error_code(c.call("tasks/get", {{"taskId", "x"}})), mcp::kMethodNotFound);
  Client m(*server, Mode::threads, "m");
  EXPECT_FALSE(m.call("server/discover", modern())["result"]["capabilities"].contains("extensions"));
}
