#include "backend.hpp"

namespace dblock::detail::lite {

std::string vocabulary::name_pattern_value(const std::string& glob) const {
  // Only `*` and `?` are special in dblock's patterns: a literal '[' is "[[]" in GLOB.
  std::string out;
  for (char c : glob)
    out += c == '[' ? std::string("[[]") : std::string(1, c);
  return out;
}

// SOCI reads columns declared INTEGER through sqlite3_column_int: 32 bits, silently cut. So
// user values travel as tagged text ('i' integer, 'r' real with 17 digits, 't' text) and are
// decoded exactly; NULL stays NULL.
std::string vocabulary::select_value(const std::string& column) const {
  const std::string c = quote(column);
  return "CASE typeof(" + c + ") WHEN 'integer' THEN 'i' || " + c +
         " WHEN 'real' THEN 'r' || printf('%!.17g', " + c + ") WHEN 'null' THEN NULL ELSE 't' || " +
         "CAST(" + c + " AS TEXT) END AS " + c;
}
std::optional<value> vocabulary::decode_text(const std::optional<std::string>& cell,
                                             soci::data_type t) const {
  // The tagged text of select_value() (SOCI describes it as text), decoded as decode_value().
  if (!cell) return value(std::monostate{});
  if (t != soci::dt_string) return detail::vocabulary::decode_text(cell, t);
  const std::string& s = *cell;
  if (s.empty()) return value(std::string());
  if (s[0] == 'i') return detail::vocabulary::decode_text(s.substr(1), soci::dt_long_long);
  if (s[0] == 'r') return detail::vocabulary::decode_text(s.substr(1), soci::dt_double);
  return value(s.substr(1));
}

value vocabulary::decode_value(const soci::row& r, std::size_t i) const {
  if (r.get_indicator(i) == soci::i_null) return std::monostate{};
  const std::string s = r.get<std::string>(i);
  if (s.empty()) return std::string();
  if (s[0] == 'i') return std::stoll(s.substr(1));
  if (s[0] == 'r') return std::stod(s.substr(1));
  return s.substr(1);
}

std::string vocabulary::lease_acquire(const table_names& t, bool in_queue_order) const {
  const std::string reentry =
      "(l.owner_token = excluded.owner_token AND l.expires_at > excluded.acquired_at AND "
      "l.hold_count > 0)";
  const std::string free = "(l.expires_at <= excluded.acquired_at OR l.hold_count = 0)";
  // In queue order, a row of our token is a lease a release handed to this waiter (statements
  // grant_take, grant_give): taken as it is, one hold, its TTL restarted. (A reentrant acquire
  // never runs in queue order.)
  const std::string held_again = in_queue_order ? "l.hold_count" : "l.hold_count + 1";
  return "INSERT INTO " + t.lock +
         " AS l (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
         " holder_host, holder_pid, holder_thread) VALUES (:name, :token, MAX(COALESCE((SELECT"
         " max_fence FROM " +
         t.floor + " WHERE id = 1), 0) + 1, :floor), 1, " + now() + ", " + plus_us(now(), "ttl") +
         ", :host, :pid, :thread) ON CONFLICT (resource_name) DO UPDATE SET"
         " fence = CASE WHEN " +
         reentry + " THEN l.fence ELSE MAX(l.fence + 1, :floor) END, hold_count = CASE WHEN " +
         reentry + " THEN " + held_again + " ELSE 1 END, acquired_at = CASE WHEN " + reentry +
         " THEN l.acquired_at ELSE excluded.acquired_at END,"
         " owner_token = excluded.owner_token, expires_at = excluded.expires_at,"
         " holder_host = excluded.holder_host, holder_pid = excluded.holder_pid,"
         " holder_thread = excluded.holder_thread"
         " WHERE l.owner_token = excluded.owner_token OR (" +
         free + (in_queue_order ? " AND NOT " + queue_ahead(t, "l.owner_token") : "") +
         ") RETURNING fence";
}

std::string vocabulary::id_reserve(const table_names& t) const {
  return "UPDATE " + t.ids + " SET next_id = MAX(next_id, (" + epoch_us(now()) +
         " / 1000 - :epoch_ms) * :per_ms) + :n WHERE generator = :name RETURNING next_id";
}

std::string vocabulary::lease_grant_take(const table_names& t) const {
  // The DELETE is the handover's lock, as in PostgreSQL's lease_release_granting(): a waiter
  // that deletes its entry to give up either goes first (nothing is handed over) or finds its
  // DELETE matched nothing, holds the lease and passes it on.
  return "DELETE FROM " + t.waiters + " WHERE ticket = (SELECT w.ticket FROM " + t.waiters +
         " w WHERE w.resource_name = :name AND w.owner_token <> :token AND w.expires_at > " +
         now() +
         " ORDER BY w.ticket LIMIT 1) AND grant_ttl_us > 0 AND bell <> '' AND EXISTS (SELECT 1"
         " FROM " +
         t.lock +
         " o WHERE o.resource_name = :name AND o.owner_token = :token AND o.fence = :fence AND"
         " o.hold_count = 1 AND o.expires_at > " +
         now() + ") RETURNING ticket, owner_token, bell, grant_ttl_us, holder_host, holder_pid";
}

std::string vocabulary::lease_grant_give(const table_names& t) const {
  return "UPDATE " + t.lock + " SET expires_at = " + plus_us(now(), "g_ttl") +
         ", hold_count = 1, owner_token = :g_token, fence = fence + 1, acquired_at = " + now() +
         ", holder_host = :g_host, holder_pid = :g_pid, holder_thread = '' WHERE resource_name ="
         " :name AND owner_token = :token AND fence = :fence AND hold_count = 1 AND expires_at > " +
         now();
}

vocabulary::fence_check vocabulary::check_fence_native(const table_names& t) const {
  // No stored routines: the check itself, in the caller's BEGIN IMMEDIATE transaction.
  return {"SELECT fence FROM " + t.lock +
              " WHERE resource_name = ? AND fence = ? AND hold_count > 0 AND expires_at > " +
              client_now(),
          true};
}

}  // namespace dblock::detail::lite
