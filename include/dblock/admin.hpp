// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dblock/database.hpp"

/// @file
/// @brief Administration of the lease table: list_locks(), force_release(),
/// recent_forced_releases(), leave_session_mode(), lease_durability_of() and
/// set_lease_durability().

namespace dblock {

/// One row of the lease table, as seen by list_locks(). Times are on the database clock.
/// Thread-safety: a plain value.
struct lock_info {
  std::string name;             ///< resource name
  std::string owner_token;      ///< token of the current (or last) acquisition
  std::int64_t fence = 0;       ///< current fencing token
  int hold_count = 0;           ///< reentrant holds; 0 when released
  std::string holder_host;      ///< host of the current (or last) holder
  std::int64_t holder_pid = 0;  ///< process id of the current (or last) holder
  std::string holder_thread;    ///< thread id (Linux TID) of the current (or last) holder
  std::chrono::system_clock::time_point acquired_at;  ///< when the acquisition happened
  std::chrono::system_clock::time_point expires_at;   ///< when the lease ends (or ended)
  std::chrono::microseconds expires_in{0};  ///< expires_at minus the database's now (< 0: expired)
  bool held = false;                        ///< hold_count > 0 and not expired
  /// Waiting acquires queued for this lease now (live entries of the waiter queue).
  int waiters = 0;
  /// "host:pid" of the waiter at the head of the queue (empty when nobody waits).
  std::string head_waiter;
  /// How long the longest waiting acquire has been queued (database clock).
  std::chrono::microseconds oldest_wait{0};
  /**
   * The name is in session mode (lease_mode::session, docs/session-leases.md): its row is the
   * name's marker (owner_token all zeros, expires_at the marker's). `held` comes from the
   * server's lock table. A holder reports its hold in its first renewal (a third of its TTL
   * after the grant; a grant itself writes nothing): from then on fence, acquired_at,
   * holder_host, holder_pid and holder_thread are the holder's, as for a row-mode lease. Before
   * that, and for a free name, fence and acquired_at are the marker's (the holder's fence is
   * above it), holder_host is the holding session's client address, holder_pid the server's
   * process id, and holder_thread "session". waiters, head_waiter and oldest_wait are the
   * server sessions waiting in the server's lock queue.
   */
  bool session_mode = false;
};

/// Which rows list_locks() returns.
/// Thread-safety: a plain value.
struct list_options {
  /// Shell-style pattern on names (`*` any run, `?` one character); empty means all names.
  std::string pattern;
  /// Also return released and expired rows (by default only held leases).
  bool include_free = false;
  /// At most this many rows, by name (1..100000).
  std::size_t limit = 1000;
};

/// Lists lease rows, by name; held leases only unless include_free. A plain read: it waits for
/// no lock. Thread-safety: safe to call concurrently; each call uses its own pooled connection.
/// @throws dblock::error errc::invalid_argument for a limit outside 1..100000 or a pattern over
///         1000 bytes, with a NUL byte or not valid UTF-8; the @ref database_errors
///         "database errors" (errc::schema_missing before `dblock migrate`).
std::vector<lock_info> list_locks(const database& db, const list_options& options = {});

/// A forced release, as recorded in the audit table.
/// Thread-safety: a plain value.
struct forced_release {
  std::string name;                 ///< resource name
  std::int64_t previous_fence = 0;  ///< the fence the old holder had
  std::int64_t new_fence = 0;       ///< previous_fence + 1: the old holder's fence is stale
  std::string previous_owner;       ///< the old holder's owner token
  std::string previous_holder;      ///< "host:pid" of the old holder
  bool was_held = false;            ///< whether the lease was live when forced
  std::string forced_by;            ///< who forced it (free text, e.g. "alice@ops-1")
  std::string reason;               ///< why (free text)
  std::chrono::system_clock::time_point at;  ///< when, on the database clock
};

/**
 * @brief Takes over and frees a stuck lease, in one transaction that locks its row.
 *
 * Bumps the fence (so the old holder's fenced writes and any storage that checks fences reject
 * it), replaces the owner token and ends the lease, so the old holder's renew, release and
 * fenced() fail with errc::lease_lost. Records who, when and why in `<prefix>resource_lock_audit`.
 * Never retried internally: a second attempt would bump the fence and write the audit twice.
 *
 * A name in session mode (lease_mode::session, docs/session-leases.md) is freed by ending the
 * server session that holds its lock (waiting up to 5 s for it to go); its marker row stays, so
 * new_fence is the marker's fence and the next grant's fence is above every earlier one.
 *
 * Thread-safety: safe to call concurrently; each call uses its own pooled connection, and calls
 * on one name take turns on its row lock (each one bumps the fence).
 *
 * @throws dblock::error errc::not_found when no row has that name; errc::invalid_argument for a
 *         bad name (empty, over 255 bytes, a NUL byte or not valid UTF-8), a reason over 1000
 *         bytes, forced_by over 255 bytes, or either with a NUL byte or not valid UTF-8;
 *         errc::lock_not_available when the row stays locked (by a fenced write, say) for over
 *         10 s; errc::in_doubt when the connection broke after COMMIT was sent (it may or may
 *         not have happened: look at recent_forced_releases() or list_locks() before forcing
 *         again); the @ref database_errors "database errors".
 */
forced_release force_release(const database& db, const std::string& name, const std::string& reason,
                             const std::string& forced_by);

/**
 * @brief Gives a name in session mode (lease_mode::session, docs/session-leases.md) back to row
 * mode.
 *
 * Takes the name's session lock as a session-mode acquire does (waiting up to `wait` for its
 * holder to release it), then, on the session holding it, frees the name's marker row with that
 * grant's fence, which is above every fence the name had in session mode; then releases the lock.
 * The next row-mode acquire of the name gets a fence above them all. A session-mode acquire that
 * comes later marks the name again (session mode is chosen per lease_lock, not per name).
 *
 * Thread-safety: safe to call concurrently; each call uses its own pooled connections.
 * @returns false when the name is not in session mode (nothing is done).
 * @throws dblock::error errc::timeout when a session lease still holds the name after `wait`;
 *         errc::invalid_argument for a bad name (as force_release()); errc::lease_lost or
 *         errc::in_doubt when the session holding the lock broke during the change (look at
 *         list_locks() before trying again); the @ref database_errors "database errors".
 */
bool leave_session_mode(const database& db, const std::string& name,
                        std::chrono::milliseconds wait = std::chrono::seconds(10));

/// The latest forced releases, newest first (at most `limit`, 1..10000). Thread-safety: safe to
/// call concurrently; each call uses its own pooled connection.
/// @throws dblock::error errc::invalid_argument for a limit outside 1..10000; the
///         @ref database_errors "database errors".
std::vector<forced_release> recent_forced_releases(const database& db, std::size_t limit = 5);

/// Whether writes to the lease table wait for durability (see set_lease_durability()).
enum class lease_durability {
  durable,  ///< every acquire, renew and release is flushed before it is acknowledged (default)
  fast,     ///< they are not (PostgreSQL: an UNLOGGED lease table); fences stay monotonic
};

/// The lease table's durability: a plain read (always durable on MySQL and SQLite).
/// Thread-safety: safe to call concurrently.
/// @throws dblock::error errc::schema_missing before `dblock migrate`; the
///         @ref database_errors "database errors".
lease_durability lease_durability_of(const database& db);

/**
 * @brief Switches the lease table between durable and fast lease mode (PostgreSQL only).
 *
 * Fast mode makes `<prefix>resource_lock` an UNLOGGED table: acquire, renew and release skip the
 * WAL flush (about 2-2.7x the lease cycles per second here, see docs/fast-leases.md). The
 * trade: a server crash (not a clean restart) and a failover empty the table, so every lease
 * held then is lost (its holder's renew, release and fenced() report errc::lease_lost), and
 * standbys never see the table. What is kept: TTLs on the database clock, owner tokens, fenced
 * writes in the holder's transaction (which are durable), and fences that never go back, also
 * across a crash that lost acknowledged grants: each connection raises a durable fence epoch
 * before its first acquire and grants fences of at least epoch x 2^32 (so fences are large
 * numbers in fast mode). Every handle on the same tables follows the table; the change takes
 * an exclusive lock on it and rewrites it (PostgreSQL's ALTER TABLE SET UNLOGGED / SET LOGGED).
 * Connections behind a transaction-mode pooler refuse to acquire on a fast table.
 *
 * Does nothing when the table already has that durability. Thread-safety: safe to call
 * concurrently (the DDL serialises).
 * @throws dblock::error errc::invalid_argument for lease_durability::fast on MySQL/MariaDB (the
 *         log flush is a server-wide setting) or SQLite (durability is per connection: the
 *         URL's `synchronous=normal`); errc::schema_missing before `dblock migrate`; the
 *         @ref database_errors "database errors".
 */
void set_lease_durability(const database& db, lease_durability durability);

}  // namespace dblock
