// Internal: the watchdog of every lease of one database handle. Two threads per handle, started
// by the first watched lease: the runner renews all due leases in batches (one write
// transaction of a few statements per batch, lock_table::renew_batch), and the watcher reports
// a lease lost when its local validity runs out before a renewal completes (a batch stuck
// behind a dead connection delays no loss report). The runner also deletes the queue entries
// that waiters left behind when they took a lease (wait_queue::deferred_exit).
#pragma once

#include <memory>

namespace dblock::detail {

struct database_impl;
struct lease_state;
namespace wait_queue {
class deferred_exit;
}

class lease_renewer {
 public:
  explicit lease_renewer(std::weak_ptr<database_impl> db);
  /// Stops both threads (detaching the calling one when it is one of them). Never throws.
  ~lease_renewer();
  lease_renewer(const lease_renewer&) = delete;
  lease_renewer& operator=(const lease_renewer&) = delete;

  /// Renews `s` every ttl/3 (a batch going out anyway takes it up to ttl/6 early) until
  /// unwatch() or until it is found lost (then lease_state::mark_lost() reports it, once).
  void watch(const std::shared_ptr<lease_state>& s);
  /// Stops renewing `s`. Once this returns, no loss of `s` is reported by the renewer (a report
  /// of `s` running on another thread is waited for, as the end of a lease's own watchdog
  /// thread used to be; from inside that report, this does not wait). Reports of other leases
  /// are never waited for. When a renewal of `s` is in flight, this waits for that round of
  /// batches to end (at most 2 s, and not past the lease's local validity), so that no renewal
  /// runs on the handle once its last watched lease is released.
  void unwatch(const lease_state* s);
  /// Without renewing `s`: fires its `ended` signal (lease_guard::lost()) once its local
  /// validity runs out, unless unwatch() comes first. For a lease without the watchdog (one with
  /// it gets the signal from its loss report). A lease already watched is left as it is.
  void watch_validity(const std::shared_ptr<lease_state>& s);
  /// Deletes the queue entry `x` on the runner, as soon as it is free (the release that frees
  /// the lease finishes it itself when the runner has not started it).
  void leave_queue_later(std::shared_ptr<wait_queue::deferred_exit> x);

  struct core;

 private:
  std::shared_ptr<core> core_;
};

/// The renewer of `db`, made on first use (thread-safe).
lease_renewer& renewer_of(const std::shared_ptr<database_impl>& db);

}  // namespace dblock::detail
