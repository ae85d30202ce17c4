// SQLite, the way this program uses it (the store's listing index, WebDAV's dead properties): a
// connection, prepared statements finalized on scope exit, and IMMEDIATE transactions rolled
// back when left by an exception. Every failure is an Error naming what the database is for.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace nshpc::sqlite {

class Connection {
 public:
  // `what` names the database in messages ("instance index /var/lib/ns-hpc/index/….sqlite").
  explicit Connection(std::string what) : what_(std::move(what)) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // sqlite3_open_v2(file, flags) with a busy timeout; throws Error when it cannot be opened.
  void open(const std::string& file, int flags, int busy_timeout_ms = 5000);
  bool is_open() const { return handle_ != nullptr; }
  sqlite3* handle() const { return handle_; }
  const std::string& what() const { return what_; }

  // Runs SQL without results; throws Error with SQLite's message and the statement.
  void exec(std::string_view sql);
  [[noreturn]] void fail(std::string_view doing) const;

 private:
  std::string what_;
  sqlite3* handle_ = nullptr;
};

class Statement {
 public:
  Statement(Connection& db, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, std::string_view v);
  Statement& bind(int i, std::int64_t v);
  bool step();  // true: a row is there
  void reset();  // to run it again, bindings cleared
  std::string text(int col) const;
  std::int64_t integer(int col) const;

 private:
  Connection& db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// BEGIN IMMEDIATE … COMMIT; ROLLBACK when destroyed uncommitted.
class Transaction {
 public:
  explicit Transaction(Connection& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Connection& db_;
  bool done_ = false;
};

}  // namespace nshpc::sqlite
