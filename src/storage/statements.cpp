#include "storage/statements.hpp"

#include <atomic>

namespace dblock::detail {
namespace {

statement make(std::string key, std::string text, std::vector<std::string> params) {
  return statement{std::move(key), std::move(text), std::move(params)};
}

// The lease cycle's statements: see statement::routine.
statement routine(std::string key, std::string text, std::vector<std::string> params) {
  return statement{std::move(key), std::move(text), std::move(params), true};
}

// Matching the fence too: a token is never reused across acquisitions in practice, but the fence
// makes a stale holder's statement miss its successor's row even if it were.
const char* const ours_and_held =
    " WHERE resource_name = :name AND owner_token = :token AND fence = :fence"
    " AND hold_count > 0 AND expires_at > ";

// The fenced-write check: the caller's unexpired grant, its row locked (by a write where a lock
// alone is not certified across nodes: connector::locks_by_writing()).
void fenced_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string ours =
      "resource_name = :name AND owner_token = :token AND hold_count > 0"
      " AND expires_at > " +
      v.now();
  s.fenced_check =
      make("fenced_check", "SELECT fence FROM " + t.lock + " WHERE " + ours + v.for_update(),
           {"name", "token"});
  s.fenced_check_write = make("fenced_check_write", v.lock_by_writing(t, ours), {"name", "token"});
}

void lease_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  s.acquire = routine("lease_acquire", v.lease_acquire(t, false),
                      {"name", "token", "ttl", "host", "pid", "thread", "floor"});
  s.acquire_in_order =
      routine("lease_acquire_in_order", v.lease_acquire(t, true),
              {"name", "token", "ttl", "host", "pid", "thread", "floor", "ticket"});
  s.renew = routine(
      "lease_renew",
      "UPDATE " + t.lock + " SET expires_at = " + v.plus_us(now, "ttl") + ours_and_held + now,
      {"ttl", "name", "token", "fence"});
  // expires_at is assigned before hold_count so that MySQL, which evaluates SET left to right,
  // sees the old hold_count like the other backends. A freed lease is also an expired one,
  // which is all that acquire checks.
  const capabilities can = v.can();
  const std::string rings =
      can.ring == release_ring::notify ? v.release_returning(t, false) : std::string();
  s.release = routine("lease_release",
                      "UPDATE " + t.lock + " SET expires_at = CASE WHEN hold_count <= 1 THEN " +
                          now + " ELSE expires_at END, hold_count = hold_count - 1" +
                          (can.ring == release_ring::interrupt ? v.release_head(t) : "") +
                          ours_and_held + now + rings,
                      can.ring == release_ring::notify
                          ? std::vector<std::string>{"name", "token", "fence", "bell", "queue"}
                      : can.ring == release_ring::interrupt
                          ? std::vector<std::string>{"name", "token", "fence", "queue"}
                          : std::vector<std::string>{"name", "token", "fence"});
  if (can.hand_over == handover::in_release)
    s.release_granting = routine("lease_release_granting", v.lease_release_granting(t),
                                 {"name", "token", "fence", "bell"});
  if (can.hand_over == handover::two_statements) {
    s.grant_take = make("grant_take", v.lease_grant_take(t), {"name", "token", "fence"});
    s.grant_give = make("grant_give", v.lease_grant_give(t),
                        {"g_ttl", "g_token", "g_host", "g_pid", "name", "token", "fence"});
  }
  s.read = make("read",
                "SELECT resource_name, owner_token, fence, hold_count, " +
                    v.epoch_us("acquired_at") + ", " + v.epoch_us("expires_at") + ", " +
                    v.epoch_us(now) + ", holder_host, holder_pid, holder_thread FROM " + t.lock +
                    " WHERE resource_name = :name",
                {"name"});
  fenced_statements(s, v, t);
  const std::string held_now = " WHERE hold_count > 0 AND expires_at > " + now;
  s.renew_batch_select = "SELECT resource_name, owner_token, fence FROM " + t.lock +
                         v.by_primary_key() + held_now + " AND resource_name IN (";
  s.renew_batch_update = "UPDATE " + t.lock + v.by_primary_key() +
                         " SET expires_at = " + v.plus_us(now, "ttl") + held_now +
                         " AND resource_name IN (";
  s.renew_batch_skip_locked = can.skip_locked ? v.for_update_skip_locked() : std::string();
  // The fence epoch (lock_table::fence_floor()).
  if (can.durability_per_table)
    s.lock_durable = make("lock_durable", v.lock_table_durable(), {"table"});
  if (can.durable_commit) s.durable_commit = make("", v.durable_commit(), {});
  s.epoch_raise = make(
      "", "UPDATE " + t.floor + " SET epoch = epoch + 1 WHERE id = 1" + v.returning("epoch"), {});
}

// The waiting acquire's read: the lock row, the head of the live queue (the holder's own entries
// excluded) and whether :token holds it (a lease handed over in the release).
statement wait_read(const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  const std::string head = "(SELECT MIN(w.ticket) FROM " + t.waiters +
                           " w WHERE w.resource_name = l.resource_name AND w.owner_token <>"
                           " l.owner_token AND w.expires_at > " +
                           now + ")";
  const std::string mine =
      "CASE WHEN l.owner_token = :token AND l.hold_count > 0 THEN 1 ELSE 0 END";
  return make("wait_read",
              "SELECT hold_count, " + v.epoch_us("expires_at") + ", " + v.epoch_us(now) + ", " +
                  head + ", fence, " + mine + " FROM " + t.lock +
                  " l WHERE l.resource_name = :name",
              {"token", "name"});
}

// The reads of a queue's head, and the rings that name it.
void queue_head_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  const capabilities can = v.can();
  s.waiter_head = make("waiter_head",
                       "SELECT owner_token, bell FROM " + t.waiters +
                           " WHERE resource_name = :name AND owner_token <> :token AND"
                           " expires_at > " +
                           now + " ORDER BY ticket LIMIT 1",
                       {"name", "token"});
  // The lowest live ticket of a queue, the entries of a holder of the lease of the same name
  // excluded (a fair waiter of a kind other than a lease, lease/queue_wait.hpp, reads it).
  s.waiter_first = make("waiter_first",
                        "SELECT MIN(w.ticket) FROM " + t.waiters +
                            " w WHERE w.resource_name = :name AND w.expires_at > " + now +
                            " AND NOT EXISTS (SELECT 1 FROM " + t.lock +
                            " l WHERE l.resource_name = w.resource_name AND l.owner_token ="
                            " w.owner_token AND l.hold_count > 0)",
                        {"name"});
  if (can.ring == release_ring::notify)
    s.head_notify = make("head_notify", v.head_notify(t), {"name", "token", "fence"});
  if (can.ring == release_ring::interrupt) {
    s.bell_ring = make("bell_ring", v.bell_ring(), {"id"});
    s.head_sleeper = make("head_sleeper", v.head_sleeper(t), {"name", "token"});
  }
}

void waiter_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  const capabilities can = v.can();
  if (can.exit == queue_exit::in_acquire) {
    s.acquire_dequeue =
        routine("lease_acquire_dequeue", v.lease_acquire_dequeue(t, false),
                {"name", "token", "ttl", "host", "pid", "thread", "floor", "ticket"});
    s.acquire_dequeue_in_order =
        routine("lease_acquire_dequeue_in_order", v.lease_acquire_dequeue(t, true),
                {"name", "token", "ttl", "host", "pid", "thread", "floor", "ticket"});
  }
  s.waiter_insert = make("waiter_insert",
                         "INSERT INTO " + t.waiters +
                             " (resource_name, owner_token, enqueued_at, expires_at, holder_host,"
                             " holder_pid, bell, grant_ttl_us) VALUES (:name, :token, " +
                             now + ", " + v.plus_us(now, "ttl") + ", :host, :pid, :bell, :grant)" +
                             v.returning_unflushed("ticket"),
                         {"name", "token", "ttl", "host", "pid", "bell", "grant"});
  s.waiter_refresh = make("waiter_refresh",
                          "UPDATE " + t.waiters + " SET expires_at = " + v.plus_us(now, "ttl") +
                              " WHERE ticket = :ticket AND owner_token = :token",
                          {"ttl", "ticket", "token"});
  s.waiter_delete =
      make("waiter_delete",
           "DELETE FROM " + t.waiters + " WHERE ticket = :ticket AND owner_token = :token",
           {"ticket", "token"});
  s.waiter_find = make(
      "waiter_find",
      "SELECT ticket FROM " + t.waiters + " WHERE resource_name = :name AND owner_token = :token",
      {"name", "token"});
  s.wait_read = wait_read(v, t);
  s.queue_ring_all = make("queue_ring_all", v.queue_ring_all(t), {"name"});
  // Live entries, the holders' own excluded (MySQL deletes a new holder's entry during its hold,
  // wait_queue::deferred_exit).
  s.waiters_list =
      make("waiters_list",
           "SELECT w.resource_name, w.ticket, w.holder_host, w.holder_pid, " +
               v.epoch_us("w.enqueued_at") + ", " + v.epoch_us(now) + " FROM " + t.waiters +
               " w WHERE w.expires_at > " + now + " AND NOT EXISTS (SELECT 1 FROM " + t.lock +
               " l WHERE l.resource_name = w.resource_name AND l.owner_token = w.owner_token)"
               " ORDER BY w.resource_name, w.ticket",
           {});
  s.waiters_reap =
      make("waiters_reap",
           "DELETE FROM " + t.waiters + " WHERE expires_at < " + v.plus_us(now, "neg_retention"),
           {"neg_retention"});
}

void row_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  s.exists =
      make("exists", "SELECT count(*) FROM " + t.lock + " WHERE resource_name = :name", {"name"});
  // A free, expired row (hold_count 0, expires_at = now) whose fence starts above the floor.
  s.insert_free = make("insert_free",
                       "INSERT INTO " + t.lock +
                           " (resource_name, owner_token, fence, hold_count, acquired_at,"
                           " expires_at, holder_host, holder_pid, holder_thread) VALUES (:name,"
                           " '', COALESCE((SELECT max_fence FROM " +
                           t.floor + " WHERE id = 1), 0) + 1, 0, " + now + ", " + now +
                           ", '', 0, '')" + v.insert_if_absent(),
                       {"name"});
  const std::string select = "SELECT 1 FROM " + t.lock + " WHERE resource_name = :name";
  s.lock_wait = make("lock_wait", select + v.for_update(), {"name"});
  s.lock_skip_locked = make("lock_skip_locked", select + v.for_update_skip_locked(), {"name"});
  s.lock_write = make("lock_write", v.lock_by_writing(t, "resource_name = :name"), {"name"});
}

void session_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  if (!s.can.session_leases) return;
  const auto x = v.session_leases(t);
  s.session_try = make("session_try", x.try_lock, {"key", "name", "marker"});
  s.session_wait = make("session_wait", x.wait_lock, {"key", "name", "marker"});
  s.session_lock_timeout = make("session_lock_timeout", x.lock_timeout, {"ms"});
  s.session_unlock = make("session_unlock", x.unlock, {"key"});
  s.session_sessions = make("session_sessions", x.sessions, {"key", "name"});
  s.session_end = make("session_end", x.end, {"pid"});
  s.session_idle = make("session_idle", x.idle, {"ttl"});
  s.session_idle_reset = make("session_idle_reset", x.idle_reset, {});
  s.session_gone = make("session_gone", x.gone, {"pid"});
  s.session_fence_next = make("session_fence_next", x.fence_next, {});
  s.session_fence_set = make("session_fence_set", x.fence_set, {"value"});
  s.session_report =
      make("session_report", x.report, {"name", "fence", "held_us", "host", "pid", "thread"});
  s.session_unreport = make("session_unreport", x.unreport, {"name"});
  s.session_forget = make("session_forget", x.forget, {});
  s.session_unmark =
      make("session_unmark",
           "UPDATE " + t.lock + " SET fence = :fence, hold_count = 0, owner_token = :token, " +
               "expires_at = " + v.now() +
               " WHERE resource_name = :name AND owner_token = :marker AND hold_count > 0",
           {"fence", "token", "name", "marker"});
}

void admin_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  s.force_read = make("force_read",
                      "SELECT owner_token, fence, hold_count, holder_host, holder_pid, " +
                          v.epoch_us("expires_at") + ", " + v.epoch_us(now) + " FROM " + t.lock +
                          " WHERE resource_name = :name" + v.for_update(),
                      {"name"});
  s.force_update = make("force_update",
                        "UPDATE " + t.lock +
                            " SET fence = fence + 1, owner_token = :token, hold_count = 0,"
                            " expires_at = " +
                            now + " WHERE resource_name = :name" + v.release_returning(t, true),
                        {"token", "name"});
  s.audit_insert = make("audit_insert",
                        "INSERT INTO " + t.audit +
                            " (resource_name, new_fence, previous_fence, previous_owner,"
                            " previous_holder, was_held, forced_by, reason, forced_at) VALUES"
                            " (:name, :nf, :pf, :po, :ph, :wh, :by, :why, " +
                            now + ")",
                        {"name", "nf", "pf", "po", "ph", "wh", "by", "why"});
  s.audit_list = make("audit_list",
                      "SELECT resource_name, previous_fence, new_fence, previous_owner,"
                      " previous_holder, was_held, forced_by, reason, " +
                          v.epoch_us("forced_at") + " FROM " + t.audit +
                          " ORDER BY forced_at DESC, new_fence DESC LIMIT :limit",
                      {"limit"});
  s.list_select =
      "SELECT resource_name, owner_token, fence, hold_count, holder_host, holder_pid,"
      " holder_thread, " +
      v.epoch_us("acquired_at") + ", " + v.epoch_us("expires_at") + ", " + v.epoch_us(now) +
      " FROM " + t.lock + " WHERE 1 = 1";
  s.list_held = " AND hold_count > 0 AND expires_at > " + now;
  s.list_pattern = " AND " + v.name_pattern("resource_name", "pattern");
}

void reaper_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  // "This lease expired more than `retention` ago" and "its fence is covered by the floor".
  const std::string expired = "expires_at < " + v.plus_us(v.now(), "neg_retention");
  const std::string covered = "fence <= (SELECT max_fence FROM " + t.floor + " WHERE id = 1)";
  s.floor_candidate =
      make("floor_candidate", "SELECT MAX(fence) FROM " + t.lock + " WHERE " + expired,
           {"neg_retention"});
  s.floor_raise = make(
      "floor_raise",
      "UPDATE " + t.floor + " SET max_fence = :top WHERE id = 1 AND max_fence < :top", {"top"});
  // In expiry order through the expiry index; where the table has none, in key order after the
  // last name of the batch before (each batch goes on where the last one stopped: one pass over
  // the table, not one scan of it per batch).
  s.reap_by_key = v.can().reap_in_key_order;
  std::vector<std::string> params = {"neg_retention", "limit"};
  if (s.reap_by_key) params.insert(params.begin(), "after");
  s.reap_candidates =
      make("reap_candidates",
           "SELECT resource_name FROM " + t.lock + " WHERE " +
               (s.reap_by_key ? "resource_name > :after AND " : "") + expired + " AND " + covered +
               " ORDER BY " + (s.reap_by_key ? "resource_name" : "expires_at") + " LIMIT :limit" +
               v.for_update_skip_locked(),
           std::move(params));
  s.reap_count =
      make("reap_count", "SELECT count(*) FROM " + t.lock + " WHERE " + expired + " AND " + covered,
           {"neg_retention"});
  s.reap_delete = "DELETE FROM " + t.lock + " WHERE resource_name IN (";
  // Re-checked at the DELETE: a lease renewed or re-acquired since the SELECT is not removed.
  s.reap_recheck = ") AND " + expired + " AND " + covered;
}

void stock_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string seg = " WHERE stock_name = :name AND segment = :seg";
  s.stock_take = routine(
      "stock_take", "UPDATE " + t.stock + " SET amount = amount - :k" + seg + " AND amount >= :k",
      {"k", "name", "seg"});
  if (v.can().skip_locked)
    s.stock_probe = make(
        "stock_probe",
        "SELECT amount FROM " + t.stock + seg + " AND amount >= :k" + v.for_update_skip_locked(),
        {"name", "seg", "k"});
  s.stock_put = routine("stock_put", "UPDATE " + t.stock + " SET amount = amount + :k" + seg,
                        {"k", "name", "seg"});
  const std::string read =
      "SELECT segment, amount FROM " + t.stock + " WHERE stock_name = :name ORDER BY segment";
  s.stock_read = make("stock_read", read, {"name"});
  s.stock_lock = make("stock_lock", read + v.for_update(), {"name"});
  s.stock_set = make("stock_set", "UPDATE " + t.stock + " SET amount = :amount" + seg,
                     {"amount", "name", "seg"});
  s.stock_insert = make(
      "stock_insert",
      "INSERT INTO " + t.stock + " (stock_name, segment, amount) VALUES (:name, :seg, :amount)",
      {"name", "seg", "amount"});
  s.stock_total = make(
      "stock_total",
      "SELECT COALESCE(SUM(amount), 0), COUNT(*) FROM " + t.stock + " WHERE stock_name = :name",
      {"name"});
  s.stock_delete =
      make("stock_delete", "DELETE FROM " + t.stock + " WHERE stock_name = :name", {"name"});
}

void id_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  s.id_insert = make("id_insert",
                     "INSERT INTO " + t.ids + " (generator, next_id) VALUES (:name, 0)" +
                         v.insert_if_absent("generator"),
                     {"name"});
  s.id_reserve = make("id_reserve", v.id_reserve(t), {"epoch_ms", "per_ms", "n", "name"});
}

void leader_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  // Written only inside a fenced transaction of the leadership lease: delete and insert, no
  // upsert form needed.
  s.leader_clear =
      make("leader_clear", "DELETE FROM " + t.leaders + " WHERE election_name = :name", {"name"});
  s.leader_announce = make("leader_announce",
                           "INSERT INTO " + t.leaders +
                               " (election_name, identity, fence, announced_at) VALUES (:name,"
                               " :identity, :fence, " +
                               v.now() + ")",
                           {"name", "identity", "fence"});
  s.leader_read = make("leader_read",
                       "SELECT identity, fence, " + v.epoch_us("announced_at") + " FROM " +
                           t.leaders + " WHERE election_name = :name",
                       {"name"});
}

void run_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  const std::string now = v.now();
  s.run_now = make("run_now", "SELECT " + v.epoch_us(now), {});
  s.run_done = make("run_done",
                    "SELECT host, pid, fence, " + v.epoch_us("started_at") + ", " +
                        v.epoch_us("ended_at") + " FROM " + t.runs +
                        " WHERE run_key = :key AND slot = :slot AND period_ms = :period AND"
                        " succeeded = 1 AND forgotten_at IS NULL ORDER BY fence LIMIT 1",
                    {"key", "slot", "period"});
  s.run_start = make("run_start",
                     "INSERT INTO " + t.runs +
                         " (run_key, slot, fence, period_ms, host, pid, started_at, succeeded)"
                         " VALUES (:key, :slot, :fence, :period, :host, :pid, " +
                         now + ", 0)",
                     {"key", "slot", "fence", "period", "host", "pid"});
  s.run_finish = make("run_finish",
                      "UPDATE " + t.runs + " SET ended_at = " + now +
                          ", exit_status = :status, succeeded = :ok"
                          " WHERE run_key = :key AND slot = :slot AND fence = :fence",
                      {"status", "ok", "key", "slot", "fence"});
  s.run_forget = make("run_forget",
                      "UPDATE " + t.runs + " SET forgotten_at = " + now +
                          ", forgotten_by = :by, forget_reason = :why"
                          " WHERE run_key = :key AND succeeded = 1 AND forgotten_at IS NULL",
                      {"by", "why", "key"});
  // A periodic run goes once its slot ended more than the retention ago (a younger one may
  // still be what makes its slot done).
  s.run_reap =
      make("run_reap",
           "DELETE FROM " + t.runs + " WHERE period_ms > 0 AND (slot + 1) * period_ms * 1000 < " +
               v.epoch_us(now) + " + :neg_retention",
           {"neg_retention"});
  s.run_list = "SELECT run_key, slot, fence, period_ms, host, pid, " + v.epoch_us("started_at") +
               ", " + v.epoch_us("ended_at") + ", exit_status, succeeded, " +
               v.epoch_us("forgotten_at") + ", forgotten_by, forget_reason FROM " + t.runs;
}

void semaphore_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  s.semaphore_declare =
      make("semaphore_declare",
           "INSERT INTO " + t.semaphores +
               " (semaphore_name, permits, declared_at) VALUES (:name, :permits, " + v.now() + ")" +
               v.insert_if_absent("semaphore_name"),
           {"name", "permits"});
  s.semaphore_permits =
      make("semaphore_permits",
           "SELECT permits FROM " + t.semaphores + " WHERE semaphore_name = :name", {"name"});
  s.permits_held = make(
      "permits_held",
      "SELECT resource_name, " + v.epoch_us("expires_at") + ", " + v.epoch_us(v.now()) + " FROM " +
          t.lock + " WHERE " + v.bytewise("resource_name") + " >= :lo AND " +
          v.bytewise("resource_name") + " < :hi AND hold_count > 0 AND expires_at > " + v.now(),
      {"lo", "hi"});
}

void migration_statements(lock_statements& s, const vocabulary& v, const table_names& t) {
  s.migrations_read =
      make("", "SELECT version, name, checksum FROM " + t.migrations + " ORDER BY version", {});
  s.migration_applied =
      make("", "SELECT count(*) FROM " + t.migrations + " WHERE version = :v", {"v"});
  s.migration_record =
      make("",
           "INSERT INTO " + t.migrations +
               " (version, name, checksum, applied_at) VALUES (:v, :n, :c, " + v.now() + ")",
           {"v", "n", "c"});
}

}  // namespace

std::string migration_record_script(const vocabulary& v, const table_names& t, int version,
                                    const std::string& name, const std::string& checksum) {
  return "INSERT INTO " + t.migrations + " (version, name, checksum, applied_at) VALUES (" +
         std::to_string(version) + ", '" + name + "', '" + checksum + "', " + v.client_now() +
         ");\n";
}

namespace {
std::atomic<bool> handover_on{true};
}  // namespace

void set_handover_enabled(bool on) noexcept {
  handover_on.store(on);
}

bool lock_statements::grants() const {
  return can.hand_over != handover::none && handover_on.load(std::memory_order_relaxed);
}

lock_statements build_lock_statements(const dialect& d, const table_names& t) {
  lock_statements s;
  s.can = d.sql.can();
  lease_statements(s, d.sql, t);
  waiter_statements(s, d.sql, t);
  queue_head_statements(s, d.sql, t);
  row_statements(s, d.sql, t);
  admin_statements(s, d.sql, t);
  session_statements(s, d.sql, t);
  stock_statements(s, d.sql, t);
  id_statements(s, d.sql, t);
  semaphore_statements(s, d.sql, t);
  leader_statements(s, d.sql, t);
  run_statements(s, d.sql, t);
  reaper_statements(s, d.sql, t);
  migration_statements(s, d.sql, t);
  return s;
}

}  // namespace dblock::detail
