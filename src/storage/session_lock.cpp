#include "storage/session_lock.hpp"

#include <algorithm>

#include "core/identifier.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail::session_lock {

namespace {

// The key the server hashes: the prefix and the name, split by U+FFFF (neither a prefix nor a
// user's name holds it).
std::string key_text(session_scope& s, const std::string& name) {
  return s.tables().prefix + std::string(internal_separator) + name;
}

std::string key_expr() {
  return "hashtextextended(CAST(:key AS TEXT), 0)";
}

}  // namespace

namespace {

// The grant's fence: the marker's plus the sequence's next value (-1 without a marker).
std::string fence_expr(session_scope& s) {
  const auto& t = s.tables();
  return "COALESCE((SELECT fence FROM " + t.lock +
         " WHERE resource_name = :name AND owner_token = :marker AND hold_count > 0) + nextval('" +
         t.prefix + "session_fence'), -1)";
}

// The server ends this session (so frees the lock) when it idles past the TTL, inside a
// transaction or not.
std::string idle_timeouts(const std::string& ttl_text) {
  return "set_config('idle_session_timeout', " + ttl_text +
         ", false), set_config('idle_in_transaction_session_timeout', " + ttl_text + ", false)";
}

// Runs a lock statement (params key, name, marker, ttl) and reads its first column: the fence,
// 0 (held) or -1 (no marker: the lock is given back at once).
tried lock_with(session_scope& s, const statement& st, const std::string& name,
                std::int64_t ttl_ms) {
  const std::int64_t v =
      s.run(st, {key_text(s, name), name, session_mode_token, static_cast<long long>(ttl_ms)})
          .integer(0, 0);
  if (v > 0) return {tried::granted, v};
  if (v == 0) return {tried::held, 0};
  unlock(s, name);  // locked, but no marker: give it back before marking
  return {tried::unmarked, 0};
}

}  // namespace

tried try_lock(session_scope& s, const std::string& name, std::int64_t ttl_ms) {
  const statement st{"session_try",
                     "WITH l AS (SELECT pg_try_advisory_lock(" + key_expr() +
                         ") AS got) SELECT CASE WHEN got THEN " + fence_expr(s) + " ELSE 0 END, " +
                         idle_timeouts("CASE WHEN got THEN CAST(:ttl AS TEXT) ELSE '0' END") +
                         " FROM l",
                     {"key", "name", "marker", "ttl"}};
  return lock_with(s, st, name, ttl_ms);
}

void set_lock_timeout(session_scope& s, std::int64_t wait_ms) {
  const statement st{"session_lock_timeout",
                     "SELECT set_config('lock_timeout', CAST(:ms AS TEXT), false)",
                     {"ms"}};
  s.run(st, {static_cast<long long>(std::max<std::int64_t>(wait_ms, 1))});
}

tried wait_lock(session_scope& s, const std::string& name, std::int64_t ttl_ms) {
  // MATERIALIZED: the lock is taken before the grant's columns are read.
  const statement st{"session_wait",
                     "WITH l AS MATERIALIZED (SELECT pg_advisory_lock(" + key_expr() +
                         ") AS got) SELECT " + fence_expr(s) + ", " +
                         idle_timeouts("CAST(:ttl AS TEXT)") +
                         ", set_config('lock_timeout', '0', false) FROM l",
                     {"key", "name", "marker", "ttl"}};
  return lock_with(s, st, name, ttl_ms);
}

bool unlock(session_scope& s, const std::string& name) {
  const statement st{"session_unlock",
                     "SELECT CAST(pg_advisory_unlock(" + key_expr() +
                         ") AS INTEGER), set_config('idle_session_timeout', '0', false), "
                         "set_config('idle_in_transaction_session_timeout', '0', false)",
                     {"key"}};
  return s.run(st, {key_text(s, name)}).integer(0, 0) == 1;
}

bool mark(session_scope& s, const std::string& name) {
  // A marker is a lease of the session mode that does not run out (about a century).
  const std::int64_t century_us = 100LL * 366 * 24 * 3600 * 1000000;
  return lock_table::acquire(s, {name, session_mode_token, century_us, "session-mode", 0, ""})
      .has_value();
}

}  // namespace dblock::detail::session_lock
