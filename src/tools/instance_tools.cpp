// create_instance, list_instances, list_archived_instances, describe_instance, update_instance,
// archive_instance, delete_instance.
#include <chrono>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

const json kInstanceIdArg = {
    {"type", "string"},
    {"description", "Instance id: 1-63 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit."}};

const json kNetworkArg = {{"type", "string"},
                          {"enum", {"host", "off"}},
                          {"description", "'host': the sandbox shares the host's network namespace: the internet where the "
                                          "host has it, but also every service on the host's loopback and its "
                                          "abstract Unix sockets (X11, D-Bus). 'off': no network at all, only its "
                                          "own loopback."}};

const json kInstanceSchema = output_object(
    {{"id", of_type("string")},
     {"description", of_type("string")},
     {"created_at", {{"type", "string"}, {"description", "ISO 8601, UTC"}}},
     {"last_activity", {{"type", "string"}, {"description", "ISO 8601, UTC"}}},
     {"network", {{"type", "string"}, {"enum", {"host", "off"}}}},
     {"hostname", of_type("string")},
     {"workspace", {{"type", "string"}, {"description", "path of the persistent workspace inside the sandbox"}}},
     {"output", {{"type", "string"}, {"description", "path of the persistent output folder inside the sandbox"}}}},
    {"id", "created_at", "last_activity", "network", "workspace", "output"});

std::optional<config::Network> arg_network(const json& args) {
  auto it = args.find("network");
  if (it == args.end()) return std::nullopt;
  return config::parse_network(it->get<std::string>());
}

std::string describe_line(const store::Instance& inst) {
  std::string line = fmt::format("{}  (network {}, last activity {})", inst.id, config::to_string(inst.network),
                                 timeutil::iso_utc(inst.last_activity()).substr(0, 19) + "Z");
  if (!inst.meta.description().empty()) line += " — " + inst.meta.description();
  return line;
}

void add_create(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "create_instance",
      .title = "Create a sandbox instance",
      .description =
          "Create a new instance: a persistent Linux workspace whose commands run in a fresh, hardened "
          "bubblewrap sandbox (no root, read-only system, private /tmp). Files in its workspace (/workspace, "
          "also $HOME) and output folder (/output) persist between commands. Leave instance_id empty to get a "
          "readable generated id such as 'calm-otter-3f2a'. Returns the new instance. Fails if the id is "
          "taken or invalid.",
      .input = input_object({{"instance_id", kInstanceIdArg},
                             {"description", {{"type", "string"}, {"description", "What the instance is for."}}},
                             {"network", kNetworkArg}}),
      .output = kInstanceSchema,
      .hints = {.destructive = false, .idempotent = false},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::CreateOptions options;
            options.description = string_arg(args, "description");
            options.network = arg_network(args);
            store::Instance inst = ctx.services.store.create(string_arg(args, "instance_id"), options, actor(rc));
            server.notify_resource_list_changed();
            return mcp::ToolResult::text(
                fmt::format("Created instance '{}' (network {}). Its workspace is {} inside the sandbox and "
                            "persists between commands; results meant to be kept go to {}.",
                            inst.id, config::to_string(inst.network), ctx.services.config.ns.workspace_mount,
                            ctx.services.config.ns.output_mount),
                agent_instance_json(ctx, inst));
          },
  });
}

void add_list(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "list_instances",
      .title = "List instances",
      .description =
          "List the active (not archived) instances, sorted by id, with their description, network mode and "
          "last activity. Use it to find an instance to work in before creating a new one.",
      .input = input_object(json::object()),
      .output = output_object({{"instances", {{"type", "array"}, {"items", kInstanceSchema}}},
                               {"count", of_type("integer")}},
                              {"instances", "count"}),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json&, mcp::RequestContext&) {
            store::Listing listing = ctx.services.store.list();
            json items = json::array();
            std::string text = listing.instances.empty() ? "No instances yet; create one with create_instance."
                                                         : fmt::format("{} instance(s):", listing.instances.size());
            for (const auto& inst : listing.instances) {
              items.push_back(agent_instance_json(ctx, inst));
              text += "\n- " + describe_line(inst);
            }
            for (const auto& bad : listing.corrupt) text += fmt::format("\n(skipped '{}': {})", bad.id, bad.problem);
            return mcp::ToolResult::text(text, json{{"instances", items}, {"count", items.size()}});
          },
  });
}

void add_list_archived(mcp::Server& server, const ToolContext& ctx) {
  const json archive = output_object({{"name", of_type("string")},
                                      {"id", of_type("string")},
                                      {"archived_at", of_type("string")},
                                      {"created_at", of_type("string")},
                                      {"description", of_type("string")}},
                                     {"name", "id"});
  add_tool(server, {
      .name = "list_archived_instances",
      .title = "List archived instances",
      .description =
          "List archived instances with the archive name (<id>__<timestamp>) and when they were archived. "
          "Archived instances keep their files on the host but accept no commands.",
      .input = input_object(json::object()),
      .output = output_object({{"archives", {{"type", "array"}, {"items", archive}}}, {"count", of_type("integer")}},
                              {"archives", "count"}),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json&, mcp::RequestContext&) {
            auto archived = ctx.services.store.list_archived();
            json items = json::array();
            std::string text =
                archived.empty() ? "No archived instances." : fmt::format("{} archived instance(s):", archived.size());
            for (const auto& a : archived) {
              items.push_back({{"name", a.name},
                               {"id", a.id},
                               {"archived_at", a.meta.archived_at()},
                               {"created_at", a.meta.created_at()},
                               {"description", a.meta.description()}});
              text += fmt::format("\n- {} (archived {})", a.name,
                                  a.meta.archived_at().empty() ? "?" : a.meta.archived_at());
            }
            return mcp::ToolResult::text(text, json{{"archives", items}, {"count", items.size()}});
          },
  });
}

void add_describe(mcp::Server& server, const ToolContext& ctx) {
  json output = kInstanceSchema;
  output["properties"]["disk_usage"] = {
      {"type", "object"},
      {"description", "bytes on disk (allocated blocks) of the workspace and output folder, and their file count"},
      {"properties",
       {{"workspace_bytes", of_type("integer")}, {"output_bytes", of_type("integer")}, {"files", of_type("integer")}}}};
  add_tool(server, {
      .name = "describe_instance",
      .title = "Describe an instance",
      .description =
          "Show one instance: description, creation time, last activity, network mode, the sandbox paths of "
          "its workspace and output folder, and their disk use.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      .output = std::move(output),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext&) {
            store::Instance inst = ctx.services.store.get(string_arg(args, "instance_id"));
            json out = agent_instance_json(ctx, inst);
            const store::Store::DiskUse use = ctx.services.store.disk_use(inst);
            out["disk_usage"] = {
                {"workspace_bytes", use.workspace_bytes}, {"output_bytes", use.output_bytes}, {"files", use.files}};
            std::string text = fmt::format(
                "Instance '{}'\nDescription: {}\nCreated: {}\nLast activity: {}\nNetwork: {}\nWorkspace: {} "
                "({:.1f} MiB)\nOutput: {} ({:.1f} MiB)\nFiles: {}",
                inst.id, inst.meta.description().empty() ? "(none)" : inst.meta.description(),
                out["created_at"].get<std::string>(), out["last_activity"].get<std::string>(),
                config::to_string(inst.network), out["workspace"].get<std::string>(),
                use.workspace_bytes / 1048576.0, out["output"].get<std::string>(), use.output_bytes / 1048576.0,
                use.files);
            return mcp::ToolResult::text(text, out);
          },
  });
}

void add_update(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "update_instance",
      .title = "Update an instance",
      .description =
          "Change an instance's description and/or network mode ('host' or 'off'; applies to the next "
          "command). Returns the updated instance. Give at least one of description and network.",
      .input = input_object({{"instance_id", kInstanceIdArg},
                             {"description", {{"type", "string"}, {"description", "New description."}}},
                             {"network", kNetworkArg}},
                            {"instance_id"}),
      .output = kInstanceSchema,
      .hints = {.destructive = false, .idempotent = true},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::UpdateOptions options;
            if (args.contains("description")) options.description = string_arg(args, "description");
            options.network = arg_network(args);
            if (!options.description && !options.network)
              throw UsageError("nothing to update: give description and/or network");
            store::Instance inst = ctx.services.store.update(string_arg(args, "instance_id"), options, actor(rc));
            server.notify_resource_updated(instance_uri(inst.id));
            return mcp::ToolResult::text(fmt::format("Updated instance '{}': description \"{}\", network {}.",
                                                     inst.id, inst.meta.description(), config::to_string(inst.network)),
                                         agent_instance_json(ctx, inst));
          },
  });
}

void add_archive(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "archive_instance",
      .title = "Archive an instance",
      .description =
          "Archive an instance: it disappears from list_instances and accepts no more commands; its files "
          "stay on the host under the returned archive name, and the id can be used again. Refused while jobs "
          "run in it.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      .output = output_object({{"instance_id", of_type("string")},
                               {"archive_name", of_type("string")},
                               {"archived_at", of_type("string")}},
                              {"instance_id", "archive_name"}),
      .hints = {.destructive = true, .idempotent = false},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            const std::string id = string_arg(args, "instance_id");
            store::ArchivedInstance archived = ctx.services.store.archive(id, actor(rc));
            server.notify_resource_list_changed();
            server.notify_resource_updated(instance_uri(id));
            return mcp::ToolResult::text(
                fmt::format("Archived instance '{}' as {}.", id, archived.name),
                json{{"instance_id", id}, {"archive_name", archived.name}, {"archived_at", archived.meta.archived_at()}});
          },
  });
}

void add_delete(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "delete_instance",
      .title = "Delete an instance for good",
      .description =
          "Permanently delete an instance (instance_id) or an archived instance (archive_name, as listed by "
          "list_archived_instances), with its workspace and output. This cannot be undone; prefer "
          "archive_instance when the files may be needed later. Refused while jobs run.",
      .input = input_object(
          {{"instance_id", kInstanceIdArg},
           {"archive_name", {{"type", "string"}, {"description", "Name of an archived instance (<id>__<timestamp>)."}}}}),
      .output = output_object({{"deleted", of_type("string")}, {"archived", of_type("boolean")}}, {"deleted", "archived"}),
      .hints = {.destructive = true, .idempotent = false},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            const std::string id = string_arg(args, "instance_id");
            const std::string archive = string_arg(args, "archive_name");
            if (id.empty() == archive.empty()) throw UsageError("give exactly one of instance_id and archive_name");
            if (!id.empty()) {
              ctx.services.store.remove(id, actor(rc));
              server.notify_resource_list_changed();
              server.notify_resource_updated(instance_uri(id));
            } else {
              ctx.services.store.remove_archived(archive, actor(rc));
            }
            const std::string what = id.empty() ? archive : id;
            return mcp::ToolResult::text(
                fmt::format("Deleted {} '{}' with its workspace and output.", id.empty() ? "archive" : "instance", what),
                json{{"deleted", what}, {"archived", id.empty()}});
          },
  });
}

}  // namespace

void add_instance_tools(mcp::Server& server, const ToolContext& ctx) {
  add_create(server, ctx);
  add_list(server, ctx);
  add_list_archived(server, ctx);
  add_describe(server, ctx);
  add_update(server, ctx);
  add_archive(server, ctx);
  add_delete(server, ctx);
}

}  // namespace nshpc::tools
