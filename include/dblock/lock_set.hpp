// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/lease_lock.hpp"

namespace soci {
class session;
}

/// @file
/// @brief Lock sets (dblock::lock_set): several leases taken all or nothing, in one global order.

namespace dblock {

/// The most names one lock set may hold.
inline constexpr std::size_t max_lock_set_names = 1000;

/**
 * @brief Every lease of a lock_set, held together: one hold per name, released together.
 *
 * Move-only; a moved-from guard is disarmed. The destructor releases every lease (in the
 * reverse of the acquisition order) and reports failures to each lease's error handler
 * (lease_options::on_release_error or set_default_error_handler()), never throwing.
 */
class lock_set_guard {
 public:
  /// Takes over `other`'s leases; `other` is disarmed.
  lock_set_guard(lock_set_guard&&) noexcept;
  /// Releases this guard's leases, as the destructor does, then takes over `other`'s.
  lock_set_guard& operator=(lock_set_guard&&) noexcept;
  lock_set_guard(const lock_set_guard&) = delete;
  lock_set_guard& operator=(const lock_set_guard&) = delete;
  /// Releases every lease as release() does; failures go to the error handlers. Never throws.
  ~lock_set_guard();

  /// How many leases the guard holds (0 when disarmed).
  std::size_t size() const noexcept;
  /// The held leases, in the set's order (lock_set::names()).
  const std::vector<lease_guard>& leases() const noexcept;
  /**
   * @brief The lease held on `name`.
   * @throws dblock::error errc::invalid_argument when `name` is not in the set.
   */
  const lease_guard& lease(const std::string& name) const;
  /**
   * @brief The fencing token of the lease on `name`: each name has its own, which only grows.
   * @throws dblock::error errc::invalid_argument when `name` is not in the set.
   */
  std::int64_t fence(const std::string& name) const;
  /// True while every lease is valid (lease_guard::valid()); false when disarmed.
  bool valid() const noexcept;
  /// Fires when the first lease of the set ends (lease_guard::lost(): lost, its local validity
  /// ran out, released): the set is no longer held whole. A disarmed set's signal has fired. The
  /// returned handle shares the signal and stays valid after the set is released or gone.
  /// @throws std::bad_alloc, or std::system_error when the handle's watcher thread cannot start.
  cancellation lost() const;
  /// The least time left of any lease (lease_guard::remaining()); zero when disarmed.
  std::chrono::milliseconds remaining() const noexcept;

  /**
   * @brief Releases every lease, in the reverse of the acquisition order. Each release is
   *        attempted even when an earlier one fails; the guard is disarmed afterwards.
   * @throws dblock::error the first failure (lease_guard::release()'s errors: errc::lease_lost,
   *         errc::in_doubt and the @ref database_errors "database errors"), after every lease
   *         was attempted; errc::not_owner when the guard is disarmed.
   */
  void release();

  /**
   * @brief Runs `write` in one transaction that first locks every lease row of the set (in the
   *        set's order, so two sets' fenced writes cannot deadlock) and checks that each still
   *        carries our owner token and fence and has not expired.
   *
   * As lease_guard::fenced() for several leases at once: either every lease is still ours at
   * the COMMIT, or nothing is written. A lease found lost is marked lost
   * (lease_options::on_lost) and the call throws errc::lease_lost naming it.
   * @param write the caller's statements, run on the transaction's session.
   * @throws dblock::error the errors of lease_guard::fenced(); errc::not_owner when the guard is
   *         disarmed.
   */
  void fenced(const std::function<void(soci::session&)>& write);

 private:
  friend class lock_set;
  lock_set_guard(std::vector<lease_guard> leases, std::vector<std::string> names);
  void release_all_quietly() noexcept;
  std::vector<lease_guard> leases_;
  std::vector<std::string> names_;
  mutable cancellation lost_;       // lost(): fired by the first member whose hold ends
  mutable bool lost_tied_ = false;  // the members fire lost_ (the first lost() call tied them)
};

/**
 * @brief Several named leases taken all or nothing.
 *
 * The names are deduplicated and sorted by their bytes, and every set takes its leases in that
 * order, holding the earlier ones while it waits for a later one. Two sets that overlap
 * therefore never wait for each other in a cycle: no deadlock, however the callers listed the
 * names. Each name is an ordinary lease (lease_lock) in the lock table, with its own owner token
 * and its own fencing token; status listings, force_release(), the reaper and `dblock status`
 * see them as such. A lock set and a lease_lock on one of its names exclude each other.
 *
 * All or nothing: when a try finds a name held, or a wait runs out, is cancelled or fails, the
 * leases taken so far are released before the call returns or throws. When a lease taken early
 * has become invalid by the time the last one is taken (no watchdog and a long wait), all are
 * released and the set starts again (acquire) or reports nothing (try_acquire).
 *
 * Thread-safety: like lease_lock, one lock_set object is for one thread at a time (threads may
 * share a dblock::lockable over it, lockable.hpp); guards may be released from any thread.
 */
class lock_set {
 public:
  /**
   * @brief A set of leases on `names` in `db`; opens no connection.
   * @param db the database holding the lock table.
   * @param names the resource names (1..max_lock_set_names after removing duplicates; each as
   *        lease_lock accepts it).
   * @param options the lease of every name (ttl, watchdog, on_lost, polling, fair).
   * @throws dblock::error errc::invalid_argument for no names, too many, a name lease_lock
   *         refuses (the message names it), or options lease_lock refuses.
   */
  lock_set(database db, std::vector<std::string> names, lease_options options = {});
  /// Destroys the handle only: guards it returned stay valid and release themselves.
  ~lock_set();
  /// Takes over `other`; `other` must not be used afterwards except to be assigned or destroyed.
  lock_set(lock_set&&) noexcept;
  /// Takes over `other` as the move constructor does.
  lock_set& operator=(lock_set&&) noexcept;

  /**
   * @brief One try of each name in order; every lease, or nothing (the leases already taken are
   *        released) as soon as one name is held by another owner.
   * @throws dblock::error lease_lock::try_acquire()'s errors (the leases already taken are
   *         released first).
   */
  [[nodiscard]] std::optional<lock_set_guard> try_acquire();
  /// try_acquire() without exceptions: on a failure it returns nothing and sets `ec` to the error's
  /// code (docs/errors.md); otherwise it clears `ec`. Only std::bad_alloc escapes.
  [[nodiscard]] std::optional<lock_set_guard> try_acquire(std::error_code& ec);

  /**
   * @brief Waits up to `wait` in all (any std::chrono duration; `max()` for ever, zero or
   *        negative: one try) for every lease: acquire_until(deadline_after(wait), cancel).
   * @throws dblock::error as acquire_until().
   */
  template <class Rep, class Period>
  [[nodiscard]] lock_set_guard acquire(const std::chrono::duration<Rep, Period>& wait,
                                       const cancellation& cancel = cancellation()) {
    return acquire_until(deadline_after(wait), cancel);
  }

  /**
   * @brief Waits until `deadline` for every lease, taking them in order
   *        (lease_lock::acquire_until() for each).
   * @param deadline when the whole set gives up (in the past: one try of each name).
   * @param cancel stops the wait (errc::cancelled).
   * @throws dblock::error errc::timeout (naming the name that stayed held) when the deadline
   *         passes, errc::cancelled when `cancel` fires, and lease_lock::acquire_until()'s
   *         errors; the leases already taken are released first.
   */
  [[nodiscard]] lock_set_guard acquire_until(steady_clock::time_point deadline,
                                             const cancellation& cancel = cancellation());

  /// The names, deduplicated and in acquisition order (sorted by their bytes).
  const std::vector<std::string>& names() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
