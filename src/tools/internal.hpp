// Shared pieces of the tool adapters.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "files/image.hpp"
#include "files/resolver.hpp"
#include "jobs/jobs.hpp"
#include "mcp/server.hpp"
#include "sandbox/capture.hpp"
#include "tools/tools.hpp"

namespace nshpc::tools {

struct ToolContext {
  Services services;
};

// ---------------------------------------------------------------------------------------------
// Declaring a tool: one spec, one call. Every tool accepts the legacy {"input": {...}} wrapper.

// MCP's behaviour hints. readOnlyHint and openWorldHint are always published; destructiveHint
// and idempotentHint only when set (a read-only tool leaves them out).
struct Hints {
  bool read_only = false;
  std::optional<bool> destructive;
  std::optional<bool> idempotent;
  bool open_world = false;
};
mcp::json annotations(const Hints& hints);

using ToolHandler = std::function<mcp::ToolResult(const mcp::json& args, mcp::RequestContext& rc)>;

// No title: a tool's name says it to people, and tools/list stays within its budget.
struct ToolSpec {
  std::string name;
  std::string description;
  mcp::json input;   // input_object(...) or instance_input(...)
  mcp::json output;  // output_object(...)
  Hints hints;
  std::function<bool()> shown;  // listed only while it says so (mcp::Tool::shown); unset: always
  ToolHandler handler;
  bool listed = true;  // false: an alias called by name, not in tools/list (mcp::Tool::listed)
  std::optional<mcp::json> meta;  // _meta in tools/list (an MCP App's, tools/app.hpp)
  // Whether a 2025-11-25 client may ask for the call as a task (mcp::Tool::task_support; the job
  // tools, tools/tasks.hpp).
  mcp::Tool::TaskSupport task_support = mcp::Tool::TaskSupport::forbidden;
};
void add_tool(mcp::Server& server, ToolSpec spec);

// Reading a file opened beneath a root (tools/file_tools.cpp), for both entry points' file tools.
// Up to `max` bytes of `fd` from `at`.
std::string pread_some(int fd, std::size_t max, off_t at = 0);
// The whole file, at most `max` bytes, else UsageError "File is N bytes; <what> limit is M bytes: <shown>".
std::string read_whole(const files::Opened& o, std::uint64_t max, const std::string& shown, const char* what);
// What the image decoder may use for an instance of `config` (within [namespace] limits memory).
files::ImageLimits image_limits(const config::Config& config);
// What an agent does about something not found, naming tools: "restore_instance brings it back
// (archive_name 'x__...')", "did you mean 'x'? list_instances lists the active ones".
std::string not_found_advice(const NotFound& e);
// What an agent does about a NeedsAction: the tool that does it ("update_instance with network
// 'filtered' ..."), or what to ask of the server's operator. Never a command to run itself.
std::string needs_action_advice(const NeedsAction& e);

// ---------------------------------------------------------------------------------------------
// Schema fragments.

mcp::json of_type(const char* type);  // {"type": type}
// The arguments object: these properties, no others; "required" left out when empty.
mcp::json input_object(mcp::json properties, std::vector<std::string> required = {});
// The instance_id argument, described the same in every tool ("Default: 'x'" with a fallback).
mcp::json instance_id_arg(const std::string& fallback = {});
// The arguments of a tool working in one instance: instance_id (described the same in every
// tool, with the [mcp] default_instance when there is one and then not required) and `properties`.
mcp::json instance_input(const config::Config& cfg, mcp::json properties, std::vector<std::string> required = {});
// A result object (structuredContent or an item of it): these properties, these required.
mcp::json output_object(mcp::json properties, std::vector<std::string> required);
// A tool's outputSchema as `ns-hpc run` publishes it: an object with the fields every result of
// the tool has. The result's text and the README describe the fields; tools/list stays small.
mcp::json result_object(std::vector<std::string> required);

// ---------------------------------------------------------------------------------------------
// Arguments. The input schema has been checked before a handler runs, so these only read.

// command, args, stdin, working_directory, env: described once, for terminal_execute and submit_job.
mcp::json command_properties(const config::Config& cfg);
// env {"NAME": "value"} as pairs; UsageError naming a bad name or value.
std::vector<std::pair<std::string, std::string>> env_arg(const mcp::json& args);

// A string argument; "" when absent (or not a string).
std::string string_arg(const mcp::json& args, const char* name);

// Who acts, for the audit log: "mcp:<client name/version>@<session>", or "mcp:<client name/version>"
// for a request without a session (2026-07-28).
std::string actor(const mcp::RequestContext& rc);
// The call's W3C trace context as TRACEPARENT (and TRACESTATE) added to the environment of a
// command or job it starts; nothing when the call carried none, and a name `env` sets already
// is left as the caller set it.
void add_trace_env(std::vector<std::pair<std::string, std::string>>& env, const mcp::RequestContext& rc);
// The same for a job: in its environment (local), or before its command through env(1) (Slurm,
// whose jobs take no variables).
void add_job_trace(jobs::SubmitRequest& req, const mcp::RequestContext& rc);
// Audits a finished tool call ("mcp.tool_call") in the log of `instance` when given and existing,
// else of the instance the arguments name, else in the store-level log.
void audit_tool_call(const ToolContext& ctx, const std::string& tool, const mcp::json& args, mcp::ToolResult& result,
                     std::chrono::milliseconds duration, mcp::RequestContext& rc, std::string_view instance = {});
// The network "on" means: the default of new instances unless that is off; else nat where it
// works, filtered where not.
config::Network network_on_mode(const ToolContext& ctx);

// An instance as tools and resources show it (sandbox paths, not host paths).
mcp::json agent_instance_json(const ToolContext& ctx, const store::Instance& inst);
std::string instance_uri(const std::string& id);  // resource://ns-hpc/instances/<id>

// A persistent instance's living state (instances::state_json), added to `out`; "unknown" with
// state_error when the backend cannot tell (one instance never fails a listing). Returns the
// status when there is one; nullopt for an instance that is not persistent (nothing is asked).
std::optional<sandbox::LivingStatus> add_living_state(const ToolContext& ctx, const store::Instance& inst,
                                                      mcp::json& out);
// "running since 2026-06-12 10:31:02Z, 3 processes, 12.5 MiB" / "stopped (last: idle for 900 s)"
std::string living_summary(const mcp::json& state);

// The instance a call names, or [mcp] default_instance; UsageError when there is neither.
std::string instance_arg(const ToolContext& ctx, const mcp::json& args);

// ---------------------------------------------------------------------------------------------
// Result size ([mcp] max_result_chars; tools/results.cpp).

// Characters one result may carry in all: max_result_chars less room for its summary.
std::size_t result_budget(const config::Config& cfg);
// Characters of output one copy of it may carry: result_budget, halved when result_type "both"
// sends the output in the text and in structuredContent.
std::size_t output_budget(const config::Config& cfg);
// Shares `budget` between texts of `a` and `b` characters: each gets what it needs up to half,
// what one leaves goes to the other.
std::pair<std::size_t, std::size_t> split_budget(std::size_t a, std::size_t b, std::size_t budget);

// A command's stdout and stderr sized for a result: each cut in the middle with a marker saying
// how much was cut and where the whole is; the whole (`raw_*`, as the command wrote it) kept in
// /workspace/.ns_hpc_output/term-<time>-<id>.out|.err, only when cut, the last few kept.
struct BoundedOutput {
  std::string out, err;
  std::string out_file, err_file;  // sandbox paths of the whole output; empty when not cut
  std::size_t out_cut = 0, err_cut = 0;
  std::string note;  // why the whole output could not be kept, if so
};
BoundedOutput bound_output(const ToolContext& ctx, const store::Instance& inst, const std::string& out,
                           const std::string& err, const std::string& raw_out, const std::string& raw_err);

// Every text content of `result` cut in the middle to `max_chars` characters (a last bound for
// every tool; the tools size their own results first).
void bound_texts(mcp::ToolResult& result, std::size_t max_chars);

void add_instance_tools(mcp::Server& server, const ToolContext& ctx);
// factory_reset_instance, snapshot_instance, list_snapshots, restore_snapshot, delete_snapshot
void add_snapshot_tools(mcp::Server& server, const ToolContext& ctx);
void add_prompts(mcp::Server& server, const ToolContext& ctx);

// terminal_execute's arguments (tools/terminal.cpp), read and checked with the seed's messages:
// command or args, stdin (at most 2 MiB), working_directory, env, timeout (default_timeout when
// absent). A command runs as `shell -c COMMAND`.
struct TerminalRequest {
  std::string instance_id;
  std::vector<std::string> argv;
  std::string stdin_text;  // empty: no stdin (EOF at once)
  std::string working_directory;
  std::vector<std::pair<std::string, std::string>> env;
  std::int64_t timeout = 0;
};
TerminalRequest parse_terminal_request(const mcp::json& args, const config::Config& cfg, std::string instance_id,
                                       const std::string& shell, std::int64_t default_timeout);
// Runs it in the instance's sandbox ([terminal.limits], stopped by a delete), its stdout and
// stderr together capped at `output_cap` bytes, with progress and cancellation through `rc`.
sandbox::CaptureResult run_terminal_request(const ToolContext& ctx, const store::Instance& inst,
                                            const TerminalRequest& req, std::size_t output_cap,
                                            mcp::RequestContext& rc);
// read_file, write_file, edit_file, list_directory, search_files, file_info, move/copy/delete_file
void add_file_tools(mcp::Server& server, const ToolContext& ctx);
// resource://ns-hpc/instances/{id}/files/{path}: the file (text, or a base64 blob) or a folder's
// listing; nullopt when there is no such instance or file. `path` percent-encoded.
std::optional<std::vector<mcp::ResourceContents>> read_file_resource(const ToolContext& ctx, const std::string& uri,
                                                                     const std::string& id, const std::string& path);
std::shared_ptr<mcp::ResourceProvider> make_resources(const ToolContext& ctx);

}  // namespace nshpc::tools
