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
/// @brief Read-write locks (dblock::rwlock): many readers or one writer, writers first.

namespace dblock {

/// How many readers one read-write lock admits at once.
inline constexpr int max_rwlock_readers = 128;

/**
 * @brief A named read-write lock: many readers at once, or one writer; a waiting writer holds
 *        back new readers.
 *
 * The writer's lease is the lease row `name` itself, so its fencing token grows on every write
 * acquisition and `dblock exec --lock NAME` is a writer. Each reader holds a lease of its own on
 * one of max_rwlock_readers internal reader rows (`name` U+FFFF "R" U+FFFF k, shown by
 * `dblock status` as `NAME [reader k]`), a permit of an internal semaphore. Readers and writers
 * each announce themselves first (a committed lease) and then look for the other side:
 *
 * - a reader takes a reader row, then reads the writer row; when a writer holds it (or waits,
 *   see below) the reader gives its row back and is not admitted;
 * - a writer takes the writer row (lease_lock, with its queue and wake-ups), then waits until no
 *   reader row is held (readers already in finish, or expire), in the readers' queue, which
 *   each reader's release rings; only then is it admitted.
 *
 * Because each side commits its announcement before it reads the other's, at least one of them
 * sees the other, so a reader and a writer are never admitted together. A writer holds the
 * writer row while it waits for readers to leave, so new readers are held back from that moment
 * on: writers are not starved by a stream of readers; a writer waits at most for the readers
 * already in (their hold, or their TTL if they died).
 *
 * A plain lease_lock on `name` takes the same writer row and so holds back new readers, but it
 * does not wait for readers already in: writers should use acquire() or try_acquire(). There is no
 * upgrade: a thread holding a read lock that asks for the write lock waits for itself until its
 * wait runs out. Reader and writer guards are lease_guards (watchdog, fenced(), release()).
 *
 * Names are 1..255 bytes of valid UTF-8 without NUL or U+FFFF, as for lease_lock; readers need
 * a name of at most 245 bytes (their rows add a suffix), so a longer name is a writer-only lock.
 * Thread-safety: like lease_lock, one rwlock object is for one thread at a time (threads may share
 * a dblock::shared_lockable over it, lockable.hpp); guards may be released from any thread.
 */
class rwlock {
 public:
  /**
   * @brief The read-write lock `name` in `db`; opens no connection.
   * @param db the database holding the lock table.
   * @param name the lock's name (the writer's lease row).
   * @param options the lease of readers and writers (ttl, watchdog, on_lost, polling; `fair`
   *        orders readers and writers together: both wait in the writer's queue).
   * @throws dblock::error errc::invalid_argument for a bad name or options lease_lock refuses.
   */
  rwlock(database db, std::string name, lease_options options = {});
  /// Destroys the handle only: guards it returned stay valid and release themselves.
  ~rwlock();
  /// Takes over `other`; `other` must not be used afterwards except to be assigned or destroyed.
  rwlock(rwlock&&) noexcept;
  /// Takes over `other` as the move constructor does.
  rwlock& operator=(rwlock&&) noexcept;

  /**
   * @brief One attempt to read: a reader lease, or nothing while a writer holds or waits (or all
   *        max_rwlock_readers reader rows are held; fair: or anybody waits in the lock's queue).
   * @throws dblock::error errc::invalid_argument for a name over 245 bytes (no reader rows),
   *         semaphore::try_acquire()'s errors and the @ref database_errors "database errors" of
   *         the read of the writer row.
   */
  [[nodiscard]] std::optional<lease_guard> try_acquire_shared();
  /// try_acquire_shared() without exceptions: on a failure it returns nothing and sets `ec` to the
  /// error's code (docs/errors.md); otherwise it clears `ec`. Only std::bad_alloc escapes.
  [[nodiscard]] std::optional<lease_guard> try_acquire_shared(std::error_code& ec);
  /**
   * @brief Waits up to `wait` (any std::chrono duration; `max()` for ever, zero or negative:
   *        one try) to read: acquire_shared_until(deadline_after(wait), cancel).
   * @throws dblock::error as acquire_shared_until().
   */
  template <class Rep, class Period>
  [[nodiscard]] lease_guard acquire_shared(const std::chrono::duration<Rep, Period>& wait,
                                           const cancellation& cancel = cancellation()) {
    return acquire_shared_until(deadline_after(wait), cancel);
  }
  /**
   * @brief Waits until `deadline` to read, in the writer's queue: the writer's release rings the
   *        first waiting reader, which rings the next (docs/waiting.md); as the safety net it
   *        looks again at the writer's expiry or at lease_options::poll_max.
   * @param deadline when to give up (in the past: one try).
   * @param cancel stops the wait (errc::cancelled).
   * @throws dblock::error errc::timeout, errc::cancelled, and the errors of
   *         try_acquire_shared().
   */
  [[nodiscard]] lease_guard acquire_shared_until(steady_clock::time_point deadline,
                                                 const cancellation& cancel = cancellation());

  /**
   * @brief One attempt to write: the writer lease, or nothing when another writer holds it or
   *        any reader is in (the writer row is given back at once then).
   * @throws dblock::error lease_lock::try_acquire()'s errors and the @ref database_errors
   *         "database errors" of the read of reader rows.
   */
  [[nodiscard]] std::optional<lease_guard> try_acquire();
  /// try_acquire() without exceptions: on a failure it returns nothing and sets `ec` to the error's
  /// code (docs/errors.md); otherwise it clears `ec`. Only std::bad_alloc escapes.
  [[nodiscard]] std::optional<lease_guard> try_acquire(std::error_code& ec);
  /**
   * @brief Waits up to `wait` (any std::chrono duration; `max()` for ever, zero or negative:
   *        one try) to write: acquire_until(deadline_after(wait), cancel).
   * @throws dblock::error as acquire_until().
   */
  template <class Rep, class Period>
  [[nodiscard]] lease_guard acquire(const std::chrono::duration<Rep, Period>& wait,
                                    const cancellation& cancel = cancellation()) {
    return acquire_until(deadline_after(wait), cancel);
  }
  /**
   * @brief Waits until `deadline` to write: takes the writer row (holding back new readers),
   *        then waits for the readers already in to leave.
   * @param deadline when the whole acquisition gives up (in the past: one try).
   * @param cancel stops the wait (errc::cancelled).
   * @throws dblock::error errc::timeout (saying whether readers were still in), errc::cancelled,
   *         and lease_lock::acquire_until()'s errors; the writer row is given back first.
   */
  [[nodiscard]] lease_guard acquire_until(steady_clock::time_point deadline,
                                          const cancellation& cancel = cancellation());

  /// The lock's name.
  const std::string& name() const noexcept;
  /// The lock name and reader slot of a reader's lease name; nothing for any other name.
  static std::optional<std::pair<std::string, int>> reader_of(const std::string& lease_name);
  /// The lease name of reader slot `slot` of lock `name` (for force_release()).
  /// @throws dblock::error errc::invalid_argument for a bad name or a slot outside
  /// 0..max_rwlock_readers-1.
  static std::string reader_lease_name(const std::string& name, int slot);

 private:
  /// One reader's try; `token` is a waiting reader's owner token (empty: a try of its own).
  std::optional<lease_guard> try_shared(const std::string& token);
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
