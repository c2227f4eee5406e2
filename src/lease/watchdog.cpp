// The watchdog of a lease: the database handle's renewer (lease/renewer.hpp) renews it at ttl/3
// in batches with the handle's other leases and reports the loss before the lease can have
// expired.
#include <algorithm>

#include "lease/renewer.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"

namespace dblock::detail {

using std::chrono::milliseconds;

void lease_state::mark_lost(const error& why, loss_reason reason) {
  if (lost.exchange(true)) return;
  db->notify([&](listener& l) { l.lost(name, reason, why); });
  end_hold();
  if (on_lost) {
    try {
      on_lost(why);
    } catch (...) {
    }
  }
}

loss_reason lease_state::loss_from(const std::optional<lease_row>& row) const {
  if (!row || row->owner_token == token) return loss_reason::expired;  // gone: reaped
  if (row->owner_token.compare(0, 6, "forced") == 0) return loss_reason::forced;
  return loss_reason::taken_over;
}

loss_reason lease_state::read_loss() const noexcept {
  // A session lease is lost only with its server session (the row shows the marker's owner,
  // which took nothing over).
  if (session_mode) return loss_reason::connection;
  try {
    const call_deadline bound(call_bound(), call_bound_what());
    return loss_from(with_session(db, "read lease '" + name + "' after its loss",
                                  [&](session_scope& s) { return lock_table::read(s, name); }));
  } catch (...) {
    return loss_reason::connection;
  }
}

void lease_state::start_hold() {
  if (!holding_.exchange(true)) db->notify([&](listener& l) { l.holding(name, true); });
}

void lease_state::end_hold() noexcept {
  if (holding_.exchange(false)) db->notify([&](listener& l) { l.holding(name, false); });
  fire_ended();
  if (validity_watched.exchange(false)) {
    try {
      renewer_of(db).unwatch(this);
    } catch (...) {  // it then fires at the validity's end: `ended` has fired already
    }
  }
}

void lease_state::fire_ended() noexcept {
  ended.cancel();
  std::vector<cancellation> also;
  {
    std::lock_guard<std::mutex> lk(ended_mu);
    also.swap(ended_also);
  }
  for (auto& c : also)
    c.cancel();
}

void lease_state::also_end(const cancellation& c) {
  std::unique_lock<std::mutex> lk(ended_mu);
  if (!ended.cancelled()) {
    ended_also.push_back(c);
    return;
  }
  lk.unlock();
  cancellation fired = c;
  fired.cancel();
}

const cancellation& lease_state::end_signal() {
  if (!watched.load() && !ended.cancelled() && !validity_watched.exchange(true))
    renewer_of(db).watch_validity(shared_from_this());
  return ended;
}

bool lease_state::renew_sql(milliseconds lease) {
  const call_deadline bound(call_bound(), call_bound_what());
  if (session_mode) {  // any statement on the holding session renews it
    const auto at = steady::now();
    if (!pinned_alive()) return false;
    // The server's idle timeout stays the TTL of the grant: a longer renewal is not granted.
    set_deadline(at, std::min(lease, ttl));
    return true;
  }
  auto sent = steady::now();
  struct timed {  // listener::renew_latency(), failed renewals included
    const lease_state& s;
    steady::time_point sent;
    ~timed() {
      s.db->notify([&](listener& l) {
        l.renew_latency(
            std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - sent));
      });
    }
  } timer{*this, sent};
  const std::string what = "renew lease '" + name + "'";
  // A deadlock or busy error of the UPDATE itself (MariaDB meets them beside a reaper's batch)
  // changed nothing: try again, briefly.
  const retry_policy& transient = bookkeeping_conflict_policy();
  // A lost reply leaves the extension unknown, but a renewal decides the same when sent again:
  // it extends the lease from the new send (the local deadline then counts from that send), or
  // finds the lease no longer ours. A late landing of the first can only move the server's
  // expiry further out. So a lost reply is resolved by sending again, while the call's bound
  // leaves time; only then is it in_doubt (the watchdog retries it like any failure).
  bool ok = false;
  for (int send = 0;; ++send) {
    sent = steady::now();
    try {
      ok = retry(transient, [&]() -> bool {
        return with_session(db, what, [&](session_scope& s) {
          return lock_table::renew(
              s, name, token, fence,
              std::chrono::duration_cast<std::chrono::microseconds>(lease).count());
        });
      });
      break;
    } catch (const error& e) {
      const bool lost = e.code() == errc::connection_lost || e.code() == errc::in_doubt;
      if (!lost) throw;
      const auto left = call_deadline::left();
      if (send < 2 && (!left || left->count() > 0)) continue;
      throw error(errc::in_doubt,
                  what + ": the reply was lost and the renewal could not be sent again within " +
                      call_deadline::current_what() + "; the lease may or may not be extended (" +
                      e.what() + ")",
                  e.backend(), e.sqlstate(), e.native_code());
    }
  }
  if (ok) set_deadline(sent, lease);
  return ok;
}

void lease_state::start_watchdog() {
  watched.store(true);
  renewer_of(db).watch(shared_from_this());
}

void lease_state::stop_watchdog() {
  if (watched.exchange(false)) renewer_of(db).unwatch(this);
}

}  // namespace dblock::detail
