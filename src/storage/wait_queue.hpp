// Internal: typed operations on the queue of waiters (<prefix>lock_waiter). Every waiting
// acquire has an entry, itself a lease (refreshed while it waits, skipped once expired); the
// ticket the database assigns orders the queue. Fair waiters take the lease only at the head;
// wake-ups name the head (PostgreSQL's release statement) so that only that waiter is woken.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "storage/lock_table.hpp"
#include "storage/session.hpp"

namespace dblock::detail::wait_queue {

/// The lock row as a waiter sees it, and the head of the live queue.
struct wait_state {
  bool exists = false;
  int hold_count = 0;
  std::int64_t expires_us = 0, now_us = 0;
  std::optional<std::int64_t> head;  ///< lowest live ticket (the last holder's entry excluded)
  std::int64_t fence = 0;            ///< the row's fence: a new holder has a new one
  bool mine = false;                 ///< held by the reader's token: handed over in a release
  bool free() const { return !exists || hold_count == 0 || expires_us <= now_us; }
};

/// A live queue entry, for status.
struct entry_info {
  std::string name;
  std::int64_t ticket = 0;
  std::string host;
  std::int64_t pid = 0;
  std::int64_t enqueued_us = 0, now_us = 0;
};

/// Adds an entry expiring `ttl_us` from now on the database clock; returns its ticket. `bell`
/// is the wake-up address of the waiter's database handle where the backend rings one
/// (bell_channel::address(); empty elsewhere).
/// `grant_ttl_us` > 0: the release may hand the lease to this entry with that TTL
/// (lock_statements::release_granting; fair waiters).
std::int64_t enqueue(session_scope&, const std::string& name, const std::string& token,
                     std::int64_t ttl_us, const std::string& host, std::int64_t pid,
                     const std::string& bell, std::int64_t grant_ttl_us = 0);
/// The ticket of `token`'s entry in `name`'s queue, expired or not; nullopt when it has none
/// (to resolve an enqueue whose reply was lost).
std::optional<std::int64_t> find(session_scope&, const std::string& name, const std::string& token);
/// Extends an entry; false when it is gone (reaped after expiring).
bool refresh(session_scope&, std::int64_t ticket, const std::string& token, std::int64_t ttl_us);
/// Deletes an entry (no error when already gone); false when it was gone already (reaped, or
/// deleted by a release that handed the lease to it).
bool dequeue(session_scope&, std::int64_t ticket, const std::string& token);
/// dequeue() in a session of its own, tried again after a deadlock, a busy or lock-timeout
/// error or a broken connection (up to 3 tries, none started more than 1 s after the first;
/// deleting twice is harmless, and an entry deleted by a try whose reply was lost reads as
/// already gone). `what` names it in errors.
/// @throws dblock::error the last try's.
bool dequeue_retried(const std::shared_ptr<database_impl>& db, const std::string& what,
                     std::int64_t ticket, const std::string& token);
/// Reads the lock row of `name` and the head of its queue; `mine` when `token` holds it.
wait_state read(session_scope&, const std::string& name, const std::string& token);
/// The head of a queue: its owner token and its entry's wake-up address (bell_channel::address();
/// empty: none). Both empty when nobody waits.
struct queue_head {
  std::string token, bell;
};
/// The head of `name`'s live queue, the releaser's own entry (`token`) excluded.
queue_head head_of(session_scope&, const std::string& name, const std::string& token);
/// The lowest live ticket of `name`'s queue (a holder's own entries excluded); nullopt when
/// nobody waits.
std::optional<std::int64_t> first_ticket(session_scope&, const std::string& name);
/// A ticket above every entry's: with it, acquire_dequeue() in order takes a free lease only
/// when nobody waits in its queue, and deletes no entry (a fair try before queueing).
constexpr std::int64_t behind_everyone = INT64_MAX;
/// The lease acquire that also deletes entry `ticket` when it acquires (one statement where the
/// dialect can, two in one write transaction where that is cheap), or, where exit_deferred(),
/// the acquire alone: the entry is then deleted off the acquire's path (deferred_exit).
/// `in_order` (fair waiters): a free lease is taken only when no live entry below `ticket`
/// waits, the holder's own excluded (vocabulary::lease_acquire), in the same statement.
std::optional<std::int64_t> acquire_dequeue(session_scope&, const acquire_params&,
                                            std::int64_t ticket, bool in_order);
/// True when the dialect's acquire cannot delete the queue entry within its own write (MySQL:
/// it would be a second autocommit write, a round trip and a log flush on the handoff's path).
/// The waiter that took the lease then leaves the queue through a deferred_exit.
bool exit_deferred(const database_impl&);

/**
 * The queue entry of a waiter that took the lease, to be deleted during the hold: the handle's
 * renewer thread deletes it soon after the acquire, and the release finishes it before it frees
 * the lease (deleting it itself when the thread has not got to it or failed), so that the entry
 * does not head the queue under the next holder. (Until then the queue's reads skip it: they
 * exclude the holder's own entries.) Thread-safe.
 */
class deferred_exit {
 public:
  deferred_exit(std::string name, std::int64_t ticket, std::string token)
      : name_(std::move(name)), ticket_(ticket), token_(std::move(token)) {}
  /**
   * Deletes the entry (deadlocks and lock timeouts retried briefly) unless that is done. When
   * another thread is deleting it, waits for that up to `wait`, and when that ended in failure
   * or is still running and `last` is set, deletes it too (deleting twice is harmless). A failed
   * deletion stays to do unless `last`. Never throws: a failure is logged to the listener, and
   * the entry, no longer refreshed, expires within the lease TTL.
   */
  void finish(const std::shared_ptr<database_impl>& db, std::chrono::milliseconds wait,
              bool last) noexcept;

 private:
  enum class stage { queued, running, done };
  bool remove(const std::shared_ptr<database_impl>& db, bool last) noexcept;

  const std::string name_;
  const std::int64_t ticket_;
  const std::string token_;
  std::mutex mu_;
  std::condition_variable cv_;
  stage stage_ = stage::queued;
};

/// Live entries, by name and ticket.
std::vector<entry_info> list(session_scope&);
/// Deletes entries expired longer than `retention` ago; returns how many.
std::uint64_t reap(session_scope&, std::chrono::milliseconds retention);

}  // namespace dblock::detail::wait_queue
