#include "store/store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "audit/audit.hpp"
#include "base/error.hpp"
#include "base/json.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/random.hpp"
#include "base/safe_path.hpp"
#include "base/text.hpp"
#include "base/time.hpp"

namespace nshpc::store {

using Clock = std::chrono::system_clock;

// ---- Metadata -------------------------------------------------------------------------------

namespace {

std::string string_field(const nlohmann::json& raw, const char* key) {
  auto it = raw.find(key);
  if (it == raw.end() || !it->is_string()) return {};
  return it->get<std::string>();
}

bool exists_nofollow(const stdfs::path& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

std::optional<Clock::time_point> mtime(const stdfs::path& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) < 0) return std::nullopt;
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) < 0) return "unknown";
  return buf;
}

void write_metadata(const stdfs::path& file, const Metadata& meta) {
  fs::atomic_write(file, meta.raw.dump(2) + "\n", 0644);
}

}  // namespace

std::string Metadata::id() const { return string_field(raw, "id"); }
std::string Metadata::created_at() const { return string_field(raw, "created_at"); }
std::string Metadata::description() const { return string_field(raw, "description"); }
std::string Metadata::hostname() const { return string_field(raw, "hostname"); }
std::string Metadata::archived_at() const { return string_field(raw, "archived_at"); }
bool Metadata::archived() const {
  auto it = raw.find("archived");
  return it != raw.end() && it->is_boolean() && it->get<bool>();
}
std::optional<config::Network> Metadata::network() const {
  return config::parse_network(string_field(raw, "network"));
}
std::optional<bool> Metadata::persistent() const {
  auto it = raw.find("persistent");
  if (it == raw.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

std::optional<bool> Metadata::computer_temporary() const {
  auto it = raw.find("computer");
  if (it == raw.end() || !it->is_object()) return std::nullopt;
  auto temporary = it->find("temporary");
  return temporary != it->end() && temporary->is_boolean() && temporary->get<bool>();
}

bool Metadata::desktop() const {
  auto it = raw.find("desktop");
  return it != raw.end() && it->is_boolean() && it->get<bool>();
}

std::string Metadata::root() const {
  std::string root = string_field(raw, "root");
  return root.empty() ? "host" : root;
}

Clock::time_point Instance::last_activity() const {
  Clock::time_point newest{};
  for (const auto& file : {audit_log(), metadata_file()}) {
    if (auto t = mtime(file)) newest = std::max(newest, *t);
  }
  if (auto created = timeutil::parse_iso(meta.created_at())) newest = std::max(newest, *created);
  return newest;
}

// ---- Store ----------------------------------------------------------------------------------

Store::Store(const config::Config& config, config::Network default_network)
    : root_(config.ns.instances_dir),
      default_network_(default_network),
      default_persistent_(config.ns.persistent),
      rotation_{static_cast<std::uint64_t>(config.audit.max_size) * 1024 * 1024, static_cast<int>(config.audit.keep)},
      workspace_mount_(config.ns.workspace_mount),
      images_dir_(config.ns.images_dir) {
  owner_ = users::sandbox_owner(config.ns.sandbox_uid, config.ns.sandbox_gid);
  std::error_code ec;
  stdfs::path canonical = stdfs::weakly_canonical(root_, ec);
  if (ec) canonical = root_;
  cgroup_tag_ = fmt::format("{:08x}", text::fnv1a(canonical.string()) & 0xffffffffu);
  index_ = std::make_unique<Index>(
      Index::default_file(config.server.state_dir, root_), root_,
      [this](const std::string& id) { return index_entry(id); }, [this] { return instance_names(); });
}

Store::~Store() = default;

std::vector<std::string> Store::instance_names() const {
  std::vector<std::string> out;
  for (auto& name : fs::folder_names(root_))
    if (!name.empty() && name[0] != '.' && name != "output") out.push_back(std::move(name));
  return out;
}

std::optional<IndexEntry> Store::index_entry(const std::string& id) const {
  const stdfs::path base = root_ / id;
  IndexEntry entry;
  entry.id = id;
  // The folder's time first: a metadata.json replaced while it is read makes the next look differ.
  entry.dir_mtime_ns = Index::mtime_ns(base).value_or(0);
  if (!exists_nofollow(base / "metadata.json")) return std::nullopt;
  try {
    const Instance inst = load(id, base);
    entry.description = inst.meta.description();
    entry.activity_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            inst.last_activity().time_since_epoch()).count();
  } catch (const NotFound&) {
    return std::nullopt;
  } catch (const Error& e) {
    entry.problem = e.what();
  }
  return entry;
}

void Store::index_changed(const std::string& id, std::optional<std::int64_t> root_mtime_before) const {
  index_->changed(id, root_mtime_before);
}

void Store::ensure_layout() const {
  fs::make_dirs(root_, 0755);
  fs::make_dirs(output_root(), 0755);
  fs::make_dirs(archive_root(), 0700);
}

void Store::give_to(const stdfs::path& dir, const std::optional<users::Identity>& owner) const {
  if (!owner) return;
  if (::lchown(dir.c_str(), owner->uid, owner->gid) < 0) throw SysError(errno, "chown", dir.string());
}

std::optional<users::Identity> Store::owner_of(const Instance& instance) const {
  sandbox::Target target;
  target.image = instance.image;
  return sandbox::host_identity(target, owner_);
}

sandbox::ImageRoot Store::image_root(const Instance& instance) const {
  const std::string root = instance.meta.root();
  constexpr std::string_view prefix = "image:";
  const std::string ref = root.substr(prefix.size());
  const auto at = ref.find('@');
  if (root.rfind(prefix, 0) != 0 || at == std::string::npos || at == 0 || at + 1 == ref.size())
    throw Error(fmt::format("instance '{}' has a root it cannot use ({:?} in metadata.json; expected "
                            "\"host\" or \"image:NAME@VERSION\")", instance.id, root));
  sandbox::ImageRoot image;
  image.image = ref;
  image.rootfs = images_dir_ / ref.substr(0, at) / ref.substr(at + 1) / "rootfs";
  image.layer = instance.layer_dir();
  image.mount_dir = instance.base / "root";
  const auto it = instance.meta.raw.find("ids");
  if (it == instance.meta.raw.end() || !it->is_object() || !it->contains("host_base") ||
      !(*it)["host_base"].is_number_unsigned() || !it->contains("count") || !(*it)["count"].is_number_unsigned())
    throw Error(fmt::format("instance '{}' runs on an image but its metadata.json has no usable \"ids\"", instance.id));
  image.ids.kind = it->value("map", "") == "range" ? sandbox::UidMapping::Kind::range : sandbox::UidMapping::Kind::single;
  image.ids.host_base = (*it)["host_base"].get<uid_t>();
  image.ids.host_gid = it->value("host_gid", static_cast<gid_t>(image.ids.host_base));  // root's: the same number
  image.ids.count = (*it)["count"].get<std::uint32_t>();
  image.ids.sub_uid = it->value("sub_uid", uid_t{0});
  image.ids.sub_gid = it->value("sub_gid", gid_t{0});
  image.ids.source = it->value("source", "");
  return image;
}

NotFound Store::instance_not_found(std::string_view id) const {
  NotFound::Facts facts;
  try {
    if (auto archived = latest_archive(id)) {
      facts.archive_name = archived->name;
      facts.archived_at = archived->meta.archived_at();
      std::string when = facts.archived_at.empty() ? "" : " on " + facts.archived_at.substr(0, 10);
      return NotFound(NotFound::Kind::instance,
                      fmt::format("instance '{}' was archived as {}{}", id, archived->name, when), std::move(facts));
    }
    if (auto near = near_miss(id)) facts.near_miss = *near;
  } catch (const std::exception& e) {
    log::debug("looking for an archive or a near miss of '{}': {}", id, e.what());
  }
  return NotFound(NotFound::Kind::instance, fmt::format("instance '{}' not found", id), std::move(facts));
}

Instance Store::load(std::string_view id, const stdfs::path& base) const {
  Instance inst;
  inst.id = std::string(id);
  inst.base = base;
  inst.workspace = base / "workspace";
  inst.output = output_root() / std::string(id);
  auto text = fs::read_file(inst.metadata_file());
  if (!text) throw instance_not_found(id);
  auto raw = parse_json_or_discarded(*text);
  if (!raw.is_object())
    throw Error(fmt::format("instance '{}' has a corrupt metadata.json ({}); repair or delete it",
                            id, inst.metadata_file().string()));
  inst.meta.raw = std::move(raw);
  inst.network = inst.meta.network().value_or(default_network_);
  inst.persistent = inst.meta.persistent().value_or(default_persistent_);
  if (auto it = inst.meta.raw.find("network_allow"); it != inst.meta.raw.end() && it->is_array())
    for (const auto& entry : *it)
      if (entry.is_string()) inst.network_allow.push_back(entry.get<std::string>());
  if (auto it = inst.meta.raw.find("idle_stop"); it != inst.meta.raw.end() && it->is_number_integer() &&
                                                 it->get<std::int64_t>() >= 0)
    inst.idle_stop = it->get<std::int64_t>();
  if (inst.meta.root() != "host") {
    inst.image = image_root(inst);
    inst.persistent = true;
  }
  return inst;
}

bool Store::exists(std::string_view id) const {
  validate_id(id);
  return exists_nofollow(root_ / std::string(id) / "metadata.json");
}

Instance Store::get(std::string_view id) const {
  validate_id(id);
  return load(id, root_ / std::string(id));
}

void Store::while_present(std::string_view id, const std::function<void(const Instance&)>& step) const {
  ensure_layout();
  fs::FileLock lock(lock_file());
  step(get(id));
}

Listing Store::list() const {
  Listing listing;
  for (const auto& name : fs::folder_names(root_)) {
    if (name.empty() || name[0] == '.' || name == "output") continue;
    const stdfs::path base = root_ / name;
    if (!exists_nofollow(base / "metadata.json")) continue;
    try {
      listing.instances.push_back(load(name, base));
    } catch (const Error& e) {
      listing.corrupt.push_back({name, base, e.what()});
    }
  }
  return listing;
}

std::vector<ArchivedInstance> Store::list_archived() const {
  std::vector<ArchivedInstance> out;
  for (const auto& name : fs::folder_names(archive_root())) {
    if (name.empty() || name[0] == '.') continue;
    ArchivedInstance a;
    a.name = name;
    a.base = archive_root() / name;
    auto sep = name.rfind("__");
    a.id = sep == std::string::npos ? name : name.substr(0, sep);
    if (auto text = fs::read_file(a.base / "metadata.json")) {
      auto raw = parse_json_or_discarded(*text);
      if (raw.is_object()) a.meta.raw = std::move(raw);
    }
    out.push_back(std::move(a));
  }
  return out;
}

Page Store::list_page(const ListQuery& query) const {
  Page page;
  try {
    IndexPage found = index_->page(query);
    page.total = found.total;
    for (const std::string& id : found.ids) {
      try {
        page.instances.push_back(load(id, root_ / id));
      } catch (const NotFound&) {
        if (page.total > 0) --page.total;  // gone since the index looked
      } catch (const Error& e) {
        page.corrupt.push_back({id, root_ / id, e.what()});
      }
    }
    for (const IndexEntry& bad : found.corrupt) page.corrupt.push_back({bad.id, root_ / bad.id, bad.problem});
    return page;
  } catch (const Error& e) {
    log::warn("{}", e.what());
  }
  // The walk: every metadata.json read.
  page.indexed = false;
  Listing all = list();
  std::string needle = query.filter;
  std::transform(needle.begin(), needle.end(), needle.begin(), [](unsigned char c) { return std::tolower(c); });
  auto matches = [&](const std::string& id, const std::string& description) {
    if (needle.empty()) return true;
    for (std::string hay : {id, description}) {
      std::transform(hay.begin(), hay.end(), hay.begin(), [](unsigned char c) { return std::tolower(c); });
      if (hay.find(needle) != std::string::npos) return true;
    }
    return false;
  };
  std::vector<std::pair<Clock::time_point, Instance>> kept;
  for (auto& inst : all.instances)
    if (matches(inst.id, inst.meta.description())) kept.emplace_back(inst.last_activity(), std::move(inst));
  if (query.sort == SortBy::last_activity)
    std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  page.total = kept.size();
  for (std::size_t i = query.offset; i < kept.size() && (query.limit == 0 || i < query.offset + query.limit); ++i)
    page.instances.push_back(std::move(kept[i].second));
  for (auto& bad : all.corrupt)
    if (matches(bad.id, "")) page.corrupt.push_back(std::move(bad));
  return page;
}

std::optional<ArchivedInstance> Store::latest_archive(std::string_view id) const {
  const std::string prefix = std::string(id) + "__";
  std::optional<std::string> newest;
  for (const auto& name : fs::folder_names(archive_root()))
    if (name.starts_with(prefix) && name.find("__", prefix.size()) == std::string::npos && (!newest || name > *newest))
      newest = name;
  if (!newest) return std::nullopt;
  ArchivedInstance a;
  a.name = *newest;
  a.id = std::string(id);
  a.base = archive_root() / *newest;
  if (auto text = fs::read_file(a.base / "metadata.json")) {
    auto raw = parse_json_or_discarded(*text);
    if (raw.is_object()) a.meta.raw = std::move(raw);
  }
  return a;
}

std::optional<std::string> Store::near_miss(std::string_view id) const {
  return text::closest(id, instance_names());
}

Instance Store::restore(std::string_view archive, std::string_view new_id, std::string_view actor) {
  ensure_layout();
  fs::FileLock lock(lock_file());
  const auto root_before = Index::mtime_ns(root_);
  // Which archive.
  std::string name(archive);
  if (name.find("__") == std::string::npos) {
    validate_id(name);
    auto newest = latest_archive(name);
    if (!newest)
      throw NotFound(NotFound::Kind::archive, fmt::format("instance '{}' has no archive", name),
                     {.near_miss = text::closest(name, [&] {
                        std::vector<std::string> names;
                        for (const auto& a : list_archived()) names.push_back(a.id);
                        return names;
                      }()).value_or("")});
    name = newest->name;
  }
  if (name.find('/') != std::string::npos)
    throw UsageError(fmt::format("'{}' is not an archive name; archive names look like <id>__<timestamp>", name));
  const std::string old_id = name.substr(0, name.rfind("__"));
  validate_id(old_id);
  const stdfs::path from = archive_root() / name;
  if (!exists_nofollow(from)) {
    std::vector<std::string> names;
    for (const auto& a : list_archived()) names.push_back(a.name);
    throw NotFound(NotFound::Kind::archive, fmt::format("archive '{}' not found", name),
                   {.near_miss = text::closest(name, names).value_or("")});
  }
  // Which id.
  std::string id(new_id);
  if (!id.empty()) {
    validate_id(id);
    if (exists_nofollow(root_ / id))
      throw UsageError(fmt::format("instance '{}' already exists; choose another id for the restored archive", id));
  } else {
    id = old_id;
    for (int n = 1; exists_nofollow(root_ / id) || exists_nofollow(output_root() / id); ++n)
      id = n == 1 ? old_id + "-restored" : fmt::format("{}-restored-{}", old_id, n);
    if (id.size() > 63) throw UsageError(fmt::format("'{}' is taken; give the restored instance a new id", old_id));
  }
  const stdfs::path base = root_ / id;
  const stdfs::path output = output_root() / id;
  if (exists_nofollow(output) && !stdfs::is_empty(output))
    throw UsageError(fmt::format(
        "the output folder {} already exists and is not empty; move it away or choose another id", output.string()));

  // The metadata first (in the archive, where a failure changes nothing), then the renames.
  Metadata meta;
  if (auto text = fs::read_file(from / "metadata.json")) {
    auto raw = parse_json_or_discarded(*text);
    if (raw.is_object()) meta.raw = std::move(raw);
  }
  meta.raw["id"] = id;
  meta.raw["workspace"] = (base / "workspace").string();
  meta.raw.erase("archived");
  meta.raw.erase("archived_at");
  meta.raw["restored_at"] = timeutil::iso_utc();
  meta.raw["restored_from"] = name;
  write_metadata(from / "metadata.json", meta);
  if (exists_nofollow(output)) ::rmdir(output.c_str());
  check_sys(::rename(from.c_str(), base.c_str()), "rename", base.string());
  Instance inst = load(id, base);
  const stdfs::path archived_output = output_root() / name;
  if (exists_nofollow(archived_output)) {
    check_sys(::rename(archived_output.c_str(), output.c_str()), "rename", output.string());
  } else {
    check_sys(::mkdir(output.c_str(), 0700), "mkdir", output.string());
    give_to(output, owner_of(inst));
  }
  fs::sync_dir(root_);
  audit(inst, "instance.restored", actor, {{"instance_id", id}, {"archive", name}});
  index_changed(id, root_before);
  return inst;
}

Instance Store::create(std::string id, const CreateOptions& options, std::string_view actor,
                       const ChooseRoot& choose_root) {
  ensure_layout();
  fs::FileLock lock(lock_file());
  const auto root_before = Index::mtime_ns(root_);
  if (id.empty()) {
    do id = generate_id();
    while (exists_nofollow(root_ / id));
  }
  validate_id(id);
  const stdfs::path base = root_ / id;
  if (exists_nofollow(base)) {
    if (exists_nofollow(base / "metadata.json"))
      throw UsageError(fmt::format("instance '{}' already exists; choose another id", id));
    throw UsageError(fmt::format(
        "a folder named '{}' exists in {} but is not an instance; remove it or choose another id",
        id, root_.string()));
  }
  // An instance on an image: its version and ids of its own, chosen while no other create can.
  const std::optional<NewRoot> image = choose_root ? choose_root(*this) : std::nullopt;
  std::optional<users::Identity> owner = owner_;
  if (image) {
    sandbox::Target target;
    target.image = sandbox::ImageRoot{.ids = image->ids};
    owner = sandbox::host_identity(target, owner_);
  }
  const stdfs::path output = output_root() / id;
  if (exists_nofollow(output) && !stdfs::is_empty(output))
    throw UsageError(fmt::format(
        "the output folder {} already exists and is not empty; move it away or choose another id",
        output.string()));

  // Build the instance in a staging folder, then rename it into place: a crash or an error
  // leaves no half-made instance under its id.
  const stdfs::path staging = root_ / fmt::format(".creating-{}-{}", id, random::hex(4));
  bool output_made = false;
  try {
    // 0711: the sandbox uid may pass through to the workspace but not list or read the rest.
    check_sys(::mkdir(staging.c_str(), 0711), "mkdir", staging.string());
    check_sys(::mkdir((staging / "workspace").c_str(), 0700), "mkdir", (staging / "workspace").string());
    give_to(staging / "workspace", owner);
    if (::mkdir(output.c_str(), 0700) == 0) {
      output_made = true;
    } else if (errno != EEXIST) {
      throw SysError(errno, "mkdir", output.string());
    }
    give_to(output, owner);
    if (image) {
      // The layer above the image: host-only on the way (0700), its folders the instance root's.
      check_sys(::mkdir((staging / "layer").c_str(), 0700), "mkdir", (staging / "layer").string());
      for (const char* dir : {"layer/upper", "layer/work"}) {
        check_sys(::mkdir((staging / dir).c_str(), 0755), "mkdir", (staging / dir).string());
        give_to(staging / dir, owner);
      }
    }

    Metadata meta;
    meta.raw["id"] = id;
    meta.raw["created_at"] = timeutil::iso_utc();
    meta.raw["workspace"] = (base / "workspace").string();
    meta.raw["hostname"] = host_name();
    if (!options.description.empty()) meta.raw["description"] = options.description;
    meta.raw["network"] = config::to_string(options.network.value_or(default_network_));
    meta.raw["persistent"] = image ? true : options.persistent.value_or(default_persistent_);
    if (!options.network_allow.empty()) meta.raw["network_allow"] = options.network_allow;
    if (options.idle_stop) {
      if (*options.idle_stop < 0) throw UsageError("idle_stop must be 0 (never) or a number of seconds");
      meta.raw["idle_stop"] = *options.idle_stop;
    }
    if (options.computer_temporary) meta.raw["computer"] = {{"temporary", *options.computer_temporary}};
    if (options.desktop) meta.raw["desktop"] = true;
    if (image) {
      const sandbox::UidMapping& ids = image->ids;
      meta.raw["root"] = image->root;
      meta.raw["ids"] = {{"map", ids.kind == sandbox::UidMapping::Kind::range ? "range" : "single"},
                         {"host_base", ids.host_base},
                         {"host_gid", ids.host_gid},
                         {"count", ids.count},
                         {"source", ids.source}};
      if (ids.sub_uid != 0) {
        meta.raw["ids"]["sub_uid"] = ids.sub_uid;
        meta.raw["ids"]["sub_gid"] = ids.sub_gid;
      }
    }
    write_metadata(staging / "metadata.json", meta);
    audit::append(staging / "audit.log", "instance.created", actor,
                  {{"instance_id", id},
                   {"description", options.description},
                   {"network", meta.raw["network"]},
                   {"persistent", meta.raw["persistent"]},
                   {"root", meta.root()}});
    check_sys(::rename(staging.c_str(), base.c_str()), "rename", base.string());
    fs::sync_dir(root_);
  } catch (...) {
    fs::remove_tree(staging);
    if (output_made) ::rmdir(output.c_str());
    throw;
  }
  index_changed(id, root_before);
  return load(id, base);
}

Instance Store::update(std::string_view id, const UpdateOptions& options, std::string_view actor) {
  ensure_layout();
  fs::FileLock lock(lock_file());
  Instance inst = get(id);
  nlohmann::json changes = nlohmann::json::object();
  if (options.description) {
    inst.meta.raw["description"] = *options.description;
    changes["description"] = *options.description;
  }
  if (options.network) {
    inst.meta.raw["network"] = config::to_string(*options.network);
    inst.network = *options.network;
    changes["network"] = config::to_string(*options.network);
  }
  if (options.network_allow) {
    inst.meta.raw["network_allow"] = *options.network_allow;
    inst.network_allow = *options.network_allow;
    changes["network_allow"] = *options.network_allow;
  }
  if (options.persistent == false && inst.image)
    throw UsageError(fmt::format("instance '{}' runs on an image and is always persistent", inst.id));
  if (options.persistent) {
    inst.meta.raw["persistent"] = *options.persistent;
    inst.persistent = *options.persistent;
    changes["persistent"] = *options.persistent;
  }
  if (options.desktop && *options.desktop != inst.meta.desktop()) {
    inst.meta.raw["desktop"] = *options.desktop;
    changes["desktop"] = *options.desktop;
  }
  if (changes.empty()) return inst;
  write_metadata(inst.metadata_file(), inst.meta);
  audit(inst, "instance.updated", actor, {{"instance_id", inst.id}, {"changes", changes}});
  index_changed(inst.id, Index::mtime_ns(root_));
  return inst;
}

stdfs::path Store::removable_base(std::string_view id, const RemovalSteps& steps) const {
  if (!exists(id)) throw instance_not_found(id);
  const stdfs::path base = root_ / std::string(id);
  if (steps.before_move) {
    Instance inst;
    try {
      inst = load(id, base);
    } catch (const Error&) {
      // Nothing is known of it: taken for persistent, so that whatever may run of it is ended.
      inst.id = std::string(id);
      inst.base = base;
      inst.workspace = base / "workspace";
      inst.output = output_root() / std::string(id);
      inst.network = default_network_;
      inst.persistent = true;
    }
    steps.before_move(inst);
  }
  return base;
}

ArchivedInstance Store::archive(std::string_view id, std::string_view actor, const RemovalSteps& steps) {
  ensure_layout();
  fs::FileLock lock(lock_file());
  const auto root_before = Index::mtime_ns(root_);
  const stdfs::path base = removable_base(id, steps);

  const auto now = Clock::now();
  ArchivedInstance archived;
  archived.id = std::string(id);
  archived.name = fmt::format("{}__{}", id, timeutil::compact_utc(now));
  archived.base = archive_root() / archived.name;
  std::optional<Instance> inst;
  try {
    inst = load(id, base);
  } catch (const UsageError&) {
    throw;
  } catch (const Error&) {
    // A corrupt metadata.json does not stop the archive: the folder is moved aside as it is.
  }
  if (inst) {
    inst->meta.raw["archived"] = true;
    inst->meta.raw["archived_at"] = timeutil::iso_utc(now);
    try {
      write_metadata(inst->metadata_file(), inst->meta);  // before anything moves: a failure changes nothing
    } catch (const SysError& e) {
      throw e.wrapped(fmt::format("cannot archive instance '{}': its metadata could not be written", id));
    }
    archived.meta = inst->meta;
  }
  audit::append(base / "audit.log", "instance.archived", actor,
                {{"instance_id", std::string(id)}, {"archive", archived.name}});
  check_sys(::rename(base.c_str(), archived.base.c_str()), "rename", archived.base.string());
  const stdfs::path output = output_root() / std::string(id);
  if (exists_nofollow(output)) {
    const stdfs::path moved = output_root() / archived.name;
    check_sys(::rename(output.c_str(), moved.c_str()), "rename", moved.string());
  }
  fs::sync_dir(root_);
  index_changed(std::string(id), root_before);
  return archived;
}

void Store::remove(std::string_view id, std::string_view actor, const RemovalSteps& steps) {
  ensure_layout();
  fs::FileLock lock(lock_file());
  const auto root_before = Index::mtime_ns(root_);
  // Nothing of the instance may still run (and write) while its files go: steps.before_move.
  const stdfs::path base = removable_base(id, steps);
  // Rename first so the instance disappears at once, then remove the trees.
  const stdfs::path doomed = root_ / fmt::format(".deleting-{}-{}", id, random::hex(4));
  check_sys(::rename(base.c_str(), doomed.c_str()), "rename", base.string());
  const stdfs::path output = output_root() / std::string(id);
  const stdfs::path doomed_output = output_root() / fmt::format(".deleting-{}-{}", id, random::hex(4));
  bool had_output = ::rename(output.c_str(), doomed_output.c_str()) == 0;
  audit::append(root_ / ".audit.log", "instance.deleted", actor, {{"instance_id", std::string(id)}}, rotation_);
  remove_doomed(doomed, steps);
  if (had_output) remove_doomed(doomed_output, steps);
  index_changed(std::string(id), root_before);  // after the doomed tree is gone: the folder's last change
}

bool Store::remove_doomed(const stdfs::path& tree, const RemovalSteps& steps) const {
  for (int attempt = 0;; ++attempt) {
    try {
      steps.remove_tree(tree);
      return true;
    } catch (const SysError& e) {
      // ENOTEMPTY/EBUSY: a process this server does not own still writes there; try again a
      // little later, then leave it to finish_deletions().
      if ((e.code() != ENOTEMPTY && e.code() != EBUSY) || attempt >= 20) {
        log::warn("{}; it is removed at the next start of the server", e.what());
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

std::size_t Store::finish_deletions(const RemovalSteps& steps) const {
  std::size_t done = 0;
  for (const stdfs::path& dir : {root_, output_root()}) {
    for (const std::string& name : fs::folder_names(dir)) {
      if (!name.starts_with(".deleting-")) continue;
      if (remove_doomed(dir / name, steps)) ++done;
    }
  }
  return done;
}

void Store::remove_archived(std::string_view name, std::string_view actor, const RemovalSteps& steps) {
  ensure_layout();
  fs::FileLock lock(lock_file());
  auto sep = name.rfind("__");
  if (sep == std::string_view::npos || name.find('/') != std::string_view::npos)
    throw UsageError(fmt::format(
        "'{}' is not an archive name; archive names look like <id>__<timestamp>", name));
  validate_id(name.substr(0, sep));
  const stdfs::path base = archive_root() / std::string(name);
  if (!exists_nofollow(base))
  {
    std::vector<std::string> names;
    for (const auto& a : list_archived()) names.push_back(a.name);
    throw NotFound(NotFound::Kind::archive, fmt::format("archive '{}' not found", name),
                   {.near_miss = text::closest(name, names).value_or("")});
  }
  audit::append(root_ / ".audit.log", "instance.archive_deleted", actor, {{"archive", std::string(name)}}, rotation_);
  steps.remove_tree(base);
  steps.remove_tree(output_root() / std::string(name));
}

std::vector<CleanCandidate> Store::clean_candidates(std::chrono::hours older_than) const {
  const auto cutoff = Clock::now() - older_than;
  std::vector<CleanCandidate> out;
  Listing listing = list();
  for (const auto& inst : listing.instances) {
    auto last = inst.last_activity();
    if (last < cutoff) out.push_back({inst.id, last, ""});
  }
  for (const auto& bad : listing.corrupt) {
    auto last = mtime(bad.base / "metadata.json").value_or(Clock::time_point{});
    if (last < cutoff) out.push_back({bad.id, last, "metadata.json is corrupt"});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

UniqueFd Store::open_workspace_file(const Instance& instance, const std::string& relative, WorkspaceOpen how,
                                    fs::Refusal* refusal) const {
  const std::string shown = workspace_mount_ + "/" + relative;
  const std::optional<users::Identity> identity = owner_of(instance);
  const fs::Expect expect{.owner = identity ? identity->uid : ::geteuid()};
  std::optional<std::pair<uid_t, gid_t>> owner;
  if (identity) owner = std::make_pair(identity->uid, identity->gid);
  UniqueFd dir = fs::open_dir_path(instance.workspace);
  switch (how) {
    case WorkspaceOpen::read:
      return fs::open_untrusted_file(dir.get(), relative, expect, refusal);
    case WorkspaceOpen::append:
      try {
        UniqueFd fd = fs::open_beneath(dir.get(), relative, O_WRONLY | O_APPEND, 0, fs::Resolve::beneath_no_links, shown);
        struct stat st;
        if (::fstat(fd.get(), &st) < 0) throw SysError(errno, "stat", shown);
        if (auto why = fs::untrusted_file_problem(st, expect))
          throw Error(fmt::format("{} is not written: {}; remove it and try again", shown, *why));
        return fd;
      } catch (const SysError& e) {
        if (e.code() != ENOENT) throw;
      }
      [[fallthrough]];
    case WorkspaceOpen::create:
      return fs::create_beneath(dir.get(), relative, 0644, owner, shown);
  }
  return {};
}

std::string Store::cgroup_folder(std::string_view id) const { return fmt::format("{}@{}", id, cgroup_tag_); }

sandbox::Target Store::sandbox_target(const Instance& instance) const {
  sandbox::Target target{instance.id,         instance.workspace,       instance.output,
                         output_root(),       instance.network,         instance.persistent,
                         instance.state_dir(), cgroup_folder(instance.id), instance.image,
                         instance.audit_log(),  instance.network_allow, rotation_,
                         instance.idle_stop,    root_ / ".audit.log"};
  if (decorator_) decorator_(instance, target);
  return target;
}

void Store::audit(const Instance& instance, std::string_view event, std::string_view actor,
                  nlohmann::json fields) const {
  audit::append(instance.audit_log(), event, actor, std::move(fields), rotation_);
  // Every audited event is activity: noted for the index, written with the next batch.
  index_->note_activity(instance.id, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         Clock::now().time_since_epoch()).count());
}

void Store::audit_store(std::string_view event, std::string_view actor, nlohmann::json fields) const {
  ensure_layout();
  audit::append(root_ / ".audit.log", event, actor, std::move(fields), rotation_);
}

}  // namespace nshpc::store
