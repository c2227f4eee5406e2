// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "dblock/error.hpp"

/// @file
/// @brief Bounded retry loops: dblock::retry_policy, dblock::retry().

namespace dblock {

/// What a retry loop reports before each retry (for metrics and logs). Valid only during the
/// retry_policy::on_retry call (it refers to the loop's current error). Thread-safety: a plain
/// value, read on the retrying thread.
struct retry_event {
  int attempt;                        ///< the attempt that just failed (1-based)
  const error& cause;                 ///< why it failed (valid during the call only)
  std::chrono::microseconds backoff;  ///< sleep before the next attempt
  std::chrono::microseconds elapsed;  ///< time since the loop started
};

/// Counts of one retry loop, filled in whether it succeeds or gives up. Thread-safety: a plain
/// value; the loop writes it on the calling thread.
struct retry_stats {
  int attempts = 0;                      ///< attempts started
  int conflicts = 0;                     ///< attempts that failed with a retryable error
  std::chrono::microseconds elapsed{0};  ///< total time of the loop
};

/**
 * @brief A bounded retry loop: attempts, time budget, exponential backoff with full jitter.
 *
 * Used by optimistic updates, CAS updates and the transaction runner. Only errors whose code is
 * in `retryable` are retried; any other error propagates at once. When attempts or time run out,
 * the loop throws the last attempt's error with its own code (version_conflict for a real
 * conflict; deadlock, serialization_failure or lock_not_available when every attempt was starved
 * by those), with attempts() and elapsed() set (attempts() > 0 is how to tell an exhausted loop)
 * and the budget that ran out in the message. Thread-safety: a policy is a value; share copies
 * freely.
 */
struct retry_policy {
  /// Maximum attempts, including the first (at least 1).
  int max_attempts = 3;
  /// Total time budget; no new attempt starts after it (zero: no budget).
  std::chrono::milliseconds time_budget{100};
  /// Backoff before retry n is uniform in [0, min(max_backoff, initial_backoff * 2^(n-1))].
  std::chrono::milliseconds initial_backoff{1};
  /// The cap of the backoff (see initial_backoff).
  std::chrono::milliseconds max_backoff{50};
  /// Codes worth retrying. SQLite BUSY is lock_not_available.
  std::vector<errc> retryable{errc::version_conflict, errc::serialization_failure, errc::deadlock,
                              errc::lock_not_available};
  /// Called before each retry (from the retrying thread); empty by default. What it throws ends
  /// the loop with that exception.
  std::function<void(const retry_event&)> on_retry;

  /// A policy that retries until success (no attempt limit, no time budget). Throws only
  /// std::bad_alloc.
  static retry_policy until_success() {
    retry_policy p;
    p.max_attempts = 0x7fffffff;
    p.time_budget = std::chrono::milliseconds(0);
    return p;
  }
  /// A policy that makes exactly one attempt. Throws only std::bad_alloc.
  static retry_policy once() {
    retry_policy p;
    p.max_attempts = 1;
    return p;
  }
  /// True when `code` is in `retryable`.
  bool is_retryable(errc code) const noexcept;
};

/// Runs `attempt` under `policy` (see retry_policy); non-template core of retry(). Throws as
/// retry() does.
void run_with_retry(const retry_policy& policy, const std::function<void()>& attempt,
                    retry_stats* stats = nullptr);

/**
 * @brief Calls `f()` until it returns, retrying retryable dblock::error codes under `policy`.
 * `f` runs on the calling thread, between sleeps of the backoff; `stats`, when given, is reset
 * and filled in. Thread-safety: safe to call concurrently (the jitter's random generator is per
 * thread); concurrent calls may share one policy.
 * @return what `f` returned.
 * @throws dblock::error the last attempt's error (its own code) when the policy is exhausted
 *         (attempts() and elapsed() set); errc::invalid_argument for a policy with
 *         max_attempts < 1; any non-retryable error of `f` as is. Anything else `f` (or
 *         on_retry) throws propagates as is, without a retry.
 */
template <class F>
auto retry(const retry_policy& policy, F&& f, retry_stats* stats = nullptr) -> decltype(f()) {
  using R = decltype(f());
  if constexpr (std::is_void_v<R>) {
    run_with_retry(
        policy, [&] { f(); }, stats);
  } else {
    std::optional<R> out;
    run_with_retry(
        policy, [&] { out.emplace(f()); }, stats);
    return std::move(*out);
  }
}

}  // namespace dblock
