#include "dblock/admin.hpp"

#include <algorithm>
#include <map>

#include "core/audit_text.hpp"
#include "core/identifier.hpp"
#include "dblock/election.hpp"
#include "dblock/semaphore.hpp"
#include "dialect/doorbell.hpp"
#include "kinds/followers.hpp"
#include "lease/fenced.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"
#include "storage/session_lock.hpp"
#include "storage/wait_queue.hpp"
#include "storage/write_scope.hpp"
#include "wake/ring.hpp"

namespace dblock {

using detail::access;
using detail::session_scope;

namespace {

// A shell-style pattern (`*` any run, `?` one character, byte by byte as the database compares
// names); an empty pattern matches every name.
bool glob_match(const std::string& pattern, const std::string& name) {
  if (pattern.empty()) return true;
  std::size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*')
    ++p;
  return p == pattern.size();
}

}  // namespace

namespace {

// Names in session mode (their row is the marker): the holder and the waiters are server
// sessions, read from the server's lock table. Without include_free, a name nobody holds goes.
void describe_sessions(session_scope& s, std::vector<lock_info>& rows, bool include_free) {
  for (auto& li : rows) {
    if (!detail::session_lock::is_marker(li.owner_token)) continue;
    li.session_mode = true;
    li.held = false;
    li.hold_count = 0;
    li.holder_host.clear();
    li.holder_pid = 0;
    li.holder_thread = "session";
    li.expires_in = std::chrono::microseconds(0);
    for (const auto& x : detail::session_lock::sessions(s, li.name)) {
      if (x.holds) {
        li.held = true;
        li.hold_count = 1;
        li.holder_host = x.client;
        li.holder_pid = x.pid;
        if (x.fence > 0) {  // the holder's report (a hold past its first renewal)
          li.fence = x.fence;
          li.acquired_at = std::chrono::system_clock::time_point(
              std::chrono::duration_cast<std::chrono::system_clock::duration>(
                  std::chrono::microseconds(x.acquired_us)));
          li.holder_host = x.host;
          li.holder_pid = x.client_pid;
          li.holder_thread = x.thread;
        }
      } else if (li.waiters++ == 0) {
        li.head_waiter = x.client + ":" + std::to_string(x.pid);
        li.oldest_wait = std::chrono::microseconds(x.now_us - x.since_us);
      }
    }
  }
  if (!include_free)
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [](const lock_info& li) { return li.session_mode && !li.held; }),
               rows.end());
}

}  // namespace

std::vector<lock_info> list_locks(const database& db, const list_options& o) {
  if (o.limit < 1 || o.limit > 100000)
    throw error(errc::invalid_argument, "list_locks: limit must be 1..100000");
  if (o.pattern.size() > 1000) throw error(errc::invalid_argument, "list_locks: pattern too long");
  detail::validate_text(o.pattern, "list_locks pattern");
  return detail::with_read(access::impl(db), "list locks", [&](session_scope& s) {
    auto rows = detail::lock_table::list(s, o);
    if (s.statements().can.session_leases) describe_sessions(s, rows, o.include_free);
    std::map<std::string, std::size_t> by_name;
    for (std::size_t i = 0; i < rows.size(); ++i)
      by_name[rows[i].name] = i;
    // Entries come by name and ticket: the first one of a name is its head. A queue-only name
    // (a semaphore's waiters) has no lease row: it is listed as a free row of that name.
    const std::size_t leases = rows.size();
    for (const auto& e : detail::wait_queue::list(s)) {
      auto it = by_name.find(e.name);
      if (it == by_name.end()) {
        if (!detail::is_queue_only(e.name) || detail::is_broadcast(e.name) ||
            !glob_match(o.pattern, e.name))
          continue;
        lock_info q;
        q.name = e.name;
        rows.push_back(q);
        it = by_name.emplace(e.name, rows.size() - 1).first;
      }
      lock_info& li = rows[it->second];
      if (li.waiters++ == 0) {
        li.head_waiter = e.host + ":" + std::to_string(e.pid);
        li.oldest_wait = std::chrono::microseconds(e.now_us - e.enqueued_us);
      }
    }
    // By name, within the limit, as the lease rows come.
    if (rows.size() > leases) {
      std::sort(rows.begin(), rows.end(),
                [](const lock_info& a, const lock_info& b) { return a.name < b.name; });
      if (rows.size() > o.limit) rows.resize(o.limit);
    }
    return rows;
  });
}

forced_release force_release(const database& db, const std::string& name, const std::string& reason,
                             const std::string& forced_by) {
  detail::validate_lease_name(name);  // a semaphore permit's lease too
  detail::validate_audit_text(reason, forced_by, "force_release", "forced_by");
  // One write transaction: the takeover and its audit row commit together. A COMMIT whose reply
  // was lost is in_doubt (never retried here: a retry would bump the fence and audit twice).
  auto f = detail::write_transaction(
      access::impl(db), "force release of '" + name + "'", std::chrono::seconds(10),
      [&](session_scope& s) { return detail::lock_table::force(s, name, reason, forced_by); });
  if (f.was_held) {  // the lease is free: wake a waiter now rather than at its next poll
    detail::wait_queue::ring_freed(access::impl(db), name, f.new_fence, std::string(),
                                   detail::lock_table::release_wake::look_up());
    // A permit: the waiters of its semaphore (lease/queue_wait.hpp) are rung too. (A token
    // that owns no entry: every entry may be the head.)
    if (auto p = semaphore::permit_of(name))
      detail::wait_queue::ring_freed(access::impl(db), p->first + std::string(detail::queue_suffix),
                                     0, "forced", detail::lock_table::release_wake::look_up());
    // A leadership released so: its followers read at once (the next leader rings them too).
    if (auto e = election::election_of(name)) detail::ring_followers(access::impl(db), *e);
  }
  return f;
}

bool leave_session_mode(const database& db, const std::string& name,
                        std::chrono::milliseconds wait) {
  detail::validate_lease_name(name);
  const std::string what = "leave session mode: '" + detail::printable(name) + "'";
  const bool marked = detail::with_session(access::impl(db), what, [&](session_scope& s) {
    const auto row = detail::lock_table::read(s, name);
    return row && row->hold_count > 0 && detail::session_lock::is_marker(row->owner_token);
  });
  if (!marked) return false;
  // The name's session lock, taken as a session lease takes it: its fence is above every session
  // fence the name had, and no session lease of the name is held until the marker is gone.
  lease_lock lk(db, name, lease_options{}, lease_mode::session);
  lease_guard g = lk.acquire(wait);
  const auto& st = detail::lease_access::state(g);
  bool freed = false;
  detail::fenced_write(
      {st.get()},
      [&](session_scope& s) {
        try {
          freed = detail::session_lock::unmark(s, name, g.fence(), detail::new_owner_token());
        } catch (const soci::soci_error&) {
          throw s.failure(what);
        }
      },
      what);
  g.release();
  return freed;
}

std::vector<forced_release> recent_forced_releases(const database& db, std::size_t limit) {
  if (limit < 1 || limit > 10000)
    throw error(errc::invalid_argument, "recent_forced_releases: limit must be 1..10000");
  return detail::with_read(access::impl(db), "read forced releases", [&](session_scope& s) {
    return detail::lock_table::forced_history(s, limit);
  });
}

lease_durability lease_durability_of(const database& db) {
  return detail::with_read(access::impl(db), "read the lease table's durability",
                           [&](session_scope& s) { return detail::lock_table::durability(s); });
}

void set_lease_durability(const database& db, lease_durability durability) {
  detail::with_session(access::impl(db), "set the lease table's durability", [&](session_scope& s) {
    detail::lock_table::set_durability(s, durability);
  });
}

}  // namespace dblock
