#include "tools/tools.hpp"

#include <chrono>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "instances/instances.hpp"
#include "tools/desktop_tools.hpp"
#include "tools/app.hpp"
#include "tools/internal.hpp"
#include "tools/tasks.hpp"

namespace nshpc::tools {

namespace {
constexpr std::size_t kAuditedArgumentBytes = 4096;
}  // namespace

std::string actor(const mcp::RequestContext& rc) {
  // A 2026-07-28 request has no session: the client alone names who acts.
  if (rc.session_id().empty()) return "mcp:" + rc.client_name();
  return fmt::format("mcp:{}@{}", rc.client_name(), rc.session_id());
}

void add_trace_env(std::vector<std::pair<std::string, std::string>>& env, const mcp::RequestContext& rc) {
  const auto add = [&env](const char* name, const std::string& value) {
    if (value.empty()) return;
    // A variable the caller set itself in `env` is theirs to keep.
    for (const auto& [given, _] : env)
      if (given == name) return;
    env.emplace_back(name, value);
  };
  add("TRACEPARENT", rc.traceparent());
  if (!rc.traceparent().empty()) add("TRACESTATE", rc.tracestate());
}

void audit_tool_call(const ToolContext& ctx, const std::string& tool, const mcp::json& args, mcp::ToolResult& result,
                     std::chrono::milliseconds duration, mcp::RequestContext& rc, std::string_view instance) {
  std::string shown_args = args.dump(-1, ' ', false, mcp::json::error_handler_t::replace);
  if (shown_args.size() > kAuditedArgumentBytes) shown_args = shown_args.substr(0, kAuditedArgumentBytes) + "…";
  mcp::json fields = {{"tool", tool}, {"arguments", shown_args}, {"is_error", result.is_error},
                      {"duration_ms", duration.count()}};
  if (result.is_error && !result.content.empty() && result.content[0].contains("text"))
    fields["error"] = result.content[0]["text"];
  if (result.structured && result.structured->contains("exit_code"))
    fields["exit_code"] = (*result.structured)["exit_code"];
  // The caller's trace, so its spans and this record can be joined (validated by the MCP core).
  if (!rc.traceparent().empty()) {
    fields["traceparent"] = rc.traceparent();
    if (!rc.tracestate().empty()) fields["tracestate"] = rc.tracestate();
  }
  try {
    // The instance's own log when the call names an existing instance, else the store's.
    auto id = args.find("instance_id");
    std::optional<store::Instance> inst;
    if (!instance.empty() || (id != args.end() && id->is_string())) {
      const std::string name = !instance.empty() ? std::string(instance) : id->get<std::string>();
      bool valid = true;
      try {
        store::validate_id(name);
      } catch (const UsageError&) {
        valid = false;
      }
      if (valid && ctx.services.instances.store().exists(name)) inst = ctx.services.instances.store().get(name);
    }
    if (inst)
      ctx.services.instances.store().audit(*inst, "mcp.tool_call", actor(rc), fields);
    else
      ctx.services.instances.store().audit_store("mcp.tool_call", actor(rc), fields);
  } catch (const std::exception& e) {
    // The call already happened: tell the agent too, so the gap in the record is not silent.
    log::error("audit log not written for {}: {}", tool, e.what());
    result.content.push_back({{"type", "text"}, {"text", std::string("warning: audit log not written: ") + e.what()}});
  }
}

void add_job_trace(jobs::SubmitRequest& req, const mcp::RequestContext& rc) {
  if (req.mode != jobs::Mode::slurm) {
    add_trace_env(req.env, rc);  // the record keeps it with the job's other variables
    return;
  }
  // A Slurm job's environment is only what the batch script needs (sbatch --export=PATH,HOME,LANG)
  // and `ns-hpc bwrap` on the node hands its sandbox no variables of its own: the job's argv
  // carries them through env(1), which every node's root has (Slurm jobs never run on an image).
  std::vector<std::pair<std::string, std::string>> trace;
  add_trace_env(trace, rc);
  if (trace.empty()) return;
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (const auto& [name, value] : trace) argv.push_back(name + "=" + value);
  argv.insert(argv.end(), req.argv.begin(), req.argv.end());
  if (req.display.empty()) req.display = text::shell_join(req.argv);
  req.argv = std::move(argv);
}

mcp::json agent_instance_json(const ToolContext& ctx, const store::Instance& inst) {
  return instances::instance_json(ctx.services.config, inst);
}

std::optional<sandbox::LivingStatus> add_living_state(const ToolContext& ctx, const store::Instance& inst,
                                                      mcp::json& out) {
  if (!inst.persistent) return std::nullopt;
  try {
    sandbox::LivingStatus status = ctx.services.instances.living_status(inst);
    out.update(instances::state_json(status));
    return status;
  } catch (const std::exception& e) {
    log::warn("instance '{}': living state unknown: {}", inst.id, e.what());
    out["state"] = "unknown";
    out["state_error"] = e.what();
    return std::nullopt;
  }
}

std::string living_summary(const mcp::json& state) {
  const std::string name = state.value("state", "");
  if (name == "running") {
    std::string text = "running";
    if (state.contains("running_since"))
      text += " since " + state["running_since"].get<std::string>().substr(0, 19) + "Z";
    const std::size_t n = state.value("processes", std::size_t{0});
    return text + fmt::format(", {} process{} in its sandbox, {:.1f} MiB", n, n == 1 ? "" : "es",
                              state.value("memory_bytes", std::uint64_t{0}) / 1048576.0);
  }
  if (name == "stopped") {
    const std::string last = state.value("last_end", "");
    return last.empty() ? "stopped" : "stopped (last: " + last + ")";
  }
  return "state unknown: " + state.value("state_error", "");
}

std::string instance_uri(const std::string& id) { return "resource://ns-hpc/instances/" + id; }

std::string instance_arg(const ToolContext& ctx, const mcp::json& args) {
  auto it = args.find("instance_id");
  if (it != args.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) return it->get<std::string>();
  if (!ctx.services.config.mcp.default_instance.empty()) return ctx.services.config.mcp.default_instance;
  throw UsageError("instance_id is required (this server has no [mcp] default_instance); list_instances shows them");
}

mcp::ServerInfo server_info() {
  mcp::ServerInfo info;
  info.name = "ns-hpc";
  info.title = "ns-hpc: persistent Linux sandboxes";
  info.version = NSHPC_VERSION;
  // What every tool shares, said once here (tools/list says only what each tool adds); true on
  // every host: what differs by host (the default network, whether 'nat' works) is in the tool
  // descriptions, generated from this server.
  info.instructions =
      "ns-hpc manages persistent Linux sandboxes, 'instances'. Each has /workspace ($HOME, the start directory) and "
      "/output, kept between calls; file tools take paths relative to /workspace or absolute under /workspace or "
      "/output. Commands run in a hardened sandbox (read-only system folders, private /tmp; root only in an "
      "instance on an image): a fresh one per command, or in a persistent instance one sandbox kept between "
      "calls with its background processes and /tmp. Network modes: 'off' (its own loopback only), 'nat' (the "
      "internet, not the host's own addresses), 'filtered' (only an allow list, through a proxy: HTTP_PROXY is "
      "set), 'host' (the host's network, the weakest); create_instance says the default here. Results are a text "
      "summary and structuredContent; a long list or file comes a page at a time (the result says how to get the next). Start with "
      "list_instances, or create_instance. Guides: resource://ns-hpc/context/ns-hpc.md (start there), jobs.md, "
      "sandbox.md; each instance is also resource://ns-hpc/instances/{id}.";
  return info;
}

mcp::ServerOptions server_options(const config::Config& config, Services services) {
  mcp::ServerOptions options;
  ToolContext ctx{services};
  options.on_tool_call = [ctx](const std::string& tool, const mcp::json& args, mcp::ToolResult& result,
                               std::chrono::milliseconds duration, mcp::RequestContext& rc) {
    if (ctx.services.tool_called) ctx.services.tool_called();
    // The last bound of every result's text; the tools size theirs first.
    bound_texts(result, static_cast<std::size_t>(ctx.services.config.mcp.max_result_chars));
    audit_tool_call(ctx, tool, args, result, duration, rc);
  };
  options.page_size = static_cast<std::size_t>(config.mcp.page_size);
  options.extensions = app::extensions();
  switch (config.mcp.result_type) {
    case config::ResultType::text: options.result_shape = mcp::ResultShape::text; break;
    case config::ResultType::structured: options.result_shape = mcp::ResultShape::structured; break;
    case config::ResultType::both: options.result_shape = mcp::ResultShape::both; break;
  }
  return options;
}

void register_all(mcp::Server& server, Services services) {
  ToolContext ctx{services};
  add_instance_tools(server, ctx);
  add_snapshot_tools(server, ctx);
  // Jobs are the tasks of this server (tools/tasks.hpp); without the job tools it has none.
  std::shared_ptr<JobTasks> tasks = services.job_tools ? run_job_tasks(ctx) : nullptr;
  if (tasks) server.set_tasks(tasks);
  add_terminal_tool(server, ctx, tasks);
  add_file_tools(server, ctx);
  if (tasks) add_job_tools(server, ctx, tasks);
  add_desktop_tools(server, {
      .ctx = ctx,
      .server = &server,
      .id_name = "instance_id",
      .id_schema = instance_id_arg(services.config.mcp.default_instance),
      .instance_for =
          [ctx](const mcp::json& args, mcp::RequestContext&) {
            return ctx.services.instances.store().get(instance_arg(ctx, args));
          },
      .working = [](const char*, std::function<mcp::ToolResult(const mcp::json&, mcp::RequestContext&)> body) {
        return ToolHandler(std::move(body));
      },
      .common =
          [](const store::Instance& inst, const char* operation) {
            return mcp::json{{"operation", operation}, {"instance_id", inst.id}, {"desktop_environment", inst.meta.desktop()}};
          },
      .unavailable_text =
          [ctx](const instances::DesktopUnavailable& why) {
            return fmt::format("{}; create_instance with desktop=true makes one on the desktop image {:?}", why.what(),
                               ctx.services.config.desktop.image);
          },
  });
  server.set_resources(make_resources(ctx));
  add_prompts(server, ctx);
}

}  // namespace nshpc::tools
