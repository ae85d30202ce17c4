#include "store/index.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/sqlite.hpp"
#include "base/text.hpp"

namespace nshpc::store {

namespace {

constexpr int kSchemaVersion = 1;
constexpr int kBusyTimeoutMs = 5000;

// FNV-1a, 64 bits: a stable file name per instances folder.
std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

}  // namespace

// The connection (base/sqlite).
struct Index::Db : sqlite::Connection {
  Db() : Connection("instance index") {}
};

using Stmt = sqlite::Statement;
using sqlite::Transaction;

Index::Index(stdfs::path file, stdfs::path root, Reader reader, Lister lister, std::chrono::milliseconds flush_interval)
    : file_(std::move(file)),
      root_(std::move(root)),
      reader_(std::move(reader)),
      lister_(std::move(lister)),
      flush_interval_(flush_interval) {}

Index::~Index() {
  if (flusher_.joinable()) {
    flusher_.request_stop();
    pending_cv_.notify_all();
    flusher_.join();
  }
  try {
    if (opened_.load()) {
      flush();
    } else {
      // A one-shot command (`ns-hpc bwrap`, ...): one append to the journal beside the index,
      // which the next listing folds in; opening SQLite would cost every command milliseconds.
      std::map<std::string, std::int64_t> batch;
      {
        std::lock_guard lock(pending_mutex_);
        batch.swap(pending_);
      }
      if (!batch.empty() && stdfs::exists(file_)) append_journal(batch);
    }
  } catch (const std::exception& e) {
    log::debug("instance index: activity not written at exit: {}", e.what());
  }
}

stdfs::path Index::journal_file() const { return file_.string() + ".activity"; }

void Index::append_journal(const std::map<std::string, std::int64_t>& batch) const {
  std::string lines;
  for (const auto& [id, when] : batch) lines += fmt::format("{} {}\n", when, id);
  UniqueFd fd(::open(journal_file().c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw SysError(errno, "open", journal_file().string());
  check_sys(::flock(fd.get(), LOCK_EX), "lock", journal_file().string());  // the reader empties it under this lock
  check_sys(::write(fd.get(), lines.data(), lines.size()), "write", journal_file().string());
}

// What one-shot commands appended since the last listing; the journal is emptied.
std::map<std::string, std::int64_t> Index::take_journal() const {
  std::map<std::string, std::int64_t> batch;
  UniqueFd fd(::open(journal_file().c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return batch;
  if (::flock(fd.get(), LOCK_EX) < 0) return batch;
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  if (::ftruncate(fd.get(), 0) < 0) log::debug("instance index: {} not emptied: {}", journal_file().string(), std::strerror(errno));
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) break;
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos) continue;
    std::int64_t when = 0;
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + space, when);
    if (ec != std::errc() || ptr != line.data() + space) continue;
    auto& slot = batch[std::string(line.substr(space + 1))];
    slot = std::max(slot, when);
  }
  return batch;
}

stdfs::path Index::default_file(const stdfs::path& state_dir, const stdfs::path& root) {
  std::error_code ec;
  stdfs::path canonical = stdfs::weakly_canonical(root, ec);
  if (ec) canonical = root;
  return state_dir / "index" / fmt::format("{:016x}.sqlite", text::fnv1a(canonical.string()));
}

std::optional<std::int64_t> Index::mtime_ns(const stdfs::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) < 0) return std::nullopt;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

bool Index::usable() const {
  std::lock_guard lock(mutex_);
  return db_ != nullptr;
}

Index::Db& Index::db() {
  if (db_) return *db_;
  if (failed_) throw Error(fmt::format("instance index {} could not be opened earlier", file_.string()));
  try {
    // The state folder may hold the instances (as root by default): passable, not listable.
    fs::make_dirs(file_.parent_path().parent_path(), 0711);
    fs::make_dirs(file_.parent_path(), 0700);
    for (int attempt = 0;; ++attempt) {
      auto db = std::make_unique<Db>();
      db->open(file_.string(), SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, kBusyTimeoutMs);
      try {
        db->exec("PRAGMA journal_mode=WAL");
        db->exec("PRAGMA synchronous=NORMAL");
        Stmt version(*db, "PRAGMA user_version");
        const std::int64_t have = version.step() ? version.integer(0) : 0;
        if (have != 0 && have != kSchemaVersion)
          throw Error(fmt::format("instance index {} has schema {}, not {}", file_.string(), have, kSchemaVersion));
        db->exec(
            "CREATE TABLE IF NOT EXISTS instances(id TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '', "
            "activity INTEGER NOT NULL DEFAULT 0, dir_mtime INTEGER NOT NULL DEFAULT 0, "
            "problem TEXT NOT NULL DEFAULT '') WITHOUT ROWID;"
            "CREATE INDEX IF NOT EXISTS instances_by_activity ON instances(activity DESC, id);"
            "CREATE TABLE IF NOT EXISTS facts(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;"
            "PRAGMA user_version=1;");
        Stmt root(*db, "SELECT value FROM facts WHERE key='root'");
        if (root.step() && root.text(0) != root_.string())
          throw Error(fmt::format("instance index {} mirrors {}", file_.string(), root.text(0)));
        Stmt set_root(*db, "INSERT OR REPLACE INTO facts(key, value) VALUES('root', ?1)");
        set_root.bind(1, root_.string()).step();
      } catch (const Error& e) {
        // Corrupt, foreign or of another release: it is only a cache, so it is made anew.
        if (attempt > 0) throw;
        log::info("{}; rebuilding it from {}", e.what(), root_.string());
        db.reset();
        for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((file_.string() + suffix).c_str());
        continue;
      }
      db_ = std::move(db);
      opened_.store(true, std::memory_order_release);
      return *db_;
    }
  } catch (const std::exception& e) {
    failed_ = true;
    throw Error(fmt::format("instance index {} cannot be used ({}); listings read every instance instead",
                            file_.string(), e.what()));
  }
}

void Index::upsert(Db& db, const IndexEntry& e) {
  Stmt st(db,
          "INSERT INTO instances(id, description, activity, dir_mtime, problem) VALUES(?1, ?2, ?3, ?4, ?5) "
          "ON CONFLICT(id) DO UPDATE SET description=excluded.description, "
          "activity=max(activity, excluded.activity), dir_mtime=excluded.dir_mtime, problem=excluded.problem");
  st.bind(1, e.id).bind(2, e.description).bind(3, e.activity_ns).bind(4, e.dir_mtime_ns).bind(5, e.problem).step();
}

void Index::erase(Db& db, const std::string& id) {
  Stmt st(db, "DELETE FROM instances WHERE id=?1");
  st.bind(1, id).step();
}

// Reconciles the rows with the folders: new ones read, gone ones dropped, and those whose folder
// changed since they were read (metadata.json replaced) read again. Then records `stamp`, the
// instances folder's mtime taken before the walk (a change during it makes the next call look
// again).
void Index::rebuild_names(Db& db, std::int64_t stamp) {
  std::vector<std::string> names = lister_();
  std::map<std::string, std::int64_t> known;  // id -> dir_mtime
  {
    Stmt all(db, "SELECT id, dir_mtime FROM instances");
    while (all.step()) known.emplace(all.text(0), all.integer(1));
  }
  Transaction tx(db);
  std::set<std::string> present;
  for (const std::string& name : names) {
    auto it = known.find(name);
    if (it != known.end()) {
      auto now = mtime_ns(root_ / name);
      if (now && *now == it->second) {
        present.insert(name);
        continue;
      }
    }
    if (auto entry = reader_(name)) {
      upsert(db, *entry);
      present.insert(name);
    }
  }
  for (const auto& [id, mtime] : known)
    if (!present.count(id)) erase(db, id);
  Stmt set(db, "INSERT OR REPLACE INTO facts(key, value) VALUES('stamp', ?1)");
  set.bind(1, std::to_string(stamp)).step();
  tx.commit();
}

void Index::sync(Db& db) {
  const auto now = mtime_ns(root_);
  if (!now) return;  // no store yet: nothing to list
  Stmt get(db, "SELECT value FROM facts WHERE key='stamp'");
  if (get.step() && get.text(0) == std::to_string(*now)) return;
  rebuild_names(db, *now);
}

IndexPage Index::page(const ListQuery& query) {
  std::unique_lock lock(mutex_);
  Db& d = db();
  sync(d);
  // Activity noted before the index was open (or since the last batch) counts for this page.
  std::map<std::string, std::int64_t> batch = take_journal();
  {
    std::lock_guard pending(pending_mutex_);
    for (const auto& [id, when] : pending_) batch[id] = std::max(batch[id], when);
    pending_.clear();
  }
  if (!batch.empty()) write_activity_locked(d, batch);
  IndexPage page;
  const std::string filter = lower_ascii(query.filter);
  const char* where = "(?1 = '' OR instr(lower(id), ?1) > 0 OR instr(lower(description), ?1) > 0)";
  {
    Stmt count(d, fmt::format("SELECT count(*) FROM instances WHERE problem = '' AND {}", where));
    count.bind(1, filter);
    if (count.step()) page.total = static_cast<std::size_t>(count.integer(0));
  }
  {
    Stmt rows(d, fmt::format("SELECT id FROM instances WHERE problem = '' AND {} ORDER BY {} LIMIT ?2 OFFSET ?3",
                                    where, query.sort == SortBy::id ? "id" : "activity DESC, id"));
    rows.bind(1, filter)
        .bind(2, query.limit == 0 ? std::int64_t{-1} : static_cast<std::int64_t>(query.limit))
        .bind(3, static_cast<std::int64_t>(query.offset));
    while (rows.step()) page.ids.push_back(rows.text(0));
  }
  {
    Stmt bad(d, fmt::format("SELECT id, problem FROM instances WHERE problem <> '' AND {} ORDER BY id", where));
    bad.bind(1, filter);
    while (bad.step()) page.corrupt.push_back({bad.text(0), "", 0, 0, bad.text(1)});
  }
  return page;
}

void Index::changed(const std::string& id, std::optional<std::int64_t> root_mtime_before) {
  std::unique_lock lock(mutex_);
  Db* d = nullptr;
  try {
    // A process that never listed has no index to keep (a CLI command, a Slurm node's
    // `ns-hpc bwrap`): the first listing builds it from the tree.
    if (!db_ && !stdfs::exists(file_)) return;
    d = &db();
  } catch (const Error& e) {
    log::debug("{}", e.what());
    return;
  }
  try {
    std::optional<std::string> stamp;
    {
      Stmt get(*d, "SELECT value FROM facts WHERE key='stamp'");
      if (get.step()) stamp = get.text(0);
    }
    Transaction tx(*d);
    if (auto entry = reader_(id))
      upsert(*d, *entry);
    else
      erase(*d, id);
    if (root_mtime_before && stamp && *stamp == std::to_string(*root_mtime_before))
      if (auto after = mtime_ns(root_)) {
        Stmt set(*d, "INSERT OR REPLACE INTO facts(key, value) VALUES('stamp', ?1)");
        set.bind(1, std::to_string(*after)).step();
      }
    tx.commit();
  } catch (const Error& e) {
    // The next listing reconciles (the stamp was not moved on).
    log::warn("{}", e.what());
  }
}

void Index::note_activity(const std::string& id, std::int64_t when_ns) {
  std::lock_guard lock(pending_mutex_);
  auto& slot = pending_[id];
  slot = std::max(slot, when_ns);
  // A process that lists (a server) writes batches from a thread of its own; a one-shot command
  // keeps its few notes for its exit (the destructor), and starts no thread.
  if (opened_.load(std::memory_order_acquire) && !flusher_.joinable())
    flusher_ = std::jthread([this](std::stop_token stop) { run_flusher(stop); });
}

void Index::run_flusher(std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::map<std::string, std::int64_t> batch;
    {
      std::unique_lock lock(pending_mutex_);
      pending_cv_.wait_for(lock, stop, flush_interval_, [] { return false; });
      batch.swap(pending_);
    }
    if (batch.empty()) continue;
    try {
      write_activity(std::move(batch));
    } catch (const std::exception& e) {
      log::debug("instance index: activity not written: {}", e.what());
    }
  }
}

void Index::flush() {
  std::map<std::string, std::int64_t> batch;
  {
    std::lock_guard lock(pending_mutex_);
    batch.swap(pending_);
  }
  if (!batch.empty()) write_activity(std::move(batch));
}

void Index::write_activity(std::map<std::string, std::int64_t> batch) {
  std::unique_lock lock(mutex_);
  if (!db_ && !stdfs::exists(file_)) return;  // built with fresh times at the first listing
  write_activity_locked(db(), batch);
}

void Index::write_activity_locked(Db& d, const std::map<std::string, std::int64_t>& batch) {
  Transaction tx(d);
  Stmt st(d, "UPDATE instances SET activity = max(activity, ?2) WHERE id = ?1");
  for (const auto& [id, when] : batch) {
    st.bind(1, id).bind(2, when).step();
    st.reset();
  }
  tx.commit();
}

}  // namespace nshpc::store
