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
//
// Persistence only: what runs in an instance, its sandbox and its jobs are the instances service's
// (src/instances/), which passes the steps an archive or delete needs per call.
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
#include "sandbox/types.hpp"
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
  // A computer of the mcp-virtual-computer entry point (instances/computers.hpp): whether it is
  // temporary; nullopt for an instance that is not a computer.
  std::optional<bool> computer_temporary() const;
  // Its desktop is switched on (desktop/): the living sandbox runs the session, commands get its display.
  bool desktop() const;
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

struct CreateOptions {
  std::string description;
  std::optional<config::Network> network;
  std::vector<std::string> network_allow;  // added to [network] allow for this instance
  std::optional<bool> persistent;
  // An image name: the instance runs on its current version ("": the host's root). The instances
  // service resolves it (ChooseRoot); the store records what that chose.
  std::string image;
  std::optional<std::int64_t> idle_stop;  // the instance's own idle_stop (0 = never); nullopt: the config's
  std::optional<bool> computer_temporary;  // set: a computer (instances/computers.hpp), temporary or not
  bool desktop = false;                     // its desktop on from the start (the instances service checks the root)
};

// An image instance's root, chosen with the store's lock held (its ids must be no other
// instance's or archive's): "image:NAME@VERSION" and the ids it runs with.
struct NewRoot {
  std::string root;
  sandbox::UidMapping ids;
};
// Called by create() with the lock held, before anything is made; nullopt: the host's root.
using ChooseRoot = std::function<std::optional<NewRoot>(const class Store&)>;

// What archive() and remove() do at their fixed points, passed by the caller (the instances
// service), with the store's lock held.
struct RemovalSteps {
  // Once the instance is known to exist and before anything moves: throws to refuse (jobs still
  // running), else ends what runs in it. `inst` as on record, or only its id and folders (and
  // persistent) when its metadata cannot be read.
  std::function<void(const struct Instance& inst)> before_move;
  // Removes a tree the instance leaves (its folder, its output); it may hold files of ids this
  // process cannot remove by itself. Throws SysError (ENOTEMPTY, EBUSY: retried a while).
  std::function<void(const std::filesystem::path& tree)> remove_tree;
};

struct UpdateOptions {
  std::optional<std::string> description;
  std::optional<config::Network> network;
  std::optional<std::vector<std::string>> network_allow;  // replaces the instance's additions
  std::optional<bool> persistent;
  std::optional<bool> desktop;
};

struct CleanCandidate {
  std::string id;
  std::chrono::system_clock::time_point last_activity;
  std::string note;  // e.g. "metadata.json is corrupt"
};

class Store {
 public:
  // `default_network`: of instances whose metadata names none ([namespace] default_network,
  // `auto` resolved by the caller, which knows whether NAT works here). The workspace and output
  // folders are given to users::sandbox_owner (the server runs as root, sandboxes as that uid).
  Store(const config::Config& config, config::Network default_network);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const stdfs::path& root() const { return root_; }
  // The network of new instances ([namespace] default_network, `auto` resolved).
  config::Network default_network() const { return default_network_; }
  // The instance's cgroup folder (sandbox::Target::cgroup_folder): "<id>@<8 hex digits of this
  // store's instances_dir>".
  std::string cgroup_folder(std::string_view id) const;
  // `choose_root` picks an image instance's root and ids (nullopt: the host's root); checks of the
  // options that need more than the store (network modes, allow entries) are the caller's.
  Instance create(std::string id, const CreateOptions& options, std::string_view actor, const ChooseRoot& choose_root);
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
  // Moves the instance to .archived/ after steps.before_move (remove_tree is not used).
  ArchivedInstance archive(std::string_view id, std::string_view actor, const RemovalSteps& steps);
  // Purges an instance: steps.before_move, then renames it away and removes its trees. A tree that
  // cannot be removed now (a process outside this server still writing) is left as
  // <instances_dir>/.deleting-* and finished by finish_deletions() at the next start.
  void remove(std::string_view id, std::string_view actor, const RemovalSteps& steps);
  // Purges an archive.
  void remove_archived(std::string_view name, std::string_view actor, const RemovalSteps& steps);
  std::vector<CleanCandidate> clean_candidates(std::chrono::hours older_than) const;

  // Removes what earlier deletes left behind (.deleting-* trees); returns how many it finished.
  std::size_t finish_deletions(const RemovalSteps& steps) const;

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

  // What a sandbox of this instance binds: its workspace, output and network; then what the
  // decorator adds (set once by the instances service: a desktop's display and session).
  sandbox::Target sandbox_target(const Instance& instance) const;
  using TargetDecorator = std::function<void(const Instance& instance, sandbox::Target& target)>;
  void set_target_decorator(TargetDecorator decorator) { decorator_ = std::move(decorator); }
  // Whom the instance's sandboxes run as on the host and its files belong to
  // (sandbox::host_identity); nullopt: this process's own uid.
  std::optional<users::Identity> owner_of(const Instance& instance) const;

  // Appends an event to the instance's audit log.
  void audit(const Instance& instance, std::string_view event, std::string_view actor,
             nlohmann::json fields = nlohmann::json::object()) const;
  // Appends an event to the store-level audit log (<instances_dir>/.audit.log).
  void audit_store(std::string_view event, std::string_view actor,
                   nlohmann::json fields = nlohmann::json::object()) const;

 private:
  TargetDecorator decorator_;
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
  sandbox::ImageRoot image_root(const Instance& instance) const;
  // The folder of an existing instance, after steps.before_move (archive/delete).
  stdfs::path removable_base(std::string_view id, const RemovalSteps& steps) const;
  // steps.remove_tree, retried while something still writes there; false (and logged) when it stays.
  bool remove_doomed(const stdfs::path& tree, const RemovalSteps& steps) const;

  stdfs::path root_;
  std::string cgroup_tag_;  // of cgroup_folder()
  config::Network default_network_;
  bool default_persistent_ = false;
  audit::Rotation rotation_;
  std::string workspace_mount_;
  stdfs::path images_dir_;
  std::optional<users::Identity> owner_;  // users::sandbox_owner
  std::unique_ptr<Index> index_;  // the listing index, opened at the first listing
};

}  // namespace nshpc::store
