// terminal_execute: one command in an instance's sandbox, run synchronously, its output returned.
// The contract is mcp-virtual-computer's terminal_execute (Kilntainers' sandbox_exec): the same
// arguments, validation messages and result object, except that a timeout keeps the partial output.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/capture.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

constexpr std::size_t kMaxStdinBytes = 2 * 1024 * 1024;     // stdin's UTF-8 size; exactly 2 MiB is allowed
constexpr std::size_t kOutputLimitBytes = 2 * 1024 * 1024;  // stdout + stderr combined
constexpr std::int64_t kDefaultTimeoutSeconds = 120;
constexpr int kTimeoutExitCode = 124;
constexpr int kOutputLimitExitCode = 1;
constexpr int kNotRunExitCode = 127;  // as a shell's "command not found"
constexpr std::chrono::milliseconds kPollSlice{50};        // cancellation is noticed within this
constexpr std::chrono::seconds kProgressInterval{1};

// ---------------------------------------------------------------------------------------------
// Arguments

struct Request {
  std::string instance_id;
  std::vector<std::string> argv;
  std::string stdin_text;  // empty: no stdin (EOF at once)
  std::string working_directory;
  std::int64_t timeout = kDefaultTimeoutSeconds;
};

// Validation as the original: empty command/args/working_directory/stdin count as absent.
Request parse_request(const json& args, const config::Config& cfg, const ToolContext& ctx) {
  Request req;
  req.instance_id = instance_arg(ctx, args);
  const std::string command = string_arg(args, "command");
  std::vector<std::string> argv;
  if (auto it = args.find("args"); it != args.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (!a.is_string()) throw UsageError("args must be a list of strings.");
      argv.push_back(a.get<std::string>());
    }
  }
  req.stdin_text = string_arg(args, "stdin");
  req.working_directory = string_arg(args, "working_directory");
  if (auto it = args.find("timeout"); it != args.end() && !it->is_null()) {
    if (it->is_number_unsigned()) {
      const auto v = it->get<std::uint64_t>();
      req.timeout = v > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<std::int64_t>(v);
    } else if (it->is_number_integer()) {
      req.timeout = it->get<std::int64_t>();
    } else if (it->is_number_float() && std::isfinite(it->get<double>()) &&
               std::trunc(it->get<double>()) == it->get<double>()) {
      // 10.0, or an integer too large for int64 (the JSON parser makes it a double).
      const double v = it->get<double>();
      req.timeout = v >= 9.2e18 ? INT64_MAX : v <= -9.2e18 ? INT64_MIN : static_cast<std::int64_t>(v);
    } else {
      throw UsageError("timeout must be an integer number of seconds.");
    }
  }

  if (!command.empty() && !argv.empty())
    throw UsageError(
        "Cannot provide both 'command' and 'args'. Use 'command' for shell commands or 'args' for direct "
        "execution.");
  if (command.empty() && argv.empty()) throw UsageError("Must provide either 'command' or 'args'.");
  if (!req.working_directory.empty() && req.working_directory.front() != '/')
    throw UsageError("working_directory must be an absolute path, got: " + req.working_directory);
  if (req.timeout < 1) throw UsageError("timeout must be at least 1 second.");
  if (req.timeout > cfg.jobs.max_timeout)
    throw UsageError(fmt::format(
        "timeout must be at most {} seconds (the server's jobs.max_timeout), got {}. Split the work into "
        "shorter commands.",
        cfg.jobs.max_timeout, req.timeout));
  if (req.stdin_text.size() > kMaxStdinBytes)
    throw UsageError(fmt::format(
        "stdin content exceeds the 2 MiB limit ({} bytes). Split into smaller chunks or use a different "
        "approach.",
        req.stdin_text.size()));
  req.argv = command.empty() ? std::move(argv) : std::vector<std::string>{"/bin/bash", "-c", command};
  return req;
}

// ---------------------------------------------------------------------------------------------
// Running: the request as an exec description, through the sandbox's captured-run pump.

sandbox::CaptureResult execute(const ToolContext& ctx, const store::Instance& inst, const Request& req,
                               mcp::RequestContext& rc) {
  const config::Config& cfg = ctx.services.config;
  sandbox::ExecSpec spec;
  spec.target = ctx.services.store.sandbox_target(inst);
  spec.argv = req.argv;
  spec.cwd = req.working_directory;  // empty: the workspace
  // [terminal.limits]: the same enforcement as a job's (cgroups for cpus/memory/pids, a file
  // size limit for output), in a group of its own that goes with the command.
  spec.limits = cfg.terminal.limits;
  spec.use_cgroups = cfg.jobs.local.use_cgroups;
  spec.cgroup_name = inst.id + "/term-" + jobs::new_job_id();

  sandbox::CaptureOptions options;
  options.input = req.stdin_text;
  options.output_cap = kOutputLimitBytes;
  options.timeout = std::chrono::seconds(req.timeout);
  options.cancelled = [&rc] { return rc.cancelled(); };
  options.progress = [&rc, &req](std::chrono::milliseconds elapsed) {
    rc.progress(std::chrono::duration<double>(elapsed).count(), static_cast<double>(req.timeout), "running");
  };
  options.progress_interval = kProgressInterval;
  options.slice = kPollSlice;
  // A delete or archive of the instance stops this command first.
  options.started = [&ctx, &inst](sandbox::Execution& execution) {
    return std::make_shared<store::Store::Registration>(
        ctx.services.store.register_execution(inst.id, [&execution] { execution.kill_tree(); }));
  };
  return sandbox::capture(ctx.services.backend, std::move(spec), options);
}

// Appends a note to stderr on its own line.
void append_note(std::string& err, const std::string& note) {
  if (!err.empty() && err.back() != '\n') err += '\n';
  err += note;
}

mcp::ToolResult make_result(const config::Config& cfg, const Request& req, const store::Instance& inst,
                            sandbox::CaptureResult o) {
  int exit_code = o.status.exit_code;
  switch (o.ending) {
    case sandbox::Ending::finished: break;
    case sandbox::Ending::cancelled: return mcp::ToolResult::error("cancelled");
    case sandbox::Ending::timed_out:
      exit_code = kTimeoutExitCode;
      append_note(o.err, fmt::format("[ns-hpc: command timed out after {} s; the sandbox was killed]", req.timeout));
      break;
    case sandbox::Ending::output_limit:
      exit_code = kOutputLimitExitCode;
      append_note(o.err, fmt::format("[ns-hpc: output limit exceeded ({} bytes of stdout+stderr); the command "
                                     "was killed. Re-run with head, tail or grep, or write the output to a file.]",
                                     kOutputLimitBytes));
      break;
  }
  if (o.status.oom_killed) {
    auto it = cfg.terminal.limits.find("memory");
    append_note(o.err, fmt::format("[ns-hpc: out of memory: the command was killed at its memory limit of {} MiB "
                                   "([terminal.limits] memory); use less memory or run it as a job with more]",
                                   it == cfg.terminal.limits.end() ? 0 : it->second));
  }
  if (o.ending == sandbox::Ending::finished && !o.status.started) {
    // bwrap could not set up the sandbox or execute the command; its own message is on stderr
    // (e.g. "bwrap: Can't chdir to /x: No such file or directory", "bwrap: execvp prog: ...").
    // With a message that is the command's failure, as a shell reports one: exit 127, the message
    // in stderr, whether it came as `args` or as a `command` (bash says "command not found").
    std::string said = text::sanitize_utf8(o.err);
    while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
    if (said.empty())
      return mcp::ToolResult::error(o.status.error.empty() ? "the sandbox did not start" : o.status.error);
    exit_code = kNotRunExitCode;
  }
  const std::string out = text::sanitize_utf8(o.out);
  const std::string err = text::sanitize_utf8(o.err);
  const std::int64_t ms = o.duration.count();
  // The text keeps the original's key order; structuredContent adds the instance.
  const std::string network(config::to_string(inst.network));
  nlohmann::ordered_json text = {
      {"stdout", out}, {"stderr", err}, {"exit_code", exit_code}, {"exec_duration_ms", ms}, {"network", network}};
  json structured = {{"stdout", out},
                     {"stderr", err},
                     {"exit_code", exit_code},
                     {"exec_duration_ms", ms},
                     {"instance_id", req.instance_id},
                     {"network", network}};
  return mcp::ToolResult::text(text.dump(), std::move(structured));
}

std::string tool_description(const config::Config& cfg, bool share_pids) {
  const std::string& ws = cfg.ns.workspace_mount;
  const std::string& outdir = cfg.ns.output_mount;
  return fmt::format(
      "Execute a command in an instance's Linux sandbox and return its output as JSON: {{stdout, stderr, "
      "exit_code, exec_duration_ms}}. instance_id names the instance (find one with list_instances or make "
      "one with create_instance). Give either `command`, a string run by /bin/bash -c (pipes, redirection, "
      "&& and globs work), or `args`, a list executed directly without a shell (every argument passed "
      "exactly as given).\n\n"
      "Commands run in a hardened sandbox (no root, read-only system folders, a private /tmp of limited "
      "size, limits on memory and processes). Files persist between calls: the workspace {ws} (also $HOME "
      "and the default working directory) and the output folder {out}. In a persistent instance background "
      "processes, /tmp and loopback servers stay between calls too{pids}; otherwise each call is a fresh sandbox "
      "and anything still running when the command ends is killed. The current directory and environment "
      "variables never carry over: chain steps with && in one command or set working_directory (an "
      "absolute path).\n\n"
      "To write files or pass data without shell escaping, use the stdin parameter (e.g. "
      "command=\"cat > file.txt\" with the content in stdin; at most 2 MiB).\n\n"
      "Commands time out after {def} seconds by default (set timeout for long-running operations, at most "
      "{max}). On timeout the command and everything it started are killed and exit_code is 124; the output printed so far is kept and "
      "stderr ends with a note. stdout and stderr together may hold at most {limit} bytes (2 MiB): a command "
      "that prints more is killed (exit_code 1, the first bytes kept, a note at the end of stderr), so "
      "narrow big output with head, tail or grep or write it to a file. A non-zero exit code is a normal "
      "result, not a tool error. Output is decoded as UTF-8 (invalid bytes become U+FFFD): keep binary data "
      "in files. The result's network is the instance's mode: 'off' has only its own loopback (no internet, "
      "no name lookups), 'host' shares the host's network; update_instance changes it.",
      fmt::arg("pids", share_pids ? "" : " (a later call cannot ps or kill them; restart_instance ends them)"),
      fmt::arg("ws", ws), fmt::arg("out", outdir), fmt::arg("def", kDefaultTimeoutSeconds),
      fmt::arg("max", cfg.jobs.max_timeout), fmt::arg("limit", kOutputLimitBytes));
}

}  // namespace

void add_terminal_tool(mcp::Server& server, const ToolContext& ctx) {
  const config::Config& cfg = ctx.services.config;
  add_tool(server, {
      .name = "terminal_execute",
      .title = "Run a command in an instance",
      .description = tool_description(cfg, ctx.services.backend.commands_share_pids()),
      .input = instance_input(
          cfg, "The instance to run the command in (its id, as listed by list_instances).",
          {{"command",
            {{"type", "string"},
             {"description", "Shell command string (mutually exclusive with args). Run by /bin/bash -c."}}},
           {"args",
            {{"type", "array"},
             {"items", of_type("string")},
             {"description",
              "List of arguments for direct execution (mutually exclusive with command). The first is the "
              "program."}}},
           {"stdin", {{"type", "string"}, {"description", "Content to pipe to stdin (at most 2 MiB)."}}},
           {"working_directory",
            {{"type", "string"},
             {"description", fmt::format("Working directory for the command (must be absolute). Default: {}.",
                                         cfg.ns.workspace_mount)}}},
           {"timeout",
            {{"type", "integer"},
             {"description", fmt::format("Timeout in seconds (default {}, at most {}).", kDefaultTimeoutSeconds,
                                         cfg.jobs.max_timeout)}}}}),
      .output = output_object({{"stdout", of_type("string")},
                               {"stderr", of_type("string")},
                               {"exit_code", of_type("integer")},
                               {"exec_duration_ms", of_type("integer")},
                               {"instance_id", of_type("string")},
                               {"network", {{"type", "string"}, {"description", "the instance's network mode"}}}},
                              {"stdout", "stderr", "exit_code", "exec_duration_ms", "instance_id", "network"}),
      .hints = {.destructive = true, .idempotent = false, .open_world = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            const Request req = parse_request(args, ctx.services.config, ctx);
            const store::Instance inst = ctx.services.store.get(req.instance_id);
            return make_result(ctx.services.config, req, inst, execute(ctx, inst, req, rc));
          },
  });
}

}  // namespace nshpc::tools
