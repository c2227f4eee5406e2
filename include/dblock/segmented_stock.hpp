// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/retry.hpp"

/// @file
/// @brief Segmented stock (segmented_stock): a hot counter split into rows that concurrent
///        takes update independently.

namespace dblock {

/**
 * @brief A named stock (a non-negative total) split into S segment rows, so that concurrent
 *        takes of a hot item update different rows instead of queueing on one.
 *
 * take(k) starts at a random segment and probes on, each probe one conditional
 * `UPDATE … SET amount = amount - k WHERE … AND amount >= k`. When no segment holds k but the
 * total does, the segments are rebalanced in one transaction (every row locked, k taken, the rest
 * spread evenly), so stock never strands: while the total is at least k, a take of k succeeds.
 * The total is the sum of the rows, read in one statement, so it is exact whenever it is read.
 * Nothing here uses a clock.
 *
 * The forms that take a `database::connection&` run on the caller's connection: inside the
 * caller's open transaction they commit or roll back with it (an order row and its decrement
 * together); without one each write commits by itself. Inside a transaction a take holds its
 * segment's row lock until the caller commits. There it first reads the segments (a plain read;
 * when the total is below k the answer is no, as committed at that read, or in REPEATABLE READ
 * at the transaction's snapshot), then probes the segments that hold k skipping rows that
 * other transactions hold (SKIP LOCKED, where the backend has row locks), and only when none
 * is free waits, and then only for a segment whose committed amount holds k (a take that may
 * roll back), so concurrent one-take transactions do not deadlock on PostgreSQL. MySQL/MariaDB
 * locks and waits for a row read by its key whatever its amount, so a take there can still,
 * rarely, wait for a segment another take emptied and deadlock with it; and any transaction
 * that took from one segment and then takes again (or rebalances) can deadlock with another
 * doing the same. The database reports it (errc::deadlock, retry the whole transaction:
 * run_transaction() in transaction.hpp does).
 *
 * Thread-safety: a handle may be shared between threads; each call uses its own pooled
 * connection (or the caller's).
 */
class segmented_stock {
 public:
  /**
   * A handle on the stock `name` of `db` (creates nothing).
   * @throws dblock::error errc::invalid_argument unless `name` is 1–255 bytes of valid UTF-8
   *         without NUL (the rules of lock names).
   */
  segmented_stock(database db, std::string name);

  /// The stock's name.
  const std::string& name() const noexcept { return name_; }

  /**
   * Creates the stock: `total` split over `segments` rows as evenly as possible, in one
   * transaction.
   * @throws dblock::error errc::unique_violation when a stock of this name exists (drop() it
   *         first to start over); errc::invalid_argument unless total >= 0 and
   *         1 <= segments <= 1024; the @ref database_errors "database errors".
   */
  void create(std::int64_t total, int segments = 16) const;

  /**
   * Takes `k` (default 1) from the stock if at least `k` is left.
   * @return true when taken; false when less than `k` was left (nothing changed).
   * @throws dblock::error errc::not_found when no stock has this name; errc::invalid_argument
   *         unless k >= 1; errc::in_doubt when the connection broke after a decrement was sent
   *         (it may or may not have been applied, and a segment's amount cannot tell this call's
   *         take from another's: read total(), do not retry blindly; the server session is ended
   *         first and the message says whether the read is then final); a connection that broke
   *         before any write was sent is sent again (three sends; then errc::connection_lost,
   *         nothing written); the
   *         @ref database_errors "database errors" (deadlocks and serialization failures are
   *         retried under `policy` first).
   */
  bool take(std::int64_t k = 1, const retry_policy& policy = {}) const;

  /**
   * take() on the caller's connection, inside the caller's transaction if one is open.
   * @throws dblock::error as take(); inside a transaction a lost connection is
   *         errc::connection_lost (nothing was committed) and a deadlock is errc::deadlock
   *         (roll back and retry the whole transaction).
   */
  bool take(database::connection& conn, std::int64_t k = 1) const;

  /**
   * Returns `k` (default 1) to the stock, into a random segment.
   * @throws dblock::error errc::not_found when no stock has this name; errc::invalid_argument
   *         unless k >= 1; errc::in_doubt as take(); the @ref database_errors "database errors".
   */
  void put(std::int64_t k = 1, const retry_policy& policy = {}) const;

  /// put() on the caller's connection, inside the caller's transaction if one is open.
  /// @throws dblock::error as put(); inside a transaction as take(connection&).
  void put(database::connection& conn, std::int64_t k = 1) const;

  /**
   * The total left: the sum of the segments, read in one statement.
   * @throws dblock::error errc::not_found when no stock has this name; the
   *         @ref database_errors "database errors".
   */
  std::int64_t total() const;

  /**
   * Each segment's amount, in segment order (a plain read; for monitoring and tests).
   * @throws dblock::error errc::not_found when no stock has this name; the
   *         @ref database_errors "database errors".
   */
  std::vector<std::int64_t> segments() const;

  /**
   * Deletes the stock. @return whether it existed.
   * @throws dblock::error the @ref database_errors "database errors".
   */
  bool drop() const;

 private:
  database db_;
  std::string name_;
  /// The number of segments as last seen (0: not read yet), shared by copies. A stale value
  /// costs probes, never correctness: the rebalance reads the rows themselves.
  std::shared_ptr<std::atomic<int>> segments_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace dblock
