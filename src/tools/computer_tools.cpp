// The tools of the mcp-virtual-computer entry point (`ns-hpc computer`): the seed's 0.2.3 surface
// (terminal_execute, read_file, write_file, edit_file; Kilntainers' sandbox_exec answered, not listed),
// each with an optional computer_id; what `ns-hpc run` has and the seed lacks (expose_port, and
// the job tools over the same job engine); and the lifecycle tools (computer_list,
// computer_create, computer_restart, computer_factory_reset, computer_delete,
// set_network_access) over instances::Computers; the desktop's tools (tools/desktop_tools.cpp).
//
// Every result is the seed's: its JSON object as the text and as structuredContent, at most
// computer::kResultBytes together; a command's output past that is cut in the middle, the whole
// kept in a file of the computer (--whole-output: the seed's whole output).
//
// The file tools (tools/computer_files.cpp) reach every path of the computer (not only
// /workspace), as the seed's `docker exec` does, from this process, beneath the computer's own
// root and confined to its own files.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <stop_token>
#include <thread>
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
#include "jobs/jobs.hpp"
#include "tools/tasks.hpp"
#include "tools/app.hpp"
#include "tools/computer_contract.hpp"
#include "tools/computer_files.hpp"
#include "tools/confirm.hpp"
#include "tools/desktop_tools.hpp"
#include "tools/internal.hpp"
#include "tools/progress.hpp"

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
  // Whether COMPUTER_ID's network (and desktop) has been set as the command line asks (once per
  // server).
  std::mutex network_mutex;
  bool network_settled = false;

  // Deletes the leased computers whose leases ran out (instances::Computers::expire_leases);
  // declared last, so stopped and joined before `computers` goes.
  std::jthread lease_timer;

  State(const ToolContext& c, ComputerSettings s)
      : ctx(c),
        settings(std::move(s)),
        computers(c.services.instances, c.services.config.ns.default_image, settings.lease) {}
};
using StatePtr = std::shared_ptr<State>;

config::Network network_for(const State& st, bool on) { return on ? network_on_mode(st.ctx) : config::Network::off; }

// The image computers run on, built if missing; waits for a build in progress, with progress.
void wait_for_image(const State& st, mcp::RequestContext& rc, const std::string& name) {
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

void wait_for_image(const State& st, mcp::RequestContext& rc) {
  wait_for_image(st, rc,
                 st.settings.desktop_environment ? st.ctx.services.config.desktop.image : st.computers.image());
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
  if (id != st.settings.computer_id) {
    store::Instance named = st.computers.get(id);
    st.computers.renew(named.id);  // a computer this process leases is in use
    return named;
  }
  if (!st.ctx.services.instances.store().exists(id)) wait_for_image(st, rc);
  store::Instance inst = st.computers.acquire(id, false, network_for(st, st.settings.network_access), "", actor(rc),
                                             nullptr, st.settings.desktop_environment);
  // A computer found again takes the network the command line asks for (--no-network means
  // off, whatever an earlier server left), and DESKTOP_ENVIRONMENT=true its desktop; later
  // set_network_access and set_desktop_environment calls change them.
  std::lock_guard lock(st.network_mutex);
  if (!st.network_settled) {
    st.network_settled = true;
    inst = set_network(st, inst, st.settings.network_access, actor(rc));
    if (st.settings.desktop_environment && !inst.meta.desktop()) {
      instances::Desktops& desktops = st.ctx.services.instances.desktops();
      if (auto why = desktops.unavailable(inst))
        log::warn("DESKTOP_ENVIRONMENT=true, but computer '{}' stays without a desktop: {}", inst.id,
                  computer::kNoDesktopInPlace);
      else
        inst = desktops.set(inst, true, actor(rc));
    }
  }
  return inst;
}

// desktop_url: where a person watches the computer's desktop in the dashboard, while the
// desktop is on and the server serves HTTP; null on stdio, where no browser reaches the server.
computer::ComputerFacts facts_of(const State& st, const store::Instance& inst) {
  return {.computer_id = inst.id,
          .desktop_environment = inst.meta.desktop(),
          .network_access = inst.network != config::Network::off,
          .desktop_url = app::desktop_url(st.ctx.services, inst)};
}

// What every file and idle result carries.
json common(const State& st, const store::Instance& inst, const char* operation) {
  return {{"operation", operation},
          {"computer_id", inst.id},
          {"desktop_environment", inst.meta.desktop()},
          {"network_access", inst.network != config::Network::off},
          {"desktop_url", app::desktop_url_json(st.ctx.services, inst)},
          {"workspace_directory", kWorkspace}};
}

// The JSON object as the text and as structuredContent.
mcp::ToolResult json_result(json object) {
  std::string text = object.dump(-1, ' ', false, json::error_handler_t::replace);
  return mcp::ToolResult::text(std::move(text), std::move(object));
}

// Where the agent finds what does exist, after the seed's "Computer 'x' was not found.".
std::string not_found_hint(const State& st, const NotFound& e) {
  const std::string near = e.facts().near_miss.empty() ? "" : fmt::format("Did you mean '{}'? ", e.facts().near_miss);
  switch (e.kind()) {
    case NotFound::Kind::instance:
      return st.settings.expose_lifecycle_tools
                 ? near + "computer_list lists the computers."
                 : fmt::format("Leave computer_id out to use this server's computer '{}'.", st.settings.computer_id);
    case NotFound::Kind::job: return near + "poll_job without a job_id lists the computer's jobs.";
    case NotFound::Kind::image:
      return "Ask the server's operator to build the image computers run on ([namespace] default_image).";
    case NotFound::Kind::archive: break;
  }
  return near;
}

// An error's text for the agent: what needs an action says which of the computer's tools does it;
// what is not there, where to look.
std::string error_text(const State& st, const std::exception& e) {
  if (const auto* needs = dynamic_cast<const NeedsAction*>(&e))
    return fmt::format("{}; {}", e.what(), computer::action_advice(*needs, st.settings.expose_lifecycle_tools));
  if (const auto* missing = dynamic_cast<const NotFound*>(&e)) {
    const std::string what = e.what(), hint = not_found_hint(st, *missing);
    if (hint.empty()) return what;
    return fmt::format("{}{} {}", what, !what.empty() && what.back() == '.' ? "" : ";", hint);
  }
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
      return json_error(
          computer::error_object(operation, given.empty() ? st->settings.computer_id : given, error_text(*st, e)));
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

// The optional computer_id of every tool but computer_create: described once, by terminal_execute
// and computer_create (every tool's description is read on every turn).
json computer_arg() { return of_type("string"); }

// ---------------------------------------------------------------------------------------------
// terminal_execute

// A result past computer::kResultBytes, or past the output [mcp] max_result_chars allows (what
// `ns-hpc run` returns), keeps the head and tail of stdout and stderr, cut as bound_output cuts
// them: a marker line says how much was cut and names the file of /workspace/.ns_hpc_output with
// the whole, as the command wrote it (stdout_file, stderr_file).
void bound(const State& st, const store::Instance& inst, json& result, const sandbox::CaptureResult& o) {
  const config::Config& cfg = st.ctx.services.config;
  const std::string& out = result["stdout"].get_ref<const std::string&>();
  const std::string& err = result["stderr"].get_ref<const std::string&>();
  const std::size_t start = result_budget(cfg) / 2;  // one copy's share: the output goes as text and as structuredContent
  const std::size_t chars = computer::output_chars_within(result, start);
  if (chars >= text::utf8_length(out) + text::utf8_length(err)) return;
  // bound_output with `chars` as the output budget of a result sent both ways.
  config::Config sized = cfg;
  sized.mcp.result_type = config::ResultType::both;
  const auto twice = static_cast<std::int64_t>(2 * chars);
  sized.mcp.max_result_chars = twice + 1200;
  sized.mcp.max_result_chars -= static_cast<std::int64_t>(result_budget(sized)) - twice;  // less its summary's room
  const ToolContext sized_ctx{Services{sized, st.ctx.services.instances, st.ctx.services.image_builds,
                                       st.ctx.services.job_tools}};
  BoundedOutput b = bound_output(sized_ctx, inst, out, err, o.out, o.err);
  if (!b.note.empty()) b.err += (b.err.empty() || b.err.back() == '\n' ? "" : "\n") + b.note;
  result["stdout"] = std::move(b.out);
  result["stderr"] = std::move(b.err);
  if (!b.out_file.empty()) result["stdout_file"] = b.out_file;
  if (!b.err_file.empty()) result["stderr_file"] = b.err_file;
}

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
      return json_result(computer::exec_result(facts_of(st, inst), "", computer::timeout_message(req.timeout), 124, ms));
    case sandbox::Ending::output_limit:
      return json_result(
          computer::exec_result(facts_of(st, inst), "", computer::output_limit_message(st.settings.output_limit), 1, ms));
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
  json result = computer::exec_result(facts_of(st, inst), text::sanitize_utf8(o.out), err, exit_code, ms);
  if (!st.settings.whole_output) bound(st, inst, result, o);
  return json_result(std::move(result));
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
                       {"computer_id", computer_arg()}});
}

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
  json out = common(st, inst, "idle");
  out["lifecycle_tools_exposed"] = st.settings.expose_lifecycle_tools;
  out["lifecycle_tools_model_visible"] = st.settings.expose_lifecycle_tools;
  return out;
}

void add_lifecycle_tools(mcp::Server& server, const StatePtr& st) {
  const json id_optional = input_object({{"computer_id", computer_arg()}});
  const json changed = result_object({"computer_id", "temporary"});
  add_tool(server, {
      .name = "computer_list",
      .description = "List the computers: id, temporary, state (running/stopped), network.",
      .input = input_object(json::object()),
      .output = result_object({"computers"}),
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
      .description =
          "Create another computer (its own Debian root); the other tools take its id as computer_id (default: this "
          "server's). temporary (default true): deleted when this session ends (sessionless: once unused for the "
          "session timeout).",
      .input = input_object(
          {{"computer_id",
            {{"type", "string"}, {"description", "Optional lowercase slug. Omit to generate a readable random ID."}}},
           {"temporary", of_type("boolean")},
           {"desktop", {{"type", "boolean"}, {"description", "With an Xfce desktop."}}}}),
      .output = changed,
      .hints = {.destructive = false},
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
        // A request without a session (2026-07-28) holds it by this process's lease.
        const std::string owner = !temporary                ? std::string()
                                  : rc.session_id().empty() ? instances::lease_key()
                                                            : instances::owner_key(rc.session_id());
        const bool desktop = args.value("desktop", false);
        if (!s.ctx.services.instances.store().exists(id) && desktop) wait_for_image(s, rc, s.ctx.services.config.desktop.image);
        const store::Instance inst = s.computers.acquire(id, temporary, network_for(s, s.settings.network_access), owner,
                                                         actor(rc), nullptr, desktop);
        if (desktop && inst.meta.desktop()) s.ctx.services.instances.desktops().ensure_running(inst, actor(rc));
        return json_result(created_json(inst));
      }),
  });
  // Restart and factory reset act on this server's computer when none is named (made first when
  // it is not yet: there is always one to act on).
  add_tool(server, {
      .name = "computer_restart",
      .description = "End every process of a computer and start it again; files and installs stay.",
      .input = id_optional,
      .output = changed,
      .hints = {},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        return json_result(created_json(s.computers.restart(computer_for(s, args, rc).id, actor(rc))));
      }),
  });
  add_tool(server, {
      .name = "computer_factory_reset",
      .description = "Back to a fresh image: installs, /workspace and processes go; id and network stay.",
      .input = with_confirm(id_optional),
      .output = changed,
      .hints = {},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        const std::string id = computer_for(s, args, rc).id;
        confirm(s.ctx, rc, "computer_factory_reset", args,
                fmt::format("Factory-reset computer '{}'? Its installs and /workspace go for good.", id));
        return json_result(created_json(s.computers.factory_reset(id, s.trash, actor(rc))));
      }),
  });
  add_tool(server, {
      .name = "computer_delete",
      .description = "Delete a computer and its files for good; this server's own is made afresh on next use.",
      .input = with_confirm(id_optional),
      .output = result_object({"computer_id", "deleted"}),
      .hints = {},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        const std::string given = string_arg(args, "computer_id");
        const std::string id = given.empty() ? s.settings.computer_id : instances::validate_computer_id(given);
        if (s.ctx.services.instances.store().exists(id))  // nothing there: nothing to ask about
          confirm(s.ctx, rc, "computer_delete", args, fmt::format("Delete computer '{}' and its files for good?", id));
        s.computers.remove(id, actor(rc));
        return json_result({{"ok", true}, {"computer_id", id}, {"deleted", true}});
      }),
  });
  add_tool(server, {
      .name = "set_network_access",
      .description =
          "Network on or off, switched at once from outside (processes keep running); off: the computer reaches "
          "nothing but itself.",
      .input = input_object({{"enabled", of_type("boolean")}, {"computer_id", computer_arg()}}, {"enabled"}),
      .output = result_object({"computer_id", "network_access"}),
      .hints = {.destructive = false},
      .handler = managing(st, [](State& s, const json& args, mcp::RequestContext& rc) {
        const store::Instance current = computer_for(s, args, rc);
        return json_result(idle_json(s, set_network(s, current, args.at("enabled").get<bool>(), actor(rc))));
      }),
  });
}

// ---------------------------------------------------------------------------------------------
// What `ns-hpc run` has beside the seed's tools: expose_port, and jobs over the same job engine
// (submit_job and poll_job with `ns-hpc run`'s names and arguments, computer_id for instance_id,
// results in the computer's style). A job is terminal_execute's command run in the background:
// the computer's own processes, files and installs; it outlives the call and the server, keeps
// its whole output in files and is stopped whole by poll_job cancel=true.

constexpr std::size_t kJobTailLines = 50;
constexpr std::size_t kJobTailBytes = 8192;
constexpr std::size_t kJobCommandBytes = 2000;  // of the command shown back

mcp::ToolResult expose_port_tool(State& st, const json& args, mcp::RequestContext& rc) {
  const std::int64_t host_port = args.value("host_port", std::int64_t{0});
  if (host_port < 0 || host_port > 65535) throw UsageError("host_port must be 0-65535 (0: a free one)");
  const store::Instance inst = computer_for(st, args, rc);
  const auto port = static_cast<std::uint16_t>(args.at("port").get<int>());
  instances::Service& service = st.ctx.services.instances;
  json out = {{"operation", "expose_port"}, {"computer_id", inst.id}, {"port", port}};
  if (args.value("close", false)) {
    out["closed"] = service.unexpose_port(inst, port, actor(rc));
  } else {
    const sandbox::ExposedPort e = service.expose_port(inst, port, static_cast<std::uint16_t>(host_port), actor(rc));
    out["host_port"] = e.host_port;
    out["url"] = fmt::format("http://127.0.0.1:{}/", e.host_port);
  }
  json ports = json::array();
  for (const sandbox::ExposedPort& p : service.exposed_ports(inst))
    ports.push_back({{"port", p.port}, {"host_port", p.host_port}, {"forwarding", p.forwarding}});
  out["exposed_ports"] = std::move(ports);
  return json_result(std::move(out));
}

// A job as the computer shows it: the engine's view, computer_id for instance_id, the command cut.
json job_json(const char* operation, const jobs::View& v) {
  json out = {{"operation", operation}, {"computer_id", v.record.instance_id}};
  out.update(jobs::view_json(v));
  out.erase("instance_id");
  out["command"] = text::truncate_utf8(v.record.command, kJobCommandBytes);
  return out;
}

// The job's result, its tails shortened until it fits computer::kResultBytes.
mcp::ToolResult job_result(State& st, const char* operation, const std::string& computer, const std::string& job,
                           const jobs::View& view) {
  json out = job_json(operation, view);
  for (std::size_t bytes = kJobTailBytes / 4; bytes > 0 && computer::result_bytes(out) > computer::kResultBytes;
       bytes /= 4)
    out = job_json(operation, st.ctx.services.instances.jobs().view(computer, job, {kJobTailLines, bytes}));
  return json_result(std::move(out));
}

// Waits up to `seconds` (at most [jobs] max_timeout) for the job to end; stops waiting, not the
// job, when the call is cancelled; progress carries its newest output.
mcp::ToolResult wait_job(State& st, const char* operation, const std::string& computer, const std::string& job,
                         std::int64_t seconds, mcp::RequestContext& rc) {
  seconds = std::clamp<std::int64_t>(seconds, 0, st.ctx.services.config.jobs.max_timeout);
  const jobs::View v = st.ctx.services.instances.jobs().wait(
      computer, job, std::chrono::seconds(seconds), {kJobTailLines, kJobTailBytes}, [&] { return rc.cancelled(); },
      [&, follower = OutputFollower()](double elapsed, const jobs::View& now) mutable {
        rc.progress(elapsed, static_cast<double>(seconds),
                    follower.window(fmt::format("waiting for the job ({}, {:.0f} s)", jobs::to_string(now.record.state),
                                                elapsed),
                                    now.stdout_tail, now.stderr_tail));
      });
  return job_result(st, operation, computer, job, v);
}

mcp::ToolResult submit_job_tool(State& st, const json& args, mcp::RequestContext& rc, JobTasks& tasks) {
  json command = args;
  command.erase("timeout");  // here: how long to wait for it
  const TerminalRequest t = parse_terminal_request(command, st.ctx.services.config, "", st.settings.shell, 1);
  const store::Instance inst = computer_for(st, args, rc);
  jobs::SubmitRequest req;
  req.instance_id = inst.id;
  req.argv = t.argv;
  req.display = string_arg(args, "command");
  if (req.display.empty()) req.display = fmt::format("{}", fmt::join(t.argv, " "));
  req.cwd = t.working_directory;
  req.stdin_text = t.stdin_text;
  add_job_trace(req, rc);
  const jobs::Record rec = st.ctx.services.instances.jobs().submit(req, actor(rc));
  // A client that follows tasks gets the job as one at once (tools/tasks.hpp).
  if (rc.task_mode() != mcp::RequestContext::TaskMode::none)
    return mcp::ToolResult::of_task(tasks.of_job(inst.id, rec.id));
  return wait_job(st, "submit_job", inst.id, rec.id, args.value("timeout", std::int64_t{30}), rc);
}

// poll_job without a job_id: the computer's jobs, newest first, as many as fit a result.
mcp::ToolResult list_jobs(State& st, const store::Instance& inst) {
  const std::vector<jobs::Record> all = st.ctx.services.instances.jobs().list(inst.id);
  json out = {{"operation", "poll_job"}, {"computer_id", inst.id}, {"jobs", json::array()}, {"total", all.size()}};
  for (const jobs::Record& r : all) {
    json item = jobs::record_summary_json(r);
    item.erase("instance_id");
    item["command"] = text::truncate_utf8(r.command, 200);
    out["jobs"].push_back(std::move(item));
    if (computer::result_bytes(out) > computer::kResultBytes) {
      out["jobs"].erase(out["jobs"].size() - 1);
      break;
    }
  }
  return json_result(std::move(out));
}

void add_run_tools(mcp::Server& server, const StatePtr& st) {
  add_tool(server, {
      .name = "expose_port",
      .description =
          "Open a port a server in the computer listens on to the user, at 127.0.0.1:host_port on their host (the "
          "url); close=true ends it.",
      .input = input_object({{"port", {{"type", "integer"}, {"minimum", 1}, {"maximum", 65535}}},
                             {"host_port", {{"type", "integer"}, {"description", "Default: a free one."}}},
                             {"close", of_type("boolean")},
                             {"computer_id", computer_arg()}},
                            {"port"}),
      .output = result_object({"computer_id", "exposed_ports"}),
      .hints = {.destructive = false},
      .handler = working(st, "expose_port", expose_port_tool),
  });
  if (!st->ctx.services.job_tools) return;
  // The computers' jobs are this server's tasks, their result poll_job's.
  auto tasks = std::make_shared<JobTasks>(
      st->ctx, jobs::TailOptions{kJobTailLines, kJobTailBytes},
      [st](const jobs::View& v) { return job_result(*st, "poll_job", v.record.instance_id, v.record.id, v); },
      [st](mcp::RequestContext&) {
        std::vector<std::string> ids;
        for (const store::Instance& inst : st->ctx.services.instances.store().list().instances)
          if (inst.meta.computer_temporary()) ids.push_back(inst.id);
        return ids;
      });
  server.set_tasks(tasks);
  const json wait = {{"type", "integer"}, {"description", "Seconds to wait for its end."}};
  add_tool(server, {
      .name = "submit_job",
      .description =
          "Run command or args as terminal_execute does, in the background; waits up to timeout s (default 30) and "
          "gives status, exit_code, output tails and the files with the whole output.",
      .input = input_object({{"command", of_type("string")},
                             {"args", {{"type", "array"}, {"items", of_type("string")}}},
                             {"stdin", of_type("string")},
                             {"working_directory", of_type("string")},
                             {"timeout", wait},
                             {"computer_id", computer_arg()}}),
      .output = result_object({"job_id", "status"}),
      .hints = {.open_world = true},
      .handler = working(st, "submit_job",
                         [tasks](State& s, const json& args, mcp::RequestContext& rc) {
                           return submit_job_tool(s, args, rc, *tasks);
                         }),
      .task_support = mcp::Tool::TaskSupport::optional,
  });
  // poll_job also lists the jobs and cancels one: what `ns-hpc run` spreads over list_jobs and
  // cancel_job, in one tool description read every turn.
  add_tool(server, {
      .name = "poll_job",
      .description = "A job's status and output tails, after waiting up to timeout s (default 0) for its end; "
                     "cancel=true stops it and all it started. No job_id: list the jobs.",
      .input = input_object({{"job_id", of_type("string")},
                             {"timeout", wait},
                             {"cancel", of_type("boolean")},
                             {"computer_id", computer_arg()}}),
      .output = result_object({"computer_id"}),
      .hints = {},
      .handler = working(st, "poll_job", [](State& s, const json& args, mcp::RequestContext& rc) {
        const store::Instance inst = computer_for(s, args, rc);
        const std::string job = string_arg(args, "job_id");
        if (job.empty()) {
          if (args.value("cancel", false)) throw UsageError("cancel=true needs the job_id of the job to stop");
          return list_jobs(s, inst);
        }
        if (args.value("cancel", false)) s.ctx.services.instances.jobs().cancel(inst.id, job, actor(rc));
        return wait_job(s, "poll_job", inst.id, job, args.value("timeout", std::int64_t{0}), rc);
      }),
  });
}

// ---------------------------------------------------------------------------------------------
// computer_ui: the seed's tool that opens its App, here the dashboard (ui://ns-hpc/dashboard:
// the computers and their activity, read-only). A host that renders no App shows the text, which
// names the dashboard a browser opens, or says why there is none.

mcp::ToolResult computer_ui(State& st, const json& args, mcp::RequestContext& rc) {
  json out = idle_json(st, computer_for(st, args, rc));
  const std::optional<std::string> base = app::dashboard_base(st.ctx.services);
  out["url"] = base ? *base + "/" : std::string(app::kUri);
  out["resource_uri"] = app::kUri;
  out["computer_attached"] = true;
  out["message"] =
      base ? fmt::format("The dashboard is at {}/ (log in with this server's token, or its one-time link printed at "
                         "start-up); a host that renders MCP Apps shows it here.",
                         *base)
           : std::string("A host that renders MCP Apps shows the dashboard here. This server speaks stdio, which no "
                         "browser reaches: for the dashboard in a browser, start it with --transport http and open "
                         "the Dashboard URL it prints.");
  return json_result(std::move(out));
}

void add_app_tool(mcp::Server& server, const StatePtr& st) {
  add_tool(server, {
      .name = "computer_ui",
      .description = "Show the user the dashboard: computers, activity, live desktop.",
      .input = input_object(json::object()),
      .output = result_object({"url"}),
      .hints = {.read_only = true},
      .handler = working(st, "computer_ui", computer_ui),
      .meta = app::tool_meta(),
  });
}

}  // namespace

mcp::ServerOptions computer_server_options(const config::Config& config, Services services,
                                           std::string default_computer) {
  mcp::ServerOptions options;
  ToolContext ctx{services};
  // Audited in the computer's own log (the store's when it does not exist yet). No cut of the
  // text here: its JSON must stay whole, and each tool bounds its own result.
  options.on_tool_call = [ctx, default_computer](const std::string& tool, const mcp::json& args,
                                                 mcp::ToolResult& result, std::chrono::milliseconds duration,
                                                 mcp::RequestContext& rc) {
    if (ctx.services.tool_called) ctx.services.tool_called();
    const std::string given = string_arg(args, "computer_id");
    audit_tool_call(ctx, tool, args, result, duration, rc, given.empty() ? default_computer : given);
  };
  options.page_size = static_cast<std::size_t>(config.mcp.page_size);
  options.result_shape = mcp::ResultShape::both;  // the seed's: the JSON as text and as structuredContent
  options.extensions = app::extensions();  // the dashboard as an MCP App (computer_ui)
  // Arguments the input schema refuses are answered as every other error of the tool.
  options.refuse_arguments = [default_computer](const std::string& tool, const mcp::json& args,
                                                const std::string& problem) {
    const std::string given = string_arg(args, "computer_id");
    return json_error(computer::error_object(tool, given.empty() ? default_computer : given, problem));
  };
  return options;
}

void register_computer(mcp::Server& server, Services services, ComputerSettings settings) {
  auto st = std::make_shared<State>(ToolContext{services}, std::move(settings));
  // Temporary computers whose sessions ended with their server (a crash) go now.
  for (const std::string& id : st->computers.sweep("ns-hpc computer (start)"))
    log::info("deleted the temporary computer '{}': the sessions that held it are gone", id);
  // Leases run out on this timer, a tenth of a lease apart (1-30 s): no session needed.
  const auto tick = std::clamp<std::chrono::seconds>(st->settings.lease / 10, std::chrono::seconds(1),
                                                     std::chrono::seconds(30));
  st->lease_timer = std::jthread([&computers = st->computers, tick](std::stop_token stop) {
    std::mutex mutex;
    std::condition_variable_any wake;
    std::unique_lock lock(mutex);
    while (!stop.stop_requested()) {
      wake.wait_for(lock, stop, tick, [] { return false; });
      if (stop.stop_requested()) break;
      try {
        for (const std::string& id : computers.expire_leases("ns-hpc computer (lease ended)"))
          log::info("deleted the temporary computer '{}': its lease ran out", id);
      } catch (const std::exception& e) {
        log::warn("temporary computers' leases: {}", e.what());
      }
    }
    // The server ends: so do its leases, as a session's hold ends with the session.
    try {
      for (const std::string& id : computers.release(instances::lease_key(), "ns-hpc computer (end)"))
        log::info("deleted the temporary computer '{}': the server that leased it ends", id);
    } catch (const std::exception& e) {
      log::warn("temporary computers' leases: {}", e.what());
    }
  });
  server.set_session_closed([st](const std::string& session) {
    for (const std::string& id : st->computers.release(instances::owner_key(session), "mcp:session-end@" + session))
      log::info("deleted the temporary computer '{}': its last session ended", id);
  });

  const ComputerSettings& s = st->settings;
  const std::string description =
      computer::terminal_description(s.shell, s.timeout, s.tool_instruction_override, s.extended_tool_instruction);
  // Kilntainers' sandbox_exec is the same tool under its old name: answered when called, never
  // listed (a second listing would cost every turn a description and make a model choose between
  // two equal tools).
  for (const char* name : {"terminal_execute", "sandbox_exec"}) {
    add_tool(server, {
        .name = name,
        .description = description,
        .input = terminal_input(),
        .output = result_object({"stdout", "stderr", "exit_code"}),
        .hints = {.open_world = true},
        .handler = working(st, "terminal_execute", terminal),
        .listed = std::string_view(name) == "terminal_execute",
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
      .common = [st](const store::Instance& inst, const char* operation) { return common(*st, inst, operation); },
      .result = json_result,
      .computer_arg = computer_arg(),
      .whole_output = st->settings.whole_output,
  });
  add_run_tools(server, st);
  add_app_tool(server, st);
  if (s.expose_lifecycle_tools) add_lifecycle_tools(server, st);
  server.set_resources(app::with_app(screen_resources(st->ctx, [st]() -> std::optional<store::Instance> {
    const store::Store& store = st->ctx.services.instances.store();
    if (!store.exists(st->settings.computer_id)) return std::nullopt;
    return store.get(st->settings.computer_id);
  })));
  add_desktop_tools(server, {
      .ctx = st->ctx,
      .server = &server,
      .id_name = "computer_id",
      .id_schema = computer_arg(),
      .instance_for = [st](const json& args, mcp::RequestContext& rc) { return computer_for(*st, args, rc); },
      .working =
          [st](const char* operation, std::function<mcp::ToolResult(const json&, mcp::RequestContext&)> body) {
            return working(st, operation, [body = std::move(body)](State&, const json& args, mcp::RequestContext& rc) {
              return body(args, rc);
            });
          },
      .common = [st](const store::Instance& inst, const char* operation) { return common(*st, inst, operation); },
      .switch_listed = s.expose_lifecycle_tools,
      .unavailable_text =
          [](const instances::DesktopUnavailable& why) {
            return why.why() == instances::DesktopUnavailable::Why::root ? std::string(computer::kNoDesktopInPlace)
                                                                         : std::string(why.what());
          },
  });
}

}  // namespace nshpc::tools
