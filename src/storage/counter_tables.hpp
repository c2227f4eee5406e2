// Internal: typed operations on the tables of segmented stock (stock_segment) and of the ID
// generator (id_block). Like lock_table.hpp, the only place besides the dialects that runs SQL
// on them. Each function runs its statements on the session it is given, inside whatever
// transaction is open there; the callers choose the write scope.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "storage/session.hpp"

namespace dblock::detail {

namespace stock_table {

/// One segment row.
struct segment {
  int index = 0;
  std::int64_t amount = 0;
};

/// Takes k from segment `seg` if it holds at least k (one conditional update).
bool take(session_scope& s, const std::string& name, int seg, std::int64_t k);
/// True where take_unlocked() can skip rows that other transactions hold (the backend has row
/// locks; SQLite has one writer and none).
bool skips_locked(session_scope& s);
/**
 * Inside a transaction, where skips_locked(): takes k from segment `seg` if it holds at least k
 * and no other transaction holds its row; never waits for a row lock. The row is locked first
 * (FOR UPDATE SKIP LOCKED), then updated by take() under that lock.
 */
bool take_unlocked(session_scope& s, const std::string& name, int seg, std::int64_t k);
/// Adds k to segment `seg`; false when there is no such segment.
bool put(session_scope& s, const std::string& name, int seg, std::int64_t k);
/// The segments in index order: a plain read, or locking the rows (inside a transaction).
std::vector<segment> read(session_scope& s, const std::string& name, bool lock);
/// Sets a segment's amount (rebalancing, inside a transaction that locked the rows).
void set(session_scope& s, const std::string& name, int seg, std::int64_t amount);
/// Inserts one segment row (errc::unique_violation when it exists).
void insert(session_scope& s, const std::string& name, int seg, std::int64_t amount);
/// The total and the number of segments, in one statement.
struct totals {
  std::int64_t total = 0;
  int segments = 0;
};
totals total(session_scope& s, const std::string& name);
/// Deletes every segment of the stock; returns how many rows went.
std::int64_t remove(session_scope& s, const std::string& name);

}  // namespace stock_table

namespace id_table {

/// Creates the generator's row at 0 unless it exists.
void ensure(session_scope& s, const std::string& name);
/**
 * Reserves n IDs: next_id = max(next_id, (now_ms - epoch_ms) * per_ms) + n on the database
 * clock. Returns the new next_id (the IDs are [next_id - n, next_id)), or nothing when the
 * generator has no row.
 */
std::optional<std::int64_t> reserve(session_scope& s, const std::string& name,
                                    std::int64_t epoch_ms, std::int64_t per_ms, std::int64_t n);

}  // namespace id_table

}  // namespace dblock::detail
