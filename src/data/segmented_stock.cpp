#include "dblock/segmented_stock.hpp"

#include <random>

#include "core/identifier.hpp"
#include "storage/counter_tables.hpp"
#include "storage/session.hpp"
#include "storage/write_scope.hpp"

namespace dblock {
namespace {

using detail::session_scope;
using detail::write_kind;
using detail::write_scope;
namespace table = detail::stock_table;

constexpr int max_segments = 1024;

int random_below(int n) {
  static thread_local std::mt19937 rng(std::random_device{}());
  return std::uniform_int_distribution<int>(0, n - 1)(rng);
}

void check_amount(std::int64_t k, const char* what) {
  if (k < 1)
    throw error(
        errc::invalid_argument,
        std::string(what) + ": the amount must be at least 1 (got " + std::to_string(k) + ")");
}

error no_such_stock(const std::string& name) {
  return error(errc::not_found, "no segmented stock named '" + name +
                                    "' (create it first with segmented_stock::create)");
}

// The number of segments: as last seen, or from a plain read (0: no such stock).
int segment_count(session_scope& s, const std::string& name, std::atomic<int>& cache) {
  int n = cache.load(std::memory_order_relaxed);
  if (n > 0) return n;
  n = table::total(s, name).segments;
  cache.store(n, std::memory_order_relaxed);
  return n;
}

// Each probe is a write of its own: a write scope per statement (SQLite: BEGIN IMMEDIATE), or
// nothing inside the caller's transaction. A lost reply of a probe is in_doubt: a segment's
// amount cannot tell this call's take or put from another's (detail::undecided_write).
template <class F>
auto write(session_scope& s, bool in_transaction, const std::string& what, F&& f) {
  if (in_transaction) return f();
  return detail::statement_write(s, what, std::forward<F>(f));
}

// Every segment locked; k taken from the whole and the rest spread evenly. False when the
// total is below k (nothing changed). Runs inside a transaction.
bool rebalance_take(session_scope& s, const std::string& name, std::int64_t k,
                    std::atomic<int>& cache) {
  const auto segs = table::read(s, name, true);
  cache.store(static_cast<int>(segs.size()), std::memory_order_relaxed);
  if (segs.empty()) throw no_such_stock(name);
  std::int64_t sum = 0;
  for (const auto& g : segs)
    sum += g.amount;
  if (sum < k) return false;
  const std::int64_t rest = sum - k;
  const auto n = static_cast<std::int64_t>(segs.size());
  // The remainder goes to segments from a random start, so that small rests do not always sit
  // in the first segments.
  const int start = random_below(static_cast<int>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& g = segs[static_cast<std::size_t>((start + i) % n)];
    const std::int64_t want = rest / n + (i < rest % n ? 1 : 0);
    if (want != g.amount) table::set(s, name, g.index, want);
  }
  return true;
}

// take() inside the caller's transaction, where the backend has row locks. A row lock lasts
// until the caller commits, and a lock taken on a segment that turned out short (PostgreSQL's
// re-check after a wait, InnoDB's locking of every row it reads by key) is kept too. A take that
// then waits for another segment, or a rebalance that waits for every row, can close a cycle:
// 3-15 deadlocks per 200 orders of 8 threads on PostgreSQL (each after its 1 s
// deadlock_timeout), hundreds on MariaDB. So a take waits only for a segment whose committed
// amount holds k, which a row that another take holds short never has:
// - a plain read of every segment, which locks nothing; when the whole is short the answer is
//   no (as committed at the read; in REPEATABLE READ, at the transaction's snapshot). Stock
//   that others took but have not committed still counts, so this never says no while their
//   rollback could leave k;
// - round 0 probes the segments that read showed holding k, from a random start, skipping rows
//   that others hold (SKIP LOCKED): no waiting at all. Segments it showed short are not probed:
//   InnoDB would keep the lock of a short row even then;
// - rounds 1 and 2 read again and probe those segments with the conditional UPDATE, which may
//   wait for a take that can still roll back. PostgreSQL checks the amount in its snapshot
//   before it waits; InnoDB waits for a row it reads by key whatever its amount, so a segment
//   emptied since the read can still make it wait for a take that holds it short (rare: see the
//   header);
// - only when no single segment holds k (or the stock kept moving for three rounds) does the
//   rebalance lock every row, in segment order.
bool take_skipping_locked(session_scope& s, const std::string& name, std::int64_t k,
                          std::atomic<int>& cache) {
  for (int round = 0; round < 3; ++round) {
    const auto segs = table::read(s, name, false);
    cache.store(static_cast<int>(segs.size()), std::memory_order_relaxed);
    if (segs.empty()) throw no_such_stock(name);
    std::int64_t total = 0;
    bool one_holds_k = false;
    for (const auto& g : segs) {
      total += g.amount;
      one_holds_k = one_holds_k || g.amount >= k;
    }
    if (total < k) return false;
    if (!one_holds_k) break;
    const int n = static_cast<int>(segs.size());
    const int start = random_below(n);
    for (int i = 0; i < n; ++i) {
      const auto& g = segs[static_cast<std::size_t>((start + i) % n)];
      if (g.amount < k) continue;
      if (round == 0 ? table::take_unlocked(s, name, g.index, k) : table::take(s, name, g.index, k))
        return true;
    }
  }
  return rebalance_take(s, name, k, cache);
}

// take() on a session; `in_transaction`: inside the caller's transaction.
bool take_on(session_scope& s, bool in_transaction, const std::string& name, std::int64_t k,
             std::atomic<int>& cache) {
  if (in_transaction && table::skips_locked(s)) return take_skipping_locked(s, name, k, cache);
  const std::string what = "take from stock '" + name + "'";
  const int n = segment_count(s, name, cache);
  if (n == 0) throw no_such_stock(name);
  const int start = random_below(n);
  // Outside a transaction each probe commits by itself and holds nothing afterwards; inside one
  // on SQLite there are no row locks (one writer at a time).
  for (int i = 0; i < n; ++i) {
    const int seg = (start + i) % n;
    if (write(s, in_transaction, what, [&] { return table::take(s, name, seg, k); })) return true;
  }
  // No segment holds k. A plain read first: when the whole is short too, the answer is no
  // without locking every row (the common case once sold out).
  if (!in_transaction && table::total(s, name).total < k) return false;
  if (in_transaction) return rebalance_take(s, name, k, cache);
  write_scope w(s, write_kind::transaction, "rebalance stock '" + name + "'");
  const bool taken = rebalance_take(s, name, k, cache);
  w.commit();
  return taken;
}

void put_on(session_scope& s, bool in_transaction, const std::string& name, std::int64_t k,
            std::atomic<int>& cache) {
  const std::string what = "put into stock '" + name + "'";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int n = segment_count(s, name, cache);
    if (n == 0) break;
    if (write(s, in_transaction, what, [&] { return table::put(s, name, random_below(n), k); }))
      return;
    cache.store(0, std::memory_order_relaxed);  // dropped or re-created smaller: read again
  }
  throw no_such_stock(name);
}

// Runs f(session, in_transaction) on the caller's connection, classifying SOCI's errors (a
// lost reply of a write outside a transaction is in_doubt where it is sent, see write()).
template <class F>
auto on_connection(database::connection& conn, const std::string& what, F&& f) {
  auto& s = detail::access::scope(conn);
  const bool in_tx = s.dia().conn.in_transaction(s.sql());
  try {
    return f(s, in_tx);
  } catch (const soci::soci_error&) {
    throw s.failure(what);
  }
}

}  // namespace

segmented_stock::segmented_stock(database db, std::string name)
    : db_(std::move(db)), name_(std::move(name)) {
  detail::validate_resource_name(name_);
}

void segmented_stock::create(std::int64_t total, int segments) const {
  if (total < 0)
    throw error(errc::invalid_argument, "segmented stock '" + name_ +
                                            "': the total must not be negative (got " +
                                            std::to_string(total) + ")");
  if (segments < 1 || segments > max_segments)
    throw error(errc::invalid_argument, "segmented stock '" + name_ + "': segments must be 1.." +
                                            std::to_string(max_segments) + " (got " +
                                            std::to_string(segments) + ")");
  detail::write_transaction(detail::access::impl(db_), "create stock '" + name_ + "'", std::nullopt,
                            [&](session_scope& s) {
                              for (int i = 0; i < segments; ++i)
                                table::insert(s, name_, i,
                                              total / segments + (i < total % segments ? 1 : 0));
                            });
}

bool segmented_stock::take(std::int64_t k, const retry_policy& policy) const {
  check_amount(k, "segmented_stock::take");
  const std::string what = "take from stock '" + name_ + "'";
  // connection_lost: nothing was written (a lost reply of a write is in_doubt): sent again.
  return detail::resend_unwritten([&] {
    return retry(policy, [&] {
      return detail::with_session(detail::access::impl(db_), what, [&](session_scope& s) {
        return take_on(s, false, name_, k, *segments_);
      });
    });
  });
}

bool segmented_stock::take(database::connection& conn, std::int64_t k) const {
  check_amount(k, "segmented_stock::take");
  return on_connection(conn, "take from stock '" + name_ + "'", [&](session_scope& s, bool in_tx) {
    return take_on(s, in_tx, name_, k, *segments_);
  });
}

void segmented_stock::put(std::int64_t k, const retry_policy& policy) const {
  check_amount(k, "segmented_stock::put");
  const std::string what = "put into stock '" + name_ + "'";
  // connection_lost: nothing was written (a lost reply of a write is in_doubt): sent again.
  detail::resend_unwritten([&] {
    retry(policy, [&] {
      detail::with_session(detail::access::impl(db_), what,
                           [&](session_scope& s) { put_on(s, false, name_, k, *segments_); });
    });
  });
}

void segmented_stock::put(database::connection& conn, std::int64_t k) const {
  check_amount(k, "segmented_stock::put");
  on_connection(conn, "put into stock '" + name_ + "'",
                [&](session_scope& s, bool in_tx) { put_on(s, in_tx, name_, k, *segments_); });
}

std::int64_t segmented_stock::total() const {
  return detail::with_read(detail::access::impl(db_), "read stock '" + name_ + "'",
                           [&](session_scope& s) {
                             const auto t = table::total(s, name_);
                             if (t.segments == 0) throw no_such_stock(name_);
                             return t.total;
                           });
}

std::vector<std::int64_t> segmented_stock::segments() const {
  return detail::with_read(detail::access::impl(db_), "read stock '" + name_ + "'",
                           [&](session_scope& s) {
                             std::vector<std::int64_t> out;
                             for (const auto& g : table::read(s, name_, false))
                               out.push_back(g.amount);
                             if (out.empty()) throw no_such_stock(name_);
                             return out;
                           });
}

bool segmented_stock::drop() const {
  return detail::write_transaction(detail::access::impl(db_), "drop stock '" + name_ + "'",
                                   std::nullopt, [&](session_scope& s) {
                                     segments_->store(0, std::memory_order_relaxed);
                                     return table::remove(s, name_) > 0;
                                   });
}

}  // namespace dblock
