// The job engine's facade: checks a request, puts the pending job on record (the job store),
// hands it to the executor of its mode, and answers views, waits, lists and cancels.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "jobs/executor.hpp"
#include "jobs/job_store.hpp"
#include "jobs/jobs.hpp"
#include "jobs/support.hpp"
#include "sandbox/bwrap_argv.hpp"

namespace nshpc::jobs {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
constexpr std::size_t kMaxStdinBytes = 2 * 1024 * 1024;  // as terminal_execute's
}  // namespace

Engine::Engine(const config::Config& config, store::Store& store, sandbox::Backend& backend)
    : config_(config), store_(store), jobs_(std::make_unique<JobStore>(config, store)) {
  executors_[static_cast<int>(Mode::local)] = std::make_unique<LocalExecutor>(config, *jobs_, backend);
  executors_[static_cast<int>(Mode::slurm)] = std::make_unique<SlurmExecutor>(config, *jobs_);
}

Engine::~Engine() {
  // The executors stop watching first (their jobs keep running); the store goes last.
  for (auto& executor : executors_) executor.reset();
}

Executor& Engine::executor(Mode mode) { return *executors_[static_cast<int>(mode)]; }

std::size_t Engine::tracked() const { return jobs_->held_count(); }

void Engine::set_hooks(EngineHooks hooks) { jobs_->hooks = std::move(hooks); }

Record Engine::submit(const SubmitRequest& request, std::string_view actor) {
  if (request.argv.empty() || (request.argv.size() == 3 && request.argv[1] == "-c" &&
                               request.argv[2].find_first_not_of(" \t\r\n") == std::string::npos))
    throw UsageError("the command is empty; give the shell command to run");
  sandbox::check_command(request.argv, request.cwd);
  if (!request.cwd.empty() && request.cwd.front() != '/')
    throw UsageError("working_directory must be an absolute path, got: " + request.cwd);
  if (request.stdin_text.size() > kMaxStdinBytes)
    throw UsageError(fmt::format("stdin is {} bytes, over the 2 MiB limit; put the data in a file of the workspace and "
                                 "read it from there", request.stdin_text.size()));
  if (request.mode == Mode::slurm && (!request.cwd.empty() || !request.env.empty() || !request.stdin_text.empty()))
    throw UsageError("working_directory, env and stdin are for local jobs; in a Slurm job put them in the command "
                     "(cd DIR && NAME=value CMD < FILE)");
  Executor& ex = executor(request.mode);
  store::Instance inst = store_.get(request.instance_id);
  if (request.mode == Mode::slurm && inst.image)
    throw UsageError(fmt::format("instance '{}' runs on the image {}, whose root layer exists only on this host: a "
                                 "compute node has neither, so its jobs run locally (mode \"local\"); for Slurm, "
                                 "use an instance on the host's root",
                                 inst.id, inst.image->image));
  // Everything that can be refused is refused before anything is written.
  const auto limits = resolve_limits(request.limits, ex.limits());

  Record rec;
  rec.id = new_job_id();
  rec.mode = request.mode;
  rec.argv = request.argv;
  rec.cwd = request.cwd;
  rec.env = request.env;
  rec.stdin_text = request.stdin_text;
  rec.command = request.display.empty() ? text::shell_join(request.argv) : request.display;
  rec.limits = limits;
  rec.owner_pid = ::getpid();
  rec.owner_start = start_time_of(rec.owner_pid);
  // The instance is found again, its place reserved and the pending record written while no
  // archive or delete can run: one that comes after sees the job (on record, and held here) and
  // refuses; one that came before leaves no instance to write into.
  std::optional<JobStore::Reservation> place;
  store_.while_present(request.instance_id, [&](const store::Instance& found) {
    if (jobs_->hooks.instance_found) jobs_->hooks.instance_found(found.id);
    inst = found;
    place.emplace(*jobs_, inst.id, rec.id);
    rec.instance_id = inst.id;
    rec.created_at = timeutil::iso_utc();
    rec.stdout_path = (inst.workspace / output_relative(rec.id, "out")).string();
    rec.stderr_path = (inst.workspace / output_relative(rec.id, "err")).string();
    ex.prepare(inst, rec);
    fs::make_dirs(JobStore::dir(inst), 0700);
    for (const auto& folder : ex.folders(inst)) fs::make_dirs(folder, 0700);
    jobs_->save(inst, rec);  // pending: on record before anything runs
  });
  return ex.start(inst, std::move(rec), actor);
}

std::optional<Record> Engine::current_record(const store::Instance& inst, const std::string& job_id) {
  for (auto& ex : executors_)
    if (auto rec = ex->tracked(inst.id, job_id)) return rec;
  std::optional<Record> rec = jobs_->load(inst, job_id);
  if (!rec || is_final(rec->state)) return rec;
  adopt(inst, job_id);  // left by another process (it may have ended meanwhile)
  if (auto now = executor(rec->mode).tracked(inst.id, job_id)) return now;
  if (auto again = jobs_->load(inst, job_id)) return again;
  return rec;
}

void Engine::adopt(const store::Instance& inst, const std::string& job_id) {
  for (auto& ex : executors_)
    if (ex->tracked(inst.id, job_id)) return;
  if (jobs_->submitting(inst.id, job_id)) return;  // being started by this process
  auto rec = jobs_->load(inst, job_id);
  if (!rec || is_final(rec->state)) return;
  executor(rec->mode).adopt(inst, *rec);
}

View Engine::view(const std::string& instance_id, const std::string& job_id, const TailOptions& tail) {
  store::Instance inst = store_.get(instance_id);
  // A job id of the instance a typo away, for the caller's "did you mean".
  const auto near = [&] {
    NotFound::Facts facts;
    facts.near_miss = text::closest(job_id, jobs_->job_ids(inst)).value_or("");
    return facts;
  };
  if (!valid_job_id(job_id))
    throw NotFound(NotFound::Kind::job, fmt::format("'{}' is not a job id (job ids are 12 hex characters)", job_id),
                   near());
  const std::optional<Record> rec = current_record(inst, job_id);
  if (!rec)
    throw NotFound(NotFound::Kind::job, fmt::format("job '{}' not found in instance '{}'", job_id, instance_id), near());
  View v;
  v.record = *rec;
  executor(rec->mode).tails(inst, *rec, tail, v);
  v.stdout_sandbox_path = sandbox_path(inst, config_, rec->stdout_path);
  v.stderr_sandbox_path = sandbox_path(inst, config_, rec->stderr_path);
  v.duration_s = std::round(seconds_between(rec->started_at.empty() ? rec->created_at : rec->started_at,
                                            rec->finished_at) * 100) / 100;
  return v;
}

View Engine::wait(const std::string& instance_id, const std::string& job_id, std::chrono::milliseconds timeout,
                  const TailOptions& tail, const std::function<bool()>& interrupted,
                  const std::function<void(double, const View&)>& tick) {
  View v = view(instance_id, job_id, tail);
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto last_tick = start;
  while (!is_final(v.record.state) && Clock::now() < deadline) {
    if (interrupted && interrupted()) break;
    jobs_->wait_changed(Clock::now() + std::chrono::milliseconds(100));
    if (tick && Clock::now() - last_tick >= std::chrono::seconds(1)) {
      last_tick = Clock::now();
      tick(std::chrono::duration<double>(last_tick - start).count(), v);
    }
    v = view(instance_id, job_id, tail);
  }
  return v;
}

std::vector<Record> Engine::list(const std::string& instance_id, std::optional<State> filter) {
  store::Instance inst = store_.get(instance_id);
  std::vector<Record> out;
  for (const auto& id : jobs_->job_ids(inst)) {
    std::optional<Record> rec = current_record(inst, id);
    if (!rec) continue;
    if (!filter || rec->state == *filter) out.push_back(std::move(*rec));
  }
  std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.created_at > b.created_at; });
  return out;
}

Record Engine::cancel(const std::string& instance_id, const std::string& job_id, std::string_view actor) {
  View current = view(instance_id, job_id, {0, 0});
  if (is_final(current.record.state)) return current.record;
  executor(current.record.mode).cancel(store_.get(instance_id), job_id, actor);
  return view(instance_id, job_id, {0, 0}).record;
}

void Engine::recover() {
  const auto stale = stdfs::file_time_type::clock::now() - std::chrono::minutes(1);
  for (const auto& inst : store_.list().instances) {
    std::error_code ec;
    for (const auto& entry : stdfs::directory_iterator(JobStore::dir(inst), ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() == ".state") {
        adopt(inst, entry.path().stem().string());
      } else if (name.starts_with(".") && name.find(".tmp-") != std::string::npos &&
                 entry.last_write_time(ec) < stale) {
        stdfs::remove(entry.path(), ec);  // an atomic write cut short by a crash
      }
    }
  }
}

std::size_t Engine::active_jobs(const stdfs::path& instance_base) {
  std::size_t count = 0;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(instance_base / ".ns_hpc_jobs", ec)) {
    if (entry.path().extension() != ".state") continue;
    auto text = fs::read_file(entry.path());
    if (!text) continue;
    auto rec = Record::from_json(parse_json_or_discarded(*text));
    if (!rec || is_final(rec->state)) continue;
    // Held here (watched, or being submitted), or by what its executor finds on the host.
    if (jobs_->held(rec->instance_id, rec->id) || jobs_->submitting(rec->instance_id, rec->id) ||
        executor(rec->mode).holds_instance(*rec))
      ++count;
  }
  return count;
}

}  // namespace nshpc::jobs
