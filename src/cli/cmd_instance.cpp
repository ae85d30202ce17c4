// ns-hpc instance create|list|list-archived|describe|update|archive|delete|enter, and clean.
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "cli/output.hpp"

namespace nshpc::cli {

namespace {

// --network host|off, of `instance create` and `instance update`.
void add_network_option(CLI::App& cmd, std::optional<config::Network>& network, const std::string& help) {
  add_choice(cmd, "--network", network, named({config::Network::host, config::Network::off}), help);
}

// An existing instance, even one whose metadata.json is corrupt (it can still be archived or
// deleted); UsageError otherwise.
void require_instance(Invocation& inv, const std::string& id) {
  if (!inv.store().exists(id))
    throw UsageError(fmt::format("instance '{}' not found; see 'ns-hpc instance list'", id));
}

void warn_corrupt(const store::Listing& listing) {
  for (const auto& bad : listing.corrupt)
    log::warn("instance '{}' skipped: {}", bad.id, bad.problem);
}

void describe_text(const store::Instance& inst) {
  std::printf("ID:            %s\n", inst.id.c_str());
  std::printf("Created at:    %s\n", inst.meta.created_at().empty() ? "unknown" : inst.meta.created_at().c_str());
  std::printf("Last activity: %s\n", short_time(inst.last_activity()).c_str());
  std::printf("Hostname:      %s\n", inst.meta.hostname().c_str());
  std::printf("Description:   %s\n", inst.meta.description().c_str());
  std::printf("Network:       %s\n", std::string(config::to_string(inst.network)).c_str());
  std::printf("Workspace:     %s\n", inst.workspace.c_str());
  std::printf("Output:        %s\n", inst.output.c_str());
}

struct InstanceArgs {
  std::string id;
  std::string description;
  std::optional<std::string> new_description;
  std::optional<config::Network> network;
  bool json = false;
  bool force = false;
  bool archived = false;
};

void add_create(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("create", "Create an instance (a persistent workspace)");
  cmd->add_option("id", a->id,
                  "Instance id: 1-63 of A-Z a-z 0-9 _ . -, starting with a letter or digit "
                  "(omitted: a readable one is generated)");
  cmd->add_option("-d,--description", a->description, "What the instance is for");
  add_network_option(*cmd, a->network,
                     "Network of its sandboxes: host (default; shares the host's loopback services and abstract "
                     "Unix sockets) or off");
  cmd->add_flag("--json", a->json, "Print the new instance as JSON");
  cmd->callback([&inv, a] {
    store::CreateOptions options;
    options.description = a->description;
    options.network = a->network;
    store::Instance inst = inv.store().create(a->id, options, users::cli_actor());
    if (a->json)
      print_json(instance_host_json(inst));
    else
      std::printf("Created instance '%s' at %s\n", inst.id.c_str(), inst.base.c_str());
  });
}

void add_list(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("list", "List active instances");
  cmd->add_flag("--json", a->json, "Print a JSON array");
  cmd->callback([&inv, a] {
    store::Listing listing = inv.store().list();
    warn_corrupt(listing);
    if (a->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& inst : listing.instances) out.push_back(instance_host_json(inst));
      print_json(out);
      return;
    }
    if (listing.instances.empty()) {
      std::puts("No instances found.");
      return;
    }
    std::vector<std::vector<std::string>> rows{{"ID", "CREATED", "LAST ACTIVITY", "NETWORK", "DESCRIPTION"}};
    for (const auto& inst : listing.instances)
      rows.push_back({inst.id, short_time(inst.meta.created_at()), short_time(inst.last_activity()),
                      std::string(config::to_string(inst.network)), inst.meta.description()});
    print_table(rows);
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
    const store::Store::DiskUse use = inv.store().disk_use(inst);
    if (a->json) {
      nlohmann::json out = instance_host_json(inst);
      out["disk_usage"] = {{"workspace_bytes", use.workspace_bytes}, {"output_bytes", use.output_bytes}, {"files", use.files}};
      print_json(out);
    } else {
      describe_text(inst);
      std::printf("Disk use:      %.1f MiB in the workspace, %.1f MiB in output, %llu files\n",
                  use.workspace_bytes / 1048576.0, use.output_bytes / 1048576.0,
                  static_cast<unsigned long long>(use.files));
    }
  });
}

void add_update(CLI::App& parent, Invocation& inv, const std::shared_ptr<InstanceArgs>& a) {
  auto* cmd = parent.add_subcommand("update", "Change an instance's description or network");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("-d,--description", a->new_description, "New description");
  add_network_option(*cmd, a->network, "host or off (applies to the next command)");
  cmd->add_flag("--json", a->json, "Print the updated instance as JSON");
  cmd->callback([&inv, a] {
    store::UpdateOptions options;
    options.description = a->new_description;
    options.network = a->network;
    if (!options.description && !options.network)
      throw UsageError("nothing to update; pass --description TEXT and/or --network host|off");
    store::Instance inst = inv.store().update(a->id, options, users::cli_actor());
    if (a->json) {
      print_json(instance_host_json(inst));
      return;
    }
    std::printf("Updated instance '%s'.\n", inst.id.c_str());
    std::printf("Description: %s\n", inst.meta.description().c_str());
    std::printf("Network: %s\n", std::string(config::to_string(inst.network)).c_str());
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
    inv.jobs();  // running jobs are checked against their real processes
    store::ArchivedInstance archived = inv.store().archive(a->id, users::cli_actor());
    if (a->json)
      print_json(archived_json(archived));
    else
      std::printf("Archived instance '%s' as %s.\n", a->id.c_str(), archived.name.c_str());
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
    inv.jobs();
    if (a->archived)
      inv.store().remove_archived(a->id, users::cli_actor());
    else
      inv.store().remove(a->id, users::cli_actor());
    std::printf("Deleted %s.\n", what.c_str());
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
  add_archive(*instance, inv, args);
  add_delete(*instance, inv, args);
  add_enter(*instance, inv, args);
  add_job_commands(*instance, inv);
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
    for (const auto& c : candidates)
      report["candidates"].push_back({{"id", c.id}, {"last_activity", short_time(c.last_activity)}, {"note", c.note}});
    if (!a->json) {
      if (candidates.empty()) {
        std::printf("No instances idle for more than %d days found.\n", a->days);
        return;
      }
      std::printf("Found %zu instance(s) idle for more than %d days:\n", candidates.size(), a->days);
      for (const auto& c : candidates)
        std::printf("  %s (last activity: %s)%s\n", c.id.c_str(), short_time(c.last_activity).c_str(),
                    c.note.empty() ? "" : (" — " + c.note).c_str());
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
        auto archived = inv.store().archive(c.id, users::cli_actor());
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
