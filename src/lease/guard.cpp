// A held lease: the guard (release, renew, accessors) and fenced writes.
#include <algorithm>
#include <mutex>
#include <utility>

#include "core/cancel_access.hpp"
#include "core/identifier.hpp"
#include "dblock/retry.hpp"
#include "lease/fenced.hpp"
#include "lease/renewer.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"
#include "storage/wait_queue.hpp"
#include "storage/write_scope.hpp"
#include "wake/gate.hpp"
#include "wake/hub.hpp"
#include "wake/ring.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;

namespace detail {
namespace {

std::mutex handler_mu;
std::function<void(const error&)>& default_handler() {
  static std::function<void(const error&)> h;
  return h;
}

}  // namespace

lease_state::~lease_state() {
  end_hold();
  open_gate();
}

void lease_state::hold_gate(std::shared_ptr<gate_pass> pass) {
  // The gate times this holder: its local validity, nothing once lost. The state outlives the
  // binding: its destructor leaves the gate, which drops the binding first.
  pass->bind([this] { return lost.load() ? steady::time_point::min() : deadline_tp(); });
  std::lock_guard<std::mutex> l(gate_mu_);
  gate_ = std::move(pass);
}

void lease_state::open_gate() {
  std::shared_ptr<gate_pass> p;
  {
    std::lock_guard<std::mutex> l(gate_mu_);
    p = gate_;
  }
  if (p) p->leave();
}

void lease_state::leave_queue_later(std::int64_t ticket, const std::string& queue_token) {
  auto x = std::make_shared<wait_queue::deferred_exit>(name, ticket, queue_token);
  std::shared_ptr<wait_queue::deferred_exit> old;
  {
    std::lock_guard<std::mutex> l(gate_mu_);
    old = std::exchange(queue_exit_, x);
  }
  if (old) old->finish(db, milliseconds(0), true);
  try {
    renewer_of(db).leave_queue_later(x);
  } catch (...) {
    x->finish(db, milliseconds(0), true);  // no renewer thread: now, then
  }
}

void lease_state::finish_queue_exit() noexcept {
  std::shared_ptr<wait_queue::deferred_exit> x;
  {
    std::lock_guard<std::mutex> l(gate_mu_);
    x = std::move(queue_exit_);
  }
  // Normally long done by the renewer; a deletion in flight is waited for (briefly: the lease
  // is released anyway, and the entry expires within its TTL).
  if (x) x->finish(db, milliseconds(2000), true);
}

void lease_state::report_released(int left, const lock_table::release_wake& wake) {
  // The lease is free: the next local contender goes first (it needs no ring), then a waiter
  // is woken now rather than at its next poll.
  if (left == 0) {
    open_gate();
    // A permit rings its semaphore's waiters instead (fence 0: the row's fence is not the
    // queue's); the release statement looked up that queue's head (release_wake::queue).
    if (ring_also.empty())
      wait_queue::ring_freed(db, name, fence, token, wake);
    else
      wait_queue::ring_freed(db, ring_also, 0, token, wake);
  }
  db->notify([&](listener& l) {
    l.released(name,
               std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - acquired_at));
  });
  if (left == 0) end_hold();
}

// Sends the release (transient conflicts retried). A lost reply: the server session is ended,
// then the row decides: applied (matched, the head to be looked up), not applied (sent again),
// or no longer ours (not matched; the row read is kept for the caller).
lease_state::release_outcome lease_state::release_sent(int left) {
  const std::string what = "release lease '" + name + "'";
  // Where the release may leave a head of this host to this process (PostgreSQL's host relay).
  release_outcome out;
  if (left == 0) {
    out.wake.bell = db->hub->relay_bell();
    out.wake.hand_over = hand_over.load();
    out.wake.queue = ring_also;
  }
  for (int round = 0; round < 3; ++round) {
    session_ref server;
    out.read = false;
    try {
      out.matched = retry(bookkeeping_conflict_policy(), [&] {
        return with_session(db, what, [&](session_scope& s) {
          server = s.server();
          return lock_table::release(s, name, token, fence, &out.wake);
        });
      });
      return out;
    } catch (const error& e) {
      if (e.code() != errc::connection_lost) throw;
    }
    // The UPDATE may have been applied: never repeat it blindly (with reentrant holds a repeat
    // would drop a hold that is still in use). Read the row back and decide.
    if (!end_broken_session(db, server))
      throw error(errc::in_doubt, what + ": the connection broke and " + session_not_ended(*db));
    out.in_doubt = true;
    out.row = read_back(what);
    out.read = true;
    const auto& row = out.row;
    const bool ours = row && row->owner_token == token && row->fence == fence;
    if (ours && row->hold_count == left) {  // it was applied; its reply named no head
      out.matched = true;
      out.wake.sleeper = -1;
      return out;
    }
    if (!(ours && row->hold_count == left + 1 && row->expires_at_us > row->now_us)) return out;
    // It was not applied: send it again.
  }
  return out;
}

namespace {

// What the lock row showed when a release found the lease no longer ours (never the owner token,
// which would let a reader release that lease).
std::string row_after_loss(const std::optional<lease_row>& row, const std::string& token) {
  if (!row) return "the row is gone (reaped)";
  const long long left_ms = (row->expires_at_us - row->now_us) / 1000;
  const std::string expiry = left_ms > 0 ? "expires in " + std::to_string(left_ms) + " ms"
                                         : "expired " + std::to_string(-left_ms) + " ms ago";
  std::string who = printable(row->holder_host) + ":" + std::to_string(row->holder_pid);
  if (!row->holder_thread.empty()) who += " thread " + printable(row->holder_thread);
  const std::string holds = "hold count " + std::to_string(row->hold_count);
  if (row->owner_token == token)
    return "the row is still this lease's at fence " + std::to_string(row->fence) + ", " + holds +
           ", " + expiry;
  const bool held = row->hold_count > 0 && left_ms > 0;
  return "the row is at fence " + std::to_string(row->fence) + ", " +
         (held ? "held by " : "last held by ") + who + ", " + holds + ", " + expiry;
}

}  // namespace

// The row after a release whose reply was lost. Only the read is tried again when its own
// connection breaks, never the release: the outcome decides that.
std::optional<lease_row> lease_state::read_back(const std::string& what) const {
  try {
    return read_retried(db, what, [&](session_scope& s) { return lock_table::read(s, name); });
  } catch (const error& e) {
    if (e.code() != errc::connection_lost) throw;
    throw error(
        errc::in_doubt,
        what + ": the connection broke and the outcome could not be read back: " + e.what());
  }
}

void lease_state::release_one() {
  const call_deadline bound(call_bound(), call_bound_what());
  if (session_mode) {  // the session lock goes with the last hold
    if (holds.fetch_sub(1) - 1 > 0) return;
    stop_watchdog();
    struct ender {
      lease_state* s;
      ~ender() { s->end_hold(); }
    } end{this};
    pinned_release();
    return;
  }
  const int left = holds.fetch_sub(1) - 1;
  if (left == 0) {
    stop_watchdog();
    finish_queue_exit();  // the queue entry goes before the lease is freed
  }
  // The last hold: whatever the outcome, the next local waiter goes to the database after it,
  // and this process holds the lease no longer (listener::holding(), also when the release
  // failed: the guard is spent, and the row runs out at its TTL).
  struct gate_opener {
    lease_state* s;
    ~gate_opener() {
      if (!s) return;
      s->open_gate();
      s->end_hold();
    }
  } opener{left == 0 ? this : nullptr};
  release_outcome sent = release_sent(left);
  if (sent.matched) {
    report_released(left, sent.wake);
    return;
  }
  const bool in_doubt = sent.in_doubt;
  // Not matched: already released by an earlier attempt whose reply was lost, or lost. The row
  // as the read-back after a lost reply saw it, else as it is now.
  const std::optional<lease_row> row =
      sent.read ? std::move(sent.row)
                : with_session(db, "release lease '" + name + "'",
                               [&](session_scope& s) { return lock_table::read(s, name); });
  if (row && row->owner_token == token && row->fence == fence && row->hold_count == left) {
    report_released(
        left,
        lock_table::release_wake::look_up());  // an earlier attempt whose reply was lost did it
    return;
  }
  if (in_doubt && (!row || row->owner_token != token)) {
    // Our release may have gone through before someone else took the free lease; either way the
    // lease is no longer ours and the successor's row was not touched.
    report_released(left, lock_table::release_wake::look_up());
    return;
  }
  const std::string now = row_after_loss(row, token);
  mark_lost(error(errc::lease_lost, "lease '" + name + "' was lost before release (" + now + ")"),
            loss_from(row));
  throw error(errc::lease_lost, "lease '" + name + "' (fence " + std::to_string(fence) +
                                    ") had expired or been taken over before release; " + now +
                                    "; the successor's row was left untouched");
}

}  // namespace detail

void set_default_error_handler(std::function<void(const error&)> handler) {
  std::lock_guard<std::mutex> lk(detail::handler_mu);
  detail::default_handler() = std::move(handler);
}

lease_guard::lease_guard(std::shared_ptr<detail::lease_state> s) : state_(std::move(s)) {}
lease_guard::lease_guard(lease_guard&&) noexcept = default;
lease_guard& lease_guard::operator=(lease_guard&& other) noexcept {
  if (this != &other) {
    lease_guard old(std::move(*this));  // releases our current hold, if any
    state_ = std::move(other.state_);
  }
  return *this;
}

lease_guard::~lease_guard() {
  if (!state_) return;
  auto s = std::move(state_);
  try {
    s->release_one();
  } catch (const error& e) {
    std::function<void(const error&)> h = s->on_release_error;
    if (!h) {
      std::lock_guard<std::mutex> lk(detail::handler_mu);
      h = detail::default_handler();
    }
    if (h) {
      try {
        h(e);
      } catch (...) {
      }
    }
  } catch (...) {
  }
}

std::int64_t lease_guard::fence() const noexcept {
  return state_ ? state_->fence : 0;
}
const std::string& lease_guard::owner_token() const noexcept {
  static const std::string empty;
  return state_ ? state_->token : empty;
}
const std::string& lease_guard::name() const noexcept {
  static const std::string empty;
  return state_ ? state_->name : empty;
}
int lease_guard::hold_count() const noexcept {
  return state_ ? state_->holds.load() : 0;
}
bool lease_guard::valid() const noexcept {
  return state_ && state_->valid();
}
cancellation lease_guard::lost() const {
  return state_ ? state_->end_signal() : detail::cancel_access::fired();
}

milliseconds lease_guard::remaining() const noexcept {
  if (!valid()) return milliseconds(0);
  auto left = state_->deadline_tp() - steady::now();
  return std::max(std::chrono::duration_cast<milliseconds>(left), milliseconds(0));
}

void lease_guard::renew(std::optional<milliseconds> ttl) {
  if (!state_) throw error(errc::not_owner, "renew: the guard holds no lease");
  milliseconds lease = ttl.value_or(state_->ttl);
  if (lease < milliseconds(10) || lease <= state_->margin)
    throw error(errc::invalid_argument, "renew: ttl must be at least 10 ms and above the margin");
  if (state_->lost.load())
    throw error(errc::lease_lost, "renew lease '" + state_->name + "': the lease was lost");
  const detail::call_deadline bound(state_->call_bound(), state_->call_bound_what());
  if (!state_->renew_sql(lease)) {
    const loss_reason why = state_->read_loss();
    error e(errc::lease_lost,
            "renew lease '" + state_->name +
                (why == loss_reason::connection
                     ? "': its connection to the database was lost (a session lease: its server "
                       "session ended, and the session lock with it)"
                     : "': it had expired or been taken over; the successor's row was left "
                       "untouched"));
    state_->mark_lost(e, why);
    throw e;
  }
}

void lease_guard::release() {
  if (!state_) throw error(errc::not_owner, "release: the guard holds no lease");
  auto s = std::move(state_);
  s->release_one();
}

void lease_guard::fenced(const std::function<void(soci::session&)>& write) {
  if (!state_) throw error(errc::not_owner, "fenced write: the guard holds no lease");
  detail::fenced_user_write({state_.get()}, write,
                            "fenced write under lease '" + state_->name + "'");
}

}  // namespace dblock
