// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/lease_lock.hpp"

/// @file
/// @brief Semaphores (dblock::semaphore): N permits of one name, each held permit a lease.

namespace dblock {

/// The most permits a semaphore may be declared with.
inline constexpr int max_semaphore_permits = 1000;

/**
 * @brief A named semaphore of N permits, each held permit a lease of its own.
 *
 * Permit k of semaphore S is the lease row "S" U+FFFF "k" of the lock table (U+FFFF is refused
 * in the names users give, so a permit never shares a row with a lock). A held permit is
 * therefore a lease_guard like any other: its own owner token, a fencing token that only grows
 * (per permit slot), a TTL judged by the database clock, lease_options::watchdog, fenced()
 * writes, release(), the reaper, list_locks() and force_release() all work as for lease_lock.
 * A permit whose holder dies comes back when its lease expires.
 *
 * The number of permits is declared in the `semaphore` table the first time a semaphore is used
 * (whoever comes first) and checked on every later first use: a semaphore object with another
 * count is refused with errc::invalid_argument, never resized silently. There is no resize
 * operation yet: to change N, stop every user and delete the name's row from that table.
 *
 * One try first probes a random permit slot (one statement, the lease upsert); when that slot is
 * held it reads which slots are held (one statement) and tries the free ones in random order, so
 * with a free permit a try costs one round trip. Once a read found at least half the permits
 * held, the object reads first on its next try (two statements, not three) until a read finds
 * most of them free again. acquire(wait) waits as a lease does (docs/waiting.md): the waiter
 * joins the semaphore's queue (the name "S" U+FFFF "Q", which no lease row has) and the release
 * of any permit rings its head, one waiter per release, in other processes too; as the safety
 * net it looks again at the earliest expiry of a held permit or at lease_options::poll_max. With
 * lease_options::fair permits go to waiters in arrival order: a try takes a permit only when
 * nobody waits ahead of it in the queue (one more read per try).
 *
 * Names are 1..249 bytes of valid UTF-8 without NUL or U+FFFF (the permit's suffix takes the
 * rest of the lock table's 255 bytes).
 *
 * Thread-safety: like lease_lock, one semaphore object is for one thread at a time (threads may
 * share a dblock::lockable over it, lockable.hpp); use one object per thread (all may share the
 * name and the database handle). Guards may be released from any thread.
 */
class semaphore {
 public:
  /**
   * @brief The semaphore `name` of `permits` permits in `db`; opens no connection (the count is
   *        declared or checked on the first try).
   * @param db the database holding the lock table and the `semaphore` table.
   * @param name the semaphore's name, shared by every user of it.
   * @param permits how many holders at once (N); every user of the name must give the same.
   * @param options the lease of every permit (ttl, watchdog, on_lost, polling), and `fair`: the
   *        waiters' order.
   * @throws dblock::error errc::invalid_argument for a bad name (empty, over 249 bytes, a NUL
   *         byte, U+FFFF or not valid UTF-8), `permits` outside 1..max_semaphore_permits, or
   *         options lease_lock refuses.
   */
  semaphore(database db, std::string name, int permits, lease_options options = {});
  /// Destroys the handle only: permits it returned stay valid and release themselves.
  ~semaphore();
  /// Takes over `other`; `other` must not be used afterwards except to be assigned or destroyed.
  semaphore(semaphore&&) noexcept;
  /// Takes over `other` as the move constructor does.
  semaphore& operator=(semaphore&&) noexcept;

  /**
   * @brief One attempt: a permit, or nothing when all N are held (fair: also when anybody waits
   *        in the semaphore's queue).
   * @throws dblock::error errc::invalid_argument when the semaphore was declared with another
   *         count (the message names both), lease_lock::try_acquire()'s errors, and the
   *         @ref database_errors "database errors" of the declaration and of the read of held
   *         permits.
   */
  [[nodiscard]] std::optional<lease_guard> try_acquire();
  /// try_acquire() without exceptions: on a failure it returns nothing and sets `ec` to the error's
  /// code (docs/errors.md); otherwise it clears `ec`. Only std::bad_alloc escapes.
  [[nodiscard]] std::optional<lease_guard> try_acquire(std::error_code& ec);

  /**
   * @brief Waits up to `wait` (any std::chrono duration; `max()` for ever, zero or negative:
   *        one try) for a permit: acquire_until(deadline_after(wait), cancel).
   * @throws dblock::error as acquire_until().
   */
  template <class Rep, class Period>
  [[nodiscard]] lease_guard acquire(const std::chrono::duration<Rep, Period>& wait,
                                    const cancellation& cancel = cancellation()) {
    return acquire_until(deadline_after(wait), cancel);
  }

  /**
   * @brief Waits until `deadline` for a permit, in the semaphore's queue (see the class comment).
   * @throws dblock::error errc::timeout when the deadline passes, errc::cancelled when `cancel`
   *         fires, and the errors of try_acquire().
   */
  [[nodiscard]] lease_guard acquire_until(steady_clock::time_point deadline,
                                          const cancellation& cancel = cancellation());

  /// The semaphore's name.
  const std::string& name() const noexcept;
  /// The number of permits this object was made with.
  int permits() const noexcept;
  /// The permit slot of a guard this class returned (0..permits-1), or -1 for any other guard.
  static int permit_slot(const lease_guard& g);
  /// The lease name of permit `slot` of semaphore `name` (as list_locks() shows it, and for
  /// force_release()). @throws dblock::error errc::invalid_argument for a bad name or a slot
  /// outside 0..max_semaphore_permits-1.
  static std::string permit_lease_name(const std::string& name, int slot);
  /// The semaphore name and permit slot of a permit's lease name; nothing for any other name.
  static std::optional<std::pair<std::string, int>> permit_of(const std::string& lease_name);
  /// The semaphore whose waiters queue under `name` (list_locks() lists such a queue as a free
  /// row with its waiters: the name adds U+FFFF "Q" to the semaphore's); nothing for any other
  /// name.
  static std::optional<std::string> queue_of(const std::string& name);

 private:
  friend class rwlock;
  /// A semaphore on one of dblock's internal names (a read-write lock's readers, which users
  /// cannot name); otherwise as the public constructor.
  semaphore(database db, std::string name, int permits, lease_options options,
            const detail::internal_name_t&);
  /// How many permits are held now (one read), and microseconds until the first of them
  /// expires (-1: none held).
  std::pair<int, long long> held_now();
  /// One try of the permits (try_acquire() without its report to the listener), with a waiter's
  /// owner token and queue ticket (an empty token: a new one per try, no queue entry).
  std::optional<lease_guard> try_slots(const std::string& token, std::int64_t ticket);
  /// The queue its waiters join (a read-write lock's writer waits there for readers to leave).
  const std::string& queue_name() const noexcept;
  /// acquire_until()'s wait, reported through `call`.
  lease_guard wait_until(detail::acquire_call& call, steady_clock::time_point deadline,
                         const cancellation& cancel);
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
