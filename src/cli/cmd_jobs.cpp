// ns-hpc instance run|status|jobs (jobs-list)|cancel: the job engine from the command line.
#include <cstdio>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "cli/output.hpp"

namespace nshpc::cli {

namespace {

struct JobArgs {
  std::string id;
  std::string job;
  std::vector<std::string> command;
  std::vector<std::string> limits;     // name=value
  std::vector<std::string> resources;  // name=value (Slurm)
  bool slurm = false;
  std::optional<jobs::State> status;
  int timeout = 60;
  int tail = 50;
  bool detach = true;
  bool json = false;
};

jobs::LimitRequest parse_limits(const std::vector<std::string>& specs, const char* flag = "-l memory=2048") {
  jobs::LimitRequest req;
  for (const auto& spec : specs) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("invalid value '{}' (use name=value, e.g. {})", spec, flag));
    const std::string value = spec.substr(eq + 1);
    std::size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(value, &used);
    } catch (const std::exception&) {
    }
    if (used != value.size() || value.empty())
      throw UsageError(fmt::format("values must be whole numbers, got '{}' in '{}'", value, spec));
    req.values[spec.substr(0, eq)] = n;
  }
  return req;
}

// Prints the job as the original did (plus the output tails), or JSON.
void print_view(const jobs::View& v, bool json) {
  if (json) {
    print_json(jobs::view_json(v));
    return;
  }
  std::string text = jobs::view_text(v);
  const jobs::Record& r = v.record;
  if (r.state == jobs::State::running || r.state == jobs::State::pending)
    text += fmt::format(" 'ns-hpc instance status {} {} -t SECONDS' waits for it, 'ns-hpc instance cancel {} {}' {} it.",
                        r.instance_id, r.id, r.instance_id, r.id, r.state == jobs::State::running ? "stops" : "removes");
  std::puts(text.c_str());
}

// Waits up to --timeout for the job (the output tails as --tail asks); with --no-detach one
// still running then is cancelled. `instance run` and `instance status`.
jobs::View wait_for_job(jobs::Engine& engine, const std::string& instance_id, const std::string& job_id,
                        const JobArgs& a) {
  const jobs::TailOptions tail{static_cast<std::size_t>(a.tail), 16 * 1024};
  jobs::View v = engine.wait(instance_id, job_id, std::chrono::seconds(a.timeout), tail);
  if (!jobs::is_final(v.record.state) && !a.detach && a.timeout > 0) {
    engine.cancel(instance_id, job_id, users::cli_actor());
    v = engine.view(instance_id, job_id, tail);
  }
  return v;
}

int exit_code_for(const jobs::View& v) {
  if (jobs::is_final(v.record.state) && v.record.state != jobs::State::completed &&
      v.record.state != jobs::State::cancelled)
    return v.record.exit_code && *v.record.exit_code != 0 ? *v.record.exit_code : 1;
  return 0;
}

}  // namespace

void add_job_commands(CLI::App& instance, Invocation& inv) {
  auto a = std::make_shared<JobArgs>();  // instance run

  auto* run = instance.add_subcommand(
      "run",
      "Run a command as a job: ns-hpc instance run ID [options] -- CMD [ARGS...]\n"
      "One word after -- is a shell command ([terminal] shell -c, default /bin/bash); several are run exactly as given.\n"
      "Waits up to --timeout seconds; a job still running then keeps running unless --no-detach.\n"
      "With --slurm it is submitted to the cluster with sbatch (-r cpus=2 -r memory=1024).");
  run->add_option("id", a->id, "Instance id")->required();
  run->add_option("command", a->command, "The command (after --)");
  run->add_option("-t,--timeout", a->timeout, "Seconds to wait (default 60)")->check(CLI::Range(0, 604800));
  run->add_option("--tail", a->tail, "Lines of output to show (default 50)")->check(CLI::Range(0, 1000));
  run->add_flag("--detach,!--no-detach", a->detach, "Keep the job running when the wait runs out (default)");
  auto* slurm =
      run->add_flag("--slurm", a->slurm, "Submit to the Slurm cluster (sbatch) instead of running on this node");
  // Local jobs take limits, Slurm jobs take resources.
  run->add_option("-l,--limit", a->limits,
                  "Resource limit name=value (cpus, memory MiB, pids, time s, output MiB) of a local job (--slurm "
                  "jobs take -r)")
      ->excludes(slurm);
  run->add_option("-r,--resource", a->resources,
                  "Slurm resource name=value from [jobs.slurm.limit] (e.g. cpus=2, memory=1024 MiB); with --slurm")
      ->needs(slurm);
  run->add_flag("--json", a->json, "Print JSON");
  run->callback([&inv, a] {
    const std::vector<std::string>& command = command_to_run(inv, a->command, "ns-hpc instance run ID -- CMD");
    if (a->timeout > inv.config().jobs.max_timeout)
      throw UsageError(fmt::format("--timeout {} is over the maximum of {} s ([jobs] max_timeout)", a->timeout,
                                   inv.config().jobs.max_timeout));
    jobs::SubmitRequest req;
    req.instance_id = a->id;
    if (command.size() == 1) {
      req.argv = {inv.config().terminal.shell, "-c", command.front()};
      req.display = command.front();
    } else {
      req.argv = command;
    }
    req.mode = a->slurm ? jobs::Mode::slurm : jobs::Mode::local;
    req.limits = a->slurm ? parse_limits(a->resources, "-r cpus=2") : parse_limits(a->limits);
    jobs::Engine& engine = inv.jobs();
    jobs::Record rec = engine.submit(req, users::cli_actor());
    jobs::View v = wait_for_job(engine, rec.instance_id, rec.id, *a);
    print_view(v, a->json);
    inv.exit_code = exit_code_for(v);
  });

  a = std::make_shared<JobArgs>();  // each command has its own defaults
  a->timeout = 0;
  auto* status = instance.add_subcommand("status", "Show a job, optionally waiting for it: ID JOB_ID");
  status->add_option("id", a->id, "Instance id")->required();
  status->add_option("job", a->job, "Job id")->required();
  status->add_option("-t,--timeout", a->timeout, "Seconds to wait for it to finish (default 0)")
      ->check(CLI::Range(0, 604800));
  status->add_option("--tail", a->tail, "Lines of output to show (default 50)")->check(CLI::Range(0, 1000));
  status->add_flag("--detach,!--no-detach", a->detach, "With a timeout: keep it running when the wait runs out");
  status->add_flag("--json", a->json, "Print JSON");
  status->callback([&inv, a] {
    print_view(wait_for_job(inv.jobs(), a->id, a->job, *a), a->json);
  });

  a = std::make_shared<JobArgs>();
  auto* list = instance.add_subcommand("jobs", "List an instance's jobs, newest first");
  list->alias("jobs-list");
  list->add_option("id", a->id, "Instance id")->required();
  add_choice(*list, "--status", a->status,
             named({jobs::State::pending, jobs::State::running, jobs::State::completed, jobs::State::failed,
                    jobs::State::cancelled, jobs::State::timed_out, jobs::State::lost, jobs::State::out_of_memory,
                    jobs::State::node_fail, jobs::State::preempted}),
             "Only jobs in this state");
  list->add_flag("--json", a->json, "Print a JSON array");
  list->callback([&inv, a] {
    auto all = inv.jobs().list(a->id, a->status);
    if (a->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : all) out.push_back(jobs::record_summary_json(r));
      print_json(out);
      return;
    }
    if (all.empty()) {
      std::puts("No jobs.");
      return;
    }
    std::vector<std::vector<std::string>> rows{{"JOB", "STATUS", "EXIT", "MODE", "CREATED", "COMMAND"}};
    for (const auto& r : all) {
      std::string mode = jobs::to_string(r.mode);
      if (r.mode == jobs::Mode::slurm) {
        mode = "slurm " + (r.slurm_job_id.empty() ? std::string("-") : r.slurm_job_id);
        if (!r.scheduler_state.empty()) mode += " " + r.scheduler_state;
        if (!r.scheduler_reason.empty() && r.scheduler_reason != "None") mode += " (" + r.scheduler_reason + ")";
      }
      rows.push_back({r.id, std::string(jobs::to_string(r.state)), r.exit_code ? std::to_string(*r.exit_code) : "-",
                      mode, short_time(r.created_at), r.command.substr(0, 60)});
    }
    print_table(rows);
  });

  a = std::make_shared<JobArgs>();
  auto* cancel = instance.add_subcommand("cancel", "Cancel a job (SIGTERM, then SIGKILL to the whole tree)");
  cancel->add_option("id", a->id, "Instance id")->required();
  cancel->add_option("job", a->job, "Job id")->required();
  cancel->add_flag("--json", a->json, "Print JSON");
  cancel->callback([&inv, a] {
    jobs::Engine& engine = inv.jobs();
    engine.cancel(a->id, a->job, users::cli_actor());
    print_view(engine.view(a->id, a->job, {50, 16 * 1024}), a->json);
  });
}

}  // namespace nshpc::cli
