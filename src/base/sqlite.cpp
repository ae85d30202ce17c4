#include "base/sqlite.hpp"

#include <sqlite3.h>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::sqlite {

Connection::~Connection() {
  if (handle_) ::sqlite3_close_v2(handle_);
}

void Connection::open(const std::string& file, int flags, int busy_timeout_ms) {
  if (handle_) {
    ::sqlite3_close_v2(handle_);
    handle_ = nullptr;
  }
  if (::sqlite3_open_v2(file.c_str(), &handle_, flags, nullptr) != SQLITE_OK) {
    const std::string why = handle_ ? ::sqlite3_errmsg(handle_) : "out of memory";
    if (handle_) ::sqlite3_close_v2(handle_);
    handle_ = nullptr;
    throw Error(fmt::format("{}: cannot open {}: {}", what_, file, why));
  }
  ::sqlite3_busy_timeout(handle_, busy_timeout_ms);
}

void Connection::fail(std::string_view doing) const {
  throw Error(fmt::format("{}: {}: {}", what_, doing, handle_ ? ::sqlite3_errmsg(handle_) : "not open"));
}

void Connection::exec(std::string_view sql) {
  const std::string statement(sql);
  char* err = nullptr;
  if (::sqlite3_exec(handle_, statement.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : "failed";
    ::sqlite3_free(err);
    throw Error(fmt::format("{}: {} ({})", what_, msg, statement));
  }
}

Statement::Statement(Connection& db, std::string_view sql) : db_(db) {
  if (::sqlite3_prepare_v2(db.handle(), sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr) != SQLITE_OK)
    throw Error(fmt::format("{}: {} ({})", db.what(), ::sqlite3_errmsg(db.handle()), sql));
}

Statement::~Statement() { ::sqlite3_finalize(stmt_); }

Statement& Statement::bind(int i, std::string_view v) {
  ::sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

Statement& Statement::bind(int i, std::int64_t v) {
  ::sqlite3_bind_int64(stmt_, i, v);
  return *this;
}

bool Statement::step() {
  const int rc = ::sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  db_.fail("step");
}

void Statement::reset() {
  ::sqlite3_reset(stmt_);
  ::sqlite3_clear_bindings(stmt_);
}

std::string Statement::text(int col) const {
  const unsigned char* t = ::sqlite3_column_text(stmt_, col);
  return t ? std::string(reinterpret_cast<const char*>(t), static_cast<std::size_t>(::sqlite3_column_bytes(stmt_, col)))
           : std::string();
}

std::int64_t Statement::integer(int col) const { return ::sqlite3_column_int64(stmt_, col); }

Transaction::Transaction(Connection& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }

Transaction::~Transaction() {
  if (!done_) ::sqlite3_exec(db_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  db_.exec("COMMIT");
  done_ = true;
}

}  // namespace nshpc::sqlite
