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
         reentry + " THEN l.hold_count + 1 ELSE 1 END, acquired_at = CASE WHEN " + reentry +
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

// The head of the freed lease's live queue, entries of :token (the releaser's) excluded.
std::string queue_head(const table_names& t, const std::string& now) {
  return "(SELECT CAST(w.owner_token AS TEXT) AS owner_token, CAST(w.bell AS TEXT) AS bell"
         " FROM " +
         t.waiters + " w WHERE w.resource_name = :name AND w.owner_token <> :token AND" +
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
  const std::string handle = "split_part(h.bell, '.', 2)";
  return " RETURNING COALESCE((SELECT CASE WHEN strpos(h.bell, '.') = 17 AND"
         " split_part(h.bell, '.', 1) = CAST(:bell AS TEXT) AND " +
         handle + " ~ '^[0-9a-f]{15}$' THEN CAST(CAST('x0' || " + handle +
         " AS BIT(64)) AS BIGINT) ELSE 0 * length(CAST(" +
         notify_head(row + "fence", row + "resource_name") + " AS TEXT)) END FROM " +
         queue_head(t, now()) + free + "), 0) + CASE WHEN " + row +
         "hold_count = 0 THEN 0 * length(set_config('synchronous_commit', 'off', true))"
         " ELSE 0 END";
}

std::string vocabulary::head_notify(const table_names& t) const {
  return "SELECT count(" + notify_head("CAST(:fence AS BIGINT)", ":name") + ") FROM " +
         queue_head(t, now());
}

std::string vocabulary::id_reserve(const table_names& t) const {
  return "UPDATE " + t.ids + " SET next_id = GREATEST(next_id, (" + epoch_us(now()) +
         " / 1000 - :epoch_ms) * :per_ms) + :n WHERE generator = :name RETURNING next_id";
}

}  // namespace dblock::detail::pg
