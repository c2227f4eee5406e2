// The watchdog of a lease: renews at ttl/3 from a background thread and reports the loss before
// the lease can have expired.
#include <algorithm>

#include "lease/state.hpp"
#include "storage/lock_table.hpp"

namespace dblock::detail {

using std::chrono::milliseconds;

void lease_state::mark_lost(const error& why) {
  if (lost.exchange(true)) return;
  db->notify([&](listener& l) { l.lease_lost(name, why); });
  if (on_lost) {
    try {
      on_lost(why);
    } catch (...) {
    }
  }
}

bool lease_state::renew_sql(milliseconds lease) {
  auto sent = steady::now();
  const std::string what = "renew lease '" + name + "'";
  // A lost reply leaves the extension unknown: in_doubt (the watchdog retries it like any
  // failure; renewing again is harmless).
  // A deadlock or busy error of the UPDATE itself (MariaDB meets them beside a reaper's batch)
  // changed nothing: try again, briefly.
  static const retry_policy transient = transient_conflict_policy(3, milliseconds(8));
  bool ok = unknown_outcome_is_in_doubt(what, [&] {
    return retry(transient, [&] {
      return with_session(db, what, [&](session_scope& s) {
        return lock_table::renew(
            s, name, token, fence,
            std::chrono::duration_cast<std::chrono::microseconds>(lease).count());
      });
    });
  });
  if (ok) set_deadline(sent, lease);
  return ok;
}

void lease_state::start_watchdog() {
  // The thread keeps the state alive: it may outlive every guard when it is detached from inside
  // the on_lost callback.
  watchdog = std::thread([self = shared_from_this()] { self->watchdog_loop(); });
}

void lease_state::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lk(mu);
    stop = true;
  }
  cv.notify_all();
  if (watchdog.joinable()) {
    if (watchdog.get_id() == std::this_thread::get_id())
      watchdog.detach();  // released from the on_lost callback itself
    else
      watchdog.join();
  }
}

// Runs one renewal on a helper thread and waits no longer than the local validity: a renewal
// stuck behind a row lock, a busy pool or a dead connection must not delay the loss report.
// Returns the renewal's outcome, or nothing when the validity ran out first (the renewal may
// still land later and extend the lease once; nobody renews it after that).
std::optional<bool> lease_state::renew_bounded(std::optional<error>& failure) {
  struct outcome {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    bool ok = false;
    std::optional<error> err;
  };
  auto out = std::make_shared<outcome>();
  std::thread([self = shared_from_this(), out] {
    bool ok = false;
    std::optional<error> err;
    try {
      ok = self->renew_sql(self->ttl);
    } catch (const error& e) {
      err = e;
    } catch (const std::exception& e) {
      err = error(errc::backend_error, std::string("renew: ") + e.what());
    }
    {
      std::lock_guard<std::mutex> g(out->m);
      out->done = true;
      out->ok = ok;
      out->err = err;
    }
    out->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(out->m);
  if (!out->cv.wait_until(l, deadline_tp(), [&] { return out->done; })) return std::nullopt;
  failure = out->err;
  return out->ok;
}

// One renewal round; false when the watchdog must stop (the loss has been reported).
bool lease_state::watchdog_step(milliseconds interval, milliseconds& wait) {
  wait = interval;
  std::optional<error> failure;
  std::optional<bool> renewed = renew_bounded(failure);
  if (!renewed) {
    mark_lost(error(errc::lease_lost, "lease '" + name +
                                          "': a renewal did not complete before the local "
                                          "validity ran out; watchdog stopped"));
    return false;
  }
  if (!failure) {
    if (*renewed) return true;
    mark_lost(error(errc::lease_lost,
                    "lease '" + name + "' expired or was taken over; watchdog stopped"));
    return false;
  }
  db->notify([&](listener& l) { l.renew_failed(name, *failure); });
  // Transient failure: retry soon, but give up (and say so) before the local validity ends, so
  // the loss is reported before the lease can have expired.
  milliseconds retry = std::max(std::min(interval / 4, milliseconds(250)), milliseconds(1));
  if (steady::now() + retry >= deadline_tp()) {
    mark_lost(error(errc::lease_lost,
                    "lease '" + name +
                        "' could not be renewed before its validity ran out: " + failure->what()));
    return false;
  }
  wait = retry;
  return true;
}

void lease_state::watchdog_loop() {
  const milliseconds interval = std::max(ttl / 3, milliseconds(1));
  milliseconds wait = interval;
  std::unique_lock<std::mutex> lk(mu);
  while (!stop) {
    if (cv.wait_for(lk, wait, [this] { return stop; })) break;
    lk.unlock();
    const bool go_on = watchdog_step(interval, wait);
    lk.lock();
    if (!go_on) break;
  }
}

}  // namespace dblock::detail
