// The instances service: its parts, an instance's creation, archive, restore and delete (with the
// steps the store runs under its lock), what runs in it, and its files' owner and disk use.
#include <unistd.h>

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "files/broker.hpp"
#include "instances/desktops.hpp"
#include "instances/instances.hpp"
#include "network/netns.hpp"
#include "network/proxy.hpp"
#include "sandbox/images.hpp"

namespace nshpc::instances {

namespace stdfs = std::filesystem;

namespace {

// An instance's additions to [network] allow, each checked as the config's are.
void check_allow(const std::vector<std::string>& entries) {
  std::vector<std::string> problems;
  for (const std::string& entry : entries) {
    std::string why;
    if (!network::parse_allow_entry(entry, &why)) problems.push_back(fmt::format("'{}': {}", entry, why));
  }
  if (!problems.empty())
    throw UsageError(fmt::format("network allow entries refused: {}; write a name (example.org), *.domain or an "
                                 "address, each optionally with :port",
                                 fmt::join(problems, "; ")));
}

// The ids a new image instance gets: a normal user's own range (or uid), shared by their
// instances; as root the lowest free range above root_range_floor that no instance or archive of
// this store uses. Called with the store's lock held.
sandbox::UidMapping allocate_ids(const store::Store& store) {
  sandbox::UidMapping ids = sandbox::image_uid_mapping();
  if (::geteuid() != 0) return ids;
  std::set<uid_t> used;
  auto note = [&used](const store::Metadata& meta) {
    const auto it = meta.raw.find("ids");
    if (it != meta.raw.end() && it->is_object() && it->contains("host_base") && (*it)["host_base"].is_number_unsigned())
      used.insert((*it)["host_base"].get<uid_t>());
  };
  for (const store::Instance& inst : store.list().instances) note(inst.meta);
  for (const store::ArchivedInstance& arch : store.list_archived()) note(arch.meta);
  constexpr std::uint64_t kTop = 0xFFFF0000u;
  for (std::uint64_t base = ids.host_base; base + ids.count <= kTop; base += ids.count) {
    if (used.count(static_cast<uid_t>(base))) continue;
    ids.host_base = static_cast<uid_t>(base);
    ids.host_gid = static_cast<gid_t>(base);
    ids.source = fmt::format("root's range for this instance: host ids {}-{} (above every account and /etc/subuid "
                             "range)", base, base + ids.count - 1);
    return ids;
  }
  throw Error("no free range of 65536 host ids is left for a new image instance; delete or purge image instances");
}

}  // namespace

Service::Service(const config::Config& config, std::unique_ptr<sandbox::Backend> backend)
    : config_(config), nat_works_(!network::nat_unavailable()), backend_(std::move(backend)) {
  store_ = std::make_unique<store::Store>(
      config, config::resolve_default_network(config.ns.default_network, config.ns.bwrap_shares_net, nat_works_));
  desktops_ = std::make_unique<Desktops>(*this);
  store_->set_target_decorator(
      [desktops = desktops_.get()](const store::Instance& inst, sandbox::Target& target) { desktops->decorate(inst, target); });
}

Service::~Service() = default;

Desktops& Service::desktops() { return *desktops_; }

sandbox::Backend& Service::backend() {
  if (!backend_) backend_ = sandbox::make_bwrap_backend(config_);
  return *backend_;
}

jobs::Engine& Service::jobs() {
  if (!jobs_) jobs_ = std::make_unique<jobs::Engine>(config_, *store_, backend());
  return *jobs_;
}

// ---- Instances -----------------------------------------------------------------------------

void Service::check_network(std::string_view id, config::Network network) const {
  if (network != config::Network::nat || nat_works_) return;
  const auto why = network::nat_unavailable();
  throw UsageError(fmt::format("instance '{}': network 'nat' cannot work here: {}; use 'filtered' or 'off'", id,
                               why.value_or("pasta is missing")));
}

std::optional<store::NewRoot> Service::choose_root(const store::Store& store, const store::CreateOptions& options) {
  if (options.image.empty()) return std::nullopt;
  if (options.persistent == false)
    throw UsageError("an instance on an image is always persistent (its root layer is mounted once for all its "
                     "commands); leave persistent unset");
  const auto image = sandbox::ImageStore(config_.ns.images_dir).current(options.image);
  if (!image)
    throw NotFound(NotFound::Kind::image,
                   fmt::format("there is no image '{}' in {}", options.image, config_.ns.images_dir.string()),
                   {.name = options.image});
  // Never an instance that cannot start: this host must give it a writable layer (tried for real
  // once per process, as doctor does).
  {
    std::lock_guard lock(layer_mutex_);
    if (!layer_support_) layer_support_ = sandbox::probe_layers(config_.ns.images_dir);
    if (!layer_support_->ok)
      throw UsageError(fmt::format("this host cannot give an instance a writable layer over an image: {}; {}",
                                   layer_support_->detail, layer_support_->fix));
  }
  store::NewRoot root{fmt::format("image:{}@{}", image->name, image->version), allocate_ids(store)};
  sandbox::check_image_owner(image->rootfs, root.ids);
  return root;
}

store::Instance Service::create(std::string id, const store::CreateOptions& options, std::string_view actor) {
  check_network(id.empty() ? std::string_view("(new)") : std::string_view(id),
                options.network.value_or(store_->default_network()));
  if (!options.network_allow.empty()) check_allow(options.network_allow);
  if (options.idle_stop && *options.idle_stop < 0) throw UsageError("idle_stop must be 0 (never) or a number of seconds");
  store::Instance inst = store_->create(std::move(id), options, actor,
                                        [&](const store::Store& store) { return choose_root(store, options); });
  // A desktop asked for on a root that has none: the instance is not kept.
  if (options.desktop) {
    if (auto why = desktops_->unavailable(inst)) {
      remove(inst.id, actor);
      throw *why;
    }
  }
  return inst;
}

store::Instance Service::update(std::string_view id, const store::UpdateOptions& options, std::string_view actor) {
  if (options.network) check_network(id, *options.network);
  if (options.network_allow) check_allow(*options.network_allow);
  return store_->update(id, options, actor);
}

// " (1a2b3c4d5e6f, 2b3c4d5e6f7a, 3c4d5e6f7a8b and 2 more)": the ids of an instance's jobs that have
// not ended, newest first; "" when none can be read.
static std::string running_jobs(jobs::Engine& engine, const store::Instance& inst) {
  constexpr std::size_t kNamed = 3;
  std::vector<std::string> ids;
  try {
    for (const jobs::Record& r : engine.list(inst.id))
      if (!jobs::is_final(r.state)) ids.push_back(r.id);
  } catch (const std::exception& e) {
    log::debug("instance '{}': its jobs not listed: {}", inst.id, e.what());
  }
  if (ids.empty()) return "";
  const std::size_t named = std::min(ids.size(), kNamed);
  std::string list = fmt::format("{}", fmt::join(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(named), ", "));
  if (ids.size() > named) list += fmt::format(" and {} more", ids.size() - named);
  return " (" + list + ")";
}

store::RemovalSteps Service::removal_steps(std::string_view why) {
  store::RemovalSteps steps;
  steps.before_move = [this, why = std::string(why)](const store::Instance& inst) {
    const std::string action = why == "archived" ? "archive" : "delete";
    if (std::size_t n = jobs().active_jobs(inst.base); n > 0)
      throw UsageError(fmt::format("cannot {} instance '{}': {} still running{}; cancel them first", action, inst.id,
                                   n == 1 ? std::string("1 job") : fmt::format("{} jobs", n), running_jobs(jobs(), inst)));
    stop_executions(inst.id);
    // Not only a living sandbox's: whatever groups an ephemeral instance's commands left go too.
    backend().stop_living(target(inst), why, grace());
  };
  steps.remove_tree = [](const stdfs::path& tree) { sandbox::remove_owned_tree(tree); };
  return steps;
}

store::ArchivedInstance Service::archive(std::string_view id, std::string_view actor) {
  return store_->archive(id, actor, removal_steps("archived"));
}

store::Instance Service::restore(std::string_view archive, std::string_view new_id, std::string_view actor) {
  return store_->restore(archive, new_id, actor);
}

void Service::remove(std::string_view id, std::string_view actor) { store_->remove(id, actor, removal_steps("deleted")); }

void Service::remove_archived(std::string_view name, std::string_view actor) {
  store_->remove_archived(name, actor, removal_steps("deleted"));
}

std::size_t Service::finish_deletions() { return store_->finish_deletions(removal_steps("deleted")); }

// ---- What runs in it -----------------------------------------------------------------------

Service::Registration::~Registration() {
  if (!service_) return;
  std::lock_guard lock(service_->executions_mutex_);
  service_->executions_.erase(key_);
}

Service::Registration Service::register_execution(std::string_view id, std::function<void()> stop,
                                                  std::string what) const {
  std::lock_guard lock(executions_mutex_);
  const std::uint64_t key = next_execution_++;
  executions_[key] = Execution{std::string(id), std::move(stop), what.empty() ? "a command" : std::move(what)};
  return Registration(*this, key);
}

std::vector<std::string> Service::executions_of(std::string_view id) const {
  std::vector<std::string> out;
  std::lock_guard lock(executions_mutex_);
  for (const auto& [key, execution] : executions_)
    if (execution.instance_id == id) out.push_back(execution.what);
  return out;
}

void Service::stop_executions(std::string_view id) const {
  std::vector<std::function<void()>> stops;
  {
    std::lock_guard lock(executions_mutex_);
    for (const auto& [key, execution] : executions_)
      if (execution.instance_id == id) stops.push_back(execution.stop);
  }
  for (const auto& stop : stops) {
    try {
      stop();
    } catch (const std::exception& e) {
      log::warn("instance {}: stopping one of its commands failed: {}", id, e.what());
    }
  }
}

// ---- Its files -----------------------------------------------------------------------------

files::InstanceView Service::file_view(const store::Instance& inst) const {
  files::InstanceView v;
  v.workspace_mount = config_.ns.workspace_mount;
  v.output_mount = config_.ns.output_mount;
  v.workspace = inst.workspace;
  v.output = inst.output;
  FileAccess access = file_access(inst);
  v.owner = access.owner;
  v.broker = std::move(access.broker);
  return v;
}

Service::FileAccess Service::file_access(const store::Instance& inst) const {
  FileAccess access;
  if (auto owner = store_->owner_of(inst)) access.owner = files::Owner{owner->uid, owner->gid};
  if (!inst.image) return access;
  if (!access.owner) access.owner = files::Owner{::geteuid(), ::getegid()};
  std::tie(access.owner->others_from, access.owner->others) = sandbox::other_ids(inst.image->ids);
  if (::geteuid() != 0)  // root manages every file from outside
    access.broker = std::make_shared<files::Broker>(sandbox::as_mapped_root(
        {fs::self_program("the helper that manages an instance's files"), std::string(files::kBrokerCommand)}));
  return access;
}

Service::RunningRoot Service::root_of_running(const store::Instance& inst, std::string_view actor) {
  if (!inst.image)
    throw UsageError(fmt::format("instance '{}' runs on the host's root, whose \"/\" is the host's: its own files are "
                                 "its workspace and output folders",
                                 inst.id));
  FileAccess access = file_access(inst);
  if (access.broker) {
    std::lock_guard lock(root_broker_mutex_);
    if (!root_broker_) root_broker_ = std::move(access.broker);
    access.broker = root_broker_;
  }
  sandbox::LivingRoot held = backend().living_root(target(inst));
  if (held.started) store_->audit(inst, "instance.started", actor, {{"instance_id", inst.id}});
  files::Root root(std::move(held.root), "/", access.owner, false, false, std::move(access.broker));
  root.confine(std::move(held.file_systems));
  return RunningRoot{std::move(root), std::move(held)};
}

Service::DiskUse Service::disk_use(const store::Instance& inst) const {
  // Folders this process may not open (an account's made inside a normal user's image instance)
  // are counted by the broker, which may.
  std::shared_ptr<files::Broker> broker;
  auto measure = [&](const stdfs::path& path) {
    const fs::TreeUsage usage = fs::tree_usage(path);
    if (usage.skipped == 0) return usage;
    if (!broker) broker = file_access(inst).broker;
    if (!broker) return usage;
    try {
      UniqueFd dir = fs::open_dir_path(path);
      return broker->tree_usage(dir.get(), path.string());
    } catch (const SysError& e) {
      log::warn("instance {}: {} folders of {} were left out of its disk use: {}", inst.id, usage.skipped,
                path.string(), e.what());
      return usage;
    }
  };
  const fs::TreeUsage ws = measure(inst.workspace);
  const fs::TreeUsage out = measure(inst.output);
  return {ws.bytes, out.bytes, ws.files + out.files, measure(inst.layer_dir()).bytes,
          measure(inst.snapshots_dir()).bytes};
}

}  // namespace nshpc::instances
