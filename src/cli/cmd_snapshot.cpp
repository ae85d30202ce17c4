// ns-hpc instance reset|snapshot|snapshots|snapshot-restore|snapshot-delete: flat verbs beside
// the other `instance` commands (as list-archived is), each taking the instance id first.
#include <cstdio>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "cli/output.hpp"
#include "instances/snapshots.hpp"

namespace nshpc::cli {

namespace {

struct SnapshotArgs {
  std::string id;
  std::string name;
  bool include_workspace = false;
  bool force = false;
  bool json = false;
};

// Runs `f` with the instance's Snapshots. The Trash finishes removing the old trees before the
// command exits (after its result is printed): a CLI user may never start a server, whose next
// start would otherwise be what frees the space.
template <typename F>
void with_snapshots(Invocation& inv, F&& f) {
  instances::Trash trash(/*finish_on_exit=*/true);
  instances::Snapshots snapshots{inv.instances(), trash};
  f(snapshots);
  std::fflush(stdout);
}

nlohmann::json change_json(const store::Instance& inst, const instances::LayerChange& change) {
  nlohmann::json out = {{"id", inst.id},
                        {"layer", change.layer},
                        {"workspace", change.workspace},
                        {"was_running", change.ended.was_running},
                        {"restarted", change.restarted},
                        {"took_ms", change.took.count() / 1000.0}};
  if (change.swap.count() > 0) out["swap_ms"] = change.swap.count() / 1000.0;
  if (change.snapshot) out["snapshot"] = instances::to_json(*change.snapshot);
  if (!change.ended.problems.empty()) out["problems"] = change.ended.problems;
  return out;
}

void print_stopped(const instances::LayerChange& change) {
  for (const auto& problem : change.ended.problems) std::printf("Warning: %s\n", problem.c_str());
  if (change.restarted)
    std::printf("Stopped its sandbox for this (every process ended) and started it again.\n");
  else if (change.ended.was_running)
    std::printf("Stopped its sandbox for this (every process ended); it starts again with the next command.\n");
}

bool confirmed(Invocation& inv, const SnapshotArgs& a, const std::string& question) {
  if (a.force || confirm(question)) return true;
  std::fprintf(stderr, "Aborted.\n");
  inv.exit_code = 1;
  return false;
}

void add_reset(CLI::App& parent, Invocation& inv) {
  auto a = std::make_shared<SnapshotArgs>();
  auto* cmd = parent.add_subcommand(
      "reset", "Factory reset: an image instance's root back to its image (refused while a job or command runs; its "
               "background processes end); the workspace stays unless --include-workspace");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--include-workspace", a->include_workspace, "Empty the workspace too");
  cmd->add_flag("-f,--force", a->force, "Do not ask for confirmation");
  cmd->add_flag("--json", a->json, "Print what was done as JSON");
  cmd->callback([&inv, a] {
    const store::Instance inst = inv.store().get(a->id);
    if (!inst.image && !a->include_workspace)
      throw UsageError(fmt::format("instance '{}' runs on the host's root (read-only): it has no root of its own to "
                                   "reset; --include-workspace empties its workspace",
                                   inst.id));
    const std::string what = std::string(inst.image ? "its installed software and root changes" : "") +
                             (inst.image && a->include_workspace ? " and " : "") +
                             (a->include_workspace ? "its workspace" : "");
    if (!confirmed(inv, *a, fmt::format("Reset instance '{}'? This discards {}.", inst.id, what))) return;
    with_snapshots(inv, [&](instances::Snapshots& s) {
      const instances::LayerChange change = s.reset(inst, a->include_workspace, users::cli_actor());
      if (a->json) return print_json(change_json(inst, change));
      print_stopped(change);
      std::printf("Reset instance '%s': %s%s%s in %.1f ms (the trees changed place in %.1f ms).\n", inst.id.c_str(),
                  change.layer ? "its root is back to its image" : "", change.layer && change.workspace ? " and " : "",
                  change.workspace ? "its workspace is empty" : "", change.took.count() / 1000.0,
                  change.swap.count() / 1000.0);
    });
  });
}

void add_snapshot(CLI::App& parent, Invocation& inv) {
  auto a = std::make_shared<SnapshotArgs>();
  auto* cmd = parent.add_subcommand(
      "snapshot", "Save an instance's root layer (image instances) and workspace under NAME (refused while a job or command "
                  "runs; its background processes end)");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("name", a->name, "Snapshot name: 1-63 of A-Z a-z 0-9 _ . -, starting with a letter or digit")
      ->required();
  cmd->add_flag("--json", a->json, "Print the snapshot as JSON");
  cmd->callback([&inv, a] {
    const store::Instance inst = inv.store().get(a->id);
    instances::validate_snapshot_name(a->name);
    with_snapshots(inv, [&](instances::Snapshots& s) {
      const instances::LayerChange change = s.take(inst, a->name, users::cli_actor());
      if (a->json) return print_json(change_json(inst, change));
      print_stopped(change);
      std::printf("Took snapshot '%s' of instance '%s' (%sworkspace, %.1f MiB) in %.1f ms.\n", a->name.c_str(),
                  inst.id.c_str(), change.layer ? "root layer and " : "", change.snapshot->bytes / 1048576.0,
                  change.took.count() / 1000.0);
    });
  });
}

void add_list(CLI::App& parent, Invocation& inv) {
  auto a = std::make_shared<SnapshotArgs>();
  auto* cmd = parent.add_subcommand("snapshots", "List an instance's snapshots, newest first");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--json", a->json, "Print a JSON array");
  cmd->callback([&inv, a] {
    const store::Instance inst = inv.store().get(a->id);
    with_snapshots(inv, [&](instances::Snapshots& s) {
      const auto all = s.list(inst);
      if (a->json) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& info : all) out.push_back(instances::to_json(info));
        return print_json(out);
      }
      if (all.empty()) {
        std::printf("Instance '%s' has no snapshots ('ns-hpc instance snapshot %s NAME' takes one).\n",
                    inst.id.c_str(), inst.id.c_str());
        return;
      }
      std::vector<std::vector<std::string>> rows{{"NAME", "CREATED", "SIZE", "CONTENTS"}};
      for (const auto& info : all)
        rows.push_back({info.name, short_time(info.created_at), fmt::format("{:.1f} MiB", info.bytes / 1048576.0),
                        info.has_layer ? "root layer, workspace" : "workspace"});
      print_table(rows);
    });
  });
}

void add_restore(CLI::App& parent, Invocation& inv) {
  auto a = std::make_shared<SnapshotArgs>();
  auto* cmd = parent.add_subcommand(
      "snapshot-restore",
      "Replace an instance's root layer and workspace by copies of snapshot NAME (refused while a job or command "
      "runs; its background processes end; the snapshot stays)");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("name", a->name, "Snapshot name (ns-hpc instance snapshots ID)")->required();
  cmd->add_flag("-f,--force", a->force, "Do not ask for confirmation");
  cmd->add_flag("--json", a->json, "Print what was done as JSON");
  cmd->callback([&inv, a] {
    const store::Instance inst = inv.store().get(a->id);
    instances::validate_snapshot_name(a->name);
    if (!confirmed(inv, *a,
                   fmt::format("Restore snapshot '{}' of instance '{}'? Its current {}workspace are discarded.",
                               a->name, inst.id, inst.image ? "root layer and " : "")))
      return;
    with_snapshots(inv, [&](instances::Snapshots& s) {
      const instances::LayerChange change = s.restore(inst, a->name, users::cli_actor());
      if (a->json) return print_json(change_json(inst, change));
      print_stopped(change);
      std::printf("Restored snapshot '%s' (taken %s) into instance '%s' in %.1f ms.\n", a->name.c_str(),
                  short_time(change.snapshot->created_at).c_str(), inst.id.c_str(), change.took.count() / 1000.0);
    });
  });
}

void add_delete(CLI::App& parent, Invocation& inv) {
  auto a = std::make_shared<SnapshotArgs>();
  auto* cmd = parent.add_subcommand("snapshot-delete", "Delete an instance's snapshot NAME for good");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("name", a->name, "Snapshot name (ns-hpc instance snapshots ID)")->required();
  cmd->add_flag("-f,--force", a->force, "Do not ask for confirmation");
  cmd->callback([&inv, a] {
    const store::Instance inst = inv.store().get(a->id);
    instances::validate_snapshot_name(a->name);
    if (!confirmed(inv, *a, fmt::format("Delete snapshot '{}' of instance '{}'? This cannot be undone.", a->name,
                                        inst.id)))
      return;
    with_snapshots(inv, [&](instances::Snapshots& s) {
      s.remove(inst, a->name, users::cli_actor());
      std::printf("Deleted snapshot '%s' of instance '%s'.\n", a->name.c_str(), inst.id.c_str());
    });
  });
}

}  // namespace

void add_snapshot_commands(CLI::App& instance, Invocation& inv) {
  add_reset(instance, inv);
  add_snapshot(instance, inv);
  add_list(instance, inv);
  add_restore(instance, inv);
  add_delete(instance, inv);
}

}  // namespace nshpc::cli
