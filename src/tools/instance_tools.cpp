// create_instance, list_instances, list_archived_instances, describe_instance, update_instance,
// stop_instance, restart_instance, archive_instance, restore_instance, delete_instance.
#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "instances/instances.hpp"
#include "jobs/jobs.hpp"
#include "network/netns.hpp"
#include "tools/app.hpp"
#include "tools/confirm.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

const json kInstanceIdArg = instance_id_arg();

// The network argument: what each mode means is in the server's instructions; here what differs
// by host (the default, and 'nat' where it cannot work).
json network_arg(const ToolContext& ctx, bool creating) {
  const auto nat_unavailable = network::nat_unavailable();
  std::string text = creating ? fmt::format("Default here: '{}'.",
                                            config::to_string(ctx.services.instances.store().default_network()))
                              : std::string("New mode.");
  if (nat_unavailable) text += " 'nat' does not work on this host.";
  return {{"type", "string"}, {"enum", {"off", "nat", "filtered", "host"}}, {"description", text}};
}

const json kAllowArg = {{"type", "array"},
                        {"items", {{"type", "string"}}},
                        {"description", "'filtered': more hosts it may reach (\"pypi.org\", \"*.debian.org\", "
                                        "\"10.1.2.3:8080\"; no port: 80 and 443)."}};

std::vector<std::string> allow_arg(const json& args) {
  std::vector<std::string> out;
  if (auto it = args.find("network_allow"); it != args.end() && it->is_array())
    for (const auto& e : *it)
      if (e.is_string()) out.push_back(e.get<std::string>());
  return out;
}

// What create, describe, update, set_network_access and restore_instance return: the instance
// (agent_instance_json; the living state of a persistent one).
const json kInstanceSchema = result_object({"id", "network"});

const json kPersistentArg = {
    {"type", "boolean"}, {"description", "Keep one sandbox (background processes, /tmp) between calls."}};

std::optional<config::Network> arg_network(const json& args) {
  auto it = args.find("network");
  if (it == args.end()) return std::nullopt;
  return config::parse_network(it->get<std::string>());
}

std::optional<bool> arg_persistent(const json& args) {
  auto it = args.find("persistent");
  if (it == args.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

// `item`: the instance as agent_instance_json shows it, with its living state.
std::string describe_line(const store::Instance& inst, const json& item) {
  std::string line = fmt::format("{}  ({}network {}, {}, last activity {})", inst.id,
                                 item.contains("image") ? "on image " + item["image"].get<std::string>() + ", " : "",
                                 config::to_string(inst.network),
                                 inst.persistent ? "persistent: " + living_summary(item) : "not persistent",
                                 timeutil::iso_utc(inst.last_activity()).substr(0, 19) + "Z");
  if (!inst.meta.description().empty()) line += " — " + inst.meta.description();
  return line;
}

// " Ended 1 job(s) first: 1a2b3c4d5e6f (sleep 100, now cancelled)." or "", and the jobs as data.
std::string ended_jobs_text(const instances::Ended& ended, json& items) {
  items = json::array();
  std::string list;
  for (const auto& r : ended.jobs) {
    items.push_back({{"job_id", r.id}, {"command", r.command}, {"status", jobs::to_string(r.state)}});
    list += fmt::format("{}{} ({}, now {})", list.empty() ? "" : ", ", r.id, text::truncate_utf8(r.command, 60),
                        jobs::to_string(r.state));
  }
  std::string out = list.empty() ? "" : fmt::format(" Ended {} job(s) first: {}.", ended.jobs.size(), list);
  for (const auto& problem : ended.problems) out += " Warning: job " + problem + ".";
  return out;
}

// An idle_stop in words: "stops after 15 min without activity" / "never stops by itself".
std::string idle_stop_words(const config::Config& cfg) {
  const std::int64_t s = cfg.ns.idle_stop;
  if (s <= 0) return "never stops by itself";
  return s % 60 == 0 ? fmt::format("stops after {} min without activity", s / 60)
                     : fmt::format("stops after {} s without activity", s);
}

// The instance that stop_instance and restart_instance act on: an active, persistent one.
store::Instance living_instance(const ToolContext& ctx, const json& args, std::string_view action) {
  store::Instance inst = ctx.services.instances.store().get(string_arg(args, "instance_id"));
  if (!inst.persistent)
    throw UsageError(fmt::format(
        "instance '{}' is not persistent: each command runs in a fresh sandbox that ends with it, so there is "
        "nothing running to {} (cancel_job ends a job; update_instance with persistent=true makes it a living "
        "instance)",
        inst.id, action));
  return inst;
}


// What a network change applied at once does to what runs, by the change: "; their connections out
// were cut" (to off), " and may now reach what 'nat' allows" (wider), "; connections 'filtered'
// forbids were cut" (narrower), "" (no change).
std::string reach_change(const store::Instance& before, const store::Instance& after) {
  using N = config::Network;
  auto rank = [](N n) { return n == N::off ? 0 : n == N::filtered ? 1 : n == N::nat ? 2 : 3; };
  const std::string mode(config::to_string(after.network));
  if (after.network == N::off) return before.network == N::off ? "" : "; their connections out were cut";
  if (before.network == N::off) return fmt::format(" and may now connect out ('{}')", mode);
  if (before.network != after.network)
    return rank(after.network) < rank(before.network) ? fmt::format("; connections '{}' forbids were cut", mode)
                                                      : fmt::format(" and may now reach what '{}' allows", mode);
  if (after.network != N::filtered || before.network_allow == after.network_allow) return "";
  const bool kept_all = std::all_of(before.network_allow.begin(), before.network_allow.end(), [&](const std::string& e) {
    return std::find(after.network_allow.begin(), after.network_allow.end(), e) != after.network_allow.end();
  });
  return kept_all ? " and may now reach the hosts added" : "; connections the new allow list forbids were cut";
}

// A network change applied to the running sandbox, said for the agent: " (applied at once: its
// processes keep running ...)", " (the instance was restarted: ...)", or "" when it does not run.
std::string network_change_note(const ToolContext& ctx, const store::Instance& before, const store::Instance& after,
                                std::string_view who) {
  switch (ctx.services.instances.apply_network(after, who)) {
    case instances::Service::NetworkChange::applied:
      return " (applied at once: its processes keep running" + reach_change(before, after) + ")";
    case instances::Service::NetworkChange::restarted:
      return " (the instance was restarted: a change to or from 'host' needs a new sandbox; its files are kept, "
             "its processes ended)";
    case instances::Service::NetworkChange::not_running: break;
  }
  return "";
}

// What archive_instance and delete_instance do, with the jobs that refuse it named as the agent
// ends them: "...; cancel them first (cancel_job, or stop_instance for all)".
template <typename F>
auto with_job_advice(const ToolContext& ctx, const std::string& id, F&& act) -> decltype(act()) {
  try {
    return act();
  } catch (const UsageError& e) {
    bool persistent = false, jobs_run = false;
    try {
      persistent = ctx.services.instances.store().get(id).persistent;
      for (const jobs::Record& r : ctx.services.instances.jobs().list(id)) jobs_run = jobs_run || !jobs::is_final(r.state);
    } catch (const std::exception&) {
      jobs_run = false;  // not an instance with jobs: the refusal is about something else
    }
    if (!jobs_run) throw;
    throw UsageError(fmt::format("{} ({})", e.what(), persistent ? "cancel_job, or stop_instance for all" : "cancel_job"));
  }
}

// The archive restore_instance brings back: archive_name, or instance_id (the id it was archived
// from, for its newest archive, or an archive name); given both, they must agree.
std::string archive_to_restore(const ToolContext& ctx, const json& args) {
  const std::string archive = string_arg(args, "archive_name"), id = string_arg(args, "instance_id");
  if (archive.empty() && id.empty())
    throw UsageError("give archive_name or instance_id (the id it was archived from); list_archived_instances "
                     "lists the archives");
  if (archive.empty() || id.empty() || archive == id) return archive.empty() ? id : archive;
  // One names an archive of the id the other names: the archive it names.
  for (const store::ArchivedInstance& a : ctx.services.instances.store().list_archived()) {
    if (a.name == archive && a.id == id) return archive;
    if (a.name == id && a.id == archive) return id;
  }
  throw UsageError(fmt::format("archive_name '{}' and instance_id '{}' do not name the same archive; give one of "
                               "them (new_instance_id restores it under another id)",
                               archive, id));
}

// An image that is being built (the default one is started here when missing) is not waited
// for: a build takes a minute or two, longer than a client waits for an answer. The call says
// how far it is, at once (and as progress to a client that asked for it).
void refuse_while_building(const ToolContext& ctx, const std::string& name, mcp::RequestContext& rc) {
  const sandbox::ImageStore images(ctx.services.config.ns.images_dir);
  sandbox::validate_image_name(name);
  if (images.current(name)) return;
  std::optional<sandbox::BuildProgress> build = images.building(name);
  if (!build && name == ctx.services.config.ns.default_image && ctx.services.image_builds)
    build = ctx.services.image_builds->start({.name = name});
  if (!build) return;  // the store says there is no such image, and how to build it
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now() - build->started);
  const std::string message = fmt::format("image '{}' is being built ({} s so far; now: {})", name,
                                          std::max<std::int64_t>(0, seconds.count()), text::truncate_utf8(build->line, 200));
  rc.progress(0, std::nullopt, message);
  throw UsageError(message + "; a build takes a minute or two: call create_instance again then");
}

void add_create(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "create_instance",
      .description = fmt::format("New instance. persistent: default {}; a persistent one's sandbox {}. image: a Debian "
                                 "root of its own where you are root and apt-get installs stay.",
                                 ctx.services.config.ns.persistent, idle_stop_words(ctx.services.config)),
      .input = input_object({{"instance_id",
                              {{"type", "string"},
                               {"description", "New id: 1-63 of A-Za-z0-9_.- (default: generated)."}}},
                             {"description", {{"type", "string"}, {"description", "What it is for."}}},
                             {"network", network_arg(ctx, true)},
                             {"network_allow", kAllowArg},
                             {"persistent", kPersistentArg},
                             {"image",
                              {{"type", "string"},
                               {"description", fmt::format("Image to run on (\"\": {:?}); always persistent.",
                                                           ctx.services.config.ns.default_image)}}},
                             {"desktop",
                              {{"type", "boolean"},
                               {"description", fmt::format("With an Xfce desktop (image default {:?}).",
                                                           ctx.services.config.desktop.image)}}}}),
      .output = kInstanceSchema,
      .hints = {.destructive = false, },
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::CreateOptions options;
            options.description = string_arg(args, "description");
            options.network = arg_network(args);
            options.network_allow = allow_arg(args);
            options.persistent = arg_persistent(args);
            options.desktop = args.value("desktop", false);
            if (options.desktop && !args.contains("image")) {
              options.image = ctx.services.config.desktop.image;
              refuse_while_building(ctx, options.image, rc);
            }
            if (args.contains("image")) {
              options.image = string_arg(args, "image");
              if (options.image.empty()) options.image = ctx.services.config.ns.default_image;
              if (options.image.empty())
                throw UsageError("image \"\" means the default image, and none is configured ([namespace] "
                                 "default_image); give an image name");
              refuse_while_building(ctx, options.image, rc);
            }
            const std::string asked = string_arg(args, "instance_id");
            store::Instance inst = ctx.services.instances.create(asked, options, actor(rc));
            server.notify_resource_list_changed();
            std::string text = fmt::format(
                "Created instance '{}' ({}network {}, {}). Its workspace is {} inside the sandbox and "
                "persists between commands; results meant to be kept go to {}.",
                inst.id, inst.image ? fmt::format("on image {}, as root with a root file system of its own; ", inst.image->image) : "",
                config::to_string(inst.network),
                inst.persistent ? "persistent: its sandbox starts with the first command"
                                : "not persistent: a fresh sandbox per command",
                ctx.services.config.ns.workspace_mount, ctx.services.config.ns.output_mount);
            json out = agent_instance_json(ctx, inst);
            if (auto archive = asked.empty() ? std::nullopt : ctx.services.instances.store().latest_archive(inst.id)) {
              text += fmt::format(
                  " Note: an archive of '{}' exists ({}, archived {}); this is a new, empty instance. "
                  "restore_instance with archive_name '{}' and new_instance_id brings the archive back.",
                  inst.id, archive->name, archive->meta.archived_at().substr(0, 10), archive->name);
              out["archive_of_same_id"] = archive->name;
            }
            return mcp::ToolResult::text(text, std::move(out));
          },
  });
}

constexpr std::int64_t kDefaultPageSize = 50;
constexpr std::int64_t kMaxPageSize = 500;

std::int64_t int_arg(const json& args, const char* name, std::int64_t fallback) {
  auto it = args.find(name);
  return it != args.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

json ports_json(const std::vector<sandbox::ExposedPort>& ports) {
  json list = json::array();
  for (const sandbox::ExposedPort& p : ports)
    list.push_back({{"port", p.port}, {"host_port", p.host_port}, {"forwarding", p.forwarding}});
  return list;
}

void add_list(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "list_instances",
      .description = "Active instances, most recently active first: image, network, whether it runs. Look here "
                     "before creating one.",
      .input = input_object(
          {{"filter", {{"type", "string"}, {"description", "Text in the id or description."}}},
           {"sort", {{"type", "string"}, {"enum", {"last_activity", "id"}}, {"description", "Default last_activity."}}},
           {"limit",
            {{"type", "integer"},
             {"minimum", 1},
             {"maximum", kMaxPageSize},
             {"description", fmt::format("Per page (default {}).", kDefaultPageSize)}}},
           {"offset", {{"type", "integer"}, {"minimum", 0}, {"description", "Instances to skip."}}},
           {"cursor", {{"type", "string"}, {"description", "Or: the last page's next_cursor."}}}}),
      // instances, count, total (matching the filter), offset; next_cursor but on the last page;
      // skipped: ids with an unusable metadata.json.
      .output = result_object({"instances", "total"}),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext&) {
            store::ListQuery query;
            query.filter = string_arg(args, "filter");
            query.sort = string_arg(args, "sort") == "id" ? store::SortBy::id : store::SortBy::last_activity;
            query.limit = static_cast<std::size_t>(std::clamp<std::int64_t>(int_arg(args, "limit", kDefaultPageSize), 1, kMaxPageSize));
            query.offset = static_cast<std::size_t>(std::max<std::int64_t>(0, int_arg(args, "offset", 0)));
            if (const std::string cursor = string_arg(args, "cursor"); !cursor.empty()) {
              std::size_t used = 0;
              try {
                query.offset = std::stoull(cursor, &used);
              } catch (const std::exception&) {
                used = 0;
              }
              if (used != cursor.size() || cursor[0] == '-')
                throw UsageError(fmt::format("cursor '{}' is not one list_instances gave; pass its next_cursor as it is",
                                             text::truncate_utf8(cursor, 40)));
            }
            store::Page page = ctx.services.instances.store().list_page(query);
            json items = json::array();
            std::string text;
            if (page.total == 0) {
              text = query.filter.empty() ? "No instances yet; create one with create_instance."
                                          : fmt::format("No instance matches '{}'.", query.filter);
            } else if (page.instances.empty()) {
              text = fmt::format("No instances from position {} on ({} in all).", query.offset, page.total);
            }
            // A page holds what fits in [mcp] max_result_chars, the text and the items together;
            // the cursor leads on from the last one that fitted.
            const std::size_t budget = result_budget(ctx.services.config);
            std::size_t used = 200;  // the heading and the "more" line
            std::string lines;
            for (const auto& inst : page.instances) {
              json item = agent_instance_json(ctx, inst);
              add_living_state(ctx, inst, item);  // persistent instances only: the others cost nothing
              const std::string line = "\n- " + describe_line(inst, item);
              const std::size_t size = item.dump().size() + line.size();
              if (!items.empty() && used + size > budget) break;
              used += size;
              lines += line;
              items.push_back(std::move(item));
            }
            if (!items.empty())
              text = fmt::format("{} instance(s){}{}, {} to {}:{}", page.total,
                                 query.filter.empty() ? "" : fmt::format(" matching '{}'", query.filter),
                                 query.sort == store::SortBy::id ? " by id" : ", most recently active first",
                                 query.offset + 1, query.offset + items.size(), lines);
            json out = {{"instances", items}, {"count", items.size()}, {"total", page.total}, {"offset", query.offset}};
            const std::size_t next = query.offset + items.size();
            if (!items.empty() && next < page.total) {
              out["next_cursor"] = std::to_string(next);
              text += fmt::format("\n{} more: call list_instances with cursor \"{}\".", page.total - next, next);
            }
            if (!page.corrupt.empty()) {
              json skipped = json::array();
              for (const auto& bad : page.corrupt) {
                skipped.push_back(bad.id);
                text += fmt::format("\n(skipped '{}': {})", bad.id, bad.problem);
              }
              out["skipped"] = std::move(skipped);
            }
            return mcp::ToolResult::text(text, std::move(out));
          },
      // A host that renders MCP Apps shows the dashboard with the list; the text is for the others.
      .meta = app::tool_meta(),
  });
}

void add_list_archived(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "list_archived_instances",
      .description = "Archived instances (restore_instance brings one back).",
      .input = input_object(json::object()),
      // archives: {name, id, archived_at, created_at, description}; count.
      .output = result_object({"archives", "count"}),
      .hints = {.read_only = true},
      .handler =
          [ctx](const json&, mcp::RequestContext&) {
            auto archived = ctx.services.instances.store().list_archived();
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
  add_tool(server, {
      .name = "describe_instance",
      .description = "One instance in detail: disk use, limits, exposed ports, whether it runs or why it stopped.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      // The instance, with network_allow ('filtered'), exposed_ports, disk_usage, limits (and their
      // usage when set) and a persistent one's living state.
      .output = kInstanceSchema,
      .hints = {.read_only = true},
      .handler =
          [ctx](const json& args, mcp::RequestContext&) {
            store::Instance inst = ctx.services.instances.store().get(string_arg(args, "instance_id"));
            json out = agent_instance_json(ctx, inst);
            const instances::Service::DiskUse use = ctx.services.instances.disk_use(inst);
            if (inst.network == config::Network::filtered) {
              std::vector<std::string> allow = ctx.services.config.network.allow;
              allow.insert(allow.end(), inst.network_allow.begin(), inst.network_allow.end());
              out["network_allow"] = allow;
            }
            if (const auto ports = ctx.services.instances.exposed_ports(inst); !ports.empty())
              out["exposed_ports"] = ports_json(ports);
            out["disk_usage"] = {{"workspace_bytes", use.workspace_bytes}, {"output_bytes", use.output_bytes},
                                 {"files", use.files}, {"layer_bytes", use.layer_bytes},
                                 {"snapshots_bytes", use.snapshots_bytes}};
            add_living_state(ctx, inst, out);
            out["limits"] = ctx.services.instances.limits(inst);
            // Where a person watches its desktop: the dashboard's, served over HTTP only (null
            // on stdio, where no browser reaches the server, and while the desktop is off).
            out["desktop_url"] = app::desktop_url_json(ctx.services, inst);
            std::string text = fmt::format(
                "Instance '{}'\nDescription: {}\nCreated: {}\nLast activity: {}\nNetwork: {}\nPersistent: {}\n"
                "Workspace: {} ({:.1f} MiB)\nOutput: {} ({:.1f} MiB)\nFiles: {}\nRoot: {}\nSnapshots: {:.1f} MiB\n"
                "Limits: {}",
                inst.id, inst.meta.description().empty() ? "(none)" : inst.meta.description(),
                out["created_at"].get<std::string>(), out["last_activity"].get<std::string>(),
                config::to_string(inst.network),
                inst.persistent ? "yes, " + living_summary(out) : "no (a fresh sandbox per command)",
                out["workspace"].get<std::string>(), use.workspace_bytes / 1048576.0,
                out["output"].get<std::string>(), use.output_bytes / 1048576.0, use.files,
                inst.image ? fmt::format("image {}, its own layer {:.1f} MiB", inst.image->image,
                                         use.layer_bytes / 1048576.0)
                           : std::string("the host's, read-only"),
                use.snapshots_bytes / 1048576.0, instances::limits_line(out["limits"]));
            // What being root there means (a single-uid map cannot hold other users).
            if (inst.image) text += fmt::format("\nIds: you are root (uid 0) inside; {}", inst.image->ids.source);
            if (out["desktop_url"].is_string())
              text += fmt::format("\nLive desktop: {}", out["desktop_url"].get<std::string>());
            return mcp::ToolResult::text(text, out);
          },
  });
}

void add_set_network_access(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "set_network_access",
      .description = fmt::format("Network off ('off'), or on ('{}' here, or the mode it has); applied at once.",
                                 config::to_string(network_on_mode(ctx))),
      .input = input_object({{"instance_id", kInstanceIdArg},
                             {"enabled", {{"type", "boolean"}, {"description", "On or off."}}}},
                            {"instance_id", "enabled"}),
      .output = kInstanceSchema,
      .hints = {.destructive = false, .idempotent = true},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            const std::string id = string_arg(args, "instance_id");
            const store::Instance current = ctx.services.instances.store().get(id);
            store::UpdateOptions options;
            if (!args.at("enabled").get<bool>()) {
              options.network = config::Network::off;
            } else if (current.network != config::Network::off) {
              options.network = current.network;  // on already
            } else {
              options.network = network_on_mode(ctx);
            }
            store::Instance inst = ctx.services.instances.update(id, options, actor(rc));
            const std::string note = network_change_note(ctx, current, inst, actor(rc));
            server.notify_resource_updated(instance_uri(inst.id));
            return mcp::ToolResult::text(fmt::format("Instance '{}': network {}{}.", inst.id,
                                                     config::to_string(inst.network), note),
                                         agent_instance_json(ctx, inst));
          },
  });
}

void add_expose_port(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "expose_port",
      .description = "Forward a port a server in the instance listens on to 127.0.0.1:host_port on the host, for "
                     "the user to open; kept until close or delete. Not for network 'host'.",
      .input = input_object(
          {{"instance_id", kInstanceIdArg},
           {"port", {{"type", "integer"}, {"minimum", 1}, {"maximum", 65535}, {"description", "Port inside."}}},
           {"host_port",
            {{"type", "integer"},
             {"minimum", 0},
             {"maximum", 65535},
             {"description", fmt::format("One of {} (default: a free one).",
                                         config::to_string(ctx.services.config.network.expose_port_range))}}},
           {"close", {{"type", "boolean"}, {"description", "End the forward."}}}},
          {"instance_id", "port"}),
      // instance_id, port; host_port and url when opened; exposed_ports: {port, host_port, forwarding}.
      .output = result_object({"exposed_ports"}),
      .hints = {.destructive = false, .idempotent = true, .open_world = false},
      .handler =
          [ctx](const json& args, mcp::RequestContext& rc) {
            const store::Instance inst = ctx.services.instances.store().get(string_arg(args, "instance_id"));
            const auto port = static_cast<std::uint16_t>(int_arg(args, "port", 0));
            instances::Service& lc = ctx.services.instances;
            json out = {{"instance_id", inst.id}, {"port", port}};
            std::string text;
            if (args.value("close", false)) {
              text = lc.unexpose_port(inst, port, actor(rc))
                         ? fmt::format("Port {} of instance '{}' is no longer exposed.", port, inst.id)
                         : fmt::format("Port {} of instance '{}' was not exposed.", port, inst.id);
            } else {
              const sandbox::ExposedPort e =
                  lc.expose_port(inst, port, static_cast<std::uint16_t>(int_arg(args, "host_port", 0)), actor(rc));
              out["host_port"] = e.host_port;
              out["url"] = fmt::format("http://127.0.0.1:{}/", e.host_port);
              text = fmt::format("Port {} of instance '{}' is at 127.0.0.1:{} on the host ({}).", port, inst.id,
                                 e.host_port, out["url"].get<std::string>());
            }
            out["exposed_ports"] = ports_json(lc.exposed_ports(inst));
            return mcp::ToolResult::text(text, out);
          },
  });
}

void add_update(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "update_instance",
      .description = "Change description, network, network_allow or persistent. A running instance switches "
                     "network at once (to or from 'host': restarted).",
      .input = input_object({{"instance_id", kInstanceIdArg},
                             {"description", {{"type", "string"}, {"description", "New description."}}},
                             {"network", network_arg(ctx, false)},
                             {"network_allow", kAllowArg},
                             {"persistent", kPersistentArg}},
                            {"instance_id"}),
      .output = kInstanceSchema,
      .hints = {.destructive = false, .idempotent = true},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::UpdateOptions options;
            if (args.contains("description")) options.description = string_arg(args, "description");
            options.network = arg_network(args);
            if (args.contains("network_allow")) options.network_allow = allow_arg(args);
            options.persistent = arg_persistent(args);
            if (!options.description && !options.network && !options.network_allow && !options.persistent)
              throw UsageError("nothing to update: give description, network, network_allow and/or persistent");
            const std::string id = string_arg(args, "instance_id");
            const store::Instance current = ctx.services.instances.store().get(id);
            if (options.persistent == false) {
              // A living sandbox left running would be out of reach of every command after this.
              if (current.persistent &&
                  ctx.services.instances.living_status(current).running)
                throw UsageError(fmt::format("instance '{}' is running; stop it first with stop_instance, then "
                                             "set persistent=false", id));
            }
            store::Instance inst = ctx.services.instances.update(id, options, actor(rc));
            std::string network_note;
            if (options.network || options.network_allow)
              network_note = network_change_note(ctx, current, inst, actor(rc));
            server.notify_resource_updated(instance_uri(inst.id));
            return mcp::ToolResult::text(
                fmt::format("Updated instance '{}': description \"{}\", network {}{}, {}.", inst.id,
                            inst.meta.description(), config::to_string(inst.network), network_note,
                            inst.persistent ? "persistent" : "not persistent"),
                agent_instance_json(ctx, inst));
          },
  });
}

// The result of stop_instance and restart_instance: the living state, whether it ran, the jobs
// ended (also as a sentence for the text).
std::pair<json, std::string> ended_result(const store::Instance& inst, const instances::Ended& ended) {
  json out = instances::state_json(ended.status);
  out["instance_id"] = inst.id;
  out["was_running"] = ended.was_running;
  json items;
  std::string jobs_text = ended_jobs_text(ended, items);
  out["jobs_ended"] = std::move(items);
  return {std::move(out), std::move(jobs_text)};
}

void add_stop(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "stop_instance",
      .description = "Stop a persistent instance: cancels its jobs, ends its processes. Files stay; the next "
                     "command starts it.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      // instance_id, was_running, jobs_ended: {job_id, command, status}, state, last_end.
      .output = result_object({"was_running", "state"}),
      .hints = {.destructive = true, .idempotent = true},
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::Instance inst = living_instance(ctx, args, "stop");
            instances::Ended ended = ctx.services.instances.stop(inst, actor(rc));
            server.notify_resource_updated(instance_uri(inst.id));
            auto [out, jobs_text] = ended_result(inst, ended);
            return mcp::ToolResult::text(
                fmt::format("{}{} Its files are kept; the next command starts it again.",
                            ended.was_running ? fmt::format("Stopped instance '{}': every process ended.", inst.id)
                                              : fmt::format("Instance '{}' was not running.", inst.id),
                            jobs_text),
                out);
          },
  });
}

void add_restart(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "restart_instance",
      .description = "stop_instance, then a fresh sandbox (empty /tmp, current network).",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      // As stop_instance, and the new sandbox's running_since, processes, memory_bytes.
      .output = result_object({"was_running", "state"}),
      .hints = {.destructive = true, },
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::Instance inst = living_instance(ctx, args, "restart");
            instances::Ended ended = ctx.services.instances.restart(inst, actor(rc));
            server.notify_resource_updated(instance_uri(inst.id));
            auto [out, jobs_text] = ended_result(inst, ended);
            return mcp::ToolResult::text(
                fmt::format("Restarted instance '{}'{}: a fresh sandbox is {}.{} Its files are kept.", inst.id,
                            ended.was_running ? " (every process ended)" : " (it was not running)",
                            living_summary(out), jobs_text),
                out);
          },
  });
}

void add_archive(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "archive_instance",
      .description = "Set an instance aside: its files stay, its id is free; restore_instance brings it back.",
      .input = input_object({{"instance_id", kInstanceIdArg}}, {"instance_id"}),
      // instance_id, archive_name, archived_at.
      .output = result_object({"archive_name"}),
      .hints = {.destructive = true, },
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            const std::string id = string_arg(args, "instance_id");
            store::ArchivedInstance archived = with_job_advice(ctx, id, [&] { return ctx.services.instances.archive(id, actor(rc)); });
            server.notify_resource_list_changed();
            server.notify_resource_updated(instance_uri(id));
            return mcp::ToolResult::text(
                fmt::format("Archived instance '{}' as {}; restore_instance brings it back.", id, archived.name),
                json{{"instance_id", id}, {"archive_name", archived.name}, {"archived_at", archived.meta.archived_at()}});
          },
  });
}

void add_restore(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "restore_instance",
      .description = "Bring back an archived instance with its files, under its old id or new_instance_id "
                     "('<id>-restored' when taken).",
      .input = input_object(
          {{"archive_name", {{"type", "string"}, {"description", "Archive name (<id>__<time>)."}}},
           {"instance_id", {{"type", "string"}, {"description", "Or: the id it was archived from (its newest archive)."}}},
           {"new_instance_id", {{"type", "string"}, {"description", "Id to restore it under (default: its old id)."}}}}),
      .output = kInstanceSchema,
      .hints = {.destructive = false, },
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            store::Instance inst = ctx.services.instances.restore(archive_to_restore(ctx, args),
                                                              string_arg(args, "new_instance_id"), actor(rc));
            server.notify_resource_list_changed();
            json out = agent_instance_json(ctx, inst);
            const std::string from = inst.meta.raw.value("restored_from", "");
            out["restored_from"] = from;
            return mcp::ToolResult::text(
                fmt::format("Restored {} as instance '{}' with its workspace and output.", from, inst.id), out);
          },
  });
}

void add_delete(mcp::Server& server, const ToolContext& ctx) {
  add_tool(server, {
      .name = "delete_instance",
      .description = "Delete an instance, or an archive, with all its files, for good (archive_instance keeps them).",
      .input = with_confirm(input_object(
          {{"instance_id", kInstanceIdArg},
           {"archive_name", {{"type", "string"}, {"description", "Or: an archive name (<id>__<time>)."}}}})),
      // deleted: the id or archive name; archived: whether it was an archive.
      .output = result_object({"deleted"}),
      .hints = {.destructive = true, },
      .handler =
          [ctx, &server](const json& args, mcp::RequestContext& rc) {
            const std::string id = string_arg(args, "instance_id");
            const std::string archive = string_arg(args, "archive_name");
            if (id.empty() == archive.empty()) throw UsageError("give exactly one of instance_id and archive_name");
            // Asked only about what exists (a wrong id is said as not found, not confirmed first).
            if (!id.empty()) ctx.services.instances.store().get(id);
            confirm(ctx, rc, "delete_instance", args,
                    id.empty() ? fmt::format("Delete archive '{}' with all its files, for good?", archive)
                               : fmt::format("Delete instance '{}' with all its files, for good?", id));
            if (!id.empty()) {
              with_job_advice(ctx, id, [&] { ctx.services.instances.remove(id, actor(rc)); });
              server.notify_resource_list_changed();
              server.notify_resource_updated(instance_uri(id));
            } else {
              ctx.services.instances.remove_archived(archive, actor(rc));
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
  add_set_network_access(server, ctx);
  add_expose_port(server, ctx);
  add_stop(server, ctx);
  add_restart(server, ctx);
  add_archive(server, ctx);
  add_restore(server, ctx);
  add_delete(server, ctx);
}

config::Network network_on_mode(const ToolContext& ctx) {
  const config::Network configured = ctx.services.instances.store().default_network();
  return configured != config::Network::off ? configured
         : network::nat_unavailable()      ? config::Network::filtered
                                           : config::Network::nat;
}

}  // namespace nshpc::tools
