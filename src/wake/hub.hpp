// Internal: wake-ups for waiters of one database handle. A waiting acquire enlists here before it
// reads the lock row; a release rings the name, and the hub wakes one waiter of that name in this
// process (the head of the fair queue when known, else the longest waiting), never all of them.
// Rings come from this process's own releases at once, and from other processes through the
// dialect's doorbell channel (PostgreSQL LISTEN/NOTIFY, a doorbell directory beside a SQLite
// file). Correctness never depends on a ring: waiters still poll, bounded by the holder's expiry.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "dblock/cancellation.hpp"
#include "dialect/dialect.hpp"
#include "wake/gate.hpp"

namespace dblock::detail {

/// One waiting acquire, as the hub knows it.
struct wake_waiter {
  std::string name;
  std::uint64_t name_hash = 0;
  std::string token;        ///< owner token of its queue entry and of its acquire attempts
  std::int64_t ticket = 0;  ///< its queue ticket (0 until enqueued); guarded by the hub's mutex
  cancellation cancel;
  wake_slot slot;  ///< wakes this waiter alone (a shared cancellation wakes all on cancel only)
  std::atomic<bool> rung{false};
  /// Its subscription to an addressed channel is confirmed (see bell_channel::addressed()).
  std::atomic<bool> subscribed{false};
  /// Woken to look again (its subscription was confirmed, or the channel was lost), not by a
  /// release: it reads before it tries.
  std::atomic<bool> relook{false};
  /// It read the lock without rings reaching it (it polls): a confirmation wakes it to look
  /// again. One that confirmed before its read needs no second read.
  std::atomic<bool> polling{false};
  /// A release handed it the lease at this fence (0: not); set with `rung`, guarded by the
  /// hub's mutex until taken (hub_entry::granted()).
  std::atomic<std::int64_t> granted_fence{0};
  /// In wait(), blocked until rung or its time is up (what tests watch: see asleep_on_rings()).
  std::atomic<bool> asleep{false};
};

/// The wake-ups of one database handle (see the file comment). Thread-safe.
class wake_hub {
 public:
  /// `target` is the dialect's doorbell target (empty: wake-ups within this process only).
  wake_hub(const dialect& d, std::string target, table_names tables,
           std::shared_ptr<listener> events);
  ~wake_hub();
  wake_hub(const wake_hub&) = delete;
  wake_hub& operator=(const wake_hub&) = delete;

  /// Registers a waiter; the doorbell channel is opened on first use.
  std::shared_ptr<wake_waiter> enlist(const std::string& name, const std::string& token,
                                      const cancellation& cancel);
  /// Records the waiter's queue ticket (the order among this process's waiters).
  void set_ticket(wake_waiter& w, std::int64_t ticket);
  /// Unregisters; a ring it received but did not use (it gives up without the lease) passes on
  /// to the next waiter of the name.
  void leave(const std::shared_ptr<wake_waiter>& w, bool acquired);
  /// Sleeps up to `d`; true when rung (the ring is consumed), false when `d` passed or the wait
  /// was cancelled (check the cancellation).
  bool wait(wake_waiter& w, std::chrono::nanoseconds d);
  /// The lease of `name` with fence `fence` was freed by this process: wakes a local waiter and
  /// rings the other processes where the database does not (dialect doorbell).
  void released(const std::string& name, std::int64_t fence, const std::string& head,
                const std::string& head_bell);
  /// The bell of the host relay this handle's releases may ring through (doorbell::relay_bell();
  /// empty: none).
  /// Looked up once per handle (every release that frees a lease passes it).
  const std::string& relay_bell() const {
    std::call_once(relay_once_, [this] { relay_bell_ = dia_.bell.relay_bell(target_); });
    return relay_bell_;
  }
  /// Rings handle `handle` of this host, which the release of `name` at `fence` left to this
  /// process (doorbell::ring_handle()); false when it could not.
  /// `granted_ticket` > 0: the release handed that waiter the lease at `fence`.
  bool ring_handle(const std::string& name, std::int64_t fence, std::int64_t handle,
                   std::int64_t granted_ticket) const {
    return dia_.bell.ring_handle(target_, name, fence, handle, granted_ticket);
  }
  /// A release handed the lease of `name` to this handle's waiter with queue ticket `ticket` at
  /// `fence`: wakes that waiter alone, which then holds the lease without a statement. False
  /// when no such waiter is here (it left, or has not recorded its ticket yet: it finds the
  /// lease its own at its next read).
  bool granted(const std::string& name, std::int64_t ticket, std::int64_t fence);
  /// A release of this process handed the lease of `name` at `fence` to the waiter with queue
  /// ticket `ticket`, and only that waiter is woken, with the grant: by granted() when it waits
  /// in this handle, else by a ring that names the ticket (on which its handle hands it over
  /// likewise), addressed by the head's `bell` (SQLite: its queue entry's, its handle's
  /// directory; doorbell::ring()) or, without one, by its `handle` on this host (PostgreSQL:
  /// through the host relay; doorbell::ring_handle()). A lost ring: the waiter finds the lease
  /// its own at its next read (poll_max).
  void handed_to(const std::string& name, std::int64_t fence, std::int64_t ticket,
                 std::int64_t handle, const std::string& bell);
  /// Wakes `w` now, whatever rang (a follower of an election hears of a change made through
  /// another handle of this process, which its channel may not bring).
  void ring(wake_waiter& w) {
    std::lock_guard<std::mutex> l(mu_);
    wake(w);
  }
  /// True when rings from other processes can reach this handle (it has a doorbell target).
  bool rings_across() const { return !target_.empty(); }
  /// True when released() should be given the head of the queue (see doorbell::rings_head()).
  bool wants_head() const { return !target_.empty() && dia_.bell.rings_head(target_); }
  /// True while rings from other processes are known to reach `w`: it may then sleep until the
  /// holder's expiry instead of polling.
  bool live(const wake_waiter& w) const;
  /// bell_channel::joined_recheck() of this handle's channel (0 while it has none).
  std::chrono::milliseconds joined_recheck() const;
  /// True when `id` is this handle's own wake-up connection or relay handle
  /// (bell_channel::is_self(); a release then wakes the waiter here without ringing it).
  bool is_own_bell(std::int64_t id) const;
  /// The wake-up address for this handle's queue entries (bell_channel::address()).
  std::string address();
  /// The local gates of this handle's waiting acquires that are not fair (wake/gate.hpp).
  local_gates& gates() { return gates_; }
  /// Waiters asleep in wait() that rings reach (live()) and that no ring has woken yet: each has
  /// read the lock since it was last woken and relies on rings now, so a release from here on
  /// wakes one of them. For tests, which release only once a waiter is there.
  std::size_t asleep_on_rings() const;
  /// Waiters woken so far (each ring wakes at most one per process).
  std::uint64_t woken() const { return woken_.load(); }

 private:
  void deliver(const ring_event& ev);
  void wake_all();
  void confirmed(const std::string& token, bool on);
  /// With mu_ held: wakes the waiter of `hash`/`name` that should try now: the head of the
  /// queue when `head` names it (nobody when it waits elsewhere), else the lowest ticket here.
  bool wake_one(std::uint64_t hash, const std::string& name, const std::string& head);
  /// With mu_ held: rings `w` (it wakes, and the listener hears of it).
  void wake(wake_waiter& w);
  bool duplicate(std::uint64_t hash, std::int64_t fence);
  /// With mu_ held: hands the waiter of `hash`/`name` with `ticket` the lease at `fence`.
  bool grant_one(std::uint64_t hash, const std::string& name, std::int64_t ticket,
                 std::int64_t fence);
  void ensure_channel();

  const dialect& dia_;
  const std::string target_;
  const table_names tables_;
  std::shared_ptr<listener> events_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<wake_waiter>> waiters_;            // in arrival order
  std::unordered_map<std::uint64_t, std::int64_t> last_rung_;  // name hash -> fence rung last
  /// Grants for a ticket no waiter here has recorded yet: ticket -> (name hash, fence).
  std::unordered_map<std::int64_t, std::pair<std::uint64_t, std::int64_t>> early_grants_;
  std::mutex channel_mu_;
  std::unique_ptr<bell_channel> channel_;
  std::atomic<bool> channel_opened_{false};
  std::atomic<std::uint64_t> woken_{0};
  local_gates gates_;
  mutable std::once_flag relay_once_;
  mutable std::string relay_bell_;
};

/// A waiter's enlistment for the length of one waiting acquire (leaves on destruction).
class hub_entry {
 public:
  hub_entry(wake_hub& hub, const std::string& name, const std::string& token,
            const cancellation& cancel)
      : hub_(hub), w_(hub.enlist(name, token, cancel)) {}
  ~hub_entry() { hub_.leave(w_, acquired_); }
  hub_entry(const hub_entry&) = delete;
  hub_entry& operator=(const hub_entry&) = delete;
  /// Sleeps up to `d`; true when rung.
  bool wait(std::chrono::nanoseconds d) { return hub_.wait(*w_, d); }
  /// True while rings from other processes reach this waiter (wake_hub::live()); a waiter
  /// asks before each read, and a confirmation wakes it to read again only when it was false.
  bool live() const {
    w_->polling.store(true);
    const bool l = hub_.live(*w_);
    if (l) w_->polling.store(false);
    return l;
  }
  /// True (once) when it was woken only to look again, not by a release.
  bool relook() { return w_->relook.exchange(false); }
  /// The acquire succeeded: a ring it holds is used up.
  void acquired() { acquired_ = true; }
  /// The fence at which a release handed it the lease (wake_hub::granted()), once; 0: none.
  std::int64_t granted() { return w_->granted_fence.exchange(0); }
  void set_ticket(std::int64_t t) { hub_.set_ticket(*w_, t); }
  /// Wakes it (wake_hub::ring()).
  void ring() { hub_.ring(*w_); }
  /// The wake-up address for its queue entry.
  std::string address() { return hub_.address(); }

 private:
  wake_hub& hub_;
  std::shared_ptr<wake_waiter> w_;
  bool acquired_ = false;
};

}  // namespace dblock::detail
