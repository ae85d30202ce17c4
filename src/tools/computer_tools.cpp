// The tools of the mcp-virtual-computer entry point (`ns-hpc computer`): the seed's 0.2.3 surface
// (terminal_execute with sandbox_exec as Kilntainers' alias, read_file, write_file, edit_file),
// each with an optional computer_id, and the lifecycle tools (computer_list, computer_create,
// computer_restart, computer_factory_reset, computer_delete, set_network_access,
// set_desktop_environment) over instances::Computers.
//
// The file tools work inside the computer, as its own user, like the seed's `docker exec`: every
// path of the computer is reachable (not only /workspace), and what the server does is bounded by
// what the sandbox may do. Calls share no lock: each runs its own process in the living sandbox.
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
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

constexpr std::size_t kFileTextLimit = 1048576;                 // the seed's file_text_limit
constexpr std::size_t kFileOutputCap = kFileTextLimit + 65536;  // the file and what the script says
constexpr std::int64_t kFileTimeout = 60;
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

// ---------------------------------------------------------------------------------------------
// Files, inside the computer

// A small script run in the computer: `sh -c SCRIPT sh ARGS…`, stdin given, output capped.
struct Script {
  int exit_code = 0;
  std::string out, err;
};
Script run_script(State& st, const store::Instance& inst, const std::string& script, std::vector<std::string> args,
                  std::string input, mcp::RequestContext& rc) {
  TerminalRequest req;
  req.instance_id = inst.id;
  req.argv = {"/bin/sh", "-c", script, "sh"};
  req.argv.insert(req.argv.end(), args.begin(), args.end());
  req.stdin_text = std::move(input);
  req.working_directory = kWorkspace;
  req.timeout = kFileTimeout;
  const sandbox::CaptureResult o = run_terminal_request(st.ctx, inst, req, kFileOutputCap, rc);
  switch (o.ending) {
    case sandbox::Ending::cancelled: throw Error("cancelled");
    case sandbox::Ending::timed_out: throw Error(fmt::format("the file operation took over {} s", kFileTimeout));
    case sandbox::Ending::output_limit: throw Error("the file grew while it was read; read it again");
    case sandbox::Ending::finished: break;
  }
  if (!o.status.started) throw Error("the computer could not run the file operation: " + std::string(text::trim(o.err)));
  return {o.status.exit_code, o.out, o.err};
}

std::string path_of(const json& args) {
  const std::string path = string_arg(args, "path");
  if (path.empty()) throw UsageError("path is required (absolute, or relative to /workspace)");
  if (path.find('\0') != std::string::npos) throw UsageError("path must not contain a NUL byte");
  return path;
}

// The path as the seed shows it: absolute, relative ones under /workspace.
std::string shown_path(const std::string& path) { return path.front() == '/' ? path : kWorkspace + "/" + path; }

// Exit codes of the scripts below, each a message.
constexpr int kMissing = 66, kNotRegular = 67, kTooBig = 68, kNoParent = 69, kChanged = 73;

// Reads the whole file (at most kFileTextLimit bytes) in the computer.
std::string read_in(State& st, const store::Instance& inst, const std::string& path, mcp::RequestContext& rc) {
  static const std::string script = fmt::format(
      "f=$1\n"
      "[ -e \"$f\" ] || [ -L \"$f\" ] || exit {missing}\n"
      "[ -f \"$f\" ] || exit {irregular}\n"
      "s=$(stat -L -c %s -- \"$f\") || exit 1\n"
      "[ \"$s\" -le {limit} ] || {{ echo \"$s\" >&2; exit {big}; }}\n"
      "exec cat -- \"$f\"\n",
      fmt::arg("missing", kMissing), fmt::arg("irregular", kNotRegular), fmt::arg("limit", kFileTextLimit),
      fmt::arg("big", kTooBig));
  const Script r = run_script(st, inst, script, {path}, "", rc);
  const std::string shown = shown_path(path);
  switch (r.exit_code) {
    case 0: break;
    case kMissing: throw UsageError(fmt::format("File does not exist: {}", shown));
    case kNotRegular: throw UsageError(fmt::format("Path is not a regular file: {}", shown));
    case kTooBig:
      throw UsageError(fmt::format("File is {} bytes; text tool limit is {} bytes: {}", text::trim(r.err),
                                   kFileTextLimit, shown));
    default: throw UsageError(fmt::format("{}: {}", shown, text::trim(text::sanitize_utf8(r.err))));
  }
  if (r.out.size() > kFileTextLimit)
    throw UsageError(fmt::format("File is over {} bytes (text tool limit): {}", kFileTextLimit, shown));
  return r.out;
}

// Writes `content` atomically in the computer (a temporary file beside it, the old file's mode,
// a rename), as the seed does. `expected_sha`: refused with kChanged unless the file has it now.
// Returns whether parent directories were made.
bool write_in(State& st, const store::Instance& inst, const std::string& path, const std::string& content,
              bool parents, const std::string& expected_sha, mcp::RequestContext& rc) {
  static const std::string script = fmt::format(
      "f=$1; d=$(dirname -- \"$f\"); made=0\n"
      "if [ ! -d \"$d\" ]; then\n"
      "  [ \"$2\" = 1 ] || exit {no_parent}\n"
      "  mkdir -p -- \"$d\" || exit 1; made=1\n"
      "fi\n"
      "if [ -n \"$3\" ]; then\n"
      "  [ -f \"$f\" ] || exit {changed}\n"
      "  now=$(sha256sum < \"$f\") || exit 1\n"
      "  [ \"${{now%% *}}\" = \"$3\" ] || exit {changed}\n"
      "fi\n"
      "[ ! -e \"$f\" ] || [ -f \"$f\" ] || exit {irregular}\n"
      "t=$(mktemp \"$d/.write.XXXXXX\") || exit 1\n"
      "if ! cat > \"$t\"; then rm -f -- \"$t\"; exit 1; fi\n"
      "[ -e \"$f\" ] && chmod --reference=\"$f\" -- \"$t\" 2>/dev/null\n"
      "[ -e \"$f\" ] || chmod 644 -- \"$t\"\n"
      "mv -f -- \"$t\" \"$f\" || {{ rm -f -- \"$t\"; exit 1; }}\n"
      "echo \"$made\"\n",
      fmt::arg("no_parent", kNoParent), fmt::arg("changed", kChanged), fmt::arg("irregular", kNotRegular));
  const Script r = run_script(st, inst, script, {path, parents ? "1" : "0", expected_sha}, content, rc);
  const std::string shown = shown_path(path);
  switch (r.exit_code) {
    case 0: return text::trim(r.out) == "1";
    case kNoParent: throw UsageError(fmt::format("Parent directory does not exist: {}", shown));
    case kChanged: throw UsageError("File changed before edit could be saved");
    case kNotRegular: throw UsageError(fmt::format("Path is not a regular file: {}", shown));
    default: throw UsageError(fmt::format("{}: {}", shown, text::trim(text::sanitize_utf8(r.err))));
  }
}

std::string checked_utf8(const std::string& data, const std::string& shown) {
  if (auto bad = text::find_invalid_utf8(data))
    throw UsageError(fmt::format("File is not valid UTF-8 text at byte {}: {}", *bad, shown));
  return data;
}

json file_result(const store::Instance& inst, const char* operation, const std::string& path,
                 const std::string& content) {
  json out = common(inst, operation);
  out["path"] = shown_path(path);
  out["size_bytes"] = content.size();
  out["sha256"] = files::sha256_hex(content);
  return out;
}

mcp::ToolResult read_file_tool(State& st, const json& args, mcp::RequestContext& rc) {
  const std::string path = path_of(args);
  const store::Instance inst = computer_for(st, args, rc);
  const std::string content = checked_utf8(read_in(st, inst, path, rc), shown_path(path));
  json out = file_result(inst, "read_file", path, content);
  out["content"] = content;
  out["visualization_warning"] = nullptr;
  return json_result(std::move(out));
}

std::string content_arg(const json& args, const char* name) {
  auto it = args.find(name);
  if (it == args.end() || !it->is_string()) throw UsageError(fmt::format("{} is required (a string)", name));
  return it->get<std::string>();
}

mcp::ToolResult write_file_tool(State& st, const json& args, mcp::RequestContext& rc) {
  const std::string path = path_of(args);
  const std::string content = content_arg(args, "content");
  if (content.size() > kFileTextLimit)
    throw UsageError(fmt::format("Content is {} bytes; text tool limit is {} bytes", content.size(), kFileTextLimit));
  auto parents_it = args.find("create_parent_directories");
  const bool parents = parents_it == args.end() || parents_it->is_null() || parents_it->get<bool>();
  const store::Instance inst = computer_for(st, args, rc);
  const bool made = write_in(st, inst, path, content, parents, "", rc);
  json out = file_result(inst, "write_file", path, content);
  out["created_parent_directories"] = made;
  return json_result(std::move(out));
}

mcp::ToolResult edit_file_tool(State& st, const json& args, mcp::RequestContext& rc) {
  const std::string path = path_of(args);
  const std::string old_text = content_arg(args, "old_text");
  const std::string new_text = content_arg(args, "new_text");
  if (old_text.empty()) throw UsageError("old_text must not be empty");
  const bool replace_all = args.contains("replace_all") && args["replace_all"].is_boolean() && args["replace_all"].get<bool>();
  const store::Instance inst = computer_for(st, args, rc);
  const std::string shown = shown_path(path);
  const std::string before = checked_utf8(read_in(st, inst, path, rc), shown);
  const std::vector<std::size_t> at = text::find_all(before, old_text);
  if (at.empty()) throw UsageError(fmt::format("old_text was not found in {}", shown));
  if (at.size() > 1 && !replace_all)
    throw UsageError(fmt::format("old_text occurs {} times in {}; provide more surrounding text or set replace_all=true",
                                 at.size(), shown));
  const std::string after = text::replace_at(before, at, old_text.size(), new_text);
  if (after.size() > kFileTextLimit)
    throw UsageError(fmt::format("Content is {} bytes; text tool limit is {} bytes", after.size(), kFileTextLimit));
  write_in(st, inst, path, after, false, files::sha256_hex(before), rc);
  json out = file_result(inst, "edit_file", path, after);
  out["old_text"] = old_text;
  out["new_text"] = new_text;
  out["replacements"] = at.size();
  return json_result(std::move(out));
}

json file_output(std::initializer_list<std::pair<const char*, json>> extra, std::vector<std::string> required) {
  json props = {{"operation", of_type("string")},          {"computer_id", of_type("string")},
                {"desktop_environment", of_type("boolean")}, {"network_access", of_type("boolean")},
                {"desktop_url", {{"type", {"string", "null"}}}}, {"workspace_directory", of_type("string")},
                {"path", of_type("string")},               {"size_bytes", of_type("integer")},
                {"sha256", of_type("string")}};
  for (const auto& [name, schema] : extra) props[name] = schema;
  required.insert(required.end(), {"operation", "computer_id", "path", "size_bytes", "sha256"});
  return output_object(std::move(props), std::move(required));
}

const json kPathArg = {{"type", "string"}, {"description", "Absolute, or relative to /workspace."}};
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
  add_tool(server, {
      .name = "read_file",
      .title = "Read a text file of the computer",
      .description = "Read a UTF-8 text file (at most 1 MiB) of the computer: its content, size_bytes and sha256.",
      .input = input_object({{"path", kPathArg}, {"computer_id", kComputerArg}}, {"path"}),
      .output = file_output({{"content", of_type("string")}}, {"content"}),
      .hints = {.read_only = true},
      .handler = working(st, "read_file", read_file_tool),
  });
  add_tool(server, {
      .name = "write_file",
      .title = "Write a text file of the computer",
      .description = "Write a UTF-8 text file (at most 1 MiB) of the computer atomically, replacing it if it exists.",
      .input = input_object({{"path", kPathArg},
                             {"content", {{"type", "string"}, {"description", "The whole new content."}}},
                             {"create_parent_directories",
                              {{"type", "boolean"}, {"description", "Make missing parent folders (default true)."}}},
                             {"computer_id", kComputerArg}},
                            {"path", "content"}),
      .output = file_output({{"created_parent_directories", of_type("boolean")}}, {}),
      .hints = {.destructive = true, .idempotent = true},
      .handler = working(st, "write_file", write_file_tool),
  });
  add_tool(server, {
      .name = "edit_file",
      .title = "Edit a text file of the computer",
      .description =
          "Replace old_text (exactly, once unless replace_all) with new_text in a text file of the computer; refused "
          "if the file changes meanwhile.",
      .input = input_object({{"path", kPathArg},
                             {"old_text", {{"type", "string"}, {"description", "Text to replace, exactly as in the file."}}},
                             {"new_text", {{"type", "string"}, {"description", "The replacement."}}},
                             {"replace_all", {{"type", "boolean"}, {"description", "Replace every occurrence (default false)."}}},
                             {"computer_id", kComputerArg}},
                            {"path", "old_text", "new_text"}),
      .output = file_output({{"old_text", of_type("string")}, {"new_text", of_type("string")},
                             {"replacements", of_type("integer")}},
                            {"replacements"}),
      .hints = {.destructive = true, .idempotent = false},
      .handler = working(st, "edit_file", edit_file_tool),
  });
  if (s.expose_lifecycle_tools) add_lifecycle_tools(server, st);
}

}  // namespace nshpc::tools
