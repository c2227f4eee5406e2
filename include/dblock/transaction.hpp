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

namespace dblock {

/// How a row-locking read treats rows locked by other transactions.
enum class lock_wait {
  wait,         ///< wait, up to the transaction's lock_timeout (then errc::lock_not_available)
  nowait,       ///< fail at once with errc::lock_not_available
  skip_locked,  ///< leave locked rows out of the result
};

/// Settings of a transaction.
struct transaction_options {
  /**
   * How long a lock wait may last inside the transaction: PostgreSQL `lock_timeout` (for this
   * transaction only), MySQL `innodb_lock_wait_timeout` (whole seconds, rounded up, at least 1; set
   * on the session when the transaction begins, reset to the server default when it ends), SQLite
   * busy timeout (the wait happens at BEGIN IMMEDIATE, which takes the database's single write
   * lock). Zero means "do not wait".
   */
  std::chrono::milliseconds lock_timeout{std::chrono::seconds(10)};
};

/// Business rows to lock by key: `SELECT columns FROM table WHERE key_column = :key FOR UPDATE`.
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
/// LOCKED`.
struct claim_spec {
  std::string table;                 ///< validated identifier
  std::string key_column;            ///< validated identifier; rows are claimed in key order
  std::vector<std::string> columns;  ///< columns to return (the key is always included)
  /// SQL condition written by the programmer, e.g. "status = :s"; values go in `params`.
  std::string where = "1 = 1";
  std::vector<std::pair<std::string, value>> params;
};

/**
 * @brief A database transaction on a pooled connection that can take row locks.
 *
 * Begins on first use (SQLite: BEGIN IMMEDIATE, which excludes every other writer of the
 * database file until the end: SQLite has no row locks, so that is its honest equivalent of a
 * row lock). The database releases every lock at commit, at rollback, or when the connection
 * dies. The destructor rolls back if neither commit() nor rollback() was called.
 * Move-only; a moved-from transaction is inactive. Thread-safety: one thread at a time.
 */
class transaction {
 public:
  /// Borrows a connection; BEGIN is sent on first use (so that lock_resource() can create a
  /// missing lock row before the transaction starts). Beginning may throw lock_not_available on
  /// SQLite when another writer holds the database past lock_timeout.
  explicit transaction(const database& db, transaction_options options = {});
  ~transaction();
  transaction(transaction&&) noexcept;
  transaction& operator=(transaction&&) noexcept;
  transaction(const transaction&) = delete;
  transaction& operator=(const transaction&) = delete;

  /// The SOCI session, for the caller's own statements inside the transaction.
  soci::session& session();
  /// The pooled connection (for versioned_update() and compare_and_set() inside it).
  database::connection& connection();
  /// True until commit() or rollback().
  bool active() const noexcept;

  /**
   * @brief Commits. @throws dblock::error errc::in_doubt when the connection broke after COMMIT
   *        was sent (the outcome is unknown: never retry blindly), other classified errors.
   */
  void commit();
  /// Rolls back; never throws (a broken connection rolls back by itself).
  void rollback() noexcept;

  /**
   * @brief Locks the `resource_lock` row of `name` FOR UPDATE, creating it first when absent
   *        (race-safe on the unique index, in its own statement so that no insert locks are
   *        held by this transaction).
   * @return false only with lock_wait::nowait when another transaction holds it.
   * @throws dblock::error errc::lock_not_available when a wait exceeds lock_timeout,
   *         errc::deadlock, errc::invalid_argument for a bad name.
   */
  bool lock_resource(const std::string& name, lock_wait mode = lock_wait::wait);

  /**
   * @brief Locks the caller's rows selected by key and returns them (empty when none match).
   *
   * With lock_wait::nowait a locked row throws errc::lock_not_available; with skip_locked a
   * locked row is left out of the result.
   * @throws dblock::error errc::invalid_argument for bad identifiers or a key column without a
   *         single-column unique index (unless allow_unindexed).
   */
  std::vector<record> lock_rows(const row_selector& rows, lock_wait mode = lock_wait::wait);

  /// Claims up to `limit` unlocked rows matching `spec` (SKIP LOCKED); the caller marks them
  /// done before commit. On SQLite the write transaction already excludes other claimers.
  std::vector<record> claim(const claim_spec& spec, std::size_t limit);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Opens a transaction and locks `name` without waiting; nothing when someone else holds it.
[[nodiscard]] std::optional<transaction> try_lock_resource(const database& db,
                                                           const std::string& name);

/// Opens a transaction and locks `name`, waiting up to `timeout`.
/// @throws dblock::error errc::lock_not_available when the wait runs out.
[[nodiscard]] transaction lock_resource(const database& db, const std::string& name,
                                        std::chrono::milliseconds timeout);

/// The default policy of run_transaction(): 5 attempts within 10 s, 10–200 ms jittered backoff.
retry_policy transaction_retry_policy();

/// Non-template core of run_transaction().
void run_transaction_void(const database& db, const std::function<void(transaction&)>& body,
                          const retry_policy& policy, transaction_options options,
                          retry_stats* stats);

/**
 * @brief Runs `body` in a transaction and commits, retrying the whole transaction on deadlock,
 *        serialization failure and lock wait timeout (the retryable codes of `policy`).
 *
 * Every failed attempt is rolled back completely before the next one (MySQL's lock wait timeout
 * 1205 rolls back only the statement by default). A COMMIT whose reply is lost is never retried:
 * errc::in_doubt propagates. `body` may run several times and must not have side effects outside
 * the transaction.
 * @return what `body` returned.
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
