// dblock: distributed locks and safe concurrent updates on the database you already run.
// Transactions: row locks (SELECT ... FOR UPDATE, NOWAIT, SKIP LOCKED), named lock rows, and a
// runner that retries whole transactions. Formerly row_lock.hpp (still included by it).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/retry.hpp"
#include "dblock/value.hpp"

/// @file
/// @brief Transactions with row locks (dblock::transaction) and the transaction runner
/// (dblock::run_transaction()).

namespace dblock {

/// How a row-locking read treats rows locked by other transactions.
enum class lock_wait {
  wait,         ///< wait, up to the transaction's lock_timeout (then errc::lock_not_available)
  nowait,       ///< fail at once with errc::lock_not_available
  skip_locked,  ///< leave locked rows out of the result
};

/// Settings of a transaction.
/// Thread-safety: a plain value.
struct transaction_options {
  /**
   * How long a lock wait may last inside the transaction: PostgreSQL `lock_timeout` (`SET LOCAL`,
   * for this transaction only, sent with its BEGIN in one round trip), MySQL
   * `innodb_lock_wait_timeout` (whole seconds, rounded up, at least 1; set on the session when
   * the transaction begins unless the session has it already from an earlier transaction, and
   * given back to the server default before the session runs anything else: dblock's own
   * statements, or a connection handed out by database::connect()), SQLite busy timeout (the
   * wait happens at BEGIN IMMEDIATE, which takes the database's single write lock). Zero means
   * "do not wait"; negative is refused (errc::invalid_argument).
   */
  std::chrono::milliseconds lock_timeout{std::chrono::seconds(10)};
};

/// Business rows to lock by key: `SELECT columns FROM table WHERE key_column = :key FOR UPDATE`.
/// Thread-safety: a plain value.
struct row_selector {
  std::string table;                 ///< validated identifier, quoted
  std::string key_column;            ///< validated identifier; must have a unique index
  value key;                         ///< bound, never spliced
  std::vector<std::string> columns;  ///< columns to return (the key is always included)
  /**
   * Lock even when `key_column` has no single-column unique index. Off by default because on
   * MySQL `FOR UPDATE` locks every row it scans: a lookup without such an index can lock the
   * whole table. dblock refuses it on every backend alike unless you opt out here.
   */
  bool allow_unindexed = false;
};

/// Rows to claim from a work queue: `... WHERE <where> ORDER BY key LIMIT n FOR UPDATE SKIP
/// LOCKED`. Thread-safety: a plain value.
struct claim_spec {
  std::string table;                 ///< validated identifier
  std::string key_column;            ///< validated identifier; rows are claimed in key order
  std::vector<std::string> columns;  ///< columns to return (the key is always included)
  /// SQL condition written by the programmer, e.g. "status = :s"; values go in `params`.
  std::string where = "1 = 1";
  /// Values bound to the `:name` parameters of `where` (names are identifiers).
  std::vector<std::pair<std::string, value>> params;
};

/**
 * @brief A database transaction on a pooled connection that can take row locks.
 *
 * Begins on first use (SQLite: BEGIN IMMEDIATE, which excludes every other writer of the
 * database file until the end: SQLite has no row locks, so that is its honest equivalent of a
 * row lock). The database releases every lock at commit, at rollback, or when the connection
 * dies. The destructor rolls back if neither commit() nor rollback() was called.
 * Move-only; a moved-from transaction is inactive. A failed statement of lock_resource(),
 * lock_rows() or claim() dooms the transaction: commit() then rolls back and throws (on
 * PostgreSQL so does a failed statement of the caller's own). Thread-safety: one thread at a
 * time (it may be handed over between threads).
 *
 * Every member that talks to the database may also throw the @ref database_errors
 * "database errors"; members called on a moved-from or ended transaction throw errc::not_owner.
 */
class transaction {
 public:
  /**
   * @brief Borrows a connection; BEGIN is sent on first use (so that lock_resource() can create
   *        a missing lock row before the transaction starts).
   * The connection is not bounded by database_options::call_timeout: the statements are the
   * caller's (docs/safety.md, "Deadlines").
   * @throws dblock::error errc::pool_exhausted when no pooled connection frees up within
   *         database_options::pool_wait, errc::connection_failed when connecting fails,
   *         errc::invalid_argument for a negative options.lock_timeout.
   */
  explicit transaction(const database& db, transaction_options options = {});
  /// Rolls back if still active (see rollback()) and returns the connection. Never throws.
  ~transaction();
  /// Takes over `other`, which becomes inactive.
  transaction(transaction&&) noexcept;
  /// Rolls this transaction back if still active, then takes over `other`, which becomes
  /// inactive.
  transaction& operator=(transaction&&) noexcept;
  transaction(const transaction&) = delete;
  transaction& operator=(const transaction&) = delete;

  /// The SOCI session, for the caller's own statements inside the transaction; begins the
  /// transaction if needed. SOCI's calls on it throw soci::soci_error (classified only inside
  /// run_transaction()).
  /// @throws dblock::error errc::not_owner when moved-from or ended; the errors of BEGIN:
  ///         errc::lock_not_available on SQLite when another writer holds the database past
  ///         lock_timeout, and the @ref database_errors "database errors".
  soci::session& session();
  /// The pooled connection (for versioned_update() and compare_and_set() inside it); begins the
  /// transaction if needed.
  /// @throws dblock::error as session().
  database::connection& connection();
  /// True until commit() or rollback().
  bool active() const noexcept;

  /**
   * @brief Commits (nothing to do when no statement ran); the transaction is ended afterwards,
   *        also when this throws.
   * @throws dblock::error errc::in_doubt when the connection broke after COMMIT was sent (the
   *         outcome is unknown: never retry blindly); when a statement had failed (rolled back,
   *         nothing written), that statement's code, or errc::backend_error for one of the
   *         caller's on PostgreSQL; errc::not_owner when moved-from or already ended; other
   *         classified errors (rolled back).
   */
  void commit();
  /// Rolls back; never throws (a broken connection rolls back by itself). Nothing to do when
  /// already ended.
  void rollback() noexcept;

  /**
   * @brief Locks the `resource_lock` row of `name` FOR UPDATE, creating it first when absent
   *        (race-safe on the unique index, in its own statement so that no insert locks are
   *        held by this transaction).
   * @return false when another transaction holds it, with lock_wait::nowait or
   *         lock_wait::skip_locked; else true.
   * @throws dblock::error errc::lock_not_available when a wait exceeds lock_timeout (SQLite:
   *         when BEGIN IMMEDIATE does), errc::deadlock, errc::invalid_argument for a bad name
   *         (empty, over 255 bytes, a NUL byte or not valid UTF-8), errc::not_owner when
   *         moved-from or ended, errc::backend_error when a reaper keeps deleting the row.
   */
  bool lock_resource(const std::string& name, lock_wait mode = lock_wait::wait);

  /**
   * @brief Locks the caller's rows selected by key and returns them (empty when none match).
   *
   * With lock_wait::nowait a locked row throws errc::lock_not_available; with skip_locked a
   * locked row is left out of the result. The statement is prepared once per pooled connection
   * after its first run there (when the key is an integer or a string), so a repeated lock
   * costs one round trip and no re-parse; values come back with the same types every time.
   * @throws dblock::error errc::invalid_argument for bad identifiers, a column of a type dblock
   *         cannot carry, or a key column without a single-column unique index (unless
   *         allow_unindexed); errc::lock_not_available (nowait, or a wait past lock_timeout);
   *         errc::deadlock; errc::not_owner when moved-from or ended.
   */
  std::vector<record> lock_rows(const row_selector& rows, lock_wait mode = lock_wait::wait);

  /// Claims up to `limit` unlocked rows matching `spec` (SKIP LOCKED); the caller marks them
  /// done before commit. On SQLite the write transaction already excludes other claimers.
  /// @throws dblock::error errc::invalid_argument for bad identifiers or parameter names, a
  ///         limit outside 1..100000, an empty `where` or a column of a type dblock cannot carry;
  ///         errc::not_owner when moved-from or ended; the classified errors of the statement
  ///         (errc::backend_error for bad SQL in `where`, ...).
  std::vector<record> claim(const claim_spec& spec, std::size_t limit);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Opens a transaction and locks `name` without waiting; nothing when someone else holds it.
/// Thread-safety: safe to call concurrently; each call uses its own pooled connection.
/// @throws dblock::error errc::invalid_argument for a bad name; the @ref database_errors
///         "database errors".
[[nodiscard]] std::optional<transaction> try_lock_resource(const database& db,
                                                           const std::string& name);

/// Opens a transaction and locks `name`, waiting up to `timeout`. Thread-safety: safe to call
/// concurrently; each call uses its own pooled connection.
/// @throws dblock::error errc::lock_not_available when the wait runs out; errc::deadlock;
///         errc::invalid_argument for a bad name or a negative timeout; the @ref database_errors
///         "database errors".
[[nodiscard]] transaction lock_resource(const database& db, const std::string& name,
                                        std::chrono::milliseconds timeout);

/// The default policy of run_transaction(): 5 attempts within 10 s, 10–200 ms jittered backoff,
/// retrying the default retryable codes of retry_policy. Throws only std::bad_alloc.
retry_policy transaction_retry_policy();

/// Non-template core of run_transaction(); throws as run_transaction() does.
void run_transaction_void(const database& db, const std::function<void(transaction&)>& body,
                          const retry_policy& policy, transaction_options options,
                          retry_stats* stats);

/**
 * @brief Runs `body` in a transaction and commits, retrying the whole transaction on deadlock,
 *        serialization failure, lock wait timeout and version conflict (the retryable codes of
 *        `policy`).
 *
 * Every failed attempt is rolled back completely before the next one (MySQL's lock wait timeout
 * 1205 rolls back only the statement by default). A COMMIT whose reply is lost is never retried:
 * errc::in_doubt propagates. `body` may run several times and must not have side effects outside
 * the transaction. SOCI errors of the caller's own statements on `t.session()` are classified
 * like dblock's, so a deadlock there is retried too. When `body` commits or rolls back itself,
 * it is not committed again.
 *
 * Thread-safety: safe to call concurrently; each attempt uses its own pooled connection, and
 * `body` runs on the calling thread.
 * @return what `body` returned.
 * @throws dblock::error the last attempt's own code (attempts() > 0) when `policy` is exhausted;
 *         errc::in_doubt when a COMMIT reply was lost; errc::invalid_argument for a policy with
 *         max_attempts < 1; any non-retryable error of `body` or of the transaction (see
 *         transaction) as is. Anything else `body` throws propagates as is, after the rollback.
 */
template <class F>
auto run_transaction(const database& db, F&& body,
                     const retry_policy& policy = transaction_retry_policy(),
                     transaction_options options = {}, retry_stats* stats = nullptr)
    -> decltype(body(std::declval<transaction&>())) {
  using R = decltype(body(std::declval<transaction&>()));
  if constexpr (std::is_void_v<R>) {
    run_transaction_void(
        db, [&](transaction& t) { body(t); }, policy, options, stats);
  } else {
    std::optional<R> out;
    run_transaction_void(
        db, [&](transaction& t) { out.emplace(body(t)); }, policy, options, stats);
    return std::move(*out);
  }
}

}  // namespace dblock
