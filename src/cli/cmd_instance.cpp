// ns-hpc instance create|list|list-archived|describe|update|start|stop|restart|ps|archive|delete|
// enter, and clean.
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "cli/output.hpp"
#include "desktop/wire.hpp"
#include "instances/desktops.hpp"
#include "instances/instances.hpp"

namespace nshpc::cli {

namespace {

// --network off|nat|filtered|host, of `instance create` and `instance update`.
void add_network_option(CLI::App& cmd, std::optional<config::Network>& network, const std::string& help) {
  add_choice(cmd, "--network", network,
             named({config::Network::off, config::Network::nat, config::Network::filtered, config::Network::host}), help);
}

// --persistent / --no-persistent, of `instance create` and `instance update`.
void add_persistent_option(CLI::App& cmd, std::optional<bool>& persistent, const std::string& help) {
  cmd.add_flag_function("--persistent,!--no-persistent", [&persistent](std::int64_t n) { persistent = n > 0; }, help);
}

// A persistent instance's living state as data (instances::state_json), added to `out`; state
// "unknown" (and a warning) when the backend cannot tell, so one instance never fails a listing.
// Nothing is asked for an instance that is not persistent.
void add_living_state(Invocation& inv, const store::Instance& inst, nlohmann::json& out) {
  if (!inst.persistent) return;
  try {
    out.update(instances::state_json(inv.instances().living_status(inst)));
  } catch (const std::exception& e) {
    log::warn("instance '{}': state unknown: {}", inst.id, e.what());
    out["state"] = "unknown";
    out["state_error"] = e.what();
  }
}

// "running since 2026-06-12 10:31:02, 3 processes, 12.5 MiB" and the like, from add_living_state's fields.
std::string living_line(const nlohmann::json& state) {
  const std::string name = state.value("state", "");
  if (name == "running")
    return fmt::format("running since {}, {} process(es), {:.1f} MiB", short_time(state.value("running_since", "")),
                       state.value("processes", std::size_t{0}), state.value("memory_bytes", std::uint64_t{0}) / 1048576.0);
  if (name == "stopped") {
    std::string line = "stopped";
    if (state.contains("last_end"))
      line += fmt::format(" ({} at {})", state["last_end"].get<std::string>(), short_time(state.value("ended_at", "")));
    return line;
  }
  return "unknown (" + state.value("state_error", "") + ")";
}

// Text a sandbox wrote (a process's command line), safe to print on a terminal: valid UTF-8,
// control characters (C0, DEL, C1) shown as '?'.
std::string printable(std::string_view untrusted) {
  std::string s = text::sanitize_utf8(untrusted);
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      out += '?';
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      out += '?';
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// "45s", "12m05s", "3h02m", "2d04h".
std::string short_age(std::chrono::seconds age) {
  const long long s = age.count();
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

// The instance `instance start|stop|restart|ps` act on: an existing, persistent one.
store::Instance living_instance(Invocation& inv, const std::string& id, std::string_view action) {
  store::Instance inst = inv.store().get(id);
  if (!inst.persistent)
    throw UsageError(fmt::format(
        "instance '{}' is not persistent: each command runs in a fresh sandbox that ends with it, so there is "
        "nothing to {} ('ns-hpc instance cancel {} JOB' ends a job; 'ns-hpc instance update {} --persistent' "
        "makes it a living instance)",
        inst.id, action, inst.id, inst.id));
  return inst;
}



// What a stop or restart did, for people.
void print_ended(const instances::Ended& ended) {
  for (const auto& r : ended.jobs)
    std::printf("Ended job %s (%s): %s\n", r.id.c_str(), text::truncate_utf8(r.command, 60).c_str(),
                jobs::to_string(r.state).c_str());
  for (const auto& problem : ended.problems) std::printf("Warning: job %s\n", problem.c_str());
}

nlohmann::json ended_json(const store::Instance& inst, const instances::Ended& ended) {
  nlohmann::json out = instances::state_json(ended.status);
  out["id"] = inst.id;
  out["was_running"] = ended.was_running;
  out["jobs_ended"] = nlohmann::json::array();
  for (const auto& r : ended.jobs)
    out["jobs_ended"].push_back({{"job_id", r.id}, {"command", r.command}, {"status", jobs::to_string(r.state)}});
  if (!ended.problems.empty()) out["problems"] = ended.problems;
  return out;
}

// An existing instance, even one whose metadata.json is corrupt (it can still be archived or
// deleted); UsageError otherwise.
void require_instance(Invocation& inv, const std::string& id) {
  if (!inv.store().exists(id)) (void)inv.store().get(id);  // NotFound, with an archive or a near miss
}

void describe_text(const store::Instance& inst, const nlohmann::json& state) {
  std::printf("ID:            %s\n", inst.id.c_str());
  std::printf("Created at:    %s\n", inst.meta.created_at().empty() ? "unknown" : inst.meta.created_at().c_str());
  std::printf("Last activity: %s\n", short_time(inst.last_activity()).c_str());
  std::printf("Hostname:      %s\n", inst.meta.hostname().c_str());
  std::printf("Description:   %s\n", inst.meta.description().c_str());
  std::printf("Network:       %s\n", std::string(config::to_string(inst.network)).c_str());
  if (inst.image) {
    std::printf("Root:          image %s, its own layer in %s\n", inst.image->image.c_str(), inst.layer_dir().c_str());
    std::printf("Ids:           %s\n", inst.image->ids.source.c_str());
  } else {
    std::printf("Root:          the host's, read-only\n");
  }
  std::printf("Persistent:    %s\n", inst.persistent ? "yes" : "no (a fresh sandbox per command)");
  if (inst.persistent) std::printf("State:         %s\n", living_line(state).c_str());
  std::printf("Workspace:     %s\n", inst.workspace.c_str());
  std::printf("Output:        %s\n", inst.output.c_str());
}

nlohmann::json disk_use_json(const instances::Service::DiskUse& use) {
  return {{"workspace_bytes", use.workspace_bytes}, {"output_bytes", use.output_bytes}, {"files", use.files},
          {"layer_bytes", use.layer_bytes}, {"snapshots_bytes", use.snapshots_bytes}};
}

std::string mib(std::uint64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

struct InstanceArgs {
  std::string id;
  std::string description;
  std::optional<std::string> new_description;
  std::optional<config::Network> network;
  std::optional<bool> persistent;
  std::optional<std::string> image;
  bool json = false;
  bool force = false;
  bool archived = false;
  std::string new_id;
  int port = 0, host_port = 0;
  bool close = false;
  std::vector<std::string> allow;
  bool desktop = false;
  std::string state;  // instance desktop: on or off
};

void add_create(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("create", "Create an instance (a persistent workspace)");
  cmd->add_option("id", a->id,
                  "Instance id: 1-63 of A-Z a-z 0-9 _ . -, starting with a letter or digit "
                  "(omitted: a readable one is generated)");
  cmd->add_option("-d,--description", a->description, "What the instance is for");
  add_network_option(*cmd, a->network,
                     "Network of its sandboxes: off (own loopback only), nat (the outside world, not the host), "
                     "filtered (only [network] allow, through a proxy) or host (shares the host's loopback "
                     "services and abstract Unix sockets: the weakest). Default: [namespace] default_network "
                     "(auto: nat where it works, else filtered)");
  add_persistent_option(*cmd, a->persistent,
                        "A living instance: one long-lived sandbox that commands and jobs join, so background "
                        "processes, /tmp and loopback servers stay between commands (default: [namespace] "
                        "persistent)");
  cmd->add_option("--image", a->image,
                  "Run on this image (ns-hpc image list) with a writable root of its own, as its root user: what "
                  "apt-get install adds stays; always persistent")
      ->expected(0, 1);
  cmd->add_option("--allow", a->allow,
                  "For filtered: what it may reach besides [network] allow (repeat: --allow pypi.org --allow "
                  "'*.debian.org:443')");
  cmd->add_flag("--desktop", a->desktop,
                "With an Xfce desktop, on [desktop] image unless --image names another desktop image");
  cmd->add_flag("--json", a->json, "Print the new instance as JSON");
  cmd->callback([&inv, a] {
    store::CreateOptions options;
    options.description = a->description;
    options.network = a->network;
    options.network_allow = a->allow;
    options.persistent = a->persistent;
    options.desktop = a->desktop;
    if (a->desktop && !a->image) options.image = inv.config().desktop.image;
    if (a->image) {
      options.image = a->image->empty() ? inv.config().ns.default_image : *a->image;
      if (options.image.empty())
        throw UsageError("--image without a name uses [namespace] default_image, which is empty; give an image name");
    }
    store::Instance inst = inv.instances().create(a->id, options, users::cli_actor());
    const auto archive = a->id.empty() ? std::nullopt : inv.store().latest_archive(inst.id);
    if (a->json) {
      nlohmann::json out = instance_host_json(inst);
      if (archive) out["archive_of_same_id"] = archived_json(*archive);
      print_json(out);
      return;
    }
    std::printf("Created instance '%s' at %s\n", inst.id.c_str(), inst.base.c_str());
    if (archive)
      std::printf("Note: an archive of '%s' exists (%s, archived %s); this is a new, empty instance. "
                  "'ns-hpc instance restore %s --as ID' brings the archive back under another id.\n",
                  inst.id.c_str(), archive->name.c_str(), short_time(archive->meta.archived_at()).c_str(),
                  archive->name.c_str());
  });
}

void add_list(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("list", "List active instances");
  auto query = std::make_shared<store::ListQuery>();
  query->sort = store::SortBy::id;
  query->limit = 0;
  cmd->add_option("--filter", query->filter, "Only instances whose id or description contains TEXT (any case)");
  auto sort = std::make_shared<std::optional<store::SortBy>>();
  add_choice(*cmd, "--sort", *sort, Choices<store::SortBy>{{"id", store::SortBy::id}, {"activity", store::SortBy::last_activity}},
             "id (default) or activity (most recently active first)");
  cmd->add_option("--limit", query->limit, "At most N instances (default: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--offset", query->offset, "Skip the first N")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", a->json, "Print a JSON array");
  cmd->callback([&inv, a, query, sort] {
    query->sort = sort->value_or(store::SortBy::id);
    store::Page page = inv.store().list_page(*query);
    for (const auto& bad : page.corrupt) log::warn("instance '{}' skipped: {}", bad.id, bad.problem);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& inst : page.instances) {
      nlohmann::json item = instance_host_json(inst);
      add_living_state(inv, inst, item);  // persistent instances only
      // For scripts only: a walk of every instance's trees is too slow for the table.
      if (a->json) item["disk_usage"] = disk_use_json(inv.instances().disk_use(inst));
      out.push_back(std::move(item));
    }
    if (a->json) {
      print_json(out);
      return;
    }
    if (page.instances.empty()) {
      if (page.total > 0)
        std::printf("No instances from position %zu on (%zu in all).\n", query->offset, page.total);
      else
        std::puts(query->filter.empty() ? "No instances found." : "No instance matches.");
      return;
    }
    // STATE: "-" for an instance that is not persistent, else running/stopped (or unknown).
    std::vector<std::vector<std::string>> rows{{"ID", "CREATED", "LAST ACTIVITY", "NETWORK", "STATE", "DESCRIPTION"}};
    for (std::size_t i = 0; i < page.instances.size(); ++i) {
      const auto& inst = page.instances[i];
      rows.push_back({inst.id, short_time(inst.meta.created_at()), short_time(inst.last_activity()),
                      std::string(config::to_string(inst.network)), out[i].value("state", "-"),
                      inst.meta.description()});
    }
    print_table(rows);
    const std::size_t next = query->offset + page.instances.size();
    if (next < page.total) std::printf("%zu more: --offset %zu\n", page.total - next, next);
  });
}

void add_list_archived(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("list-archived", "List archived instances");
  cmd->add_flag("--json", a->json, "Print a JSON array");
  cmd->callback([&inv, a] {
    auto archived = inv.store().list_archived();
    if (a->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& entry : archived) out.push_back(archived_json(entry));
      print_json(out);
      return;
    }
    if (archived.empty()) {
      std::puts("No archived instances found.");
      return;
    }
    std::vector<std::vector<std::string>> rows{{"ARCHIVE", "ID", "ARCHIVED", "CREATED"}};
    for (const auto& entry : archived)
      rows.push_back({entry.name, entry.id, short_time(entry.meta.archived_at()),
                      short_time(entry.meta.created_at())});
    print_table(rows);
  });
}

void add_describe(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("describe", "Show an instance's metadata and folders");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&inv, a] {
    store::Instance inst = inv.store().get(a->id);
    const instances::Service::DiskUse use = inv.instances().disk_use(inst);
    nlohmann::json out = instance_host_json(inst);
    add_living_state(inv, inst, out);
    out["limits"] = inv.instances().limits(inst);
    if (a->json) {
      out["disk_usage"] = disk_use_json(use);
      print_json(out);
    } else {
      describe_text(inst, out);
      std::printf("Disk use:      %s in the workspace, %s in output, %llu files; %s root layer, %s snapshots\n",
                  mib(use.workspace_bytes).c_str(), mib(use.output_bytes).c_str(),
                  static_cast<unsigned long long>(use.files), inst.image ? mib(use.layer_bytes).c_str() : "no",
                  mib(use.snapshots_bytes).c_str());
      std::printf("Limits:        %s\n", instances::limits_line(out["limits"]).c_str());
    }
  });
}

void add_update(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("update", "Change an instance's description or network");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("-d,--description", a->new_description, "New description");
  add_network_option(*cmd, a->network,
                     "off, nat, filtered or host (a running instance switches at once among the first three; a "
                     "living one changed to or from host is restarted)");
  add_persistent_option(*cmd, a->persistent,
                        "Make it a living instance, or (--no-persistent, once stopped) one with a fresh sandbox "
                        "per command");
  auto* allow = cmd->add_option("--allow", a->allow,
                                 "For filtered: replace what it may reach besides [network] allow (repeat it; "
                                 "--allow '' clears them)");
  cmd->add_flag("--json", a->json, "Print the updated instance as JSON");
  cmd->callback([&inv, a, allow] {
    store::UpdateOptions options;
    options.description = a->new_description;
    options.network = a->network;
    if (allow->count() > 0) {
      std::vector<std::string> entries;
      for (const std::string& e : a->allow)
        if (!e.empty()) entries.push_back(e);
      options.network_allow = std::move(entries);
    }
    options.persistent = a->persistent;
    if (!options.description && !options.network && !options.network_allow && !options.persistent)
      throw UsageError("nothing to update; pass --description TEXT, --network MODE, --allow ENTRY and/or "
                       "--persistent|--no-persistent");
    if (options.persistent == false) {
      // A living sandbox left running would be out of reach of every command after this.
      store::Instance current = inv.store().get(a->id);
      if (current.persistent && inv.instances().living_status(current).running)
        throw UsageError(fmt::format("instance '{}' is running; stop it first ('ns-hpc instance stop {}')",
                                     current.id, current.id));
    }
    store::Instance inst = inv.instances().update(a->id, options, users::cli_actor());
    std::string applied;
    if (options.network || options.network_allow) {
      switch (inv.instances().apply_network(inst, users::cli_actor())) {
        case instances::Service::NetworkChange::applied: applied = " (applied to the running sandbox)"; break;
        case instances::Service::NetworkChange::restarted: applied = " (the running sandbox was restarted)"; break;
        case instances::Service::NetworkChange::not_running: break;
      }
    }
    if (a->json) {
      print_json(instance_host_json(inst));
      return;
    }
    std::printf("Updated instance '%s'.\n", inst.id.c_str());
    std::printf("Description: %s\n", inst.meta.description().c_str());
    std::printf("Network: %s%s\n", std::string(config::to_string(inst.network)).c_str(), applied.c_str());
    std::printf("Persistent: %s\n", inst.persistent ? "yes" : "no");
  });
}

void add_start(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("start", "Start a persistent instance's sandbox now (else the first command does)");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--json", a->json, "Print the state as JSON");
  cmd->callback([&inv, a] {
    store::Instance inst = living_instance(inv, a->id, "start");
    const sandbox::LivingStatus status = inv.instances().start(inst, users::cli_actor());
    nlohmann::json out = instances::state_json(status);
    out["id"] = inst.id;
    if (a->json)
      print_json(out);
    else
      std::printf("Instance '%s': %s.\n", inst.id.c_str(), living_line(out).c_str());
  });
}

void add_stop(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "stop", "End every process of a persistent instance (its running jobs are cancelled first); files stay");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--json", a->json, "Print what was done as JSON");
  cmd->callback([&inv, a] {
    store::Instance inst = living_instance(inv, a->id, "stop");
    const instances::Ended ended = inv.instances().stop(inst, users::cli_actor());
    if (a->json) {
      print_json(ended_json(inst, ended));
      return;
    }
    print_ended(ended);
    if (ended.was_running)
      std::printf("Stopped instance '%s'.\n", inst.id.c_str());
    else
      std::printf("Instance '%s' was not running.\n", inst.id.c_str());
  });
}

void add_restart(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "restart", "End every process of a persistent instance (running jobs first) and start a fresh sandbox");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--json", a->json, "Print what was done as JSON");
  cmd->callback([&inv, a] {
    store::Instance inst = living_instance(inv, a->id, "restart");
    const instances::Ended ended = inv.instances().restart(inst, users::cli_actor());
    const nlohmann::json out = ended_json(inst, ended);
    if (a->json) {
      print_json(out);
      return;
    }
    print_ended(ended);
    std::printf("Restarted instance '%s': %s.\n", inst.id.c_str(), living_line(out).c_str());
  });
}

void add_ps(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("ps", "List the processes of a persistent instance's sandbox");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("--json", a->json, "Print a JSON array");
  cmd->callback([&inv, a] {
    store::Instance inst = living_instance(inv, a->id, "list");
    const auto processes = inv.instances().processes(inst);
    if (a->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& p : processes)
        out.push_back({{"pid", p.pid}, {"ppid", p.ppid}, {"rss_bytes", p.rss_bytes},
                       {"age_seconds", p.age.count()}, {"command", text::sanitize_utf8(p.command)}});
      print_json(out);
      return;
    }
    if (processes.empty()) {
      std::printf("Instance '%s' is not running.\n", inst.id.c_str());
      return;
    }
    std::vector<std::vector<std::string>> rows{{"PID", "PPID", "RSS", "AGE", "COMMAND"}};
    for (const auto& p : processes)
      rows.push_back({std::to_string(p.pid), std::to_string(p.ppid), fmt::format("{:.1f}M", p.rss_bytes / 1048576.0),
                      short_age(p.age), printable(p.command)});
    print_table(rows);
  });
}

void add_archive(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("archive", "Archive an instance (moves it aside; no new jobs)");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_flag("-f,--force", a->force, "Do not ask for confirmation");
  cmd->add_flag("--json", a->json, "Print the archive entry as JSON");
  cmd->callback([&inv, a] {
    require_instance(inv, a->id);  // unknown ids fail before the question
    if (!a->force && !confirm(fmt::format("Archive instance '{}' and disable new jobs?", a->id))) {
      std::fprintf(stderr, "Aborted.\n");
      inv.exit_code = 1;
      return;
    }
    store::ArchivedInstance archived = inv.instances().archive(a->id, users::cli_actor());
    if (a->json)
      print_json(archived_json(archived));
    else
      std::printf("Archived instance '%s' as %s.\n", a->id.c_str(), archived.name.c_str());
  });
}

void add_restore(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "restore", "Bring an archived instance back (to its old id, or ID-restored when that is taken)");
  cmd->add_option("archive", a->id, "Archive name from list-archived (<id>__<timestamp>), or an id (its newest archive)")
      ->required();
  cmd->add_option("--as", a->new_id, "The id it gets (default: its old id)");
  cmd->add_flag("--json", a->json, "Print the restored instance as JSON");
  cmd->callback([&inv, a] {
    store::Instance inst = inv.instances().restore(a->id, a->new_id, users::cli_actor());
    if (a->json) {
      print_json(instance_host_json(inst));
      return;
    }
    std::printf("Restored '%s' as instance '%s' at %s\n", inst.meta.raw.value("restored_from", a->id).c_str(),
                inst.id.c_str(), inst.base.c_str());
  });
}

void add_delete(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "delete", "Delete an instance and its workspace and output for good (purge)");
  cmd->add_option("id", a->id, "Instance id, or with --archived an archive name from list-archived")
      ->required();
  cmd->add_flag("-f,--force", a->force, "Do not ask for confirmation");
  cmd->add_flag("--archived", a->archived, "Delete an archived instance (name from list-archived)");
  cmd->callback([&inv, a] {
    if (!a->archived) require_instance(inv, a->id);
    const std::string what = a->archived ? fmt::format("archive '{}'", a->id)
                                         : fmt::format("instance '{}'", a->id);
    if (!a->force &&
        !confirm(fmt::format("Delete {} with its workspace and output? This cannot be undone.", what))) {
      std::fprintf(stderr, "Aborted.\n");
      inv.exit_code = 1;
      return;
    }
    if (a->archived)
      inv.instances().remove_archived(a->id, users::cli_actor());
    else
      inv.instances().remove(a->id, users::cli_actor());
    std::printf("Deleted %s.\n", what.c_str());
  });
}

void add_expose(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "expose",
      "Forward a port a server inside an instance listens on to the host's 127.0.0.1 (kept until --close or the "
      "instance is deleted); without PORT, list the exposed ports");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("port", a->port, "The port inside")->check(CLI::Range(1, 65535));
  cmd->add_option("--host-port", a->host_port,
                  "The port on the host's 127.0.0.1, within [network] expose_port_range (default: a free one of it)")
      ->check(CLI::Range(0, 65535));
  cmd->add_flag("--close", a->close, "End the forward of PORT");
  cmd->add_flag("--json", a->json, "Print the exposed ports as JSON");
  cmd->callback([&inv, a] {
    const store::Instance inst = inv.store().get(a->id);
    instances::Service& lc = inv.instances();
    const auto port = static_cast<std::uint16_t>(a->port);
    if (a->port != 0 && a->close) {
      if (!lc.unexpose_port(inst, port, users::cli_actor()))
        throw UsageError(fmt::format("port {} of instance '{}' is not exposed", port, inst.id));
      if (!a->json) std::printf("Port %u of instance '%s' is no longer exposed.\n", port, inst.id.c_str());
    } else if (a->port != 0) {
      const sandbox::ExposedPort e =
          lc.expose_port(inst, port, static_cast<std::uint16_t>(a->host_port), users::cli_actor());
      if (!a->json)
        std::printf("Port %u of instance '%s' is at http://127.0.0.1:%u/ on this host.\n", port, inst.id.c_str(),
                    e.host_port);
    } else if (a->close) {
      throw UsageError("--close needs the PORT to close");
    }
    const std::vector<sandbox::ExposedPort> ports = lc.exposed_ports(inst);
    if (a->json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& p : ports)
        list.push_back({{"port", p.port}, {"host_port", p.host_port}, {"forwarding", p.forwarding}});
      print_json(list);
    } else if (a->port == 0) {
      if (ports.empty()) std::printf("Instance '%s' exposes no ports.\n", inst.id.c_str());
      for (const auto& p : ports)
        std::printf("%u -> 127.0.0.1:%u%s\n", p.port, p.host_port,
                    p.forwarding ? "" : " (not forwarding now: starts again with its sandbox)");
    }
  });
}

void add_enter(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "enter", "Open an interactive bash in the instance's sandbox (on a private terminal relayed to yours)");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->callback([&inv, a] {
    store::Instance inst = inv.store().get(a->id);
    if (!::isatty(STDIN_FILENO))
      throw UsageError(fmt::format(
          "'instance enter' needs a terminal on stdin; for scripts use: ns-hpc bwrap {} -- CMD", inst.id));
    inv.exit_code = run_in_sandbox(inv, inst, {"/bin/bash", "-i"}, "sandbox.enter");
  });
}

void add_desktop(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand(
      "desktop",
      "Switch an instance's Xfce desktop on or off in place (files and processes stay); without on/off, say whether "
      "it is on");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("state", a->state, "on or off")->check(CLI::IsMember({"on", "off"}));
  cmd->callback([&inv, a] {
    store::Instance inst = inv.store().get(a->id);
    if (!a->state.empty()) inst = inv.instances().desktops().set(inst, a->state == "on", users::cli_actor());
    if (!inst.meta.desktop()) {
      std::printf("The desktop of instance '%s' is off.\n", inst.id.c_str());
      return;
    }
    std::printf("The desktop of instance '%s' is on (%dx%d): its commands get DISPLAY=%s.\n", inst.id.c_str(),
                inv.instances().desktops().width(), inv.instances().desktops().height(),
                std::string(desktop::kDisplay).c_str());
  });
}

}  // namespace

void add_instance_commands(CLI::App& app, Invocation& inv) {
  auto* instance = app.add_subcommand("instance", "Manage sandbox instances");
  instance->require_subcommand(1);
  auto args = std::make_shared<InstanceArgs>();
  add_create(*instance, inv, args);
  add_list(*instance, inv, args);
  add_list_archived(*instance, inv, args);
  add_describe(*instance, inv, args);
  add_update(*instance, inv, args);
  add_start(*instance, inv, args);
  add_stop(*instance, inv, args);
  add_restart(*instance, inv, args);
  add_ps(*instance, inv, args);
  add_archive(*instance, inv, args);
  add_restore(*instance, inv, args);
  add_delete(*instance, inv, args);
  add_enter(*instance, inv, args);
  add_expose(*instance, inv, args);
  add_desktop(*instance, inv, args);
  add_job_commands(*instance, inv);
  add_snapshot_commands(*instance, inv);
}

void add_clean_command(CLI::App& app, Invocation& inv) {
  struct Args {
    int days = 7;
    bool force = false;
    bool dry_run = false;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("clean", "Archive instances with no activity for N days");
  cmd->add_option("-d,--days", a->days, "Idle days (default 7)")->check(CLI::Range(0, 36500));
  cmd->add_flag("-f,--force", a->force, "Do not ask for confirmation");
  cmd->add_flag("--dry-run", a->dry_run, "Only list what would be archived");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([&inv, a] {
    auto candidates = inv.store().clean_candidates(std::chrono::hours(24) * a->days);
    nlohmann::json report = {{"days", a->days}, {"dry_run", a->dry_run},
                             {"archived", nlohmann::json::array()}, {"skipped", nlohmann::json::array()},
                             {"candidates", nlohmann::json::array()}};
    // What each candidate holds on disk (an archive keeps all of it: workspace, output, root
    // layer and snapshots); unknown for one whose metadata.json cannot be read.
    std::vector<std::optional<instances::Service::DiskUse>> uses;
    for (const auto& c : candidates) {
      std::optional<instances::Service::DiskUse> use;
      try {
        if (c.note.empty()) use = inv.instances().disk_use(inv.store().get(c.id));
      } catch (const Error& e) {
        log::warn("instance '{}': disk use unknown: {}", c.id, e.what());
      }
      nlohmann::json item = {{"id", c.id}, {"last_activity", short_time(c.last_activity)}, {"note", c.note}};
      if (use) item["disk_usage"] = disk_use_json(*use);
      report["candidates"].push_back(std::move(item));
      uses.push_back(use);
    }
    if (!a->json) {
      if (candidates.empty()) {
        std::printf("No instances idle for more than %d days found.\n", a->days);
        return;
      }
      std::printf("Found %zu instance(s) idle for more than %d days:\n", candidates.size(), a->days);
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        const auto& c = candidates[i];
        const std::string size =
            uses[i] ? fmt::format("; {} on disk, root layer {}, snapshots {}",
                                  mib(uses[i]->workspace_bytes + uses[i]->output_bytes + uses[i]->layer_bytes +
                                      uses[i]->snapshots_bytes),
                                  mib(uses[i]->layer_bytes), mib(uses[i]->snapshots_bytes))
                    : "";
        std::printf("  %s (last activity: %s%s)%s\n", c.id.c_str(), short_time(c.last_activity).c_str(), size.c_str(),
                    c.note.empty() ? "" : (" — " + c.note).c_str());
      }
    }
    if (a->dry_run || candidates.empty()) {
      if (a->json) print_json(report);
      return;
    }
    if (!a->force && !confirm("Archive these instances?")) {
      std::fprintf(stderr, "Aborted.\n");
      inv.exit_code = 1;
      return;
    }
    for (const auto& c : candidates) {
      try {
        auto archived = inv.instances().archive(c.id, users::cli_actor());
        report["archived"].push_back({{"id", c.id}, {"archive", archived.name}});
        if (!a->json) std::printf("  Archived %s\n", c.id.c_str());
      } catch (const Error& e) {
        report["skipped"].push_back({{"id", c.id}, {"reason", e.what()}});
        if (!a->json) std::printf("  Skipped %s: %s\n", c.id.c_str(), e.what());
      }
    }
    if (a->json) print_json(report);
  });
}

}  // namespace nshpc::cli
