// Waiting for a lease: the one waiting engine (lease/queue_wait) with the lease's policy: read
// before trying, fair mode grants only at the queue's head, and a fair release may hand over.
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "lease/lock_impl.hpp"
#include "lease/queue_wait.hpp"
#include "storage/wait_queue.hpp"
#include "wake/hub.hpp"

namespace dblock {
namespace detail {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

/// One call of lease_lock::acquire(wait): the waiting engine (lease/queue_wait.hpp) with the
/// lease's policy. Before it tries, a waiter in the queue reads the row (a refused write costs
/// more than a read); a fair release may hand the lease to the queue's head; this process's own
/// contenders for the name pass a local gate first (wake/gate.hpp).
class waiting_acquire final : public wait_policy {
 public:
  waiting_acquire(lease_lock::impl& lk, steady::time_point deadline, const cancellation& cancel)
      : lk_(lk),
        dbi_(access::impl(lk.db)),
        cancel_(cancel),
        deadline_(deadline),
        grants_(lk.options.fair && dbi_->statements.grants()),
        w_(dbi_, lk.name, "acquire lease '" + lk.name + "'", lk.options, deadline, cancel,
           timeout_text_, grants_ ? ttl_us() : 0) {}
  ~waiting_acquire() override {
    const resolution_time grace;  // leaving the queue after the deadline: briefly
    w_.leave(this);               // while this policy can still pass a lease handed to it on
  }

  lease_guard run() {
    return call_.run([&] { return run_reported(); });
  }

 private:
  lease_guard run_reported() {
    if (cancel_.cancelled()) throw error(errc::cancelled, w_.what() + ": cancelled");
    if (!lk_.options.fair && !reentry()) {
      // Behind this process's other contenders for the name first (wake/gate.hpp).
      pass_ = dbi_->hub->gates().enter(lk_.name, cancel_, deadline_, [&] { call_.waits(); });
      if (!pass_) {  // its deadline passed, or it was cancelled
        w_.check();
        throw w_.timed_out();
      }
    }
    w_.run(*this);
    return done(std::move(*got_));
  }

  bool first_try(queue_wait& w) override {
    round_ = 0;
    seen_fence_ = -1;
    // Even with a zero wait; a fair one only when nobody is queued.
    if (!lk_.options.fair || reentry()) return take(lk_.attempt(w.token()));
    return take(lk_.attempt(w.token(), wait_queue::behind_everyone));
  }
  void on_wait() override { call_.waits(); }

  bool round(queue_wait& w, bool rung, nanoseconds& sleep) override {
    if (take(handed_over(w, rung))) return true;
    w.check();
    // Rung: the lease was just freed; try at once without reading first. A fair waiter's
    // acquire takes it only when nobody waits ahead (the statement checks), so a ring that
    // reached it out of turn, or late, costs one refused try and breaks no order.
    if (rung && !w.entry()->relook() && take(lk_.attempt(w.token(), w.ticket()))) return true;
    const bool live = w.entry()->live();  // before the read: a later release will ring
    const wait_queue::wait_state st = read(w);
    if (st.fence != seen_fence_) round_ = 0;  // a new holder: poll briskly again
    seen_fence_ = st.fence;
    // (A fair waiter that is not the head does not try: a refused write costs more than a read,
    // and the head is rung when the lease is freed.)
    const bool at_front = !st.head || *st.head >= w.ticket();  // nobody live waits ahead
    const bool our_turn = !lk_.options.fair || at_front;
    // Free and ours to take: try (when another waiter wins, the jittered sleep keeps us from
    // spinning). Held: sleep until a release rings or, as the safety net, the holder's expiry
    // or poll_max, whichever is first (polling with jittered backoff when rings cannot be
    // relied on).
    sleep = poll_backoff(lk_.options, round_++);
    // Ours: handed over in a release whose ring did not reach this waiter.
    if ((grants_ && st.mine) || (st.free() && our_turn)) {
      if (take(lk_.attempt(w.token(), w.ticket()))) return true;
    } else if (!st.free()) {
      const nanoseconds left = microseconds(st.expires_us - st.now_us) + milliseconds(1);
      sleep = live ? std::min<nanoseconds>(left, poll_ceiling(lk_.options)) : std::min(sleep, left);
      // Just joined: a release running meanwhile may not have seen the entry; look once more
      // soon. Only when nobody waits ahead: such a release rang the first entry it saw, and the
      // waiter at the front of those it missed is the one that looks again.
      const auto r = w.joined_recheck(live);
      if (r && at_front) sleep = std::min<nanoseconds>(sleep, *r);
    }
    return false;
  }

  // Gone at a refresh: reaped, or deleted by a release that handed the lease over (the next
  // read sees it ours and the try takes it).
  bool entry_gone(queue_wait& w) override { return grants_ && read(w).mine; }
  // Gone when leaving: a release may have handed this waiter the lease (the release locks the
  // entry, so it has committed by now). Pass it on: take it and release it.
  void left_gone(queue_wait& w) noexcept override {
    try {
      if (!grants_ || !read(w).mine) return;
      if (auto g = lk_.attempt(w.token(), w.ticket())) g->release();
    } catch (const std::exception& e) {
      dbi_->notify([&](listener& l) {
        l.log(log_level::warning, w.what() + " (passing on a lease handed to it): " + e.what() +
                                      "; that lease runs out at its TTL");
      });
    } catch (...) {
    }
  }

  bool take(std::optional<lease_guard> g) {
    if (!g) return false;
    got_ = std::move(g);
    return true;
  }
  lease_guard done(lease_guard g) {
    const bool queued = w_.entry() != nullptr;  // came through the queue
    // Fair: its release may hand the lease to the next in line.
    if (queued && grants_ && lk_.current && lk_.current->holds.load() == 1)
      lk_.current->hand_over.store(true);
    // The acquire deleted the queue entry, or, where that would cost a second write on the
    // handoff's path, the lease deletes it during the hold (a reentrant hold, which came
    // through no queue, leaves it to the engine).
    if (!w_.ticket() || !wait_queue::exit_deferred(*dbi_)) {
      w_.entry_deleted();
    } else if (lk_.current && lk_.current->holds.load() == 1) {
      lk_.current->leave_queue_later(w_.ticket(), w_.token());
      w_.entry_deleted();
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
  wait_queue::wait_state read(const queue_wait& w) {
    return with_session(dbi_, w.what(),
                        [&](session_scope& s) { return wait_queue::read(s, lk_.name, w.token()); });
  }
  // Handed the lease by a release, which rang this waiter with its fence: held without a
  // statement (else `rung`, and the try takes it, one statement, as after a ring without it).
  std::optional<lease_guard> handed_over(queue_wait& w, bool& rung) {
    const std::int64_t f = w.entry()->granted();
    if (!f) return std::nullopt;
    rung = true;
    return adopt(w, f);
  }
  // The lease a release handed over at `fence` (vocabulary::lease_release_granting()), held
  // without a statement. Its TTL ran from the release's clock reading, which came after this
  // waiter's entry was committed, so that entry's send time is a safe start for the local
  // validity (as a try's send time is for its grant). After a long wait that start would cost
  // the guard too much of its TTL: nullopt then, and the try takes the lease with a fresh TTL.
  std::optional<lease_guard> adopt(queue_wait& w, std::int64_t fence) {
    if (!grants_ || steady::now() - w.enqueued_at() > lk_.options.ttl / 4) return std::nullopt;
    // Where another local user could forge such a ring (doorbell::private_rings()), the row
    // must say so first: one read, no write. Otherwise the try decides, as after any ring.
    if (!dbi_->dia->bell.private_rings()) {
      const wait_queue::wait_state st = read(w);
      if (!st.mine || st.fence != fence || st.hold_count != 1 || st.expires_us <= st.now_us)
        return std::nullopt;
    }
    acquire_params p;
    p.name = lk_.name;
    p.owner_token = w.token();
    p.ttl_us = ttl_us();
    p.holder_host = host_name();
    p.holder_pid = static_cast<std::int64_t>(::getpid());
    dbi_->notify([&](listener& l) {
      l.acquired(lk_.name, fence, duration_cast<microseconds>(steady::now() - w.started()));
    });
    return lk_.granted(p, fence, w.enqueued_at(), false);
  }
  std::int64_t ttl_us() const { return duration_cast<microseconds>(lk_.options.ttl).count(); }

  lease_lock::impl& lk_;
  const std::shared_ptr<database_impl>& dbi_;
  const cancellation& cancel_;
  const steady::time_point deadline_;
  const bool grants_;  // fair, where a release may hand the lease to its queue's head
  const std::string timeout_text_ = "not acquired within";
  queue_wait w_;
  acquire_call call_{dbi_, lk_.name};  // what the listener hears of this call
  std::shared_ptr<gate_pass> pass_;    // the local gate (not fair, not reentrant)
  std::optional<lease_guard> got_;     // what the try that succeeded took
  int round_ = 0;
  std::int64_t seen_fence_ = -1;
};

}  // namespace detail

lease_guard lease_lock::acquire_until(steady_clock::time_point deadline,
                                      const cancellation& cancel) {
  // A deadline in the past is now (time_point::min() would overflow `deadline - now`).
  deadline = std::max(deadline, steady_clock::now());
  detail::thread_check entered(*impl_);
  if (impl_->mode == lease_mode::session) {
    detail::acquire_call call(detail::access::impl(impl_->db), impl_->name);
    return call.run([&] { return impl_->session_wait(deadline, cancel, call); });
  }
  return detail::waiting_acquire(*impl_, deadline, cancel).run();
}

}  // namespace dblock
