// The tools of the mcp-virtual-computer entry point (`ns-hpc computer`): the seed's 0.2.3 surface
// (terminal_execute with sandbox_exec as Kilntainers' alias, read_file, write_file, edit_file),
// each with an optional computer_id, and the lifecycle tools (computer_list, computer_create,
// computer_restart, computer_factory_reset, computer_delete, set_network_access,
// set_desktop_environment) over instances::Computers.
//
// The file tools (tools/computer_files.cpp) reach every path of the computer (not only
// /workspace), as the seed's `docker exec` does, from this process, beneath the computer's own
// root and confined to its own files.
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "files/content.hpp"
#include "instances/computers.hpp"
#include "instances/instances.hpp"
#include "instances/snapshots.hpp"
#include "tools/computer_contract.hpp"
#include "tools/computer_files.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

constexpr std::chrono::minutes kImageWait{20};
const std::string kWorkspace = "/workspace";

struct State {
  ToolContext ctx;
  ComputerSettings settings;
  instances::Computers computers;
  instances::Trash trash{false};
  // Whether COMPUTER_ID's network has been set as the command line asks (once per server).
  std::mutex network_mutex;
  bool network_settled = false;

  State(const ToolContext& c, ComputerSettings s)
      : ctx(c),
        settings(std::move(s)),
        computers(c.services.instances, c.services.config.ns.default_image) {}
};
using StatePtr = std::shared_ptr<State>;

config::Network network_for(const State& st, bool on) { return on ? network_on_mode(st.ctx) : config::Network::off; }

// The image computers run on, built if missing; waits for a build in progress, with progress.
void wait_for_image(const State& st, mcp::RequestContext& rc) {
  const std::string& name = st.computers.image();
  if (name.empty()) return;  // acquire says what to set
  const sandbox::ImageStore images(st.ctx.services.config.ns.images_dir);
  if (images.current(name)) return;
  std::optional<sandbox::BuildProgress> build = images.building(name);
  if (!build && st.ctx.services.image_builds) build = st.ctx.services.image_builds->start({.name = name});
  if (!build) return;  // acquire says there is no such image and how to build it
  const auto start = std::chrono::steady_clock::now();
  double step = 0;
  for (; build; build = images.building(name)) {
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited > kImageWait)
      throw Error(fmt::format("the image '{}' is still being built after {} minutes; try again later", name,
                              kImageWait.count()));
    rc.progress(++step, std::nullopt,
                fmt::format("preparing the computer: building image '{}' ({} s; now: {})", name,
                            std::chrono::duration_cast<std::chrono::seconds>(waited).count(),
                            text::truncate_utf8(build->line, 200)));
    if (rc.wait_cancelled_for(std::chrono::seconds(1))) throw Error("cancelled");
  }
  if (!images.current(name))
    throw Error(fmt::format("the image '{}' could not be built; its log is {}/.building/{}.log", name,
                            st.ctx.services.config.ns.images_dir.string(), name));
}

// Switches a computer's network on or off, applied to its running sandbox at once.
store::Instance set_network(State& st, const store::Instance& inst, bool on, std::string_view who) {
  if ((inst.network != config::Network::off) == on) return inst;
  store::UpdateOptions options;
  options.network = network_for(st, on);
  store::Instance changed = st.ctx.services.instances.update(inst.id, options, who);
  st.ctx.services.instances.apply_network(changed, who);
  return changed;
}

// The computer a call works in: computer_id when given, else COMPUTER_ID's (made on first use).
store::Instance computer_for(State& st, const json& args, mcp::RequestContext& rc) {
  const std::string given = string_arg(args, "computer_id");
  const std::string id = given.empty() ? st.settings.computer_id : instances::validate_computer_id(given);
  if (id != st.settings.computer_id) return st.computers.get(id);
  if (!st.ctx.services.instances.store().exists(id)) wait_for_image(st, rc);
  store::Instance inst =
      st.computers.acquire(id, false, network_for(st, st.settings.network_access), "", actor(rc));
  // A computer found again takes the network the command line asks for (--no-network means
  // off, whatever an earlier server left); later set_network_access calls change it.
  std::lock_guard lock(st.network_mutex);
  if (!st.network_settled) {
    st.network_settled = true;
    inst = set_network(st, inst, st.settings.network_access, actor(rc));
  }
  return inst;
}

computer::ComputerFacts facts_of(const store::Instance& inst) {
  return {.computer_id = inst.id, .desktop_environment = false, .network_access = inst.network != config::Network::off};
}

// What every file and idle result carries.
json common(const store::Instance& inst, const char* operation) {
  return {{"operation", operation},          {"computer_id", inst.id},
          {"desktop_environment", false},    {"network_access", inst.network != config::Network::off},
          {"desktop_url", nullptr},          {"workspace_directory", kWorkspace}};
}

// The JSON object as the text and as structuredContent.
mcp::ToolResult json_result(json object) {
  std::string text = object.dump(-1, ' ', false, json::error_handler_t::replace);
  return mcp::ToolResult::text(std::move(text), std::move(object));
}

// An error's text for the agent: what needs an action says which of the computer's tools does it.
std::string error_text(const State& st, const std::exception& e) {
  if (const auto* needs = dynamic_cast<const NeedsAction*>(&e))
    return fmt::format("{}; {}", e.what(), computer::action_advice(*needs, st.settings.expose_lifecycle_tools));
  return e.what();
}

// An error as the seed answers it: isError with a JSON payload.
mcp::ToolResult json_error(json payload) {
  mcp::ToolResult r;
  r.is_error = true;
  r.content.push_back({{"type", "text"}, {"text", payload.dump(-1, ' ', false, json::error_handler_t::replace)}});
  return r;
}

// The handlers of the working tools: errors become {operation, computer_id, desktop_environment, error}.
ToolHandler working(StatePtr st, const char* operation,
                    std::function<mcp::ToolResult(State&, const json&, mcp::RequestContext&)> body) {
  return [st, operation, body = std::move(body)](const json& args, mcp::RequestContext& rc) {
    try {
      return body(*st, args, rc);
    } catch (const mcp::ProtocolError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string given = string_arg(args, "computer_id");
      return json_error({{"operation", operation},
                         {"computer_id", given.empty() ? st->settings.computer_id : given},
                         {"desktop_environment", false},
                         {"error", error_text(*st, e)}});
    }
  };
}

// The handlers of the lifecycle tools: errors become {"error": …} (the seed's Stage A tools).
ToolHandler managing(StatePtr st, std::function<mcp::ToolResult(State&, const json&, mcp::RequestContext&)> body) {
  return [st, body = std::move(body)](const json& args, mcp::RequestContext& rc) {
    try {
      return body(*st, args, rc);
    } catch (const mcp::ProtocolError&) {
      throw;
    } catch (const std::exception& e) {
      return json_error({{"error", error_text(*st, e)}});
    }
  };
}

// ---------------------------------------------------------------------------------------------
// terminal_execute

mcp::ToolResult terminal(State& st, const json& args, mcp::RequestContext& rc) {
  const config::Config& cfg = st.ctx.services.config;
  TerminalRequest req = parse_terminal_request(args, cfg, "", st.settings.shell, st.settings.timeout);
  const store::Instance inst = computer_for(st, args, rc);
  req.instance_id = inst.id;
  const sandbox::CaptureResult o =
      run_terminal_request(st.ctx, inst, req, static_cast<std::size_t>(st.settings.output_limit), rc);
  const std::int64_t ms = o.duration.count();
  switch (o.ending) {
    case sandbox::Ending::cancelled: throw Error("cancelled");
    case sandbox::Ending::timed_out:
      return json_result(computer::exec_result(facts_of(inst), "", computer::timeout_message(req.timeout), 124, ms));
    case sandbox::Ending::output_limit:
      return json_result(
          computer::exec_result(facts_of(inst), "", computer::output_limit_message(st.settings.output_limit), 1, ms));
    case sandbox::Ending::finished: break;
  }
  std::string err = text::sanitize_utf8(o.err);
  int exit_code = o.status.exit_code;
  if (!o.status.started) {
    // The sandbox could not run the command (bwrap says why on stderr): a shell's "not found".
    if (text::trim(err).empty())
      throw Error(o.status.error.empty() ? "the computer could not run the command" : o.status.error);
    exit_code = 127;
  }
  if (o.status.oom_killed) err += "\n[ns-hpc: out of memory: the command was killed at its memory limit]";
  return json_result(computer::exec_result(facts_of(inst), text::sanitize_utf8(o.out), err, exit_code, ms));
}

json terminal_input() {
  return input_object({{"command", {{"type", "string"}, {"description", "Shell command string (mutually exclusive with args)."}}},
                       {"args",
                        {{"type", "array"},
                         {"items", of_type("string")},
                         {"description", "List of arguments for direct execution (mutually exclusive with command)."}}},
                       {"stdin", {{"type", "string"}, {"description", "Content to pipe to stdin."}}},
                       {"working_directory",
                        {{"type", "string"}, {"description", "Working directory for the command (must be absolute)."}}},
                       {"timeout", {{"type", "integer"}, {"description", "Timeout in seconds (defaults to server config)."}}},
                       {"computer_id",
                        {{"type", "string"},
                         {"description", "Another computer (computer_create made it); default: this server's."}}}});
}

json terminal_output() {
  return output_object({{"computer_id", of_type("string")},
                        {"operation", of_type("string")},
                        {"desktop_environment", of_type("boolean")},
                        {"network_access", of_type("boolean")},
                        {"desktop_url", {{"type", {"string", "null"}}}},
                        {"stdout", of_type("string")},
                        {"stderr", of_type("string")},
                        {"exit_code", of_type("integer")},
                        {"exec_duration_ms", of_type("integer")}},
                       {"computer_id", "operation", "stdout", "stderr", "exit_code", "exec_duration_ms"});
}

const json kComputerArg = {{"type", "string"},
                           {"description", "Another computer (computer_create made it); default: this server's."}};

// ---------------------------------------------------------------------------------------------
// Lifecycle

json computer_json(const instances::ComputerInfo& c) {
  json out = instances::to_json(c);
  out["sandbox_id"] = c.computer_id;
  out["backend"] = "ns-hpc";
  out["image"] = c.root;
  return out;
}

json created_json(const store::Instance& inst) {
  return {{"ok", true},
          {"computer_id", inst.id},
          {"sandbox_id", inst.id},
          {"temporary", inst.meta.computer_temporary().value_or(false)}};
}

json idle_json(const State& st, const store::Instance& inst) {
  json out = common(inst, "idle");
  out["lifecycle_tools_exposed"] = st.settings.expose_lifecycle_tools;
  out["lifecycle_tools_model_visible"] = st.settings.expose_lifecycle_tools;
  return out;
}

std::string required_id(const json& args) {
  const std::string id = string_arg(args, "computer_id");
  if (id.empty()) throw UsageError("computer_id is required");
  return instances::validate_computer_id(id);
}

void add_lifecycle_tools(mcp::Server& server, const StatePtr& st) {
  const json id_required = input_object({{"computer_id", {{"type", "string"}, {"description", "The computer."}}}},
                                        {"computer_id"});
  const json changed = output_object({{"ok", of_type("boolean")},
                                      {"computer_id", of_type("string")},
                                      {"sandbox_id", of_type("string")},
                                      {"temporary", of_type("boolean")}},
                                     {"ok", "computer_id", "temporary"});
  add_tool(server, {
      .name = "computer_list",
      .title = "List computers",
      .description = "List the computers: id, temporary, state (running/stopped), network.",
      .input = input_object(json::object()),
      .output = output_object({{"computers", {{"type", "array"}, {"items", of_type("object")}}},
                               {"count", of_type("integer")}},
                              {"computers", "count"}),
      .hints = {.read_only = true},
      .handler = managing(st, [](State& s, const json&, mcp::RequestContext&) {
        json items = json::array();
        for (const auto& c : s.computers.list()) items.push_back(computer_json(c));
        const std::size_t count = items.size();
        return json_result({{"computers", std::move(items)}, {"count", count}});
      }),
  });
  add_tool(server, {
      .name = "computer_create",
      .title = "Create a computer",
      .description =
          "Create another computer (a Debian root of its own; installs persist). A temporary one (default) is deleted "
          "when this session ends; temporary=false keeps it. Use it with computer_id on the other tools.",
      .input = input_object(
          {{"computer_id",
            {{"type", "string"}, {"description", "Optional lowercase slug. Omit to generate a readable random ID."}}},
           {"temporary", {{"type", "boolean"}, {"description", "Delete it when this session ends (default true)."}}}}),
      .output = changed,
      .hints = {.destructive = false, .idempotent = false},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        const bool temporary = !args.contains("temporary") || args["temporary"].is_null() || args["temporary"].get<bool>();
        std::string id = string_arg(args, "computer_id");
        if (id.empty()) {
          do id = instances::random_computer_id();
          while (s.ctx.services.instances.store().exists(id));
        } else {
          id = instances::validate_computer_id(id);
        }
        if (!s.ctx.services.instances.store().exists(id)) wait_for_image(s, rc);
        const std::string owner = temporary ? instances::owner_key(rc.session_id()) : std::string();
        const store::Instance inst =
            s.computers.acquire(id, temporary, network_for(s, s.settings.network_access), owner, actor(rc));
        return json_result(created_json(inst));
      }),
  });
  add_tool(server, {
      .name = "computer_restart",
      .title = "Restart a computer",
      .description = "End every process of a computer and start it again; its files (installs, /workspace) stay.",
      .input = id_required,
      .output = changed,
      .hints = {.destructive = true, .idempotent = false},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        return json_result(created_json(s.computers.restart(required_id(args), actor(rc))));
      }),
  });
  add_tool(server, {
      .name = "computer_factory_reset",
      .title = "Factory reset a computer",
      .description = "Return a computer to a fresh image: installs, /workspace and every process go; id and network stay.",
      .input = id_required,
      .output = changed,
      .hints = {.destructive = true, .idempotent = true},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        return json_result(created_json(s.computers.factory_reset(required_id(args), s.trash, actor(rc))));
      }),
  });
  add_tool(server, {
      .name = "computer_delete",
      .title = "Delete a computer",
      .description = "Delete a computer with all its files, for good.",
      .input = id_required,
      .output = output_object({{"ok", of_type("boolean")}, {"computer_id", of_type("string")}, {"deleted", of_type("boolean")}},
                              {"ok", "computer_id", "deleted"}),
      .hints = {.destructive = true, .idempotent = false},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        const std::string id = required_id(args);
        s.computers.remove(id, actor(rc));
        return json_result({{"ok", true}, {"computer_id", id}, {"deleted", true}});
      }),
  });
  const json idle_output = output_object({{"operation", of_type("string")},
                                          {"computer_id", of_type("string")},
                                          {"desktop_environment", of_type("boolean")},
                                          {"network_access", of_type("boolean")},
                                          {"desktop_url", {{"type", {"string", "null"}}}},
                                          {"workspace_directory", of_type("string")},
                                          {"lifecycle_tools_exposed", of_type("boolean")},
                                          {"lifecycle_tools_model_visible", of_type("boolean")}},
                                         {"operation", "computer_id", "network_access"});
  add_tool(server, {
      .name = "set_network_access",
      .title = "Turn a computer's network on or off",
      .description =
          "enabled=false: the computer reaches nothing but itself; true: the network again. Applied at once, from "
          "outside the computer; its processes keep running.",
      .input = input_object({{"enabled", {{"type", "boolean"}, {"description", "Network on or off."}}},
                             {"computer_id", kComputerArg}},
                            {"enabled"}),
      .output = idle_output,
      .hints = {.destructive = false, .idempotent = true},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        const store::Instance current = computer_for(s, args, rc);
        return json_result(idle_json(s, set_network(s, current, args.at("enabled").get<bool>(), actor(rc))));
      }),
  });
  add_tool(server, {
      .name = "set_desktop_environment",
      .title = "Turn a computer's desktop on or off",
      .description = "Not available yet: computers have no desktop. enabled=false is accepted (nothing to turn off).",
      .input = input_object({{"enabled", {{"type", "boolean"}, {"description", "Desktop on or off."}}},
                             {"computer_id", kComputerArg}},
                            {"enabled"}),
      .output = idle_output,
      .hints = {.destructive = false, .idempotent = true},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        if (args.at("enabled").get<bool>())
          throw UsageError(
              "The desktop environment is not available yet: ns-hpc computers have no desktop (no screen, no "
              "desktop tools). Use terminal_execute; a desktop will come with a later release.");
        return json_result(idle_json(s, computer_for(s, args, rc)));
      }),
  });
}

}  // namespace

mcp::ServerOptions computer_server_options(const config::Config& config, Services services,
                                           std::string default_computer) {
  mcp::ServerOptions options;
  ToolContext ctx{services};
  // Audited in the computer's own log (the store's when it does not exist yet). No cut of the
  // text: the seed's output limit bounds a command's result, and its JSON must stay whole.
  options.on_tool_call = [ctx, default_computer](const std::string& tool, const mcp::json& args,
                                                 mcp::ToolResult& result, std::chrono::milliseconds duration,
                                                 mcp::RequestContext& rc) {
    const std::string given = string_arg(args, "computer_id");
    audit_tool_call(ctx, tool, args, result, duration, rc, given.empty() ? default_computer : given);
  };
  options.page_size = static_cast<std::size_t>(config.mcp.page_size);
  options.result_shape = mcp::ResultShape::both;  // the seed's: the JSON as text and as structuredContent
  return options;
}

void register_computer(mcp::Server& server, Services services, ComputerSettings settings) {
  auto st = std::make_shared<State>(ToolContext{services}, std::move(settings));
  // Temporary computers whose sessions ended with their server (a crash) go now.
  for (const std::string& id : st->computers.sweep("ns-hpc computer (start)"))
    log::info("deleted the temporary computer '{}': the sessions that held it are gone", id);
  server.set_session_closed([st](const std::string& session) {
    for (const std::string& id : st->computers.release(instances::owner_key(session), "mcp:session-end@" + session))
      log::info("deleted the temporary computer '{}': its last session ended", id);
  });

  const ComputerSettings& s = st->settings;
  const std::string description =
      computer::terminal_description(s.shell, s.timeout, s.tool_instruction_override, s.extended_tool_instruction);
  for (const char* name : {"terminal_execute", "sandbox_exec"}) {
    add_tool(server, {
        .name = name,
        .title = "Run a command in the computer",
        .description = description,
        .input = terminal_input(),
        .output = terminal_output(),
        .hints = {.destructive = true, .idempotent = false, .open_world = true},
        .handler = working(st, "terminal_execute", terminal),
    });
  }
  computer::add_file_tools(server, {
      .ctx = st->ctx,
      .computer_for = [st](const json& args, mcp::RequestContext& rc) { return computer_for(*st, args, rc); },
      .working =
          [st](const char* operation, computer::FileToolBody body) {
            return working(st, operation,
                           [body = std::move(body)](State&, const json& args, mcp::RequestContext& rc) {
                             return body(args, rc);
                           });
          },
      .common = common,
      .result = json_result,
      .computer_arg = kComputerArg,
  });
  if (s.expose_lifecycle_tools) add_lifecycle_tools(server, st);
}

}  // namespace nshpc::tools
