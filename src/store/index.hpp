// The listing index of a store: what a page of instances needs (id, description, last activity,
// whether its metadata is usable), in SQLite, so that a page of a 10,000-instance store is one
// query instead of a walk that parses every metadata.json.
//
// It is a cache of the tree, never the truth, and it lives in a local state folder
// (<[server] state_dir>/index/<hash of instances_dir>.sqlite), not in instances_dir, which may be
// on NFS or Lustre where SQLite's locking is unreliable. Correctness:
//   - every store change (create, update, archive, restore, delete) updates it under the store's
//     lock, and records the instances folder's modification time it left the tree at;
//   - a listing compares that time with the folder's: when another process (an older release, a
//     crash between the rename and the update, a hand-made change) changed the set of folders, it
//     reconciles names (added, gone) and re-reads the rows whose folder changed;
//   - a missing, unreadable or foreign-version database is rebuilt from the tree;
//   - SQLite (WAL, a busy timeout) keeps it consistent across a crash and across processes.
// Activity (last_activity) is noted in memory and written in batches by a background thread of a
// process that lists (a server), so commands never wait for the index; a one-shot command appends
// its few notes at exit to a small journal beside the database, which the next listing folds in.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace nshpc::store {

namespace stdfs = std::filesystem;

// One instance as the index keeps it.
struct IndexEntry {
  std::string id;
  std::string description;
  std::int64_t activity_ns = 0;   // last activity, ns since the epoch
  std::int64_t dir_mtime_ns = 0;  // the instance folder's mtime when this row was read
  std::string problem;            // non-empty: metadata.json is unusable (the row is listed as corrupt)
};

enum class SortBy { id, last_activity };

struct ListQuery {
  std::string filter;  // case-insensitive substring of the id or the description; "" = all
  SortBy sort = SortBy::last_activity;
  std::size_t limit = 50;  // 0: all
  std::size_t offset = 0;
};

struct IndexPage {
  std::vector<std::string> ids;  // the page, in order
  std::size_t total = 0;         // usable instances matching the filter
  std::vector<IndexEntry> corrupt;  // every instance whose metadata is unusable (matching the filter)
};

class Index {
 public:
  // Reads one instance folder for the index; nullopt when it is not an instance (no metadata.json).
  using Reader = std::function<std::optional<IndexEntry>(const std::string& id)>;
  // Lists the candidate instance ids of the tree (folder names).
  using Lister = std::function<std::vector<std::string>()>;

  // `file`: the database; `root`: the instances folder it mirrors. Nothing is opened yet.
  Index(stdfs::path file, stdfs::path root, Reader reader, Lister lister,
        std::chrono::milliseconds flush_interval = std::chrono::milliseconds(500));
  ~Index();  // writes the activity still pending
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  // The default location: <state_dir>/index/<16 hex of a hash of root>.sqlite.
  static stdfs::path default_file(const stdfs::path& state_dir, const stdfs::path& root);

  // A page of the instances matching `query`, after bringing the index up to date with the tree.
  // Throws Error when the database cannot be used at all (the caller falls back to a walk).
  IndexPage page(const ListQuery& query);

  // A change by this process to the instance `id` (created, updated, gone), made while holding the
  // store's lock: re-reads its row. `root_mtime_before` is the instances folder's mtime taken under
  // that lock before the change: when the index was in step with the tree then, it still is.
  void changed(const std::string& id, std::optional<std::int64_t> root_mtime_before);

  // Notes activity of an instance now; written with the next batch, off the caller's path.
  void note_activity(const std::string& id, std::int64_t when_ns);
  // Writes the pending activity now (tests; the destructor).
  void flush();

  // Whether a database was opened (false before first use or when it cannot be).
  bool usable() const;
  const stdfs::path& file() const { return file_; }

  // The folder's modification time in ns, nullopt when it cannot be read.
  static std::optional<std::int64_t> mtime_ns(const stdfs::path& path);

  struct Db;  // the SQLite connection (index.cpp)

 private:
  Db& db();                   // opens (and creates) the database; throws Error
  void sync(Db& db);          // brings it up to date with the tree
  void rebuild_names(Db& db, std::int64_t stamp);
  void upsert(Db& db, const IndexEntry& entry);
  void erase(Db& db, const std::string& id);
  void write_activity(std::map<std::string, std::int64_t> batch);
  void write_activity_locked(Db& db, const std::map<std::string, std::int64_t>& batch);  // mutex_ held
  void run_flusher(std::stop_token stop);
  // One-shot commands' activity: appended at their exit to <file>.activity (under flock), folded
  // into the index by the next listing.
  stdfs::path journal_file() const;
  void append_journal(const std::map<std::string, std::int64_t>& batch) const;
  std::map<std::string, std::int64_t> take_journal() const;

  stdfs::path file_;
  stdfs::path root_;
  Reader reader_;
  Lister lister_;
  std::chrono::milliseconds flush_interval_;

  mutable std::mutex mutex_;  // the connection
  std::unique_ptr<Db> db_;
  bool failed_ = false;  // opening failed once: do not retry on every call
  std::atomic<bool> opened_{false};  // db_ is set (read without mutex_ by note_activity)

  std::mutex pending_mutex_;
  std::condition_variable_any pending_cv_;
  std::map<std::string, std::int64_t> pending_;  // id -> newest activity
  std::jthread flusher_;
};

}  // namespace nshpc::store
