// Dead properties in SQLite (see props.hpp).
#include "dav/props.hpp"

#include <sqlite3.h>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/sqlite.hpp"

namespace nshpc::dav {

struct PropStore::Db : sqlite::Connection {
  explicit Db(const std::string& file) : Connection(fmt::format("WebDAV property store {}", file)) {}
};

namespace {

using Stmt = sqlite::Statement;
using sqlite::Transaction;

// Paths under `path`: path/... sorts between "path/" and "path0" ('0' follows '/').
constexpr const char* kUnder = "(path = ?1 OR (path >= ?1 || '/' AND path < ?1 || '0'))";

}  // namespace

PropStore::PropStore(const std::filesystem::path& file) : db_(std::make_unique<Db>(file.string())) {
  db_->open(file.string(), SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX);
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
