// Internal: one lease acquisition, shared by its guards (reentrant holds) and its watchdog.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backoff.hpp"
#include "dblock/cancellation.hpp"
#include "dblock/lease_lock.hpp"
#include "dblock/retry.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/session.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail {

using steady = std::chrono::steady_clock;
class gate_pass;
namespace wait_queue {
class deferred_exit;
}

struct lease_state : std::enable_shared_from_this<lease_state> {
  std::shared_ptr<database_impl> db;
  std::string name;
  std::string token;
  std::int64_t fence = 0;
  std::chrono::milliseconds ttl{0};
  std::chrono::milliseconds margin{0};
  std::function<void(const error&)> on_lost;
  std::function<void(const error&)> on_release_error;

  std::atomic<steady::rep> deadline{0};  // steady clock ticks; local validity ends here
  steady::time_point acquired_at;        // when the acquisition succeeded (for metrics)
  std::atomic<bool> lost{false};
  std::atomic<int> holds{0};

  std::atomic<bool> watched{false};  // the handle's renewer renews it (watchdog on)
  /// lease_guard::lost(): fires when the hold ends: lost (mark_lost), released by its last hold
  /// (end_hold), or its local validity ran out (the renewer's watcher: from the loss report
  /// with the watchdog, else through watch_validity() once end_signal() asked for it).
  cancellation ended;
  std::atomic<bool> validity_watched{false};  // lease_renewer::watch_validity() has it
  /// Fires `ended` and every signal also_end() added (once each).
  void fire_ended() noexcept;
  /// `c` fires with `ended` (at once when it has fired): a lock set's lost().
  void also_end(const cancellation& c);
  /// A fair acquisition that came through the waiter queue: others are likely queued behind it,
  /// so its release may hand the lease to the head (lock_statements::release_granting).
  std::atomic<bool> hand_over{false};
  /// A queue-only name (dialect/doorbell.hpp) whose head a release that frees this lease rings
  /// instead of the lease's own queue, from the release statement itself: a semaphore's permit
  /// rings its semaphore's queue (lease/queue_wait.hpp). Set before the guard is handed out.
  std::string ring_also;
  /// lease_mode::session (src/lease/session_mode.cpp): set at the grant, never changed.
  bool session_mode = false;
  /// lease_mode::session: the pooled connection whose server session holds the lock, for the
  /// whole hold (empty once released or lost); its mutex serializes the watchdog's statements
  /// with the holder's.
  std::unique_ptr<session_scope> pinned;
  std::mutex pinned_mu;
  /// lease_mode::session (under pinned_mu): the hold reported itself for status in its first
  /// renewal (session_lock::report()), so its release deletes the report; the acquiring thread.
  bool reported = false;
  std::string holder_thread;
  /// lease_mode::session: one statement on the holding session, which restarts the server's
  /// idle timer (the TTL): the hold's report for status the first time, else `SELECT 1`; false
  /// when it failed (the session, and its lock, are gone: the connection is dropped).
  bool pinned_alive() noexcept;
  /// lease_mode::session: gives the session lock back and the connection to the pool (the last
  /// hold); throws lease_lost when the session had ended.
  void pinned_release();
  /// lease_mode::session: one write transaction on the holding session, for fenced_write()
  /// (lease/fenced.hpp), which bounds it.
  void pinned_write(const std::function<void(session_scope&)>& write, const std::string& what);

  /// The deadline of a call on this lease (renew, release, a fenced write): its TTL less the
  /// safety margin, at least one second (docs/safety.md, "Deadlines").
  std::chrono::milliseconds call_bound() const {
    return std::max<std::chrono::milliseconds>(ttl - margin, std::chrono::seconds(1));
  }
  /// call_bound() in words, for messages.
  std::string call_bound_what() const {
    return std::to_string(call_bound().count()) + " ms (the lease's TTL less its safety margin)";
  }

  /// The local validity ends `lease - margin` after the request was sent.
  void set_deadline(steady::time_point sent, std::chrono::milliseconds lease) {
    deadline.store((sent + lease - margin).time_since_epoch().count());
  }
  steady::time_point deadline_tp() const {
    return steady::time_point(steady::duration(deadline.load()));
  }
  bool valid() const { return !lost.load() && steady::now() < deadline_tp(); }

  ~lease_state();
  /// Keeps the local gate this acquisition came through (wake/gate.hpp) until the lease is
  /// released (or runs out: the gate times the holder's validity).
  void hold_gate(std::shared_ptr<gate_pass> pass);
  /// Passes the local gate on, if it holds one (idempotent).
  void open_gate();
  /// The waiting acquire that took this lease left its queue entry (`ticket`, `token`) behind
  /// (wait_queue::exit_deferred()): the renewer deletes it during the hold, and the release
  /// that frees the lease makes sure it is gone first.
  void leave_queue_later(std::int64_t ticket, const std::string& queue_token);

  /// Reports the loss once (listener, on_lost), and the end of the hold.
  void mark_lost(const error& why, loss_reason reason);
  /// Why a lease whose row now reads `row` (nullopt: gone) is no longer ours.
  loss_reason loss_from(const std::optional<lease_row>& row) const;
  /// loss_from() of the row as it is now (one read); `connection` when it cannot be read.
  loss_reason read_loss() const noexcept;
  /// Reports that this process holds the lease now (listener::holding(); once).
  void start_hold();
  /// Reports that it holds it no longer (released, lost, or gone; once, after start_hold()),
  /// and fires `ended`.
  void end_hold() noexcept;
  /// `ended`, watched for the end of the local validity from now on when the watchdog does
  /// not renew the lease.
  const cancellation& end_signal();
  /// One renewal statement; true when renewed, false when the lease is gone.
  bool renew_sql(std::chrono::milliseconds lease);

  // watchdog.cpp
  /// Hands the lease to the database handle's renewer (lease/renewer.hpp).
  void start_watchdog();
  /// Takes it back (idempotent); no loss is reported by the renewer afterwards.
  void stop_watchdog();

  // guard.cpp
  /// Releases one hold; throws lease_lost when the lease was no longer ours.
  void release_one();

 private:
  /// What release_sent() learned.
  struct release_outcome {
    bool matched = false;   ///< the release applied
    bool in_doubt = false;  ///< a reply was lost on the way
    /// The row was read back after the last lost reply (`row`, nullopt when it was gone) and
    /// decided the outcome.
    bool read = false;
    std::optional<lease_row> row;
    /// What the release returned for the head waiter (sleeper -1: look it up), or the waiter
    /// it handed the lease to; see report_released().
    lock_table::release_wake wake;
  };
  release_outcome release_sent(int left);
  /// `wake`: what the release statement returned for the head waiter, for
  /// wait_queue::ring_freed(); its sleeper is -1 when the release's reply was lost (the head is
  /// looked up instead).
  void report_released(int left, const lock_table::release_wake& wake);

  /// Finishes the deletion of leave_queue_later()'s entry (idempotent).
  void finish_queue_exit() noexcept;
  std::optional<lease_row> read_back(const std::string& what) const;

  std::atomic<bool> holding_{false};  // start_hold() reported, end_hold() not yet
  std::mutex ended_mu;                // guards ended_also
  std::vector<cancellation> ended_also;
  std::mutex gate_mu_;
  std::shared_ptr<gate_pass> gate_;
  std::shared_ptr<wait_queue::deferred_exit> queue_exit_;  // guarded by gate_mu_
};

/// The one backoff of every wait that polls (a lease, a semaphore permit, a rwlock side, a
/// writer waiting for readers to leave): full jitter under a cap of poll_initial doubled per
/// round, at most poll_max. Saturates: any round and any duration (no overflow).
std::chrono::nanoseconds poll_backoff(const lease_options& o, int round);
/// poll_max as nanoseconds, at most a day (milliseconds::max() and the like cannot overflow).
std::chrono::nanoseconds poll_ceiling(const lease_options& o);

}  // namespace dblock::detail
