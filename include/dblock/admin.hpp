// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dblock/database.hpp"

namespace dblock {

/// One row of the lease table, as seen by list_locks(). Times are on the database clock.
struct lock_info {
  std::string name;         ///< resource name
  std::string owner_token;  ///< token of the current (or last) acquisition
  std::int64_t fence = 0;   ///< current fencing token
  int hold_count = 0;       ///< reentrant holds; 0 when released
  std::string holder_host;  ///< host of the current (or last) holder
  std::int64_t holder_pid = 0;
  std::string holder_thread;
  std::chrono::system_clock::time_point acquired_at;  ///< when the acquisition happened
  std::chrono::system_clock::time_point expires_at;   ///< when the lease ends (or ended)
  std::chrono::microseconds expires_in{0};  ///< expires_at minus the database's now (< 0: expired)
  bool held = false;                        ///< hold_count > 0 and not expired
};

/// Which rows list_locks() returns.
struct list_options {
  /// Shell-style pattern on names (`*` any run, `?` one character); empty means all names.
  std::string pattern;
  /// Also return released and expired rows (by default only held leases).
  bool include_free = false;
  /// At most this many rows, by name (1..100000).
  std::size_t limit = 1000;
};

/// Lists lease rows; held leases only unless include_free. Thread-safe.
/// @throws dblock::error (schema_missing, connection errors, invalid_argument for a bad limit or
///         a pattern over 1000 bytes, with a NUL byte or not valid UTF-8).
std::vector<lock_info> list_locks(const database& db, const list_options& options = {});

/// A forced release, as recorded in the audit table.
struct forced_release {
  std::string name;
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
 * @throws dblock::error errc::not_found when no row has that name, errc::invalid_argument for a
 *         bad name, a reason over 1000 bytes, forced_by over 255 bytes, or either with a NUL
 *         byte or not valid UTF-8.
 */
forced_release force_release(const database& db, const std::string& name, const std::string& reason,
                             const std::string& forced_by);

/// The latest forced releases, newest first (at most `limit`).
std::vector<forced_release> recent_forced_releases(const database& db, std::size_t limit = 5);

}  // namespace dblock
