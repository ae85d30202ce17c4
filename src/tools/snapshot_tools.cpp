// factory_reset_instance, snapshot_instance, list_snapshots, restore_snapshot, delete_snapshot:
// adapters to instances::Snapshots.
#include <memory>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "instances/snapshots.hpp"
#include "tools/confirm.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

const json kInstanceIdArg = instance_id_arg();
const json kNameArg = {{"type", "string"}, {"description", "Snapshot name: 1-63 of A-Za-z0-9_.-."}};

// What snapshot_instance and restore_snapshot answer: instance_id, the snapshot (name, created_at,
// root: the instance's root when taken, bytes, has_layer), whether the living sandbox was stopped
// for the copy (was_running) and started again (restarted), took_ms.
const json kSnapshotChangeSchema = result_object({"snapshot", "restarted"});

// The tools share one Trash (instances/snapshots.hpp): old trees go in the background, and what is
// left when the server stops is finished at its next start.
struct SnapshotContext {
  ToolContext ctx;
  std::shared_ptr<instances::Trash> trash;

  store::Instance instance(const json& args) const { return ctx.services.instances.store().get(string_arg(args, "instance_id")); }
  template <typename F>
  auto with_snapshots(F&& f) const {
    instances::Snapshots snapshots{ctx.services.instances, *trash};
    return f(snapshots);
  }
};

// " Its processes were ended for it; its sandbox runs again (fresh)." and the data.
std::string stopped_text(const instances::LayerChange& change, json& out) {
  out["was_running"] = change.ended.was_running;
  out["restarted"] = change.restarted;
  std::string text;
  if (change.restarted)
    text = " Its sandbox was stopped for this (every process ended) and runs again.";
  else if (change.ended.was_running)
    text = " Its sandbox was stopped for this (every process ended); it starts again with the next command.";
  for (const auto& problem : change.ended.problems) text += " Warning: " + problem + ".";
  return text;
}

double ms(std::chrono::microseconds us) { return static_cast<double>(us.count()) / 1000.0; }

void add_reset(mcp::Server& server, const SnapshotContext& sc) {
  add_tool(server, {
      .name = "factory_reset_instance",
      .description = "Put an image instance's root back to its image (what was installed goes); ends its "
                     "processes. The workspace stays unless include_workspace.",
      .input = with_confirm(input_object({{"instance_id", kInstanceIdArg},
                             {"include_workspace", {{"type", "boolean"}, {"description", "Empty /workspace too."}}}},
                            {"instance_id"})),
      // instance_id, layer_reset, workspace_emptied, was_running, restarted, took_ms.
      .output = result_object({"layer_reset", "workspace_emptied"}),
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [sc, &server](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const bool workspace = args.value("include_workspace", false);
            if (!inst.image && !workspace)
              throw UsageError(fmt::format("instance '{}' runs on the host's root (read-only): it has no root of its "
                                           "own to reset; include_workspace: true empties its workspace",
                                           inst.id));
            confirm(sc.ctx, rc, "factory_reset_instance", args,
                    fmt::format("Factory-reset instance '{}'{}? What was changed since cannot be brought back.", inst.id,
                                workspace ? " and empty its workspace" : ""));
            const instances::LayerChange change =
                sc.with_snapshots([&](instances::Snapshots& s) { return s.reset(inst, workspace, actor(rc)); });
            server.notify_resource_updated(instance_uri(inst.id));
            json out = {{"instance_id", inst.id},
                        {"layer_reset", change.layer},
                        {"workspace_emptied", change.workspace},
                        {"took_ms", ms(change.took)}};
            const std::string stopped = stopped_text(change, out);
            std::string what = change.layer ? "its root is back to its image" : "";
            if (change.workspace) what += what.empty() ? "its workspace is empty" : " and its workspace is empty";
            return mcp::ToolResult::text(
                fmt::format("Reset instance '{}': {} ({:.0f} ms).{}{}", inst.id, what, ms(change.took), stopped,
                            change.workspace ? "" : " The workspace is kept."),
                std::move(out));
          },
  });
}

void add_snapshot(mcp::Server& server, const SnapshotContext& sc) {
  add_tool(server, {
      .name = "snapshot_instance",
      .description = "Save an instance's root (on an image) and workspace under a name; ends its processes. "
                     "restore_snapshot goes back to it.",
      .input = input_object({{"instance_id", kInstanceIdArg}, {"name", kNameArg}}, {"instance_id", "name"}),
      .output = kSnapshotChangeSchema,
      .hints = {.destructive = false, },
      .handler =
          [sc, &server](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const std::string name = string_arg(args, "name");
            const instances::LayerChange change =
                sc.with_snapshots([&](instances::Snapshots& s) { return s.take(inst, name, actor(rc)); });
            server.notify_resource_updated(instance_uri(inst.id));
            json out = {{"instance_id", inst.id}, {"snapshot", to_json(*change.snapshot)}, {"took_ms", ms(change.took)}};
            const std::string stopped = stopped_text(change, out);
            return mcp::ToolResult::text(
                fmt::format("Took snapshot '{}' of instance '{}' ({}workspace, {:.1f} MiB, {:.0f} ms).{}", name,
                            inst.id, change.layer ? "root and " : "", change.snapshot->bytes / 1048576.0,
                            ms(change.took), stopped),
                std::move(out));
          },
  });
}

void add_list(mcp::Server& server, const SnapshotContext& sc) {
  add_tool(server, {
      .name = "list_snapshots",
      .description = "An instance's snapshots, newest first.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      // instance_id, snapshots (as in snapshot_instance's result), count.
      .output = result_object({"snapshots"}),
      .hints = {.read_only = true},
      .handler =
          [sc](const json& args, mcp::RequestContext&) {
            const store::Instance inst = sc.instance(args);
            const auto all = sc.with_snapshots([&](instances::Snapshots& s) { return s.list(inst); });
            json items = json::array();
            std::string text = all.empty() ? fmt::format("Instance '{}' has no snapshots.", inst.id)
                                           : fmt::format("Instance '{}' has {} snapshot(s), newest first:", inst.id,
                                                         all.size());
            for (const auto& s : all) {
              items.push_back(to_json(s));
              text += fmt::format("\n- {} ({}, {:.1f} MiB)", s.name, s.created_at.substr(0, 19) + "Z",
                                  s.bytes / 1048576.0);
            }
            return mcp::ToolResult::text(text,
                                         json{{"instance_id", inst.id}, {"snapshots", items}, {"count", items.size()}});
          },
  });
}

void add_restore(mcp::Server& server, const SnapshotContext& sc) {
  add_tool(server, {
      .name = "restore_snapshot",
      .description = "Put an instance's root and workspace back as a snapshot saved them; ends its processes. The "
                     "snapshot stays.",
      .input = with_confirm(input_object({{"instance_id", kInstanceIdArg}, {"name", kNameArg}}, {"instance_id", "name"})),
      .output = kSnapshotChangeSchema,
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [sc, &server](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const std::string name = string_arg(args, "name");
            confirm(sc.ctx, rc, "restore_snapshot", args,
                    fmt::format("Restore snapshot '{}' over instance '{}'? Its changes since are lost.", name, inst.id));
            const instances::LayerChange change =
                sc.with_snapshots([&](instances::Snapshots& s) { return s.restore(inst, name, actor(rc)); });
            server.notify_resource_updated(instance_uri(inst.id));
            json out = {{"instance_id", inst.id}, {"snapshot", to_json(*change.snapshot)}, {"took_ms", ms(change.took)}};
            const std::string stopped = stopped_text(change, out);
            return mcp::ToolResult::text(
                fmt::format("Restored snapshot '{}' of instance '{}': its {}workspace are as they were at {} ({:.0f} "
                            "ms).{}",
                            name, inst.id, change.layer ? "root and " : "", change.snapshot->created_at,
                            ms(change.took), stopped),
                std::move(out));
          },
  });
}

void add_delete(mcp::Server& server, const SnapshotContext& sc) {
  add_tool(server, {
      .name = "delete_snapshot",
      .description = "Delete a snapshot for good.",
      .input = with_confirm(input_object({{"instance_id", kInstanceIdArg}, {"name", kNameArg}}, {"instance_id", "name"})),
      .output = result_object({"deleted"}),
      .hints = {.destructive = true, },
      .handler =
          [sc](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const std::string name = string_arg(args, "name");
            confirm(sc.ctx, rc, "delete_snapshot", args,
                    fmt::format("Delete snapshot '{}' of instance '{}' for good?", name, inst.id));
            const instances::SnapshotInfo gone =
                sc.with_snapshots([&](instances::Snapshots& s) { return s.remove(inst, name, actor(rc)); });
            return mcp::ToolResult::text(
                fmt::format("Deleted snapshot '{}' of instance '{}' ({:.1f} MiB).", name, inst.id, gone.bytes / 1048576.0),
                json{{"instance_id", inst.id}, {"deleted", name}});
          },
  });
}

}  // namespace

void add_snapshot_tools(mcp::Server& server, const ToolContext& ctx) {
  const SnapshotContext sc{ctx, std::make_shared<instances::Trash>(/*finish_on_exit=*/false)};
  add_reset(server, sc);
  add_snapshot(server, sc);
  add_list(server, sc);
  add_restore(server, sc);
  add_delete(server, sc);
}

}  // namespace nshpc::tools
