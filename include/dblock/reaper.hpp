// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dblock/database.hpp"
#include "dblock/error.hpp"

/// @file
/// @brief Deleting long-expired lease rows: reap_once() and the background dblock::reaper.

namespace dblock {

/// Progress or outcome of reaping.
/// Thread-safety: a plain value.
struct reap_result {
  std::uint64_t rows_reaped = 0;         ///< rows deleted by this call
  std::uint64_t batches = 0;             ///< delete transactions run
  std::chrono::microseconds elapsed{0};  ///< wall time of the call
  bool complete = false;                 ///< true when no reapable row was left
  /// Waiter queue entries deleted (expired longer than min(retention, 1 minute) ago: their
  /// waiters died or gave up without deleting them); not counted in rows_reaped.
  std::uint64_t waiters_reaped = 0;
  /// Runs of periodic jobs (run_in_slot(), `dblock exec --every`) whose slot ended more than the
  /// retention ago; not counted in rows_reaped. Runs of run_once() are kept: they are its
  /// memory that the job ran.
  std::uint64_t runs_reaped = 0;
};

/// Settings of the reaper; reap_once() and reaper's constructor check them. Thread-safety: a
/// plain value.
struct reaper_options {
  /// Delete rows whose lease expired more than this long ago (judged by the database clock; not
  /// negative).
  std::chrono::milliseconds retention{std::chrono::hours(1)};
  /// Rows deleted per transaction (1..10000): short transactions, short lock times.
  std::size_t batch_size = 1000;
  /// reap_once() stops starting batches after this long (zero: until done).
  std::chrono::milliseconds time_budget{0};
  /**
   * Pause between raising the fence floor and deleting rows, so that any acquire statement
   * that read the old floor has finished before a row it could re-create is deleted (see
   * "Fences after deletion" in docs/reaper.md). The background reaper uses its interval instead.
   */
  std::chrono::milliseconds floor_grace{std::chrono::seconds(1)};
  /// Background mode: time between runs (at least 1 ms), each randomised by ±jitter.
  std::chrono::milliseconds interval{std::chrono::seconds(60)};
  /// Background mode: the randomisation of interval, a fraction in 0..1 (0.2: ±20 %).
  double jitter = 0.2;
  /// Called after each batch (reap_once() and background runs), to print progress, say; on the
  /// reaping thread. What it throws ends reap_once() with that exception, or fails the
  /// background run (reported to on_error).
  std::function<void(const reap_result& so_far)> on_batch;
  /// Background mode: called with each failed run's error, on the reaper's thread; the next run
  /// tries again. Exceptions are swallowed.
  std::function<void(const error&)> on_error;
};

/**
 * @brief Deletes long-expired lease rows in batches until none is left or the time budget is
 *        spent.
 *
 * Safe with several reapers in several processes: candidates are picked with
 * `FOR UPDATE SKIP LOCKED` (SQLite: inside one write transaction), so no row is deleted twice
 * and the counts add up; every DELETE re-checks the expiry in its own WHERE clause, so a lease
 * renewed or re-acquired meanwhile is never removed. Fences stay monotonic: before deleting, the
 * reaper raises `resource_lock_fence_floor` to at least every fence it may delete, and rows that
 * are created later start above it. Blocks for floor_grace after raising the floor.
 *
 * Thread-safety: safe to call concurrently, also with reapers in other threads and processes;
 * each call uses its own pooled connections.
 *
 * @throws dblock::error errc::invalid_argument for bad options (retention negative, batch_size
 *         outside 1..10000, jitter outside 0..1, interval under 1 ms); errc::deadlock,
 *         errc::serialization_failure or errc::lock_not_available when a step failed with one 10
 *         times or for 30 s (attempts() > 0); errc::in_doubt when the connection broke after a
 *         batch's COMMIT was sent; the @ref database_errors "database errors". The rows of
 *         finished batches stay deleted. Exceptions of on_batch propagate as they are.
 */
reap_result reap_once(const database& db, const reaper_options& options = {});

/// Counters of a background reaper.
/// Thread-safety: a plain value (a snapshot).
struct reaper_metrics {
  std::uint64_t rows_reaped = 0;          ///< total over all runs
  std::uint64_t batches = 0;              ///< total delete transactions
  std::uint64_t runs = 0;                 ///< runs finished (successfully or not)
  std::uint64_t failed_runs = 0;          ///< runs that ended with an error
  std::optional<std::string> last_error;  ///< message of the latest failed run, if any
};

/**
 * @brief Reaps in a background thread every `interval` (± jitter) until destroyed.
 *
 * Each run deletes rows whose fence the previous run covered by raising the floor, then raises
 * the floor for the next run, so the interval doubles as the floor grace. Errors go to
 * `on_error` and the next run tries again. The destructor stops the thread promptly (it wakes the
 * sleeping thread and waits at most for the batch in flight). Thread-safety: metrics() may be
 * called from any thread, concurrently; stop() and the destructor from one thread (see stop()).
 * A run's errors never leave the thread: they go to on_error and metrics().
 */
class reaper {
 public:
  /**
   * @brief Starts the thread; the first run starts at once.
   * @throws dblock::error errc::invalid_argument for bad options (as reap_once()).
   * @throws std::system_error when the thread cannot be started.
   */
  reaper(database db, reaper_options options = {});
  /// Stops and joins the thread (see stop()). Never throws.
  ~reaper();
  reaper(const reaper&) = delete;
  reaper& operator=(const reaper&) = delete;

  /// A snapshot of the counters. Throws only std::bad_alloc (copying last_error).
  reaper_metrics metrics() const;
  /// Stops and joins the thread (also done by the destructor). Call it from one thread, and
  /// never from the reaper's own callbacks (on_batch, on_error), which run on that thread.
  void stop() noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
