// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "dblock/listener.hpp"

/// @file
/// @brief dblock::database, the handle on one database and its connection pool.

namespace soci {
class session;
}

namespace dblock {

namespace detail {
struct database_impl;
class session_scope;
struct access;
}  // namespace detail

/// Transaction isolation level for the pooled connections.
enum class isolation_level {
  server_default,   ///< leave the server's setting (PostgreSQL: READ COMMITTED, InnoDB: REPEATABLE
                    ///< READ)
  read_committed,   ///< READ COMMITTED (PostgreSQL, MySQL)
  repeatable_read,  ///< REPEATABLE READ (PostgreSQL, MySQL)
  serializable,     ///< SERIALIZABLE (PostgreSQL, MySQL); SQLite is always serializable
};

/// What sits between dblock and a PostgreSQL server (see docs/deployment.md).
enum class pooler_mode {
  none,         ///< a direct connection (the default)
  session,      ///< a pooler in session mode (PgBouncer pool_mode=session): behaves like `none`
  transaction,  ///< a pooler in transaction mode (PgBouncer pool_mode=transaction): dblock keeps
                ///< no server-side state beyond one transaction (no named prepared statements,
                ///< no session settings), cannot end a server session after a lost COMMIT reply
                ///< (such an in_doubt is reported as not final); migrate() takes its lock in
                ///< each of its transactions
};

/// Settings of a database handle; all have safe defaults.
/// Thread-safety: a plain value.
struct database_options {
  /// Prefix of every dblock table name (for example "app1_"); empty or `[a-z_][a-z0-9_]{0,31}`
  /// (lower case, so that every backend spells the table names alike).
  std::string table_prefix;
  /// Number of pooled connections (1..1024), opened lazily on first use. Watchdogs borrow one
  /// while renewing, so allow one per concurrently renewing lock plus your own threads.
  std::size_t pool_size = 4;
  /// How long a call waits for a free pooled connection before throwing errc::pool_exhausted
  /// (errc::timeout when the call's own wait or deadline ends first; connect() and transactions
  /// have none).
  std::chrono::milliseconds pool_wait{30000};
  /// Connect timeout for PostgreSQL and MySQL (rounded up to whole seconds; PostgreSQL's least
  /// is 2 s). The URL key `connect_timeout` (whole seconds, or a duration such as `1500ms`; more
  /// than 0) sets it. A call whose deadline is nearer lowers it for the connections it opens.
  std::chrono::milliseconds connect_timeout{10000};
  /**
   * The deadline of a call that has none of its own (reads, admin, status, reap, migrate; a
   * lease's calls are bounded by its TTL, an acquire by its wait; docs/safety.md, "Deadlines").
   * Not for a connection handed to the caller (connect(), a transaction): those statements are
   * the caller's. When it passes, the server is asked to stop the statement and the connection
   * is cut: the call ends with errc::timeout (a read, also when its connection had to be cut;
   * a statement the server cancelled), errc::in_doubt (a write whose reply did not come) or
   * errc::connection_lost (a write cut off before anything was written), within 250 ms of it
   * (plus up to 600 ms to resolve an unknown outcome). A connection opened inside the call
   * counts its connect timeout in whole seconds (PostgreSQL: at least 2 s).
   */
  std::chrono::milliseconds call_timeout{30000};
  /// SQLite busy timeout: how long a statement waits for another writer.
  std::chrono::milliseconds sqlite_busy_timeout{5000};
  /// Isolation level set on every pooled connection when it connects (SQLite ignores it).
  isolation_level isolation = isolation_level::server_default;
  /// PostgreSQL only: the connection pooler in front of the server; also the URL key
  /// `pooler=none|session|transaction`, which overrides this field. Any other value than `none`
  /// on MySQL or SQLite is refused.
  pooler_mode pooler = pooler_mode::none;
  /// PostgreSQL only: where waiters' wake-up listener connects (a `postgresql://` URL straight
  /// to the server). Empty (the default): the database URL itself, except behind a
  /// transaction-mode pooler, where LISTEN cannot work and waiters poll instead (see
  /// docs/waiting.md). The listener is one connection outside the pool, opened when the first
  /// acquire starts waiting.
  std::string listen_url;
  /// PostgreSQL only: the database handles of this host (every process of this user) whose
  /// listener would connect alike share one listener connection (true, the default): one of
  /// them listens for all and relays each wake-up to the handle it is for through a private
  /// directory ($XDG_RUNTIME_DIR/dblock, else /dev/shm/dblock-UID, else /tmp/dblock-UID), and a
  /// release rings a waiter of the same directory itself; when that process ends, the
  /// next one with a waiter takes over. PostgreSQL signals every listening backend of the
  /// database at each NOTIFY, so one listener per host instead of one per handle keeps
  /// handoffs fast with many waiting processes. false, or a directory that cannot be used: one
  /// listener per handle. See docs/waiting.md.
  bool share_listener = true;
  /**
   * How long the cluster behind the URL takes to notice that a node is lost and to serve writes
   * elsewhere: a PostgreSQL failover manager's detection plus promotion, for example. Also the
   * URL key `failover_window` (`30s`, `1500ms`, `2m`), which overrides this field. Zero (the
   * default): what the server reports, which only a Galera node does (its
   * `evs.suspect_timeout` plus 1 s for the view change); the larger of the two counts. A lease
   * whose TTL is too short to be renewed through another node within that window is reported
   * once per handle and TTL (listener::short_ttl()); see failover() and docs/safety.md.
   */
  std::chrono::milliseconds failover_window{0};
  /// Receives events and log messages of everything using this database (optional).
  std::shared_ptr<listener> events;
};

/// The database server behind a handle (database::server()).
struct server_info {
  /// "PostgreSQL", "MariaDB", "MySQL" (Oracle's MySQL 8.0 / 8.4 and servers derived from it) or
  /// "SQLite" (the library linked in).
  std::string product;
  /// The version the server reports, e.g. "16.4", "10.11.6-MariaDB-0+deb12u1", "8.4.3",
  /// "3.40.1"; behind PgBouncer, what the pooler reports.
  std::string version;
};

/// What a database handle knows of its cluster's failure detection (database::failover()).
/// Thread-safety: a plain value.
struct failover_info {
  /// Time to detect a lost node and serve writes elsewhere; zero when unknown (a single server,
  /// or a PostgreSQL cluster without database_options::failover_window).
  std::chrono::milliseconds window{0};
  /// Where the window comes from, e.g. "Galera evs.suspect_timeout PT5S + 1 s for the view
  /// change" or "database_options::failover_window"; empty when window is zero.
  std::string source;
  /// The least TTL of a lease (with the default safety margin, ttl/10) that is renewed through
  /// another node before it expires when its holder's node is lost; zero when window is zero.
  std::chrono::milliseconds min_ttl{0};
};

/// The least TTL of a lease with the given safety margin (zero: the default, ttl/10) whose
/// watchdog, renewing at ttl/3, still renews it through another node when its holder's node is
/// lost and the cluster takes `window` to go on: 2/3 ttl - margin > window. Zero for a zero
/// window. Never throws.
std::chrono::milliseconds min_surviving_ttl(std::chrono::milliseconds window,
                                            std::chrono::milliseconds safety_margin = {}) noexcept;

/**
 * @brief A handle on one database: its URL, dialect, table names and connection pool.
 *
 * Accepted URLs (the scheme is case-insensitive):
 * - `postgresql://user:pass@host:port/db?sslmode=require&host=/run/postgresql` (also
 *   `postgres://`); query keys: the libpq keywords `host` (a unix socket directory),
 *   `hostaddr`, `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `sslcrl`, `application_name`
 *   (default `dblock`), `options`, `target_session_attrs`, `keepalives`, `keepalives_idle`,
 *   `keepalives_interval`, `keepalives_count`, `tcp_user_timeout`, `gssencmode`,
 *   `channel_binding`, `passfile` and `connect_timeout`, plus dblock's
 *   `pooler=none|session|transaction` (database_options::pooler).
 * - `mysql://user:pass@host:port/db?unix_socket=/path` (also `mariadb://`); query keys
 *   `unix_socket`, `charset` (default utf8mb4), `connect_timeout`, `read_timeout` and
 *   `write_timeout` (whole seconds, at least 1), `sslca`, `sslcert`, `sslkey` (the last two only
 *   with `sslca`).
 * - `sqlite:///absolute/path.db`, `sqlite://relative/path.db` (also `sqlite3://`), or
 *   `sqlite::memory:` for an in-memory database shared by the connections of this handle (and
 *   its copies) only, created and migrated by the constructor; query keys
 *   `synchronous=full|normal|extra` (default: SQLite's, FULL) and `busy_timeout=MILLISECONDS`
 *   (database_options::sqlite_busy_timeout). SQLite's own `:memory:` and `file:` URI names are
 *   refused (each `:memory:` connection would be a database of its own).
 * - Every scheme also takes dblock's `failover_window=DURATION` (database_options::failover_window;
 *   a number with `ms`, `s`, `m` or `h`).
 * - `connect_timeout` (PostgreSQL and MySQL) is database_options::connect_timeout: whole seconds
 *   or a duration (`1500ms`), more than 0 and at most 24 h.
 * - Several hosts, `postgresql://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write`
 *   (libpq tries them in order; no `host=` or `hostaddr=` key then) or
 *   `mysql://u:p@h1:3306,h2:3306,h3:3306/db` (dblock tries them in order, starting from the one
 *   that worked last); at most 16, no empty or repeated host; an IPv6 address in brackets
 *   (`[::1]:5432`).
 * User names and passwords may be percent-encoded. Unknown query keys are rejected.
 *
 * Copies are cheap and share the same pool; the pool lives until the last copy and the last
 * lock, guard or watchdog using it is gone. Thread-safety: all member functions may be called
 * concurrently from several threads, on one object or on copies (a moved-from handle must not be
 * used except to be assigned to or destroyed).
 *
 * @throws dblock::error errc::invalid_argument for a malformed URL, unknown scheme or key, or a bad
 *         table prefix. Connecting is lazy: an unreachable server or a wrong password shows up
 *         (errc::connection_failed) on the first connect(), or at once with ping().
 */
class database {
 public:
  /**
   * @brief Parses the URL and prepares the pool; opens no connection yet.
   * @throws dblock::error errc::invalid_argument for a malformed URL, an unknown scheme or query
   *         key, a bad query value, options.pool_size outside 1..1024 or a bad
   *         options.table_prefix.
   */
  explicit database(const std::string& url, database_options options = {});
  /// Drops this handle's share of the pool (closed when the last user is gone). Never throws.
  ~database();
  /// Another handle on the same pool. Never throws.
  database(const database&) = default;
  /// Makes this a handle on `other`'s pool. Never throws.
  database& operator=(const database&) = default;
  /// Takes over `other`'s share of the pool; `other` must not be used afterwards.
  database(database&&) noexcept = default;
  /// Takes over `other`'s share of the pool; `other` must not be used afterwards.
  database& operator=(database&&) noexcept = default;

  /// "postgresql", "mysql" or "sqlite".
  const std::string& backend() const noexcept;
  /// The URL with any password replaced by "***", safe to log.
  const std::string& redacted_url() const noexcept;
  /// The options this handle was opened with.
  const database_options& options() const noexcept;
  /// Full name of the lease lock table, e.g. "resource_lock" or "app1_resource_lock".
  const std::string& lock_table() const noexcept;

  /// Opens (or checks, with `SELECT 1`) one pooled connection now.
  /// @throws dblock::error errc::connection_failed with the reason when connecting fails,
  ///         errc::connection_lost when an open connection turns out broken (it is reopened on
  ///         its next use), errc::pool_exhausted when no pooled connection frees up within
  ///         options().pool_wait.
  void ping() const;

  /**
   * @brief The cluster's failure-detection window and the least TTL that survives a node loss.
   *
   * Opens a pooled connection when none has been opened yet (what a Galera node reports is
   * read when a connection opens). See database_options::failover_window.
   * @throws dblock::error as ping().
   */
  failover_info failover() const;

  /**
   * @brief The database server behind this handle, as it named itself when a connection opened.
   *
   * Opens a pooled connection when none is open (as ping()); costs no round trip otherwise.
   * `dblock status` prints it.
   * @throws dblock::error as ping().
   */
  server_info server() const;

  /**
   * @brief A pooled connection, returned to the pool on destruction.
   *
   * Use session() to run your own SQL through SOCI. Move-only; a moved-from connection must not
   * be used except to be assigned to or destroyed. If a call on it fails with a lost connection,
   * it is reopened on its next lease. Thread-safety: not thread-safe, one thread at a time (it
   * may be handed over between threads).
   */
  class connection {
   public:
    /// Takes over `other`'s pooled connection.
    connection(connection&&) noexcept;
    /// Returns this connection's pooled connection (see ~connection()) and takes over `other`'s.
    connection& operator=(connection&&) noexcept;
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;
    /// Returns the connection to the pool, rolled back when a transaction is still open, and
    /// closed (to be reopened on its next lease) when it broke. Never throws.
    ~connection();
    /// The SOCI session of this connection. Never throws; SOCI's own calls on it throw
    /// soci::soci_error, which dblock does not translate.
    soci::session& session();
    /// Marks the connection as broken so the pool reconnects it before its next use.
    void discard() noexcept;

   private:
    friend class database;
    friend struct detail::access;
    explicit connection(std::unique_ptr<detail::session_scope> s);
    std::unique_ptr<detail::session_scope> s_;
  };

  /// Borrows a connection from the pool, connecting it when needed (a connection found broken
  /// earlier is reopened here; one that broke unnoticed fails on its first statement). Its
  /// statements are the caller's: database_options::call_timeout does not bound them.
  /// @throws dblock::error errc::pool_exhausted when none frees up within options().pool_wait,
  ///         errc::connection_failed when connecting fails.
  connection connect() const;

 private:
  friend struct detail::access;
  std::shared_ptr<detail::database_impl> impl_;
};

}  // namespace dblock
