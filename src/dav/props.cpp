// Dead properties in SQLite (see props.hpp).
#include "dav/props.hpp"

#include <sqlite3.h>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::dav {

struct PropStore::Db {
  sqlite3* handle = nullptr;
  std::string file;
  ~Db() {
    if (handle) ::sqlite3_close_v2(handle);
  }
  [[noreturn]] void fail(std::string_view what) const {
    throw Error(fmt::format("WebDAV property store {}: {}: {}", file, what, handle ? ::sqlite3_errmsg(handle) : "cannot open"));
  }
  void exec(const char* sql) {
    if (::sqlite3_exec(handle, sql, nullptr, nullptr, nullptr) != SQLITE_OK) fail(sql);
  }
};

namespace {

class Stmt {
 public:
  Stmt(PropStore::Db& db, const char* sql) : db_(db) {
    if (::sqlite3_prepare_v2(db.handle, sql, -1, &stmt_, nullptr) != SQLITE_OK) db.fail(sql);
  }
  ~Stmt() { ::sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt& bind(int i, std::string_view v) {
    ::sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  bool step() {
    const int rc = ::sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    db_.fail("step");
  }
  std::string text(int col) const {
    const unsigned char* t = ::sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<std::size_t>(::sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }

 private:
  PropStore::Db& db_;
  sqlite3_stmt* stmt_ = nullptr;
};

class Transaction {
 public:
  explicit Transaction(PropStore::Db& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!done_) ::sqlite3_exec(db_.handle, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    db_.exec("COMMIT");
    done_ = true;
  }

 private:
  PropStore::Db& db_;
  bool done_ = false;
};

// Paths under `path`: path/... sorts between "path/" and "path0" ('0' follows '/').
constexpr const char* kUnder = "(path = ?1 OR (path >= ?1 || '/' AND path < ?1 || '0'))";

}  // namespace

PropStore::PropStore(const std::filesystem::path& file) : db_(std::make_unique<Db>()) {
  db_->file = file.string();
  if (::sqlite3_open_v2(db_->file.c_str(), &db_->handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK)
    db_->fail("open");
  ::sqlite3_busy_timeout(db_->handle, 5000);
  db_->exec("PRAGMA journal_mode=WAL");
  db_->exec("PRAGMA synchronous=NORMAL");
  db_->exec("CREATE TABLE IF NOT EXISTS props (path TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL, "
            "lang TEXT NOT NULL DEFAULT '', value TEXT NOT NULL, PRIMARY KEY (path, ns, name))");
}

PropStore::~PropStore() = default;

std::vector<DeadProperty> PropStore::get(const std::string& path) {
  std::lock_guard lock(mutex_);
  Stmt s(*db_, "SELECT ns, name, value, lang FROM props WHERE path = ?1 ORDER BY ns, name");
  s.bind(1, path);
  std::vector<DeadProperty> out;
  while (s.step()) out.push_back({{s.text(0), s.text(1)}, s.text(2), s.text(3)});
  return out;
}

std::map<std::string, std::vector<DeadProperty>> PropStore::get_members(const std::string& path) {
  std::lock_guard lock(mutex_);
  Stmt s(*db_, "SELECT path, ns, name, value, lang FROM props WHERE path >= ?1 || '/' AND path < ?1 || '0'");
  s.bind(1, path);
  std::map<std::string, std::vector<DeadProperty>> out;
  while (s.step()) {
    std::string member = s.text(0);
    if (member.find('/', path.size() + 1) != std::string::npos) continue;  // deeper down
    out[std::move(member)].push_back({{s.text(1), s.text(2)}, s.text(3), s.text(4)});
  }
  return out;
}

void PropStore::apply(const std::string& path, const std::vector<PropChange>& changes) {
  std::lock_guard lock(mutex_);
  Transaction t(*db_);
  for (const PropChange& c : changes) {
    if (c.remove) {
      Stmt s(*db_, "DELETE FROM props WHERE path = ?1 AND ns = ?2 AND name = ?3");
      s.bind(1, path).bind(2, c.property.name.ns).bind(3, c.property.name.local).step();
    } else {
      Stmt s(*db_, "INSERT OR REPLACE INTO props (path, ns, name, lang, value) VALUES (?1, ?2, ?3, ?4, ?5)");
      s.bind(1, path).bind(2, c.property.name.ns).bind(3, c.property.name.local).bind(4, c.property.lang)
          .bind(5, c.property.value_xml).step();
    }
  }
  t.commit();
}

void PropStore::copy_tree(const std::string& from, const std::string& to) {
  std::lock_guard lock(mutex_);
  Transaction t(*db_);
  {
    Stmt del(*db_, fmt::format("DELETE FROM props WHERE {}", kUnder).c_str());
    del.bind(1, to).step();
  }
  Stmt s(*db_, fmt::format("INSERT OR REPLACE INTO props (path, ns, name, lang, value) SELECT ?2 || substr(path, length(?1) + 1), "
                           "ns, name, lang, value FROM props WHERE {}", kUnder).c_str());
  s.bind(1, from).bind(2, to).step();
  t.commit();
}

void PropStore::move_tree(const std::string& from, const std::string& to) {
  std::lock_guard lock(mutex_);
  Transaction t(*db_);
  {
    Stmt del(*db_, fmt::format("DELETE FROM props WHERE {}", kUnder).c_str());
    del.bind(1, to).step();
  }
  Stmt s(*db_, fmt::format("UPDATE props SET path = ?2 || substr(path, length(?1) + 1) WHERE {}", kUnder).c_str());
  s.bind(1, from).bind(2, to).step();
  t.commit();
}

void PropStore::remove_tree(const std::string& path) {
  std::lock_guard lock(mutex_);
  Stmt del(*db_, fmt::format("DELETE FROM props WHERE {}", kUnder).c_str());
  del.bind(1, path).step();
}

}  // namespace nshpc::dav
