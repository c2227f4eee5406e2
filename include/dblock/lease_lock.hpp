// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/error.hpp"

namespace dblock {

namespace detail {
struct lease_state;
}  // namespace detail

/// Settings of a lease lock.
struct lease_options {
  /// Lease length, judged by the database clock. Must be at least 10 ms.
  std::chrono::milliseconds ttl{std::chrono::seconds(30)};
  /// Subtracted from the local validity of a guard; default (zero) means ttl / 10. It absorbs
  /// clock-rate drift between this host and the database and scheduling delays.
  std::chrono::milliseconds safety_margin{0};
  /// Renew automatically at ttl/3 from a background thread while the guard lives.
  bool watchdog = false;
  /// Called (from the watchdog thread) once when the watchdog finds the lease lost or cannot
  /// renew it before its local validity ends. Must not block for long.
  std::function<void(const error&)> on_lost;
  /// Called when a guard's destructor fails to release (the destructor never throws); when
  /// empty, the process-wide handler set by set_default_error_handler() is used.
  std::function<void(const error&)> on_release_error;
  /// Polling of acquire(wait): first delay, cap, and growth; each sleep is drawn uniformly from
  /// [0, min(cap, initial * 2^attempt)] ("full jitter").
  std::chrono::milliseconds poll_initial{5};
  std::chrono::milliseconds poll_max{std::chrono::seconds(1)};
};

/// Sets the process-wide handler for release failures in guard destructors (default: ignore).
void set_default_error_handler(std::function<void(const error&)> handler);

class lease_guard;

/**
 * @brief A named lease lock stored in the `resource_lock` table.
 *
 * Acquire is one atomic upsert that takes the row when it is absent, expired or released (the
 * fencing token grows by one), or when this object already holds it (reentry: the hold count
 * grows, the fence stays). Expiry is decided by the database clock only (SQLite has no server:
 * there it is the calling process's clock, so all users of one SQLite file must share a host
 * clock).
 *
 * Resource names are 1..255 bytes of UTF-8, compared byte for byte; longer names are rejected.
 *
 * Thread-safety: one lease_lock object is for one thread at a time (like a reentrant mutex
 * handle); use separate objects, even with the same name, from different threads. Guards may be
 * released from any thread.
 */
class lease_lock {
 public:
  /// @throws dblock::error errc::invalid_argument for a bad name or options.
  lease_lock(database db, std::string name, lease_options options = {});
  ~lease_lock();
  lease_lock(lease_lock&&) noexcept;
  lease_lock& operator=(lease_lock&&) noexcept;

  /**
   * @brief One attempt; nothing when another owner holds an unexpired lease.
   * @throws dblock::error on real failures (connection, schema_missing, ...). A deadlock or
   *         busy error of the upsert itself is retried internally. If the connection breaks
   *         after the upsert was sent, the row is read back by owner token to resolve the
   *         outcome; errc::in_doubt only when even that read fails (the lease then expires on its
   *         own, nobody renews it).
   */
  [[nodiscard]] std::optional<lease_guard> try_acquire();

  /**
   * @brief Waits up to `wait` for the lease, polling with jittered exponential backoff.
   *
   * While the lease is held, polls read the row (no write) and sleep until at most its expiry.
   * @throws dblock::error errc::timeout when `wait` runs out, errc::cancelled when `cancel`
   *         fires, and the errors of try_acquire().
   */
  [[nodiscard]] lease_guard acquire(std::chrono::milliseconds wait,
                                    const cancellation& cancel = cancellation());

  /// The resource name.
  const std::string& name() const noexcept;
  /// The database handle.
  const database& db() const noexcept;
  /// The options.
  const lease_options& options() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/**
 * @brief Proof of holding a lease: one hold of one acquisition.
 *
 * Move-only; a moved-from guard is disarmed. The destructor releases this hold and reports
 * failures to the error handler, never throwing. Thread-safety: a guard is used by one thread
 * at a time; the watchdog runs on its own thread and shares only atomic state with it.
 */
class lease_guard {
 public:
  lease_guard(lease_guard&&) noexcept;
  lease_guard& operator=(lease_guard&&) noexcept;
  lease_guard(const lease_guard&) = delete;
  lease_guard& operator=(const lease_guard&) = delete;
  ~lease_guard();

  /// Fencing token of this acquisition: strictly greater than every earlier one of the name.
  std::int64_t fence() const noexcept;
  /// 32 hex digits, new for every acquisition (reentrant holds share it).
  const std::string& owner_token() const noexcept;
  /// The resource name.
  const std::string& name() const noexcept;
  /// Holds of this acquisition still outstanding (reentrancy), counting this one.
  int hold_count() const noexcept;

  /// False once the lease is known lost or its conservative local validity has run out.
  bool valid() const noexcept;
  /// Conservative time left: counted on the local monotonic clock from when the last
  /// successful acquire or renew request was sent, minus the safety margin; zero when invalid.
  std::chrono::milliseconds remaining() const noexcept;

  /**
   * @brief Extends the lease to `ttl` (default: the lock's ttl) from now on the database clock.
   * @throws dblock::error errc::lease_lost when the lease expired or was taken over (the guard
   *         becomes invalid); connection errors leave validity unchanged.
   */
  void renew(std::optional<std::chrono::milliseconds> ttl = std::nullopt);

  /**
   * @brief Releases this hold now; the lease is freed when the last hold of the acquisition is
   *        released. Safe to retry after a lost reply: it matches on the owner token and never
   *        touches a successor's row. The guard is disarmed afterwards.
   * @throws dblock::error errc::lease_lost when the lease had already expired or been taken
   *         over; errc::not_owner when the guard is disarmed.
   */
  void release();

  /**
   * @brief Runs `write` in one transaction that first locks the lease row and checks that it
   *        still carries our owner token and fence and has not expired.
   *
   * A holder that paused past its TTL cannot commit: either the check fails (errc::lease_lost,
   * nothing written) or the row lock keeps any successor waiting until our commit. The lock row
   * and the data must live in the same database. On SQLite the transaction is BEGIN IMMEDIATE.
   * @throws dblock::error errc::lease_lost (rolled back), errc::in_doubt when the connection
   *         broke during COMMIT; database errors of `write`'s own statements are classified
   *         (for example errc::unique_violation); anything else `write` throws is rethrown as is.
   *         The transaction is rolled back in every failing case.
   */
  void fenced(const std::function<void(soci::session&)>& write);

 private:
  friend class lease_lock;
  explicit lease_guard(std::shared_ptr<detail::lease_state> s);
  std::shared_ptr<detail::lease_state> state_;
};

}  // namespace dblock
