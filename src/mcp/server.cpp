#include "mcp/server.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_set>
#include <variant>

#include "base/log.hpp"
#include "base/text.hpp"
#include "mcp/validate.hpp"

namespace nshpc::mcp {

namespace {

constexpr int kServerBusy = -32000;  // implementation-defined server error range
constexpr std::string_view kCursorPrefix = "nshpc-page-";

// Which sessions this thread is currently running a handler for / sending for. close() called
// from inside a handler or a Send callback must not wait for itself.
thread_local std::vector<const void*> tl_handlers;
thread_local std::vector<const void*> tl_sends;

struct StackEntry {
  std::vector<const void*>& stack;
  StackEntry(std::vector<const void*>& s, const void* p) : stack(s) { stack.push_back(p); }
  ~StackEntry() { stack.pop_back(); }
  StackEntry(const StackEntry&) = delete;
  StackEntry& operator=(const StackEntry&) = delete;
};

std::size_t count_of(const std::vector<const void*>& stack, const void* p) {
  return static_cast<std::size_t>(std::count(stack.begin(), stack.end(), p));
}

ProtocolError invalid_params(std::string message) {
  return ProtocolError(kInvalidParams, std::move(message));
}

// params of a request: absent or null = {}; anything but an object is refused.
json params_of(const json& message) {
  auto p = message.find("params");
  if (p == message.end() || p->is_null()) return json::object();
  if (!p->is_object())
    throw invalid_params(
        fmt::format("params: expected an object, got {}", detail::describe_type(*p)));
  return *p;
}

std::string required_string(const json& params, const char* field) {
  auto v = params.find(field);
  if (v == params.end()) throw invalid_params(fmt::format("params.{}: missing", field));
  if (!v->is_string())
    throw invalid_params(
        fmt::format("params.{}: expected a string, got {}", field, detail::describe_type(*v)));
  return v->get<std::string>();
}

// An optional object member; absent or null = {}.
json optional_object(const json& params, const char* field) {
  auto v = params.find(field);
  if (v == params.end() || v->is_null()) return json::object();
  if (!v->is_object())
    throw invalid_params(
        fmt::format("params.{}: expected an object, got {}", field, detail::describe_type(*v)));
  return *v;
}

std::string encode_cursor(std::size_t offset) { return fmt::format("{}{}", kCursorPrefix, offset); }

std::optional<std::size_t> decode_cursor(std::string_view cursor) {
  if (cursor.substr(0, kCursorPrefix.size()) != kCursorPrefix) return std::nullopt;
  cursor.remove_prefix(kCursorPrefix.size());
  std::size_t offset = 0;
  auto [end, ec] = std::from_chars(cursor.data(), cursor.data() + cursor.size(), offset);
  if (ec != std::errc() || end != cursor.data() + cursor.size() || cursor.empty() || offset == 0)
    return std::nullopt;
  return offset;
}

// The offset params.cursor names (0 without one). A cursor that is not a string, or not one this
// server gave out, is refused (-32602).
std::size_t cursor_offset(const json& params) {
  auto c = params.find("cursor");
  if (c == params.end() || c->is_null()) return 0;
  if (!c->is_string())
    throw invalid_params(fmt::format("params.cursor: expected a string, got {}", detail::describe_type(*c)));
  auto offset = decode_cursor(c->get_ref<const std::string&>());
  if (!offset) throw invalid_params("invalid cursor");
  return *offset;
}

// One page of a list result: `items` from `start` on (at most `page_size` of them; 0: all) as
// {key: [...]}, with nextCursor when more follow.
template <class Item, class ToJson>
json page_at(std::size_t start, const std::vector<Item>& items, std::size_t page_size, const char* key,
             ToJson&& to_json) {
  start = std::min(start, items.size());  // the list may have shrunk since
  const std::size_t end =
      (page_size == 0 || items.size() - start <= page_size) ? items.size() : start + page_size;
  json page = json::array();
  for (std::size_t i = start; i < end; ++i) page.push_back(to_json(items[i]));
  json result = {{key, std::move(page)}};
  if (end < items.size()) result["nextCursor"] = encode_cursor(end);
  return result;
}

// The page params.cursor asks for.
template <class Item, class ToJson>
json page_of(const json& params, const std::vector<Item>& items, std::size_t page_size, const char* key,
             ToJson&& to_json) {
  return page_at(cursor_offset(params), items, page_size, key, std::forward<ToJson>(to_json));
}

// The request ids a session received last: at most `capacity` (the oldest is forgotten first).
class RecentIds {
 public:
  explicit RecentIds(std::size_t capacity) : capacity_(capacity) {}
  bool contains(const std::string& key) const { return set_.count(key) > 0; }
  void add(const std::string& key) {
    if (capacity_ == 0 || !set_.insert(key).second) return;
    order_.push_back(key);
    if (order_.size() > capacity_) {
      set_.erase(order_.front());
      order_.pop_front();
    }
  }
  std::size_t size() const { return order_.size(); }

 private:
  std::size_t capacity_;
  std::unordered_set<std::string> set_;
  std::deque<std::string> order_;  // oldest first
};

bool schema_has_property(const json& schema, const std::string& name) {
  if (!schema.is_object()) return false;
  auto props = schema.find("properties");
  return props != schema.end() && props->is_object() && props->contains(name);
}

json shape_tool_result(ToolResult r, ResultShape shape) {
  json out = json::object();
  switch (shape) {
    case ResultShape::both:
      out["content"] = std::move(r.content);
      if (r.structured) out["structuredContent"] = std::move(*r.structured);
      break;
    case ResultShape::text:
      // Without structuredContent a result needs its content; a tool that only returned
      // structured data gets it as JSON text.
      if ((r.content.is_array() && r.content.empty()) && r.structured)
        r.content = json::array(
            {{{"type", "text"},
              {"text", r.structured->dump(-1, ' ', false, json::error_handler_t::replace)}}});
      out["content"] = std::move(r.content);
      break;
    case ResultShape::structured:
      if (r.structured) {
        out["content"] = json::array();
        out["structuredContent"] = std::move(*r.structured);
      } else {
        out["content"] = std::move(r.content);
      }
      break;
  }
  if (!out["content"].is_array()) out["content"] = json::array();
  if (r.is_error) out["isError"] = true;
  return out;
}

// Adds the optional strings that are set: MCP leaves an unset one out rather than sending "".
void put_set(json& j, std::initializer_list<std::pair<const char*, const std::string&>> fields) {
  for (const auto& [key, value] : fields)
    if (!value.empty()) j[key] = value;
}

json tool_json(const Tool& t, ResultShape shape) {
  json j = {{"name", t.name}};
  put_set(j, {{"title", t.title}});
  j["description"] = t.description;
  j["inputSchema"] = t.input_schema;
  if (t.output_schema && shape != ResultShape::text) j["outputSchema"] = *t.output_schema;
  if (t.annotations) j["annotations"] = *t.annotations;
  if (t.task_support != Tool::TaskSupport::forbidden)  // 2025-11-25 (left out for 2026-07-28)
    j["execution"] = {{"taskSupport", t.task_support == Tool::TaskSupport::optional ? "optional" : "required"}};
  if (t.meta) j["_meta"] = *t.meta;
  return j;
}

constexpr std::string_view kRelatedTask = "io.modelcontextprotocol/related-task";

// A task as each wire shows it. 2025-11-25: {taskId, status, statusMessage?, createdAt,
// lastUpdatedAt, ttl, pollInterval?}. 2026-07-28: the same with ttlMs/pollIntervalMs and, for
// tasks/get (`detailed`), the result, error or input requests of its status.
json task_json(const Task& t, Era era, bool detailed, ResultShape shape) {
  json j = {{"taskId", t.id}, {"status", std::string(to_string(t.status))}};
  if (!t.status_message.empty()) j["statusMessage"] = t.status_message;
  j["createdAt"] = t.created_at;
  j["lastUpdatedAt"] = t.last_updated_at;
  const char* ttl_key = era == Era::modern ? "ttlMs" : "ttl";
  j[ttl_key] = t.ttl_ms ? json(*t.ttl_ms) : json(nullptr);
  if (t.poll_interval_ms) j[era == Era::modern ? "pollIntervalMs" : "pollInterval"] = *t.poll_interval_ms;
  if (detailed && era == Era::modern) {
    if (t.status == Task::Status::completed && t.result) {
      // The inlined CallToolResult is a 2026-07-28 result in its own right.
      j["result"] = shape_tool_result(*t.result, shape);
      j["result"]["resultType"] = "complete";
    }
    if (t.status == Task::Status::failed && t.error) j["error"] = *t.error;
    if (t.status == Task::Status::input_required) j["inputRequests"] = t.input_requests;
  }
  return j;
}

bool terminal(Task::Status status) {
  return status == Task::Status::completed || status == Task::Status::failed || status == Task::Status::cancelled;
}

json resource_json(const Resource& r) {
  json j = {{"uri", r.uri}, {"name", r.name}};
  put_set(j, {{"title", r.title}, {"description", r.description}, {"mimeType", r.mime_type}});
  if (r.size) j["size"] = *r.size;
  if (r.meta) j["_meta"] = *r.meta;
  return j;
}

json template_json(const ResourceTemplate& t) {
  json j = {{"uriTemplate", t.uri_template}, {"name", t.name}};
  put_set(j, {{"title", t.title}, {"description", t.description}, {"mimeType", t.mime_type}});
  return j;
}

json prompt_json(const Prompt& p) {
  json j = {{"name", p.name}};
  put_set(j, {{"title", p.title}, {"description", p.description}});
  json args = json::array();
  for (const auto& a : p.arguments) {
    json arg = {{"name", a.name}};
    put_set(arg, {{"description", a.description}});
    arg["required"] = a.required;
    args.push_back(std::move(arg));
  }
  j["arguments"] = std::move(args);
  return j;
}

std::string log_level_names() {
  std::string out;
  for (int i = 0; i <= static_cast<int>(LogLevel::emergency); ++i)
    out += (i ? ", " : "") + std::string(to_string(static_cast<LogLevel>(i)));
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ToolResult

ToolResult ToolResult::text(std::string text, std::optional<json> structured) {
  ToolResult r;
  r.content = json::array({{{"type", "text"}, {"text", std::move(text)}}});
  r.structured = std::move(structured);
  return r;
}

ToolResult ToolResult::of_task(Task task) {
  ToolResult r;
  r.task = std::make_shared<const Task>(std::move(task));
  return r;
}

std::string_view to_string(Task::Status status) {
  switch (status) {
    case Task::Status::working: return "working";
    case Task::Status::input_required: return "input_required";
    case Task::Status::completed: return "completed";
    case Task::Status::failed: return "failed";
    case Task::Status::cancelled: return "cancelled";
  }
  return "working";
}

ToolResult ToolResult::error(std::string text) {
  ToolResult r = ToolResult::text(std::move(text));
  r.is_error = true;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Session state

struct Session::State : std::enable_shared_from_this<Session::State> {
  // One request running through the Executor.
  struct Call {
    json id;
    std::string key;  // id.dump()
    std::string method;
    Envelope env;                       // what the request said about itself (its era among it)
    json input_responses = json::object();  // modern retries after input_required
    std::string request_state;
    RequestContext::TaskMode task_mode = RequestContext::TaskMode::none;  // tools/call only
    std::optional<std::int64_t> task_ttl;  // 2025-11-25: params.task.ttl
    std::optional<json> progress_token;
    std::atomic<bool> cancelled{false};   // set under State::mu (waiters use State::cv)
    std::mutex send_mu;                   // orders this request's progress before its response
    bool done = false;                    // response decided; guarded by send_mu
    std::optional<double> last_progress;  // guarded by send_mu
  };
  // A request this server sent to the client, waiting for the client's response.
  struct Outgoing {
    bool answered = false;
    json result;
    std::optional<json> error;
  };
  class RunningRequest;
  using Job = std::function<json(RequestContext& ctx)>;  // the result; may throw ProtocolError

  // A row of the method table (see methods()). `Answer` methods never block: they answer on the
  // I/O thread that read the request. `Offload` methods check their params there and return the
  // work, which runs on the Executor.
  enum class Lifecycle {
    anytime,      // before initialize too (ping)
    initialized,  // only once initialize was answered
    initializes,  // initialize itself: the session is initialized once its answer went out
  };
  using Answer = json (State::*)(const json& params);
  using Offload = Job (State::*)(const json& params);
  struct Method {
    Lifecycle lifecycle;
    std::variant<Answer, Offload> run;
  };
  static std::variant<Answer, Offload> on_io_thread(Answer answer) { return answer; }
  static std::variant<Answer, Offload> on_executor(Offload offload) { return offload; }
  static const std::map<std::string, Method, std::less<>>& methods();

  State(Server& srv, std::string session_id, RoutedSend send_fn, Executor exec, Unanswered unanswered_fn)
      : server(srv),
        id(std::move(session_id)),
        send(std::move(send_fn)),
        executor(std::move(exec)),
        unanswered(std::move(unanswered_fn)),
        recent_ids(srv.options().remembered_request_ids) {}

  Server& server;
  const std::string id;
  const RoutedSend send;
  const Executor executor;
  const Unanswered unanswered;

  mutable std::mutex mu;
  std::condition_variable cv;  // running/sending counts, cancellations
  bool closed = false;
  bool initialized = false;         // the initialize response went out
  bool client_initialized = false;  // notifications/initialized arrived
  // The era this connection settled on: initialize's answer fixes legacy, the first request with
  // a valid 2026-07-28 envelope fixes modern. server/discover (and ping) never fix it: a client
  // probes with discover and may still open with initialize.
  std::optional<Era> era;
  // subscriptions/listen requests open on this connection (modern): their id and filter.
  struct Listen {
    json id;
    bool tools = false, prompts = false, resources = false;
    std::set<std::string, std::less<>> uris;
  };
  std::map<std::string, Listen> listens;  // by request key
  std::string protocol_version;
  std::string client_name = "unknown";
  json client_capabilities = json::object();
  LogLevel level = LogLevel::info;
  // A request id is refused while its request is in flight (`calls`) and while it is among the
  // last ServerOptions::remembered_request_ids ids received: a long session holds no more.
  RecentIds recent_ids;
  std::map<std::string, std::shared_ptr<Call>> calls;  // accepted, not yet answered
  std::size_t running = 0;                             // handlers executing now
  std::size_t sending = 0;                             // Send calls in progress
  std::set<std::string, std::less<>> subscriptions;
  std::map<std::string, std::shared_ptr<Outgoing>> outgoing;  // by request id
  std::uint64_t next_outgoing = 0;

  Server::Registry& registry() { return *server.registry_; }

  // Sends unless closed; never with `mu` held. Returns whether it was handed to Send.
  bool emit(const json& message, const json& related = nullptr) {
    return to_transport([&] { send(message, related); });
  }

  // Tells the transport that the request of `call` ends without a response (it was cancelled).
  void went_unanswered(const Call& call) {
    if (unanswered) to_transport([&] { unanswered(call.id); });
  }

  // Calls into the transport unless closed; never with `mu` held (close() waits for the call to
  // end). Returns whether it was made.
  template <class Fn>
  bool to_transport(Fn&& transport_call) {
    {
      std::lock_guard lock(mu);
      if (closed) return false;
      ++sending;
    }
    {
      StackEntry entry(tl_sends, this);
      try {
        transport_call();
      } catch (...) {
        // The transport reports its own failures; the protocol core carries on.
      }
    }
    bool wake = false;
    {
      std::lock_guard lock(mu);
      --sending;
      wake = closed;  // only close() waits for sends to end
    }
    if (wake) cv.notify_all();
    return true;
  }

  // notifications/message about `call`: legacy at the session's level (once initialized), modern
  // at the request's own logLevel (none sent: no messages).
  void log(LogLevel lv, const json& data, const std::string& logger, const Call& call) {
    {
      std::lock_guard lock(mu);
      if (closed) return;
      if (call.env.era == Era::modern) {
        if (!call.env.log_level || lv < *call.env.log_level) return;
      } else if (!initialized || lv < level) {
        return;
      }
    }
    json params = {{"level", std::string(to_string(lv))}};
    if (!logger.empty()) params["logger"] = text::sanitize_utf8(logger);
    params["data"] = data;
    emit(make_notification("notifications/message", std::move(params)), call.id);
  }

  json request_client(const std::shared_ptr<Call>& call, const std::string& method, json params,
                      std::chrono::milliseconds timeout);
  void client_response(const json& message);

  void close() {
    // Subscription streams the server ends get their final result (the client sees a graceful end).
    std::vector<json> ending;
    {
      std::lock_guard lock(mu);
      if (!closed)
        for (auto& [key, l] : listens) {
          ending.push_back(l.id);
          calls.erase(key);
        }
      listens.clear();
    }
    for (const json& id : ending) emit(make_response(id, listen_ended(id)), id);
    std::unique_lock lock(mu);
    closed = true;
    for (auto& [key, call] : calls) call->cancelled = true;
    cv.notify_all();
    const std::size_t own_handlers = count_of(tl_handlers, this);
    const std::size_t own_sends = count_of(tl_sends, this);
    cv.wait(lock, [&] { return running <= own_handlers && sending <= own_sends; });
    calls.clear();  // queued work finds `closed` and returns without running
  }

  std::size_t in_flight() const {
    std::lock_guard lock(mu);
    return calls.size();
  }

  std::size_t request_ids_held() const {
    std::lock_guard lock(mu);
    return recent_ids.size() + calls.size();
  }

  void handle(json message);
  void notification(const std::string& method, const json& message);
  void request(const std::string& name, const json& id, const json& message);
  // The handlers of the method table.
  json initialize(const json& params);
  json discover(const json& params);
  json capabilities(Era era);
  json server_info() const;
  json shape(json result, std::string_view method, Era era) const;
  // subscriptions/listen: registers the stream's filter and acknowledges it; no response until
  // the server ends it (a cancel ends it without one).
  void listen(const json& id, const json& params, const Envelope& env);
  // The final result of a listen the server ends (it shuts down).
  json listen_ended(const json& id) const;
  // Change notifications: to a legacy session as before, and to every listen whose filter wants it.
  enum class Change { tools, prompts, resources, updated };
  void publish(Change change, const std::string& uri);
  json ping(const json& params);
  json set_level(const json& params);
  json list_tools(const json& params);
  Job call_tool(const json& params);
  json list_prompts(const json& params);
  Job get_prompt(const json& params);
  Job complete(const json& params);
  Job list_resources(const json& params);
  Job list_resource_templates(const json& params);
  json subscribe(const json& params);
  json unsubscribe(const json& params);
  Job read_resource(const json& params);
  Job get_task(const json& params);
  Job task_result(const json& params);
  Job list_tasks(const json& params);
  Job cancel_task(const json& params);
  Job update_task(const json& params);
  // The task store, or -32601 for `method` when the server has none.
  std::shared_ptr<TaskStore> tasks_for(std::string_view method);
  // The resource provider, or -32601 for `method` when the server has none.
  std::shared_ptr<ResourceProvider> resources_for(std::string_view method);

  void start(const json& id, const std::string& method, const json& params, const Envelope& env, Job job);
  void run(const std::shared_ptr<Call>& call, const Job& job);
  void erase_call(const std::shared_ptr<Call>& call) {  // mu held
    auto it = calls.find(call->key);
    if (it != calls.end() && it->second == call) calls.erase(it);
  }
  void reply(const json& id, json result) { emit(make_response(id, std::move(result)), id); }
  void fail(const json& id, int code, std::string_view message, const json& data = nullptr) {
    emit(make_error(id, code, message, data), id);
  }
};

// What the handler of one request running on the Executor sees of it and of its session.
class Session::State::RunningRequest final : public RequestContext {
 public:
  RunningRequest(std::shared_ptr<State> state, std::shared_ptr<Call> call)
      : state_(std::move(state)), call_(std::move(call)) {
    if (call_->env.era == Era::modern) {
      protocol_version_ = call_->env.protocol_version;
      client_name_ = call_->env.client_name.empty() ? std::string("unknown") : call_->env.client_name;
      return;
    }
    std::lock_guard lock(state_->mu);
    protocol_version_ = state_->protocol_version;
    client_name_ = state_->client_name;
    session_id_ = state_->id;
  }

  bool cancelled() const override { return call_->cancelled.load(); }

  bool wait_cancelled_for(std::chrono::milliseconds timeout) const override {
    std::unique_lock lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return call_->cancelled.load(); });
  }

  void progress(double progress, std::optional<double> total, const std::string& message) override {
    if (!call_->progress_token || !std::isfinite(progress)) return;
    std::lock_guard lock(call_->send_mu);
    if (call_->done || call_->cancelled.load()) return;
    if (call_->last_progress && progress <= *call_->last_progress) return;
    call_->last_progress = progress;
    json params = {{"progressToken", *call_->progress_token}, {"progress", progress}};
    if (total && std::isfinite(*total)) params["total"] = *total;
    if (!message.empty()) params["message"] = text::sanitize_utf8(message);
    state_->emit(make_notification("notifications/progress", std::move(params)), call_->id);
  }

  void log(LogLevel level, const json& data, const std::string& logger) override {
    state_->log(level, data, logger, *call_);
  }

  json client_capabilities() const override {
    if (call_->env.era == Era::modern) return call_->env.client_capabilities;
    std::lock_guard lock(state_->mu);
    return state_->client_capabilities;
  }

  json request_client(const std::string& method, json params,
                      std::chrono::milliseconds timeout) override {
    if (call_->env.era == Era::modern)
      throw ProtocolError(kInvalidRequest,
                          fmt::format("{} cannot be sent to a {} client: that revision has no server-to-client "
                                      "requests (the server answers input_required instead)",
                                      method, call_->env.protocol_version));
    return state_->request_client(call_, method, std::move(params), timeout);
  }

  Era era() const override { return call_->env.era; }
  const std::string& protocol_version() const override { return protocol_version_; }
  std::string client_name() const override { return client_name_; }
  const std::string& session_id() const override { return session_id_; }
  const std::string& traceparent() const override { return call_->env.traceparent; }
  const std::string& tracestate() const override { return call_->env.tracestate; }
  const json& input_responses() const override { return call_->input_responses; }
  TaskMode task_mode() const override { return call_->task_mode; }
  std::optional<std::int64_t> requested_task_ttl() const override { return call_->task_ttl; }
  const std::string& request_state() const override { return call_->request_state; }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Call> call_;
  std::string protocol_version_;
  std::string client_name_;
  std::string session_id_;  // empty for a modern request
};

// ---------------------------------------------------------------------------------------------
// Server registry

struct Server::Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<const Tool>> tools;
  std::vector<std::shared_ptr<const Prompt>> prompts;
  std::shared_ptr<ResourceProvider> resources;
  CompletionHandler completion;
  std::shared_ptr<TaskStore> tasks;
  Server::SessionClosed session_closed;
  std::map<Session*, std::weak_ptr<Session::State>> sessions;

  std::shared_ptr<const Tool> find_tool(std::string_view name) { return find(tools, name); }
  std::shared_ptr<const Prompt> find_prompt(std::string_view name) { return find(prompts, name); }
  std::vector<std::shared_ptr<const Tool>> all_tools() {
    std::lock_guard lock(mu);
    return tools;
  }
  // What tools/list shows: every tool but an alias that is not listed.
  std::vector<std::shared_ptr<const Tool>> listed_tools() {
    std::vector<std::shared_ptr<const Tool>> out;
    {
      std::lock_guard lock(mu);
      for (const auto& tool : tools)
        if (tool->listed) out.push_back(tool);
    }
    std::erase_if(out, [](const std::shared_ptr<const Tool>& tool) { return tool->shown && !tool->shown(); });
    return out;
  }
  std::vector<std::shared_ptr<const Prompt>> all_prompts() {
    std::lock_guard lock(mu);
    return prompts;
  }
  std::shared_ptr<ResourceProvider> provider() {
    std::lock_guard lock(mu);
    return resources;
  }
  CompletionHandler completion_handler() {
    std::lock_guard lock(mu);
    return completion;
  }

  template <class T>
  std::shared_ptr<const T> find(const std::vector<std::shared_ptr<const T>>& list, std::string_view name) {
    std::lock_guard lock(mu);
    for (const auto& item : list)
      if (item->name == name) return item;
    return nullptr;
  }
  // Adds `item` (a `kind`: tool or prompt) to `list`; one of the same name is replaced, the newer
  // definition winning. Returns whether sessions are open (and must hear that the list changed).
  template <class T>
  bool add(std::vector<std::shared_ptr<const T>>& list, T item, std::string_view kind) {
    if (item.name.empty()) throw std::invalid_argument(fmt::format("mcp: a {} needs a name", kind));
    if (!item.handler) throw std::invalid_argument(fmt::format("mcp: {} '{}' has no handler", kind, item.name));
    auto shared = std::make_shared<const T>(std::move(item));
    std::lock_guard lock(mu);
    auto it = std::find_if(list.begin(), list.end(), [&](const auto& old) { return old->name == shared->name; });
    if (it != list.end())
      *it = std::move(shared);
    else
      list.push_back(std::move(shared));
    return !sessions.empty();
  }

  std::vector<std::shared_ptr<Session::State>> open_sessions() {
    std::vector<std::shared_ptr<Session::State>> out;
    std::lock_guard lock(mu);
    for (auto& [session, weak] : sessions)
      if (auto state = weak.lock()) out.push_back(std::move(state));
    return out;
  }
  // Tells every open session of a change (sessions collected under the lock, served outside it).
  void publish(Session::State::Change change, const std::string& uri = {}) {
    for (auto& state : open_sessions()) state->publish(change, uri);
  }
};

Server::Server(ServerInfo info, ServerOptions options)
    : info_(std::move(info)),
      options_(std::move(options)),
      registry_(std::make_unique<Registry>()) {}

Server::~Server() = default;

void Server::add_tool(Tool tool) {
  if (registry_->add(registry_->tools, std::move(tool), "tool")) registry_->publish(Session::State::Change::tools);
}

void Server::add_prompt(Prompt prompt) {
  if (registry_->add(registry_->prompts, std::move(prompt), "prompt"))
    registry_->publish(Session::State::Change::prompts);
}

void Server::set_resources(std::shared_ptr<ResourceProvider> provider) {
  bool notify = false;
  {
    std::lock_guard lock(registry_->mu);
    registry_->resources = std::move(provider);
    notify = registry_->resources && !registry_->sessions.empty();
  }
  if (notify) notify_resource_list_changed();
}

void Server::set_tasks(std::shared_ptr<TaskStore> store) {
  std::lock_guard lock(registry_->mu);
  registry_->tasks = std::move(store);
}

void Server::set_completion(CompletionHandler handler) {
  std::lock_guard lock(registry_->mu);
  registry_->completion = std::move(handler);
}

void Server::set_session_closed(SessionClosed handler) {
  std::lock_guard lock(registry_->mu);
  registry_->session_closed = std::move(handler);
}

void Server::notify_tool_list_changed() { registry_->publish(Session::State::Change::tools); }

void Server::notify_resource_list_changed() { registry_->publish(Session::State::Change::resources); }

void Server::notify_resource_updated(const std::string& uri) {
  registry_->publish(Session::State::Change::updated, uri);
}

std::set<std::string> Server::subscribed_uris() const {
  std::set<std::string> uris;
  for (const auto& state : registry_->open_sessions()) {
    std::lock_guard lock(state->mu);
    if (state->closed) continue;
    uris.insert(state->subscriptions.begin(), state->subscriptions.end());
    for (const auto& [key, listen] : state->listens) uris.insert(listen.uris.begin(), listen.uris.end());
  }
  return uris;
}

void Server::attach(Session* session) {
  std::lock_guard lock(registry_->mu);
  registry_->sessions[session] = session->state_;
}

void Server::detach(Session* session) {
  std::lock_guard lock(registry_->mu);
  registry_->sessions.erase(session);
}

// ---------------------------------------------------------------------------------------------
// Message handling

void Session::State::handle(json message) {
  if (message.is_array()) {
    fail(nullptr, kInvalidRequest,
         "invalid request: batches are not supported; send one JSON-RPC message at a time");
    return;
  }
  if (!message.is_object()) {
    fail(nullptr, kInvalidRequest,
         fmt::format("invalid request: expected a JSON-RPC message object, got {}",
                     detail::describe_type(message)));
    return;
  }
  const auto id_it = message.find("id");
  const bool has_id = id_it != message.end();
  const json id = (has_id && is_valid_id(*id_it)) ? *id_it : json(nullptr);

  auto version = message.find("jsonrpc");
  if (version == message.end()) {
    fail(id, kInvalidRequest, R"(invalid request: missing "jsonrpc": "2.0")");
    return;
  }
  if (*version != "2.0") {
    fail(id, kInvalidRequest,
         fmt::format(R"(invalid request: "jsonrpc" must be "2.0", got {})", version->dump()));
    return;
  }
  auto method_it = message.find("method");
  if (method_it == message.end()) {
    // A response from the client to a request this server sent.
    if (message.contains("result") || message.contains("error")) {
      client_response(message);
      return;
    }
    fail(id, kInvalidRequest, R"(invalid request: missing "method")");
    return;
  }
  if (!method_it->is_string()) {
    fail(id, kInvalidRequest,
         fmt::format(R"(invalid request: "method" must be a string, got {})",
                     detail::describe_type(*method_it)));
    return;
  }
  const std::string method = method_it->get<std::string>();
  if (!has_id) {
    notification(method, message);
    return;
  }
  if (!is_valid_id(*id_it)) {
    fail(nullptr, kInvalidRequest,
         fmt::format(R"(invalid request: "id" must be a string or an integer, got {})",
                     detail::describe_type(*id_it)));
    return;
  }
  bool reused = false;
  {
    const std::string key = id.dump();
    std::lock_guard lock(mu);
    reused = calls.count(key) > 0 || recent_ids.contains(key);
    if (!reused) recent_ids.add(key);
  }
  if (reused) {
    fail(id, kInvalidRequest,
         fmt::format("request id {} was already used in this session", id.dump()));
    return;
  }
  try {
    request(method, id, message);
  } catch (const ProtocolError& e) {
    fail(id, e.code(), e.what(), e.data());
  } catch (const std::exception& e) {
    fail(id, kInternalError, e.what());
  }
}

void Session::State::notification(const std::string& method, const json& message) {
  auto p = message.find("params");
  const json params = (p != message.end() && p->is_object()) ? *p : json::object();
  if (method == "notifications/initialized") {
    std::lock_guard lock(mu);
    client_initialized = true;
  } else if (method == "notifications/cancelled") {
    auto rid = params.find("requestId");
    if (rid == params.end() || !is_valid_id(*rid)) return;
    std::shared_ptr<Call> ended_listen;
    {
      std::lock_guard lock(mu);
      auto it = calls.find(rid->dump());
      if (it == calls.end()) return;  // unknown or finished: ignored
      if (listens.erase(it->first) > 0) {  // a subscription stream: it ends now, without a response
        ended_listen = it->second;
        calls.erase(it);
      } else {
        it->second->cancelled = true;
        cv.notify_all();
      }
    }
    if (ended_listen) went_unanswered(*ended_listen);
  }
  // Anything else (including notifications/roots/list_changed) needs no action.
}

json Session::State::initialize(const json& params) {
  {
    std::lock_guard lock(mu);
    if (initialized)
      throw ProtocolError(kInvalidRequest,
                          "invalid request: initialize was already received in this session");
  }
  const std::string requested = required_string(params, "protocolVersion");
  const json capabilities = optional_object(params, "capabilities");
  auto info = params.find("clientInfo");
  if (info == params.end()) throw invalid_params("params.clientInfo: missing");
  if (!info->is_object())
    throw invalid_params(
        fmt::format("params.clientInfo: expected an object, got {}", detail::describe_type(*info)));
  auto name = info->find("name");
  if (name == info->end()) throw invalid_params("params.clientInfo.name: missing");
  if (!name->is_string())
    throw invalid_params(fmt::format("params.clientInfo.name: expected a string, got {}",
                                     detail::describe_type(*name)));
  std::string client = name->get<std::string>();
  if (auto v = info->find("version");
      v != info->end() && v->is_string() && !v->get_ref<const std::string&>().empty())
    client += "/" + v->get<std::string>();
  if (client.empty()) client = "unknown";

  const std::string negotiated =
      is_supported_version(requested) ? requested : std::string(kProtocolVersions.front());

  const ServerInfo& si = server.info();
  json result = {{"protocolVersion", negotiated}, {"capabilities", this->capabilities(Era::legacy)}, {"serverInfo", server_info()}};
  if (!si.instructions.empty()) result["instructions"] = si.instructions;

  std::lock_guard lock(mu);
  protocol_version = negotiated;
  client_name = std::move(client);
  client_capabilities = capabilities;
  return result;
}

json Session::State::capabilities(Era era) {
  auto& reg = registry();
  bool has_resources = false, has_prompts = false, has_completion = false, has_tasks = false;
  {
    std::lock_guard lock(reg.mu);
    has_resources = reg.resources != nullptr;
    has_prompts = !reg.prompts.empty();
    has_completion = static_cast<bool>(reg.completion);
    has_tasks = reg.tasks != nullptr;
  }
  json caps = json::object();
  caps["tools"] = {{"listChanged", true}};
  if (has_resources) caps["resources"] = {{"subscribe", true}, {"listChanged", true}};
  if (has_prompts) caps["prompts"] = {{"listChanged", true}};
  caps["logging"] = json::object();
  if (has_completion) caps["completions"] = json::object();
  json extensions = server.options().extensions;
  if (has_tasks && era == Era::legacy)
    caps["tasks"] = {{"list", json::object()}, {"cancel", json::object()}, {"requests", {{"tools", {{"call", json::object()}}}}}};
  if (has_tasks && era == Era::modern) extensions[kTasksExtension] = json::object();
  if (!extensions.empty()) caps["extensions"] = std::move(extensions);
  return caps;
}

json Session::State::server_info() const {
  const ServerInfo& si = server.info();
  json info = {{"name", si.name}};
  if (!si.title.empty()) info["title"] = si.title;
  info["version"] = si.version;
  return info;
}

json Session::State::discover(const json&) {
  json result = {{"supportedVersions", supported_versions()}, {"capabilities", capabilities(Era::modern)}};
  if (!server.info().instructions.empty()) result["instructions"] = server.info().instructions;
  return result;
}

// A modern result as 2026-07-28 wants it: resultType, the cache hints of lists and reads, and the
// server's identity in _meta. Legacy results go out as the handler made them.
json Session::State::shape(json result, std::string_view method, Era era) const {
  if (era == Era::legacy) return result;
  if (!result.is_object()) result = json::object();
  if (!result.contains("resultType")) result["resultType"] = "complete";
  if (result["resultType"] == "complete") {
    const auto& ttl = server.options().cache;
    std::optional<std::chrono::milliseconds> ms;
    if (method == "tools/list") ms = ttl.tools;
    else if (method == "prompts/list") ms = ttl.prompts;
    else if (method == "resources/list") ms = ttl.resources;
    else if (method == "resources/templates/list") ms = ttl.templates;
    else if (method == "resources/read") ms = ttl.read;
    else if (method == "server/discover") ms = ttl.discover;
    if (ms) {
      result["ttlMs"] = std::max<std::int64_t>(0, ms->count());
      result["cacheScope"] = "private";
    }
  }
  json& meta = result["_meta"];
  if (!meta.is_object()) meta = json::object();
  if (!meta.contains(kMetaServerInfo)) meta[kMetaServerInfo] = server_info();
  return result;
}

// ---------------------------------------------------------------------------------------------
// The method table: every request method, when it may come, and where it runs.

const std::map<std::string, Session::State::Method, std::less<>>& Session::State::methods() {
  // Answers come from the I/O thread that read the request for methods that never block
  // (lifecycle, settings, the tool and prompt lists); methods that call a tool, prompt,
  // completion or resource handler (the resource lists too) check their params there and run
  // on the Executor.
  using enum Lifecycle;
  // clang-format off
  static const std::map<std::string, Method, std::less<>> table = {
      {"initialize",               {initializes,            on_io_thread(&State::initialize)}},
      {"server/discover",          {anytime,                on_io_thread(&State::discover)}},
      {"ping",                     {anytime,                on_io_thread(&State::ping)}},
      {"logging/setLevel",         {initialized,            on_io_thread(&State::set_level)}},
      {"tools/list",               {initialized,            on_io_thread(&State::list_tools)}},
      {"tools/call",               {initialized,            on_executor(&State::call_tool)}},
      {"prompts/list",             {initialized,            on_io_thread(&State::list_prompts)}},
      {"prompts/get",              {initialized,            on_executor(&State::get_prompt)}},
      {"completion/complete",      {initialized,            on_executor(&State::complete)}},
      {"resources/list",           {initialized,            on_executor(&State::list_resources)}},
      {"resources/templates/list", {initialized,            on_executor(&State::list_resource_templates)}},
      {"resources/subscribe",      {initialized,            on_io_thread(&State::subscribe)}},
      {"resources/unsubscribe",    {initialized,            on_io_thread(&State::unsubscribe)}},
      {"resources/read",           {initialized,            on_executor(&State::read_resource)}},
      {"tasks/get",                {initialized,            on_executor(&State::get_task)}},
      {"tasks/result",             {initialized,            on_executor(&State::task_result)}},
      {"tasks/list",               {initialized,            on_executor(&State::list_tasks)}},
      {"tasks/cancel",             {initialized,            on_executor(&State::cancel_task)}},
      {"tasks/update",             {initialized,            on_executor(&State::update_task)}},
  };
  // clang-format on
  return table;
}

namespace {

std::string meta_field(std::string_view key) { return fmt::format("params._meta[\"{}\"]", key); }

}  // namespace

void Session::State::request(const std::string& name, const json& id, const json& message) {
  // The request's own envelope first: a modern one with a version not served is answered -32022,
  // a malformed one -32602, whatever the method.
  const Envelope env = read_envelope(message);
  const auto& table = methods();
  const auto found = table.find(name);
  const bool known = name == "subscriptions/listen" || found != table.end();
  if (!known || !is_method(name, env.era)) {
    if (known && env.era == Era::modern)
      throw ProtocolError(kMethodNotFound,
                          fmt::format("method not found: {} is a 2025-era method; a request with the {} _meta "
                                      "envelope has no such method{}",
                                      name, env.protocol_version,
                                      name == "initialize" ? " (2026-07-28 needs no handshake: send requests directly)"
                                      : name == "resources/subscribe" || name == "resources/unsubscribe"
                                          ? " (use subscriptions/listen with resourceSubscriptions)"
                                      : name == "logging/setLevel" ? " (send _meta[\"io.modelcontextprotocol/logLevel\"] "
                                                                     "with each request instead)"
                                                                   : ""));
    if (known && name == "server/discover")
      throw invalid_params(fmt::format("{}: missing; server/discover is a 2026-07-28 request and carries its version "
                                       "and client capabilities in _meta (a 2025-era client opens with initialize)",
                                       meta_field(kMetaProtocolVersion)));
    if (known)
      throw ProtocolError(kMethodNotFound,
                          fmt::format("method not found: {} is a 2026-07-28 method: send it with {} and {}", name,
                                      meta_field(kMetaProtocolVersion), meta_field(kMetaClientCapabilities)));
    throw ProtocolError(kMethodNotFound, fmt::format("method not found: {}", text::truncate_utf8(name, 80)));
  }
  // The era of the connection: fixed by initialize (legacy) or by the first other modern request;
  // discover and ping leave it open.
  if (name != "server/discover" && name != "ping") {
    std::lock_guard lock(mu);
    if (!era && env.era == Era::modern) era = Era::modern;
    if (era == Era::legacy && env.era == Era::modern)
      throw ProtocolError(kInvalidRequest,
                          fmt::format("invalid request: this connection opened with initialize (MCP {}), so it "
                                      "speaks the 2025 era; a request with the {} _meta envelope cannot be served "
                                      "on it. Send it without {} (as the session's version), or on a new "
                                      "connection without initialize",
                                      protocol_version, env.protocol_version, meta_field(kMetaProtocolVersion)));
    if (era == Era::modern && env.era == Era::legacy) {
      if (name == "initialize")
        throw ProtocolError(kInvalidRequest,
                            "invalid request: this connection speaks MCP 2026-07-28 since its first request (it "
                            "carried the _meta envelope); initialize cannot follow on it. Open a new connection "
                            "for a 2025-era session");
      throw invalid_params(fmt::format("{}: missing; this connection speaks MCP 2026-07-28 since its first request, "
                                       "and every request carries its version and client capabilities in _meta",
                                       meta_field(kMetaProtocolVersion)));
    }
  }
  if (name == "subscriptions/listen") {
    listen(id, params_of(message), env);
    return;
  }
  const Method& method = found->second;
  if (env.era == Era::legacy && method.lifecycle == Lifecycle::initialized) {
    std::lock_guard lock(mu);
    if (!initialized)
      throw ProtocolError(kInvalidRequest, "server not initialized: send initialize first");
  }
  // ping answers whatever its params are: a liveness check never fails.
  const json params = method.lifecycle == Lifecycle::anytime ? json::object() : params_of(message);
  if (const auto* answer = std::get_if<Answer>(&method.run)) {
    json result = (this->**answer)(params);
    if (name == "tools/list" && env.era == Era::modern)  // execution.taskSupport is 2025-11-25's
      for (auto& tool : result["tools"]) tool.erase("execution");
    reply(id, shape(std::move(result), name, env.era));
    if (method.lifecycle == Lifecycle::initializes) {
      // Only now: nothing (a log, a list_changed) may reach the client before this answer.
      std::lock_guard lock(mu);
      initialized = true;
      era = Era::legacy;
    }
    return;
  }
  start(id, name, params, env, (this->*std::get<Offload>(method.run))(params));
}

void Session::State::listen(const json& id, const json& params, const Envelope& env) {
  constexpr std::size_t kMaxUris = 1000, kMaxUriBytes = 4096;
  auto filter = params.find("notifications");
  if (filter == params.end() || !filter->is_object())
    throw invalid_params(fmt::format(
        "params.notifications: expected an object like {{\"toolsListChanged\": true, \"resourceSubscriptions\": "
        "[\"…\"]}}, got {}",
        filter == params.end() ? std::string_view("nothing") : detail::describe_type(*filter)));
  bool has_resources = false, has_prompts = false;
  {
    std::lock_guard lock(registry().mu);
    has_resources = registry().resources != nullptr;
    has_prompts = !registry().prompts.empty();
  }
  Listen entry;
  entry.id = id;
  json honored = json::object();
  for (const auto& [field, offered, target] :
       {std::tuple<const char*, bool, bool*>{"toolsListChanged", true, &entry.tools},
        {"promptsListChanged", has_prompts, &entry.prompts},
        {"resourcesListChanged", has_resources, &entry.resources}}) {
    auto v = filter->find(field);
    if (v == filter->end() || v->is_null()) continue;
    if (!v->is_boolean())
      throw invalid_params(fmt::format("params.notifications.{}: expected a boolean, got {}", field,
                                       detail::describe_type(*v)));
    *target = v->get<bool>() && offered;
    if (*target) honored[field] = true;
  }
  if (auto uris = filter->find("resourceSubscriptions"); uris != filter->end() && !uris->is_null()) {
    if (!uris->is_array())
      throw invalid_params(fmt::format("params.notifications.resourceSubscriptions: expected an array of URIs, got {}",
                                       detail::describe_type(*uris)));
    if (uris->size() > kMaxUris)
      throw invalid_params(fmt::format("params.notifications.resourceSubscriptions: {} URIs; at most {} per stream",
                                       uris->size(), kMaxUris));
    for (const auto& uri : *uris) {
      if (!uri.is_string() || uri.get_ref<const std::string&>().size() > kMaxUriBytes)
        throw invalid_params(fmt::format(
            "params.notifications.resourceSubscriptions: each entry is a URI string of at most {} bytes", kMaxUriBytes));
      if (has_resources) entry.uris.insert(uri.get<std::string>());
    }
    if (has_resources) honored["resourceSubscriptions"] = json(entry.uris);
  }
  // Held as a request in flight: its id stays taken, a cancel finds it, and it counts against the
  // session's limit like any other request.
  auto call = std::make_shared<Call>();
  call->id = id;
  call->key = id.dump();
  call->method = "subscriptions/listen";
  call->env = env;
  const std::size_t limit = server.options().max_in_flight;
  {
    std::lock_guard lock(mu);
    if (closed) return;
    if (calls.size() >= limit)
      throw ProtocolError(kServerBusy, fmt::format("too many requests in flight (limit {}); end a subscription or "
                                                   "wait for requests to finish",
                                                   limit));
    calls.emplace(call->key, call);
    listens.emplace(call->key, std::move(entry));
  }
  json ack = {{"notifications", std::move(honored)}, {"_meta", {{kMetaSubscriptionId, id}}}};
  emit(make_notification("notifications/subscriptions/acknowledged", std::move(ack)), id);
}

json Session::State::listen_ended(const json& id) const {
  return shape(json{{"_meta", {{kMetaSubscriptionId, id}}}}, "subscriptions/listen", Era::modern);
}

void Session::State::publish(Change change, const std::string& uri) {
  const char* method = change == Change::tools       ? "notifications/tools/list_changed"
                       : change == Change::prompts   ? "notifications/prompts/list_changed"
                       : change == Change::resources ? "notifications/resources/list_changed"
                                                     : "notifications/resources/updated";
  bool to_session = false;
  std::vector<json> to_listens;
  {
    std::lock_guard lock(mu);
    if (closed) return;
    to_session = initialized && era == Era::legacy && (change != Change::updated || subscriptions.count(uri) > 0);
    for (const auto& [key, l] : listens) {
      const bool wants = change == Change::tools       ? l.tools
                         : change == Change::prompts   ? l.prompts
                         : change == Change::resources ? l.resources
                                                       : l.uris.count(uri) > 0;
      if (wants) to_listens.push_back(l.id);
    }
  }
  json params = change == Change::updated ? json{{"uri", uri}} : json::object();
  if (to_session) emit(make_notification(method, params));
  for (const json& id : to_listens) {
    json tagged = params;
    tagged["_meta"] = {{kMetaSubscriptionId, id}};
    emit(make_notification(method, std::move(tagged)), id);
  }
}

std::shared_ptr<ResourceProvider> Session::State::resources_for(std::string_view method) {
  if (auto provider = registry().provider()) return provider;
  throw ProtocolError(kMethodNotFound,
                      fmt::format("method not found: {} (this server has no resources)", method));
}

json Session::State::ping(const json&) { return json::object(); }

json Session::State::set_level(const json& params) {
  auto lv = params.find("level");
  std::optional<LogLevel> parsed;
  if (lv != params.end() && lv->is_string()) parsed = parse_log_level(lv->get<std::string>());
  if (!parsed)
    throw invalid_params(fmt::format(
        "params.level: {}; expected one of {}",
        lv == params.end() ? std::string("missing") : "got " + text::sanitize_utf8(lv->dump()),
        log_level_names()));
  std::lock_guard lock(mu);
  level = *parsed;
  return json::object();
}

json Session::State::list_tools(const json& params) {
  const ResultShape shape = server.options().result_shape;
  return page_of(params, registry().listed_tools(), server.options().page_size, "tools",
                 [shape](const auto& tool) { return tool_json(*tool, shape); });
}

Session::State::Job Session::State::call_tool(const json& params) {
  const std::string name = required_string(params, "name");
  json arguments = optional_object(params, "arguments");
  auto tool = registry().find_tool(name);
  if (!tool) {
    // The tools that exist, and the one meant when the name is a near miss.
    std::vector<std::string> names;
    for (const auto& t : registry().listed_tools()) names.push_back(t->name);
    const auto near = text::closest(name, names);
    throw invalid_params(fmt::format("unknown tool '{}'; {}the tools are: {}", text::truncate_utf8(name, 80),
                                     near ? fmt::format("did you mean '{}'? ", *near) : "", fmt::join(names, ", ")));
  }
  if (tool->accept_input_wrapper && arguments.size() == 1 && arguments.contains("input") &&
      arguments["input"].is_object() && !schema_has_property(tool->input_schema, "input")) {
    json inner = std::move(arguments["input"]);
    arguments = std::move(inner);
  }
  if (auto task = params.find("task"); task != params.end() && !task->is_null()) {
    // 2025-11-25's task augmentation (a 2026-07-28 client never asks: the server decides).
    if (!task->is_object())
      throw invalid_params(fmt::format("params.task: expected an object like {{\"ttl\": 60000}}, got {}",
                                       detail::describe_type(*task)));
    if (tool->task_support == Tool::TaskSupport::forbidden)
      throw invalid_params(fmt::format("tool '{}' does not run as a task (its execution.taskSupport is forbidden); "
                                       "call it without params.task",
                                       name));
  }
  const ResultShape shape = server.options().result_shape;
  const ToolCallObserver& observer = server.options().on_tool_call;
  const ArgumentRefusal& refuse = server.options().refuse_arguments;
  return [tool, shape, observer, refuse, arguments = std::move(arguments)](RequestContext& ctx) {
    const auto started = std::chrono::steady_clock::now();
    ToolResult r;
    if (auto problem = detail::validate_arguments(arguments, tool->input_schema)) {
      // SEP-1303: the model should see this and correct its call, so it is a tool result.
      r = refuse ? refuse(tool->name, arguments, *problem) : ToolResult::error(*problem);
    } else {
      try {
        r = tool->handler(arguments, ctx);
      } catch (const ProtocolError&) {
        throw;
      } catch (const InputRequired&) {
        throw;  // a round of a modern request, not its end: no result (and no audit) yet
      } catch (const std::exception& e) {
        r = ToolResult::error(text::sanitize_utf8(e.what()));
      } catch (...) {
        r = ToolResult::error("the tool failed with an unknown exception");
      }
    }
    if (observer) {
      observer(tool->name, arguments, r,
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started),
               ctx);
    }
    if (r.task) {
      // A task only where the request allows one: else the tool broke its contract.
      if (ctx.task_mode() == RequestContext::TaskMode::none)
        throw ProtocolError(kInternalError, fmt::format("tool '{}' answered with a task the client did not allow "
                                                        "(a server bug)",
                                                        tool->name));
      if (ctx.task_mode() == RequestContext::TaskMode::modern) {
        json created = task_json(*r.task, Era::modern, false, shape);
        created["resultType"] = "task";
        return created;
      }
      return json{{"task", task_json(*r.task, Era::legacy, false, shape)}};
    }
    return shape_tool_result(std::move(r), shape);
  };
}

json Session::State::list_prompts(const json& params) {
  return page_of(params, registry().all_prompts(), server.options().page_size, "prompts",
                 [](const auto& prompt) { return prompt_json(*prompt); });
}

Session::State::Job Session::State::get_prompt(const json& params) {
  const std::string name = required_string(params, "name");
  auto prompt = registry().find_prompt(name);
  if (!prompt) throw invalid_params(fmt::format("unknown prompt '{}'", name));
  json arguments = optional_object(params, "arguments");
  for (auto it = arguments.begin(); it != arguments.end(); ++it)
    if (!it->is_string())
      throw invalid_params(fmt::format("params.arguments.{}: expected a string, got {}", it.key(),
                                       detail::describe_type(*it)));
  for (const auto& arg : prompt->arguments)
    if (arg.required && !arguments.contains(arg.name))
      throw invalid_params(
          fmt::format("params.arguments: missing required argument '{}' of "
                      "prompt '{}'",
                      arg.name, name));
  return [prompt, arguments = std::move(arguments)](RequestContext&) {
    return prompt->handler(arguments);
  };
}

Session::State::Job Session::State::complete(const json& params) {
  CompletionHandler handler = registry().completion_handler();
  if (!handler)
    throw ProtocolError(kMethodNotFound, "method not found: completion/complete (this server offers no completions)");
  auto ref = params.find("ref");
  if (ref == params.end() || !ref->is_object())
    throw invalid_params("params.ref: expected an object like {\"type\":\"ref/prompt\",\"name\":…}");
  auto argument = params.find("argument");
  if (argument == params.end() || !argument->is_object() || !argument->contains("name"))
    throw invalid_params("params.argument: expected an object {\"name\":…, \"value\":…}");
  json context = params.contains("context") ? params["context"] : json::object();
  return [handler, r = *ref, a = *argument, context](RequestContext&) {
    json result = handler(r, a, context);
    json completion = {{"values", json::array()}};
    if (result.is_object()) completion = std::move(result);
    if (completion.contains("values") && completion["values"].size() > 100) {
      // The spec allows at most 100 values per response.
      const std::size_t total = completion["values"].size();
      completion["values"].erase(completion["values"].begin() + 100, completion["values"].end());
      completion["hasMore"] = true;
      if (!completion.contains("total")) completion["total"] = total;
    }
    return json{{"completion", std::move(completion)}};
  };
}

// The resource lists come from the provider, which may read a store: on the Executor, never on
// the I/O thread (the cursor is checked there).
std::vector<Resource> ResourceProvider::list_range(std::size_t start, std::size_t count, std::size_t& total) {
  std::vector<Resource> all = list();
  total = all.size();
  start = std::min(start, all.size());  // the list may have shrunk since
  const std::size_t end = (count == 0 || all.size() - start <= count) ? all.size() : start + count;
  return {std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(start)),
          std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(end))};
}

Session::State::Job Session::State::list_resources(const json& params) {
  auto provider = resources_for("resources/list");
  return [provider, start = cursor_offset(params), page_size = server.options().page_size](RequestContext&) {
    std::size_t total = 0;
    std::vector<Resource> items = provider->list_range(start, page_size, total);
    json page = json::array();
    for (const auto& item : items) page.push_back(resource_json(item));
    json result = {{"resources", std::move(page)}};
    if (start + items.size() < total && !items.empty()) result["nextCursor"] = encode_cursor(start + items.size());
    return result;
  };
}

Session::State::Job Session::State::list_resource_templates(const json& params) {
  auto provider = resources_for("resources/templates/list");
  return [provider, start = cursor_offset(params), page_size = server.options().page_size](RequestContext&) {
    return page_at(start, provider->templates(), page_size, "resourceTemplates", template_json);
  };
}

json Session::State::subscribe(const json& params) {
  resources_for("resources/subscribe");
  std::string uri = required_string(params, "uri");
  std::lock_guard lock(mu);
  subscriptions.insert(std::move(uri));
  return json::object();
}

json Session::State::unsubscribe(const json& params) {
  resources_for("resources/unsubscribe");
  const std::string uri = required_string(params, "uri");
  std::lock_guard lock(mu);
  subscriptions.erase(uri);
  return json::object();
}

Session::State::Job Session::State::read_resource(const json& params) {
  auto provider = resources_for("resources/read");
  std::string uri = required_string(params, "uri");
  return [provider, uri = std::move(uri)](RequestContext&) {
    auto contents = provider->read(uri);
    if (!contents)
      throw ProtocolError(kResourceNotFound, fmt::format("resource not found: {}", uri),
                          json{{"uri", uri}});
    json list = json::array();
    for (const auto& c : *contents) {
      json item = {{"uri", c.uri.empty() ? uri : c.uri}};
      if (!c.mime_type.empty()) item["mimeType"] = c.mime_type;
      if (c.text)
        item["text"] = *c.text;
      else if (c.blob)
        item["blob"] = *c.blob;
      else
        item["text"] = "";
      if (c.meta) item["_meta"] = *c.meta;
      list.push_back(std::move(item));
    }
    return json{{"contents", std::move(list)}};
  };
}

std::shared_ptr<TaskStore> Session::State::tasks_for(std::string_view method) {
  std::shared_ptr<TaskStore> store;
  {
    std::lock_guard lock(registry().mu);
    store = registry().tasks;
  }
  if (!store)
    throw ProtocolError(kMethodNotFound, fmt::format("method not found: {} (this server has no tasks)", method));
  return store;
}

namespace {

// The Tasks extension's methods need it declared in the request's own capabilities (2026-07-28).
void require_tasks_extension(RequestContext& ctx, std::string_view method) {
  if (ctx.era() != Era::modern) return;
  const json caps = ctx.client_capabilities();
  if (auto ext = caps.find("extensions"); ext != caps.end() && ext->is_object() && ext->contains(kTasksExtension)) return;
  throw ProtocolError(kMissingRequiredClientCapability,
                      fmt::format("Missing required client capability: {} needs the {} extension in "
                                  "_meta[\"io.modelcontextprotocol/clientCapabilities\"].extensions",
                                  method, kTasksExtension),
                      json{{"requiredCapabilities", {{"extensions", {{kTasksExtension, json::object()}}}}}});
}

}  // namespace

Session::State::Job Session::State::get_task(const json& params) {
  auto store = tasks_for("tasks/get");
  std::string id = required_string(params, "taskId");
  const ResultShape shape = server.options().result_shape;
  return [store, id = std::move(id), shape](RequestContext& ctx) {
    require_tasks_extension(ctx, "tasks/get");
    return task_json(store->get(id, ctx), ctx.era(), true, shape);
  };
}

Session::State::Job Session::State::task_result(const json& params) {
  auto store = tasks_for("tasks/result");
  std::string id = required_string(params, "taskId");
  const ResultShape shape = server.options().result_shape;
  return [store, id = std::move(id), shape](RequestContext& ctx) -> json {
    // Blocks until the task ends (2025-11-25), polling at the task's own interval.
    for (;;) {
      Task task = store->get(id, ctx);
      if (terminal(task.status)) {
        if (task.status == Task::Status::failed && task.error) {
          const json& e = *task.error;
          throw ProtocolError(e.value("code", static_cast<int>(kInternalError)), e.value("message", std::string("the task failed")),
                              e.contains("data") ? e["data"] : json(nullptr));
        }
        if (task.status == Task::Status::cancelled && !task.result)
          throw ProtocolError(kInvalidRequest, fmt::format("task {} was cancelled: it has no result", id));
        json result = shape_tool_result(task.result ? *task.result : ToolResult::error(task.status_message), shape);
        result["_meta"] = {{kRelatedTask, {{"taskId", id}}}};
        return result;
      }
      const auto wait = std::chrono::milliseconds(std::clamp<std::int64_t>(task.poll_interval_ms.value_or(1000), 100, 5000));
      if (ctx.wait_cancelled_for(wait))
        throw ProtocolError(kInternalError, "tasks/result was cancelled before the task ended");
    }
  };
}

Session::State::Job Session::State::list_tasks(const json& params) {
  auto store = tasks_for("tasks/list");
  const std::size_t start = cursor_offset(params);
  const std::size_t page_size = server.options().page_size;
  const ResultShape shape = server.options().result_shape;
  return [store, start, page_size, shape](RequestContext& ctx) {
    std::size_t total = 0;
    std::vector<Task> items = store->list(start, page_size, total, ctx);
    json page = json::array();
    for (const auto& t : items) page.push_back(task_json(t, Era::legacy, false, shape));
    json result = {{"tasks", std::move(page)}};
    if (start + items.size() < total && !items.empty()) result["nextCursor"] = encode_cursor(start + items.size());
    return result;
  };
}

Session::State::Job Session::State::cancel_task(const json& params) {
  auto store = tasks_for("tasks/cancel");
  std::string id = required_string(params, "taskId");
  const ResultShape shape = server.options().result_shape;
  return [store, id = std::move(id), shape](RequestContext& ctx) {
    require_tasks_extension(ctx, "tasks/cancel");
    Task task = store->cancel(id, ctx);
    // 2026-07-28 acknowledges; 2025-11-25 answers with the task.
    return ctx.era() == Era::modern ? json::object() : task_json(task, Era::legacy, false, shape);
  };
}

Session::State::Job Session::State::update_task(const json& params) {
  auto store = tasks_for("tasks/update");
  std::string id = required_string(params, "taskId");
  auto responses = params.find("inputResponses");
  if (responses == params.end() || !responses->is_object())
    throw invalid_params("params.inputResponses: expected an object keyed by the task's inputRequests");
  return [store, id = std::move(id), responses = *responses](RequestContext& ctx) {
    require_tasks_extension(ctx, "tasks/update");
    store->update(id, responses, ctx);
    return json::object();
  };
}

void Session::State::start(const json& id, const std::string& method, const json& params, const Envelope& env,
                           Job job) {
  auto call = std::make_shared<Call>();
  call->id = id;
  call->key = id.dump();
  call->method = method;
  call->env = env;
  if (method == "tools/call") {
    if (env.era == Era::modern) {
      const json& caps = env.client_capabilities;
      if (auto ext = caps.find("extensions"); ext != caps.end() && ext->is_object() && ext->contains(kTasksExtension))
        call->task_mode = RequestContext::TaskMode::modern;
    } else if (auto task = params.find("task"); task != params.end() && task->is_object()) {
      // call_tool checked that the tool takes tasks.
      call->task_mode = RequestContext::TaskMode::legacy;
      if (auto ttl = task->find("ttl"); ttl != task->end() && ttl->is_number_integer() && ttl->get<std::int64_t>() >= 0)
        call->task_ttl = ttl->get<std::int64_t>();
    }
  }
  if (env.era == Era::modern) {
    // A retry after input_required carries the client's answers and the state it was given back.
    if (auto r = params.find("inputResponses"); r != params.end() && !r->is_null()) {
      if (!r->is_object())
        throw invalid_params(fmt::format("params.inputResponses: expected an object keyed by the input requests, got {}",
                                         detail::describe_type(*r)));
      call->input_responses = *r;
    }
    if (auto st = params.find("requestState"); st != params.end() && !st->is_null()) {
      if (!st->is_string())
        throw invalid_params(fmt::format("params.requestState: expected the string this server returned, got {}",
                                         detail::describe_type(*st)));
      call->request_state = st->get<std::string>();
    }
  }
  if (auto meta = params.find("_meta"); meta != params.end() && meta->is_object())
    if (auto token = meta->find("progressToken");
        token != meta->end() && (token->is_string() || token->is_number_integer()))
      call->progress_token = *token;

  const std::size_t limit = server.options().max_in_flight;
  {
    std::lock_guard lock(mu);
    if (closed) return;
    if (calls.size() >= limit)
      throw ProtocolError(kServerBusy,
                          fmt::format("too many requests in flight (limit {}); wait for some to "
                                      "finish",
                                      limit));
    calls.emplace(call->key, call);
  }
  if (!executor) {
    run(call, job);
    return;
  }
  try {
    executor([self = shared_from_this(), call, job = std::move(job)] { self->run(call, job); });
  } catch (...) {
    bool was_queued = false;
    {
      std::lock_guard lock(mu);
      was_queued = calls.count(call->key) > 0 && !call->cancelled.load();
      erase_call(call);
    }
    if (was_queued) throw ProtocolError(kInternalError, "could not schedule the request");
  }
}

void Session::State::run(const std::shared_ptr<Call>& call, const Job& job) {
  {
    std::unique_lock lock(mu);
    if (closed || call->cancelled.load()) {  // cancelled while queued: never runs
      erase_call(call);
      lock.unlock();
      went_unanswered(*call);
      return;
    }
    ++running;
  }
  json message;
  {
    StackEntry entry(tl_handlers, this);
    RunningRequest ctx(shared_from_this(), call);
    const Era era = call->env.era;
    try {
      message = make_response(call->id, shape(job(ctx), call->method, era));
    } catch (const InputRequired& input) {
      if (era == Era::modern) {
        json result = {{"resultType", "input_required"}};
        if (!input.requests.empty()) result["inputRequests"] = input.requests;
        if (!input.state.empty()) result["requestState"] = input.state;
        message = make_response(call->id, shape(std::move(result), call->method, era));
      } else {
        message = make_error(call->id, kInternalError,
                             "this request needs the client's input, which a 2025-era session asks for with "
                             "requests of its own; the handler did not (a server bug)");
      }
    } catch (const ProtocolError& e) {
      // 2026-07-28 retired -32002 (resource not found): an unknown URI is invalid params there.
      const int code = era == Era::modern && e.code() == kResourceNotFound ? kInvalidParams : e.code();
      message = make_error(call->id, code, e.what(), e.data());
    } catch (const std::exception& e) {
      message = make_error(call->id, kInternalError, e.what());
    } catch (...) {
      message = make_error(call->id, kInternalError, "internal error");
    }
  }
  bool drop = false;
  {
    std::lock_guard lock(mu);
    --running;
    erase_call(call);
    drop = closed || call->cancelled.load();  // cancelled: the client expects no response
  }
  if (drop) cv.notify_all();  // close() may be waiting for this handler
  {
    std::lock_guard lock(call->send_mu);
    call->done = true;
    if (!drop) emit(message, call->id);
  }
  if (drop) went_unanswered(*call);
}

json Session::State::request_client(const std::shared_ptr<Call>& call, const std::string& method,
                                    json params, std::chrono::milliseconds timeout) {
  static const std::map<std::string, std::string, std::less<>> needs = {
      {"sampling/createMessage", "sampling"},
      {"elicitation/create", "elicitation"},
      {"roots/list", "roots"}};
  auto pending = std::make_shared<Outgoing>();
  std::string key;
  json id;
  {
    std::lock_guard lock(mu);
    if (auto need = needs.find(method);
        need != needs.end() && !client_capabilities.contains(need->second))
      throw ProtocolError(kInvalidRequest,
                          fmt::format("the client did not declare the '{}' capability, so the "
                                      "server cannot send it {}",
                                      need->second, method));
    if (closed) throw ProtocolError(kInternalError, "the session is closed");
    id = fmt::format("ns-hpc-{}", ++next_outgoing);
    key = id.dump();
    outgoing.emplace(key, pending);
  }
  json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
  if (!params.is_null()) message["params"] = std::move(params);
  emit(message, call->id);
  std::unique_lock lock(mu);
  const bool answered = cv.wait_for(lock, timeout, [&] {
    return pending->answered || closed || call->cancelled.load();
  }) && pending->answered;
  outgoing.erase(key);
  if (!answered) {
    if (closed) throw ProtocolError(kInternalError, fmt::format("the session closed before the client answered {}", method));
    if (call->cancelled.load()) throw ProtocolError(kInternalError, fmt::format("the request was cancelled while waiting for the client to answer {}", method));
    throw ProtocolError(kInternalError, fmt::format("the client did not answer {} within {} ms", method, timeout.count()));
  }
  if (pending->error) {
    const json& e = *pending->error;
    const int code = e.is_object() && e.contains("code") && e["code"].is_number_integer() ? e["code"].get<int>() : kInternalError;
    const std::string text = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : "error";
    throw ProtocolError(code, fmt::format("the client answered {} with an error: {}", method, text),
                        e.is_object() && e.contains("data") ? e["data"] : json(nullptr));
  }
  return std::move(pending->result);
}

void Session::State::client_response(const json& message) {
  auto id = message.find("id");
  if (id == message.end() || !is_valid_id(*id)) return;
  std::lock_guard lock(mu);
  auto it = outgoing.find(id->dump());
  if (it == outgoing.end()) return;  // unknown or given up: nothing waits for it
  it->second->answered = true;
  if (auto e = message.find("error"); e != message.end())
    it->second->error = *e;
  else
    it->second->result = message["result"];
  cv.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Session

Session::Session(Server& server, std::string id, Send send, Executor executor)
    : Session(server, std::move(id),
              RoutedSend([send = std::move(send)](const json& message, const json&) { send(message); }),
              std::move(executor)) {}

Session::Session(Server& server, std::string id, RoutedSend send, Executor executor, Unanswered unanswered)
    : server_(server),
      id_(std::move(id)),
      state_(std::make_shared<State>(server, id_, std::move(send), std::move(executor), std::move(unanswered))) {
  server_.attach(this);
}

std::string Session::protocol_version() const {
  std::lock_guard lock(state_->mu);
  return state_->protocol_version;
}

Session::~Session() {
  server_.detach(this);
  state_->close();
  {
    // Only a 2025-era session holds anything by its id (a modern request has no session).
    std::lock_guard lock(state_->mu);
    if (!state_->initialized) return;
  }
  Server::SessionClosed closed;
  {
    std::lock_guard lock(server_.registry_->mu);
    closed = server_.registry_->session_closed;
  }
  if (!closed) return;
  try {
    closed(id_);
  } catch (const std::exception& e) {
    log::warn("session {}: after it closed: {}", id_, e.what());
  }
}

void Session::receive(std::string_view text) {
  try {
    {
      std::lock_guard lock(state_->mu);
      if (state_->closed) return;
    }
    json message;
    try {
      message = parse_message(text, server_.options().limits);
    } catch (const ProtocolError& e) {
      state_->fail(nullptr, e.code(), e.what(), e.data());
      return;
    }
    state_->handle(std::move(message));
  } catch (...) {
    // Never throws: whatever went wrong has been answered or cannot be.
  }
}

void Session::receive(json message) {
  try {
    {
      std::lock_guard lock(state_->mu);
      if (state_->closed) return;
    }
    state_->handle(std::move(message));
  } catch (...) {
  }
}

void Session::close() { state_->close(); }

std::size_t Session::in_flight() const { return state_->in_flight(); }

std::size_t Session::request_ids_held() const { return state_->request_ids_held(); }

void Session::deliver(const json& message) { state_->emit(message); }

}  // namespace nshpc::mcp
