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
  waiting_acquire(lease_lock::impl& lk, steady::time_point deadline, const cancellation& cancel)
      : lk_(lk),
        dbi_(access::impl(lk.db)),
        cancel_(cancel),
        what_("acquire lease '" + lk.name + "'"),
        wait_(wait_text(steady::now(), deadline)),
        deadline_(deadline),
        // A short wait still makes its one try: its statements get at least a second (or the
        // lease's TTL less its margin, when shorter). A wait for ever has no bound.
        call_deadline_(deadline == steady::time_point::max()
                           ? steady::time_point::max()
                           : std::max(deadline, steady::now() + std::min<milliseconds>(
                                                                    std::chrono::seconds(1),
                                                                    lk.options.ttl -
                                                                        lk.options.safety_margin))),
        token_(new_owner_token()),
        grants_(lk.options.fair && dbi_->statements.grants()) {}
  ~waiting_acquire() {
    const resolution_time grace;  // leaving the queue after the deadline: briefly
    leave_queue();
  }

  lease_guard run() {
    return call_.run([&] { return run_reported(); });
  }

 private:
  lease_guard run_reported() {
    if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
    if (!lk_.options.fair && !reentry()) {
      // Behind this process's other contenders for the name first (wake/gate.hpp).
      pass_ = dbi_->hub->gates().enter(lk_.name, cancel_, deadline_, [&] { call_.waits(); });
      if (!pass_) {  // its deadline passed, or it was cancelled
        check();
        throw timed_out();
      }
    }
    // Rides out a failover (promise D2): before a grant, a server that cannot be reached, a
    // connection lost, or a node that is read-only or out of its cluster, is tried again (a
    // multi-host URL reaches the new primary or a surviving node) until the deadline.
    for (int failures = 0;; ++failures) {
      try {
        return wait_once();
      } catch (const error& e) {
        if (!rides_out(e)) throw;
        if (steady::now() >= deadline_) {
          // The wait ran out while the database could not be reached: not acquired. (An
          // acquire in doubt stays so: it may hold the lease until its TTL.)
          if (e.code() == errc::in_doubt) throw;
          throw error(errc::timeout, timed_out().what() + std::string(" (") + e.what() + ")",
                      e.backend(), e.sqlstate(), e.native_code());
        }
        dbi_->notify([&](listener& l) {
          l.log(log_level::warning,
                what_ + ": " + e.what() + "; trying again until the wait's end");
        });
        leave_queue();  // best effort; an entry left behind expires within the lease TTL
        ticket_ = 0;
        entry_.reset();
        const nanoseconds pause = bounded(failure_backoff(failures));
        if (cancel_.sleep_for(pause)) throw error(errc::cancelled, what_ + ": cancelled");
      }
    }
  }

  static bool rides_out(const error& e) {
    // in_doubt: an acquire whose reply was lost when the server went away, and whose outcome
    // could not be read back: trying again with the same owner token takes the lease, or
    // finds that it has it (a hold the lost reply may have added runs out at the TTL).
    return e.code() == errc::connection_failed || e.code() == errc::connection_lost ||
           e.code() == errc::in_doubt;
  }
  std::string what_deadline() const {
    if (call_deadline_ == steady::time_point::max()) return "no bound";
    return std::to_string(duration_cast<milliseconds>(call_deadline_ - steady::now()).count()) +
           " ms (the wait of " + what_ + ")";
  }
  lease_guard wait_once() {
    if (auto g = first_try()) return done(std::move(*g));  // even with a zero wait
    call_.waits();
    // Enlisted only now, so an acquire that needs no wait never subscribes to wake-ups, and
    // still before the first read below: a release after that read rings this waiter.
    entry_.emplace(*dbi_->hub, lk_.name, token_, cancel_);
    enqueue();
    bool rung = false;
    std::int64_t seen_fence = -1;
    for (int round = 0;; ++round) {
      if (auto g = handed_over(rung)) return done(std::move(*g));
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
      // Ours: handed over in a release whose ring did not reach this waiter.
      if ((grants_ && st.mine) || (st.free() && our_turn)) {
        if (auto g = lk_.attempt(token_, ticket_)) return done(std::move(*g));
      } else if (!st.free()) {
        const nanoseconds left = microseconds(st.expires_us - st.now_us) + milliseconds(1);
        sleep =
            live ? std::min<nanoseconds>(left, poll_ceiling(lk_.options)) : std::min(sleep, left);
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

  void check() {
    if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
    if (steady::now() >= deadline_) throw timed_out();
  }
  error timed_out() const { return error(errc::timeout, what_ + ": not acquired within " + wait_); }
  lease_guard done(lease_guard g) {
    if (entry_) entry_->acquired();
    // Came through the queue, fair: its release may hand the lease to the next in line.
    if (entry_ && grants_ && lk_.current && lk_.current->holds.load() == 1)
      lk_.current->hand_over.store(true);
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
                        [&](session_scope& s) { return wait_queue::read(s, lk_.name, token_); });
  }
  // Handed the lease by a release, which rang this waiter with its fence: held without a
  // statement (else `rung`, and the try takes it, one statement, as after a ring without it).
  std::optional<lease_guard> handed_over(bool& rung) {
    const std::int64_t f = entry_->granted();
    if (!f) return std::nullopt;
    rung = true;
    return adopt(f);
  }
  // The lease a release handed over at `fence` (vocabulary::lease_release_granting()), held
  // without a statement. Its TTL ran from the release's clock reading, which came after this
  // waiter's entry was committed, so that entry's send time is a safe start for the local
  // validity (as a try's send time is for its grant). After a long wait that start would cost
  // the guard too much of its TTL: nullopt then, and the try takes the lease with a fresh TTL.
  std::optional<lease_guard> adopt(std::int64_t fence) {
    if (!grants_ || steady::now() - enqueued_at_ > lk_.options.ttl / 4) return std::nullopt;
    // Where another local user could forge such a ring (doorbell::private_rings()), the row
    // must say so first: one read, no write. Otherwise the try decides, as after any ring.
    if (!dbi_->dia->bell.private_rings()) {
      const wait_queue::wait_state w = read();
      if (!w.mine || w.fence != fence || w.hold_count != 1 || w.expires_us <= w.now_us)
        return std::nullopt;
    }
    acquire_params p;
    p.name = lk_.name;
    p.owner_token = token_;
    p.ttl_us = ttl_us();
    p.holder_host = host_name();
    p.holder_pid = static_cast<std::int64_t>(::getpid());
    dbi_->notify([&](listener& l) {
      l.acquired(lk_.name, fence, duration_cast<microseconds>(steady::now() - started_));
    });
    return lk_.granted(p, fence, enqueued_at_, false);
  }
  std::int64_t ttl_us() const { return duration_cast<microseconds>(lk_.options.ttl).count(); }
  void enqueue() {
    const steady::time_point sent = steady::now();
    ticket_ = insert_entry();
    enqueued_at_ = sent;
    entry_->set_ticket(ticket_);
    joined_ = true;
    refresh_at_ = steady::now() + lk_.options.ttl / 3;
  }
  // Sends the entry's insert. When its reply is lost the entry may exist, and nobody would
  // refresh or delete it: it would stay at the head until its TTL ran out, fair waiters behind
  // it waiting that long, and a release could hand it the lease. So once the broken server
  // session is ended (nothing it ran can land later) the entry is looked up by this waiter's
  // token: found, it is this waiter's; not found, the insert is sent again (three tries in all).
  // A session that cannot be confirmed ended leaves the acquire failed, the entry if any
  // expiring within the lease TTL.
  std::int64_t insert_entry() {
    const std::string what = what_ + " (joining the queue)";
    for (int round = 0;; ++round) {
      session_ref server;
      try {
        return with_session(dbi_, what, [&](session_scope& s) {
          server = s.server();
          return wait_queue::enqueue(s, lk_.name, token_, ttl_us(), host_name(),
                                     static_cast<std::int64_t>(::getpid()), entry_->address(),
                                     grants_ ? ttl_us() : 0);
        });
      } catch (const error& e) {
        if (e.code() != errc::connection_lost || round >= 2) throw;
        if (!end_broken_session(dbi_, server))
          throw error(errc::connection_lost,
                      what + ": the connection broke and " + session_not_ended(*dbi_) +
                          "; a queue entry, if made, expires within the lease TTL: " + e.what(),
                      e.backend(), e.sqlstate(), e.native_code());
      }
      if (const std::optional<std::int64_t> found = find_entry(what)) return *found;
    }
  }
  // This waiter's entry, after a lost reply of its insert (only the read is tried again, never
  // the insert, which could then leave a second entry nobody deletes).
  std::optional<std::int64_t> find_entry(const std::string& what) {
    return read_retried(dbi_, what + " (reading the entry back after a lost reply)",
                        [&](session_scope& s) { return wait_queue::find(s, lk_.name, token_); });
  }
  // The queue entry is a lease too: extend it while waiting; re-enter at the back when it was
  // reaped (this waiter stalled past its TTL).
  void refresh() {
    const bool alive = with_session(
        dbi_, what_ + " (refreshing the queue entry)",
        [&](session_scope& s) { return wait_queue::refresh(s, ticket_, token_, ttl_us()); });
    if (!alive) {
      // Gone: reaped, or deleted by a release that handed the lease over (the next read sees
      // it ours and the try takes it).
      if (grants_ && read().mine) {
        refresh_at_ = steady::time_point::max();
        return;
      }
      enqueue();
      return;
    }
    refresh_at_ = steady::now() + lk_.options.ttl / 3;
  }
  void leave_queue() noexcept {
    if (!ticket_) return;
    const std::string what = what_ + " (leaving the queue, ticket " + std::to_string(ticket_) + ")";
    try {
      const bool left = wait_queue::dequeue_retried(dbi_, what, ticket_, token_);
      // The entry was gone: a release may have handed this waiter the lease (the release locks
      // the entry, so it has committed by now). Pass it on: take it and release it.
      if (!left && grants_ && read().mine) {
        if (auto g = lk_.attempt(token_, ticket_)) g->release();
      }
    } catch (const std::exception& e) {
      // The entry expires within the lease TTL; the reaper deletes it later (a lease handed
      // over runs out at its TTL).
      dbi_->notify([&](listener& l) {
        l.log(log_level::warning,
              what + ": " + e.what() +
                  "; the entry, if still there, expires within the lease TTL (a lease handed to "
                  "it, too)");
      });
    } catch (...) {
    }
  }
  nanoseconds backoff(int round) const { return poll_backoff(lk_.options, round); }
  nanoseconds bounded(nanoseconds sleep) const {
    const auto now = steady::now();
    return std::max(nanoseconds(0), std::min({sleep, nanoseconds(deadline_ - now),
                                              nanoseconds(refresh_at_ - now)}));
  }

  lease_lock::impl& lk_;
  const std::shared_ptr<database_impl>& dbi_;
  const cancellation& cancel_;
  const std::string what_;
  const std::string wait_;  // "250 ms", for messages
  const steady::time_point deadline_;
  const steady::time_point call_deadline_;
  // Every statement of the wait (and of leaving the queue) ends by it, whatever the server does.
  const call_deadline bound_{call_deadline_, what_deadline()};
  const std::string token_;
  acquire_call call_{dbi_, lk_.name};  // what the listener hears of this call
  std::shared_ptr<gate_pass> pass_;    // the local gate (not fair, not reentrant)
  std::optional<hub_entry> entry_;     // enlisted once the first try failed
  std::int64_t ticket_ = 0;
  const bool grants_;               // fair, where a release may hand the lease to its queue's head
  steady::time_point enqueued_at_;  // when the last enqueue was sent
  const steady::time_point started_ = steady::now();  // for listener::acquired()
  bool joined_ = false;  // enqueued, and not yet slept on a held lease since
  steady::time_point refresh_at_ = steady::time_point::max();
};

}  // namespace detail

lease_guard lease_lock::acquire_until(steady_clock::time_point deadline,
                                      const cancellation& cancel) {
  // A deadline in the past is now (time_point::min() would overflow `deadline - now`).
  deadline = std::max(deadline, steady_clock::now());
  detail::thread_check entered(*impl_);
  if (impl_->options.mode == lease_mode::session) {
    detail::acquire_call call(detail::access::impl(impl_->db), impl_->name);
    return call.run([&] { return impl_->session_wait(deadline, cancel, call); });
  }
  return detail::waiting_acquire(*impl_, deadline, cancel).run();
}

}  // namespace dblock
