#include "lease/queue_wait.hpp"

#include <unistd.h>

#include <algorithm>
#include <utility>

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

namespace {

steady::time_point bound_of(steady::time_point deadline, const lease_options& o) {
  if (deadline == steady::time_point::max()) return deadline;
  return std::max(deadline, steady::now() + std::min<milliseconds>(std::chrono::seconds(1),
                                                                   o.ttl - o.safety_margin));
}

// A lost connection, a server that cannot be reached, or an acquire whose reply was lost and
// whose outcome could not be read back (tried again with the same owner token, it takes what it
// waits for or finds it has it; a hold the lost reply may have added runs out at the TTL).
bool rides_out(const error& e) {
  return e.code() == errc::connection_failed || e.code() == errc::connection_lost ||
         e.code() == errc::in_doubt;
}

// The kinds whose try is one function (queue_wait::attempt_fn).
class attempt_policy final : public wait_policy {
 public:
  attempt_policy(const queue_wait::attempt_fn& attempt, const std::function<void()>& on_wait,
                 const lease_options& o)
      : attempt_(attempt), on_wait_(on_wait), o_(o) {}
  bool first_try(queue_wait& w) override {
    round_ = 0;
    limit_us_ = -1;
    return (!o_.fair || w.at_front()) && attempt_(0, limit_us_);
  }
  void on_wait() override {
    if (on_wait_ && !std::exchange(waited_, true)) on_wait_();
  }
  bool round(queue_wait& w, bool rung, nanoseconds& sleep) override {
    if (rung) round_ = 0;
    w.check();
    const bool live = w.entry()->live();  // before the try: a later release will ring
    if ((!o_.fair || w.at_front()) && attempt_(w.ticket(), limit_us_)) return true;
    // Asleep until a release rings or, as the safety net, the holder's expiry or poll_max
    // (with jittered backoff while rings cannot be relied on).
    sleep = live ? poll_ceiling(o_) : poll_backoff(o_, round_++);
    if (limit_us_ >= 0)
      sleep = std::min<nanoseconds>(sleep, microseconds(limit_us_) + milliseconds(1));
    if (const auto r = w.joined_recheck(live)) sleep = std::min<nanoseconds>(sleep, *r);
    return false;
  }

 private:
  const queue_wait::attempt_fn& attempt_;
  const std::function<void()>& on_wait_;
  const lease_options& o_;
  int round_ = 0;
  long long limit_us_ = -1;
  bool waited_ = false;  // on_wait_ ran
};

}  // namespace

queue_wait::queue_wait(std::shared_ptr<database_impl> db, std::string queue, std::string what,
                       const lease_options& options, steady::time_point deadline,
                       const cancellation& cancel, const std::string& timeout_text,
                       std::int64_t grant_ttl_us)
    : db_(std::move(db)),
      queue_(std::move(queue)),
      what_(std::move(what)),
      timeout_text_(timeout_text),
      o_(options),
      deadline_(deadline),
      cancel_(cancel),
      bound_until_(bound_of(deadline, options)),
      bound_(bound_until_, bound_text()),
      token_(new_owner_token()),
      grant_ttl_us_(grant_ttl_us) {}

queue_wait::~queue_wait() {
  const resolution_time grace;  // leaving the queue after the deadline: briefly
  leave();
}

std::string queue_wait::bound_text() const {
  if (bound_until_ == steady::time_point::max()) return "no bound";
  return std::to_string(duration_cast<milliseconds>(bound_until_ - steady::now()).count()) +
         " ms (the wait of " + what_ + ")";
}

std::int64_t queue_wait::ttl_us() const {
  return duration_cast<microseconds>(o_.ttl).count();
}

nanoseconds queue_wait::bounded(nanoseconds d) const {
  const auto now = steady::now();
  return std::max(nanoseconds(0),
                  std::min({d, nanoseconds(deadline_ - now), nanoseconds(refresh_at_ - now)}));
}

error queue_wait::timed_out() const {
  return error(errc::timeout, what_ + ": " + timeout_text_ + " " + wait_text(started_, deadline_));
}

void queue_wait::check() const {
  if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
  if (steady::now() >= deadline_) throw timed_out();
}

std::optional<std::int64_t> queue_wait::first_ticket(const std::shared_ptr<database_impl>& db,
                                                     const std::string& queue,
                                                     const std::string& what) {
  return with_session(db, what + " (reading the queue)",
                      [&](session_scope& s) { return wait_queue::first_ticket(s, queue); });
}

bool queue_wait::at_front() const {
  const std::optional<std::int64_t> first = first_ticket(db_, queue_, what_);
  // Before joining (ticket 0): only when nobody waits; after: when nobody joined before it.
  return !first || (ticket_ != 0 && *first >= ticket_);
}

std::optional<milliseconds> queue_wait::joined_recheck(bool live) {
  if (!live || !joined_) return std::nullopt;
  joined_ = false;
  const milliseconds r = db_->hub->joined_recheck();
  if (r.count() <= 0) return std::nullopt;
  return r;
}

void queue_wait::enqueue() {
  const steady::time_point sent = steady::now();
  ticket_ = insert_entry();
  enqueued_at_ = sent;
  entry_->set_ticket(ticket_);
  joined_ = true;
  refresh_at_ = steady::now() + o_.ttl / 3;
}

// Sends the entry's insert. When its reply is lost the entry may exist, and nobody would refresh
// or delete it: it would stay at the head until its TTL ran out, fair waiters behind it waiting
// that long, and a release could hand it a lease. So once the broken server session is ended
// (nothing it ran can land later) the entry is looked up by this waiter's token: found, it is this
// waiter's; not found, the insert is sent again (three tries in all). Only the read is retried on
// its own, never the insert, which could then leave a second entry nobody deletes. A session that
// cannot be confirmed ended leaves the wait failed, the entry if any expiring within the TTL.
std::int64_t queue_wait::insert_entry() {
  const std::string what = what_ + " (joining the queue)";
  for (int round = 0;; ++round) {
    session_ref server;
    try {
      return with_session(db_, what, [&](session_scope& s) {
        server = s.server();
        return wait_queue::enqueue(s, queue_, token_, ttl_us(), host_name(),
                                   static_cast<std::int64_t>(::getpid()), entry_->address(),
                                   grant_ttl_us_);
      });
    } catch (const error& e) {
      if (e.code() != errc::connection_lost || round >= 2) throw;
      if (!end_broken_session(db_, server))
        throw error(errc::connection_lost,
                    what + ": the connection broke and " + session_not_ended(*db_) +
                        "; a queue entry, if made, expires within the TTL: " + e.what(),
                    e.backend(), e.sqlstate(), e.native_code());
    }
    const std::optional<std::int64_t> found =
        read_retried(db_, what + " (reading the entry back after a lost reply)",
                     [&](session_scope& s) { return wait_queue::find(s, queue_, token_); });
    if (found) return *found;
  }
}

// The entry is a lease too: extended while it waits, made again (at the back) when it was
// reaped after this waiter stalled past its TTL.
void queue_wait::refresh() {
  const bool alive = with_session(
      db_, what_ + " (refreshing the queue entry)",
      [&](session_scope& s) { return wait_queue::refresh(s, ticket_, token_, ttl_us()); });
  if (alive) {
    refresh_at_ = steady::now() + o_.ttl / 3;
  } else if (policy_ && policy_->entry_gone(*this)) {
    refresh_at_ = steady::time_point::max();
  } else {
    enqueue();
  }
}

void queue_wait::leave(wait_policy* p) noexcept {
  if (!p) p = policy_;
  if (!ticket_) return;
  const std::string what = what_ + " (leaving the queue, ticket " + std::to_string(ticket_) + ")";
  try {
    const bool left = wait_queue::dequeue_retried(db_, what, ticket_, token_);
    if (!left && p) p->left_gone(*this);
  } catch (const std::exception& e) {
    db_->notify([&](listener& l) {
      l.log(log_level::warning,
            what + ": " + e.what() +
                "; the entry, if still there, expires within the TTL (a lease handed to it too)");
    });
  } catch (...) {
  }
  ticket_ = 0;
}

void queue_wait::run(wait_policy& p) {
  struct running {
    wait_policy*& slot;
    ~running() { slot = nullptr; }
  } in_run{policy_ = &p};
  // Rides out a failover (promise D2): before it gets what it waits for, a server that cannot be
  // reached or a connection lost is tried again, from a new queue entry (a multi-host URL reaches
  // the new primary or a surviving node), until the deadline.
  for (int failures = 0;; ++failures) {
    try {
      run_once(p);
      return;
    } catch (const error& e) {
      if (!rides_out(e)) throw;
      if (steady::now() >= deadline_) {
        // The wait ran out while the database could not be reached: not acquired. (An acquire
        // in doubt stays so: it may hold what it waited for until its TTL.)
        if (e.code() == errc::in_doubt) throw;
        throw error(errc::timeout, timed_out().what() + std::string(" (") + e.what() + ")",
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

void queue_wait::run_once(wait_policy& p) {
  if (cancel_.cancelled()) throw error(errc::cancelled, what_ + ": cancelled");
  if (p.first_try(*this)) return;
  p.on_wait();
  // Enlisted only now, so a call that needs no wait never subscribes to wake-ups, and before the
  // entry is made and the next try reads: a release after that read rings this waiter.
  entry_ = std::make_unique<hub_entry>(*db_->hub, queue_, token_, cancel_);
  enqueue();
  for (bool rung = false;;) {
    nanoseconds sleep{0};
    if (p.round(*this, rung, sleep)) break;
    rung = entry_->wait(bounded(sleep));
    if (steady::now() >= refresh_at_) refresh();
  }
  entry_->acquired();
}

void queue_wait::run(const attempt_fn& attempt, const std::function<void()>& on_wait) {
  attempt_policy p(attempt, on_wait, o_);
  run(p);
  leave();  // unless the try deleted the entry (entry_deleted())
}

void queue_wait::ring_head(const std::shared_ptr<database_impl>& db, const std::string& queue,
                           const std::string& token) {
  wait_queue::ring_freed(db, queue, 0, token, lock_table::release_wake::look_up());
}

}  // namespace dblock::detail
