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
#include "base/steps.hpp"
#include "tools/internal.hpp"
#include "tools/progress.hpp"
#include "tools/tasks.hpp"

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
// A 2026-07-28 client with the Tasks extension that asks for a timeout above this runs the
// command as a job; one still running after kTaskAfter becomes a task (a quick one answers at
// once, as ever). Anything else runs here, synchronously.
constexpr std::int64_t kTaskAboveSeconds = 60;
constexpr std::chrono::seconds kTaskAfter{5};
constexpr std::string_view kTool = "terminal_execute";

// Appends a note to stderr on its own line.
void append_note(std::string& err, const std::string& note) {
  if (!err.empty() && err.back() != '\n') err += '\n';
  err += note;
}

mcp::ToolResult make_result(const ToolContext& ctx, const store::Instance& inst, const TerminalRequest& req,
                            sandbox::CaptureResult o) {
  const config::Config& cfg = ctx.services.config;
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
  // At most [mcp] max_result_chars of output; the whole of a cut output stays in a file.
  BoundedOutput b = bound_output(ctx, inst, text::sanitize_utf8(o.out), text::sanitize_utf8(o.err), o.out, o.err);
  if (!b.note.empty()) append_note(b.err, b.note);
  const std::int64_t ms = o.duration.count();
  json structured = {{"stdout", b.out},
                     {"stderr", b.err},
                     {"exit_code", exit_code},
                     {"exec_duration_ms", ms},
                     {"instance_id", req.instance_id},
                     {"network", std::string(config::to_string(inst.network))}};
  if (!b.out_file.empty()) structured["stdout_file"] = b.out_file;
  if (!b.err_file.empty()) structured["stderr_file"] = b.err_file;
  // The text: a readable summary and the output, never a second serialisation of it.
  std::string text = fmt::format("exit code {} ({} ms, network {})", exit_code, ms, config::to_string(inst.network));
  auto stream = [&text](const char* name, const std::string& data, const std::string& file) {
    if (data.empty()) return;
    text += fmt::format("\n--- {}{} ---\n", name, file.empty() ? "" : " (cut; whole: " + file + ")");
    text += data;
  };
  stream("stdout", b.out, b.out_file);
  stream("stderr", b.err, b.err_file);
  if (b.out.empty() && b.err.empty()) text += ", no output";
  return mcp::ToolResult::text(std::move(text), std::move(structured));
}

// `share_pids`: whether a later command of a persistent instance sees the processes an earlier one
// left (Backend::commands_share_pids); the description says what this server does.
std::string tool_description(const config::Config& cfg, bool share_pids) {
  return fmt::format(
      "Run a command in an instance and wait for it. {ws} and {out} persist; cd and variables do not. A "
      "persistent instance keeps background processes and /tmp{pids}; else each call is a fresh sandbox. A "
      "timeout kills all it started (exit 124); over {limit} MiB of output kills it (exit 1). Output past {chars} "
      "characters is cut in the middle, the whole kept in the file the result names. Long work: submit_job.",
      fmt::arg("pids", share_pids ? " (later calls' ps and kill see them)"
                                  : " (they run on, but later calls' ps and kill do not see them)"),
      fmt::arg("ws", cfg.ns.workspace_mount), fmt::arg("out", cfg.ns.output_mount),
      fmt::arg("limit", kOutputLimitBytes / (1024 * 1024)), fmt::arg("chars", cfg.mcp.max_result_chars));
}

json input_properties(const config::Config& cfg) {
  json props = command_properties(cfg);
  props["timeout"] = {{"type", "integer"},
                      {"minimum", 1},
                      {"maximum", cfg.jobs.max_timeout},
                      {"description", fmt::format("Seconds it may run (default {}).", kDefaultTimeoutSeconds)}};
  return props;
}

}  // namespace

// Validation as the original: empty command/args/working_directory/stdin count as absent.
TerminalRequest parse_terminal_request(const json& args, const config::Config& cfg, std::string instance_id,
                                       const std::string& shell, std::int64_t default_timeout) {
  TerminalRequest req;
  req.instance_id = std::move(instance_id);
  req.timeout = default_timeout;
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
  req.env = env_arg(args);
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
  req.argv = command.empty() ? std::move(argv) : std::vector<std::string>{shell, "-c", command};
  return req;
}

// ---------------------------------------------------------------------------------------------
// Running: the request as an exec description, through the sandbox's captured-run pump.

sandbox::CaptureResult run_terminal_request(const ToolContext& ctx, const store::Instance& inst,
                                            const TerminalRequest& req, std::size_t output_cap,
                                            mcp::RequestContext& rc) {
  sandbox::ExecSpec spec = ctx.services.instances.command(inst, instances::Service::Command::terminal, req.argv);
  spec.cwd = req.working_directory;  // empty: the workspace
  spec.env = req.env;
  add_trace_env(spec.env, rc);

  sandbox::CaptureOptions options;
  options.input = req.stdin_text;
  options.output_cap = output_cap;
  options.timeout = std::chrono::seconds(req.timeout);
  options.cancelled = [&rc] { return rc.cancelled(); };
  options.progress = [&rc, &req, follower = OutputFollower()](const sandbox::CaptureProgress& p) mutable {
    const double seconds = std::chrono::duration<double>(p.elapsed).count();
    rc.progress(seconds, static_cast<double>(req.timeout),
                follower.grown(fmt::format("running, {:.0f} s", seconds), p.out, p.err));
  };
  options.progress_interval = kProgressInterval;
  options.slice = kPollSlice;
  const std::string shown =
      req.argv.size() == 3 && req.argv[1] == "-c" ? req.argv[2] : text::shell_join(req.argv);
  return ctx.services.instances.run_captured(inst, std::move(spec), std::move(options),
                                             fmt::format("a command (`{}`)", text::truncate_utf8(shown, 60)));
}

namespace {

// One output stream of a job as the command wrote it, read beneath the workspace (the sandbox
// can write there) up to half the output limit; a longer one is its tail, with where the whole is.
std::string job_stream(const ToolContext& ctx, const store::Instance& inst, const std::string& host_path,
                       const std::string& sandbox_path, const std::string& tail) {
  const std::string ws = inst.workspace.string() + "/";
  if (host_path.rfind(ws, 0) != 0) return tail;
  fs::Refusal refusal;
  UniqueFd fd = ctx.services.instances.store().open_workspace_file(inst, host_path.substr(ws.size()),
                                                                   store::Store::WorkspaceOpen::read, &refusal);
  if (!fd) return tail;  // not written (empty), or not readable: the tail says what there is
  constexpr std::size_t kMax = kOutputLimitBytes / 2;
  std::string whole = pread_some(fd.get(), kMax + 1);
  if (whole.size() <= kMax) return whole;
  return fmt::format("[ns-hpc: over {} bytes; the last lines follow, the whole is in {}]\n{}", kMax, sandbox_path, tail);
}

// terminal_execute's result of a command that ran as a job, from the job's view.
mcp::ToolResult result_of_job(const ToolContext& ctx, const jobs::View& v) {
  const jobs::Record& r = v.record;
  const store::Instance inst = ctx.services.instances.store().get(r.instance_id);
  TerminalRequest req;
  req.instance_id = inst.id;
  if (auto t = r.limits.find("time"); t != r.limits.end()) req.timeout = t->second;
  sandbox::CaptureResult o;
  o.ending = r.state == jobs::State::cancelled   ? sandbox::Ending::cancelled
             : r.state == jobs::State::timed_out ? sandbox::Ending::timed_out
                                                 : sandbox::Ending::finished;
  o.status.started = true;
  o.status.exit_code = r.exit_code.value_or(-1);
  o.out = job_stream(ctx, inst, r.stdout_path, v.stdout_sandbox_path, v.stdout_tail);
  o.err = job_stream(ctx, inst, r.stderr_path, v.stderr_sandbox_path, v.stderr_tail);
  // How a job ends beyond its exit code (out of memory, its output limit, lost) in its own words.
  if (r.state != jobs::State::completed && r.state != jobs::State::failed && o.ending == sandbox::Ending::finished)
    append_note(o.err, fmt::format("[ns-hpc: the command ran as job {} and ended {}{}]", r.id, jobs::to_string(r.state),
                                   r.reason.empty() ? "" : ": " + r.reason));
  o.duration = std::chrono::milliseconds(std::llround(v.duration_s * 1000));
  return make_result(ctx, inst, req, std::move(o));
}

// The command as a job: its result if it ends within kTaskAfter, else its task.
mcp::ToolResult run_as_task(const ToolContext& ctx, JobTasks& tasks, const store::Instance& inst,
                            const TerminalRequest& req, mcp::RequestContext& rc) {
  const config::Config& cfg = ctx.services.config;
  jobs::SubmitRequest job;
  job.instance_id = inst.id;
  job.argv = req.argv;
  if (req.argv.size() == 3 && req.argv[1] == "-c") job.display = req.argv[2];
  job.cwd = req.working_directory;
  job.env = req.env;
  job.stdin_text = req.stdin_text;
  std::int64_t time = req.timeout;
  if (auto t = cfg.jobs.local.limit.find("time"); t != cfg.jobs.local.limit.end()) time = std::min(time, t->second.max);
  job.limits.values["time"] = time;
  add_job_trace(job, rc);
  jobs::Engine& engine = ctx.services.instances.jobs();
  const jobs::Record rec = engine.submit(job, actor(rc));
  const jobs::TailOptions tail{.lines = 200, .bytes = 64 * 1024};
  const jobs::View v = engine.wait(inst.id, rec.id, kTaskAfter, tail, [&rc] { return rc.cancelled(); });
  if (jobs::is_final(v.record.state)) return result_of_job(ctx, v);
  if (rc.cancelled()) {  // the call was given up: so is its command, as a synchronous one would be
    engine.cancel(inst.id, rec.id, actor(rc));
    return mcp::ToolResult::error("cancelled");
  }
  return mcp::ToolResult::of_task(tasks.of_job(inst.id, rec.id, std::string(kTool)));
}

}  // namespace

void add_terminal_tool(mcp::Server& server, const ToolContext& ctx, std::shared_ptr<JobTasks> tasks) {
  const config::Config& cfg = ctx.services.config;
  if (tasks)
    tasks->add_result_shape(std::string(kTool), {.lines = 200, .bytes = 64 * 1024},
                            [ctx](const jobs::View& v) { return result_of_job(ctx, v); });
  add_tool(server, {
      .name = "terminal_execute",
      .description = tool_description(cfg, ctx.services.instances.commands_share_pids()),
      .input = instance_input(cfg, input_properties(cfg)),
      // And stdout_file/stderr_file: the whole of a cut output.
      .output = result_object({"stdout", "stderr", "exit_code", "exec_duration_ms", "instance_id", "network"}),
      .hints = {.destructive = true, .open_world = true},
      .handler =
          [ctx, tasks](const json& args, mcp::RequestContext& rc) {
            std::string instance_id = instance_arg(ctx, args);
            Steps step("terminal_execute", instance_id);
            step("request");
            const TerminalRequest req = parse_terminal_request(args, ctx.services.config, std::move(instance_id),
                                                               ctx.services.config.terminal.shell,
                                                               kDefaultTimeoutSeconds);
            const store::Instance inst = ctx.services.instances.store().get(req.instance_id);
            if (tasks && rc.task_mode() == mcp::RequestContext::TaskMode::modern && args.contains("timeout") &&
                req.timeout > kTaskAboveSeconds) {
              step("job");
              return run_as_task(ctx, *tasks, inst, req, rc);
            }
            step("run");
            sandbox::CaptureResult ran = run_terminal_request(ctx, inst, req, kOutputLimitBytes, rc);
            step("result");
            return make_result(ctx, inst, req, std::move(ran));
          },
  });
}

}  // namespace nshpc::tools
