// Internal: one interface for everything that differs between PostgreSQL, MySQL and SQLite.
// Nothing outside src/dialect/ branches on the backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dblock/optimistic.hpp"

namespace soci {
class session;
class statement;
class row;
class backend_factory;
}  // namespace soci

namespace dblock::detail {

struct parsed_url;

/// Table names after applying the validated prefix (already safe to splice; quoted by dialect).
struct table_names {
  std::string prefix;
  std::string lock;        // <prefix>resource_lock
  std::string floor;       // <prefix>resource_lock_fence_floor
  std::string migrations;  // <prefix>dblock_schema_migrations
  std::string audit;       // <prefix>resource_lock_audit
};

/// One migration file, as embedded at build time.
struct migration_file {
  int version;
  std::string name;  // file name, e.g. "0001_resource_lock.sql"
  std::string text;  // raw file text (checksummed before substitution)
};

/// What an acquire statement is given.
struct acquire_params {
  std::string name;
  std::string owner_token;  // 32 hex chars
  std::int64_t ttl_us;
  std::string holder_host;
  std::int64_t holder_pid;
  std::string holder_thread;
};

/// State dblock keeps beside one pooled SOCI session for the life of its connection (prepared
/// statements of the lease hot path). Destroyed before the session closes or reconnects.
struct connection_state {
  virtual ~connection_state() = default;
  /// The server session behind the connection (PostgreSQL backend pid, MySQL connection id;
  /// 0: none, as on SQLite) and what tells it apart from a later session that reuses the id
  /// (PostgreSQL: backend start in µs; MySQL: the client address as the server sees it).
  std::int64_t session_id = 0;
  std::string session_tag;
};

/// A server session, as recorded when its connection was opened.
struct session_ref {
  std::int64_t id = 0;  ///< 0: no server session (SQLite)
  std::string tag;
};

/// The server session of a pooled connection (no round trip; empty for a session without state).
session_ref session_of(soci::session&) noexcept;

/// The state attached to a session by the pool, or nullptr (a session dblock did not open).
connection_state* state_of(soci::session&) noexcept;
/// Attaches `state` to a session, destroying the previous one (nullptr: detach only).
void attach_state(soci::session&, std::unique_ptr<connection_state> state);

/**
 * The SQL text of the lease statements, with named parameters (`:name`). The library's hot path
 * and the benchmark's raw-client floor both run exactly these texts.
 */
struct lease_statements {
  /// Parameters name, token, ttl (µs), host, pid, thread. Yields the fence when acquired
  /// (RETURNING; MySQL: LAST_INSERT_ID() from the OK packet, 0 when held by another owner).
  std::string acquire;
  /// Parameters name, token, fence. One row affected when a hold was released.
  std::string release;
  /// Parameters ttl (µs), name, token, fence. One row affected when renewed.
  std::string renew;
  /// True when each statement must run inside BEGIN IMMEDIATE ... COMMIT (SQLite).
  bool write_transaction = false;
};

/// Prepares `st` (its use/into elements exchanged already) for a single execution. SOCI's
/// repeatable statements cost PostgreSQL a PREPARE and a DEALLOCATE round trip each; a one-time
/// statement is one round trip (PQexecParams).
void prepare_once(soci::statement& st, const std::string& text);

/// Replaces named parameters (`:name`) by PostgreSQL's positional ones ($1, $2, ...) in the order
/// of `params` (a name may occur several times). `::` casts are left alone.
std::string to_positional(const std::string& sql, const std::vector<std::string>& params);

/// A lease row as read back.
struct lease_row {
  std::string name;
  std::string owner_token;
  std::int64_t fence = 0;
  int hold_count = 0;
  std::int64_t acquired_at_us = 0;  // database clock, microseconds since the epoch
  std::int64_t expires_at_us = 0;
  std::int64_t now_us = 0;  // database clock when read
  std::string holder_host;
  std::int64_t holder_pid = 0;
  std::string holder_thread;
};

class dialect {
 public:
  virtual ~dialect() = default;

  /// "postgresql", "mysql" or "sqlite".
  virtual const char* name() const noexcept = 0;
  /// SOCI backend factory.
  virtual const soci::backend_factory& factory() const = 0;
  /// SOCI connection string for a parsed URL (validates backend-specific query keys).
  virtual std::string connect_string(const parsed_url& url, const database_options& o) const = 0;
  /// Lets URL parameters override options (for example SQLite's busy_timeout).
  virtual void adjust_options(const parsed_url&, database_options&) const {}
  /// Session set-up right after connecting (pragmas, session variables, clock function).
  virtual void on_connect(soci::session&, const database_options&) const {}
  /// Per-connection state for a freshly opened session (nothing by default).
  virtual std::unique_ptr<connection_state> make_connection_state(soci::session&) const {
    return std::make_unique<connection_state>();
  }
  /// Records the server session of a freshly opened connection in its state (one round trip
  /// on the servers, none on SQLite).
  virtual void identify_session(soci::session&, connection_state&) const {}
  /**
   * From another connection: ends server session `s` if it still runs and waits until it is
   * gone, so that a statement it was still executing (its client's connection broke while the
   * server worked on it) can no longer take effect. Returns false when that could not be
   * established within `timeout` (no permission, the server unreachable). A session id reused
   * by someone else's later session is never touched (the tag must match).
   */
  virtual bool end_session(soci::session&, const session_ref& s,
                           std::chrono::milliseconds timeout) const {
    (void)s;
    (void)timeout;
    return true;
  }

  /// Statement setting the session's isolation level; empty when the backend has no choice.
  virtual std::string isolation_sql(isolation_level level) const;

  /// Condition "column matches the bound pattern :param" for name patterns (case-sensitive).
  virtual std::string name_pattern_sql(const std::string& column, const std::string& param) const {
    return column + " LIKE :" + param + " ESCAPE '!'";
  }
  /// Turns a shell-style pattern (`*`, `?`) into the value bound for name_pattern_sql().
  virtual std::string name_pattern_value(const std::string& glob) const;

  /// Select-list expression reading a user column as a dblock::value, aliased to its name
  /// (default: the quoted column; SQLite: a tagged text form, see sqlite.cpp).
  virtual std::string select_value_sql(const std::string& column) const { return quote(column); }
  /// Reads column `i` of a row selected with select_value_sql() as a dblock::value.
  virtual value decode_value(const soci::row& r, std::size_t i) const;

  /// Quotes an already validated identifier.
  virtual std::string quote(std::string_view ident) const;

  // ---- clock -------------------------------------------------------------------------------
  /// SQL expression for "now" on the database clock, in the type of the timestamp columns.
  virtual std::string now_sql() const = 0;
  /// SQL expression `ts + micros` where micros is a bound parameter named `param`.
  virtual std::string plus_us_sql(const std::string& ts, const std::string& param) const = 0;
  /// SQL expression converting a timestamp expression to integer microseconds since the epoch.
  virtual std::string epoch_us_sql(const std::string& ts) const = 0;

  // ---- transactions and locking ------------------------------------------------------------
  /// Starts a transaction that will write (SQLite: BEGIN IMMEDIATE).
  virtual std::string begin_write_sql() const { return "BEGIN"; }
  /// Sets how long the next lock waits in this session (PostgreSQL lock_timeout, MySQL
  /// innodb_lock_wait_timeout, SQLite busy_timeout).
  virtual void set_lock_timeout(soci::session&, std::chrono::milliseconds) const = 0;
  /// Suffix for a row-locking SELECT (SQLite: none; its write transaction already excludes).
  virtual std::string for_update_sql() const { return " FOR UPDATE"; }
  /// Suffix for a row-locking SELECT that fails at once when the row is locked.
  virtual std::string for_update_nowait_sql() const { return " FOR UPDATE NOWAIT"; }
  /// Suffix for a row-locking SELECT that skips locked rows.
  virtual std::string for_update_skip_locked_sql() const { return " FOR UPDATE SKIP LOCKED"; }

  /// Begins a transaction whose lock waits last at most `lock_timeout` (zero: do not wait).
  virtual void begin_transaction(soci::session&, std::chrono::milliseconds lock_timeout) const;
  /// Undoes per-transaction session settings after COMMIT or ROLLBACK.
  virtual void end_transaction(soci::session&, const database_options&) const {}
  /// True when the lock row of `name` exists (a non-locking read).
  bool lock_row_exists(soci::session&, const table_names&, const std::string& name) const;
  /// Suffix making an INSERT of an existing key a no-op.
  virtual std::string insert_if_absent_suffix() const {
    return " ON CONFLICT (resource_name) DO NOTHING";
  }
  /// Inserts the lock row of `name` unless it exists, inside the caller's open transaction
  /// (race-safe on the unique index; never changes an existing row).
  virtual void insert_lock_row(soci::session&, const table_names&, const std::string& name) const;
  /// Outside any transaction: creates the lock row of `name` when absent, waiting at most
  /// `lock_timeout` for a concurrent writer (settings changed here are undone by
  /// end_transaction()). A plain read first, so an existing row locked by its holder is never
  /// waited for.
  virtual void ensure_lock_row(soci::session&, const table_names&, const std::string& name,
                               std::chrono::milliseconds lock_timeout) const;
  /// True when the session has a transaction open (checked locally, no round trip).
  virtual bool in_transaction(soci::session&) const { return false; }
  /// True when the open transaction has failed and can only roll back (PostgreSQL answers
  /// COMMIT of such a transaction with ROLLBACK, silently).
  virtual bool transaction_failed(soci::session&) const { return false; }
  /// True when `column` of `table` has a unique index on exactly that one column (or is the
  /// whole primary key), so that a lookup by it touches at most one row.
  virtual bool has_unique_index(soci::session&, const std::string& table,
                                const std::string& column) const = 0;

  // ---- errors --------------------------------------------------------------------------------
  /// Classifies the exception currently being handled (call from a catch block) into a
  /// dblock::error; `what` says which operation failed (it prefixes the message).
  virtual error classify_current(const std::string& what) const = 0;

  // ---- migrations ----------------------------------------------------------------------------
  /// Serialises migrators across processes (session-level lock held until unlock).
  virtual void lock_migrations(soci::session&, const std::string& key) const = 0;
  virtual void unlock_migrations(soci::session&, const std::string& key) const = 0;
  /// True when the table exists in the connected database.
  virtual bool table_exists(soci::session&, const std::string& table) const = 0;
  /// Embedded migration files of this backend, in version order, plus the bootstrap file.
  virtual const std::vector<migration_file>& migrations() const = 0;
  virtual const migration_file& bootstrap() const = 0;

  // ---- lease lock ----------------------------------------------------------------------------
  /// The lease statements of this backend for the given tables.
  virtual lease_statements lease_sql(const table_names&) const = 0;
  /**
   * One atomic statement: takes the row when absent, expired, released, or already ours (then
   * increments hold_count and extends the lease without changing the fence). Returns the fence
   * when acquired, nothing when another owner holds an unexpired lease.
   */
  virtual std::optional<std::int64_t> lease_acquire(soci::session&, const table_names&,
                                                    const acquire_params&) const = 0;
  /// Extends an unexpired lease owned by `token`; false when it is no longer ours or expired.
  virtual bool lease_renew(soci::session&, const table_names&, const std::string& name,
                           const std::string& token, std::int64_t fence, std::int64_t ttl_us) const;
  /// Decrements the hold count of an unexpired lease owned by `token` (at zero the lease is
  /// free); false when it is no longer ours or has expired.
  virtual bool lease_release(soci::session&, const table_names&, const std::string& name,
                             const std::string& token, std::int64_t fence) const;
  /// Runs `body` (single-statement writes) so that it cannot fail half-way on a stale snapshot:
  /// a no-op by default; SQLite wraps it in BEGIN IMMEDIATE ... COMMIT.
  virtual void atomic_write(soci::session&, const std::function<void()>& body) const;
  /// Renew and release texts shared by every backend (acquire is left empty).
  lease_statements common_lease_sql(const table_names&) const;
  /// Reads a lease row (and the database clock); nothing when the row does not exist.
  virtual std::optional<lease_row> lease_read(soci::session&, const table_names&,
                                              const std::string& name) const;
};

/// Embedded migration files of one backend directory ("postgresql", "mysql", "sqlite").
std::vector<migration_file> load_migrations(const std::string& backend);
/// The embedded bootstrap file (the migrations bookkeeping table) of one backend.
migration_file load_bootstrap(const std::string& backend);

const dialect& postgresql_dialect_instance();
const dialect& mysql_dialect_instance();
const dialect& sqlite_dialect_instance();

/// The dialect for a URL scheme; throws errc::invalid_argument for an unknown scheme.
const dialect& dialect_for_scheme(const std::string& scheme);

/// Builds the names of dblock's tables for a prefix (validated here).
table_names make_table_names(const std::string& prefix);

/// Replaces "{{prefix}}" in migration text.
std::string apply_prefix(const std::string& sql, const std::string& prefix);

/// Splits a migration file into statements (a statement ends with ';' at the end of a line).
std::vector<std::string> split_statements(const std::string& sql);

}  // namespace dblock::detail
