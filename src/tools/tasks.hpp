// Jobs as MCP tasks: an mcp::TaskStore over the job engine, for both task wires (the 2026-07-28
// Tasks extension and 2025-11-25's experimental tasks; the MCP core speaks them). A job already
// is what a task models: work a client starts, follows and collects later, kept on record across
// disconnects and server restarts; so a task is nothing but a view of its job, and tasks survive
// a restart because jobs do.
//
// A task's id is "<instance>/<job>": job ids are unique only within their instance, and the
// engine finds a job through its instance.
//
// Its fields: pending and running jobs are `working`; a cancelled job is `cancelled`; every other
// final state (completed, failed, timed_out, out_of_memory, lost, ...) is `completed` with the
// result a finished poll_job gives, a non-zero exit code included (a task is `failed` only for a
// JSON-RPC error, which a job never is). createdAt and lastUpdatedAt come from the record; ttl is
// unlimited (null), since finished job records are kept as long as their instance is; the poll
// interval is 1 s for local jobs and the scheduler's poll interval for Slurm jobs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jobs/jobs.hpp"
#include "mcp/server.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

std::string job_task_id(std::string_view instance_id, std::string_view job_id);

// How often a client is asked to poll a local job's task. The engine notices a job's end within
// 100 ms; a second keeps a waiting client cheap without making it wait long for the result.
inline constexpr std::int64_t kLocalJobPollMs = 1000;

// The task of a job record, without its result (pure; `slurm_poll_ms` is for Slurm jobs).
mcp::Task job_task(const jobs::Record& record, std::int64_t slurm_poll_ms);

class JobTasks final : public mcp::TaskStore {
 public:
  // A finished job's result as this entry point's poll_job gives it.
  using ResultOf = std::function<mcp::ToolResult(const jobs::View& view)>;
  // The instances whose jobs a caller's tasks/list shows.
  using Visible = std::function<std::vector<std::string>(mcp::RequestContext& rc)>;

  JobTasks(ToolContext ctx, jobs::TailOptions tail, ResultOf result_of, Visible visible);

  // Jobs that `tool` started as its tasks give their result as `result_of` shapes it (e.g.
  // terminal_execute's), from a view with `tail`. Before the first use.
  void add_result_shape(std::string tool, jobs::TailOptions tail, ResultOf result_of);

  // The task of a job just submitted (its record exists: tasks/get finds it at once). `tool`: a
  // tool of add_result_shape whose task it is, noted beside the job (it survives a restart);
  // empty: the jobs' own result (poll_job's).
  mcp::Task of_job(const std::string& instance_id, const std::string& job_id, const std::string& tool = {});

  // A job that waits for the user's yes before it is submitted (submit_job: a Slurm job above
  // [mcp] confirm_slurm_cpu_hours, for a client with the Tasks extension). The job store keeps
  // only jobs handed to an executor (a pending record whose submitter is gone counts as lost),
  // so the request is kept here, beside the job records (<instance>/.ns_hpc_tasks/<id>.confirm):
  // a task in input_required whose inputRequests ask `what` (confirm.hpp's elicitation);
  // tasks/update with a yes submits it (working, then the job's own course), a no or
  // tasks/cancel ends it cancelled, nothing submitted. A restart keeps all of it.
  mcp::Task awaiting_confirmation(const jobs::SubmitRequest& request, const std::string& what);

  mcp::Task get(const std::string& id, mcp::RequestContext& rc) override;
  mcp::Task cancel(const std::string& id, mcp::RequestContext& rc) override;
  // The answer to a confirmation (key "confirm"); anything else is ignored, as the extension lets
  // a server ignore responses to requests it does not have outstanding.
  void update(const std::string& id, const mcp::json& input_responses, mcp::RequestContext& rc) override;
  std::vector<mcp::Task> list(std::size_t start, std::size_t count, std::size_t& total,
                              mcp::RequestContext& rc) override;

 private:
  // The instance and job an id names; ProtocolError(kInvalidParams) saying why when it names
  // none: not an id of this server, its instance archived or gone.
  std::pair<std::string, std::string> resolve(const std::string& id) const;
  struct Shape {
    jobs::TailOptions tail;
    ResultOf result_of;
  };
  // The shape of a job's result: its tool's, noted when the task was made, else the jobs' own.
  const Shape& shape_of(const std::string& instance_id, const std::string& job_id) const;
  mcp::Task of_view(const jobs::View& view, const Shape& shape) const;
  std::int64_t slurm_poll_ms() const;
  // The task of a job awaiting confirmation (`note`: its record), or of the job it became.
  mcp::Task confirmation_task(const std::string& id, const std::string& instance_id, const mcp::json& note);

  // Answers to confirmations are taken one at a time: a job is submitted once.
  std::mutex confirm_mutex_;

  ToolContext ctx_;
  Shape plain_;
  std::map<std::string, Shape> shapes_;  // by tool
  Visible visible_;
};

// ns-hpc run's job tasks: results shaped as its poll_job's (tools/job_tools.cpp).
std::shared_ptr<JobTasks> run_job_tasks(const ToolContext& ctx);
// The tools of ns-hpc run that answer with tasks over `tasks` (these replace the declarations of
// tools/internal.hpp without it): submit_job, poll_job, list_jobs, cancel_job; and
// terminal_execute, which becomes a task only as tools/terminal.cpp says (null: never).
void add_job_tools(mcp::Server& server, const ToolContext& ctx, std::shared_ptr<JobTasks> tasks);
void add_terminal_tool(mcp::Server& server, const ToolContext& ctx, std::shared_ptr<JobTasks> tasks);


}  // namespace nshpc::tools
