// Internal: what a backend can do, as typed answers of its dialect's vocabulary
// (vocabulary::can()). The storage and wake layers ask these questions; an empty statement text
// never stands for "unsupported" outside src/dialect/ (the structure check enforces it).
#pragma once

namespace dblock::detail {

/// Which server of its dialect's family a connection reached, read when it opens
/// (connection_state::dialect_flavor). Where two servers of one dialect differ, the dialect asks
/// this, never a version string.
enum class flavor {
  standard,  ///< the server the dialect is written for: PostgreSQL, SQLite, MariaDB
  mysql,     ///< the MySQL dialect on Oracle's MySQL 8.0 / 8.4 (no SEQUENCE, no RETURNING)
};

/// How a release reaches the head of the freed lease's queue.
enum class release_ring {
  doorbell,   ///< the releasing process rings the head's doorbell (SQLite: a directory)
  notify,     ///< the release's own transaction notifies it (PostgreSQL: pg_notify)
  interrupt,  ///< the release names the head's sleeping connection, which is then interrupted
              ///< (MySQL/MariaDB: KILL QUERY)
};

/// How a release hands a freed lease to a fair head that asked for it.
enum class handover {
  none,            ///< never: the head takes it itself
  in_release,      ///< in the release statement itself (PostgreSQL)
  two_statements,  ///< two statements of one write transaction (SQLite)
};

/// How a queued acquire that succeeds leaves the queue.
enum class queue_exit {
  in_acquire,        ///< the acquire statement deletes the entry: one round trip (PostgreSQL)
  same_transaction,  ///< a second statement of the acquire's write transaction (SQLite)
  deferred,          ///< deleted during the hold, off the acquire's path (MySQL/MariaDB)
};

struct capabilities {
  release_ring ring = release_ring::doorbell;
  handover hand_over = handover::none;
  queue_exit exit = queue_exit::in_acquire;
  /// FOR UPDATE SKIP LOCKED (segmented stock probes a segment without waiting for it).
  bool skip_locked = false;
  /// The lock table's durability is a property of the table, readable and settable (fast leases,
  /// PostgreSQL's UNLOGGED); elsewhere it is always durable or set per connection.
  bool durability_per_table = false;
  /// A statement makes one transaction's COMMIT wait for durability whatever the session's
  /// setting (PostgreSQL's synchronous_commit); elsewhere every commit does.
  bool durable_commit = false;
  /// Session leases (lease_mode::session, storage/session_lock): a session-level lock the
  /// server queues in order, a sequence, and idle timeouts that end a session (PostgreSQL 14+,
  /// MariaDB 10.3+).
  bool session_leases = false;
  /// The server counts a session lease's idle timeout in whole seconds (MariaDB's wait_timeout): a
  /// TTL is rounded up.
  bool session_idle_whole_seconds = false;
  /// Runs behind a transaction-mode connection pooler (database_options::pooler: PgBouncer).
  bool pooler = false;
  /// An insert-if-absent can wait for a concurrent inserter of the same row, so a lock timeout
  /// goes before it; false where it never waits (PostgreSQL's ON CONFLICT DO NOTHING).
  bool insert_if_absent_waits = true;
  /// The lock table has no expiry index (PostgreSQL, migration 0010): the reaper reads it in key
  /// order, each batch going on after the last name of the one before.
  bool reap_in_key_order = false;
};

}  // namespace dblock::detail
