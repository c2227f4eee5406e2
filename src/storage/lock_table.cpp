#include "storage/lock_table.hpp"

#include <optional>
#include <random>
#include <utility>

#include "storage/session_lock.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail::lock_table {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

long long neg_micros(milliseconds retention) {
  return -std::chrono::duration_cast<microseconds>(retention).count();
}

std::chrono::system_clock::time_point from_us(long long us) {
  return std::chrono::system_clock::time_point(microseconds(us));
}

std::string forced_token() {
  // A token no acquisition can have: acquisitions use 32 hex digits, this starts with "forced".
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string t = "forced";
  while (t.size() < 32)
    t += hex[rng() % 16];
  return t;
}

lock_info to_lock_info(const sql_result& r, std::size_t i) {
  lock_info li;
  li.name = r.text(i, 0);
  li.owner_token = r.text(i, 1);
  li.fence = r.integer(i, 2);
  li.hold_count = static_cast<int>(r.integer(i, 3));
  li.holder_host = r.text(i, 4);
  li.holder_pid = r.integer(i, 5);
  li.holder_thread = r.text(i, 6);
  const long long expires = r.integer(i, 8), now = r.integer(i, 9);
  li.acquired_at = from_us(r.integer(i, 7));
  li.expires_at = from_us(expires);
  li.expires_in = microseconds(expires - now);
  li.held = li.hold_count > 0 && expires > now;
  return li;
}

}  // namespace

std::int64_t raise_epoch(session_scope& s, const std::function<void()>& also) {
  const lock_statements& t = s.statements();
  sql_result r;
  try {
    write_scope w(s, write_kind::transaction, "raise the fence epoch");
    if (t.can.durable_commit) s.run(t.durable_commit, {});
    r = s.run(t.epoch_raise, {});
    if (r.empty() ? r.affected < 1 : r.is_null(0, 0))
      throw error(errc::schema_missing, "the fence floor row of " + s.tables().floor +
                                            " is missing (run `dblock migrate`)");
    if (also) also();
    w.commit();
  } catch (const error& e) {
    // An epoch raised or not is harmless either way (epochs may skip); nothing was granted.
    if (e.code() != errc::in_doubt) throw;
    throw error(errc::connection_lost, e.what(), e.backend(), e.sqlstate(), e.native_code());
  }
  return r.empty() ? 0 : r.integer(0, 0);
}

std::int64_t fence_floor(session_scope& s) {
  connection_state& st = s.state();
  if (st.fence_floor) return *st.fence_floor;
  std::int64_t floor = 0;
  if (durability(s) == lease_durability::fast) {
    if (st.transaction_pooler)
      throw error(errc::invalid_argument,
                  "the lock table " + s.tables().lock +
                      " is in fast lease mode (not durable), which needs connections straight to "
                      "the server or through a session-mode pooler: behind a transaction-mode "
                      "pooler dblock cannot tell a server restart, so fences could go back after a "
                      "crash (make it durable with set_lease_durability() or `dblock migrate "
                      "--lease-durability durable`, or use a direct URL)");
    floor = raise_epoch(s) << fence_epoch_shift;
  }
  st.fence_floor = floor;
  return floor;
}

lease_durability durability(session_scope& s) {
  const statement& q = s.statements().lock_durable;
  if (!s.statements().can.durability_per_table) return lease_durability::durable;
  const sql_result r = s.run(q, {s.tables().lock});
  if (r.empty())
    throw error(errc::schema_missing,
                "the lock table " + s.tables().lock + " does not exist (run `dblock migrate`)");
  return r.integer(0, 0) == 0 ? lease_durability::fast : lease_durability::durable;
}

void set_durability(session_scope& s, lease_durability d) {
  if (!s.statements().can.durability_per_table) {
    if (d == lease_durability::durable) return;  // it always is
    throw error(errc::invalid_argument, "fast lease mode is not available on " + s.db().backend +
                                            ": " + s.dia().sql.no_fast_leases());
  }
  if (durability(s) == d) return;
  s.run(
      statement{
          "", s.dia().sql.set_lock_table_durability(s.tables(), d == lease_durability::fast), {}},
      {});
}

std::optional<std::int64_t> acquire(session_scope& s, const acquire_params& p) {
  const long long floor = fence_floor(s);
  return acquired_fence(
      write_statement(s, write_kind::statement, s.statements().acquire,
                      {p.name, p.owner_token, static_cast<long long>(p.ttl_us), p.holder_host,
                       static_cast<long long>(p.holder_pid), p.holder_thread, floor}));
}

std::optional<std::int64_t> acquired_fence(const sql_result& r) {
  if (!r.empty()) {
    if (r.is_null(0, 0)) return std::nullopt;
    return r.integer(0, 0);
  }
  if (r.insert_id > 0) return r.insert_id;  // MySQL: LAST_INSERT_ID(fence) in the OK packet
  return std::nullopt;
}

bool renew(session_scope& s, const std::string& name, const std::string& token, std::int64_t fence,
           std::int64_t ttl_us) {
  return write_statement(
             s, write_kind::statement, s.statements().renew,
             {static_cast<long long>(ttl_us), name, token, static_cast<long long>(fence)})
             .affected == 1;
}

namespace {

// The head a release handed the lease to: its ticket and bell.
struct handed_head {
  std::int64_t ticket = 0;
  std::string bell;
};

// SQLite's handover (lock_statements::grant_take, grant_give): the head's entry deleted and the
// lock row made its own in one write transaction that commits durably, since it grants. Nothing
// to hand over: rolled back, and the caller releases as usual (a commit that need not sync).
std::optional<handed_head> hand_over_in_steps(session_scope& s, const std::string& name,
                                              const std::string& token, std::int64_t fence) {
  const lock_statements& all = s.statements();
  write_scope w(s, write_kind::statement);
  const sql_result head = s.run(all.grant_take, {name, token, static_cast<long long>(fence)});
  if (head.empty()) {
    w.rollback();
    return std::nullopt;
  }
  std::vector<sql_param> v;
  v.reserve(7);
  v.emplace_back(static_cast<long long>(head.integer(0, 3)));
  v.emplace_back(head.text(0, 1));
  v.emplace_back(head.text(0, 4));
  v.emplace_back(static_cast<long long>(head.integer(0, 5)));
  v.emplace_back(name);
  v.emplace_back(token);
  v.emplace_back(static_cast<long long>(fence));
  // The DELETE checked the row in this same transaction, and SQLite has one writer: it matches.
  if (s.run(all.grant_give, v).affected != 1) {
    w.rollback();
    return std::nullopt;
  }
  w.commit();
  return handed_head{head.integer(0, 0), head.text(0, 2)};
}

}  // namespace

bool release(session_scope& s, const std::string& name, const std::string& token,
             std::int64_t fence, release_wake* wake) {
  const lock_statements& all = s.statements();
  const bool hand_over = wake && wake->hand_over;
  if (wake) {
    wake->sleeper = 0;
    wake->granted = 0;
    wake->granted_bell.clear();
  }
  if (hand_over && all.can.hand_over == handover::two_statements) {
    if (std::optional<handed_head> h = hand_over_in_steps(s, name, token, fence)) {
      wake->granted = h->ticket;
      wake->granted_bell = std::move(h->bell);
      return true;
    }
    // Rolled back: the release below must be a write of its own, never one joined to a
    // transaction that a failed ROLLBACK left open (it would not commit).
    if (s.dia().conn.in_transaction(s.sql())) {
      s.mark_broken();
      throw error(errc::backend_error, "release lease '" + name +
                                           "': the connection could not roll back a handover "
                                           "that found nobody to hand the lease to");
    }
  }
  const statement& st =
      hand_over && all.can.hand_over == handover::in_release ? all.release_granting : all.release;
  std::vector<sql_param> v{name, token, static_cast<long long>(fence)};
  for (std::size_t i = 3; i < st.params.size(); ++i) {  // the ring's: "bell", "queue"
    if (st.params[i] == "bell")
      v.emplace_back(wake ? wake->bell : std::string());
    else
      v.emplace_back(wake && !wake->queue.empty() ? wake->queue : name);
  }
  const sql_result r = write_statement(s, write_kind::unflushed, st, v);
  // An UPDATE: the rows it changed (0 or 1); release_granting: the rows it returned (1, or 2
  // when it handed the lease over).
  const bool released = r.affected >= 1;
  if (!wake || !released) return released;
  if (all.can.ring == release_ring::interrupt) {  // release_head()
    wake->sleeper = r.insert_id;
  } else if (all.can.ring == release_ring::notify) {
    // release_returning(), and the head's ticket when handed over (in either order).
    std::int64_t ring = r.empty() || r.is_null(0, 0) ? 0 : r.integer(0, 0);
    std::int64_t other = r.rows.size() > 1 ? r.integer(1, 0) : 0;
    if ((other & handed_over) != 0) std::swap(ring, other);
    wake->sleeper = ring & ~handed_over;
    if ((ring & handed_over) != 0) wake->granted = other;
  }
  return released;
}

std::optional<lease_row> read(session_scope& s, const std::string& name) {
  const sql_result r = s.run(s.statements().read, {name});
  if (r.empty()) return std::nullopt;
  lease_row row;
  row.name = r.text(0, 0);
  row.owner_token = r.text(0, 1);
  row.fence = r.integer(0, 2);
  row.hold_count = static_cast<int>(r.integer(0, 3));
  row.acquired_at_us = r.integer(0, 4);
  row.expires_at_us = r.integer(0, 5);
  row.now_us = r.integer(0, 6);
  row.holder_host = r.text(0, 7);
  row.holder_pid = r.integer(0, 8);
  row.holder_thread = r.text(0, 9);
  return row;
}

std::optional<std::int64_t> fenced_check(session_scope& s, const std::string& name,
                                         const std::string& token) {
  if (s.dia().conn.locks_by_writing(s.state())) {
    const sql_result r = s.run(s.statements().fenced_check_write, {name, token});
    if (r.affected == 1 && r.insert_id > 0) return r.insert_id;
    return std::nullopt;
  }
  const sql_result r = s.run(s.statements().fenced_check, {name, token});
  if (r.empty() || r.is_null(0, 0)) return std::nullopt;
  return r.integer(0, 0);
}

void ensure_row(session_scope& s, const std::string& name, milliseconds lock_timeout) {
  if (s.run(s.statements().exists, {name}).integer(0, 0) > 0) return;
  // Only a concurrent creator of the same absent row can make this insert wait, briefly.
  if (s.statements().can.insert_if_absent_waits)
    s.dia().conn.set_lock_timeout(s.sql(), s.state(), lock_timeout);
  write_statement(s, write_kind::statement, s.statements().insert_free, {name});
}

bool lock_row(session_scope& s, const std::string& name, lock_wait mode) {
  // NOWAIT is done as SKIP LOCKED plus an existence check: the answer is the same, and no error
  // is raised, which on PostgreSQL would abort the whole transaction.
  const bool wait = mode == lock_wait::wait;
  const statement& select = wait ? s.statements().lock_wait : s.statements().lock_skip_locked;
  for (int round = 0; round < 2; ++round) {
    if (!s.run(select, {name}).empty()) {
      // Ours; where a lock is not certified across nodes (Galera), it is taken by a write too.
      if (s.dia().conn.locks_by_writing(s.state())) s.run(s.statements().lock_write, {name});
      return true;
    }
    if (!wait && s.run(s.statements().exists, {name}).integer(0, 0) > 0) return false;
    // Removed (by a reaper) since it was created: create it inside the transaction.
    s.run(s.statements().insert_free, {name});
  }
  throw error(errc::backend_error, "lock resource '" + name + "': the lock row keeps disappearing");
}

std::vector<lock_info> list(session_scope& s, const list_options& o) {
  // Four shapes (held only or all, with or without a pattern), each prepared once.
  const lock_statements& t = s.statements();
  statement st{std::string("list") + (o.include_free ? "_all" : "_held") +
                   (o.pattern.empty() ? "" : "_pattern"),
               t.list_select,
               {}};
  std::vector<sql_param> values;
  if (!o.include_free) st.text += t.list_held;
  if (!o.pattern.empty()) {
    st.text += t.list_pattern;
    st.params.push_back("pattern");
    values.push_back(s.dia().sql.name_pattern_value(o.pattern));
  }
  st.text += " ORDER BY resource_name LIMIT :limit";
  st.params.push_back("limit");
  values.push_back(static_cast<long long>(o.limit));
  const sql_result r = s.run(st, values);
  std::vector<lock_info> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out.push_back(to_lock_info(r, i));
  return out;
}

namespace {

// A name in session mode (its row is the marker): its holder is a server session, which is ended,
// and its lock with it. The marker stays (the name stays in session mode, and the next grant's
// fence is above every earlier one: new_fence is the marker's).
void force_session(session_scope& s, forced_release& f) {
  f.new_fence = f.previous_fence;
  f.was_held = false;
  f.previous_holder.clear();
  for (const auto& h : session_lock::sessions(s, f.name)) {
    if (!h.holds) continue;
    f.previous_holder = h.client + ":" + std::to_string(h.pid) + " (server session)";
    if (!session_lock::end_session(s, h.pid))
      throw error(errc::backend_error, "force release of '" + f.name +
                                           "': its holding server session " +
                                           std::to_string(h.pid) + " did not end within 5 s");
    f.was_held = true;
  }
  s.run(s.statements().audit_insert,
        {f.name, static_cast<long long>(f.new_fence), static_cast<long long>(f.previous_fence),
         f.previous_owner, f.previous_holder, f.was_held ? 1LL : 0LL, f.forced_by, f.reason});
}

}  // namespace

forced_release force(session_scope& s, const std::string& name, const std::string& reason,
                     const std::string& forced_by) {
  const lock_statements& t = s.statements();
  const sql_result r = s.run(t.force_read, {name});
  if (r.empty() || r.is_null(0, 0))
    throw error(errc::not_found, "force release: no lock named '" + name + "'");
  forced_release f;
  f.name = name;
  f.forced_by = forced_by;
  f.reason = reason;
  f.previous_owner = r.text(0, 0);
  f.previous_fence = r.integer(0, 1);
  f.new_fence = f.previous_fence + 1;
  f.previous_holder = r.text(0, 3) + ":" + std::to_string(r.integer(0, 4));
  const long long expires = r.integer(0, 5), now = r.integer(0, 6);
  f.was_held = r.integer(0, 2) > 0 && expires > now;
  f.at = from_us(now);
  if (t.can.session_leases && session_lock::is_marker(f.previous_owner)) {
    force_session(s, f);
    return f;
  }
  s.run(t.force_update, {forced_token(), name});
  s.run(t.audit_insert,
        {name, static_cast<long long>(f.new_fence), static_cast<long long>(f.previous_fence),
         f.previous_owner, f.previous_holder, f.was_held ? 1LL : 0LL, forced_by, reason});
  return f;
}

std::vector<forced_release> forced_history(session_scope& s, std::size_t limit) {
  const sql_result r = s.run(s.statements().audit_list, {static_cast<long long>(limit)});
  std::vector<forced_release> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    forced_release f;
    f.name = r.text(i, 0);
    f.previous_fence = r.integer(i, 1);
    f.new_fence = r.integer(i, 2);
    f.previous_owner = r.text(i, 3);
    f.previous_holder = r.text(i, 4);
    f.was_held = r.integer(i, 5) != 0;
    f.forced_by = r.text(i, 6);
    f.reason = r.text(i, 7);
    f.at = from_us(r.integer(i, 8));
    out.push_back(std::move(f));
  }
  return out;
}

std::optional<std::int64_t> reapable_fence(session_scope& s, milliseconds retention) {
  const sql_result r = s.run(s.statements().floor_candidate, {neg_micros(retention)});
  if (r.empty() || r.is_null(0, 0)) return std::nullopt;
  return r.integer(0, 0);
}

void raise_floor(session_scope& s, std::int64_t top) {
  write_statement(s, write_kind::statement, s.statements().floor_raise,
                  {static_cast<long long>(top)});
}

reap_batch_result reap_batch(session_scope& s, milliseconds retention, std::size_t limit,
                             const std::string& after) {
  const lock_statements& t = s.statements();
  const long long neg = neg_micros(retention);
  const auto n = static_cast<long long>(limit);
  const sql_result names = t.reap_by_key ? s.run(t.reap_candidates, {after, neg, n})
                                         : s.run(t.reap_candidates, {neg, n});
  reap_batch_result out;
  out.end = names.rows.size() < limit;
  if (names.empty()) return out;
  if (t.reap_by_key) out.after = names.text(names.rows.size() - 1, 0);
  statement del{"", t.reap_delete, {}};
  std::vector<sql_param> values;
  for (std::size_t i = 0; i < names.rows.size(); ++i) {
    const std::string p = "n" + std::to_string(i);
    del.text += (i ? ", :" : ":") + p;
    del.params.push_back(p);
    values.push_back(names.text(i, 0));
  }
  del.text += t.reap_recheck;
  del.params.push_back("neg_retention");
  values.push_back(neg);
  out.deleted = static_cast<std::uint64_t>(s.run(del, values).affected);
  return out;
}

long long count_reapable(session_scope& s, milliseconds retention) {
  return s.run(s.statements().reap_count, {neg_micros(retention)}).integer(0, 0);
}

void bootstrap(session_scope& s) {
  for (const auto& stmt : split_statements(apply_prefix(s.dia().bootstrap.text, s.tables().prefix)))
    s.run(statement{"", stmt, {}}, {});
}

std::map<int, applied_migration> applied(session_scope& s) {
  std::map<int, applied_migration> out;
  if (!s.dia().conn.table_exists(s.sql(), s.tables().migrations)) return out;
  const sql_result r = s.run(s.statements().migrations_read, {});
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out[static_cast<int>(r.integer(i, 0))] = {r.text(i, 1), r.text(i, 2)};
  return out;
}

bool apply(session_scope& s, const migration_file& file, const std::string& checksum) {
  const lock_statements& t = s.statements();
  if (s.run(t.migration_applied, {static_cast<long long>(file.version)}).integer(0, 0) > 0)
    return false;
  for (const auto& stmt : split_statements(apply_prefix(file.text, s.tables().prefix)))
    s.run(statement{"", stmt, {}}, {});
  s.run(t.migration_record, {static_cast<long long>(file.version), file.name, checksum});
  return true;
}

}  // namespace dblock::detail::lock_table
