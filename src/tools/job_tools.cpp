// submit_job, poll_job, list_jobs, cancel_job: adapters to the job engine.
#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/text.hpp"
#include "jobs/jobs.hpp"
#include "tools/confirm.hpp"
#include "tools/internal.hpp"
#include "tools/progress.hpp"
#include "tools/tasks.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

const json kJobIdArg = {{"type", "string"}, {"description", "Job id."}};
const json kTailArg = {{"type", "integer"},
                       {"minimum", 0},
                       {"maximum", 1000},
                       {"description", "Last output lines to return (default 50)."}};

// One vocabulary for both modes (jobs/state.hpp).
const json kStates = {"pending",   "running", "completed",     "failed",    "cancelled",   "timed_out",
                      "lost",      "out_of_memory", "output_limit", "node_fail", "preempted"};

const json kDetachArg = {{"type", "boolean"}, {"description", "false: cancel it if still running when the wait ends."}};

// A job as submit_job, poll_job and cancel_job return it: job_id, instance_id, status (kStates),
// command, mode, stdout_path, stderr_path, limits, duration_s, and what is known: exit_code,
// signal, reason, times, output tails, unenforced, the Slurm fields. Nothing unknown is sent as
// null: it is left out.
const json kJobSchema = result_object({"job_id", "status"});

// `j` without its null members (a field not known yet is left out, never null).
json without_nulls(json j) {
  for (auto it = j.begin(); it != j.end();) it = it->is_null() ? j.erase(it) : std::next(it);
  return j;
}

json limits_arg(const config::Config& cfg) {
  json props = json::object();
  // What each limit means, in its unit; its minimum is the least that still bounds the job.
  const std::map<std::string, std::pair<std::string, std::int64_t>> meaning = {
      {"cpus", {"CPU cores", 1}},
      {"memory", {"MiB", 16}},
      {"pids", {"Processes", 8}},
      {"time", {"Seconds", 1}},
      {"output", {"MiB per file", 1}}};
  for (const auto& [name, limit] : cfg.jobs.local.limit) {
    auto m = meaning.find(name);
    props[name] = {{"type", "integer"},
                   {"minimum", m == meaning.end() ? 0 : m->second.second},
                   {"maximum", limit.max},
                   {"description", fmt::format("{} (default {}).", m == meaning.end() ? name : m->second.first,
                                               limit.default_value)}};
  }
  return {{"type", "object"}, {"properties", props}, {"additionalProperties", false},
          {"description", "Local limits (seen inside as NS_HPC_LIMIT_*)."}};
}

json resources_arg(const config::Config& cfg) {
  json props = json::object();
  for (const auto& [name, limit] : cfg.jobs.slurm.limit) {
    props[name] = {{"type", "integer"},
                   {"minimum", 0},
                   {"maximum", limit.max},
                   {"description", fmt::format("{}{} (default {}).", name, name == "memory" ? " MiB" : "",
                                               limit.default_value)}};
  }
  return {{"type", "object"}, {"properties", props}, {"additionalProperties", false},
          {"description", "Slurm resources (mode slurm)."}};
}

// Slurm is offered where its submit program is configured and installed: sbatch_command's program
// on PATH (the controller answering is for `ns-hpc doctor` to check, not for every tools/list).
bool slurm_configured(const config::Config& cfg) {
  return !cfg.jobs.slurm.sbatch_command.empty() && fs::find_program(cfg.jobs.slurm.sbatch_command.front());
}

json mode_arg(const config::Config& cfg) {
  if (!slurm_configured(cfg))
    return {{"type", "string"}, {"enum", {"local"}}, {"description", "local (no Slurm here)."}};
  return {{"type", "string"}, {"enum", {"local", "slurm"}}, {"description", "local (default) or slurm (sbatch)."}};
}

json timeout_arg(const config::Config& cfg, std::int64_t fallback) {
  return {{"type", "integer"},
          {"minimum", 0},
          {"maximum", cfg.jobs.max_timeout},
          {"description", fmt::format("Seconds to wait (default {}).", fallback)}};
}

// The tails fit [mcp] max_result_chars: each stream at most half of one copy's output budget
// (bytes bound characters).
jobs::TailOptions tail_of(const ToolContext& ctx, const json& args) {
  jobs::TailOptions t;
  t.lines = static_cast<std::size_t>(args.value("tail", 50));
  t.bytes = std::min(t.bytes, output_budget(ctx.services.config) / 2);
  return t;
}

mcp::ToolResult result_of(const jobs::View& view) {
  std::string text = jobs::view_text(view);
  if (view.record.state == jobs::State::running) text += " poll_job waits for it, cancel_job stops it.";
  if (view.record.state == jobs::State::pending) text += " poll_job waits for it, cancel_job removes it.";
  return mcp::ToolResult::text(std::move(text), without_nulls(jobs::view_json(view)));
}

// Waits for the job as the call asked: progress while waiting, stops waiting (not the job) when
// the request is cancelled, and with detach=false cancels a job still running when a real wait
// (timeout > 0) ran out. Returns the result to send.
mcp::ToolResult wait_for(const ToolContext& ctx, const std::string& instance, const std::string& job,
                         std::int64_t timeout_s, const json& args, mcp::RequestContext& rc) {
  jobs::Engine& engine = ctx.services.instances.jobs();
  bool interrupted = false;
  jobs::View v = engine.wait(
      instance, job, std::chrono::seconds(timeout_s), tail_of(ctx, args),
      [&] { return interrupted = rc.cancelled(); },
      [&, follower = OutputFollower()](double elapsed, const jobs::View& now) mutable {
        rc.progress(elapsed, static_cast<double>(timeout_s),
                    follower.window(fmt::format("waiting for the job ({}, {:.0f} s)", jobs::to_string(now.record.state),
                                                elapsed),
                                    now.stdout_tail, now.stderr_tail));
      });
  const bool ran_out = !interrupted && !jobs::is_final(v.record.state) && timeout_s > 0;
  if (ran_out && !args.value("detach", true)) {
    engine.cancel(instance, job, actor(rc));
    v = engine.view(instance, job, tail_of(ctx, args));
  }
  return result_of(v);
}

// One line of list_jobs: id, state, exit code, where it runs (Slurm), the command's start.
std::string job_line(const jobs::Record& r) {
  std::string where;
  if (r.mode == jobs::Mode::slurm)
    where = fmt::format("  [slurm {}{}{}]", r.slurm_job_id.empty() ? "-" : r.slurm_job_id,
                        r.scheduler_state.empty() ? "" : " " + r.scheduler_state,
                        r.scheduler_reason.empty() || r.scheduler_reason == "None" ? "" : " (" + r.scheduler_reason + ")");
  return fmt::format("{}  {}{}{}  {}", r.id, jobs::to_string(r.state),
                     r.exit_code ? fmt::format(" ({})", *r.exit_code) : "", where, r.command.substr(0, 80));
}

// A Slurm submit that fails says what Slurm said, in words an agent can act on.
jobs::Record submit_or_say_why(const ToolContext& ctx, const jobs::SubmitRequest& req, const std::string& who) {
  try {
    return ctx.services.instances.jobs().submit(req, who);
  } catch (const jobs::SchedulerError& e) {
    if (req.mode != jobs::Mode::slurm) throw;
    throw UsageError(fmt::format(
        "the Slurm cluster did not take the job: {}. Its controller may not be answering; run the job with mode "
        "\"local\" meanwhile, and ask the server's operator to run `ns-hpc doctor`, which checks Slurm",
        text::truncate_utf8(e.what(), 400)));
  }
}

// Whether a Slurm job is big enough to ask the user first ([mcp] confirm_destructive with
// confirm_slurm_cpu_hours), and the question. Its size: CPUs × its time bound, the Slurm `time`
// resource in minutes (what sbatch --time={time} gives Slurm) when configured, else [jobs]
// max_timeout.
std::optional<std::string> slurm_confirmation(const config::Config& cfg, const jobs::SubmitRequest& req) {
  if (req.mode != jobs::Mode::slurm || !cfg.mcp.confirm_destructive || cfg.mcp.confirm_slurm_cpu_hours <= 0)
    return std::nullopt;
  const auto value = [&](const char* name) -> std::optional<std::int64_t> {
    if (auto it = req.limits.values.find(name); it != req.limits.values.end()) return it->second;
    if (auto it = cfg.jobs.slurm.limit.find(name); it != cfg.jobs.slurm.limit.end()) return it->second.default_value;
    return std::nullopt;
  };
  const std::int64_t cpus = std::max<std::int64_t>(1, value("cpus").value_or(1));
  const std::optional<std::int64_t> minutes = value("time");
  const double hours = minutes ? *minutes / 60.0 : cfg.jobs.max_timeout / 3600.0;
  const double cpu_hours = static_cast<double>(cpus) * hours;
  if (cpu_hours <= cfg.mcp.confirm_slurm_cpu_hours) return std::nullopt;
  return fmt::format("Submit a Slurm job of {} CPU(s) for up to {:.1f} h ({:.1f} CPU hours, over this server's bound "
                     "of {:g}): {}",
                     cpus, hours, cpu_hours, cfg.mcp.confirm_slurm_cpu_hours,
                     text::truncate_utf8(req.display.empty() ? text::shell_join(req.argv) : req.display, 200));
}

void add_submit(mcp::Server& server, const ToolContext& ctx, std::shared_ptr<JobTasks> tasks) {
  const config::Config& cfg = ctx.services.config;
  json props = command_properties(cfg);
  props["timeout"] = timeout_arg(cfg, 30);
  props["detach"] = kDetachArg;
  props["tail"] = kTailArg;
  props["limits"] = limits_arg(cfg);
  props["resources"] = resources_arg(cfg);
  props["mode"] = mode_arg(cfg);
  // confirm: true only where a Slurm job may have to be confirmed (tools/list stays small).
  const bool may_confirm = cfg.mcp.confirm_destructive && cfg.mcp.confirm_slurm_cpu_hours > 0 && slurm_configured(cfg);
  // A client that follows tasks gets the job as one at once (its record exists by then); any
  // other waits for it as before.
  add_tool(server, {
      .name = "submit_job",
      .description = "Run a command as a background job (limits, or Slurm resources); waits up to timeout s, then "
                     "gives status, exit code and output tails. It runs on after the wait; its whole output is in "
                     "the files named.",
      .input = may_confirm ? with_confirm(instance_input(cfg, std::move(props))) : instance_input(cfg, std::move(props)),
      .output = kJobSchema,
      .hints = {.destructive = true, .open_world = true},
      .handler =
          [ctx, tasks](const json& args, mcp::RequestContext& rc) {
            const config::Config& cfg = ctx.services.config;
            const std::string command = string_arg(args, "command");
            std::vector<std::string> argv;
            if (auto it = args.find("args"); it != args.end() && it->is_array())
              for (const auto& a : *it) {
                if (!a.is_string()) throw UsageError("args must be a list of strings.");
                argv.push_back(a.get<std::string>());
              }
            if (!command.empty() && !argv.empty())
              throw UsageError("Give either `command` (a shell command) or `args` (an exact argv), not both.");
            if (command.empty() && argv.empty())
              throw UsageError("Give `command` (a shell command) or `args` (an exact argv).");
            jobs::SubmitRequest req = jobs::shell_job(instance_arg(ctx, args), command, cfg.terminal.shell);
            if (command.empty()) req.argv = argv;
            req.cwd = string_arg(args, "working_directory");
            req.env = env_arg(args);
            req.stdin_text = string_arg(args, "stdin");
            const std::string mode = args.value("mode", "local");
            if (auto parsed = jobs::parse_mode(mode))
              req.mode = *parsed;
            else
              throw UsageError(
                  fmt::format("unknown mode '{}'; use \"local\" (this machine) or \"slurm\" (the cluster)", mode));
            if (req.mode == jobs::Mode::slurm && args.contains("limits"))
              throw UsageError("mode \"slurm\" takes `resources` (e.g. {\"cpus\": 2, \"memory\": 1024}), not `limits`");
            if (req.mode != jobs::Mode::slurm && args.contains("resources"))
              throw UsageError("`resources` are for mode \"slurm\"; local jobs take `limits`");
            if (auto it = args.find(req.mode == jobs::Mode::slurm ? "resources" : "limits"); it != args.end())
              for (const auto& [name, value] : it->items()) req.limits.values[name] = value.get<std::int64_t>();
            add_job_trace(req, rc);
            if (const std::optional<std::string> what = slurm_confirmation(cfg, req)) {
              // A client that follows tasks is asked through the task, the job kept until it says
              // yes; any other is asked now (or told to pass confirm: true).
              if (rc.task_mode() == mcp::RequestContext::TaskMode::modern && !args.value("confirm", false))
                return mcp::ToolResult::of_task(tasks->awaiting_confirmation(req, *what));
              confirm(ctx, rc, "submit_job", args, *what);
            }
            jobs::Record rec = submit_or_say_why(ctx, req, actor(rc));
            if (rc.task_mode() != mcp::RequestContext::TaskMode::none)
              return mcp::ToolResult::of_task(tasks->of_job(rec.instance_id, rec.id));
            return wait_for(ctx, rec.instance_id, rec.id, args.value("timeout", 30), args, rc);
          },
      .task_support = mcp::Tool::TaskSupport::optional,
  });
}

void add_poll(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "poll_job",
      .description = "A job's status, exit code and output tails; waits up to timeout s for its end (0: look).",
      .input = instance_input(ctx.services.config,
                              {{"job_id", kJobIdArg},
                               {"timeout", timeout_arg(ctx.services.config, 0)},
                               {"detach", kDetachArg},
                               {"tail", kTailArg}},
                              {"job_id"}),
      .output = kJobSchema,
      .hints = {.destructive = false},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            return wait_for(ctx, instance_arg(ctx, args), string_arg(args, "job_id"), args.value("timeout", 0), args,
                            rc);
          },
  });
}

void add_list(mcp::Server& server, const ToolContext& ctx) {
  json input = instance_input(
      ctx.services.config,
      {{"status", {{"type", "string"}, {"enum", kStates}, {"description", "Only this status."}}},
       {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 500}, {"description", "Per page (default 15)."}}},
       {"offset", {{"type", "integer"}, {"minimum", 0}, {"description", "Jobs to skip."}}}});
  // Published as it always was: an empty "required" when instance_id may be left out.
  if (!input.contains("required")) input["required"] = json::array();
  add_tool(server, {
      .name = "list_jobs",
      .description = "An instance's jobs, newest first.",
      .input = std::move(input),
      // jobs: {job_id, instance_id, status, command, mode, exit_code, ...} as in poll_job's result
      // without output; total; next_offset but on the last page.
      .output = result_object({"jobs", "total"}),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext&) {
            std::optional<jobs::State> filter;
            if (auto it = args.find("status"); it != args.end()) filter = jobs::parse_state(it->get<std::string>());
            const std::string instance = instance_arg(ctx, args);
            auto all = ctx.services.instances.jobs().list(instance, filter);
            const std::size_t offset = args.value("offset", 0);
            const std::size_t limit = args.value("limit", 15);
            json items = json::array();
            std::string text;
            if (all.empty() && filter) {
              const std::size_t others = ctx.services.instances.jobs().list(instance).size();
              text = fmt::format("No {} jobs ({} in other states).", jobs::to_string(*filter), others);
            } else if (all.empty()) {
              text = "No jobs.";
            } else {
              text = fmt::format("{} {}job(s), newest first:", all.size(), filter ? jobs::to_string(*filter) + " " : "");
            }
            // A page holds what fits in [mcp] max_result_chars, the text and the items together.
            const std::size_t budget = result_budget(ctx.services.config);
            std::size_t used = 0, end = offset;
            for (std::size_t i = offset; i < all.size() && i < offset + limit; ++i) {
              json item = without_nulls(jobs::record_summary_json(all[i]));
              const std::string line = "\n- " + job_line(all[i]);
              const std::size_t size = item.dump().size() + line.size();
              if (i > offset && used + size > budget) break;
              used += size;
              items.push_back(std::move(item));
              text += line;
              end = i + 1;
            }
            const bool more = end < all.size();
            if (more) text += fmt::format("\n(more: offset {})", end);
            json out = {{"jobs", items}, {"total", all.size()}};
            if (more) out["next_offset"] = end;
            return mcp::ToolResult::text(text, std::move(out));
          },
  });
}

void add_cancel(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "cancel_job",
      .description = "Stop a job and all it started (SIGTERM, then SIGKILL; Slurm: scancel); gives its final status.",
      .input = instance_input(ctx.services.config, {{"job_id", kJobIdArg}, {"tail", kTailArg}}, {"job_id"}),
      .output = kJobSchema,
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            const std::string instance = instance_arg(ctx, args);
            const std::string job = string_arg(args, "job_id");
            ctx.services.instances.jobs().cancel(instance, job, actor(rc));
            return result_of(ctx.services.instances.jobs().view(instance, job, tail_of(ctx, args)));
          },
  });
}

}  // namespace

std::shared_ptr<JobTasks> run_job_tasks(const ToolContext& ctx) {
  // Jobs are this server's tasks: followed by tasks/get, their result poll_job's.
  return std::make_shared<JobTasks>(
      ctx, tail_of(ctx, json::object()), [](const jobs::View& view) { return result_of(view); },
      [ctx](mcp::RequestContext&) {
        std::vector<std::string> ids;
        for (const store::Instance& inst : ctx.services.instances.store().list().instances) ids.push_back(inst.id);
        return ids;
      });
}

void add_job_tools(mcp::Server& server, const ToolContext& ctx, std::shared_ptr<JobTasks> tasks) {
  add_submit(server, ctx, std::move(tasks));
  add_poll(server, ctx);
  add_list(server, ctx);
  add_cancel(server, ctx);
}

}  // namespace nshpc::tools
