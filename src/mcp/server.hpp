// The MCP server side: a registry of tools, resources and prompts shared by every connection
// (Server), and one protocol session per connection (Session). Transports feed a Session the
// messages they read and write out what it sends.
//
// Both eras go through a Session (protocol.hpp: Era). A legacy connection opens with initialize
// and keeps what it settled (version, capabilities, log level, resource subscriptions); a modern
// request carries all of that in its _meta and is served by itself (an HTTP transport gives each
// one a Session of its own). A connection's era is fixed by initialize or by its first other
// modern request, never by server/discover; mixing eras afterwards is refused. Change
// notifications reach a legacy session unsolicited and a modern client only on its
// subscriptions/listen streams (tagged with the stream's subscriptionId).
//
// Threading: Session::receive is called from one I/O thread. Requests that call a tool, prompt,
// completion or resource handler (tools/call, prompts/get, completion/complete, resources/read)
// run through the Executor the transport provides, so a slow tool call never delays ping or
// another call; the others (lifecycle, settings, lists) are answered on the I/O thread (the
// method table in server.cpp says which is which). `Send` may be called from any
// thread and must be thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mcp/protocol.hpp"

namespace nshpc::mcp {

// What a running request can see and do.
class RequestContext {
 public:
  virtual ~RequestContext() = default;
  // True once notifications/cancelled named this request (or the session closed).
  virtual bool cancelled() const = 0;
  // Sleeps up to `timeout`, returning early (true) if the request is cancelled meanwhile.
  virtual bool wait_cancelled_for(std::chrono::milliseconds timeout) const = 0;
  // notifications/progress, when the request carried _meta.progressToken (else a no-op).
  // `progress` must increase from call to call; smaller values are dropped.
  virtual void progress(double progress, std::optional<double> total = std::nullopt,
                        const std::string& message = {}) = 0;
  // notifications/message, when `level` is at or above the session's logging level.
  virtual void log(LogLevel level, const json& data, const std::string& logger = {}) = 0;
  // The era of this request (a legacy session's, or the modern request's own).
  virtual Era era() const = 0;
  // The version this request is served in: the session's (legacy) or the request's own (modern).
  virtual const std::string& protocol_version() const = 0;
  // "name/version" of the client (legacy: from initialize; modern: the request's clientInfo),
  // e.g. "claude-code/1.2", or "unknown".
  virtual std::string client_name() const = 0;
  // The legacy session's id (stdio: "stdio"; HTTP: its Mcp-Session-Id). Empty for a modern
  // request: nothing may be tied to a session there (state lives in handles such as instance ids).
  virtual const std::string& session_id() const = 0;
  // The capabilities the client declared (legacy: in initialize; modern: in this request's _meta),
  // e.g. {"sampling":{}, "elicitation":{}}.
  virtual json client_capabilities() const = 0;
  // W3C trace context from the request's _meta (validated; empty when none was sent).
  virtual const std::string& traceparent() const = 0;
  virtual const std::string& tracestate() const = 0;
  // Modern era: what a retried request carries after an input_required result (see
  // InputRequired): params.inputResponses ({} when none) and params.requestState ("" when none).
  // The state came back from the client: whoever minted it verifies it.
  virtual const json& input_responses() const = 0;
  virtual const std::string& request_state() const = 0;
  // Legacy era: sends a request to the client (sampling/createMessage, elicitation/create,
  // roots/list) as part of this request and waits for its answer. Returns the client's result;
  // throws ProtocolError with the client's error, or when `timeout` passes, this request is
  // cancelled or the session closes (the message says which). Modern era: throws
  // ProtocolError(kInvalidRequest) (2026-07-28 has no server-to-client requests: throw
  // InputRequired instead).
  virtual json request_client(const std::string& method, json params,
                              std::chrono::milliseconds timeout) = 0;
  // Whether this tools/call may be answered with a task (ToolResult::task), and in which wire:
  // modern, when the request's clientCapabilities list the Tasks extension; legacy, when the
  // request carried params.task (its ttl in requested_task_ttl()) and the tool allows tasks.
  enum class TaskMode { none, modern, legacy };
  virtual TaskMode task_mode() const = 0;
  virtual std::optional<std::int64_t> requested_task_ttl() const = 0;
};

// Thrown by a tool, prompt or resource handler of a modern request that needs the client's input
// (MRTR): the request is answered {resultType: "input_required", inputRequests, requestState}
// and the client retries it with params.inputResponses (keyed as `requests`) and the same
// requestState. `requests`: {key: {"method": "elicitation/create"|"sampling/createMessage"|
// "roots/list", "params": {...}}}. In the legacy era it is an error (use request_client there).
struct InputRequired {
  json requests = json::object();
  std::string state;
};

struct Task;

struct ToolResult {
  json content = json::array();    // MCP content blocks
  std::optional<json> structured;  // structuredContent (matches the tool's outputSchema)
  bool is_error = false;
  // Set instead of the above when the call became a task (only where RequestContext::task_mode()
  // allows it): answered as a CreateTaskResult in the request's task wire.
  std::shared_ptr<const Task> task;

  static ToolResult text(std::string text, std::optional<json> structured = std::nullopt);
  static ToolResult error(std::string text);
  static ToolResult of_task(Task task);
};

// Long work a tools/call turned into, followed by its id (ns-hpc: a job). The same record serves
// both task wires: the Tasks extension of 2026-07-28 (io.modelcontextprotocol/tasks: tasks/get,
// tasks/update, tasks/cancel; resultType "task") and 2025-11-25's experimental tasks (params.task,
// tasks/get, tasks/result, tasks/list, tasks/cancel).
struct Task {
  enum class Status { working, input_required, completed, failed, cancelled };
  std::string id;
  Status status = Status::working;
  std::string status_message;
  std::string created_at;       // ISO 8601 UTC
  std::string last_updated_at;  // ISO 8601 UTC
  std::optional<std::int64_t> ttl_ms;  // from creation; nullopt: unlimited
  std::optional<std::int64_t> poll_interval_ms;
  // completed: the tool's result (shaped as the tool's results are); failed: the JSON-RPC error
  // {code, message, data?}; input_required: the outstanding requests, keyed (MRTR's shape).
  std::optional<ToolResult> result;
  std::optional<json> error;
  json input_requests = json::object();
};
std::string_view to_string(Task::Status status);

// Where tasks live (the tools layer implements it over its job store). Methods run on the
// Executor; each throws ProtocolError(kInvalidParams, "…") for an id it does not know (the message
// says why: never existed, expired, archived with its instance, …).
class TaskStore {
 public:
  virtual ~TaskStore() = default;
  virtual Task get(const std::string& id, RequestContext& ctx) = 0;
  // Asks the work to stop; returns the task as it is after asking (cancelled, or already ended).
  virtual Task cancel(const std::string& id, RequestContext& ctx) = 0;
  // tasks/update: the client's answers to the task's input_requests (keys not outstanding are
  // ignored).
  virtual void update(const std::string& id, const json& input_responses, RequestContext& ctx) = 0;
  // tasks/list (2025-11-25 only): one page from `start`, at most `count` (0: all), newest first;
  // `total` is how many there are.
  virtual std::vector<Task> list(std::size_t start, std::size_t count, std::size_t& total, RequestContext& ctx) = 0;
};

// The Tasks extension's id (capabilities.extensions in server/discover and in a modern request's
// clientCapabilities).
inline constexpr std::string_view kTasksExtension = "io.modelcontextprotocol/tasks";

struct Tool {
  std::string name;
  std::string title;
  std::string description;
  json input_schema = {{"type", "object"}};
  std::optional<json> output_schema;
  std::optional<json> annotations;  // readOnlyHint, destructiveHint, idempotentHint, openWorldHint
  // Accept ns-hpc's legacy form {"input": {...}} as well as flat arguments.
  bool accept_input_wrapper = false;
  // false: called by its name but not in tools/list (an old name kept for clients that use it,
  // costing the model nothing to read).
  bool listed = true;
  // Listed only while this says so (a tool that works only in some state: a desktop's screen
  // tools while a desktop is on); called outside the server's locks. Whoever changes its answer
  // calls Server::notify_tool_list_changed(). Unset: always.
  std::function<bool()> shown;
  // Arguments are checked against input_schema first (type object, required, property types,
  // enums, no unknown properties when additionalProperties is false); a failure becomes an
  // isError result naming the field. The handler may throw ProtocolError (JSON-RPC error) or
  // any std::exception (isError result with its message).
  std::function<ToolResult(const json& arguments, RequestContext& ctx)> handler;
  std::optional<json> meta;  // the tool's _meta (an MCP App's {"ui": {"resourceUri": ...}})
  // Whether a 2025-11-25 client may ask for the call as a task (params.task): listed as
  // execution.taskSupport. A 2026-07-28 client is given a task whenever the tool decides to.
  enum class TaskSupport { forbidden, optional, required };
  TaskSupport task_support = TaskSupport::forbidden;
};

struct Resource {
  std::string uri;
  std::string name;
  std::string title;
  std::string description;
  std::string mime_type;
  std::optional<std::int64_t> size;
  std::optional<json> meta;  // _meta in resources/list (an MCP App's {"ui": {"csp": ...}})
};

struct ResourceTemplate {
  std::string uri_template;  // RFC 6570 level 1, e.g. resource://ns-hpc/instances/{id}
  std::string name;
  std::string title;
  std::string description;
  std::string mime_type;
};

struct ResourceContents {
  std::string uri;
  std::string mime_type;
  std::optional<std::string> text;
  std::optional<std::string> blob;  // base64
  std::optional<json> meta;          // _meta of the content item
};

class ResourceProvider {
 public:
  virtual ~ResourceProvider() = default;
  virtual std::vector<Resource> list() = 0;
  // One page of resources/list: at most `count` (0: all) from position `start` on, with how many
  // there are in all in `total`. The default cuts list(); a provider with many resources answers
  // from an index instead.
  virtual std::vector<Resource> list_range(std::size_t start, std::size_t count, std::size_t& total);
  virtual std::vector<ResourceTemplate> templates() = 0;
  // nullopt: no such resource (-32002 with data.uri).
  virtual std::optional<std::vector<ResourceContents>> read(const std::string& uri) = 0;
};

struct PromptArgument {
  std::string name;
  std::string description;
  bool required = false;
};

struct Prompt {
  std::string name;
  std::string title;
  std::string description;
  std::vector<PromptArgument> arguments;
  // Returns the prompts/get result ({description?, messages: [...]}). Missing required
  // arguments are refused before the call (-32602 naming them).
  std::function<json(const json& arguments)> handler;
};

// completion/complete: given the reference ({"type":"ref/prompt","name":…} or
// {"type":"ref/resource","uri":…}), the argument ({"name","value"}) and the optional context
// ({"arguments":{…}}), returns {"values":[…], "total"?, "hasMore"?}. May throw ProtocolError.
using CompletionHandler = std::function<json(const json& ref, const json& argument, const json& context)>;

enum class ResultShape { text, structured, both };

struct ServerInfo {
  std::string name = "ns-hpc";
  std::string title;
  std::string version;
  std::string instructions;
};

class RequestContext;

// Sees every finished tools/call (including refused arguments and tool failures) before the
// result is shaped and sent; may add content (e.g. a warning). Used for auditing.
using ToolCallObserver = std::function<void(const std::string& tool, const json& arguments, ToolResult& result,
                                            std::chrono::milliseconds duration, RequestContext& ctx)>;

// The result of a call whose arguments the input schema refuses (`problem` names the argument and
// what is expected, e.g. "missing required argument 'path'"), as the tool words its other errors.
using ArgumentRefusal = std::function<ToolResult(const std::string& tool, const json& arguments,
                                                 const std::string& problem)>;

struct ServerOptions {
  std::size_t page_size = 100;          // list results per page (cursor pagination)
  ResultShape result_shape = ResultShape::both;
  std::size_t max_in_flight = 128;      // concurrent requests per session
  // A request id is refused while its request is in flight, and while it is among the last this
  // many ids the session received; older ids are forgotten (a long session holds no more).
  std::size_t remembered_request_ids = 1024;
  ParseLimits limits;
  ToolCallObserver on_tool_call;        // optional
  ArgumentRefusal refuse_arguments;     // optional; default: an isError result with `problem` as its text
  // capabilities.extensions in initialize and server/discover, by extension id (e.g.
  // "io.modelcontextprotocol/ui"); empty: left out.
  json extensions = json::object();
  // Modern era: how long a client may cache a list or read result (ttlMs; cacheScope is always
  // "private": what a server behind a token lists is not for shared caches).
  struct CacheTtl {
    std::chrono::milliseconds tools{60'000};      // changes with a desktop (subscriptions/listen tells sooner)
    std::chrono::milliseconds prompts{3'600'000};
    std::chrono::milliseconds resources{5'000};   // instances come and go
    std::chrono::milliseconds templates{3'600'000};
    std::chrono::milliseconds read{0};            // instance state is live
    std::chrono::milliseconds discover{3'600'000};
  } cache;
};

class Session;

class Server {
 public:
  Server(ServerInfo info, ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Registration, before sessions start (adding later sends list_changed to every session).
  void add_tool(Tool tool);
  void add_prompt(Prompt prompt);
  void set_resources(std::shared_ptr<ResourceProvider> provider);
  // Enables the completions capability.
  void set_completion(CompletionHandler handler);
  // Enables tasks: the tasks capability (2025-11-25) and the Tasks extension (server/discover,
  // 2026-07-28), and the tasks/* methods.
  void set_tasks(std::shared_ptr<TaskStore> store);
  // Called with a 2025-era session's id (one that initialized) once it has closed and none of its
  // requests runs any more (the client or the transport ended it, or it idled out), from the
  // thread that ended it.
  using SessionClosed = std::function<void(const std::string& session_id)>;
  void set_session_closed(SessionClosed handler);

  // Broadcasts to every open session.
  void notify_tool_list_changed();
  void notify_resource_list_changed();
  void notify_resource_updated(const std::string& uri);  // only sessions subscribed to `uri`
  // Every URI some open session subscribes to (for whoever watches resources for changes).
  std::set<std::string> subscribed_uris() const;

  const ServerInfo& info() const { return info_; }
  const ServerOptions& options() const { return options_; }

 private:
  friend class Session;
  struct Registry;
  void attach(Session* session);
  void detach(Session* session);

  ServerInfo info_;
  ServerOptions options_;
  std::unique_ptr<Registry> registry_;
};

class Session {
 public:
  using Send = std::function<void(const json& message)>;
  // Like Send, with the id of the client request the message belongs to: its response, its
  // progress and log notifications, and requests the server sends to the client while serving
  // it. Null for messages that belong to no request (list_changed, resources/updated, and
  // errors about input whose id could not be read). HTTP transports route by it.
  using RoutedSend = std::function<void(const json& message, const json& related_request)>;
  using Executor = std::function<void(std::function<void()> work)>;
  // Called with the id of a client request that ends without a response because it was
  // cancelled (from the thread that ran it, after its last progress or log message). A transport
  // that keeps something per request (HTTP: its stream) lets it go.
  using Unanswered = std::function<void(const json& request_id)>;

  // `id` names the session in audit records and logs (stdio: "stdio"; HTTP: the session id).
  Session(Server& server, std::string id, Send send, Executor executor);
  Session(Server& server, std::string id, RoutedSend send, Executor executor, Unanswered unanswered = nullptr);
  ~Session();  // cancels what is still running and waits for it
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // One framed message as read from the transport. Never throws: malformed input is answered
  // with a JSON-RPC error (-32700 with id null when the id cannot be known).
  void receive(std::string_view text);
  void receive(json message);
  // Without these, a std::string or a string literal would be ambiguous between the two above
  // (json converts from strings too); both mean text to parse.
  void receive(const std::string& text) { receive(std::string_view(text)); }
  void receive(const char* text) { receive(std::string_view(text)); }

  // Cancels every running request and stops sending; returns once none is running.
  void close();
  std::size_t in_flight() const;
  // Request ids held to refuse duplicates: those in flight plus the recent ones (at most
  // in_flight() + ServerOptions::remembered_request_ids, however long the session).
  std::size_t request_ids_held() const;
  const std::string& id() const { return id_; }
  // The protocol version initialize settled on ("" before initialize).
  std::string protocol_version() const;

 private:
  friend class Server;
  struct State;
  void deliver(const json& message);  // used by Server broadcasts

  Server& server_;
  std::string id_;
  std::shared_ptr<State> state_;
};

}  // namespace nshpc::mcp
