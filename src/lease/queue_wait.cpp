#include "lease/queue_wait.hpp"

#include <unistd.h>

#include <algorithm>

#include "lease/lock_impl.hpp"
#include "storage/deadline.hpp"
#include "storage/wait_queue.hpp"
#include "wake/hub.hpp"
#include "wake/ring.hpp"

namespace dblock::detail {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

queue_wait::queue_wait(std::shared_ptr<database_impl> db, std::string queue, std::string what,
                       const lease_options& options, steady::time_point deadline,
                       const cancellation& cancel)
    : db_(std::move(db)),
      queue_(std::move(queue)),
      what_(std::move(what)),
      o_(options),
      deadline_(deadline),
      cancel_(cancel),
      bound_(deadline == steady::time_point::max()
                 ? steady::time_point::max()
                 : std::max(deadline, steady::now() + std::min<milliseconds>(
                                                          std::chrono::seconds(1),
                                                          options.ttl - options.safety_margin)),
             "the wait of " + what_),
      token_(new_owner_token()) {}

queue_wait::~queue_wait() {
  const resolution_time grace;  // leaving the queue after the deadline: briefly
  leave();
}

std::int64_t queue_wait::ttl_us() const {
  return duration_cast<microseconds>(o_.ttl).count();
}

nanoseconds queue_wait::bounded(nanoseconds d) const {
  const auto now = steady::now();
  return std::max(nanoseconds(0),
                  std::min({d, nanoseconds(deadline_ - now), nanoseconds(refresh_at_ - now)}));
}

void queue_wait::check(const std::string& timeout_text) const {
  if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
  if (steady::now() >= deadline_)
    throw error(errc::timeout, what_ + ": " + timeout_text + " " + wait_text(started_, deadline_));
}

std::optional<std::int64_t> queue_wait::first_ticket(const std::shared_ptr<database_impl>& db,
                                                     const std::string& queue,
                                                     const std::string& what) {
  return with_session(db, what + " (reading the queue)",
                      [&](session_scope& s) { return wait_queue::first_ticket(s, queue); });
}

bool queue_wait::at_front() {
  const std::optional<std::int64_t> first = first_ticket(db_, queue_, what_);
  // Before joining (ticket 0): only when nobody waits; after: when nobody joined before it.
  return !first || (ticket_ != 0 && *first >= ticket_);
}

void queue_wait::enqueue() {
  ticket_ = with_session(db_, what_ + " (joining the queue)", [&](session_scope& s) {
    return wait_queue::enqueue(s, queue_, token_, ttl_us(), host_name(),
                               static_cast<std::int64_t>(::getpid()), entry_->address());
  });
  entry_->set_ticket(ticket_);
  refresh_at_ = steady::now() + o_.ttl / 3;
}

// The entry is a lease too: extended while it waits, made again (at the back) when it was
// reaped after this waiter stalled past its TTL.
void queue_wait::refresh() {
  const bool alive = with_session(
      db_, what_ + " (refreshing the queue entry)",
      [&](session_scope& s) { return wait_queue::refresh(s, ticket_, token_, ttl_us()); });
  if (!alive) {
    enqueue();
    return;
  }
  refresh_at_ = steady::now() + o_.ttl / 3;
}

void queue_wait::leave() noexcept {
  if (!ticket_) return;
  const std::string what = what_ + " (leaving the queue, ticket " + std::to_string(ticket_) + ")";
  try {
    wait_queue::dequeue_retried(db_, what, ticket_, token_);
  } catch (const std::exception& e) {
    db_->notify([&](listener& l) {
      l.log(log_level::warning,
            what + ": " + e.what() + "; the entry, if still there, expires within the TTL");
    });
  } catch (...) {
  }
  ticket_ = 0;
}

void queue_wait::run(const attempt_fn& attempt, const std::function<void()>& on_wait,
                     const std::string& timeout_text) {
  // Rides out a failover as a lease's wait does (promise D2): a server that cannot be reached or
  // a connection lost is tried again, from a new queue entry, until the deadline.
  for (int failures = 0;; ++failures) {
    try {
      run_once(attempt, on_wait, timeout_text);
      return;
    } catch (const error& e) {
      const bool transient = e.code() == errc::connection_failed ||
                             e.code() == errc::connection_lost || e.code() == errc::in_doubt;
      if (!transient) throw;
      if (steady::now() >= deadline_) {
        if (e.code() == errc::in_doubt) throw;
        throw error(errc::timeout,
                    what_ + ": " + timeout_text + " " + wait_text(started_, deadline_) + " (" +
                        e.what() + ")",
                    e.backend(), e.sqlstate(), e.native_code());
      }
      db_->notify([&](listener& l) {
        l.log(log_level::warning, what_ + ": " + e.what() + "; trying again until the wait's end");
      });
      leave();  // best effort; an entry left behind expires within the TTL
      entry_.reset();
      const auto left = std::max(nanoseconds(0), nanoseconds(deadline_ - steady::now()));
      if (cancel_.sleep_for(std::min(left, failure_backoff(failures))))
        throw error(errc::cancelled, what_ + ": cancelled");
    }
  }
}

void queue_wait::run_once(const attempt_fn& attempt, const std::function<void()>& on_wait,
                          const std::string& timeout_text) {
  long long limit_us = -1;
  if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
  // The first try, even with a zero wait; a fair one only when nobody is queued.
  if ((!o_.fair || at_front()) && attempt(0, limit_us)) return;
  if (on_wait && !waited_) on_wait();
  waited_ = true;
  // Enlisted before the entry is made, and the entry made before the next try: a release after
  // that try's read sees the entry and rings this waiter.
  entry_ = std::make_unique<hub_entry>(*db_->hub, queue_, token_, cancel_);
  enqueue();
  bool joined = true;  // not yet slept since the entry was made
  for (int round = 0;; ++round) {
    check(timeout_text);
    const bool live = entry_->live();  // before the try: a later release will ring
    if (!o_.fair || at_front()) {
      if (attempt(ticket_, limit_us)) break;
    }
    // Asleep until a release rings or, as the safety net, the holder's expiry or poll_max
    // (with jittered backoff while rings cannot be relied on).
    nanoseconds sleep = live ? poll_ceiling(o_) : poll_backoff(o_, round);
    if (limit_us >= 0)
      sleep = std::min<nanoseconds>(sleep, microseconds(limit_us) + milliseconds(1));
    // Just joined: a release that ran while the entry was being made may have looked for the
    // head before the entry was there, and freed the lock after this try looked
    // (bell_channel::joined_recheck()); look once more soon rather than at the safety net.
    if (joined && live) {
      joined = false;
      const milliseconds r = db_->hub->joined_recheck();
      if (r.count() > 0) sleep = std::min<nanoseconds>(sleep, r);
    }
    if (entry_->wait(bounded(sleep))) round = 0;
    if (steady::now() >= refresh_at_) refresh();
  }
  entry_->acquired();
  leave();  // unless the try deleted the entry (entry_deleted())
}

void queue_wait::ring_head(const std::shared_ptr<database_impl>& db, const std::string& queue,
                           const std::string& token) {
  wait_queue::ring_freed(db, queue, 0, token, lock_table::release_wake::look_up());
}

}  // namespace dblock::detail
