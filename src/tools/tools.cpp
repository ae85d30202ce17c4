#include "tools/tools.hpp"

#include <chrono>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/time.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {
constexpr std::size_t kAuditedArgumentBytes = 4096;
}  // namespace

std::string actor(const mcp::RequestContext& rc) {
  return fmt::format("mcp:{}@{}", rc.client_name(), rc.session_id());
}

Handler audited(const Context& ctx, std::string tool, Handler handler) {
  return [ctx, tool = std::move(tool), handler = std::move(handler)](const mcp::json& args,
                                                                     mcp::RequestContext& rc) {
    const auto started = std::chrono::steady_clock::now();
    mcp::ToolResult result;
    std::string error;
    try {
      result = handler(args, rc);
    } catch (const mcp::ProtocolError&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
      result = mcp::ToolResult::error(error);
    }
    std::string shown_args = args.dump(-1, ' ', false, mcp::json::error_handler_t::replace);
    if (shown_args.size() > kAuditedArgumentBytes) shown_args = shown_args.substr(0, kAuditedArgumentBytes) + "…";
    mcp::json fields = {
        {"tool", tool},
        {"arguments", shown_args},
        {"is_error", result.is_error},
        {"duration_ms",
         std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()}};
    if (!error.empty()) fields["error"] = error;
    try {
      auto id = args.find("instance_id");
      std::optional<store::Instance> inst;
      if (id != args.end() && id->is_string() && ctx.services.store.exists(id->get<std::string>()))
        inst = ctx.services.store.get(id->get<std::string>());
      if (inst)
        ctx.services.store.audit(*inst, "mcp.tool_call", actor(rc), fields);
      else
        ctx.services.store.audit_store("mcp.tool_call", actor(rc), fields);
    } catch (const std::exception& e) {
      // The call already happened: report the audit failure to the agent too.
      result.content.push_back({{"type", "text"}, {"text", std::string("warning: audit log not written: ") + e.what()}});
    }
    return result;
  };
}

mcp::json instance_json(const Context& ctx, const store::Instance& inst) {
  return {{"id", inst.id},
          {"description", inst.meta.description()},
          {"created_at", inst.meta.created_at()},
          {"last_activity", timeutil::iso_utc(inst.last_activity())},
          {"network", config::to_string(inst.network)},
          {"hostname", inst.meta.hostname()},
          {"workspace", ctx.services.config.ns.workspace_mount},
          {"output", ctx.services.config.ns.output_mount}};
}

std::string instance_uri(const std::string& id) { return "resource://ns-hpc/instances/" + id; }

mcp::ServerInfo server_info() {
  mcp::ServerInfo info;
  info.name = "ns-hpc";
  info.title = "ns-hpc: persistent Linux sandboxes";
  info.version = NSHPC_VERSION;
  info.instructions =
      "ns-hpc manages persistent Linux sandbox 'instances' for you. Each instance has a workspace "
      "(/workspace, also $HOME) and an output folder (/output) that persist; every command runs in a "
      "fresh hardened sandbox (no root, read-only system folders, private /tmp, network 'host' or 'off'). "
      "Start with list_instances, or create_instance for a new one. Guides are available as resources "
      "under resource://ns-hpc/context/ (start with ns-hpc.md); each instance is also a resource, "
      "resource://ns-hpc/instances/{id}.";
  return info;
}

mcp::ServerOptions server_options(const config::Config& config) {
  mcp::ServerOptions options;
  options.page_size = static_cast<std::size_t>(config.mcp.page_size);
  switch (config.mcp.result_type) {
    case config::ResultType::text: options.result_shape = mcp::ResultShape::text; break;
    case config::ResultType::structured: options.result_shape = mcp::ResultShape::structured; break;
    case config::ResultType::both: options.result_shape = mcp::ResultShape::both; break;
  }
  return options;
}

void register_all(mcp::Server& server, Services services) {
  Context ctx{services};
  add_instance_tools(server, ctx);
  server.set_resources(make_resources(ctx));
  add_prompts(server, ctx);
}

}  // namespace nshpc::tools
