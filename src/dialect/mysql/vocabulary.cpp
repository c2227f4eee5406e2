#include "backend.hpp"

namespace dblock::detail::my {

std::string vocabulary::lease_acquire(const table_names& t, bool in_queue_order) const {
  // ON DUPLICATE KEY UPDATE has no WHERE, and MySQL assigns left to right, so every column
  // is an IF() on conditions over owner_token, hold_count and expires_at, and those three are
  // assigned last in an order that keeps the conditions true for the columns after them:
  // owner_token first (once the owner is ours, "ours" stays true), then hold_count (its
  // reentry test still sees the old expires_at), then expires_at. A released row
  // (hold_count 0) is free whatever the clock says, also after the clock stepped back.
  // The fence comes back via LAST_INSERT_ID(expr), which mysql_insert_id() reads from the OK
  // packet: the new fence when acquired, 0 when held by another owner. SOCI connects with
  // CLIENT_FOUND_ROWS, so affected rows cannot tell "held" from "inserted"; the id can.
  const std::string now = this->now();
  const std::string ours = "owner_token = VALUES(owner_token)";
  const std::string reentry = "(" + ours + " AND expires_at > " + now + " AND hold_count > 0)";
  const std::string take = "(" + ours + " OR expires_at <= " + now + " OR hold_count = 0)";
  // In queue order, the first IF() (fence) also asks whether anyone waits ahead, the lock
  // row's owner's own entries excluded; the columns after it ask LAST_INSERT_ID(), which that
  // IF() has just set to the new fence (acquired) or to 0: the locking read of the queue runs
  // once, and only when the lease is free. (A subquery in every IF() would run once per
  // column, about 40 us each on MariaDB.)
  const std::string first = in_queue_order ? "(" + ours + " OR ((expires_at <= " + now +
                                                 " OR hold_count = 0) AND NOT " +
                                                 queue_ahead(t, t.lock + ".owner_token") + "))"
                                           : take;
  const std::string then = in_queue_order ? "(LAST_INSERT_ID() > 0)" : take;
  return "INSERT INTO " + t.lock +
         " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
         " holder_host, holder_pid, holder_thread) VALUES (:name, :token,"
         " LAST_INSERT_ID(GREATEST(COALESCE((SELECT max_fence FROM " +
         t.floor + " WHERE id = 1), 0) + 1, :floor)), 1, " + now + ", " + plus_us(now, "ttl") +
         ", :host, :pid, :thread)"
         " ON DUPLICATE KEY UPDATE" +
         " fence = IF(" + first + ", LAST_INSERT_ID(IF(" + reentry +
         ", fence, GREATEST(fence + 1, :floor))), fence + LAST_INSERT_ID(0))," +
         " acquired_at = IF(" + reentry + ", acquired_at, IF(" + then + ", " + now +
         ", acquired_at))," + " holder_host = IF(" + then + ", VALUES(holder_host), holder_host)," +
         " holder_pid = IF(" + then + ", VALUES(holder_pid), holder_pid)," +
         " holder_thread = IF(" + then + ", VALUES(holder_thread), holder_thread)," +
         " owner_token = IF(" + then + ", VALUES(owner_token), owner_token)," +
         " hold_count = IF(" + reentry + ", hold_count + 1, IF(" + then + ", 1, hold_count))," +
         " expires_at = IF(" + then + ", VALUES(expires_at), expires_at)";
}

std::string vocabulary::id_reserve(const table_names& t) const {
  // The new next_id comes back through LAST_INSERT_ID(expr) in the OK packet (no RETURNING).
  return "UPDATE " + t.ids + " SET next_id = LAST_INSERT_ID(GREATEST(next_id, (" + epoch_us(now()) +
         " DIV 1000 - :epoch_ms) * :per_ms) + :n) WHERE generator = :name";
}

// When this release frees the lease and the head of the live queue (other than the releaser)
// waits in a handle whose wake-up connection is up on this server: that connection's session
// id, else 0, through LAST_INSERT_ID(expr), so the reply's insert id carries it without another
// round trip. The wake-up connection holds the user-level lock bell_lock_prefix + its bell for
// its whole life, and IS_USED_LOCK() names the session that holds it: a dead connection's lock
// is gone with it, so only a live wake-up connection is ever named. (No information_schema
// read: MariaDB 10.11 once crashed freeing the temporary table of a PROCESSLIST subquery in
// this statement.) SET runs left to right: hold_count is already the new count here;
// holder_pid keeps its value.
namespace {

// The session id of the wake-up connection of the handle of the head of `queue`'s live queue
// (entries of :token excluded), NULL when none.
std::string head_sleeper_of(const table_names& t, const std::string& now,
                            const std::string& queue) {
  return "(SELECT IF(w.bell = '', NULL, IS_USED_LOCK(CONCAT('" + std::string(bell_lock_prefix) +
         "', w.bell))) FROM " + t.waiters + " w WHERE w.resource_name = " + queue +
         " AND w.owner_token <> :token AND w.expires_at > " + now + " ORDER BY w.ticket LIMIT 1)";
}

}  // namespace

std::string vocabulary::release_head(const table_names& t) const {
  return ", holder_pid = holder_pid + 0 * LAST_INSERT_ID(IF(hold_count = 0, COALESCE(" +
         head_sleeper_of(t, now(), ":queue") + ", 0), 0))";
}

std::string vocabulary::head_sleeper(const table_names& t) const {
  return "SELECT COALESCE(" + head_sleeper_of(t, now(), ":name") + ", 0)";
}

std::string vocabulary::queue_ring_all(const table_names& t) const {
  return "SELECT w.owner_token, w.bell, COALESCE(IF(w.bell = '', NULL, IS_USED_LOCK(CONCAT('" +
         std::string(bell_lock_prefix) + "', w.bell))), 0) FROM " + t.waiters +
         " w WHERE w.resource_name = :name AND w.expires_at > " + now();
}

std::string vocabulary::lock_by_writing(const table_names& t, const std::string& where) const {
  // On Galera, a write, not a locking read: Galera certifies the rows a transaction wrote, not
  // the ones it locked (migration 0019). With FOR UPDATE alone, a fenced transaction on one node
  // whose COMMIT was certified before that node applied another node's takeover of the lease
  // committed (5 of 300 tries on the test cluster; 0 of 2,000 with the write), and two row locks
  // of one name on two nodes both committed (100 of 100). `touches` changes on every lock, so
  // the row is in the write set; the fence comes back through LAST_INSERT_ID(expr). Not on one
  // server, where FOR UPDATE holds: the write costs 90 us more per fenced transaction there.
  return "UPDATE " + t.lock + " SET touches = touches + 1, fence = LAST_INSERT_ID(fence) WHERE " +
         where;
}

vocabulary::fence_check vocabulary::check_fence_native(const table_names& t) const {
  return {"CALL " + t.prefix + "dblock_check_fence(?, ?)", false};
}

// ---- session leases -----------------------------------------------------------------------------
// MariaDB flavor only (begin): session leases are refused on MySQL 8 (connector.cpp,
// session_lease_refusal()), whose server has no SEQUENCE and no PROCESSLIST.TIME_MS.
// GET_LOCK names are server-wide and at most 64 characters: the key is the SHA-256 (64 hex
// digits) of the database's name and the text the caller binds (prefix, U+FFFF, name). A fence
// is the marker's plus the sequence's next value (session_lock.cpp: each connection moves the
// sequence 2^32 ahead, durably, before its first grant).

namespace {
const char* const session_key = "SHA2(CONCAT(DATABASE(), X'00', :key), 256)";

// The marker is read by a function called after GET_LOCK has returned (migration 0017): a
// subquery here would be read before it, and could miss leave_session_mode()'s change.
std::string session_fence(const table_names& t) {
  return "COALESCE(" + t.prefix + "dblock_session_marker(:name, :marker) + NEXTVAL(" + t.prefix +
         "session_fence), -1)";
}
}  // namespace

vocabulary::session_texts vocabulary::session_leases(const table_names& t) const {
  session_texts x;
  // GET_LOCK: 1 granted, 0 timed out (held), NULL on an error or a KILL QUERY.
  x.try_lock = std::string("SELECT CASE WHEN GET_LOCK(") + session_key + ", 0) = 1 THEN " +
               session_fence(t) + " ELSE 0 END";
  x.wait_lock = std::string("SELECT CASE WHEN GET_LOCK(") + session_key +
                ", @dblock_session_wait) = 1 THEN " + session_fence(t) + " ELSE 0 END";
  x.lock_timeout = "SET @dblock_session_wait = :ms / 1000";
  x.unlock = std::string("SELECT COALESCE(RELEASE_LOCK(") + session_key + "), 0)";
  // The holder only: which sessions wait for a user lock is not shown without the
  // METADATA_LOCK_INFO plugin. Its client and the start of its state (idle: since its last
  // statement) from the process list, where the user can see it.
  const std::string holders = t.prefix + "session_holder";
  x.sessions = std::string(
                   "SELECT h.id, CASE WHEN p.HOST IS NULL THEN '?' WHEN p.HOST = "
                   "'localhost' THEN 'local' ELSE SUBSTRING_INDEX(p.HOST, ':', 1) END, 1, ") +
               epoch_us(
                   "UTC_TIMESTAMP(6) - INTERVAL CAST(COALESCE(p.TIME_MS, 0) * 1000 AS "
                   "SIGNED) MICROSECOND") +
               ", " + epoch_us("UTC_TIMESTAMP(6)") +
               ", COALESCE(r.fence, 0), COALESCE(r.acquired_us, 0), COALESCE(r.holder_host, ''), "
               "COALESCE(r.holder_pid, 0), COALESCE(r.holder_thread, '') FROM (SELECT "
               "IS_USED_LOCK(" +
               session_key +
               ") AS id) h LEFT JOIN information_schema.PROCESSLIST p ON p.ID = h.id LEFT JOIN " +
               holders +
               " r ON r.server_session = h.id AND r.resource_name = :name WHERE h.id IS NOT NULL";
  x.report = "INSERT INTO " + holders +
             " (server_session, resource_name, fence, acquired_us, holder_host, holder_pid, "
             "holder_thread) VALUES (CONNECTION_ID(), :name, :fence, " +
             epoch_us("UTC_TIMESTAMP(6)") +
             " - :held_us, :host, :pid, :thread) ON DUPLICATE KEY UPDATE fence = VALUES(fence), "
             "acquired_us = VALUES(acquired_us), holder_host = VALUES(holder_host), holder_pid = "
             "VALUES(holder_pid), holder_thread = VALUES(holder_thread)";
  x.unreport = "DELETE FROM " + holders +
               " WHERE server_session = CONNECTION_ID() AND resource_name = :name";
  x.forget = "DELETE FROM " + holders + " WHERE server_session = CONNECTION_ID()";
  x.end = "KILL CONNECTION :pid";
  x.gone =
      "SELECT CAST(COUNT(*) = 0 AS SIGNED) FROM information_schema.PROCESSLIST WHERE ID = :pid";
  // SETVAL takes a literal only: the executor writes values into the text.
  x.fence_next = "SELECT NEXTVAL(" + t.prefix + "session_fence)";
  x.fence_set = "SELECT SETVAL(" + t.prefix + "session_fence, :value)";
  // wait_timeout counts whole seconds: rounded up, so the server never ends a session before its
  // TTL (it ends it less than a second after).
  x.idle = "SET SESSION wait_timeout = GREATEST(1, CEILING(:ttl / 1000))";
  x.idle_reset = "SET SESSION wait_timeout = DEFAULT";
  return x;
}
// MariaDB flavor only (end)

}  // namespace dblock::detail::my
