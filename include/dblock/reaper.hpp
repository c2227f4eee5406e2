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

namespace dblock {

/// Progress or outcome of reaping.
struct reap_result {
  std::uint64_t rows_reaped = 0;         ///< rows deleted by this call
  std::uint64_t batches = 0;             ///< delete transactions run
  std::chrono::microseconds elapsed{0};  ///< wall time of the call
  bool complete = false;                 ///< true when no reapable row was left
};

/// Settings of the reaper.
struct reaper_options {
  /// Delete rows whose lease expired more than this long ago (judged by the database clock).
  std::chrono::milliseconds retention{std::chrono::hours(1)};
  /// Rows deleted per transaction (1..10000): short transactions, short lock times.
  std::size_t batch_size = 1000;
  /// reap_once() stops starting batches after this long (zero: until done).
  std::chrono::milliseconds time_budget{0};
  /**
   * Pause between raising the fence floor and deleting rows, so that any acquire statement
   * that read the old floor has finished before a row it could re-create is deleted (see
   * "Fences after deletion" in the README). The background reaper uses its interval instead.
   */
  std::chrono::milliseconds floor_grace{std::chrono::seconds(1)};
  /// Background mode: time between runs, each randomised by ±jitter (a fraction, 0..1).
  std::chrono::milliseconds interval{std::chrono::seconds(60)};
  double jitter = 0.2;
  /// Called after each batch (reap_once() and background runs), e.g. to print progress.
  std::function<void(const reap_result& so_far)> on_batch;
  /// Background mode: called with each failed run's error; the next run tries again.
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
 * are created later start above it.
 * @throws dblock::error on connection and backend failures (the rows of finished batches stay
 *         deleted).
 */
reap_result reap_once(const database& db, const reaper_options& options = {});

/// Counters of a background reaper.
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
 * called from any thread.
 */
class reaper {
 public:
  /// Starts the thread. @throws dblock::error errc::invalid_argument for bad options.
  reaper(database db, reaper_options options = {});
  ~reaper();
  reaper(const reaper&) = delete;
  reaper& operator=(const reaper&) = delete;

  /// A snapshot of the counters.
  reaper_metrics metrics() const;
  /// Stops and joins the thread (also done by the destructor). Call it from one thread, and
  /// never from the reaper's own callbacks (on_batch, on_error), which run on that thread.
  void stop() noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
