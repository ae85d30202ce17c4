// A person's terminal in an instance's sandbox, relayed by the caller (terminal.hpp). The order
// of an open is in Service::open_terminal, top to bottom.
#include "instances/terminal.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/pty.hpp"

namespace nshpc::instances {

namespace {

// Whether `fd` becomes readable within `timeout` (nullopt: however long it takes).
bool readable_within(int fd, std::optional<std::chrono::milliseconds> timeout) {
  if (fd < 0) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(std::chrono::milliseconds(0));
  for (;;) {
    int wait_ms = -1;
    if (timeout) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::max<std::chrono::milliseconds::rep>(left.count(), 0));
    }
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, wait_ms);
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

}  // namespace

// What the registration's stop (a delete, archive or stop on another thread) and the terminal
// share: the execution, reached under the mutex only, and the terminal's slot in the service's
// count, given back when the last of them lets go.
struct Terminal::Shared {
  Shared(Service& service, std::string instance_id) : service(service), instance_id(std::move(instance_id)) {}
  ~Shared() {
    std::lock_guard lock(service.terminals_mutex_);
    auto it = service.terminals_.find(instance_id);
    if (it != service.terminals_.end() && --it->second == 0) service.terminals_.erase(it);
  }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  Service& service;
  const std::string instance_id;
  std::mutex mutex;
  std::unique_ptr<sandbox::Execution> execution;  // null once the terminal has let it go
};

std::unique_ptr<Terminal> Service::open_terminal(const store::Instance& inst, const TerminalRequest& request,
                                                 std::string_view actor) {
  // A slot first: nothing starts beyond the bounds.
  std::shared_ptr<Terminal::Shared> shared;
  {
    std::lock_guard lock(terminals_mutex_);
    std::size_t all = 0;
    for (const auto& [id, count] : terminals_) all += count;
    const auto it = terminals_.find(inst.id);
    const std::size_t here = it == terminals_.end() ? 0 : it->second;
    if (here >= kMaxTerminalsPerInstance)
      throw UsageError(fmt::format("instance {} has {} terminals open, the most there may be; close one first",
                                   inst.id, here));
    if (all >= kMaxTerminals)
      throw UsageError(fmt::format("{} terminals are open, the most this server keeps; close one first", all));
    ++terminals_[inst.id];
    // From here on the slot is the Shared's to give back.
    shared = std::make_shared<Terminal::Shared>(*this, inst.id);
  }

  auto terminal = std::make_unique<Terminal>(Terminal::Key{});
  terminal->service_ = this;
  terminal->instance_ = inst;
  terminal->argv_ = request.argv.empty() ? std::vector<std::string>{"/bin/bash", "-i"} : request.argv;
  terminal->actor_ = actor;

  // What `instance enter` runs, on a terminal of the size asked for, for an xterm-like screen.
  sandbox::ExecSpec spec = command(inst, Command::person, terminal->argv_);
  spec.env.emplace_back("TERM", "xterm-256color");
  Pty pty = open_pty();
  set_window_size(pty.master.get(), request.rows, request.cols);
  spec.stdio = {pty.slave.get(), pty.slave.get(), pty.slave.get()};
  spec.terminal = true;  // the controlling terminal of a session of its own: job control, Ctrl-C

  terminal->started_ = std::chrono::steady_clock::now();
  std::unique_ptr<sandbox::Execution> execution = execute(std::move(spec));
  pty.slave.reset();  // only the sandbox holds it now: EIO on the master once it is gone
  // A command joining a living sandbox has a terminal of the sandbox's own devpts instead (made
  // like this one, at this size): that is the one to relay.
  terminal->master_ = execution->terminal() >= 0 ? execution->terminal() : pty.master.get();
  terminal->own_master_ = std::move(pty.master);
  shared->execution = std::move(execution);
  terminal->shared_ = shared;
  terminal->registration_.emplace(register_execution(
      inst.id,
      [weak = std::weak_ptr<Terminal::Shared>(shared)] {
        if (auto s = weak.lock()) {
          std::lock_guard lock(s->mutex);
          if (s->execution) s->execution->kill_tree();
        }
      },
      fmt::format("a terminal ({})", actor)));
  return terminal;
}

void Terminal::resize(unsigned short rows, unsigned short cols) { set_window_size(master_, rows, cols); }

int Terminal::wait_fd() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->execution ? shared_->execution->wait_fd() : -1;
}

bool Terminal::ended() const {
  if (status_) return true;
  std::lock_guard lock(shared_->mutex);
  return !shared_->execution || shared_->execution->ended();
}

sandbox::ExitStatus Terminal::wait() {
  if (status_) return *status_;
  // Not under the mutex while it runs: a stop from another thread must get in.
  readable_within(wait_fd(), std::nullopt);
  {
    std::lock_guard lock(shared_->mutex);
    status_ = shared_->execution->wait();
  }
  audit(*status_, false);
  return *status_;
}

nlohmann::json person_run_fields(const store::Instance& inst, const std::vector<std::string>& command,
                                 const sandbox::ExitStatus& status, std::chrono::milliseconds took) {
  nlohmann::json fields = {{"instance_id", inst.id},
                           {"command", command},
                           {"network", config::to_string(inst.network)},
                           {"duration_ms", took.count()},
                           {"exit_code", status.exit_code},
                           {"started", status.started}};
  if (!status.error.empty()) fields["error"] = status.error;
  return fields;
}

void Terminal::audit(const sandbox::ExitStatus& status, bool closed) {
  if (audited_) return;
  audited_ = true;
  // The fields of `instance enter`'s line, and whether closing ended it.
  nlohmann::json fields = person_run_fields(
      instance_, argv_, status,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_));
  if (closed) fields["closed_while_running"] = true;
  try {
    service_->store().audit(instance_, "sandbox.enter", actor_, std::move(fields));
  } catch (const std::exception& e) {
    log::warn("instance {}: the audit line of a terminal could not be written: {}", instance_.id, e.what());
  }
}

Terminal::~Terminal() {
  if (!shared_) return;
  bool closed = false;
  try {
    if (!status_ && !ended()) {
      closed = true;
      // A hang-up first, as a terminal that goes away gives (a shell ends its jobs and exits),
      // when the master is ours to close. A command joined to a living sandbox has its terminal
      // made inside and owned by its execution, and TIOCSIG sends no SIGHUP on a pty (only
      // SIGINT, SIGQUIT, SIGTSTP): it is killed at once below.
      if (own_master_ && master_ == own_master_.get()) {
        own_master_.reset();
        master_ = -1;
        readable_within(wait_fd(), service_->grace());
      }
    }
    std::lock_guard lock(shared_->mutex);
    // Also after the command ended: what it left running in the background goes with it.
    shared_->execution->kill_tree();
    if (!status_) status_ = shared_->execution->wait();
    shared_->execution.reset();
  } catch (const std::exception& e) {
    log::warn("instance {}: ending a terminal: {}", instance_.id, e.what());
    std::lock_guard lock(shared_->mutex);
    shared_->execution.reset();  // its destructor kills what is left
  }
  registration_.reset();
  if (status_) audit(*status_, closed);
}

}  // namespace nshpc::instances
