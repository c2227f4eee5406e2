#include "storage/wait_queue.hpp"

#include <algorithm>

#include "core/identifier.hpp"
#include "storage/deadline.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail::wait_queue {
namespace {

// The queue's own writes (an entry, its refresh, its deletion, the reaper's) commit without
// waiting for the disk where the backend lets a statement choose (SQLite; PostgreSQL's insert
// says so in its SQL): an entry decides no grant, and a crash that undoes one of them is an OS
// crash or power loss (SQLite, whose waiters all run on this host and die with it) or a server
// crash (PostgreSQL: the waiter's next refresh makes its entry again). A grant commits durably.
constexpr write_kind queue_write = write_kind::unflushed;

}  // namespace

std::int64_t enqueue(session_scope& s, const std::string& name, const std::string& token,
                     std::int64_t ttl_us, const std::string& host, std::int64_t pid,
                     const std::string& bell, std::int64_t grant_ttl_us) {
  const sql_result r =
      write_statement(s, queue_write, s.statements().waiter_insert,
                      {name, token, static_cast<long long>(ttl_us), host,
                       static_cast<long long>(pid), bell, static_cast<long long>(grant_ttl_us)});
  return r.empty() ? r.insert_id : r.integer(0, 0);
}

std::optional<std::int64_t> find(session_scope& s, const std::string& name,
                                 const std::string& token) {
  const sql_result r = s.run(s.statements().waiter_find, {name, token});
  if (r.empty()) return std::nullopt;
  return r.integer(0, 0);
}

bool refresh(session_scope& s, std::int64_t ticket, const std::string& token, std::int64_t ttl_us) {
  return write_statement(s, queue_write, s.statements().waiter_refresh,
                         {static_cast<long long>(ttl_us), static_cast<long long>(ticket), token})
             .affected == 1;
}

bool dequeue(session_scope& s, std::int64_t ticket, const std::string& token) {
  return write_statement(s, queue_write, s.statements().waiter_delete,
                         {static_cast<long long>(ticket), token})
             .affected == 1;
}

bool dequeue_retried(const std::shared_ptr<database_impl>& db, const std::string& what,
                     std::int64_t ticket, const std::string& token) {
  static const retry_policy policy = [] {
    retry_policy p = bookkeeping_conflict_policy();
    // An acquire that gave up deletes its entry before it returns: no new try after 1 s, so it
    // returns at most about one more lock wait (SQLite: busy_timeout) plus 1 s later.
    p.time_budget = std::chrono::milliseconds(1000);
    p.retryable.push_back(errc::connection_lost);
    p.retryable.push_back(errc::in_doubt);
    return p;
  }();
  return retry(policy, [&] {
    return with_session(db, what, [&](session_scope& s) { return dequeue(s, ticket, token); });
  });
}

wait_state read(session_scope& s, const std::string& name, const std::string& token) {
  const sql_result r = s.run(s.statements().wait_read, {token, name});
  wait_state w;
  if (r.empty()) return w;
  w.exists = true;
  w.hold_count = static_cast<int>(r.integer(0, 0));
  w.expires_us = r.integer(0, 1);
  w.now_us = r.integer(0, 2);
  if (!r.is_null(0, 3)) w.head = r.integer(0, 3);
  w.fence = r.integer(0, 4);
  w.mine = r.integer(0, 5) != 0;
  return w;
}

queue_head head_of(session_scope& s, const std::string& name, const std::string& token) {
  const sql_result r = s.run(s.statements().waiter_head, {name, token});
  if (r.empty()) return {};
  return {r.text(0, 0), r.is_null(0, 1) ? std::string() : r.text(0, 1)};
}

std::optional<std::int64_t> first_ticket(session_scope& s, const std::string& name) {
  const sql_result r = s.run(s.statements().waiter_first, {name});
  if (r.empty() || r.is_null(0, 0)) return std::nullopt;
  return r.integer(0, 0);
}

std::optional<std::int64_t> acquire_dequeue(session_scope& s, const acquire_params& p,
                                            std::int64_t ticket, bool in_order) {
  const lock_statements& all = s.statements();
  const statement& dq = in_order ? all.acquire_dequeue_in_order : all.acquire_dequeue;
  const statement& acq = in_order ? all.acquire_in_order : all.acquire;
  const long long floor = lock_table::fence_floor(s);
  std::vector<sql_param> v;
  v.reserve(8);
  v.emplace_back(p.name);
  v.emplace_back(p.owner_token);
  v.emplace_back(static_cast<long long>(p.ttl_us));
  v.emplace_back(p.holder_host);
  v.emplace_back(static_cast<long long>(p.holder_pid));
  v.emplace_back(p.holder_thread);
  v.emplace_back(floor);
  // No entry to delete (behind_everyone), or MySQL, which deletes it during the hold: the
  // acquire alone.
  const bool alone = ticket == behind_everyone || exit_deferred(s.db());
  const bool one_statement = all.can.exit == queue_exit::in_acquire;
  if (in_order || (!alone && one_statement))
    v.emplace_back(std::in_place_type<long long>, static_cast<long long>(ticket));
  if (alone) return lock_table::acquired_fence(write_statement(s, write_kind::statement, acq, v));
  if (one_statement)
    return lock_table::acquired_fence(write_statement(s, write_kind::statement, dq, v));
  // Two statements in SQLite's one write transaction.
  write_scope w(s, write_kind::statement);
  const std::optional<std::int64_t> fence = lock_table::acquired_fence(s.run(acq, v));
  if (fence) {
    std::vector<sql_param> del;
    del.emplace_back(static_cast<long long>(ticket));
    del.emplace_back(p.owner_token);
    s.run(all.waiter_delete, del);
  }
  w.commit();
  return fence;
}

bool exit_deferred(const database_impl& db) {
  return db.statements.can.exit == queue_exit::deferred;
}

bool deferred_exit::remove(const std::shared_ptr<database_impl>& db, bool last) noexcept {
  const std::string what = "leave the queue of lease '" + name_ + "'";
  try {
    dequeue_retried(db, what, ticket_, token_);
    return true;
  } catch (const std::exception& e) {
    db->notify([&](listener& l) {
      l.log(log_level::warning,
            what + " (ticket " + std::to_string(ticket_) + "): " + e.what() +
                (last ? "; the entry expires within the lease TTL" : "; the release tries again"));
    });
  } catch (...) {
  }
  return false;
}

void deferred_exit::finish(const std::shared_ptr<database_impl>& db, std::chrono::milliseconds wait,
                           bool last) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (stage_ == stage::running) {
    cv_.wait_for(lk, wait, [&] { return stage_ != stage::running; });
    if (stage_ == stage::done || !last) return;
  }
  if (stage_ == stage::done) return;
  const bool mine = stage_ == stage::queued;  // else: another deletion still runs, overdue
  if (mine) stage_ = stage::running;
  lk.unlock();
  const bool ok = remove(db, last);
  lk.lock();
  if (ok || last)
    stage_ = stage::done;
  else if (mine && stage_ == stage::running)
    stage_ = stage::queued;  // the release deletes it
  cv_.notify_all();
}

std::vector<entry_info> list(session_scope& s) {
  const sql_result r = s.run(s.statements().waiters_list, {});
  std::vector<entry_info> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out.push_back({r.text(i, 0), r.integer(i, 1), r.text(i, 2), r.integer(i, 3), r.integer(i, 4),
                   r.integer(i, 5)});
  return out;
}

std::uint64_t reap(session_scope& s, std::chrono::milliseconds retention) {
  const long long neg = -std::chrono::duration_cast<std::chrono::microseconds>(retention).count();
  return static_cast<std::uint64_t>(
      write_statement(s, queue_write, s.statements().waiters_reap, {neg}).affected);
}

}  // namespace dblock::detail::wait_queue
