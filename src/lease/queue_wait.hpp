// Internal: the waiting engine of the kinds that wait for something other than one free lease row
// (a semaphore's permits, a read-write lock's readers and its writer's drain). The waiter joins
// the same queue of waiters as a lease's (storage/wait_queue), is woken by the same release path
// (wake/ring, wake/hub: the release of a permit rings the head of its semaphore's queue) and
// polls with the same backoff, bounded by the holder's expiry, as the safety net. Fair mode: a
// waiter tries only when nobody queued before it still waits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dblock/cancellation.hpp"
#include "dblock/lease_lock.hpp"
#include "lease/state.hpp"
#include "storage/deadline.hpp"

namespace dblock::detail {

class hub_entry;
struct database_impl;

/**
 * One waiting call. The caller's try is `attempt(ticket, limit_us)`: true when it got what it
 * waits for. `ticket` is the waiter's queue entry (0 before it joined the queue; a try that
 * deletes the entry itself, as a permit's acquire does, calls entry_deleted()); `limit_us` is
 * set to the microseconds until the holder it waits for expires (-1: unknown), the bound of the
 * next sleep. The waiter's owner token (token()) is the one its acquires must use: a release by
 * a holder with that token skips the holder's own entry when it looks for the head.
 */
class queue_wait {
 public:
  using attempt_fn = std::function<bool(std::int64_t ticket, long long& limit_us)>;
  /// Waits in `queue` (a queue-only name, dialect/doorbell.hpp, or a lease's own name) until
  /// `deadline`; `what` names the call in errors ("acquire a permit of semaphore 'x'").
  queue_wait(std::shared_ptr<database_impl> db, std::string queue, std::string what,
             const lease_options& options, steady::time_point deadline, const cancellation& cancel);
  ~queue_wait();
  queue_wait(const queue_wait&) = delete;
  queue_wait& operator=(const queue_wait&) = delete;

  /// Tries, joins the queue when the try fails, and tries again when rung (or at the safety
  /// net) until `attempt` succeeds. `on_wait` runs once, when the first try failed.
  /// @throws dblock::error errc::timeout (the message says `timeout_text` and the wait; the
  ///         caller may change the string it passed from its `attempt`), errc::cancelled,
  ///         and the errors of `attempt` and of the queue's statements.
  void run(const attempt_fn& attempt, const std::function<void()>& on_wait,
           const std::string& timeout_text);

  /// The waiter's owner token.
  const std::string& token() const { return token_; }
  /// The try that succeeded deleted the queue entry itself.
  void entry_deleted() { ticket_ = 0; }
  /// The lowest live ticket of `queue` (the lease holder's own entries excluded); nothing when
  /// nobody waits. A fair try goes only when nobody is ahead of it.
  static std::optional<std::int64_t> first_ticket(const std::shared_ptr<database_impl>& db,
                                                  const std::string& queue,
                                                  const std::string& what);
  /// Rings the head of `queue` now (a reader that got in lets the next waiter of its writer's
  /// queue look: readers share).
  static void ring_head(const std::shared_ptr<database_impl>& db, const std::string& queue,
                        const std::string& token);

 private:
  void run_once(const attempt_fn& attempt, const std::function<void()>& on_wait,
                const std::string& timeout_text);
  bool at_front();
  void enqueue();
  void refresh();
  void leave() noexcept;
  std::int64_t ttl_us() const;
  std::chrono::nanoseconds bounded(std::chrono::nanoseconds d) const;
  void check(const std::string& timeout_text) const;

  std::shared_ptr<database_impl> db_;
  const std::string queue_;
  const std::string what_;
  const lease_options& o_;
  const steady::time_point deadline_;
  const cancellation& cancel_;
  // Every statement of the wait ends by its deadline, or within a second (the TTL less its margin,
  // when shorter) for a short wait's one try; a wait for ever has no bound.
  const call_deadline bound_;
  const std::string token_;
  bool waited_ = false;  // on_wait() ran
  const steady::time_point started_ = steady::now();
  std::unique_ptr<hub_entry> entry_;
  std::int64_t ticket_ = 0;
  steady::time_point refresh_at_ = steady::time_point::max();
};

}  // namespace dblock::detail
