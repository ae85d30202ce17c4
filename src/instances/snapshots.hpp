// Factory reset and snapshots of an instance: its root layer (an instance on an image) and its
// workspace, each step in one fixed order for the MCP tools and the CLI alike. Nothing here knows
// MCP or the command line.
//
//   <base>/layer/{upper,work}                      the root layer (image instances)
//   <base>/snapshots/<name>/{layer,workspace,snapshot.json}
//   <instances_dir>/.deleting-<id>-<what>-<hex>    what is being made or thrown away
//
// Every tree that is being made or thrown away lives under a `.deleting-` name in the instances
// folder, which Service::finish_deletions() removes at the next start of the server: a crash at any
// moment leaves either the old tree or the new one in place, never half of one, and no litter.
// Trees change place by rename (an exchange where the filesystem has one), so a reset takes the
// same few milliseconds whatever the layer holds; the old tree is removed afterwards (Trash).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/json.hpp"
#include "instances/instances.hpp"
#include "store/store.hpp"

namespace nshpc::instances {

// Removes thrown-away trees on a thread of its own, one at a time, so no call waits for them.
// Destroyed with work left: with `finish_on_exit` (a CLI command: nothing else would free the
// space before the next server start) it waits for all of it; otherwise (the server) it finishes
// the tree in progress and leaves the rest to Service::finish_deletions() at the next start (their
// `.deleting-` names say so).
class Trash {
 public:
  explicit Trash(bool finish_on_exit);
  ~Trash();
  Trash(const Trash&) = delete;
  Trash& operator=(const Trash&) = delete;

  void add(std::filesystem::path tree);
  // Waits until every tree added so far is gone (tests, benchmarks).
  void drain();

 private:
  void run(std::stop_token stop);
  bool finish_on_exit_;
  std::mutex mutex_;
  std::condition_variable_any changed_;
  std::deque<std::filesystem::path> queue_;
  bool busy_ = false;
  std::jthread thread_;  // last: started once the rest exists, joined before it goes
};

// Throws UsageError when `name` is not a snapshot name (the instance id rule: 1-63 of
// A-Z a-z 0-9 _ . -, first a letter or digit).
void validate_snapshot_name(std::string_view name);

struct SnapshotInfo {
  std::string name;
  std::string created_at;  // ISO 8601 UTC
  std::string root;        // the instance's root when taken: "host" or "image:NAME@VERSION"
  std::uint64_t bytes = 0; // on disk (allocated blocks) when taken
  bool has_layer = false;  // a root layer is part of it (an image instance)
};
nlohmann::json to_json(const SnapshotInfo& info);
// snapshot.json's text as SnapshotInfo; nullopt when it is not one (the name is the folder's).
std::optional<SnapshotInfo> parse_snapshot(const std::string& name, const std::string& text);

// What a reset, a snapshot or a restore did.
struct LayerChange {
  Ended ended;                        // the living sandbox stopped for the change (its processes)
  bool restarted = false;             // ...and started again after it
  std::optional<SnapshotInfo> snapshot;
  bool layer = false;                 // the root layer changed (or was copied)
  bool workspace = false;             // the workspace changed (or was copied)
  std::chrono::microseconds took{0};  // the whole call, the stop included
  std::chrono::microseconds swap{0};  // reset/restore: the trees' change of place alone
};

class Snapshots {
 public:
  Snapshots(Service& instances, Trash& trash) : instances_(instances), store_(instances.store()), trash_(trash) {}

  // reset, take and restore hold the instance still while they change or copy its trees
  // (Service::hold_still): refused while a job of it has not ended or a command runs in it
  // (nothing is killed for them); a running living sandbox is stopped for the change and started
  // again after it (LayerChange::restarted).
  //
  // The root layer back to its image (an empty layer), and with `include_workspace` an empty
  // workspace too. Refused for an instance on the host's root without include_workspace (it has
  // no layer). Audited as instance.reset.
  LayerChange reset(const store::Instance& inst, bool include_workspace, std::string_view actor);
  // A copy of the root layer and the workspace, taken together. Refused when the name is taken. Audited as instance.snapshot_taken.
  LayerChange take(const store::Instance& inst, const std::string& name, std::string_view actor);
  // Newest first.
  std::vector<SnapshotInfo> list(const store::Instance& inst) const;
  // The layer and workspace replaced by copies of the snapshot (which stays). Audited as instance.snapshot_restored.
  LayerChange restore(const store::Instance& inst, const std::string& name, std::string_view actor);
  // Audited as instance.snapshot_deleted.
  SnapshotInfo remove(const store::Instance& inst, const std::string& name, std::string_view actor);

 private:
  SnapshotInfo find(const store::Instance& inst, const std::string& name) const;
  std::filesystem::path staging(const store::Instance& inst, std::string_view what) const;

  Service& instances_;
  const store::Store& store_;
  Trash& trash_;
};

}  // namespace nshpc::instances
