#include "instances/snapshots.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include <fmt/format.h>

#include "base/copy_tree.hpp"
#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/random.hpp"
#include "base/time.hpp"
#include "sandbox/layers.hpp"

namespace nshpc::instances {

namespace stdfs = std::filesystem;
using Steady = std::chrono::steady_clock;

// ---- Trash ----------------------------------------------------------------------------------

Trash::Trash(bool finish_on_exit)
    : finish_on_exit_(finish_on_exit), thread_([this](std::stop_token stop) { run(stop); }) {}

Trash::~Trash() {
  if (finish_on_exit_) drain();
  thread_.request_stop();  // the condition variable wakes on it; the jthread joins
}

void Trash::add(stdfs::path tree) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(tree));
  }
  changed_.notify_all();
}

void Trash::drain() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void Trash::run(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, stop, [this] { return !queue_.empty(); });
    if (stop.stop_requested()) return;  // what is queued keeps its .deleting- name
    stdfs::path tree = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    try {
      sandbox::remove_owned_tree(tree);
    } catch (const std::exception& e) {
      log::warn("{}; it is removed at the next start of the server", e.what());
    }
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

// ---- Names and records ----------------------------------------------------------------------

void validate_snapshot_name(std::string_view name) {
  try {
    store::validate_id(name);  // one rule for every name that becomes a folder
  } catch (const UsageError&) {
    throw UsageError(fmt::format("'{}' is not a snapshot name: use 1-63 of A-Z a-z 0-9 _ . -, starting with a "
                                 "letter or digit",
                                 name.size() > 40 ? std::string(name.substr(0, 40)) + "…" : std::string(name)));
  }
}

nlohmann::json to_json(const SnapshotInfo& info) {
  return {{"name", info.name}, {"created_at", info.created_at}, {"root", info.root}, {"bytes", info.bytes},
          {"has_layer", info.has_layer}};
}

std::optional<SnapshotInfo> parse_snapshot(const std::string& name, const std::string& text) {
  const auto raw = parse_json_or_discarded(text);
  if (!raw.is_object()) return std::nullopt;
  SnapshotInfo info;
  info.name = name;
  info.created_at = raw.value("created_at", "");
  info.root = raw.value("root", "host");
  const auto bytes = raw.find("bytes");
  if (bytes != raw.end() && bytes->is_number_unsigned()) info.bytes = bytes->get<std::uint64_t>();
  info.has_layer = raw.value("has_layer", false);
  return info;
}

namespace {

stdfs::path lock_file(const store::Instance& inst) { return inst.base / ".snapshots.lock"; }

// An empty folder, given to `owner` (nullopt: this process's own uid keeps it).
void make_dir(const stdfs::path& dir, mode_t mode, const std::optional<users::Identity>& owner) {
  check_sys(::mkdir(dir.c_str(), mode), "mkdir", dir.string());
  if (owner && ::lchown(dir.c_str(), owner->uid, owner->gid) < 0) throw SysError(errno, "chown", dir.string());
  check_sys(::chmod(dir.c_str(), mode), "chmod", dir.string());  // the umask took its share
}

// An empty root layer at `layer`, as Store::create makes one: host-only on the way (0700), its
// upper/ and work/ the instance root's.
void make_layer(const stdfs::path& layer, const std::optional<users::Identity>& owner) {
  make_dir(layer, 0700, std::nullopt);
  make_dir(layer / "upper", 0755, owner);
  make_dir(layer / "work", 0755, owner);
}

// A copy of the tree `from` at `to` (which must not exist), exact (base/copy_tree.hpp): owners,
// modes, times, extended attributes (the overlay's trusted.overlay.* as root), whiteouts, links as
// links, hard links as hard links, blocks shared where the filesystem can. Made through
// descriptors that never follow a link, so that even a tree changed while it is read (nothing of
// the instance runs meanwhile: Service::hold_still) can never bring a file from outside it into
// the copy. `mapped`: the tree holds files of a normal user's subordinate ids (an image
// instance's accounts), which only a user namespace mapping them can copy exactly: then
// `ns-hpc __copy-tree` does it there (sandbox::as_mapped_root).
void copy_tree(const stdfs::path& from, const stdfs::path& to, bool mapped) {
  if (!mapped) {
    try {
      fs::copy_tree_exact(from, to);
    } catch (const SysError& e) {
      throw e.wrapped(fmt::format("copying {} to {}", from.string(), to.string()));
    }
    return;
  }
  const std::vector<std::string> argv = sandbox::as_mapped_root(
      {fs::self_program("the copy of an instance's files"), std::string(fs::kCopyTreeCommand), from.string(), to.string()});
  // Hours, not seconds: a large tree on a slow disk is not a hang.
  const CommandResult r = run_command(argv, {}, std::chrono::hours(12), 64 * 1024);
  if (r.exit_code != 0 || r.timed_out)
    throw Error(fmt::format("copying {} to {} failed: {}", from.string(), to.string(), describe_failure(argv, r)));
}

// Whether the trees of `inst` need a mapped copy (copy_tree).
bool needs_mapping(const store::Instance& inst) { return inst.image && ::geteuid() != 0; }

// Puts the tree `staged` in place of `target`; returns where the old tree went (inside
// `staged`'s folder, so it is thrown away with it), or nullopt when there was none. One
// rename(2) exchange where the filesystem has it: at no moment is `target` missing.
std::optional<stdfs::path> swap_in(const stdfs::path& staged, const stdfs::path& target) {
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return staged;
  const int err = errno;
  if (err == ENOENT) {  // no old tree (a layer removed by hand): just the new one
    check_sys(::rename(staged.c_str(), target.c_str()), "rename", target.string());
    return std::nullopt;
  }
  if (err != EINVAL && err != ENOSYS) throw SysError(err, "exchange", target.string());
  // A filesystem without exchange: two renames, the second undone by the first when it fails.
  stdfs::path aside = staged;
  aside += "-old";
  check_sys(::rename(target.c_str(), aside.c_str()), "rename", target.string());
  if (::rename(staged.c_str(), target.c_str()) < 0) {
    const int again = errno;
    ::rename(aside.c_str(), target.c_str());
    throw SysError(again, "rename", target.string());
  }
  return aside;
}

std::chrono::microseconds since(Steady::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Steady::now() - start);
}

double ms(std::chrono::microseconds us) { return static_cast<double>(us.count()) / 1000.0; }

}  // namespace

// ---- Snapshots ------------------------------------------------------------------------------

stdfs::path Snapshots::staging(const store::Instance& inst, std::string_view what) const {
  const stdfs::path dir = store_.root() / fmt::format(".deleting-{}-{}-{}", inst.id, what, random::hex(4));
  make_dir(dir, 0700, std::nullopt);
  return dir;
}

LayerChange Snapshots::reset(const store::Instance& inst, bool include_workspace, std::string_view actor) {
  if (!inst.image && !include_workspace)
    throw UsageError(fmt::format(
        "instance '{}' runs on the host's root, read-only: it has no root layer of its own to reset; only its "
        "workspace can be emptied (include the workspace to do that)",
        inst.id));
  const auto start = Steady::now();
  fs::FileLock lock(lock_file(inst));
  LayerChange change;
  Service::Still still = instances_.hold_still(inst, "stopped for a factory reset", actor);
  const stdfs::path stage = staging(inst, "reset");
  const std::optional<users::Identity> owner = store_.owner_of(inst);
  std::chrono::steady_clock::time_point swap_start;
  try {
    if (inst.image) make_layer(stage / "layer", owner);
    if (include_workspace) make_dir(stage / "workspace", 0700, owner);
    swap_start = Steady::now();
    if (inst.image) {
      swap_in(stage / "layer", inst.layer_dir());
      change.layer = true;
    }
    if (include_workspace) {
      swap_in(stage / "workspace", inst.workspace);
      change.workspace = true;
    }
  } catch (...) {
    trash_.add(stage);  // what was swapped stays swapped: each swap is whole
    instances_.resume(inst, still, actor);
    throw;
  }
  change.swap = since(swap_start);
  trash_.add(stage);
  change.restarted = instances_.resume(inst, still, actor);
  change.ended = std::move(still.ended);
  change.took = since(start);
  store_.audit(inst, "instance.reset", actor,
               {{"instance_id", inst.id},
                {"layer", change.layer},
                {"workspace", change.workspace},
                {"swap_ms", ms(change.swap)},
                {"was_running", change.ended.was_running},
                {"restarted", change.restarted}});
  return change;
}

LayerChange Snapshots::take(const store::Instance& inst, const std::string& name, std::string_view actor) {
  validate_snapshot_name(name);
  const auto start = Steady::now();
  fs::FileLock lock(lock_file(inst));
  const stdfs::path target = inst.snapshots_dir() / name;
  struct stat st;
  if (::lstat(target.c_str(), &st) == 0) {
    const auto text = fs::read_file(target / "snapshot.json");
    const auto taken = text ? parse_snapshot(name, *text) : std::nullopt;
    throw UsageError(fmt::format("instance '{}' already has a snapshot named '{}' (taken {}); delete it first or "
                                 "choose another name",
                                 inst.id, name, taken && !taken->created_at.empty() ? taken->created_at : "at an unknown time"));
  }
  LayerChange change;
  Service::Still still = instances_.hold_still(inst, "stopped for a snapshot", actor);
  const stdfs::path stage = staging(inst, "snapshot");
  const std::string what = fmt::format("snapshot '{}' of instance '{}' not taken", name, inst.id);
  SnapshotInfo info;
  try {
    try {
      if (inst.image) {
        copy_tree(inst.layer_dir(), stage / "layer", needs_mapping(inst));
        change.layer = info.has_layer = true;
      }
      copy_tree(inst.workspace, stage / "workspace", needs_mapping(inst));
      change.workspace = true;
    } catch (const SysError&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}; the instance is as it was (free disk space, or delete snapshots, and try again)",
                              what, e.what()));
    }
    info.name = name;
    info.created_at = timeutil::iso_utc();
    info.root = inst.meta.root();
    info.bytes = fs::tree_usage(stage).bytes;
    fs::atomic_write(stage / "snapshot.json", to_json(info).dump(2) + "\n", 0600);
    // Host-only: a sandbox reaches none of it (the instance folder is 0711 and this 0700).
    if (::mkdir(inst.snapshots_dir().c_str(), 0700) < 0 && errno != EEXIST)
      throw SysError(errno, "mkdir", inst.snapshots_dir().string());
    check_sys(::rename(stage.c_str(), target.c_str()), "rename", target.string());
    fs::sync_dir(inst.snapshots_dir());
  } catch (const SysError& e) {
    trash_.add(stage);
    instances_.resume(inst, still, actor);
    throw e.wrapped(what + " (the instance is as it was)");
  } catch (...) {
    trash_.add(stage);
    instances_.resume(inst, still, actor);
    throw;
  }
  change.restarted = instances_.resume(inst, still, actor);
  change.ended = std::move(still.ended);
  change.snapshot = info;
  change.took = since(start);
  store_.audit(inst, "instance.snapshot_taken", actor,
               {{"instance_id", inst.id},
                {"snapshot", name},
                {"bytes", info.bytes},
                {"took_ms", ms(change.took)},
                {"was_running", change.ended.was_running},
                {"restarted", change.restarted}});
  return change;
}

std::vector<SnapshotInfo> Snapshots::list(const store::Instance& inst) const {
  std::vector<SnapshotInfo> out;
  for (const std::string& name : fs::folder_names(inst.snapshots_dir())) {
    if (name[0] == '.') continue;  // nothing of ours
    const auto text = fs::read_file(inst.snapshots_dir() / name / "snapshot.json");
    std::optional<SnapshotInfo> info = text ? parse_snapshot(name, *text) : std::nullopt;
    if (!info) {
      log::warn("instance '{}': snapshot folder '{}' has no usable snapshot.json; skipped", inst.id, name);
      continue;
    }
    out.push_back(std::move(*info));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SnapshotInfo& a, const SnapshotInfo& b) { return a.created_at > b.created_at; });
  return out;
}

SnapshotInfo Snapshots::find(const store::Instance& inst, const std::string& name) const {
  validate_snapshot_name(name);
  const auto text = fs::read_file(inst.snapshots_dir() / name / "snapshot.json");
  if (auto info = text ? parse_snapshot(name, *text) : std::nullopt) return *info;
  std::vector<std::string> names;
  for (const auto& s : list(inst)) names.push_back(s.name);
  throw UsageError(names.empty() ? fmt::format("instance '{}' has no snapshots (no '{}')", inst.id, name)
                                 : fmt::format("instance '{}' has no snapshot '{}'; its snapshots: {}", inst.id, name,
                                               fmt::join(names, ", ")));
}

LayerChange Snapshots::restore(const store::Instance& inst, const std::string& name, std::string_view actor) {
  const auto start = Steady::now();
  fs::FileLock lock(lock_file(inst));
  const SnapshotInfo info = find(inst, name);
  if (info.root != inst.meta.root() || info.has_layer != inst.image.has_value())
    throw UsageError(fmt::format("snapshot '{}' was taken on root {} and instance '{}' now runs on {}; it cannot be "
                                 "restored here",
                                 name, info.root, inst.id, inst.meta.root()));
  const stdfs::path from = inst.snapshots_dir() / name;
  LayerChange change;
  Service::Still still = instances_.hold_still(inst, "stopped for a snapshot's restore", actor);
  const stdfs::path stage = staging(inst, "restore");
  // The copies first, beside the instance: a copy that fails (a full disk) changes nothing.
  try {
    if (info.has_layer) copy_tree(from / "layer", stage / "layer", needs_mapping(inst));
    copy_tree(from / "workspace", stage / "workspace", needs_mapping(inst));
  } catch (const SysError& e) {
    trash_.add(stage);
    instances_.resume(inst, still, actor);
    throw e.wrapped(fmt::format("snapshot '{}' of instance '{}' not restored (the instance is as it was)", name, inst.id));
  } catch (const Error& e) {
    trash_.add(stage);
    instances_.resume(inst, still, actor);
    throw Error(fmt::format("snapshot '{}' of instance '{}' not restored: {}; the instance is as it was (free disk "
                            "space and try again)",
                            name, inst.id, e.what()));
  }
  const auto swap_start = Steady::now();
  try {
    std::optional<stdfs::path> old_layer;
    if (info.has_layer) {
      old_layer = swap_in(stage / "layer", inst.layer_dir());
      change.layer = true;
    }
    try {
      swap_in(stage / "workspace", inst.workspace);
      change.workspace = true;
    } catch (...) {
      // Layer and workspace belong together: put the layer back as it was.
      if (old_layer) swap_in(*old_layer, inst.layer_dir());
      throw;
    }
  } catch (...) {
    trash_.add(stage);
    instances_.resume(inst, still, actor);
    throw;
  }
  change.swap = since(swap_start);
  trash_.add(stage);
  change.restarted = instances_.resume(inst, still, actor);
  change.ended = std::move(still.ended);
  change.snapshot = info;
  change.took = since(start);
  store_.audit(inst, "instance.snapshot_restored", actor,
               {{"instance_id", inst.id},
                {"snapshot", name},
                {"took_ms", ms(change.took)},
                {"was_running", change.ended.was_running},
                {"restarted", change.restarted}});
  return change;
}

SnapshotInfo Snapshots::remove(const store::Instance& inst, const std::string& name, std::string_view actor) {
  fs::FileLock lock(lock_file(inst));
  const SnapshotInfo info = find(inst, name);
  const stdfs::path doomed = store_.root() / fmt::format(".deleting-{}-snapshot-{}", inst.id, random::hex(4));
  const stdfs::path from = inst.snapshots_dir() / name;
  check_sys(::rename(from.c_str(), doomed.c_str()), "rename", from.string());
  trash_.add(doomed);
  store_.audit(inst, "instance.snapshot_deleted", actor, {{"instance_id", inst.id}, {"snapshot", name}});
  return info;
}

}  // namespace nshpc::instances
