#include "backend.hpp"

namespace dblock::detail::my {

std::string vocabulary::lease_acquire(const table_names& t) const {
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
  return "INSERT INTO " + t.lock +
         " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
         " holder_host, holder_pid, holder_thread) VALUES (:name, :token,"
         " LAST_INSERT_ID(COALESCE((SELECT max_fence FROM " +
         t.floor + " WHERE id = 1), 0) + 1), 1, " + now + ", " + plus_us(now, "ttl") +
         ", :host, :pid, :thread) ON DUPLICATE KEY UPDATE" + " fence = IF(" + take +
         ", LAST_INSERT_ID(IF(" + reentry + ", fence, fence + 1)), fence + LAST_INSERT_ID(0))," +
         " acquired_at = IF(" + reentry + ", acquired_at, IF(" + take + ", " + now +
         ", acquired_at))," + " holder_host = IF(" + take + ", VALUES(holder_host), holder_host)," +
         " holder_pid = IF(" + take + ", VALUES(holder_pid), holder_pid)," +
         " holder_thread = IF(" + take + ", VALUES(holder_thread), holder_thread)," +
         " owner_token = IF(" + take + ", VALUES(owner_token), owner_token)," +
         " hold_count = IF(" + reentry + ", hold_count + 1, IF(" + take + ", 1, hold_count))," +
         " expires_at = IF(" + take + ", VALUES(expires_at), expires_at)";
}

std::string vocabulary::id_reserve(const table_names& t) const {
  // The new next_id comes back through LAST_INSERT_ID(expr) in the OK packet (no RETURNING).
  return "UPDATE " + t.ids + " SET next_id = LAST_INSERT_ID(GREATEST(next_id, (" + epoch_us(now()) +
         " DIV 1000 - :epoch_ms) * :per_ms) + :n) WHERE generator = :name";
}

}  // namespace dblock::detail::my
