// Instance store: the on-disk layout of ns-hpc (compatible with the Python original).
//
//   <instances_dir>/
//     .lock                          store-wide lock file (every mutation holds it)
//     .audit.log                     store-level audit (events that outlive an instance: deletes)
//     <id>/metadata.json             presence <=> the instance exists
//     <id>/audit.log                 per-instance audit (host side only)
//     <id>/workspace/                bound read-write at namespace.workspace_mount
//     <id>/.ns_hpc_jobs/<job>.state  job records (jobs module)
//     output/<id>/                   bound read-write at namespace.output_mount
//     .archived/<id>__<ts>/          archived instances (whole tree); output/<id>__<ts> beside it
//
// Every write is atomic (temp + fsync + rename) and every mutation holds an exclusive flock on
// <instances_dir>/.lock, so several processes (CLI, server) can share one store.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "audit/audit.hpp"
#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/json.hpp"
#include "base/safe_path.hpp"
#include "base/users.hpp"
#include "config/config.hpp"
#include "files/resolver.hpp"
#include "sandbox/layers.hpp"
#include "sandbox/sandbox.hpp"
#include "store/index.hpp"

namespace nshpc::store {

namespace stdfs = std::filesystem;

// Throws UsageError naming the rule when `id` is not a valid, unreserved instance id.
void validate_id(std::string_view id);
// A readable id such as "calm-otter-3f2a".
std::string generate_id();

struct Metadata {
  nlohmann::json raw = nlohmann::json::object();  // the whole file; unknown fields are kept

  std::string id() const;
  std::string created_at() const;
  std::string description() const;
  std::string hostname() const;
  bool archived() const;
  std::string archived_at() const;
  std::optional<config::Network> network() const;  // nullopt: not set (use the default)
  std::optional<bool> persistent() const;           // nullopt: not set (use the default)
  // A computer of the mcp-virtual-computer entry point (lifecycle/computers.hpp): whether it is
  // temporary; nullopt for an instance that is not a computer.
  std::optional<bool> computer_temporary() const;
  // "host", or "image:<name>@<version>" for an instance on an image.
  std::string root() const;
};

struct Instance {
  std::string id;
  stdfs::path base;       // <instances_dir>/<id>
  stdfs::path workspace;  // <base>/workspace
  stdfs::path output;     // <instances_dir>/output/<id>
  Metadata meta;
  config::Network network = config::Network::host;  // effective (metadata or default)
  bool persistent = false;                           // effective: a living instance
  // Its own [namespace] idle_stop (seconds; 0 = never stops for idleness); nullopt: the config's.
  std::optional<std::int64_t> idle_stop;
  std::vector<std::string> network_allow;            // its additions to [network] allow
  // On an image: the image version, the instance's layer and ids (always persistent then).
  std::optional<sandbox::ImageRoot> image;

  stdfs::path metadata_file() const { return base / "metadata.json"; }
  stdfs::path audit_log() const { return base / "audit.log"; }
  // Host-only state of the instance's sandboxes: job status files, the living sandbox's record.
  stdfs::path state_dir() const { return base / "status"; }
  // An image instance's own root layer (upper/ and work/), and its snapshots.
  stdfs::path layer_dir() const { return base / "layer"; }
  stdfs::path snapshots_dir() const { return base / "snapshots"; }
  // Last activity: the newest of audit.log's and metadata.json's modification times.
  std::chrono::system_clock::time_point last_activity() const;
};

struct ArchivedInstance {
  std::string name;  // folder name under .archived: <id>__<timestamp>
  std::string id;
  stdfs::path base;
  Metadata meta;
};

// An instance folder whose metadata.json cannot be used; reported, never fatal.
struct CorruptInstance {
  std::string id;
  stdfs::path base;
  std::string problem;
};

struct Listing {
  std::vector<Instance> instances;  // sorted by id
  std::vector<CorruptInstance> corrupt;
};

// One page of a listing (Store::list_page): the instances of the page, in order, and how many
// match in all.
struct Page {
  std::vector<Instance> instances;
  std::size_t total = 0;                // usable instances matching the query
  std::vector<CorruptInstance> corrupt;  // every unusable one matching the query
  bool indexed = true;                   // false: the index could not be used, the tree was walked
};

// The jobs layer answers whether an instance still has live jobs (archive/delete refuse then).
class JobsGuard {
 public:
  virtual ~JobsGuard() = default;
  virtual std::size_t active_jobs(const stdfs::path& instance_base) = 0;
};

// Counts the jobs recorded as "pending" or "running" in <base>/.ns_hpc_jobs/*.state, taking the
// records at their word (no look at the sandboxes): for processes without a job engine.
class RecordedJobsGuard final : public JobsGuard {
 public:
  std::size_t active_jobs(const stdfs::path& instance_base) override;
};

struct CreateOptions {
  std::string description;
  std::optional<config::Network> network;
  std::vector<std::string> network_allow;  // added to [network] allow for this instance
  std::optional<bool> persistent;
  std::string image;  // an image name (its current version): the instance runs on it; "": the host's root
  std::optional<std::int64_t> idle_stop;  // the instance's own idle_stop (0 = never); nullopt: the config's
  std::optional<bool> computer_temporary;  // set: a computer (lifecycle/computers.hpp), temporary or not
};

struct UpdateOptions {
  std::optional<std::string> description;
  std::optional<config::Network> network;
  std::optional<std::vector<std::string>> network_allow;  // replaces the instance's additions
  std::optional<bool> persistent;
};

struct CleanCandidate {
  std::string id;
  std::chrono::system_clock::time_point last_activity;
  std::string note;  // e.g. "metadata.json is corrupt"
};

class Store {
 public:
  // `owner_uid/gid`: when set, the workspace and output folders are chowned to them (the server
  // runs as root and bwrap runs as this unprivileged uid).
  Store(const config::Config& config, JobsGuard& jobs);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const stdfs::path& root() const { return root_; }
  // The network of new instances ([namespace] default_network, `auto` resolved here).
  config::Network default_network() const { return default_network_; }
  // Whom the instance's sandboxes run as on the host and its files belong to (sandbox.hpp:
  // host_identity); nullopt: this process's own uid.
  std::optional<users::Identity> owner_of(const Instance& instance) const;
  // Whom the instance's files belong to (its accounts' ids included), and, for a normal user's
  // image instance, the broker that does what the server may not do to them from outside (files
  // of accounts made inside, folders closed to their owner): the view of the file tools and
  // WebDAV.
  struct FileAccess {
    std::optional<files::Owner> owner;
    std::shared_ptr<files::Broker> broker;
  };
  FileAccess file_access(const Instance& instance) const;
  // The instance's cgroup folder (sandbox::Target::cgroup_folder): "<id>@<8 hex digits of this
  // store's instances_dir>".
  std::string cgroup_folder(std::string_view id) const;
  // Who answers "does this instance still have jobs?" (the job engine, once it exists).
  void set_jobs_guard(JobsGuard& jobs) { jobs_ = &jobs; }
  // Who stops a living instance's sandbox (the sandbox backend): archive() and remove() call it
  // for a persistent instance after the jobs check and before its files move, with `why`
  // "archived" or "deleted". Unset: nothing is stopped (a process that starts no sandboxes).
  using LivingStop = std::function<void(const sandbox::Target& target, std::string_view why)>;
  void set_living_stop(LivingStop stop) { living_stop_ = std::move(stop); }

  Instance create(std::string id, const CreateOptions& options, std::string_view actor);
  Instance get(std::string_view id) const;  // UsageError when unknown, Error when corrupt
  // Runs `step` with the instance as it is now, while no archive or delete of it can begin or be
  // half done (the store's lock is held): for what must be on record before either looks, such
  // as a job's pending record. Throws as get() does.
  void while_present(std::string_view id, const std::function<void(const Instance&)>& step) const;
  // True when an instance folder with a metadata.json exists (even a corrupt one).
  bool exists(std::string_view id) const;
  Listing list() const;
  // A page of the active instances matching `query`, from the listing index (store/index.hpp);
  // when the index cannot be used, from a walk of the tree (the same answer, slower).
  Page list_page(const ListQuery& query) const;
  std::vector<ArchivedInstance> list_archived() const;
  // The newest archive of `id` (archived under that id), if any.
  std::optional<ArchivedInstance> latest_archive(std::string_view id) const;
  // The active instance id closest to `id` (a likely typo), if one is close.
  std::optional<std::string> near_miss(std::string_view id) const;
  // Brings an archive back as an active instance: `archive` is an archive name (<id>__<ts>) or an
  // id (its newest archive). It becomes `new_id` when given (UsageError when taken), else its old
  // id, or when that is taken now "<id>-restored", "<id>-restored-2", ...
  Instance restore(std::string_view archive, std::string_view new_id, std::string_view actor);
  Instance update(std::string_view id, const UpdateOptions& options, std::string_view actor);
  ArchivedInstance archive(std::string_view id, std::string_view actor);
  // Purges an instance: refused while it has jobs; stops the executions registered for it, then
  // renames it away and removes its trees. A tree that cannot be removed now (a process outside
  // this server still writing) is left as <instances_dir>/.deleting-* and finished by
  // finish_deletions() at the next start.
  void remove(std::string_view id, std::string_view actor);
  void remove_archived(std::string_view name, std::string_view actor);    // purge an archive
  std::vector<CleanCandidate> clean_candidates(std::chrono::hours older_than) const;

  // Removes what earlier deletes left behind (.deleting-* trees); returns how many it finished.
  std::size_t finish_deletions() const;

  // A running execution of an instance (a terminal command, ...) is registered while it runs, with
  // what stops it: remove() and archive() stop it before the files go.
  class Registration {
   public:
    Registration(const Store& store, std::uint64_t key) : store_(&store), key_(key) {}
    Registration(Registration&& other) noexcept : store_(std::exchange(other.store_, nullptr)), key_(other.key_) {}
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    Registration& operator=(Registration&&) = delete;
    ~Registration();

   private:
    const Store* store_;
    std::uint64_t key_;
  };
  // `what`: the execution in a few words for people ("`make test`"); empty: "a command".
  Registration register_execution(std::string_view id, std::function<void()> stop, std::string what = {}) const;
  // Stops (kills the trees of) the executions of instance `id` that this process registered.
  void stop_executions(std::string_view id) const;
  // What this process runs in instance `id` now, as registered.
  std::vector<std::string> executions_of(std::string_view id) const;

  // Disk use of an instance's workspace, output folder, root layer (an image instance) and
  // snapshots (walked without following links; a large tree takes a while, so only describe and
  // listings for scripts ask). Allocated blocks: a snapshot's reflinked copy shares its blocks
  // with the layer but counts in both. No quota is set: the filesystem here has none that an
  // unprivileged server could use. `files`: of the workspace and output.
  struct DiskUse {
    std::uint64_t workspace_bytes = 0;
    std::uint64_t output_bytes = 0;
    std::uint64_t files = 0;
    std::uint64_t layer_bytes = 0;
    std::uint64_t snapshots_bytes = 0;
  };
  DiskUse disk_use(const Instance& instance) const;

  // A file of an instance's workspace, which its sandbox writes (so it is hostile): opened beneath
  // the workspace without following links and without blocking (base/safe_path.hpp).
  //   create: a fresh file (a planted entry is removed, not followed), given to the sandbox uid
  //   append: an existing regular file of the sandbox uid with one link, else a fresh one
  //   read:   for reading, checked the same way; an invalid descriptor and `refusal` set when
  //           it may not be read (missing, a link, not a regular file, another owner)
  // create and append throw SysError (ELOOP/ENOTDIR: a link or a file on the way).
  enum class WorkspaceOpen { create, append, read };
  UniqueFd open_workspace_file(const Instance& instance, const std::string& relative, WorkspaceOpen how,
                               fs::Refusal* refusal = nullptr) const;

  // What a sandbox of this instance binds: its workspace, output and network.
  sandbox::Target sandbox_target(const Instance& instance) const;

  // Appends an event to the instance's audit log.
  void audit(const Instance& instance, std::string_view event, std::string_view actor,
             nlohmann::json fields = nlohmann::json::object()) const;
  // Appends an event to the store-level audit log (<instances_dir>/.audit.log).
  void audit_store(std::string_view event, std::string_view actor,
                   nlohmann::json fields = nlohmann::json::object()) const;

 private:
  stdfs::path lock_file() const { return root_ / ".lock"; }
  stdfs::path output_root() const { return root_ / "output"; }
  stdfs::path archive_root() const { return root_ / ".archived"; }
  void ensure_layout() const;
  NotFound instance_not_found(std::string_view id) const;  // with the archive and near miss, when any
  std::optional<IndexEntry> index_entry(const std::string& id) const;  // the index's Reader
  std::vector<std::string> instance_names() const;                     // the index's Lister
  void index_changed(const std::string& id, std::optional<std::int64_t> root_mtime_before) const;
  Instance load(std::string_view id, const stdfs::path& base) const;
  void give_to(const stdfs::path& dir, const std::optional<users::Identity>& owner) const;
  // The ids a new image instance gets (as root: the lowest free range above root_range_floor,
  // none used by an instance or archive of this store); called with the store's lock held.
  sandbox::UidMapping allocate_ids() const;
  sandbox::ImageRoot image_root(const Instance& instance) const;
  // The folder of an existing instance that has no live jobs (archive/delete), else UsageError.
  stdfs::path removable_base(std::string_view id, std::string_view action) const;
  // Stops the instance's living sandbox (living_stop_) when it is persistent, or when its
  // metadata cannot be read (then nothing is known, and a stop of what never ran is harmless).
  void stop_living(std::string_view id, const stdfs::path& base, std::string_view why) const;
  // remove_tree, retried while something still writes there; false (and logged) when it stays.
  bool remove_doomed(const stdfs::path& tree) const;

  struct Execution {
    std::string instance_id;
    std::function<void()> stop;
    std::string what;
  };
  mutable std::mutex executions_mutex_;
  mutable std::map<std::uint64_t, Execution> executions_;
  mutable std::uint64_t next_execution_ = 0;

  stdfs::path root_;
  std::string cgroup_tag_;  // of cgroup_folder()
  config::Network default_network_;
  bool default_persistent_ = false;
  audit::Rotation rotation_;
  std::string workspace_mount_;
  stdfs::path images_dir_;
  mutable std::optional<sandbox::LayerSupport> layer_support_;  // probed at the first image instance
  std::optional<users::Identity> owner_;  // users::sandbox_owner
  JobsGuard* jobs_;
  LivingStop living_stop_;
  std::unique_ptr<Index> index_;  // the listing index, opened at the first listing
};

}  // namespace nshpc::store
