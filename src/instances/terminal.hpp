// A person's terminal in an instance's sandbox for a face that relays it itself (the dashboard's
// live terminal): what `instance enter` gives a person on the command line — the same command
// description (Service::command, Command::person: the instance's limits, the sandbox's identity,
// the workspace as cwd), the same audit line (sandbox.enter) — on a pseudo-terminal whose master
// the caller reads and writes. A persistent instance's terminal joins its living sandbox; any
// other instance's gets a fresh sandbox of its own, as `instance enter`.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "instances/instances.hpp"
#include "sandbox/execution.hpp"
#include "store/store.hpp"

namespace nshpc::instances {

// Terminals this process has open at once: per instance and in all. Constants for now; opening
// one more is refused with a UsageError that says to close one first.
inline constexpr std::size_t kMaxTerminalsPerInstance = 4;
inline constexpr std::size_t kMaxTerminals = 32;

// The fields of the audit line of a command a person ran in `inst` (`ns-hpc bwrap`, `instance
// enter`, a dashboard terminal): the instance, the command, its network, how long it took and how
// it ended.
nlohmann::json person_run_fields(const store::Instance& inst, const std::vector<std::string>& command,
                                 const sandbox::ExitStatus& status, std::chrono::milliseconds took);

struct TerminalRequest {
  std::vector<std::string> argv;  // empty: /bin/bash -i, as `instance enter`
  unsigned short rows = 24;       // the window size the command starts with
  unsigned short cols = 80;
};

// An open terminal: its command runs until it ends or this object goes. Owned and used by one
// thread at a time (the relay's), except that a delete, archive or stop of the instance may end
// its sandbox from another thread at any time (it is registered as an execution of the instance,
// as "a terminal (<actor>)").
class Terminal {
  struct Key {  // only Service::open_terminal makes one
    explicit Key() = default;
  };

 public:
  explicit Terminal(Key) {}
  // Ends the command's whole tree unless it has ended: a hang-up of its terminal when the master
  // is this object's (a fresh sandbox), and at the latest after the service's grace ([jobs]
  // cancel_grace) SIGKILL to every process of it, background and setsid'd ones included (also
  // after the command ended: nothing it started is left running). Then the audit line, once.
  ~Terminal();
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  // The terminal's master, non-blocking: read the command's output from it (EIO once nothing
  // holds the terminal any more), write the person's input to it. Valid while this object lives.
  int fd() const { return master_; }
  // A new window size (TIOCSWINSZ): the command's foreground gets SIGWINCH. Throws SysError.
  void resize(unsigned short rows, unsigned short cols);
  // Readable (poll) once the command has ended.
  int wait_fd() const;
  bool ended() const;
  // Blocks until the command has ended; its exit status (128+N when signal N ended it). Writes
  // the audit line the first time. Later calls repeat the answer.
  sandbox::ExitStatus wait();

 private:
  friend class Service;
  struct Shared;  // the execution as its registration's stop reaches it
  void audit(const sandbox::ExitStatus& status, bool closed);

  Service* service_ = nullptr;
  store::Instance instance_;
  std::vector<std::string> argv_;
  std::string actor_;
  std::chrono::steady_clock::time_point started_;
  std::shared_ptr<Shared> shared_;  // holds the execution and the slot
  UniqueFd own_master_;             // the pty made here (relayed unless the backend made one inside)
  int master_ = -1;
  std::optional<sandbox::ExitStatus> status_;
  bool audited_ = false;
  std::optional<Service::Registration> registration_;  // gone first: no stop reaches a dead execution
};

}  // namespace nshpc::instances
