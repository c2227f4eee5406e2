// Internal: the release->ring protocol. After a release (or a forced release, or a change of an
// election) the waiters of the name are woken: a local waiter through this handle's hub, the head
// waiter of another process through what the backend rings (capabilities::release_ring: the
// database's NOTIFY, an interrupt of a sleeping connection, or the doorbell with the head read
// here). Storage keeps the queue's rows (storage/wait_queue.hpp); this layer decides whom to
// wake with them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "storage/lock_table.hpp"
#include "storage/session.hpp"

namespace dblock::detail::wait_queue {

/// After this handle freed the lease of `name` at `fence` (the releaser's entries, `token`, are
/// not the head): wakes a local waiter through the hub and rings the head waiter's process where
/// the database does not, from what the release returned (`wake`, lock_table::release_wake):
/// the doorbell with the head of the queue (SQLite; one local read), or an interrupt of the
/// sleeping connection of the head waiter's handle (MySQL, `wake.sleeper` the session id; -1:
/// look it up, for a forced release); on PostgreSQL, `wake.sleeper` is the handle of a head on
/// this host that the release did not notify (vocabulary::release_returning()), rung through
/// the host relay's directory, or notified now when that fails. A failure only costs the
/// wake-up. When the release handed the lease over (`wake.granted`), only that waiter is rung,
/// and the ring carries the grant (wake_hub::handed_to()).
void ring_freed(const std::shared_ptr<database_impl>& db, const std::string& name,
                std::int64_t fence, const std::string& token, const lock_table::release_wake& wake);
/// Rings every live entry of the broadcast queue `name` (broadcast_suffix, dialect/doorbell.hpp),
/// in this handle and in other processes (vocabulary::queue_ring_all()): the followers of an
/// election hear of a change. Its statements end within `bound`; a failure only costs the
/// wake-ups (the followers read again at their safety net) and is logged.
void ring_all(const std::shared_ptr<database_impl>& db, const std::string& name,
              std::chrono::milliseconds bound) noexcept;

}  // namespace dblock::detail::wait_queue
