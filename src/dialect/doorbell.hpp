// Internal: wake-ups across processes, the doorbell role of a dialect (see dialect.hpp): how a
// release reaches the waiters of other processes, and the channel on which a database handle
// receives those rings.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "dblock/database.hpp"
#include "dblock/listener.hpp"

namespace dblock::detail {

struct parsed_url;
struct table_names;

/// A queue name ending so (U+FFFF then "W") is a broadcast queue: its entries wait for no lease
/// but for rings, and every live entry is rung (vocabulary::queue_ring_all(): the followers of
/// an election, whose changes ring them). Reads of the queue that pick a head for a lease leave
/// such entries out (MySQL's sleeping connection, doorbell.cpp). No user name ends so (names
/// never contain U+FFFF).
inline constexpr std::string_view broadcast_suffix = "\xEF\xBF\xBFW";
inline bool is_broadcast(std::string_view name) {
  return name.size() > broadcast_suffix.size() &&
         name.substr(name.size() - broadcast_suffix.size()) == broadcast_suffix;
}

/// A queue name ending so (U+FFFF then "Q") is the queue of a kind whose waiters wait for any of
/// several lease rows (a semaphore's permits, lease/queue_wait.hpp): no lease row has the name,
/// a release of one of the rows rings its head (lease_state::ring_also, release_wake::queue), and a
/// read that asks whether a queue's lease is free leaves it out, as it does broadcast queues.
inline constexpr std::string_view queue_suffix = "\xEF\xBF\xBFQ";
inline bool is_queue_only(std::string_view name) {
  return is_broadcast(name) || (name.size() > queue_suffix.size() &&
                                name.substr(name.size() - queue_suffix.size()) == queue_suffix);
}

/// FNV-1a of a resource name: how a doorbell names a lock without carrying the name.
std::uint64_t name_hash(const std::string& name);

/// A release as a doorbell delivers it: the resource name (empty where only its hash travels),
/// the hash (name_hash()), the fence of the freed lease (0: unknown) and the owner token of the
/// head of the name's live fair queue (empty: unknown or none). With neither name nor hash, the
/// ring is for the waiter `head`, whatever its name. (A woken waiter tries at once; a fair one's
/// acquire statement checks the queue order, so a ring that reaches it out of turn breaks none.)
struct ring_event {
  std::string name;
  std::uint64_t hash = 0;
  std::int64_t fence = 0;
  std::string head;
  /// > 0: the release handed the lease, at `fence`, to the waiter with this queue ticket
  /// (vocabulary::lease_release_granting()); that waiter alone is woken.
  std::int64_t granted_ticket = 0;
};

/// A backend's open wake-up channel: a thread that delivers rings from other processes until
/// destroyed.
class bell_channel {
 public:
  virtual ~bell_channel() = default;
  /// True while rings are known to arrive (for example after LISTEN succeeded and until the
  /// listening connection broke).
  virtual bool live() const = 0;
  /// True when rings are addressed to single waiters, which must subscribe (watch()) and are
  /// reached only once the subscription is confirmed (bell_callbacks::confirmed).
  virtual bool addressed() const { return false; }
  /// Subscribes (`on`) or unsubscribes the waiter with owner token `token`.
  virtual void watch(const std::string& token, bool on) { (void)token, (void)on; }
  /// The address a waiter's queue entry carries so that a release can ring this channel
  /// (MySQL: the mark of its sleeping connection); empty where rings find waiters otherwise.
  virtual std::string address() const { return {}; }
  /// True when server session `id` is this channel's own connection (MySQL), or `id` is its
  /// handle in the host relay (PostgreSQL, doorbell::ring_handle()).
  virtual bool is_self(std::int64_t /*id*/) const { return false; }
  /// How soon a waiter that joined the queue reads once more before it relies on rings, where a
  /// release running as it joined may not have seen its entry (PostgreSQL); 0: never needed.
  virtual std::chrono::milliseconds joined_recheck() const { return {}; }
};

/// Callbacks of a bell_channel, called on its thread.
struct bell_callbacks {
  std::function<void(const ring_event&)> deliver;
  /// Rings may have been lost (the channel reconnected): every waiter should look again.
  std::function<void()> lost;
  /// The subscription of waiter `token` is in place (addressed channels), or gone (`false`,
  /// the connection broke).
  std::function<void(const std::string& token, bool)> confirmed;
  std::function<void(log_level, const std::string&)> log;
};

/// Wake-ups across processes. The default has none: waiters are woken by releases in their own
/// process and otherwise poll (MySQL, which has no NOTIFY).
class doorbell {
 public:
  virtual ~doorbell() = default;
  /// Where the channel of a database handle connects (PostgreSQL: a libpq conninfo; SQLite: the
  /// doorbell directory); empty when there is none.
  /// Refuses database_options::listen_url where the backend has no listener.
  virtual std::string target(const parsed_url&, const database_options& o) const;
  /// Opens the channel (its thread connects and reconnects by itself); nullptr when none.
  virtual std::unique_ptr<bell_channel> open(const std::string& /*target*/, const table_names&,
                                             bell_callbacks) const {
    return nullptr;
  }
  /// True when ring() should name the head of the queue (the releaser then reads it): the
  /// doorbell at `target` has listeners to tell apart.
  virtual bool rings_head(const std::string& target) const {
    (void)target;
    return false;
  }
  /// Called by the releasing process after the lease of `name` (fence) was freed: rings the
  /// other processes where the database does not do it in the release's own transaction;
  /// `head` is the owner token of the head of the queue (empty: unknown or nobody) and
  /// `head_bell` its queue entry's wake-up address (bell_channel::address(); empty: none).
  virtual void ring(const std::string& target, const std::string& name, std::int64_t fence,
                    const std::string& head, const std::string& head_bell) const {
    (void)target, (void)name, (void)fence, (void)head, (void)head_bell;
  }
  /// True when only the user's own processes can ring a handle, so that a ring saying a lease
  /// was handed over (granted_head()) is taken at its word (PostgreSQL's relay directory is
  /// private). False where any local user can ring (SQLite's doorbell directories, shared by
  /// every user of the database file): the waiter then reads the row before it holds the lease.
  virtual bool private_rings() const { return true; }
  /// The bell of the host relay that the handles of this process connecting to `target` share
  /// (PostgreSQL, bound to the release as :bell, vocabulary::release_returning()); empty where
  /// there is none.
  virtual std::string relay_bell(const std::string& target) const {
    (void)target;
    return {};
  }
  /// Rings, from the releasing process, the handle that vocabulary::release_returning()
  /// returned as `handle` (the lease of `name` freed at `fence`), the lowest ticket of its
  /// waiters of that name; false when that could not be done (the caller then notifies it
  /// through the database, head_notify). `granted_ticket` > 0: the release handed the lease at
  /// `fence` to that handle's waiter with this ticket, and the ring says so to it alone.
  virtual bool ring_handle(const std::string& target, const std::string& name, std::int64_t fence,
                           std::int64_t handle, std::int64_t granted_ticket) const {
    (void)target, (void)name, (void)fence, (void)handle, (void)granted_ticket;
    return false;
  }
};

}  // namespace dblock::detail
