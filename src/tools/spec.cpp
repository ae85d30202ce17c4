// Declaring tools: the spec turned into an mcp::Tool, the schema fragments every tool shares,
// and reading arguments.
#include <fmt/format.h>

#include "base/error.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

using mcp::json;

// Only what differs from MCP's defaults (readOnlyHint false, destructiveHint true, idempotentHint
// false, openWorldHint true): a client reads the same, the model reads less every turn.
json annotations(const Hints& hints) {
  json out = json::object();
  if (hints.read_only) out["readOnlyHint"] = true;
  if (!hints.read_only && hints.destructive == false) out["destructiveHint"] = false;
  if (!hints.read_only && hints.idempotent == true) out["idempotentHint"] = true;
  if (!hints.open_world) out["openWorldHint"] = false;
  return out;
}

void add_tool(mcp::Server& server, ToolSpec spec) {
  mcp::Tool tool;
  tool.name = std::move(spec.name);
  tool.description = std::move(spec.description);
  tool.input_schema = std::move(spec.input);
  tool.output_schema = std::move(spec.output);
  if (json hints = annotations(spec.hints); !hints.empty()) tool.annotations = std::move(hints);
  tool.accept_input_wrapper = true;
  tool.listed = spec.listed;
  tool.shown = std::move(spec.shown);
  tool.meta = std::move(spec.meta);
  tool.task_support = spec.task_support;
  // What is not found is said with the tool that brings it back or lists what there is; what
  // needs an action, with the tool that does it or the operator who can.
  tool.handler = [handler = std::move(spec.handler)](const json& args, mcp::RequestContext& rc) {
    try {
      return handler(args, rc);
    } catch (const NotFound& e) {
      throw UsageError(fmt::format("{}; {}", e.what(), not_found_advice(e)));
    } catch (const NeedsAction& e) {
      throw Error(fmt::format("{}; {}", e.what(), needs_action_advice(e)));
    }
  };
  server.add_tool(std::move(tool));
}

std::string not_found_advice(const NotFound& e) {
  const NotFound::Facts& f = e.facts();
  if (e.kind() == NotFound::Kind::instance && !f.archive_name.empty())
    return fmt::format("restore_instance brings it back (archive_name '{}')", f.archive_name);
  std::string advice = f.near_miss.empty() ? "" : fmt::format("did you mean '{}'? ", f.near_miss);
  switch (e.kind()) {
    case NotFound::Kind::instance: return advice + "list_instances lists the active ones";
    case NotFound::Kind::job: return advice + "list_jobs lists the instance's jobs";
    case NotFound::Kind::archive: return advice + "list_archived_instances lists the archives";
    case NotFound::Kind::image:
      return advice + "create the instance without an image (on the host's root), or ask the server's operator for "
                      "the image";
  }
  return advice;
}

std::string needs_action_advice(const NeedsAction& e) {
  switch (e.action()) {
    case NeedsAction::Action::choose_network:
      return "update_instance with network 'filtered' or 'off' gives it a network that works here";
    case NeedsAction::Action::reset_instance:
      return "factory_reset_instance puts its root back to the image, or restore_snapshot to a snapshot's";
    case NeedsAction::Action::build_image:
      return "create the instance without an image, or ask the server's operator to build the image as the user "
             "who runs the server";
    case NeedsAction::Action::check_id_ranges:
      return "ask the server's operator to check the ranges in /etc/subuid and /etc/subgid (`ns-hpc doctor` checks "
             "them)";
    case NeedsAction::Action::check_host:
      return "try again; if it fails again, ask the server's operator to run `ns-hpc doctor`, which checks what "
             "sandboxes need here";
  }
  return "ask the server's operator to run `ns-hpc doctor`";
}

json of_type(const char* type) { return {{"type", type}}; }

json input_object(json properties, std::vector<std::string> required) {
  json schema = {{"type", "object"}, {"properties", std::move(properties)}, {"additionalProperties", false}};
  if (!required.empty()) schema["required"] = std::move(required);
  return schema;
}

json instance_id_arg(const std::string& fallback) {
  return {{"type", "string"},
          {"description", fallback.empty() ? std::string("Instance id.") : fmt::format("Instance id. Default: '{}'.", fallback)}};
}

json instance_input(const config::Config& cfg, json properties,
                    std::vector<std::string> required) {
  // Described the same in every tool (the tool's own description says what it does there).
  const std::string& fallback = cfg.mcp.default_instance;
  properties["instance_id"] = instance_id_arg(fallback);
  if (fallback.empty()) required.insert(required.begin(), "instance_id");
  return input_object(std::move(properties), std::move(required));
}

json output_object(json properties, std::vector<std::string> required) {
  return {{"type", "object"}, {"properties", std::move(properties)}, {"required", std::move(required)}};
}

json result_object(std::vector<std::string> required) {
  return {{"type", "object"}, {"required", std::move(required)}};
}

json command_properties(const config::Config& cfg) {
  const json str = of_type("string");
  return {
      {"command", {{"type", "string"}, {"description", fmt::format("Shell command ({} -c).", cfg.terminal.shell)}}},
      {"args", {{"type", "array"}, {"items", str}, {"description", "Or: program and arguments, run as given."}}},
      {"stdin", {{"type", "string"}, {"description", "Text for stdin (at most 2 MiB)."}}},
      {"working_directory",
       {{"type", "string"}, {"description", fmt::format("Absolute start directory (default {}).", cfg.ns.workspace_mount)}}},
      {"env", {{"type", "object"}, {"additionalProperties", str}, {"description", "Extra variables: {\"NAME\": \"value\"}."}}},
  };
}

std::vector<std::pair<std::string, std::string>> env_arg(const json& args) {
  std::vector<std::pair<std::string, std::string>> env;
  auto it = args.find("env");
  if (it == args.end() || it->is_null()) return env;
  if (!it->is_object()) throw UsageError("env must be an object of NAME: \"value\" strings.");
  for (const auto& [name, value] : it->items()) {
    const bool valid_name =
        !name.empty() && !(name[0] >= '0' && name[0] <= '9') &&
        name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
    if (!valid_name)
      throw UsageError(fmt::format("env: '{}' is not a variable name (letters, digits and _, not starting with a digit).",
                                   name));
    if (!value.is_string()) throw UsageError(fmt::format("env: the value of {} must be a string.", name));
    env.emplace_back(name, value.get<std::string>());
  }
  return env;
}

std::string string_arg(const json& args, const char* name) {
  auto it = args.find(name);
  return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace nshpc::tools
