#include "storage/session_lock.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/identifier.hpp"
#include "storage/lock_table.hpp"

namespace dblock::detail::session_lock {

namespace {

// The text the server hashes into the lock's key: the prefix and the name, split by U+FFFF
// (neither a prefix nor a user's name holds it).
std::string key_text(session_scope& s, const std::string& name) {
  return s.tables().prefix + std::string(internal_separator) + name;
}

// The fence sequence can go back in a crash or a failover: MariaDB does not flush NEXTVAL's write
// with its statement, and PostgreSQL's nextval hands out the 32 values one call logged ahead
// before that call's transaction has flushed them (the tests show both). So before its first
// grant each connection moves the sequence 2^32 past its next value, in a transaction that
// raises the fence epoch (whose row lock serializes the moves) and is durable (PostgreSQL: on a
// synchronous standby too). A crash or a failover ends every connection, and the first grant
// after it comes after such a move, above every value handed out before it (a crash takes back
// fewer than 2^32 values). In one server's life the sequence only grows, so the fences of a name
// (marker fence + sequence value) strictly increase, with no read that a snapshot could make
// stale.
void raise_once(session_scope& s) {
  if (s.state().session.fence_moved) return;
  const lock_statements& t = s.statements();
  lock_table::raise_epoch(s, [&] {
    const std::int64_t next = s.run(t.session_fence_next, {}).integer(0, 0);
    s.run(t.session_fence_set, {static_cast<long long>(next + (std::int64_t{1} << 32))});
    // Reports a session of the same id left behind would pass for this one's.
    s.run(t.session_forget, {});
  });
  s.state().session.fence_moved = true;
}

// Runs a lock statement and reads its first column: the fence, 0 (held) or -1 (no marker: the
// lock is given back at once).
tried lock_with(session_scope& s, const statement& st, const std::string& name,
                std::int64_t ttl_ms) {
  raise_once(s);
  const std::int64_t v = s.run(st, {key_text(s, name), name, session_mode_token}).integer(0, 0);
  if (v > 0) {
    // The idle timeout: a statement of its own sets it now (until it has, the session idles under
    // the server's default: the grant is not yet reported), unless an earlier grant on this
    // connection left the same one (session_lease_state). MariaDB cannot set it inside a SELECT,
    // and on PostgreSQL setting it in every cycle costs more than once per connection and TTL.
    const lock_statements& t = s.statements();
    const std::int64_t server_ms = t.can.session_idle_whole_seconds
                                       ? std::max<std::int64_t>(1, (ttl_ms + 999) / 1000) * 1000
                                       : ttl_ms;
    if (s.state().session.idle_ms != server_ms) {
      s.state().session.idle_ms = 0;  // unknown until the statement has run
      s.run(t.session_idle, {static_cast<long long>(ttl_ms)});
      s.state().session.idle_ms = server_ms;
    }
    return {tried::granted, v};
  }
  if (v == 0) return {tried::held, 0};
  unlock(s, name);  // locked, but no marker: give it back before marking
  return {tried::unmarked, 0};
}

}  // namespace

tried try_lock(session_scope& s, const std::string& name, std::int64_t ttl_ms) {
  return lock_with(s, s.statements().session_try, name, ttl_ms);
}

void set_lock_timeout(session_scope& s, std::int64_t wait_ms) {
  s.run(s.statements().session_lock_timeout,
        {static_cast<long long>(std::max<std::int64_t>(wait_ms, 1))});
}

tried wait_lock(session_scope& s, const std::string& name, std::int64_t ttl_ms) {
  return lock_with(s, s.statements().session_wait, name, ttl_ms);
}

bool unlock(session_scope& s, const std::string& name) {
  // An idle timeout set apart stays: the pool resets it before any other use of the connection.
  return s.run(s.statements().session_unlock, {key_text(s, name)}).integer(0, 0) == 1;
}

const char* refusal(session_scope& s) {
  return s.dia().conn.session_lease_refusal(s.state());
}

std::vector<server_session> sessions(session_scope& s, const std::string& name) {
  const sql_result r = s.run(s.statements().session_sessions, {key_text(s, name), name});
  std::vector<server_session> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out.push_back({r.integer(i, 0), r.text(i, 1), r.integer(i, 2) == 1, r.integer(i, 3),
                   r.integer(i, 4), r.integer(i, 5), r.integer(i, 6), r.text(i, 7), r.integer(i, 8),
                   r.text(i, 9)});
  return out;
}

bool report(session_scope& s, const std::string& name, const hold_report& h) {
  try {
    s.run(s.statements().session_report,
          {name, static_cast<long long>(h.fence), static_cast<long long>(h.held_us), h.host,
           static_cast<long long>(h.pid), h.thread});
    return true;
  } catch (const soci::soci_error&) {
    const error e = s.failure("report session lease '" + name + "'");
    if (s.broken()) throw e;  // the session is gone, and its lock with it
    return false;
  }
}

void unreport(session_scope& s, const std::string& name) {
  s.run(s.statements().session_unreport, {name});
}

bool end_session(session_scope& s, std::int64_t pid) {
  const sql_result r = s.run(s.statements().session_end, {static_cast<long long>(pid)});
  if (!r.empty()) return r.integer(0, 0) == 1;  // a statement that waits itself
  // Ended in the background (MariaDB's KILL): wait up to 5 s until it is gone.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    if (s.run(s.statements().session_gone, {static_cast<long long>(pid)}).integer(0, 0) == 1)
      return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(pause);
  }
}

bool mark(session_scope& s, const std::string& name) {
  // A marker is a lease of the session mode that does not run out (about a century).
  const std::int64_t century_us = 100LL * 366 * 24 * 3600 * 1000000;
  return lock_table::acquire(s, {name, session_mode_token, century_us, "session-mode", 0, ""})
      .has_value();
}

bool unmark(session_scope& s, const std::string& name, std::int64_t fence,
            const std::string& token) {
  return s.run(s.statements().session_unmark,
               {static_cast<long long>(fence), token, name, session_mode_token})
             .affected == 1;
}

}  // namespace dblock::detail::session_lock
