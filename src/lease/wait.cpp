// Waiting for a lease: the waiter queue (storage/wait_queue), wake-ups (wake/hub) and polling
// bounded by the holder's expiry as the safety net; fair mode grants only at the queue's head.
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "lease/lock_impl.hpp"
#include "storage/wait_queue.hpp"
#include "wake/hub.hpp"

namespace dblock {
namespace detail {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

/// One call of lease_lock::acquire(wait).
class waiting_acquire {
 public:
  waiting_acquire(lease_lock::impl& lk, milliseconds wait, const cancellation& cancel)
      : lk_(lk),
        dbi_(access::impl(lk.db)),
        cancel_(cancel),
        what_("acquire lease '" + lk.name + "'"),
        wait_(wait),
        deadline_(steady::now() + wait),
        token_(new_owner_token()) {}
  ~waiting_acquire() { leave_queue(); }

  lease_guard run() {
    if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
    if (!lk_.options.fair && !reentry()) {
      // Behind this process's other contenders for the name first (wake/gate.hpp).
      pass_ = dbi_->hub->gates().enter(lk_.name, cancel_, deadline_);
      if (!pass_) {  // its deadline passed, or it was cancelled
        check();
        throw timed_out();
      }
    }
    if (auto g = first_try()) return done(std::move(*g));  // even with a zero wait
    // Enlisted only now, so an acquire that needs no wait never subscribes to wake-ups, and
    // still before the first read below: a release after that read rings this waiter.
    entry_.emplace(*dbi_->hub, lk_.name, token_, cancel_);
    enqueue();
    bool rung = false;
    std::int64_t seen_fence = -1;
    for (int round = 0;; ++round) {
      check();
      // Rung: the lease was just freed; try at once without reading first. A fair waiter's
      // acquire takes it only when nobody waits ahead (the statement checks), so a ring that
      // reached it out of turn, or late, costs one refused try and breaks no order.
      if (rung && !entry_->relook()) {
        if (auto g = lk_.attempt(token_, ticket_)) return done(std::move(*g));
      }
      const bool live = entry_->live();  // before the read: a later release will ring
      const wait_queue::wait_state st = read();
      if (st.fence != seen_fence) round = 0;  // a new holder: poll briskly again
      seen_fence = st.fence;
      // (A fair waiter that is not the head does not try: a refused write costs more than a
      // read, and the head is rung when the lease is freed.)
      const bool at_front = !st.head || *st.head >= ticket_;  // nobody live waits ahead
      const bool our_turn = !lk_.options.fair || at_front;
      // Free and ours to take: try (when another waiter wins, the jittered sleep below keeps
      // us from spinning). Held: sleep until a release rings or, as the safety net, the
      // holder's expiry or poll_max, whichever is first (polling with jittered backoff when
      // rings cannot be relied on).
      nanoseconds sleep = backoff(round);
      if (st.free() && our_turn) {
        if (auto g = lk_.attempt(token_, ticket_)) return done(std::move(*g));
      } else if (!st.free()) {
        const nanoseconds left = microseconds(st.expires_us - st.now_us) + milliseconds(1);
        sleep = live ? std::min<nanoseconds>(left, lk_.options.poll_max) : std::min(sleep, left);
        // Just joined: a release running meanwhile may not have seen the entry
        // (bell_channel::joined_recheck()); look once more soon rather than at poll_max. Only
        // when nobody waits ahead: such a release rang the first entry it saw, and the waiter
        // at the front of those it missed is the one that looks again.
        if (live && joined_) {
          joined_ = false;
          const milliseconds r = dbi_->hub->joined_recheck();
          if (r.count() > 0 && at_front) sleep = std::min<nanoseconds>(sleep, r);
        }
      }
      rung = entry_->wait(bounded(sleep));
      if (steady::now() >= refresh_at_) refresh();
    }
  }

 private:
  void check() {
    if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
    if (steady::now() >= deadline_) throw timed_out();
  }
  error timed_out() const {
    return error(errc::timeout,
                 what_ + ": not acquired within " + std::to_string(wait_.count()) + " ms");
  }
  lease_guard done(lease_guard g) {
    if (entry_) entry_->acquired();
    // The acquire deleted the queue entry, or, where that would cost a second write on the
    // handoff's path, the lease deletes it during the hold (a reentrant hold, which came
    // through no queue, leaves it to the destructor).
    if (!ticket_ || !wait_queue::exit_deferred(*dbi_)) {
      ticket_ = 0;
    } else if (lk_.current && lk_.current->holds.load() == 1) {
      lk_.current->leave_queue_later(ticket_, token_);
      ticket_ = 0;
    }
    // The holder keeps the gate until it releases (a reentrant hold came through none).
    if (pass_ && lk_.current && lk_.current->holds.load() == 1) lk_.current->hold_gate(pass_);
    pass_.reset();
    return g;
  }
  bool reentry() const {
    const auto& cur = lk_.current;
    return cur && cur->holds.load() > 0 && cur->valid();
  }
  std::optional<lease_guard> first_try() {
    if (!lk_.options.fair || reentry()) return lk_.attempt(token_);
    return lk_.attempt(token_, wait_queue::behind_everyone);  // fair: only when nobody is queued
  }
  wait_queue::wait_state read() {
    return with_session(dbi_, what_,
                        [&](session_scope& s) { return wait_queue::read(s, lk_.name); });
  }
  std::int64_t ttl_us() const { return duration_cast<microseconds>(lk_.options.ttl).count(); }
  void enqueue() {
    ticket_ = with_session(dbi_, what_ + " (joining the queue)", [&](session_scope& s) {
      return wait_queue::enqueue(s, lk_.name, token_, ttl_us(), host_name(),
                                 static_cast<std::int64_t>(::getpid()), entry_->address());
    });
    entry_->set_ticket(ticket_);
    joined_ = true;
    refresh_at_ = steady::now() + lk_.options.ttl / 3;
  }
  // The queue entry is a lease too: extend it while waiting; re-enter at the back when it was
  // reaped (this waiter stalled past its TTL).
  void refresh() {
    const bool alive = with_session(
        dbi_, what_ + " (refreshing the queue entry)",
        [&](session_scope& s) { return wait_queue::refresh(s, ticket_, token_, ttl_us()); });
    if (!alive) {
      enqueue();
      return;
    }
    refresh_at_ = steady::now() + lk_.options.ttl / 3;
  }
  void leave_queue() noexcept {
    if (!ticket_) return;
    try {
      with_session(dbi_, what_ + " (leaving the queue)",
                   [&](session_scope& s) { wait_queue::dequeue(s, ticket_, token_); });
    } catch (...) {
      // The entry expires within the lease TTL; the reaper deletes it later.
    }
  }
  nanoseconds backoff(int round) const {
    const auto& o = lk_.options;
    const nanoseconds cap =
        std::min<nanoseconds>(o.poll_initial * (1LL << std::min(round, 20)), o.poll_max);
    return full_jitter(cap);
  }
  nanoseconds bounded(nanoseconds sleep) const {
    const auto now = steady::now();
    return std::max(nanoseconds(0), std::min({sleep, nanoseconds(deadline_ - now),
                                              nanoseconds(refresh_at_ - now)}));
  }

  lease_lock::impl& lk_;
  const std::shared_ptr<database_impl>& dbi_;
  const cancellation& cancel_;
  const std::string what_;
  const milliseconds wait_;
  const steady::time_point deadline_;
  const std::string token_;
  std::shared_ptr<gate_pass> pass_;  // the local gate (not fair, not reentrant)
  std::optional<hub_entry> entry_;   // enlisted once the first try failed
  std::int64_t ticket_ = 0;
  bool joined_ = false;  // enqueued, and not yet slept on a held lease since
  steady::time_point refresh_at_ = steady::time_point::max();
};

}  // namespace detail

lease_guard lease_lock::acquire(std::chrono::milliseconds wait, const cancellation& cancel) {
  return detail::waiting_acquire(*impl_, wait, cancel).run();
}

}  // namespace dblock
