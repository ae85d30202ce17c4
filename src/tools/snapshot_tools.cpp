// factory_reset_instance, snapshot_instance, list_snapshots, restore_snapshot, delete_snapshot:
// adapters to instances::Snapshots.
#include <memory>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "instances/snapshots.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

const json kInstanceIdArg = instance_id_arg();
const json kNameArg = {{"type", "string"}, {"description", "Snapshot name: 1-63 of A-Z a-z 0-9 _ . - (first a letter or digit)."}};

const json kSnapshotSchema = output_object({{"name", of_type("string")},
                                            {"created_at", {{"type", "string"}, {"format", "date-time"}}},
                                            {"root", of_type("string")},  // the instance's root when taken
                                            {"bytes", of_type("integer")},
                                            {"has_layer", of_type("boolean")}},
                                           {"name", "created_at", "bytes"});

// What snapshot_instance and restore_snapshot answer: the snapshot, and whether the living
// sandbox was stopped for the copy and started again.
const json kSnapshotChangeSchema = output_object({{"instance_id", of_type("string")},
                                                 {"snapshot", kSnapshotSchema},
                                                 {"was_running", of_type("boolean")},
                                                 {"restarted", of_type("boolean")},
                                                 {"took_ms", of_type("number")}},
                                                {"instance_id", "snapshot", "was_running", "restarted"});

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
      .title = "Factory reset an instance",
      .description =
          "Return an image instance's root to its image (what was installed goes) in milliseconds. Refused while "
          "a job or command runs in it; its background processes end. The workspace stays unless include_workspace.",
      .input = input_object({{"instance_id", kInstanceIdArg},
                             {"include_workspace",
                              {{"type", "boolean"}, {"description", "Empty the workspace too (default false)."}}}},
                            {"instance_id"}),
      .output = output_object({{"instance_id", of_type("string")},
                               {"layer_reset", of_type("boolean")},
                               {"workspace_emptied", of_type("boolean")},
                               {"was_running", of_type("boolean")},
                               {"restarted", of_type("boolean")},
                               {"took_ms", of_type("number")}},
                              {"instance_id", "layer_reset", "workspace_emptied", "was_running", "restarted"}),
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [sc, &server](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const bool workspace = args.value("include_workspace", false);
            if (!inst.image && !workspace)
              throw UsageError(fmt::format("instance '{}' runs on the host's root (read-only): it has no root of its "
                                           "own to reset; include_workspace: true empties its workspace",
                                           inst.id));
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
      .title = "Snapshot an instance",
      .description =
          "Save an instance's root (image instances) and workspace together under a name. Refused while a job or "
          "command runs in it; its background processes end. restore_snapshot brings them back.",
      .input = input_object({{"instance_id", kInstanceIdArg}, {"name", kNameArg}}, {"instance_id", "name"}),
      .output = kSnapshotChangeSchema,
      .hints = {.destructive = false, .idempotent = false},
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
      .title = "List an instance's snapshots",
      .description = "An instance's snapshots, newest first: name, time, size.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      .output = output_object({{"instance_id", of_type("string")},
                               {"snapshots", {{"type", "array"}, {"items", kSnapshotSchema}}},
                               {"count", of_type("integer")}},
                              {"instance_id", "snapshots", "count"}),
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
      .title = "Restore a snapshot",
      .description =
          "Put an instance's root and workspace back as a snapshot saved them. Refused while a job or command runs "
          "in it; its background processes end. The snapshot stays.",
      .input = input_object({{"instance_id", kInstanceIdArg}, {"name", kNameArg}}, {"instance_id", "name"}),
      .output = kSnapshotChangeSchema,
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [sc, &server](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const std::string name = string_arg(args, "name");
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
      .title = "Delete a snapshot",
      .description = "Delete one of an instance's snapshots for good.",
      .input = input_object({{"instance_id", kInstanceIdArg}, {"name", kNameArg}}, {"instance_id", "name"}),
      .output = output_object({{"instance_id", of_type("string")}, {"deleted", of_type("string")}},
                              {"instance_id", "deleted"}),
      .hints = {.destructive = true, .idempotent = false},
      .handler =
          [sc](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = sc.instance(args);
            const std::string name = string_arg(args, "name");
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
