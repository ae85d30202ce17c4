// The computers of the mcp-virtual-computer entry point (`ns-hpc computer`): instances on the
// default image that never stop for idleness, marked as computers in their metadata, either
// permanent (the COMPUTER_ID one, kept until deleted) or temporary (held by the MCP sessions
// that acquired them and deleted when the last one ends).
//
// Holders are on record in the instance's folder (<base>/owners/<pid>.<start time>.<session>),
// so several server processes share one computer (one per stdio client) and a holder whose
// process is gone (a crash) no longer counts: sweep() deletes what only such holders kept. Every
// acquire and release holds <instances_dir>/.computers.lock, so a computer being deleted is never
// acquired half-way. Nothing here knows MCP.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.hpp"
#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "instances/snapshots.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::instances {

// The seed's computer id rule (1-63 of [a-z0-9-], a letter or digit at both ends), its message
// word for word.
inline constexpr std::string_view kComputerIdRule =
    "computer_id must be 1-63 lowercase letters, numbers, or hyphens; it must start and end with a letter or number.";
bool is_computer_id(std::string_view id);
// What Python's str.strip() removes: the seed trims ids and flags with it.
inline constexpr std::string_view kPythonSpace = " \t\n\r\v\f";
// The rule on the id with surrounding whitespace trimmed (as the seed strips it); returns it.
// Throws UsageError with kComputerIdRule.
std::string validate_computer_id(std::string_view id);
// A readable random id from the seed's word lists: "<adjective>-<noun>-<4 hex digits>".
std::string random_computer_id();

// "<pid>.<start time>.<session>": a holder in this process (`session` as the MCP session names
// itself; characters other than [A-Za-z0-9_-] become '_').
std::string owner_key(std::string_view session);
// Whether the process a key names still runs: same pid and start time, and not ended (a zombie
// that was never reaped keeps both).
bool owner_alive(std::string_view key);
// "<pid>.<start time>.~lease": this process's lease, the holder of the temporary computers that
// requests without a session (MCP 2026-07-28) made. It holds while this process runs and until
// the time its record's mtime says (set on every renewal to then + the lease); a session's key
// never has '~'.
std::string lease_key();
bool is_lease_key(std::string_view key);

struct ComputerInfo {
  std::string computer_id;
  bool temporary = false;
  std::string state;  // "running", "stopped" or "unknown"
  std::string root;   // "image:NAME@VERSION"
  std::string created_at;
  config::Network network = config::Network::off;
  std::size_t holders = 0;  // live sessions holding a temporary computer
};
nlohmann::json to_json(const ComputerInfo& info);

class Computers {
 public:
  // `image`: what new computers run on (the default image). `lease`: how long a lease holds
  // after its last renewal (ns-hpc computer's --session-timeout).
  Computers(Service& instances, std::string image, std::chrono::seconds lease = std::chrono::seconds(300));

  const std::string& image() const { return image_; }

  // The computer `id`, created when there is none (on the image, never idle-stopping, with
  // `network`), else checked: an instance that is not a computer is refused, and so is one whose
  // temporary flag differs, with the seed's two messages: "… lifecycle mode cannot be changed …"
  // for one this object acquired before, "… requested temporary=…" for one found on disk.
  // `owner`, when not empty, holds a temporary computer until release(). `created` says which it
  // was.
  // `desktop`: a new computer is made on [desktop] image with its desktop on (an existing one is
  // left as it is).
  store::Instance acquire(const std::string& id, bool temporary, config::Network network, std::string_view owner,
                          std::string_view actor, bool* created = nullptr, bool desktop = false);
  // A computer by id; NotFound (Kind::instance, its near_miss a computer's id) "Computer 'x' was
  // not found." otherwise, an ordinary instance too.
  store::Instance get(const std::string& id) const;
  // Drops `owner`'s hold on every computer; deletes each temporary one no live holder keeps any
  // more. Returns the ids deleted.
  std::vector<std::string> release(std::string_view owner, std::string_view actor);
  // Deletes the temporary computers whose holders have all ended without a release (a crash),
  // or whose leases ran out.
  std::vector<std::string> sweep(std::string_view actor);
  // Extends this process's lease on computer `id` to the lease from now, when it holds one (a
  // call that names the computer); false when it holds none.
  bool renew(const std::string& id);
  // Deletes the temporary computers this process leased whose leases ran out and that nothing
  // else holds; returns their ids. Cheap when it leases none (a timer calls it).
  std::vector<std::string> expire_leases(std::string_view actor);
  std::chrono::seconds lease() const { return lease_; }
  std::vector<ComputerInfo> list() const;

  // Every process ends and the sandbox starts again; files (root layer, workspace) kept.
  store::Instance restart(const std::string& id, std::string_view actor);
  // Back to the image: the root layer and the workspace emptied; same id, network and flag.
  store::Instance factory_reset(const std::string& id, Trash& trash, std::string_view actor);
  // Its jobs and processes end, then it goes with its files.
  void remove(const std::string& id, std::string_view actor);

 private:
  ComputerInfo info(const store::Instance& inst) const;
  // Live holders of a computer (the records of ended processes are removed on the way).
  std::size_t live_holders(const store::Instance& inst) const;
  // Deletes `inst` when it is temporary and nothing holds it; true when it did. Lock held.
  bool delete_if_unheld(const store::Instance& inst, std::string_view actor);
  void remove_locked(const store::Instance& inst, std::string_view actor);
  std::filesystem::path lock_file() const;

  Service& instances_;
  const store::Store& store_;
  std::string image_;
  std::chrono::seconds lease_;
  // The computers this process holds a lease on (the timer looks at these only).
  std::set<std::string> leased_;  // guarded by held_mutex_
  // The computers acquired through this object (the seed's registry of this process) and not
  // deleted since.
  mutable std::mutex held_mutex_;
  std::set<std::string> held_;
  bool held(const std::string& id) const;
  void forget(const std::string& id);
};

}  // namespace nshpc::instances
