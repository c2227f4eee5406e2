// Internal: typed operations on dblock's tables (the lock table, the fence floor, the audit
// table, the migrations bookkeeping, the semaphore declarations). With wait_queue and
// counter_tables, the only place besides the dialects that runs SQL on them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dblock/admin.hpp"
#include "dblock/transaction.hpp"
#include "storage/session.hpp"

namespace dblock::detail {

/// What an acquire statement is given.
struct acquire_params {
  std::string name;
  std::string owner_token;  // 32 hex chars
  std::int64_t ttl_us;
  std::string holder_host;
  std::int64_t holder_pid;
  std::string holder_thread;
};

/// A lease row as read back.
struct lease_row {
  std::string name;
  std::string owner_token;
  std::int64_t fence = 0;
  int hold_count = 0;
  std::int64_t acquired_at_us = 0;  // database clock, microseconds since the epoch
  std::int64_t expires_at_us = 0;
  std::int64_t now_us = 0;  // database clock when read
  std::string holder_host;
  std::int64_t holder_pid = 0;
  std::string holder_thread;
};

/// A migration recorded as applied.
struct applied_migration {
  std::string name;
  std::string checksum;
};

namespace lock_table {

// ---- lease (autocommit statements; SQLite wraps each in its write transaction) --------------
/// The bits of a fence below the epoch (fence_floor()).
constexpr int fence_epoch_shift = 32;
/**
 * The least fence an acquire on this connection may grant, found at its first acquire and kept
 * with the connection: 0 while the lock table is durable. When it is not (PostgreSQL UNLOGGED,
 * set_durability()), a crash may lose acknowledged grants, so the connection first raises the
 * fence epoch by one in a durable transaction and grants fences of at least epoch << 32: every
 * connection open after a crash raised the epoch above all those before it. Refused behind a
 * transaction-mode pooler, whose client connections outlive the server's sessions.
 */
std::int64_t fence_floor(session_scope&);
/// Raises the fence epoch by one in a durable transaction (fence_floor(), and session leases) ->
/// the new epoch where the statement returns it (RETURNING), else 0. A lost COMMIT reply is
/// errc::connection_lost (an epoch raised or not is harmless); no floor row is
/// errc::schema_missing.
/// `also`, when given, runs in the same transaction after the raise (session leases: the fence
/// sequence's move).
std::int64_t raise_epoch(session_scope&, const std::function<void()>& also = {});
/// Whether the lock table's writes wait for durability (a plain read).
lease_durability durability(session_scope&);
/// Makes the lock table durable or fast (DDL; see set_lease_durability()).
void set_durability(session_scope&, lease_durability);
/// One atomic upsert; the fence when acquired, nothing when another owner holds the lease.
std::optional<std::int64_t> acquire(session_scope&, const acquire_params&);
/// The fence an acquire statement yielded (RETURNING; MySQL: LAST_INSERT_ID(fence) in the OK
/// packet), nothing when it did not acquire.
std::optional<std::int64_t> acquired_fence(const sql_result&);
/// Extends an unexpired lease owned by `token`; false when no longer ours or expired.
bool renew(session_scope&, const std::string& name, const std::string& token, std::int64_t fence,
           std::int64_t ttl_us);
/// What a release that frees a lease does for the next waiter: the caller's part, then what the
/// dialect's release returned, for wait_queue::ring_freed().
struct release_wake {
  /// In: the releasing handle's relay bell (PostgreSQL, wake_hub::relay_bell()), where the
  /// release may leave a head of this host to this process; else empty.
  std::string bell;
  /// In: the queue whose head the release rings when it frees the lease (empty: the lease's own
  /// name); a semaphore's permit names its semaphore's queue (lease_state::ring_also).
  std::string queue;
  /// In: a fair holder that came through the queue: the release may hand the freed lease to
  /// the head of the queue (lock_statements::release_granting, or grant_take and grant_give).
  bool hand_over = false;
  /// Out: the head waiter to ring, 0 when nobody waits: the server session id of the connection
  /// that sleeps for it (MySQL, vocabulary::release_head()), or the handle of a head on this
  /// host that waits through the host relay (PostgreSQL, vocabulary::release_returning(); when
  /// handed over, that head's handle). -1: look it up (a lost reply, a forced release).
  std::int64_t sleeper = 0;
  /// Out: the ticket of the head the release handed the lease to, at the released fence + 1
  /// (0: not handed over). Only that waiter is then rung, and the ring carries the grant.
  std::int64_t granted = 0;
  /// Out, with `granted`, where the dialect hands over in two statements (SQLite): the head's
  /// bell, its handle's directory to ring it in (`sleeper` is then 0).
  std::string granted_bell;
  /// After a release whose reply was lost, or a forced release: the head is to be looked up.
  static release_wake look_up() {
    release_wake w;
    w.sleeper = -1;
    return w;
  }
};
/// Drops one hold of an unexpired lease owned by `token`; false when no longer ours. When this
/// release freed the lease and `wake` is given, `wake` receives what the release returned for
/// the head of the live waiter queue, and may have handed the lease over (release_wake).
bool release(session_scope&, const std::string& name, const std::string& token, std::int64_t fence,
             release_wake* wake = nullptr);
/// The bit of the handle PostgreSQL's release returns that says the lease was handed over
/// (handles are 60 bits; vocabulary::release_returning()).
constexpr std::int64_t handed_over = std::int64_t(1) << 60;
/// One lease of a batch renewal: the acquisition renew() would be given.
struct renewal {
  std::string name;
  std::string token;
  std::int64_t fence = 0;
};
/// What a batch renewal did to one lease.
enum class renewal_outcome {
  renewed,  ///< extended by the TTL
  busy,     ///< still ours and unexpired, but its row is locked (a fenced write): not extended
  lost,     ///< expired, released or taken over
};
/// The most leases renew_batch() takes at once.
constexpr std::size_t renew_batch_max = 512;
/**
 * Extends the unexpired leases of `batch` (at most renew_batch_max) owned by their tokens and
 * fences by `ttl_us`, in one write transaction that skips rows another transaction has locked,
 * so that one fenced write in progress delays no other lease: locking SELECT, UPDATE, COMMIT.
 * When some leases were not extended, one plain read tells busy from lost. Returns one outcome
 * per lease, in order; `round_trips` receives the statements sent (BEGIN and COMMIT included).
 */
std::vector<renewal_outcome> renew_batch(session_scope&, const std::vector<renewal>& batch,
                                         std::int64_t ttl_us, int& round_trips);
/// Reads a lease row and the database clock; nothing when the row does not exist.
std::optional<lease_row> read(session_scope&, const std::string& name);
/// Inside a write transaction: locks the row and returns its fence when the lease is held by
/// `token` and unexpired.
std::optional<std::int64_t> fenced_check(session_scope&, const std::string& name,
                                         const std::string& token);

// ---- named lock rows (SELECT ... FOR UPDATE) --------------------------------------------------
/// Outside any transaction: creates the lock row of `name` when absent, waiting at most
/// `lock_timeout` for a concurrent creator. A plain read first, so an existing row locked by its
/// holder is never waited for.
void ensure_row(session_scope&, const std::string& name, std::chrono::milliseconds lock_timeout);
/// Inside the caller's transaction: locks the row of `name` (wait, or skip it when locked);
/// creates it when a reaper removed it. False only when skipping a locked row.
bool lock_row(session_scope&, const std::string& name, lock_wait mode);

// ---- administration -----------------------------------------------------------------------
std::vector<lock_info> list(session_scope&, const list_options&);
/// Inside a write transaction: takes the row from whoever holds it and writes the audit row.
forced_release force(session_scope&, const std::string& name, const std::string& reason,
                     const std::string& forced_by);
std::vector<forced_release> forced_history(session_scope&, std::size_t limit);

// ---- reaper ---------------------------------------------------------------------------------
/// The highest fence among rows reapable now (expired more than `retention` ago), if any.
std::optional<std::int64_t> reapable_fence(session_scope&, std::chrono::milliseconds retention);
/// Raises the fence floor to `top` (never lowers it).
void raise_floor(session_scope&, std::int64_t top);
/// One reaper batch: rows deleted; where the reaper walks the table in key order
/// (lock_statements::reap_by_key), the last name it read, where the next batch goes on; and
/// whether it read fewer than `limit` candidates (the walk, or the expiry order, is at its end).
struct reap_batch_result {
  std::uint64_t deleted = 0;
  std::string after;
  bool end = false;
};
/// Inside a write transaction: locks up to `limit` reapable rows covered by the floor (skipping
/// locked ones; in key order after `after` where the reaper walks the table so) and deletes
/// them, re-checking the conditions.
reap_batch_result reap_batch(session_scope&, std::chrono::milliseconds retention, std::size_t limit,
                             const std::string& after);
/// Reapable rows covered by the floor, locked or not (a plain read).
long long count_reapable(session_scope&, std::chrono::milliseconds retention);

// ---- migrations -----------------------------------------------------------------------------
/// Creates the bookkeeping table when absent.
void bootstrap(session_scope&);
/// Applied migrations by version (empty when the bookkeeping table does not exist).
std::map<int, applied_migration> applied(session_scope&);
/// Inside a write transaction: applies `file` unless another migrator did; true when applied.
bool apply(session_scope&, const migration_file& file, const std::string& checksum);

}  // namespace lock_table

/// Semaphores (semaphore.hpp): the declared counts, and which permit rows are held.
namespace semaphore_table {

/// Declares `name` with `permits` unless it is declared already (one write), then returns the
/// declared count (a read); std::nullopt when the row is missing even so.
std::optional<std::int64_t> declare(session_scope&, const std::string& name, int permits);

/// A held permit row: its lease name, and microseconds until it expires (database clock).
struct held_permit {
  std::string lease_name;
  std::int64_t expires_in_us = 0;
};
/// The permit rows of semaphore `semaphore_name` held now (one range read of the primary key;
/// the caller checks each name's slot).
std::vector<held_permit> held(session_scope&, const std::string& semaphore_name);

}  // namespace semaphore_table

/// Leader elections (election.hpp): the identity each winner announced.
namespace leader_table {

/// An announcement: who won, with which fence, when (database clock).
struct announcement {
  std::string identity;
  std::int64_t fence = 0;
  std::int64_t announced_at_us = 0;
};
/// Inside the leadership's fenced transaction: replaces the election's announcement.
void announce(session_scope&, const std::string& name, const std::string& identity,
              std::int64_t fence);
/// The election's announcement, if any (one statement).
std::optional<announcement> read(session_scope&, const std::string& name);

}  // namespace leader_table

namespace run_table {

/// One row of the runs table (runs.hpp), times in µs on the database clock (0: none).
struct run_row {
  std::string key;
  std::int64_t slot = 0, fence = 0, period_ms = 0, pid = 0;
  std::string host;
  std::int64_t started_us = 0, ended_us = 0, forgotten_us = 0;
  std::optional<int> exit_status;
  bool succeeded = false;
  std::string forgotten_by, forget_reason;
};

/// The database clock now, µs since the epoch.
std::int64_t now_us(session_scope&);
/// The success of `key` in `slot` of `period_ms` (0: once ever) that is not forgotten, if any.
std::optional<run_row> done(session_scope&, const std::string& key, std::int64_t slot,
                            std::int64_t period_ms);
/// A run row for the holder of `fence` (on `host`, process `pid`), started now.
void start(session_scope&, const std::string& key, std::int64_t slot, std::int64_t fence,
           std::int64_t period_ms, const std::string& host, std::int64_t pid);
/// Inside the lease's fenced transaction: the run ends now with `status` (0: success).
void finish(session_scope&, const std::string& key, std::int64_t slot, std::int64_t fence,
            int status);
/// The runs of `key` ("" every key), newest first, at most `limit`.
std::vector<run_row> list(session_scope&, const std::string& key, std::size_t limit);
/// Forgets the successes of `key` (a rerun may come); how many.
long long forget(session_scope&, const std::string& key, const std::string& forgotten_by,
                 const std::string& reason);
/// Deletes the periodic runs started more than `retention` ago; how many.
long long reap(session_scope&, std::chrono::milliseconds retention);

}  // namespace run_table
}  // namespace dblock::detail
