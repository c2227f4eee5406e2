// Internal: SQLite's roles (see dialect.hpp). One writer at a time per database file. The clock
// is the calling process's (dblock_now_us(), registered on each connection, microsecond
// precision), timestamps are INTEGER microseconds since the epoch, writes run in BEGIN IMMEDIATE
// so that they wait on the busy timeout instead of failing on a stale WAL snapshot. dblock's
// statements (and BEGIN IMMEDIATE / COMMIT) are prepared once per connection and reused.
#pragma once

#include <soci/soci.h>
#include <soci/sqlite3/soci-sqlite3.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>

#include "dialect/dialect.hpp"

namespace dblock::detail::lite {

// SOCI includes sqlite3.h inside namespace sqlite_api.
using namespace sqlite_api;

inline sqlite3* raw(soci::session& sql) {
  return static_cast<soci::sqlite3_session_backend*>(sql.get_backend())->conn_;
}

/// Throws what SOCI would throw, so the classifier treats both paths alike.
[[noreturn]] void fail(sqlite3* db, int rc);

/// Per connection: statements prepared on it, by cache key.
struct state final : connection_state {
  sqlite3* db;
  // A cache: filled also through a const state (connector::begin() and commit() see one).
  mutable std::map<std::string, sqlite3_stmt*> stmts;
  mutable std::size_t caller_stmts = 0;  // of those, caller statements (statement::caller)
  bool own_write = false;                // begin_statement() opened the write transaction
  int synchronous = 2;                   // the connection's own PRAGMA synchronous (2: FULL)
  bool relaxed = false;                  // lowered to NORMAL for a release's commit
  bool wal = false;                      // journal_mode is WAL
  /// How long a statement waits for another writer (the busy handler, busy_wait()): the lock
  /// timeout of the write, else database_options::sqlite_busy_timeout.
  mutable long long busy_ms = 5000;
  mutable std::chrono::steady_clock::time_point busy_since{};
  /// Set when the call's deadline cut the connection off: a busy wait ends at once.
  mutable std::atomic<bool> cut{false};
  explicit state(sqlite3* d) : db(d) {}
  ~state() override;
  /// The cached statement for `key`, prepared from `text` on first use.
  sqlite3_stmt* get(const std::string& key, const std::string& text) const;
  /// Steps a cached statement without results (BEGIN IMMEDIATE, COMMIT, ROLLBACK).
  void exec(const std::string& key, const char* text) const;
};

class connector final : public detail::connector {
 public:
  std::unique_ptr<interrupter> interrupter_for(soci::session&,
                                               const connection_state&) const override;
  const soci::backend_factory& factory() const override { return *soci::factory_sqlite3(); }
  std::string connect_string(const parsed_url& u, const database_options& o) const override;
  void adjust_options(const parsed_url& u, database_options& o) const override;
  std::shared_ptr<void> keep_open(const std::vector<std::string>& connect_strings) const override;
  std::unique_ptr<connection_state> on_connect(soci::session&,
                                               const database_options&) const override;
  /// One writer at a time: every transaction is serializable.
  std::string isolation_sql(isolation_level) const override { return {}; }
  bool end_session(soci::session&, const session_ref&, std::chrono::milliseconds) const override {
    return true;  // no server: nothing outlives a connection
  }
  void commit(soci::session&, const connection_state& st) const override;
  void begin(soci::session&, const connection_state&, const database_options&,
             std::optional<std::chrono::milliseconds> lock_timeout) const override;
  void set_lock_timeout(soci::session&, const connection_state&,
                        std::chrono::milliseconds) const override;
  void end_transaction(soci::session&, const connection_state& st,
                       const database_options&) const override;
  bool in_transaction(soci::session&) const override;
  bool has_unique_index(soci::session&, const std::string& table,
                        const std::string& column) const override;
  bool table_exists(soci::session&, const std::string& table) const override;
  // Every migration runs in BEGIN IMMEDIATE, which already excludes other writers.
  void lock_migrations(soci::session&, const connection_state&, const std::string&) const override {
  }
  void unlock_migrations(soci::session&, const std::string&) const override {}
};

/// Wake-ups through a doorbell directory beside the database file (doorbell.cpp).
class doorbell final : public detail::doorbell {
 public:
  std::string target(const parsed_url& u, const database_options& o) const override;
  std::unique_ptr<bell_channel> open(const std::string& target, const table_names& t,
                                     bell_callbacks cb) const override;
  bool rings_head(const std::string& target) const override;
  void ring(const std::string& target, const std::string& name, std::int64_t fence,
            const std::string& head, const std::string& head_bell) const override;
  /// The doorbell directories are open to every user of the database file (mode 0777).
  bool private_rings() const override { return false; }
};

class classifier final : public detail::classifier {
 public:
  error classify_current(const std::string& what) const override;
};

class vocabulary final : public detail::vocabulary {
 public:
  capabilities can() const override {
    capabilities c;
    c.ring = release_ring::doorbell;
    c.hand_over = handover::two_statements;
    c.exit = queue_exit::same_transaction;
    return c;
  }
  fence_check check_fence_native(const table_names& t) const override;
  std::string no_fast_leases() const override {
    return "SQLite sets durability per connection: add ?synchronous=normal to the URL (a power "
           "loss, not a process crash, may then undo the last grants; see docs/fast-leases.md)";
  }
  // SQLite's LIKE ignores ASCII case; GLOB compares exactly and speaks `*` and `?` already.
  std::string name_pattern(const std::string& column, const std::string& param) const override {
    return column + " GLOB :" + param;
  }
  std::string name_pattern_value(const std::string& glob) const override;
  std::string select_value(const std::string& column) const override;
  value decode_value(const soci::row& r, std::size_t i) const override;
  std::optional<value> decode_text(const std::optional<std::string>& cell,
                                   soci::data_type t) const override;
  std::string now() const override { return "dblock_now_us()"; }
  // Microseconds since the epoch from SQLite's own clock (millisecond precision).
  std::string client_now() const override {
    return "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
  }
  std::string plus_us(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + :" + param + ")";
  }
  std::string epoch_us(const std::string& ts) const override { return ts; }
  std::string begin_write() const override { return "BEGIN IMMEDIATE"; }
  std::string for_update() const override { return ""; }
  std::string for_update_nowait() const override { return ""; }
  std::string for_update_skip_locked() const override { return ""; }
  std::string lease_acquire(const table_names& t, bool in_queue_order) const override;
  std::string lease_grant_take(const table_names& t) const override;
  std::string lease_grant_give(const table_names& t) const override;
  std::string id_reserve(const table_names& t) const override;
};

class executor final : public detail::executor {
 public:
  sql_result run(exec_session&, const statement& st,
                 const std::vector<sql_param>& values) const override;
  void begin_statement(exec_session&, bool no_flush_wait) const override;
  void commit_statement(exec_session&) const override;
  void rollback_statement(exec_session&) const noexcept override;
  bool statement_in_transaction() const override { return true; }
};

}  // namespace dblock::detail::lite
