// Internal: everything that differs between PostgreSQL, MySQL and SQLite, split by role:
//   connector   connection and session set-up and control (connect string, pragmas, lock
//               timeouts, transaction state, ending a server session, catalog look-ups);
//   classifier  native errors -> dblock::error;
//   vocabulary  SQL text fragments (clock, quoting, FOR UPDATE forms, upserts);
//   doorbell    wake-ups of waiters across processes (LISTEN/NOTIFY, a doorbell directory);
//   executor    running a statement with bound values: prepared once per connection where the
//               backend can (PostgreSQL PQprepare, SQLite cached sqlite3_stmt), one text round
//               trip on MySQL (as its own client library does).
// Each backend implements them in src/dialect/<backend>/; nothing outside branches on the backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dblock/listener.hpp"
#include "dblock/value.hpp"
#include "dialect/capabilities.hpp"
#include "dialect/connection_state.hpp"
#include "dialect/doorbell.hpp"
#include "dialect/interrupter.hpp"

#include <soci/soci-backend.h>  // soci::data_type

namespace soci {
class session;
class row;
class backend_factory;
}  // namespace soci

namespace dblock::detail {

struct parsed_url;

/// Table names after applying the validated prefix (already safe to splice).
struct table_names {
  std::string prefix;
  std::string lock;        // <prefix>resource_lock
  std::string floor;       // <prefix>resource_lock_fence_floor
  std::string migrations;  // <prefix>dblock_schema_migrations
  std::string audit;       // <prefix>resource_lock_audit
  std::string stock;       // <prefix>stock_segment
  std::string ids;         // <prefix>id_block
  std::string waiters;     // <prefix>lock_waiter
  std::string semaphores;  // <prefix>semaphore
  std::string leaders;     // <prefix>leader
  std::string runs;        // <prefix>job_run
};

/// One migration file, as embedded at build time.
struct migration_file {
  int version;
  std::string name;  // file name, e.g. "0001_resource_lock.sql"
  std::string text;  // raw file text (checksummed before substitution)
  /// Named NNNN_x.mysql.sql: the MySQL flavor's file of that version, in place of the shared
  /// NNNN_x.sql (which then is the other flavor's); see migrations_for().
  std::optional<flavor> only;
};

// ---- statements ---------------------------------------------------------------------------

/// A bound value of dblock's own statements.
using sql_param = std::variant<long long, std::string>;

/**
 * A statement on dblock's tables: SQL text with named parameters (`:name`), the parameter names
 * in the order values are passed, and a cache key (empty: run once, never prepared).
 */
struct statement {
  std::string key;
  std::string text;
  std::vector<std::string> params;
  /// Run very often, alone, outside any transaction, and returns either nothing (the caller
  /// reads the rows affected) or one BIGINT column: a backend may run it through a routine kept
  /// on the server (PostgreSQL behind a transaction-mode pooler, where it cannot be prepared).
  bool routine = false;
  /// SQL text from dblock's caller (compare_and_set()): cached per connection by its text (the
  /// key only says "cache it"), at most caller_statement_cache statements per connection; past
  /// that, run uncached.
  bool caller = false;
};

/// How many caller statements (statement::caller) one connection keeps prepared.
constexpr std::size_t caller_statement_cache = 64;

/// What a statement returned: rows as text (NULL as nothing), rows affected (matched rows on
/// every backend) and MySQL's LAST_INSERT_ID() from the OK packet.
struct sql_result {
  std::vector<std::vector<std::optional<std::string>>> rows;
  long long affected = 0;
  long long insert_id = 0;

  bool empty() const noexcept { return rows.empty(); }
  bool is_null(std::size_t row, std::size_t col) const { return !rows.at(row).at(col); }
  long long integer(std::size_t row, std::size_t col) const;
  const std::string& text(std::size_t row, std::size_t col) const;
};

/// Replaces named parameters (`:name`) by PostgreSQL's positional ones ($1, $2, ...) in the
/// order of `params` (a name may occur several times). `::` casts and quoted literals are left
/// alone.
std::string to_positional(const std::string& sql, const std::vector<std::string>& params);

/// Calls `on_param(name)` for each named parameter of `sql` and `on_text(chunk)` for the text
/// between them (quoted literals and `::` casts are text).
template <class Text, class Param>
void scan_parameters(const std::string& sql, Text&& on_text, Param&& on_param);

// ---- roles --------------------------------------------------------------------------------

/// Connection and session set-up and control.
class connector {
 public:
  virtual ~connector() = default;
  /// SOCI backend factory.
  virtual const soci::backend_factory& factory() const = 0;
  /// SOCI connection string for a parsed URL (validates backend-specific query keys).
  virtual std::string connect_string(const parsed_url& url, const database_options& o) const = 0;
  /// The connection strings to try, in order, when opening a connection: one per host for a
  /// multi-host URL whose client library takes one host (MySQL), else one (libpq takes the
  /// whole host list itself).
  virtual std::vector<std::string> connect_strings(const parsed_url& url,
                                                   const database_options& o) const {
    return {connect_string(url, o)};
  }
  /// `connect_string` with its connect timeout lowered to at most `left` (a connection opened
  /// inside a call with a deadline); the client libraries count it in whole seconds.
  virtual std::string bounded_connect(const std::string& connect_string,
                                      std::chrono::milliseconds /*left*/) const {
    return connect_string;
  }
  /// What stops a statement that outlives its deadline on this connection (storage/deadline.hpp):
  /// a cancel from another connection, then the socket cut.
  virtual std::unique_ptr<interrupter> interrupter_for(soci::session&,
                                                       const connection_state&) const = 0;
  /// What keeps the database of `connect_strings` alive while the dblock::database lives, when
  /// it would vanish with its last connection (SQLite's in-memory database); else nothing.
  virtual std::shared_ptr<void> keep_open(
      const std::vector<std::string>& /*connect_strings*/) const {
    return nullptr;
  }
  /// Lets URL parameters override options (for example SQLite's busy_timeout).
  virtual void adjust_options(const parsed_url&, database_options&) const {}
  /// Session set-up right after connecting; returns the connection's state, with its server
  /// session identified (one round trip on the servers, none on SQLite).
  virtual std::unique_ptr<connection_state> on_connect(soci::session&,
                                                       const database_options&) const = 0;
  /// Statement setting the session's isolation level; empty when the backend has no choice.
  virtual std::string isolation_sql(isolation_level level) const;
  /**
   * From another connection: ends server session `s` if it still runs and waits until it is
   * gone, so that a statement it was still executing can no longer take effect. False when that
   * could not be established within `timeout`. A reused id is never touched (the tag must match).
   */
  virtual bool end_session(soci::session&, const session_ref& s,
                           std::chrono::milliseconds timeout) const = 0;

  /// Begins a write transaction whose lock waits last at most `lock_timeout` (zero: do not
  /// wait; none: the session's default). `st`: the connection's state; `o`: the options.
  virtual void begin(soci::session&, const connection_state& st, const database_options& o,
                     std::optional<std::chrono::milliseconds> lock_timeout) const;
  /// Commits the write transaction begin() began.
  virtual void commit(soci::session&, const connection_state& st) const;
  /// Sets how long lock waits last in this session until end_transaction() (outside a
  /// transaction: for the next statements). `st` is the connection's state.
  virtual void set_lock_timeout(soci::session&, const connection_state& st,
                                std::chrono::milliseconds) const = 0;
  /// Undoes per-transaction session settings after COMMIT or ROLLBACK.
  virtual void end_transaction(soci::session&, const connection_state&,
                               const database_options&) const {}
  /// Gives the session its default settings back before database::connect() hands it out.
  virtual void to_session_defaults(soci::session&, const connection_state&) const {}
  /// True (once) when the server answered the last COMMIT with success only because the
  /// deadline's cancel ended its wait for a synchronous standby: committed locally, maybe not
  /// replicated (PostgreSQL's warning). False where that cannot happen.
  virtual bool commit_unreplicated(connection_state&) const { return false; }
  /// True when the session has a transaction open (checked locally, no round trip).
  virtual bool in_transaction(soci::session&) const = 0;
  /// True when the open transaction has failed and can only roll back (PostgreSQL answers
  /// COMMIT of such a transaction with ROLLBACK, silently).
  virtual bool transaction_failed(soci::session&) const { return false; }
  /// True when `column` of `table` has a unique index on exactly that one column.
  virtual bool has_unique_index(soci::session&, const std::string& table,
                                const std::string& column) const = 0;
  /// True when the table exists in the connected database.
  virtual bool table_exists(soci::session&, const std::string& table) const = 0;
  /// Serialises migrators across processes (session-level lock held until unlock). Not called
  /// when session_migration_lock() is false.
  virtual void lock_migrations(soci::session&, const connection_state& st,
                               const std::string& key) const = 0;
  /// False when the connection cannot keep a session-level lock (behind a transaction-mode
  /// pooler): migrate then takes lock_migrations_in_transaction() in each of its transactions.
  virtual bool session_migration_lock(const connection_state&) const { return true; }
  /// Why session leases cannot work on this server (Galera); nullptr: they can.
  virtual const char* session_lease_refusal(const connection_state&) const { return nullptr; }
  /// True where a row lock is not certified across nodes (Galera): rows are locked by writes.
  virtual bool locks_by_writing(const connection_state&) const { return false; }
  /// The migration lock for the open transaction only (released by its COMMIT or ROLLBACK).
  virtual void lock_migrations_in_transaction(soci::session&, const std::string&) const {}
  virtual void unlock_migrations(soci::session&, const std::string& key) const = 0;
};

/// Native errors to dblock::error.
class classifier {
 public:
  virtual ~classifier() = default;
  /// Classifies the exception being handled (call from a catch block); `what` prefixes the
  /// message. A dblock::error is rethrown unchanged.
  virtual error classify_current(const std::string& what) const = 0;
};

/// SQL text fragments.
class vocabulary {
 public:
  virtual ~vocabulary() = default;
  /// What the backend can do (capabilities.hpp): the texts below that a capability needs are
  /// non-empty exactly when it says so (tests/dialect checks it).
  virtual capabilities can() const = 0;
  virtual std::string quote(std::string_view ident) const;  ///< an identifier, validated already
  virtual std::string now() const = 0;  ///< "now" on the database clock, as timestamp columns
  /// now() in SQL that any client runs, without dblock's connection set-up (migration_sql()).
  virtual std::string client_now() const { return now(); }
  /// Lines around one migration file in migration_sql(): a transaction where DDL is one; and one
  /// statement of it, as the backend's own client reads it (MySQL: a routine in DELIMITER).
  virtual std::string script_begin() const { return "BEGIN;\n"; }
  virtual std::string script_commit() const { return "COMMIT;\n"; }
  virtual std::string script_statement(const std::string& st) const { return st + ";\n"; }
  /// `ts + micros` where micros is the bound parameter `param`.
  virtual std::string plus_us(const std::string& ts, const std::string& param) const = 0;
  /// A timestamp expression as integer microseconds since the epoch.
  virtual std::string epoch_us(const std::string& ts) const = 0;
  /// Suffixes of row-locking SELECTs (SQLite: none; its write transaction already excludes).
  virtual std::string for_update() const { return " FOR UPDATE"; }
  virtual std::string for_update_nowait() const { return " FOR UPDATE NOWAIT"; }
  virtual std::string for_update_skip_locked() const { return " FOR UPDATE SKIP LOCKED"; }
  /// Where connector::locks_by_writing(): an UPDATE that locks the lock rows matching `where`
  /// by writing them; their fence comes back in the OK packet's insert id.
  virtual std::string lock_by_writing(const table_names&, const std::string&) const { return {}; }
  /// After a table name: reach its rows by primary key only. MySQL's FORCE INDEX (PRIMARY):
  /// InnoDB locks every row a locking statement reads, so an UPDATE of a few named rows that
  /// scanned the expiry index would wait for rows other transactions hold.
  virtual std::string by_primary_key() const { return ""; }
  /// The statement that begins a write transaction (SQLite: BEGIN IMMEDIATE).
  virtual std::string begin_write() const { return "BEGIN"; }
  /// Suffix making an INSERT of an existing key a no-op.
  virtual std::string insert_if_absent(const std::string& key = "resource_name") const {
    return " ON CONFLICT (" + key + ") DO NOTHING";
  }
  /// Condition "column matches the bound pattern :param" (case-sensitive).
  virtual std::string name_pattern(const std::string& column, const std::string& param) const;
  /// `column` compared byte by byte (MySQL's VARBINARY and SQLite's BINARY names are; PostgreSQL
  /// says `COLLATE "C"`, which migration 0013's index serves).
  virtual std::string bytewise(const std::string& column) const { return column; }
  /// Turns a shell-style pattern (`*`, `?`) into the value bound for name_pattern().
  virtual std::string name_pattern_value(const std::string& glob) const;
  /// Select-list expression reading a user column as a dblock::value, aliased to its name.
  virtual std::string select_value(const std::string& column) const { return quote(column); }
  /// Reads column `i` of a row selected with select_value() as a dblock::value.
  virtual value decode_value(const soci::row& r, std::size_t i) const;
  /// A cell of dblock's executor (text, or NULL) as decode_value() would give it for a column
  /// SOCI types as `t`; nothing when it does not convert exactly (then SOCI reads the row).
  virtual std::optional<value> decode_text(const std::optional<std::string>& cell,
                                           soci::data_type t) const;
  /**
   * The lease acquire statement: one atomic upsert that takes the row when absent, expired,
   * released or already ours (reentry keeps the fence). Parameters name, token, ttl (µs), host,
   * pid, thread, floor (a new grant's fence is at least floor: the connection's fence epoch,
   * see lock_table::fence_floor()). Yields the fence when acquired (RETURNING; MySQL:
   * LAST_INSERT_ID() from the OK packet, 0 when held by another owner). `in_queue_order` (fair
   * waiters): one more parameter, `ticket`; a free lease is taken only when no live entry of the
   * name's queue below it waits, the row owner's own excluded (queue_ahead()), whichever ring
   * woke the waiter, at no extra round trip. A missing row is inserted as before.
   */
  virtual std::string lease_acquire(const table_names&, bool in_queue_order) const = 0;
  /// Condition: a live entry of :name's fair queue below :ticket waits that is not an entry of
  /// `owner` (the lock row's owner_token as the acquire statement names it).
  std::string queue_ahead(const table_names&, const std::string& owner) const;
  /// Fast leases (docs/fast-leases.md): `table` (the lock table's name) -> 1 when it is durable,
  /// 0 when a crash loses its writes (PostgreSQL: UNLOGGED). Empty where it is always durable.
  virtual std::string lock_table_durable() const { return {}; }
  /// The DDL making the lock table non-durable (the bool: fast) or durable again; empty where
  /// the backend has no such table (see no_fast_leases()).
  virtual std::string set_lock_table_durability(const table_names&, bool) const { return {}; }
  virtual std::string no_fast_leases() const { return {}; }  ///< why there is no fast mode
  /// Inside a write transaction: makes its COMMIT wait for durability (empty: every commit does).
  virtual std::string durable_commit() const { return {}; }
  /// Session leases: the texts of lock_statements::session_try and the next ones
  /// (storage/statements.hpp says what each does; capabilities::session_leases); empty elsewhere.
  struct session_texts {
    std::string try_lock, wait_lock, lock_timeout, unlock, sessions, end, idle, idle_reset, gone,
        fence_next, fence_set, report, unreport, forget;
  };
  virtual session_texts session_leases(const table_names&) const { return {}; }
  /// The server a flavor stands for where the dialect has several ("MariaDB", "MySQL 8");
  /// empty where it has one.
  virtual std::string flavor_name(flavor) const { return {}; }
  /**
   * Reserves IDs of a generator: `next_id = max(next_id, (now_ms - :epoch_ms) * :per_ms) + :n`
   * on the database clock, for the row `generator = :name`. Yields the new next_id (RETURNING;
   * MySQL: LAST_INSERT_ID() from the OK packet); the reserved IDs are [next_id - n, next_id).
   */
  virtual std::string id_reserve(const table_names&) const = 0;
  /// Suffix of an INSERT that yields the generated `column` (MySQL: none; the OK packet's id).
  virtual std::string returning(const std::string& column) const { return " RETURNING " + column; }
  /// returning(), for an insert whose commit need not wait for durability (a fair-queue entry:
  /// one lost in a crash is made again by its waiter's next refresh). PostgreSQL: the commit
  /// does not wait for the WAL flush.
  virtual std::string returning_unflushed(const std::string& column) const {
    return returning(column);
  }
  /**
   * The lease acquire statement (parameters as lease_acquire, then `ticket`) that also deletes
   * the fair-queue entry `ticket` when, and only when, it acquires: one round trip. Empty where
   * one statement cannot do both; the queue entry is then deleted by a second statement.
   */
  virtual std::string lease_acquire_dequeue(const table_names&, bool /*in_queue_order*/) const {
    return {};
  }
  /// Where a release rings a sleeping connection (MySQL): a SET clause for the release that
  /// returns, through the reply's insert id, the server session id of the connection sleeping
  /// for the handle of the head of the live queue, 0 when none (:name, :token bound); and the
  /// statement that interrupts that sleep (:id). Empty elsewhere.
  virtual std::string release_head(const table_names&) const { return {}; }
  /// Where the database rings in the release's own transaction (PostgreSQL): a suffix of the
  /// release and of the forced release (after their WHERE clause) that notifies the head of the
  /// freed lease's live queue, entries of :token excluded, when the lease is free; a release
  /// (not forced) that frees it also commits without waiting for the WAL flush. The release
  /// (not forced) instead returns a number for a head that its own process may ring directly,
  /// 0 otherwise (see doorbell::ring_handle()). Empty elsewhere.
  virtual std::string release_returning(const table_names&, bool /*forced*/) const { return {}; }
  /**
   * The whole lease release statement (:name, :token, :fence, :bell) where a release that frees
   * the lease hands it to the head of the live queue when that head asked for it
   * (lock_waiter.grant_ttl_us > 0) and waits through the releasing process's own host relay
   * (PostgreSQL): the head's owner token, fence + 1, a TTL of grant_ttl_us, its entry deleted,
   * all in the statement's own durable transaction. Its rows: release_returning()'s number (a
   * handed-over lease: the head's handle + 2^60), then, when handed over, the head's ticket.
   * One row at least when a hold was released. Empty where the dialect never hands a lease
   * over; the release is then built from release_head() and release_returning().
   */
  virtual std::string lease_release_granting(const table_names&) const { return {}; }
  /**
   * Where a release hands a freed lease to the head of the queue in two statements of one write
   * transaction instead (SQLite, without data-modifying CTEs but with one writer at a time, so
   * nothing changes between the two): the first (:name, :token, :fence) deletes the head of the
   * live queue (entries of :token excluded) when it asked for the lease (grant_ttl_us > 0) and
   * carries a bell (a handle directory to ring it in) and the lease is :token's at :fence with
   * one hold, unexpired; it returns the head's ticket, owner token, bell, grant TTL (µs), host
   * and pid (no row: nothing to hand over). Empty where the dialect does not hand over so.
   */
  virtual std::string lease_grant_take(const table_names&) const { return {}; }
  /// With lease_grant_take(): the second statement (:g_ttl, :g_token, :g_host, :g_pid, :name,
  /// :token, :fence) makes the lock row the head's (fence + 1, one hold, a TTL of :g_ttl µs from
  /// now, no holder thread) when it is still :token's at :fence with one hold.
  virtual std::string lease_grant_give(const table_names&) const { return {}; }
  /// With release_returning(): a query that notifies the head of the live queue as the release
  /// would (:name, :token, :fence bound), for a head the releasing process could not ring.
  virtual std::string head_notify(const table_names&) const { return {}; }
  virtual std::string bell_ring() const { return {}; }
  /// The same session id as a query (:name, :token) for a forced release. Empty elsewhere.
  virtual std::string head_sleeper(const table_names&) const { return {}; }
  /// Every live entry of broadcast queue :name (doorbell.hpp): owner token, bell, and the session
  /// to interrupt for it (MySQL's sleeper; else 0). PostgreSQL notifies each entry right here.
  virtual std::string queue_ring_all(const table_names&) const;
  /// The SQL API's fence check for any client (sql_api.hpp): its text, placeholders its own, name
  /// then fence; `returns_row`: it answers with the fence's row (none: refused), else it raises
  /// SQLSTATE DL001 (a stored routine) and returns nothing to read.
  struct fence_check {
    std::string text;
    bool returns_row = false;
  };
  virtual fence_check check_fence_native(const table_names& t) const = 0;
};

/// What an executor needs of a borrowed connection: the SOCI session, the connection's state as
/// the connector made it, and a way to have it closed when given back. storage's session_scope
/// is the one implementation; the dialect layer never sees the pool.
class exec_session {
 public:
  virtual soci::session& sql() = 0;
  virtual connection_state& state() = 0;
  virtual void mark_broken() noexcept = 0;

 protected:
  ~exec_session() = default;
};

/// Runs statements with bound values on a pooled connection.
class executor {
 public:
  virtual ~executor() = default;
  /// Runs `st` with `values` (in the order of st.params). Throws what the backend's SOCI
  /// backend would throw, so that the classifier treats both paths alike.
  virtual sql_result run(exec_session&, const statement& st,
                         const std::vector<sql_param>& values) const = 0;
  /// A single autocommit write statement runs between these (SQLite: BEGIN IMMEDIATE and COMMIT,
  /// prepared once, so it waits for the write lock instead of failing on a stale snapshot; a
  /// no-op elsewhere). `no_flush_wait`: a write whose commit need not wait for the disk (a
  /// release, a waiter-queue write; see write_kind::unflushed).
  virtual void begin_statement(exec_session&, bool /*no_flush_wait*/) const {}
  virtual void commit_statement(exec_session&) const {}
  virtual void rollback_statement(exec_session&) const noexcept {}
  /// True when begin_statement() really opens a write transaction (SQLite).
  virtual bool statement_in_transaction() const { return false; }
};

/// One backend: its name and its five roles.
struct dialect {
  const char* name;  ///< "postgresql", "mysql" or "sqlite"
  const connector& conn;
  const classifier& errors;
  const vocabulary& sql;
  const executor& exec;
  const doorbell& bell;
  const std::vector<migration_file>& migrations;  ///< embedded files, in version order
  const migration_file& bootstrap;                ///< the migrations bookkeeping table
};

/// Embedded migration files of one backend directory ("postgresql", "mysql", "sqlite").
std::vector<migration_file> load_migrations(const std::string& backend);
/// The files a server of flavor `f` applies, one per version, in version order: a version's
/// file for `f` where it has one, else its shared file.
std::vector<migration_file> migrations_for(const std::vector<migration_file>& all, flavor f);
/// The embedded bootstrap file (the migrations bookkeeping table) of one backend.
migration_file load_bootstrap(const std::string& backend);

/// The one dialect object of a backend, made of its roles (one instance per backend).
template <class Connector, class Classifier, class Vocabulary, class Executor,
          class Doorbell = doorbell>
const dialect& make_dialect(const char* name) {
  static const Connector conn;
  static const Classifier errors;
  static const Vocabulary sql;
  static const Executor exec;
  static const Doorbell bell;
  static const std::vector<migration_file> files = load_migrations(name);
  static const migration_file boot = load_bootstrap(name);
  static const dialect d{name, conn, errors, sql, exec, bell, files, boot};
  return d;
}

const dialect& postgresql_dialect();
const dialect& mysql_dialect();
const dialect& sqlite_dialect();

/// The dialect for a URL scheme; throws errc::invalid_argument for an unknown scheme.
const dialect& dialect_for_scheme(const std::string& scheme);
/// Builds the names of dblock's tables for a prefix (validated here).
table_names make_table_names(const std::string& prefix);
/// Replaces "{{prefix}}" in migration text.
std::string apply_prefix(const std::string& sql, const std::string& prefix);
/// Splits a migration file into statements (a statement ends with ';' at the end of a line).
std::vector<std::string> split_statements(const std::string& sql);

}  // namespace dblock::detail

#include "dialect/scan_parameters.hpp"  // scan_parameters() defined
