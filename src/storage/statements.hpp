// Internal: the text of every statement dblock runs on its own tables, built once per database
// from the dialect's vocabulary. The library and the benchmark's raw-client floor run exactly
// these texts.
#pragma once

#include <string>

#include "dialect/dialect.hpp"

namespace dblock::detail {

struct lock_statements {
  /// What the backend can do (vocabulary::can()): which of the statements below exist and how a
  /// release rings, hands over and lets a waiter leave its queue.
  capabilities can;
  // ---- lease ----------------------------------------------------------------------------------
  /// name, token, ttl, host, pid, thread, floor -> fence (see vocabulary::lease_acquire)
  statement acquire;
  /// acquire's parameters, then ticket -> fence: takes a free lease only when no live entry
  /// of the name's queue below ticket waits (vocabulary::lease_acquire, in queue order)
  statement acquire_in_order;
  statement renew;  ///< ttl, name, token, fence; one row affected when renewed
  /// name, token, fence[, bell (release_returning(), PostgreSQL)]; one row affected when a
  /// hold was released
  statement release;
  /// The same (bell bound), handing a freed lease to the head of the queue when it asked for
  /// that (vocabulary::lease_release_granting()); a fair holder that came through the queue
  /// releases with it. Empty text where the dialect never hands a lease over.
  statement release_granting;
  /// Where the dialect hands a lease over in two statements (vocabulary::lease_grant_take() and
  /// lease_grant_give(), SQLite), in one durable write transaction: name, token, fence ->
  /// deletes the head of the live queue (entries of token excluded) when it asked for the lease
  /// and has a bell and the lease is token's at fence with one hold, returning its ticket,
  /// owner token, bell, grant TTL (µs), host and pid (no row: nothing to hand over)...
  statement grant_take;
  /// ...then g_ttl, g_token, g_host, g_pid, name, token, fence: makes the lock row that head's
  /// (fence + 1, one hold, its TTL from now); one row affected. Empty texts elsewhere.
  statement grant_give;
  /// True where a release may hand a freed lease to a fair waiter (either way above), unless
  /// the benchmark turned handovers off (set_handover_enabled()).
  bool grants() const;
  statement read;  ///< name -> the row and the database clock
  /// name, token -> fence, locking the row (inside a write transaction): the fenced-write check
  statement fenced_check;
  /// fenced_check by a write (connector::locks_by_writing()): the fence in the OK packet
  statement fenced_check_write;
  /// table -> 1 when the lock table is durable, 0 when a crash may lose its writes (PostgreSQL:
  /// UNLOGGED). Empty text where it is always durable.
  statement lock_durable;
  // ---- session leases (vocabulary::session_leases(); PostgreSQL, MariaDB) --------------------
  /// key (the text the server hashes into the lock's key), name, marker (a marker row's owner
  /// token) -> the fence (the marker's plus the fence sequence's next value), 0 when another
  /// session holds the lock, -1 when taken but the name has no marker (given back). The idle
  /// timeouts are session_idle's.
  statement session_try;
  /// The same, waiting in the server's lock queue up to the limit session_lock_timeout (ms) set;
  /// the limit back to none after.
  statement session_wait, session_lock_timeout;
  /// key -> 1 when this session held the lock (given back now; the idle timeouts stay).
  statement session_unlock;
  /// key, name -> one row per server session holding or waiting for the lock, holders first,
  /// waiters by arrival: pid, client address, 1 when holding, its statement's start (µs), now
  /// (µs), then the session's report of its hold of `name` (fence, grant time in µs, client's
  /// host, pid and thread; 0 and empty when it has made none).
  statement session_sessions;
  /// On the holding session: name, fence, held_us (µs since the grant), host, pid, thread ->
  /// its report of the hold (inserted or replaced, keyed by the session's id and the name);
  /// name -> its report deleted; -> every report of this session's id deleted (before the
  /// connection's first grant: reports a session of the same id left behind).
  statement session_report, session_unreport, session_forget;
  /// pid -> 1 once that server session ended (waiting up to 5 s); no row where the server ends
  /// it in the background (MariaDB's KILL): session_gone then tells when it has.
  statement session_end;
  /// ttl (ms) -> the session's idle timeouts become ttl (rounded up to what the server counts
  /// in); the idle timeouts back to the server's default; pid -> 1 when that session is gone
  /// (empty where session_end always waits for that itself).
  statement session_idle, session_idle_reset, session_gone;
  /// -> the fence sequence's next value; value -> the sequence continues after value (inside a
  /// transaction that raised the fence epoch, which serializes the moves: session_lock.cpp,
  /// raise_once()).
  statement session_fence_next, session_fence_set;
  /// fence, token, name, marker -> frees the name's marker row (1 affected) with that fence and
  /// token: the name is back in row mode (session_lock::unmark()).
  statement session_unmark;
  /// Inside a write transaction: makes its COMMIT wait for durability (empty: every commit does)
  statement durable_commit;
  /// Raises the fence epoch by one -> the new epoch where the backend returns it
  /// (lock_table::raise_epoch())
  statement epoch_raise;
  // ---- waiting: the fair queue (lock_waiter) ---------------------------------------------------
  /// acquire's parameters, then ticket -> fence; deletes the queue entry when acquired. Empty
  /// text where the dialect cannot do both in one statement (see vocabulary).
  statement acquire_dequeue;
  statement acquire_dequeue_in_order;  ///< the same, in queue order (as acquire_in_order)
  /// name, token, ttl, host, pid, bell, grant (the TTL in µs to be handed the lease with, 0:
  /// never) -> ticket (RETURNING or insert id)
  statement waiter_insert;
  statement waiter_refresh;  ///< ttl, ticket, token; one row affected while the entry lives
  statement waiter_delete;   ///< ticket, token
  /// name, token -> the ticket of the entry `token` has in `name`'s queue (no row: none)
  statement waiter_find;
  /// token, name -> hold_count, expires (µs), now (µs), the lowest live ticket (NULL: none),
  /// fence, 1 when held by `token` (a lease handed over in the release) else 0
  statement wait_read;
  /// name, token (the releaser's) -> the owner token of the head of the live queue
  statement waiter_head;
  statement waiter_first;  ///< -> MIN(ticket) of :name's live queue, holders' entries excluded
  /// Where the release names the sleeping connection to ring (MySQL): id -> interrupt its
  /// sleep. Empty text elsewhere.
  statement bell_ring;
  /// name, token -> the session id bell_ring would interrupt for the head of the queue (0:
  /// none). Empty text where bell_ring is.
  statement head_sleeper;
  /// name, token, fence: notifies the head of the live queue as the release does (PostgreSQL,
  /// for a head that the release left to its process to ring, doorbell::ring_handle()). Empty
  /// text elsewhere.
  statement head_notify;
  /// name -> owner token, bell, session id to interrupt (0: none) of every live entry of a
  /// broadcast queue; PostgreSQL notifies each in the query (vocabulary::queue_ring_all())
  statement queue_ring_all;
  statement waiters_list;  ///< -> name, ticket, host, pid, enqueued (µs), now (µs): live entries
  statement waiters_reap;  ///< neg_retention: deletes entries expired longer ago than that
  // ---- named lock rows ------------------------------------------------------------------------
  statement exists;            ///< name -> count (a plain read, takes no lock)
  statement insert_free;       ///< name; a free row above the floor unless it exists
  statement lock_wait;         ///< name -> 1, FOR UPDATE
  statement lock_write;        ///< name: locked by a write (connector::locks_by_writing())
  statement lock_skip_locked;  ///< name -> 1, FOR UPDATE SKIP LOCKED
  // ---- administration -------------------------------------------------------------------------
  statement force_read;    ///< name -> owner, fence, holds, host, pid, expires, now (locking)
  statement force_update;  ///< token, name: fence + 1, released now
  statement audit_insert;  ///< name, nf, pf, po, ph, wh, by, why
  statement audit_list;    ///< limit -> forced releases, newest first
  // ---- reaper ---------------------------------------------------------------------------------
  statement floor_candidate;  ///< neg_retention -> MAX(fence) of reapable rows
  statement floor_raise;      ///< top
  /// [after,] neg_retention, limit -> names (FOR UPDATE SKIP LOCKED); `after` (the last name
  /// of the batch before) where reap_by_key
  statement reap_candidates;
  statement reap_count;  ///< neg_retention -> reapable rows left
  // ---- segmented stock ------------------------------------------------------------------------
  statement stock_take;    ///< k, name, seg; one row affected when the segment had k
  statement stock_put;     ///< k, name, seg; one row affected when the segment exists
  statement stock_read;    ///< name -> segment, amount (ORDER BY segment; a plain read)
  statement stock_lock;    ///< name -> segment, amount, locking the rows (in a transaction)
  statement stock_set;     ///< amount, name, seg
  statement stock_insert;  ///< name, seg, amount
  statement stock_total;   ///< name -> SUM(amount), COUNT(*)
  statement stock_delete;  ///< name
  /// name, seg, k -> amount, locking the segment's row when it holds k and no other transaction
  /// holds it (FOR UPDATE SKIP LOCKED: never waits). Empty text where the backend has no row
  /// locks (SQLite).
  statement stock_probe;
  // ---- ID generator ---------------------------------------------------------------------------
  statement id_insert;   ///< name; a row at 0 unless it exists
  statement id_reserve;  ///< epoch_ms, per_ms, n, name -> the new next_id (vocabulary)
  // ---- semaphores -----------------------------------------------------------------------------
  statement semaphore_declare;  ///< name, permits; a declaration row unless one exists
  statement semaphore_permits;  ///< name -> the declared permits
  /// lo, hi -> resource_name, expires (µs), now (µs) of the rows held now whose names are in
  /// [lo, hi) under byte order (the lock table's collation on every backend, migration 0013)
  statement permits_held;

  // ---- leader elections ------------------------------------------------------------------------
  statement leader_clear;     ///< name; the election's announcement row, whoever wrote it
  statement leader_announce;  ///< name, identity, fence; a new announcement row
  statement leader_read;      ///< name -> identity, fence, announced_at (epoch us)
  // ---- job runs (runs.hpp) ---------------------------------------------------------------------
  statement run_now;     ///< -> now (epoch us, the database clock)
  statement run_done;    ///< key, slot -> the not forgotten success: host, pid, fence, start, end
  statement run_start;   ///< key, slot, fence, period, host, pid; a run row, started now
  statement run_finish;  ///< status, ok, key, slot, fence; the run row ends now
  statement run_forget;  ///< by, why, key; its not forgotten successes are forgotten now
  statement run_reap;    ///< neg_retention; periodic runs whose slot ended before now - retention
  std::string run_list;  ///< SELECT ... FROM job_run (then WHERE ..., ORDER BY, LIMIT)
  // ---- migrations -----------------------------------------------------------------------------
  statement migrations_read;    ///< -> version, name, checksum
  statement migration_applied;  ///< v -> count
  statement migration_record;   ///< v, n, c
  // ---- SQL fragments for the statements built per call ---------------------------------------
  std::string list_select;   ///< SELECT ... FROM lock table WHERE 1 = 1
  std::string list_held;     ///< AND held now
  std::string list_pattern;  ///< AND name matches :pattern
  std::string reap_delete;   ///< DELETE FROM lock table WHERE resource_name IN (
  std::string reap_recheck;  ///< ) AND still reapable (neg_retention)
  bool reap_by_key = false;  ///< reap_candidates walks the table in key order (see above)
  /// Batch renewal (renew_batch.cpp): SELECT resource_name, owner_token, fence of held rows
  /// ... AND resource_name IN (
  std::string renew_batch_select;
  /// UPDATE lock table SET expires_at = now + :ttl WHERE held now AND resource_name IN (
  std::string renew_batch_update;
  /// FOR UPDATE SKIP LOCKED where the backend has row locks (SQLite: empty)
  std::string renew_batch_skip_locked;
};

/// Builds the statements of one dialect for one set of tables.
lock_statements build_lock_statements(const dialect& d, const table_names& t);

/// For the benchmark (dblock-bench --no-handover) only: false makes every fair waiter of this
/// process take a freed lease itself, as where the dialect has no handover, so that the
/// handover's gain can be measured against its removal.
void set_handover_enabled(bool on) noexcept;

/// The record of one applied migration as a literal statement, for a printed script (`dblock
/// migrate --print-sql`); the time is the client's clock expression of the script's backend.
/// `name` is [0-9a-z_.] and `checksum` hex digits: nothing to escape.
std::string migration_record_script(const vocabulary& v, const table_names& t, int version,
                                    const std::string& name, const std::string& checksum);

}  // namespace dblock::detail
