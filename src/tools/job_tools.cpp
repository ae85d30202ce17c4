// submit_job, poll_job, list_jobs, cancel_job: adapters to the job engine.
#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/text.hpp"
#include "jobs/jobs.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

const json kJobIdArg = {{"type", "string"}, {"description", "Job id (12 hex characters) from submit_job or list_jobs."}};
const json kTailArg = {{"type", "integer"},
                       {"minimum", 0},
                       {"maximum", 1000},
                       {"description", "How many last lines of stdout and stderr to return (default 50; at most 16 KiB each)."}};

const json kStates = {"pending",   "running", "completed",     "failed",    "cancelled",
                       "timed_out", "lost",    "out_of_memory", "node_fail", "preempted"};

const json kDetachArg = {{"type", "boolean"},
                        {"description", "Keep the job running when the wait runs out (default true)."}};
constexpr const char* kInstanceWhat = "The instance to work in.";

json job_schema() {
  const json str = of_type("string");
  const json nullable_int = {{"type", {"integer", "null"}}};
  const json nullable_str = {{"type", {"string", "null"}}};
  return output_object(
      {{"job_id", str}, {"instance_id", str}, {"status", {{"type", "string"}, {"enum", kStates}}},
       {"exit_code", nullable_int}, {"reason", str}, {"command", str}, {"mode", str},
       {"duration_s", of_type("number")}, {"created_at", str}, {"started_at", str}, {"finished_at", str},
       {"stdout_path", str}, {"stderr_path", str}, {"stdout_tail", str}, {"stderr_tail", str},
       {"limits", of_type("object")}, {"unenforced", {{"type", "array"}, {"items", str}}},
       {"slurm_job_id", nullable_str}, {"scheduler_state", nullable_str}, {"scheduler_reason", nullable_str},
       {"scheduler_error", nullable_str}, {"signal", nullable_int}},
      {"job_id", "instance_id", "status", "exit_code", "command", "stdout_tail", "stderr_tail", "stdout_path",
       "stderr_path"});
}

json limits_arg(const config::Config& cfg) {
  json props = json::object();
  const std::map<std::string, std::string> meaning = {{"cpus", "CPU cores"},
                                                      {"memory", "memory in MiB"},
                                                      {"pids", "processes and threads"},
                                                      {"time", "wall-clock seconds; then the job is killed (timed_out)"},
                                                      {"output", "MiB: the largest file the job may write, stdout/stderr included"}};
  for (const auto& [name, limit] : cfg.jobs.local.limit) {
    auto m = meaning.find(name);
    props[name] = {{"type", "integer"},
                   {"minimum", 0},
                   {"maximum", limit.max},
                   {"description", fmt::format("{} (default {}, at most {})", m == meaning.end() ? name : m->second,
                                               limit.default_value, limit.max)}};
  }
  return {{"type", "object"}, {"properties", props}, {"additionalProperties", false},
          {"description", "Resource limits for this job; each defaults to the server's setting."}};
}

json resources_arg(const config::Config& cfg) {
  json props = json::object();
  for (const auto& [name, limit] : cfg.jobs.slurm.limit) {
    props[name] = {{"type", "integer"},
                   {"minimum", 0},
                   {"maximum", limit.max},
                   {"description", fmt::format("{}{} (default {}, at most {})", name, name == "memory" ? " in MiB" : "",
                                               limit.default_value, limit.max)}};
  }
  return {{"type", "object"}, {"properties", props}, {"additionalProperties", false},
          {"description", "Slurm resources for mode \"slurm\" (filled into the sbatch command); each defaults to the "
                          "server's setting."}};
}

// Slurm is offered where its submit program is configured and installed: sbatch_command's program
// on PATH (the controller answering is for `ns-hpc doctor` to check, not for every tools/list).
bool slurm_configured(const config::Config& cfg) {
  return !cfg.jobs.slurm.sbatch_command.empty() && fs::find_program(cfg.jobs.slurm.sbatch_command.front());
}

json mode_arg(const config::Config& cfg) {
  if (!slurm_configured(cfg))
    return {{"type", "string"}, {"enum", {"local"}}, {"description", "Where to run: 'local' (this node; no Slurm here)."}};
  return {{"type", "string"},
          {"enum", {"local", "slurm"}},
          {"description", "Where to run: 'local' (this node, default) or 'slurm' (the cluster)."}};
}

json timeout_arg(const config::Config& cfg, const std::string& what, std::int64_t fallback) {
  return {{"type", "integer"},
          {"minimum", 0},
          {"maximum", cfg.jobs.max_timeout},
          {"description", fmt::format("{} (seconds, 0..{}, default {}).", what, cfg.jobs.max_timeout, fallback)}};
}

jobs::TailOptions tail_of(const json& args) {
  jobs::TailOptions t;
  t.lines = static_cast<std::size_t>(args.value("tail", 50));
  return t;
}

mcp::ToolResult result_of(const jobs::View& view) {
  std::string text = jobs::view_text(view);
  if (view.record.state == jobs::State::running) text += " poll_job waits for it, cancel_job stops it.";
  if (view.record.state == jobs::State::pending) text += " poll_job waits for it, cancel_job removes it.";
  return mcp::ToolResult::text(std::move(text), jobs::view_json(view));
}

// Waits for the job as the call asked: progress while waiting, stops waiting (not the job) when
// the request is cancelled, and with detach=false cancels a job still running when a real wait
// (timeout > 0) ran out. Returns the result to send.
mcp::ToolResult wait_for(const ToolContext& ctx, const std::string& instance, const std::string& job,
                         std::int64_t timeout_s, const json& args, mcp::RequestContext& rc) {
  jobs::Engine& engine = *ctx.services.jobs;
  bool interrupted = false;
  jobs::View v = engine.wait(
      instance, job, std::chrono::seconds(timeout_s), tail_of(args),
      [&] { return interrupted = rc.cancelled(); },
      [&](double elapsed) { rc.progress(elapsed, static_cast<double>(timeout_s), "waiting for the job"); });
  const bool ran_out = !interrupted && !jobs::is_final(v.record.state) && timeout_s > 0;
  if (ran_out && !args.value("detach", true)) {
    engine.cancel(instance, job, actor(rc));
    v = engine.view(instance, job, tail_of(args));
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
    return ctx.services.jobs->submit(req, who);
  } catch (const jobs::SchedulerError& e) {
    if (req.mode != jobs::Mode::slurm) throw;
    throw UsageError(fmt::format(
        "the Slurm cluster did not take the job: {}. Its controller may not be answering; run the job with mode "
        "\"local\" meanwhile, and ask the server's operator to run `ns-hpc doctor`, which checks Slurm",
        text::truncate_utf8(e.what(), 400)));
  }
}

void add_submit(mcp::Server& server, const ToolContext& ctx) {
  const config::Config& cfg = ctx.services.config;
  add_tool(server, {
      .name = "submit_job",
      .title = "Run a command as a job",
      .description =
          "Run a shell command (/bin/sh -c) as an asynchronous job in an instance's sandbox: on this node with "
          "resource `limits` (mode \"local\", the default), or on the Slurm cluster through sbatch with "
          "`resources` such as cpus and memory (mode \"slurm\"; it may wait in the queue as pending, with the "
          "scheduler's reason). Waits up to `timeout` seconds and returns the job's status with the last lines "
          "of its stdout and stderr; a job still running then keeps running (detach=true, the default) — check "
          "it with poll_job, stop it with cancel_job. With detach=false a job still running when the wait runs "
          "out is cancelled. Output files are kept in /workspace/.ns_hpc_output/. Use terminal_execute instead "
          "for quick commands whose output you need at once.",
      .input = instance_input(
          cfg, kInstanceWhat,
          {{"command", {{"type", "string"}, {"description", "Shell command to run."}}},
           {"timeout", timeout_arg(cfg, "How long to wait for the job before returning", 30)},
           {"detach", kDetachArg},
           {"tail", kTailArg},
           {"limits", limits_arg(cfg)},
           {"resources", resources_arg(cfg)},
           {"mode", mode_arg(cfg)}},
          {"command"}),
      .output = job_schema(),
      .hints = {.destructive = true, .open_world = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            jobs::SubmitRequest req;
            req.instance_id = instance_arg(ctx, args);
            const std::string command = string_arg(args, "command");
            req.argv = {"/bin/sh", "-c", command};
            req.display = command;
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
            jobs::Record rec = submit_or_say_why(ctx, req, actor(rc));
            return wait_for(ctx, rec.instance_id, rec.id, args.value("timeout", 30), args, rc);
          },
  });
}

void add_poll(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "poll_job",
      .title = "Check or wait for a job",
      .description =
          "Return a job's status, exit code and the last lines of its output, waiting up to `timeout` seconds "
          "(default 0: just look) for it to finish. With detach=false, a job still running when a real wait "
          "(timeout > 0) runs out is cancelled; timeout 0 never cancels.",
      .input = instance_input(ctx.services.config, kInstanceWhat,
                              {{"job_id", kJobIdArg},
                               {"timeout", timeout_arg(ctx.services.config, "How long to wait for the job to finish", 0)},
                               {"detach", kDetachArg},
                               {"tail", kTailArg}},
                              {"job_id"}),
      .output = job_schema(),
      .hints = {.destructive = false},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            return wait_for(ctx, instance_arg(ctx, args), string_arg(args, "job_id"), args.value("timeout", 0), args,
                            rc);
          },
  });
}

void add_list(mcp::Server& server, const ToolContext& ctx) {
  json input = instance_input(ctx.services.config, kInstanceWhat,
                              {{"status", {{"type", "string"}, {"enum", kStates}}},
                               {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 500}}},
                               {"offset", {{"type", "integer"}, {"minimum", 0}}}});
  // Published as it always was: an empty "required" when instance_id may be left out.
  if (!input.contains("required")) input["required"] = json::array();
  add_tool(server, {
      .name = "list_jobs",
      .title = "List jobs",
      .description =
          "List an instance's jobs, newest first, with status, exit code and command. Filter by status; page "
          "with limit (default 15, at most 500) and offset (from next_offset).",
      .input = std::move(input),
      .output = output_object({{"jobs", {{"type", "array"}, {"items", of_type("object")}}},
                               {"total", of_type("integer")},
                               {"next_offset", {{"type", {"integer", "null"}}}}},
                              {"jobs", "total", "next_offset"}),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext&) {
            std::optional<jobs::State> filter;
            if (auto it = args.find("status"); it != args.end()) filter = jobs::parse_state(it->get<std::string>());
            auto all = ctx.services.jobs->list(instance_arg(ctx, args), filter);
            const std::size_t offset = args.value("offset", 0);
            const std::size_t limit = args.value("limit", 15);
            json items = json::array();
            std::string text = all.empty() ? "No jobs." : fmt::format("{} job(s), newest first:", all.size());
            for (std::size_t i = offset; i < all.size() && i < offset + limit; ++i) {
              items.push_back(jobs::record_summary_json(all[i]));
              text += "\n- " + job_line(all[i]);
            }
            const bool more = offset + limit < all.size();
            if (more) text += fmt::format("\n(more: offset {})", offset + limit);
            return mcp::ToolResult::text(text, json{{"jobs", items},
                                                    {"total", all.size()},
                                                    {"next_offset", more ? json(offset + limit) : json(nullptr)}});
          },
  });
}

void add_cancel(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "cancel_job",
      .title = "Cancel a job",
      .description =
          "Stop a job: SIGTERM to all its processes, then after a grace period SIGKILL to the whole process "
          "tree (Slurm jobs: scancel). Returns the final status and the last lines of its output. A finished "
          "job is left as it is.",
      .input = instance_input(ctx.services.config, kInstanceWhat, {{"job_id", kJobIdArg}, {"tail", kTailArg}}, {"job_id"}),
      .output = job_schema(),
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            const std::string instance = instance_arg(ctx, args);
            const std::string job = string_arg(args, "job_id");
            ctx.services.jobs->cancel(instance, job, actor(rc));
            return result_of(ctx.services.jobs->view(instance, job, tail_of(args)));
          },
  });
}

}  // namespace

void add_job_tools(mcp::Server& server, const ToolContext& ctx) {
  add_submit(server, ctx);
  add_poll(server, ctx);
  add_list(server, ctx);
  add_cancel(server, ctx);
}

}  // namespace nshpc::tools
