// lease_mode::session: a lease held as a server session lock (PostgreSQL's session-level advisory
// lock) by one pooled connection pinned for the hold. The statements are in
// storage/session_lock; docs/session-leases.md has the design.
//
// - Exclusion: the session lock of a key the server hashes from the prefix and the name. A name
//   in session mode has a marker (its lock row, held for good by session_lock::session_mode_token),
//   so a durable lease of the name is refused while it is in session mode.
// - Fence: the marker's fence plus the next value of a sequence, read in the lock statement.
// - TTL: the server ends the holding session when it stays idle past the TTL
//   (idle_session_timeout, idle_in_transaction_session_timeout), which frees the lock; the
//   watchdog's renewal is one statement on that session (the first one also reports the hold
//   for status: session_lock::report()).
// - Deadlines: each use of the pinned connection is armed with its call's deadline; a connection
//   whose statement failed, or whose deadline fired, is dropped (its session ends, and any lock
//   it may hold with it), never given back to the pool.
#include <unistd.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/cancel_access.hpp"
#include "core/identifier.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/session_lock.hpp"
#include "storage/write_scope.hpp"

namespace dblock {

namespace {

using detail::steady;
using std::chrono::milliseconds;

// A use of the pinned connection, armed with the calling thread's deadline, disarmed after.
class pinned_use {
 public:
  explicit pinned_use(detail::session_scope& s) : s_(s) {
    if (auto until = detail::call_deadline::current())
      s_.arm(*until, detail::call_deadline::current_what());
  }
  pinned_use(const pinned_use&) = delete;
  pinned_use& operator=(const pinned_use&) = delete;
  ~pinned_use() { s_.disarm(); }

 private:
  detail::session_scope& s_;
};

// While a session waits in the server's lock queue: a thread that cancels the statement when
// `cancel` is cancelled (the dialect's interrupter, as a deadline would). fired(): it did; the
// connection must then be dropped whatever the wait returned (a late cancel must never hit a
// later statement).
class cancel_watch {
 public:
  cancel_watch(detail::session_scope& s, const cancellation& cancel) : cancel_(cancel) {
    auto target = s.dia().conn.interrupter_for(s.sql(), s.state());
    std::function<void()> ask = target ? target->cancel() : std::function<void()>();
    thread_ = std::thread([this, ask] {
      while (!done_.load()) {
        detail::cancel_access::wait(cancel_, std::chrono::hours(1), done_, slot_);
        if (!done_.load() && cancel_.cancelled()) {
          fired_.store(true);
          if (ask) ask();
          return;
        }
      }
    });
  }
  cancel_watch(const cancel_watch&) = delete;
  cancel_watch& operator=(const cancel_watch&) = delete;
  ~cancel_watch() { stop(); }
  /// Ends the watch: once it returns, no cancel is sent any more.
  void stop() {
    if (!thread_.joinable()) return;
    done_.store(true);
    detail::cancel_access::poke(slot_);
    thread_.join();
  }
  bool fired() const { return fired_.load(); }

 private:
  const cancellation& cancel_;
  std::atomic<bool> done_{false}, fired_{false};
  detail::wake_slot slot_;
  std::thread thread_;
};

// One wait in the server's lock queue, cancelled on the server when `cancel` is: nothing then,
// and the connection is marked broken (a lock it may have got ends with its session).
std::optional<detail::session_lock::tried> wait_watched(detail::session_scope& s,
                                                        const std::string& name,
                                                        std::int64_t ttl_ms,
                                                        const cancellation& cancel) {
  std::optional<detail::session_lock::tried> r;
  std::exception_ptr failed;
  bool fired = false;
  {
    cancel_watch watch(s, cancel);
    try {
      r = detail::session_lock::wait_lock(s, name, ttl_ms);
    } catch (...) {
      failed = std::current_exception();
    }
    watch.stop();  // read fired() only now: the watch may fire until it has stopped
    fired = watch.fired();
  }
  if (fired) s.mark_broken();
  if (failed) std::rethrow_exception(failed);
  if (fired) return std::nullopt;
  return r;
}

}  // namespace

void lease_lock::impl::session_checks() const {
  const auto& dbi = detail::access::impl(db);
  // The messages are built only when thrown: this runs on every acquire.
  auto what = [&] { return "lease '" + detail::printable(name) + "'"; };
  if (!dbi->statements.can.session_leases)
    throw error(errc::invalid_argument,
                what() + ": lease_mode::session needs PostgreSQL or MariaDB (" + dbi->backend +
                    " has no session lock with a server-enforced idle timeout here yet)");
  if (db.options().pooler == pooler_mode::transaction)
    throw error(errc::invalid_argument,
                what() +
                    ": lease_mode::session cannot work behind a transaction-mode pooler (a "
                    "session lock lives in one server session); use a direct URL");
}

std::optional<lease_guard> lease_lock::impl::session_reentry() {
  auto cur = current;
  if (!(cur && cur->holds.load() > 0 && cur->valid())) return std::nullopt;
  cur->holds.fetch_add(1);  // the same session lock
  return lease_guard(cur);
}

lease_guard lease_lock::impl::session_granted(std::unique_ptr<detail::session_scope> s,
                                              std::int64_t fence, steady::time_point sent) {
  s->disarm();
  // A deadline that fired during the grant's statements sent a cancel that may still reach a
  // later statement of this session (the holder's release or fenced write): given up, not held.
  if (s->deadline_fired()) {
    s->mark_broken();
    throw error(errc::timeout,
                "acquire lease '" + detail::printable(name) + "': " + s->deadline_cause());
  }
  detail::acquire_params p;
  p.name = name;
  p.owner_token = detail::new_owner_token();
  pinning = std::move(s);
  // As a row grant (acquire.cpp, wait.cpp): the whole call, its wait included.
  const auto started = detail::acquire_call::started_here().value_or(sent);
  detail::access::impl(db)->notify([&](listener& l) {
    l.acquired(name, fence,
               std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - started));
  });
  return granted(p, fence, sent, false);
}

std::optional<lease_guard> lease_lock::impl::session_attempt() {
  session_checks();
  if (auto g = session_reentry()) return g;
  const auto& dbi = detail::access::impl(db);
  auto what = [&] { return "acquire lease '" + detail::printable(name) + "' (session mode)"; };
  auto s = dbi->lease(dbi, true, true);  // armed with the call's deadline
  // Refused before anything runs: the healthy connection goes back to the pool.
  if (const char* why = detail::session_lock::refusal(*s))
    throw error(errc::invalid_argument, what() + ": lease_mode::session " + why);
  const auto sent = steady::now();
  try {
    auto r = detail::session_lock::try_lock(*s, name, options.ttl.count());
    if (r.kind == detail::session_lock::tried::unmarked) {
      if (!detail::session_lock::mark(*s, name)) {  // a durable lease holds the name
        dbi->refused_tries.fetch_add(1, std::memory_order_relaxed);
        return std::nullopt;
      }
      r = detail::session_lock::try_lock(*s, name, options.ttl.count());
    }
    if (s->deadline_fired()) throw error(errc::timeout, what() + ": " + s->deadline_cause());
    if (r.kind != detail::session_lock::tried::granted) {
      dbi->refused_tries.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    return session_granted(std::move(s), r.fence, sent);
  } catch (const soci::soci_error&) {
    s->mark_broken();  // whatever the session may hold ends with it
    throw s->failure(what());
  } catch (...) {
    if (s) s->mark_broken();  // (session_granted() took it, and dropped it, when it threw)
    throw;
  }
}

lease_guard lease_lock::impl::session_wait(steady::time_point deadline, const cancellation& cancel,
                                           detail::acquire_call& call) {
  session_checks();
  const auto start = steady::now();
  const std::string what = "acquire lease '" + detail::printable(name) + "'";
  auto timed_out = [&] {
    return error(errc::timeout, what + ": not acquired within " +
                                    detail::wait_text(start, deadline) +
                                    " (session mode: still held)");
  };
  if (cancel.cancelled()) throw error(errc::cancelled, what + ": cancelled");
  {
    // One try first: a free lease is taken without a wait (and without a watch thread).
    const auto try_bound = std::max(deadline, start + std::min(options.ttl, milliseconds(1000)));
    const detail::call_deadline bound(try_bound,
                                      "the wait of " + detail::wait_text(start, deadline));
    try {
      if (auto g = session_attempt()) return std::move(*g);
    } catch (const error& e) {  // unreachable now: the wait below tries again until its end
      if (e.code() != errc::connection_lost && e.code() != errc::connection_failed) throw;
    }
  }
  call.refused();
  call.waits();
  const auto& dbi = detail::access::impl(db);
  const detail::call_deadline bound(deadline, "the wait of " + detail::wait_text(start, deadline));
  // Rides out a failover as a row-mode wait does (promise D2): a server that cannot be reached or
  // a connection lost is waited on again from a new session until the deadline. A lock that the
  // lost session may have got died with it, or is freed by the server at the TTL (the grant
  // statement set the session's idle timeouts).
  for (int failures = 0;; ++failures) {
    try {
      return session_wait_once(deadline, cancel, what, timed_out);
    } catch (const error& e) {
      if (e.code() != errc::connection_lost && e.code() != errc::connection_failed) throw;
      if (steady::now() >= deadline) throw timed_out();
      dbi->notify([&](listener& l) {
        l.log(log_level::warning, what + ": " + e.what() + "; waiting again until the wait's end");
      });
      const auto pause = std::min<std::chrono::nanoseconds>(detail::failure_backoff(failures),
                                                            deadline - steady::now());
      if (cancel.sleep_for(pause)) throw error(errc::cancelled, what + ": cancelled");
    }
  }
}

lease_guard lease_lock::impl::session_wait_once(steady::time_point deadline,
                                                const cancellation& cancel, const std::string& what,
                                                const std::function<error()>& timed_out) {
  const auto& dbi = detail::access::impl(db);
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - steady::now());
    if (left.count() <= 0) throw timed_out();
    auto s = dbi->lease(dbi, true, true);  // armed with the wait's deadline
    if (const char* why = detail::session_lock::refusal(*s))
      throw error(errc::invalid_argument, what + ": lease_mode::session " + why);
    try {
      detail::session_lock::set_lock_timeout(*s, left.count());
      const auto r = wait_watched(*s, name, options.ttl.count(), cancel);
      if (!r) throw error(errc::cancelled, what + ": cancelled");
      if (s->deadline_fired()) throw timed_out();
      if (r->kind == detail::session_lock::tried::granted) {
        // The server's idle timer starts when a statement ends: one more statement now, so the
        // lease's validity counts from it rather than from the start of the wait.
        const auto sent = steady::now();
        int one = 0;
        s->sql() << "SELECT 1", soci::into(one);
        return session_granted(std::move(s), r->fence, sent);
      }
      if (r->kind == detail::session_lock::tried::held) continue;  // the server's wait ran out
      // No marker yet (the lock was given back): mark the name, or wait for its durable holder.
      if (!detail::session_lock::mark(*s, name) && cancel.sleep_for(milliseconds(50)))
        throw error(errc::cancelled, what + ": cancelled");
    } catch (const soci::soci_error&) {
      s->mark_broken();
      const error e = s->failure(what);
      if (cancel.cancelled()) throw error(errc::cancelled, what + ": cancelled");
      if (e.code() == errc::lock_not_available || e.code() == errc::timeout ||
          s->deadline_fired() || steady::now() >= deadline)
        throw timed_out();
      // PostgreSQL under REPEATABLE READ or SERIALIZABLE: the marker changed after the wait's
      // snapshot (leave_session_mode(), migration 0017). The connection, and the lock it got,
      // are dropped; wait again.
      if (e.code() == errc::serialization_failure) continue;
      throw e;
    } catch (...) {
      if (s) s->mark_broken();  // (session_granted() took it, and dropped it, when it threw)
      throw;
    }
  }
}

namespace detail {

bool lease_state::pinned_alive() noexcept {
  std::lock_guard<std::mutex> l(pinned_mu);
  if (!pinned) return false;
  try {
    const call_deadline bound(call_bound(), call_bound_what());
    pinned_use use(*pinned);
    if (!reported) {
      // A hold that lasts shows in status: its fence, age and client (one statement that
      // renews as well; a short hold never writes it).
      reported = true;
      session_lock::hold_report r;
      r.fence = fence;
      r.held_us = std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - acquired_at)
                      .count();
      r.host = host_name();
      r.pid = static_cast<std::int64_t>(::getpid());
      r.thread = holder_thread;
      if (session_lock::report(*pinned, name, r) && !pinned->deadline_fired()) return true;
    }
    int one = 0;
    pinned->sql() << "SELECT 1", soci::into(one);
    if (one == 1 && !pinned->deadline_fired()) return true;
  } catch (...) {
  }
  pinned->mark_broken();  // the session ended, and its lock with it
  pinned.reset();
  return false;
}

void lease_state::pinned_release() {
  std::unique_ptr<session_scope> s;
  bool report_made = false;
  {
    std::lock_guard<std::mutex> l(pinned_mu);
    s = std::move(pinned);
    report_made = reported;
  }
  bool held = false;
  if (s) {
    try {
      pinned_use use(*s);
      held = session_lock::unlock(*s, name) && !s->deadline_fired();
      // After the unlock, so that the next holder is not kept waiting. If it fails the
      // connection is dropped: a report left behind then belongs to a session that has ended.
      if (held && report_made) {
        try {
          session_lock::unreport(*s, name);
        } catch (...) {
          s->mark_broken();
        }
      }
    } catch (...) {
      held = false;
    }
    if (!held) s->mark_broken();
    s.reset();  // back to the pool (its timeouts reset by the unlock), or closed
  }
  if (!held) {
    error e(errc::lease_lost, "release lease '" + name +
                                  "': the lease was lost (its server session ended, and the "
                                  "session lock with it)");
    mark_lost(e, loss_reason::connection);
    throw e;
  }
}

void lease_state::pinned_write(const std::function<void(session_scope&)>& write,
                               const std::string& what) {
  std::exception_ptr failure;
  bool session_gone = false;
  {
    std::lock_guard<std::mutex> l(pinned_mu);
    if (!pinned) {
      session_gone = true;
    } else {
      session_scope& s = *pinned;
      try {
        pinned_use use(s);
        // One transaction on the holding session: it commits only while the session lives, and
        // the session lock lives exactly as long (a lost COMMIT reply is in_doubt).
        write_scope w(s, write_kind::transaction, what);
        write(s);
        w.commit();
        if (!s.deadline_fired()) return;
        throw error(errc::in_doubt, what + ": " + s.deadline_cause());
      } catch (...) {
        failure = std::current_exception();
        if (s.broken() || s.deadline_fired()) {
          s.mark_broken();
          pinned.reset();
          session_gone = true;
        }
      }
    }
  }
  if (!session_gone) std::rethrow_exception(failure);
  // Reported outside the mutex: the loss callback is the caller's code. A COMMIT whose reply was
  // lost stays in_doubt; any other failure of a session that ended wrote nothing.
  std::string cause;
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const error& e) {
      if (e.code() == errc::in_doubt) {
        mark_lost(e, loss_reason::connection);
        throw;
      }
      cause = std::string(" (") + e.what() + ")";
    } catch (...) {
    }
  }
  error e(errc::lease_lost, what +
                                ": the lease's server session ended, and its session lock with "
                                "it; nothing was written" +
                                cause);
  mark_lost(e, loss_reason::connection);
  throw e;
}

}  // namespace detail

}  // namespace dblock
