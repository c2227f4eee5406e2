// Internal: PostgreSQL's roles (see dialect.hpp). clock_timestamp() as the clock, INSERT ... ON
// CONFLICT ... RETURNING for acquire, SQLSTATE-based classification, statements prepared once per
// connection with libpq (PQprepare / PQexecPrepared: one round trip each, no re-parse).
#pragma once

#include <libpq-fe.h>
#include <soci/postgresql/soci-postgresql.h>
#include <soci/soci.h>

#include <map>
#include <set>
#include <string>

#include "../dialect.hpp"

namespace dblock::detail::pg {

/// Per connection: the statements prepared on it.
struct state final : connection_state {
  std::set<std::string> prepared;
  /// Caller statements (statement::caller): text -> the name it is prepared under.
  std::map<std::string, std::string> caller_names;
  /// Behind a transaction pooler: the server refused to create dblock's temporary routines (no
  /// TEMP privilege); routine statements run as unnamed statements.
  bool routines_refused = false;
};

inline PGconn* raw(soci::session& sql) {
  return static_cast<soci::postgresql_session_backend*>(sql.get_backend())->conn_;
}

/// Throws what SOCI would throw for failed result `r` (or for the connection's error when `r`
/// is null), so that the classifier treats libpq and SOCI paths alike; clears `r`.
[[noreturn]] void fail(PGconn* c, PGresult* r);
/// Runs a command without parameters or rows through libpq (no SOCI statement object); throws
/// as fail().
void command(PGconn* c, const std::string& sql);

class connector final : public detail::connector {
 public:
  const soci::backend_factory& factory() const override { return *soci::factory_postgresql(); }
  void adjust_options(const parsed_url& u, database_options& o) const override;
  bool accepts_pooler() const override { return true; }
  std::string connect_string(const parsed_url& u, const database_options& o) const override;
  std::unique_ptr<connection_state> on_connect(soci::session&,
                                               const database_options&) const override;
  std::string isolation_sql(isolation_level level) const override;
  bool end_session(soci::session&, const session_ref& s,
                   std::chrono::milliseconds timeout) const override;
  void begin(soci::session&, const connection_state& st, const database_options& o,
             std::optional<std::chrono::milliseconds> lock_timeout) const override;
  void commit(soci::session&, const connection_state& st) const override;
  void set_lock_timeout(soci::session&, const connection_state&,
                        std::chrono::milliseconds) const override;
  // ON CONFLICT DO NOTHING never waits for a holder of the existing row (and a session-level
  // lock_timeout would outlive the call).
  bool insert_if_absent_waits() const override { return false; }
  bool in_transaction(soci::session&) const override;
  bool transaction_failed(soci::session&) const override;
  bool has_unique_index(soci::session&, const std::string& table,
                        const std::string& column) const override;
  bool table_exists(soci::session&, const std::string& table) const override;
  void lock_migrations(soci::session&, const connection_state& st,
                       const std::string& key) const override;
  bool session_migration_lock(const connection_state& st) const override {
    return !st.transaction_pooler;
  }
  void lock_migrations_in_transaction(soci::session&, const std::string& key) const override;
  void unlock_migrations(soci::session&, const std::string& key) const override;
};

/// LISTEN/NOTIFY wake-ups while a handle has waiters (doorbell.cpp).
class doorbell final : public detail::doorbell {
 public:
  std::string target(const parsed_url& u, const database_options& o) const override;
  std::unique_ptr<bell_channel> open(const std::string& target, const table_names& t,
                                     bell_callbacks cb) const override;
};

class classifier final : public detail::classifier {
 public:
  error classify_current(const std::string& what) const override;
};

class vocabulary final : public detail::vocabulary {
 public:
  std::string now() const override { return "clock_timestamp()"; }
  std::string plus_us(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + CAST(:" + param + " AS DOUBLE PRECISION) * INTERVAL '1 microsecond')";
  }
  std::string epoch_us(const std::string& ts) const override {
    return "CAST(floor(extract(epoch FROM " + ts + ") * 1000000) AS BIGINT)";
  }
  std::string lease_acquire(const table_names& t, bool in_queue_order) const override;
  std::string lease_acquire_dequeue(const table_names& t, bool in_queue_order) const override;
  std::string id_reserve(const table_names& t) const override;
  std::string release_returning(const table_names& t, bool forced) const override;
  std::string lock_table_durable() const override {
    return "SELECT CASE WHEN c.relpersistence = 'u' THEN 0 ELSE 1 END FROM pg_catalog.pg_class c"
           " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
           " WHERE n.nspname = current_schema() AND c.relname = :table";
  }
  std::string set_lock_table_durability(const table_names& t, bool fast) const override {
    return "ALTER TABLE " + t.lock + (fast ? " SET UNLOGGED" : " SET LOGGED");
  }
  // remote_apply: with a synchronous standby, the epoch is on it before any fence of the epoch
  // is granted; without one it is a local flush.
  std::string durable_commit() const override {
    return "SET LOCAL synchronous_commit = remote_apply";
  }
  bool reap_in_key_order() const override { return true; }
};

/// Behind a transaction-mode pooler, a statement::routine statement runs as a PL/pgSQL routine
/// in the server session's temporary schema (see executor.cpp).
struct routine {
  std::string create;         ///< CREATE OR REPLACE FUNCTION pg_temp.dblock_<key>_<hash>(...)
  std::string call;           ///< a simple query calling it, the values as typed literals
  bool returns_rows = false;  ///< rows of one BIGINT; otherwise one row: the rows affected
};
/// The routine of `positional` (the statement with $n parameters) for these values' types.
routine make_routine(PGconn* c, const std::string& key, const std::string& positional,
                     const std::vector<sql_param>& values);
/// True when a routine's call failed because the routine is missing on this server session
/// (nothing ran): run `create` and `call` together in one simple query.
bool routine_missing(PGresult* r);

class executor final : public detail::executor {
 public:
  sql_result run(session_scope&, const statement& st,
                 const std::vector<sql_param>& values) const override;

 private:
  sql_result run_routine(PGconn* c, state& cs, const statement& st,
                         const std::vector<sql_param>& values,
                         const std::vector<const char*>& ptrs) const;
};

}  // namespace dblock::detail::pg
