#include "backend.hpp"

namespace dblock::detail::pg {

std::string vocabulary::lease_acquire(const table_names& t, bool in_queue_order) const {
  // One statement. EXCLUDED.acquired_at is this statement's clock reading, so every comparison
  // below uses the same instant. Reentry (our token, unexpired) keeps the fence; a new grant's
  // fence is at least :floor (the connection's fence epoch, lock_table::fence_floor()). A released
  // row (hold_count 0) is free whatever the clock says (also after it stepped back).
  const std::string reentry =
      "(l.owner_token = EXCLUDED.owner_token AND l.expires_at > EXCLUDED.acquired_at AND "
      "l.hold_count > 0)";
  const std::string free = "(l.expires_at <= EXCLUDED.acquired_at OR l.hold_count = 0)";
  // A row that the statement's snapshot shows held by another owner is not even tried: ON
  // CONFLICT would lock it and write WAL, and the commit would wait for the flush, for nothing
  // (a waiter's first try, a contender's poll). The clause below still decides every grant, on
  // the locked row; a lease freed while this statement started only fails this try, as a try a
  // moment earlier would have.
  // In queue order, a row of our token is a lease the release handed to this waiter
  // (lease_release_granting()): the statement takes it as it is, one hold, and restarts its TTL.
  // (A reentrant acquire never runs in queue order.)
  const std::string held_again = in_queue_order ? "l.hold_count" : "l.hold_count + 1";
  return "INSERT INTO " + t.lock +
         " AS l (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
         " holder_host, holder_pid, holder_thread)"
         " SELECT CAST(:name AS TEXT), CAST(:token AS TEXT), GREATEST(COALESCE((SELECT max_fence "
         "FROM " +
         t.floor + " WHERE id = 1), 0) + 1, CAST(:floor AS BIGINT)), 1, " + now() + ", " +
         plus_us(now(), "ttl") +
         ", CAST(:host AS TEXT), CAST(:pid AS BIGINT), CAST(:thread AS TEXT) WHERE NOT EXISTS"
         " (SELECT 1 FROM " +
         t.lock +
         " o WHERE o.resource_name = CAST(:name AS TEXT) AND o.owner_token <> CAST(:token AS TEXT)"
         " AND o.hold_count > 0 AND o.expires_at > " +
         now() +
         ")"
         " ON CONFLICT (resource_name) DO UPDATE SET"
         " fence = CASE WHEN " +
         reentry + " THEN l.fence ELSE GREATEST(l.fence + 1, :floor) END, hold_count = CASE WHEN " +
         reentry + " THEN " + held_again + " ELSE 1 END, acquired_at = CASE WHEN " + reentry +
         " THEN l.acquired_at ELSE EXCLUDED.acquired_at END,"
         " owner_token = EXCLUDED.owner_token, expires_at = EXCLUDED.expires_at,"
         " holder_host = EXCLUDED.holder_host, holder_pid = EXCLUDED.holder_pid,"
         " holder_thread = EXCLUDED.holder_thread"
         " WHERE l.owner_token = EXCLUDED.owner_token OR (" +
         free + (in_queue_order ? " AND NOT " + queue_ahead(t, "l.owner_token") : "") +
         ") RETURNING fence";
}

std::string vocabulary::lease_acquire_dequeue(const table_names& t, bool in_queue_order) const {
  // Data-modifying CTEs run once each, whatever the outer query reads; the DELETE's condition
  // on the acquire's RETURNING keeps the queue entry when the lease was not acquired.
  return "WITH acq AS (" + lease_acquire(t, in_queue_order) + "), gone AS (DELETE FROM " +
         t.waiters +
         " WHERE ticket = :ticket AND EXISTS (SELECT 1 FROM acq)) SELECT fence FROM acq";
}

namespace {

// The head of the live queue `queue` (the freed lease's, :name, unless given), entries of :token
// (the releaser's) excluded.
std::string queue_head(const table_names& t, const std::string& now,
                       const std::string& queue = ":name") {
  return "(SELECT CAST(w.owner_token AS TEXT) AS owner_token, CAST(w.bell AS TEXT) AS bell"
         " FROM " +
         t.waiters + " w WHERE w.resource_name = " + queue + " AND w.owner_token <> :token AND" +
         " w.expires_at > " + now + " ORDER BY w.ticket LIMIT 1) h";
}

// Notifies head `h` of the lease at `fence` (a column or :fence) and `name`: its channel is its
// handle's bell (doorbell.cpp), or its own token's for an entry without one; a bell
// "<host>.<handle>" is the host relay's (relay.cpp), whose channel is the host part. The
// payload is "<fence>:<head token>[@<handle>]:<name>".
std::string notify_head(const std::string& fence, const std::string& name) {
  return "pg_notify('dblock_w_' || CASE WHEN h.bell = '' THEN h.owner_token ELSE"
         " split_part(h.bell, '.', 1) END, CAST(" +
         fence +
         " AS TEXT) || ':' || h.owner_token || CASE WHEN strpos(h.bell, '.') > 0 THEN '@' ||"
         " split_part(h.bell, '.', 2) ELSE '' END || ':' || " +
         name + ")";
}

// A bell column of a queue entry that waits through the host relay whose bell is :bell (the
// releasing handle's, '' when it has none): "<16-char host bell>.<15 hex digits>".
std::string same_relay(const std::string& bell) {
  return "(CAST(:bell AS TEXT) <> '' AND strpos(" + bell + ", '.') = 17 AND split_part(" + bell +
         ", '.', 1) = CAST(:bell AS TEXT) AND split_part(" + bell + ", '.', 2) ~ '^[0-9a-f]{15}$')";
}

// The handle part of such a bell, as a number.
std::string relay_handle(const std::string& bell) {
  return "CAST(CAST('x0' || split_part(" + bell + ", '.', 2) AS BIT(64)) AS BIGINT)";
}

// `ts` plus a column of microseconds.
std::string plus_us_value(const std::string& ts, const std::string& us) {
  return "(" + ts + " + CAST(" + us + " AS DOUBLE PRECISION) * INTERVAL '1 microsecond')";
}

}  // namespace

std::string vocabulary::release_returning(const table_names& t, bool forced) const {
  // The lock row's columns are its new values: hold_count 0 once the lease is free.
  const std::string row = t.lock + ".";
  const std::string free = " WHERE " + row + "hold_count = 0";
  if (forced)
    return " RETURNING (SELECT count(" + notify_head(row + "fence", row + "resource_name") +
           ") FROM " + queue_head(t, now()) + free + ")";
  // A head that waits through the releasing process's own host relay (its bell's host part is
  // :bell, the relay directory's bell of the releasing handle; '' when it has none) is not
  // notified: the statement returns its handle (15 hex digits) as a number, and the releasing
  // process rings it through that directory (doorbell::ring_handle()), or notifies it after all
  // (head_notify) when it cannot. That spares the server the NOTIFY and the ring the trip
  // through the leader's listener. Otherwise it returns 0.
  //
  // A release that frees the lease commits without waiting for the WAL flush: set_config(...,
  // true) lasts until the end of this statement's own transaction. A server crash can undo such
  // a release only (the lease then runs out at its TTL); the next grant's commit is durable and
  // flushes the release before it. A forced release raises the fence and stays durable.
  //
  // The queue rung is :queue: the lease's own name, or the queue of a semaphore whose permit this
  // is (lease/queue_wait.hpp), whose ring carries fence 0 (the hub filters repeats per fence,
  // and permits' fences are not the queue's).
  return " RETURNING " + freed_ring(t, row, "CAST(:queue AS TEXT)");
}

std::string vocabulary::freed_ring(const table_names& t, const std::string& row,
                                   const std::string& queue) const {
  const std::string free = " WHERE " + row + "hold_count = 0";
  const std::string q = queue.empty() ? row + "resource_name" : queue;
  const std::string fence = queue.empty() ? row + "fence"
                                          : "CASE WHEN " + queue + " = " + row +
                                                "resource_name THEN " + row + "fence ELSE 0 END";
  return "COALESCE((SELECT CASE WHEN " + same_relay("h.bell") + " THEN " + relay_handle("h.bell") +
         " ELSE 0 * length(CAST(" + notify_head(fence, q) + " AS TEXT)) END FROM " +
         queue_head(t, now(), queue.empty() ? ":name" : queue) + free + "), 0) + CASE WHEN " + row +
         "hold_count = 0 THEN 0 * length(set_config('synchronous_commit', 'off', true))"
         " ELSE 0 END";
}

std::string vocabulary::lease_release_granting(const table_names& t) const {
  const std::string nw = now();
  // The head of the live queue (entries of :token excluded), deleted when it is handed the
  // lease: it asked for that (a fair waiter's TTL), it waits through the releasing process's own
  // host relay (which then rings it with the fence, ring_handle()), and this release frees the
  // lease (the statement's snapshot of our row; the UPDATE below re-checks on the locked row,
  // and at the instant of the TTL's end alone could the two differ: the waiter then joins the
  // queue again). The DELETE is the handover's lock: a waiter that deletes its entry to give up
  // either goes first (this statement then hands nothing over) or waits for this one and finds
  // its DELETE matched nothing: it holds the lease and passes it on.
  const std::string head =
      "gone AS (DELETE FROM " + t.waiters + " WHERE ticket = (SELECT w.ticket FROM " + t.waiters +
      " w WHERE w.resource_name = :name AND w.owner_token <> :token AND" + " w.expires_at > " + nw +
      " ORDER BY w.ticket LIMIT 1) AND grant_ttl_us > 0 AND " + same_relay("bell") +
      " AND EXISTS (SELECT 1 FROM " + t.lock +
      " o WHERE o.resource_name = :name AND o.owner_token = :token AND o.fence = :fence AND"
      " o.hold_count = 1 AND o.expires_at > " +
      nw +
      ") RETURNING ticket AS g_ticket, CAST(owner_token AS TEXT) AS g_token, CAST(bell AS TEXT)"
      " AS g_bell, grant_ttl_us AS g_ttl, holder_host AS g_host, holder_pid AS g_pid)";
  const std::string g = "(l.hold_count = 1 AND gone.g_ticket IS NOT NULL)";
  auto pick = [&](const std::string& given, const std::string& kept) {
    return "CASE WHEN " + g + " THEN " + given + " ELSE " + kept + " END";
  };
  // The RETURNING clause sees the new row: handed over when its owner is the head's token.
  const std::string handed = "(gone.g_ticket IS NOT NULL AND l.owner_token = gone.g_token)";
  return "WITH " + head + ", r AS (UPDATE " + t.lock + " AS l SET expires_at = CASE WHEN " + g +
         " THEN " + plus_us_value(nw, "gone.g_ttl") + " WHEN l.hold_count <= 1 THEN " + nw +
         " ELSE l.expires_at END, hold_count = " + pick("1", "l.hold_count - 1") +
         ", owner_token = " + pick("gone.g_token", "l.owner_token") +
         ", fence = " + pick("l.fence + 1", "l.fence") +
         ", acquired_at = " + pick(nw, "l.acquired_at") +
         ", holder_host = " + pick("gone.g_host", "l.holder_host") +
         ", holder_pid = " + pick("gone.g_pid", "l.holder_pid") +
         ", holder_thread = " + pick("''", "l.holder_thread") +
         " FROM (SELECT 1) AS one LEFT JOIN gone ON true"
         " WHERE l.resource_name = :name AND l.owner_token = :token AND l.fence = :fence"
         " AND l.hold_count > 0 AND l.expires_at > " +
         nw + " RETURNING CASE WHEN " + handed + " THEN " + relay_handle("gone.g_bell") +
         " + 1152921504606846976 ELSE " + freed_ring(t, "l.") + " END AS ring, CASE WHEN " +
         handed +
         " THEN gone.g_ticket END AS granted) SELECT ring FROM r UNION ALL"
         " SELECT granted FROM r WHERE granted IS NOT NULL";
}

std::string vocabulary::head_notify(const table_names& t) const {
  return "SELECT count(" + notify_head("CAST(:fence AS BIGINT)", ":name") + ") FROM " +
         queue_head(t, now());
}

std::string vocabulary::queue_ring_all(const table_names& t) const {
  return "SELECT h.owner_token, h.bell, 0 * length(CAST(" + notify_head("0", ":name") +
         " AS TEXT)) FROM (SELECT CAST(w.owner_token AS TEXT) AS owner_token, CAST(w.bell AS TEXT)"
         " AS bell FROM " +
         t.waiters + " w WHERE w.resource_name = :name AND w.expires_at > " + now() + ") h";
}

std::string vocabulary::id_reserve(const table_names& t) const {
  return "UPDATE " + t.ids + " SET next_id = GREATEST(next_id, (" + epoch_us(now()) +
         " / 1000 - :epoch_ms) * :per_ms) + :n WHERE generator = :name RETURNING next_id";
}

vocabulary::fence_check vocabulary::check_fence_native(const table_names& t) const {
  return {"SELECT " + t.prefix + "dblock_check_fence(CAST($1 AS TEXT), CAST($2 AS BIGINT))", false};
}

// ---- session leases -----------------------------------------------------------------------------
// The key is the server's 64-bit hash of the text the caller binds (prefix, U+FFFF, name).

namespace {
const char* const session_key = "hashtextextended(CAST(:key AS TEXT), 0)";

// The marker is read by a function called after the lock is granted (migration 0017): a subquery
// here would read it in the statement's snapshot, taken before the lock, and could miss
// leave_session_mode()'s change.
std::string session_fence(const table_names& t) {
  return "COALESCE(" + t.prefix +
         "dblock_session_marker(CAST(:name AS TEXT), CAST(:marker AS TEXT)) + nextval('" +
         t.prefix + "session_fence'), -1)";
}

// The server ends the session (so frees its locks) when it idles past `ttl_text` ms, inside a
// transaction or not.
std::string idle_timeouts(const std::string& ttl_text) {
  return "set_config('idle_session_timeout', " + ttl_text +
         ", false), set_config('idle_in_transaction_session_timeout', " + ttl_text + ", false)";
}
}  // namespace

vocabulary::session_texts vocabulary::session_leases(const table_names& t) const {
  session_texts x;
  // The idle timeouts are set by statements of their own (x.idle), once per connection and TTL
  // (session_lease_state), not in every cycle (four set_config calls cost 3-18 % of its rate).
  x.try_lock = std::string("WITH l AS (SELECT pg_try_advisory_lock(") + session_key +
               ") AS got) SELECT CASE WHEN got THEN " + session_fence(t) + " ELSE 0 END FROM l";
  // MATERIALIZED: the lock is taken before the grant's columns are read.
  x.wait_lock = std::string("WITH l AS MATERIALIZED (SELECT pg_advisory_lock(") + session_key +
                ") AS got) SELECT " + session_fence(t) +
                ", set_config('lock_timeout', '0', false) FROM l";
  x.lock_timeout = "SELECT set_config('lock_timeout', CAST(:ms AS TEXT), false)";
  x.unlock = std::string("SELECT CAST(pg_advisory_unlock(") + session_key + ") AS INTEGER)";
  x.fence_next = "SELECT nextval('" + t.prefix + "session_fence')";
  x.fence_set = "SELECT setval('" + t.prefix + "session_fence', CAST(:value AS BIGINT))";
  x.idle = "SELECT " + idle_timeouts("CAST(:ttl AS TEXT)");
  x.idle_reset = "SELECT " + idle_timeouts("'0'");
  // pg_locks shows a 64-bit advisory key as its high and low 32 bits (classid, objid) with
  // objsubid 1.
  const std::string holders = t.prefix + "session_holder";
  x.sessions = std::string("WITH k AS (SELECT ") + session_key +
               " AS v) SELECT l.pid, COALESCE(host(a.client_addr), 'local'), CAST(l.granted AS "
               "INTEGER), " +
               epoch_us("COALESCE(a.query_start, clock_timestamp())") + ", " +
               epoch_us("clock_timestamp()") +
               ", COALESCE(h.fence, 0), COALESCE(h.acquired_us, 0), COALESCE(h.holder_host, ''), "
               "COALESCE(h.holder_pid, 0), COALESCE(h.holder_thread, '') FROM k JOIN pg_locks l "
               "ON l.classid = CAST((k.v >> 32) & 4294967295 AS oid) AND l.objid = CAST(k.v & "
               "4294967295 AS oid) LEFT JOIN pg_stat_activity a ON a.pid = l.pid LEFT JOIN " +
               holders +
               " h ON l.granted AND h.server_session = l.pid AND h.resource_name = :name WHERE "
               "l.locktype = 'advisory' AND l.objsubid = 1 AND l.database = (SELECT oid FROM "
               "pg_database WHERE datname = current_database()) ORDER BY l.granted DESC, "
               "a.query_start";
  x.report = "INSERT INTO " + holders +
             " (server_session, resource_name, fence, acquired_us, holder_host, holder_pid, "
             "holder_thread) VALUES (pg_backend_pid(), :name, CAST(:fence AS BIGINT), " +
             epoch_us("clock_timestamp()") +
             " - CAST(:held_us AS BIGINT), :host, CAST(:pid AS BIGINT), :thread) ON CONFLICT "
             "(server_session, resource_name) DO UPDATE SET fence = EXCLUDED.fence, acquired_us "
             "= EXCLUDED.acquired_us, holder_host = EXCLUDED.holder_host, holder_pid = "
             "EXCLUDED.holder_pid, holder_thread = EXCLUDED.holder_thread";
  x.unreport = "DELETE FROM " + holders +
               " WHERE server_session = pg_backend_pid() AND resource_name = :name";
  x.forget = "DELETE FROM " + holders + " WHERE server_session = pg_backend_pid()";
  // Waits (up to 5 s) until the session is gone, so no `gone` statement.
  x.end = "SELECT CAST(pg_terminate_backend(CAST(:pid AS INTEGER), 5000) AS INTEGER)";
  return x;
}

}  // namespace dblock::detail::pg
