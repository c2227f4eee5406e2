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
#include "dblock/deadline.hpp"
#include "dblock/error.hpp"

/// @file
/// @brief Lease locks: dblock::lease_lock, dblock::lease_guard and their options.

namespace dblock {

namespace detail {
struct lease_state;
class waiting_acquire;
class thread_check;
class acquire_call;
struct internal_name_t;
struct lease_access;
}  // namespace detail

/// How a lease is held (docs/session-leases.md).
enum class lease_mode {
  row,  ///< a row of the lock table (the default): durable, on every backend
  /**
   * A server session lock (PostgreSQL 14+ and MariaDB 10.3+, direct connections): one pooled
   * connection is pinned for the hold and its server session holds a session-level lock
   * (PostgreSQL's advisory lock, MariaDB's GET_LOCK); the fence comes from a sequence in the
   * same statement; the server ends the session, and so frees the lock, when it stays idle past
   * the TTL (MariaDB: the TTL rounded up to whole seconds); waits queue in the server in arrival
   * order. Refused with errc::invalid_argument on MySQL 8 (no SEQUENCE), Galera (GET_LOCK is
   * local to one node), SQLite and behind a transaction-mode pooler. Only a lease_lock is held
   * this way, chosen by its constructor (lease_lock(db, name, options, lease_mode::session)):
   * the other kinds (semaphore, rwlock, lock_set, election, run_once and the job runner) take
   * lease_options, which has no mode, so they cannot be asked for it.
   */
  session,
};

/// Settings of a lease lock; lease_lock's constructor checks them.
/// Thread-safety: a plain value.
struct lease_options {
  /// Lease length, judged by the database clock: 10 ms to one year.
  std::chrono::milliseconds ttl{std::chrono::seconds(30)};
  /// Subtracted from the local validity of a guard, in [0, ttl); default (zero) means ttl / 10
  /// (at least 1 ms). It absorbs clock-rate drift between this host and the database and
  /// scheduling delays.
  std::chrono::milliseconds safety_margin{0};
  /**
   * Renew automatically at ttl/3 while the guard lives. The leases of one database handle
   * share one watchdog: two threads, started with its first watched lease, renew every lease
   * that is due (and those due within ttl/6) in batches of up to 512 per write transaction,
   * and report each loss by its local validity (see on_lost), whatever the number of leases.
   * A lease whose row another transaction holds locked (its own fenced() write in progress) is
   * skipped and retried soon; it delays no other lease.
   */
  bool watchdog = false;
  /**
   * Called once per acquisition when it is first found lost: by the watchdog (lost, or not
   * renewed before its local validity ended), or by renew(), release() or fenced() on the
   * calling thread, or by a reentrant try_acquire() that finds the lease taken over. Runs on the
   * thread that found it; must not block for long; exceptions are swallowed.
   */
  std::function<void(const error&)> on_lost;
  /// Called when a guard's destructor (or move assignment) fails to release (those never
  /// throw), on that thread; when empty, the process-wide handler set by
  /// set_default_error_handler() is used. Exceptions are swallowed.
  std::function<void(const error&)> on_release_error;
  /// Polling of acquire(wait): first delay, cap, and growth; each sleep is drawn uniformly from
  /// [0, min(cap, initial * 2^attempt)] ("full jitter"). Must be above zero.
  std::chrono::milliseconds poll_initial{5};
  /// The cap of the polling delay (at least poll_initial); a poll also never sleeps past the
  /// holder's expiry or the end of the wait.
  std::chrono::milliseconds poll_max{std::chrono::seconds(1)};
  /**
   * Fair mode: acquire(wait) grants the lease in arrival order. Every waiting acquire has an
   * entry in the database's waiter queue (ordered by a ticket the database assigns; the entry is
   * itself a lease of `ttl`, refreshed while it waits, so a waiter that dies is skipped within
   * its TTL); in fair mode only the head of the queue may take the lease (the acquire statement
   * itself checks, so no wake-up can break the order), and a release wakes only the head.
   * try_acquire() and the first try of acquire() then take a free lease only when nobody is
   * queued (checked by the same statement). Holders that are not fair (other lock objects on the
   * same name without this option) can still take a free lease first. On PostgreSQL and SQLite
   * a fair holder that came through the queue hands the lease to a fair head of its own host in
   * the release itself (fence + 1; the head holds it without a statement of its own; a head handed
   * the lease that dies holds it until its TTL runs out; docs/waiting.md). Off by default: a
   * release still wakes one waiter (the longest waiting), but anyone may take the lease first.
   */
  bool fair = false;
};

/// Sets the process-wide handler for release failures in guard destructors (default: ignore);
/// an empty function restores the default. Used only by guards whose lease_options have no
/// on_release_error. Thread-safety: safe to call from any thread, also while guards are being
/// destroyed. Never throws.
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
 * handle): reentrancy is per object. Use separate objects, even with the same name, from
 * different threads, or share one dblock::lockable<lease_lock> (lockable.hpp), which threads
 * may share like a std::timed_mutex. A lease_lock used by two threads at once, or re-entered by
 * a thread other than the one holding its current acquisition, is refused with
 * errc::invalid_argument. Handing it from one thread to another between uses is fine, and
 * guards may be released from any thread.
 */
class lease_lock {
 public:
  /**
   * @brief A lock on `name` in `db`'s lease table; opens no connection.
   * @throws dblock::error errc::invalid_argument for a bad name (empty, over 255 bytes, a NUL
   *         byte or not valid UTF-8) or options: ttl outside 10 ms..1 year, safety_margin
   *         negative or not below ttl, poll_initial not above zero or above poll_max.
   */
  lease_lock(database db, std::string name, lease_options options = {});
  /**
   * @brief A lock on `name` whose leases are held as `mode` says: lease_mode::row is the
   * constructor above; lease_mode::session holds each lease by a server session lock
   * (docs/session-leases.md), where `ttl`, `safety_margin`, `watchdog`, `on_lost` and
   * `on_release_error` apply and the polling fields and `fair` do not (waiters queue in the
   * server, in arrival order). A name used in session mode stays in it: a lease of that name in
   * row mode is refused until leave_session_mode() (admin.hpp).
   * @throws dblock::error as the constructor above; where session mode cannot work (SQLite,
   *         MySQL 8, Galera, a transaction-mode pooler) the first acquire refuses it with
   *         errc::invalid_argument and the reason.
   */
  lease_lock(database db, std::string name, lease_options options, lease_mode mode);
  /// Destroys the handle only: guards it returned stay valid and release themselves. Never
  /// throws.
  ~lease_lock();
  /// Takes over `other` (and its current acquisition, for reentry); `other` must not be used
  /// afterwards except to be assigned to or destroyed.
  lease_lock(lease_lock&&) noexcept;
  /// Takes over `other` as the move constructor does; guards of this lock's earlier
  /// acquisitions stay valid.
  lease_lock& operator=(lease_lock&&) noexcept;

  /**
   * @brief One attempt; nothing when another owner holds an unexpired lease.
   *
   * When this object's current acquisition is still valid, the attempt re-enters it (the hold
   * count grows, the fence stays); if the row was taken over meanwhile, that acquisition is
   * marked lost (lease_options::on_lost) and a new one starts. With lease_options::watchdog it
   * hands the new acquisition to the database handle's watchdog (starting its threads on first
   * use).
   * @throws dblock::error on real failures: the @ref database_errors "database errors". A
   *         deadlock or busy error of the upsert itself is retried internally (9 attempts); when
   *         all fail, the last one's code (errc::deadlock, errc::serialization_failure or
   *         errc::lock_not_available) with attempts() > 0. If the connection breaks after the
   *         upsert was sent, the row is read back by owner token to resolve the outcome;
   *         errc::in_doubt only when even that read fails (the lease then expires on its own,
   *         nobody renews it).
   *         errc::invalid_argument when two threads use this object at once (see the class).
   * @throws std::system_error when the watchdog's threads cannot be started.
   */
  [[nodiscard]] std::optional<lease_guard> try_acquire();

  /// try_acquire() without exceptions: on a failure it returns nothing and sets `ec` to the
  /// error's code (docs/errors.md); otherwise it clears `ec`. Only std::bad_alloc escapes.
  [[nodiscard]] std::optional<lease_guard> try_acquire(std::error_code& ec);

  /**
   * @brief Waits up to `wait` (any std::chrono duration) for the lease: woken when it is
   *        released, polling as a safety net.
   *
   * The same as acquire_until(deadline_after(wait), cancel): `max()` waits for ever, zero or a
   * negative wait tries once.
   * @throws dblock::error as acquire_until().
   */
  template <class Rep, class Period>
  [[nodiscard]] lease_guard acquire(const std::chrono::duration<Rep, Period>& wait,
                                    const cancellation& cancel = cancellation());

  /**
   * @brief Waits until `deadline` for the lease: woken when it is released, polling as a safety
   *        net.
   *
   * Tries once; when the lease is held, the call enters the waiter queue (one row, deleted when
   * it acquires or gives up) and sleeps until a release wakes it (see docs/waiting.md: the
   * same process at once; other processes through PostgreSQL LISTEN/NOTIFY, on MySQL by a
   * `KILL QUERY` of the waiting handle's wake-up connection, through SQLite's doorbell
   * directory) or the holder's lease expires. Without a working
   * wake-up channel it polls with jittered exponential backoff (poll_initial .. poll_max),
   * reading the row (no write), never sleeping past the holder's expiry. A lost wake-up costs
   * latency only. With lease_options::fair the grants follow the queue order.
   * A deadline already past (or `steady_clock::now()`) tries once; `time_point::max()` waits
   * for ever. Other clocks' deadlines: deadline_from().
   * @throws dblock::error errc::timeout when the deadline passes (also when no pooled
   *         connection freed up before it), errc::cancelled when `cancel` fires, the errors of
   *         try_acquire(), and the @ref database_errors "database errors" of the polling reads.
   */
  [[nodiscard]] lease_guard acquire_until(steady_clock::time_point deadline,
                                          const cancellation& cancel = cancellation());

  /// The resource name.
  const std::string& name() const noexcept;
  /// The database handle.
  const database& db() const noexcept;
  /// The options, as checked (a zero safety_margin replaced by its default).
  const lease_options& options() const noexcept;
  /// How this lock holds its leases (its constructor's choice). Never throws.
  lease_mode mode() const noexcept;

 private:
  friend class detail::waiting_acquire;
  friend class detail::thread_check;
  friend struct detail::lease_access;  // the kinds' one gate (src/lease/lock_impl.hpp)
  /// A lock on one of dblock's internal lease names (a semaphore permit's, which users cannot
  /// name); otherwise as the public constructor.
  lease_lock(database db, std::string name, lease_options options, const detail::internal_name_t&);
  struct impl;
  std::unique_ptr<impl> impl_;
};

/**
 * @brief Proof of holding a lease: one hold of one acquisition.
 *
 * Move-only; a moved-from guard is disarmed. The destructor releases this hold and reports
 * failures to the error handler, never throwing. Thread-safety: a guard is used by one thread
 * at a time (it may be handed over between threads); the watchdog runs on the database handle's
 * renewal threads and shares only atomic state with it.
 */
class lease_guard {
 public:
  /// Takes over `other`'s hold; `other` is disarmed.
  lease_guard(lease_guard&&) noexcept;
  /// Releases this guard's hold, if any, as the destructor does (failures go to the error
  /// handler), then takes over `other`'s; `other` is disarmed.
  lease_guard& operator=(lease_guard&&) noexcept;
  lease_guard(const lease_guard&) = delete;
  lease_guard& operator=(const lease_guard&) = delete;
  /// Releases this hold as release() does; failures go to lease_options::on_release_error, or
  /// else to the handler of set_default_error_handler(). Never throws.
  ~lease_guard();

  /// Fencing token of this acquisition: strictly greater than every earlier one of the name
  /// (0 when disarmed).
  std::int64_t fence() const noexcept;
  /// 32 hex digits, new for every acquisition (reentrant holds share it); empty when disarmed.
  const std::string& owner_token() const noexcept;
  /// The resource name (empty when disarmed).
  const std::string& name() const noexcept;
  /// Holds of this acquisition still outstanding (reentrancy), counting this one (0 when
  /// disarmed).
  int hold_count() const noexcept;

  /// False once the lease is known lost or its conservative local validity has run out.
  bool valid() const noexcept;
  /// Conservative time left: counted on the local monotonic clock from when the last
  /// successful acquire or renew request was sent, minus the safety margin; zero when invalid.
  std::chrono::milliseconds remaining() const noexcept;
  /**
   * @brief The signal that this hold has ended, for the work holding it to watch.
   *
   * Fires when the lease is found lost (by the watchdog, renew(), fenced() or release()), when
   * its local validity runs out (the moment valid() turns false: another owner may get the
   * lease from then on), or when the hold is released (its last reentrant hold). Pass it to the
   * waits and loops of the guarded work, as a leadership's lost() (election.hpp):
   * `while (!lease.lost().cancelled()) step();` or `lease.lost().sleep_for(d)`. With the
   * watchdog the handle's watcher thread fires it; without it, the same thread watches the
   * validity from the first call on (a renew() that comes after it has fired does not undo it:
   * stop the work, and take a new lease). lease_options::on_lost is called as well, for a loss.
   * A disarmed guard's signal has fired. The returned handle shares the signal (copies are
   * cheap) and stays valid after the guard is released or gone.
   * @throws std::bad_alloc, or std::system_error when the handle's watcher thread cannot start.
   */
  cancellation lost() const;

  /**
   * @brief Extends the lease to `ttl` (default: the lock's ttl) from now on the database clock.
   *
   * Safe to repeat, also after a lost reply, and alongside the watchdog. A session lease
   * (lease_mode::session) is renewed by one statement on its holding session, for at most its
   * lock's ttl (the server's idle timeout was set at the grant).
   * @throws dblock::error errc::lease_lost when the lease expired or was taken over (the guard
   *         becomes invalid); errc::not_owner when the guard is disarmed; errc::deadlock,
   *         errc::serialization_failure or errc::lock_not_available when 3 attempts all met one
   *         (attempts() > 0); errc::invalid_argument
   *         for a ttl under 10 ms or not above the safety margin; the @ref database_errors
   *         "database errors", which leave validity unchanged (after errc::connection_lost the
   *         renewal may or may not have been applied).
   */
  void renew(std::optional<std::chrono::milliseconds> ttl = std::nullopt);

  /**
   * @brief Releases this hold now; the lease is freed when the last hold of the acquisition is
   *        released. Safe to retry after a lost reply: it matches on the owner token and never
   *        touches a successor's row. The guard is disarmed afterwards.
   * @throws dblock::error errc::lease_lost when the lease had already expired or been taken
   *         over; errc::not_owner when the guard is disarmed; errc::in_doubt when the connection
   *         broke and the outcome could not be resolved (the server session not confirmed ended,
   *         or the row not read back; the lease then expires on its own);
   *         errc::deadlock, errc::serialization_failure or errc::lock_not_available when 3
   *         attempts all met one (attempts() > 0); the @ref database_errors "database errors".
   *         The guard is disarmed also when this throws.
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
   *         broke during COMMIT, errc::not_owner when the guard is disarmed,
   *         errc::lock_not_available when the lease row or the database stays locked past the
   *         server's lock wait timeout (SQLite: busy timeout); database errors of `write`'s own
   *         statements are classified (for example errc::unique_violation), and so are the
   *         @ref database_errors "database errors"; anything else `write` throws is rethrown as
   *         is. The transaction is rolled back in every failing case. Nothing is retried.
   */
  void fenced(const std::function<void(soci::session&)>& write);

 private:
  friend class lease_lock;
  friend struct detail::lease_access;
  explicit lease_guard(std::shared_ptr<detail::lease_state> s);
  std::shared_ptr<detail::lease_state> state_;
};

template <class Rep, class Period>
lease_guard lease_lock::acquire(const std::chrono::duration<Rep, Period>& wait,
                                const cancellation& cancel) {
  return acquire_until(deadline_after(wait), cancel);
}

}  // namespace dblock
