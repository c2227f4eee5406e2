// Internal: the one waiting engine. Every kind that waits (a lease, and through it a lock set and
// an election; a semaphore's permits; a read-write lock's readers and its writer's drain) waits
// here: a first try; then the waiter joins the queue of waiters (storage/wait_queue), is woken
// by the one release path (wake/ring, wake/hub), refreshes its entry while it waits, rides out a
// failover until its deadline, bounds every statement by the wait's deadline, and leaves the queue
// on every exit. What differs by kind is only its try and what it reads before trying: a
// wait_policy.
#pragma once

#include <chrono>
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
class queue_wait;
struct database_impl;

/// What a kind adds to the engine: its tries, and what it does when its entry is found gone.
class wait_policy {
 public:
  virtual ~wait_policy() = default;
  /// The try before the waiter joins the queue (also after a failover); true when it got what it
  /// waits for. Even a zero wait makes it.
  virtual bool first_try(queue_wait& w) = 0;
  /// When the first try failed (again after a failover): the listener hears that the call waits.
  virtual void on_wait() {}
  /// One round in the queue: true when the kind got what it waits for; else `sleep` is how long
  /// to sleep before the next round (the engine bounds it by the deadline and the entry's
  /// refresh). `rung`: the last sleep ended on a ring. A round calls w.check() where the kind may
  /// still give up (the deadline, a cancellation).
  virtual bool round(queue_wait& w, bool rung, std::chrono::nanoseconds& sleep) = 0;
  /// The entry was found gone at a refresh (reaped after a stall, or deleted by a release that
  /// handed a lease to it). True: the kind holds it anyway and the engine stops refreshing;
  /// false: the waiter joins again, at the back.
  virtual bool entry_gone(queue_wait&) { return false; }
  /// The entry (still w.ticket()) was found gone when leaving the queue without what the kind
  /// waited for (a release may have handed a lease to it: the kind passes it on).
  virtual void left_gone(queue_wait&) noexcept {}
};

/**
 * One waiting call in `queue` (a lease's own name, or a queue-only name, dialect/doorbell.hpp).
 * The waiter's owner token (token()) is the one its acquires must use: a release by a holder with
 * that token skips the holder's own entry when it looks for the head.
 */
class queue_wait {
 public:
  /// Waits until `deadline`; `what` names the call in errors ("acquire a permit of semaphore
  /// 'x'"), `timeout_text` the timeout's words before the wait's length ("not acquired within";
  /// the caller may change the string while the wait runs). `grant_ttl_us` > 0: a release may
  /// hand the lease to this waiter's entry with that TTL (fair leases).
  queue_wait(std::shared_ptr<database_impl> db, std::string queue, std::string what,
             const lease_options& options, steady::time_point deadline, const cancellation& cancel,
             const std::string& timeout_text, std::int64_t grant_ttl_us = 0);
  ~queue_wait();
  queue_wait(const queue_wait&) = delete;
  queue_wait& operator=(const queue_wait&) = delete;

  /// Runs the wait until `p` got what it waits for.
  /// @throws dblock::error errc::timeout, errc::cancelled, and the errors of the kind's tries and
  ///         of the queue's statements (a lost connection only once the deadline has passed).
  void run(wait_policy& p);

  /// The kinds whose try is one function: `attempt(ticket, limit_us)` is true when it got what
  /// it waits for; `ticket` is the waiter's queue entry (0 before it joined; a try that deletes
  /// the entry itself, as a permit's acquire does, calls entry_deleted()); `limit_us` is set to
  /// the microseconds until the holder it waits for expires (-1: unknown), the bound of the next
  /// sleep. Fair: a try goes only when nobody queued before it still waits. `on_wait` runs once,
  /// when the first try failed.
  using attempt_fn = std::function<bool(std::int64_t ticket, long long& limit_us)>;
  void run(const attempt_fn& attempt, const std::function<void()>& on_wait);

  /// Throws errc::cancelled or errc::timeout when the call may no longer wait.
  void check() const;
  /// The timeout of this wait.
  error timed_out() const;
  /// Leaves the queue now (best effort; an entry left behind expires within the TTL), telling
  /// `p` (else the policy of the running wait) when the entry was gone. The destructor does it
  /// too, with no policy: a kind that must hear of it leaves before.
  void leave(wait_policy* p = nullptr) noexcept;

  const std::string& token() const { return token_; }
  const std::string& what() const { return what_; }
  /// The waiter's entry (0 while it has none).
  std::int64_t ticket() const { return ticket_; }
  /// The try that succeeded deleted the queue entry itself, or the kind took over deleting it.
  void entry_deleted() { ticket_ = 0; }
  /// The waiter's wake-up registration; null until the first try failed.
  hub_entry* entry() const { return entry_.get(); }
  /// When the last entry was sent (the earliest start of a lease a release handed to it).
  steady::time_point enqueued_at() const { return enqueued_at_; }
  steady::time_point started() const { return started_; }
  /// Just joined, with rings live: a release that ran while the entry was being made may have
  /// looked for the head before the entry was there (bell_channel::joined_recheck()): the time
  /// to look again soon, once per join.
  std::optional<std::chrono::milliseconds> joined_recheck(bool live);
  /// Nobody waits ahead of this waiter (before it joined: nobody waits).
  bool at_front() const;
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
  void run_once(wait_policy& p);
  void enqueue();
  std::int64_t insert_entry();
  void refresh();
  std::int64_t ttl_us() const;
  std::chrono::nanoseconds bounded(std::chrono::nanoseconds d) const;
  std::string bound_text() const;

  std::shared_ptr<database_impl> db_;
  const std::string queue_;
  const std::string what_;
  const std::string& timeout_text_;
  const lease_options& o_;
  const steady::time_point deadline_;
  const cancellation& cancel_;
  const steady::time_point started_ = steady::now();
  // Every statement of the wait ends by its deadline, or within a second (the TTL less its margin,
  // when shorter) for a short wait's one try; a wait for ever has no bound.
  const steady::time_point bound_until_;
  const call_deadline bound_;
  const std::string token_;
  const std::int64_t grant_ttl_us_;
  wait_policy* policy_ = nullptr;  // while run() runs
  std::unique_ptr<hub_entry> entry_;
  std::int64_t ticket_ = 0;
  bool joined_ = false;  // entry made, and joined_recheck() not yet used since
  steady::time_point enqueued_at_;
  steady::time_point refresh_at_ = steady::time_point::max();
};

}  // namespace dblock::detail
