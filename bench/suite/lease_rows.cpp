// The lease rows: the round-trip floor, the lease cycle on distinct keys (raw, dblock, the SQL
// API), as the lock table grows, in PostgreSQL's fast mode, on one hot key, and the renewal.
#include <dblock/dblock.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rows.hpp"
#include "storage/lock_table.hpp"
#include "storage/session.hpp"

namespace dblock::bench {
namespace {

// Why a hot-key row took the lease not once: who holds the key (a lease that an earlier row
// left held, or another process's), for the row's note.
std::string hot_key_holder(const backend_ctx& b) {
  try {
    dblock::list_options lo;
    lo.pattern = "bench/hot";
    lo.include_free = true;
    for (const auto& l : dblock::list_locks(b.db, lo))
      if (l.name == "bench/hot")
        return "no try succeeded: bench/hot " +
               (l.held ? "was held by " + l.holder_host + " pid " + std::to_string(l.holder_pid) +
                             " thread " + l.holder_thread + " (fence " + std::to_string(l.fence) +
                             ", " + std::to_string(l.hold_count) + " holds, expires in " +
                             std::to_string(l.expires_in.count() / 1000) + " ms)"
                       : std::string("is free now"));
    return "no try succeeded: bench/hot has no row";
  } catch (const std::exception& e) {
    return std::string("no try succeeded (reading bench/hot: ") + e.what() + ")";
  }
}

// The tables of a dblock.tablesize_* operation: prefix <prefix>rows<N>_, holding the released
// lease rows "fill/0" ... "fill/<N-1>" (expired two hours ago). Filled once, in batches of 1,000
// rows, and kept for later runs.
void prepare_sized(backend_ctx& b, long long rows, std::ostream& progress) {
  dblock::database_options dbo = b.db.options();
  dbo.table_prefix = b.prefix + "rows" + std::to_string(rows) + "_";
  dblock::database db(b.url, dbo);
  dblock::migrate(db);
  auto c = db.connect();
  auto& sql = c.session();
  long long have = 0;
  sql << "SELECT COUNT(*) FROM " << db.lock_table() << " WHERE resource_name LIKE 'fill/%'",
      soci::into(have);
  const std::string past = b.backend == "postgresql" ? "clock_timestamp() - INTERVAL '2 hours'"
                           : b.backend == "mysql"    ? "UTC_TIMESTAMP(6) - INTERVAL 2 HOUR"
                                                     : "0";
  if (have < rows)
    progress << "bench: " << b.label << ": filling " << db.lock_table() << " from " << have
             << " to " << rows << " rows (once; kept for later runs)\n";
  const auto t0 = clk::now();
  const long long batch = 1000, per_txn = 50;
  for (long long first = have; first < rows;) {
    sql << b.begin_write;
    for (long long n = 0; n < per_txn && first < rows; ++n, first += batch) {
      std::string q = "INSERT INTO " + db.lock_table() +
                      " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
                      " holder_host, holder_pid, holder_thread) VALUES ";
      for (long long i = first; i < std::min(rows, first + batch); ++i)
        q += std::string(i > first ? ", " : "") + "('fill/" + std::to_string(i) + "', '', " +
             std::to_string(i + 1) + ", 0, " + past + ", " + past + ", '', 0, '')";
      sql << q;
    }
    sql << "COMMIT";
    if (rows >= 100000 && first % 100000 == 0)
      progress << "bench: " << b.label << ": " << first << " of " << rows << " rows\n";
  }
  if (have < rows)
    progress << "bench: " << b.label << ": filled in "
             << std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0).count()
             << " ms\n";
  b.sized.emplace(rows, db);
}

// The round-trip floor, and the lease cycle on distinct keys: raw, dblock and the SQL API.
void add_cycle_rows(std::vector<row>& ops, const backend_ctx& b, int keys) {
  const bool pg = b.backend == "postgresql", my = b.backend == "mysql";
  ops.push_back({"raw.select1", "floor", "", "SELECT 1 round trip", [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   return cycle_fn([c] { return c->run("s1", "SELECT 1", {}).value == 1; });
                 }});
  ops.push_back({"dblock.ping", "dblock", "raw.select1", "database::ping(): SELECT 1 via SOCI",
                 [](backend_ctx& b, int) {
                   return cycle_fn([&b] {
                     b.db.ping();
                     return true;
                   });
                 }});

  ops.push_back(
      {"raw.lease", "floor", "", "acquire+release, distinct keys", [keys](backend_ctx& b, int t) {
         auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
         return cycle_fn([c, &b, t, keys] {
           const std::string name = key_name(t, keys), tok = token();
           auto f = raw_acquire(*c, b, name, tok);
           return f && raw_release(*c, b, name, tok, *f);
         });
       }});
  ops.push_back({"dblock.lease", "dblock", "raw.lease", "try_acquire()+release(), distinct keys",
                 [keys](backend_ctx& b, int t) {
                   return lease_cycle(b.db, "bench/" + std::to_string(t) + "/", keys);
                 }});

  // The SQL API (docs/sql-api.md): the same lease cycle as a client in any language runs it,
  // through the routines that `dblock migrate` installs (PostgreSQL functions, MariaDB
  // procedures), on the C client library; as a ratio to dblock.lease. On PostgreSQL the release
  // passes durable => false (no wait for the WAL flush), as the library's own release does.
  if (pg || my)
    ops.push_back({"sql.lease", "feature", "dblock.lease",
                   "SQL API: dblock_acquire()+dblock_release() from libpq / the MySQL client, "
                   "distinct keys; ratio to dblock.lease",
                   [keys](backend_ctx& b, int t) {
                     auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                     const bool on_pg = b.backend == "postgresql";
                     const std::string acq = (on_pg ? "SELECT " : "CALL ") + b.prefix +
                                             "dblock_acquire(:name, :owner, 30000)";
                     const std::string rel =
                         on_pg ? "SELECT CAST(" + b.prefix +
                                     "dblock_release(:name, :owner, :fence, false) AS INTEGER)"
                               : "CALL " + b.prefix + "dblock_release(:name, :owner, :fence)";
                     return cycle_fn([c, t, keys, acq, rel] {
                       const std::string name = key_name(t, keys), tok = token();
                       const auto f = c->run("sql_acquire", acq, {{"name", name}, {"owner", tok}});
                       return f.value &&
                              c->run("sql_release", rel,
                                     {{"name", name}, {"owner", tok}, {"fence", *f.value}})
                                      .value == 1;
                     });
                   }});
}

// The lease cycle as the lock table grows: try_acquire()+release() of distinct names against
// tables that already hold 10, 10,000 or 1,000,000 released rows (as before the reaper ran),
// each size in its own tables (prepare_sized()). Ratios to the 10-row figure: flat when the
// primary-key index keeps the cost of a row independent of the table's size.
void add_tablesize_rows(std::vector<row>& ops, int keys) {
  auto add = [&ops, keys](const char* name, const char* floor, const char* note, long long rows,
                          bool named_only) {
    row r{name, "feature", floor, note, {}, named_only};
    r.setup = [rows, keys](backend_ctx& b, int t) {
      auto it = b.sized.find(rows);
      if (it == b.sized.end()) throw std::runtime_error("the sized tables were not prepared");
      return lease_cycle(it->second, "bench/size/" + std::to_string(t) + "/", keys);
    };
    r.prepare = [rows](backend_ctx& b, std::ostream& progress) {
      prepare_sized(b, rows, progress);
    };
    ops.push_back(std::move(r));
  };
  add("dblock.tablesize_10", "dblock.lease",
      "try_acquire()+release(), distinct names, 10 other rows in the lock table; ratio to "
      "dblock.lease",
      10, false);
  add("dblock.tablesize_10k", "dblock.tablesize_10",
      "the same with 10,000 released rows in the lock table; ratio to 10 rows", 10000, false);
  add("dblock.tablesize_1m", "dblock.tablesize_10",
      "the same with 1,000,000 released rows (filled once, kept; runs only when --only names "
      "it); ratio to 10 rows",
      1000000, true);
}

// PostgreSQL's fast lease mode: the lease cycle on an UNLOGGED lease table (b.fast), the raw
// client raising the fence epoch once per connection as dblock does. Compare with pg.advisory.
void add_fast_rows(std::vector<row>& ops, const backend_ctx& b, int keys) {
  if (b.backend == "postgresql" && b.fast) {
    ops.push_back(
        {"raw.lease_fast", "floor", "",
         "acquire+release, distinct keys, UNLOGGED lease table (fast mode), fence epoch raised "
         "once per connection",
         [keys](backend_ctx& b, int t) {
           backend_ctx& f = *b.fast;
           auto c = std::shared_ptr<raw_client>(connect_raw(f.url));
           // dblock's own statements for the raise (the dialect's durable commit, the floor
           // table's epoch), as lock_table::fence_floor() runs them.
           const auto& st = detail::access::impl(f.db)->statements;
           c->exec("BEGIN");
           if (!st.durable_commit.text.empty()) c->exec(st.durable_commit.text);
           const std::optional<long long> epoch = c->run("epoch", st.epoch_raise.text, {}).value;
           c->exec("COMMIT");
           if (!epoch) throw std::runtime_error("raising the fence epoch returned nothing");
           const long long floor = *epoch << detail::lock_table::fence_epoch_shift;
           return cycle_fn([c, &f, t, keys, floor] {
             const std::string name = key_name(t, keys), tok = token();
             auto fence = raw_acquire(*c, f, name, tok, floor);
             return fence && raw_release(*c, f, name, tok, *fence);
           });
         }});
    ops.push_back({"dblock.lease_fast", "dblock", "raw.lease_fast",
                   "try_acquire()+release(), distinct keys, fast lease mode "
                   "(set_lease_durability(fast)); compare with pg.advisory",
                   [keys](backend_ctx& b, int t) {
                     return lease_cycle(b.fast->db, "bench/" + std::to_string(t) + "/", keys);
                   }});
  }
}

// One hot key, polling (raw: one try per operation; dblock: acquire(wait)). A round that took
// the lease not once says who held it.
void add_hot_rows(std::vector<row>& ops) {
  ops.push_back({"raw.lease_hot", "floor", "",
                 "one key, polling: one try per operation, successes counted",
                 [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   return cycle_fn([c, &b] {
                     const std::string tok = token();
                     auto f = raw_acquire(*c, b, "bench/hot", tok);
                     return f && raw_release(*c, b, "bench/hot", tok, *f);
                   });
                 }});
  ops.push_back({"dblock.lease_hot", "dblock", "raw.lease_hot",
                 "one key: acquire(wait)+release, default polling", [](backend_ctx& b, int) {
                   auto lk =
                       std::make_shared<dblock::lease_lock>(b.db, "bench/hot", b.wait_options);
                   return cycle_fn([lk] {
                     auto g = lk->acquire(std::chrono::seconds(30));
                     g.release();
                     return true;
                   });
                 }});
  for (auto* r : {&ops[ops.size() - 2], &ops.back()})
    r->why_none = hot_key_holder;
}

// Renewing a held lease.
void add_renew_rows(std::vector<row>& ops) {
  ops.push_back({"raw.renew", "floor", "", "renew a held lease", [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   const std::string name = fresh_name("renew"), tok = token();
                   auto f = raw_acquire(*c, b, name, tok);
                   if (!f) throw std::runtime_error("cannot acquire " + name);
                   const long long fence = *f;
                   return cycle_fn([c, &b, name, tok, fence] {
                     return raw_simple_write(
                         *c, b, "renew", b.sql.renew,
                         {{"ttl", kTtlUs}, {"name", name}, {"token", tok}, {"fence", fence}});
                   });
                 }});
  ops.push_back(
      {"dblock.renew", "dblock", "raw.renew", "lease_guard::renew()", [](backend_ctx& b, int) {
         auto lk = std::make_shared<dblock::lease_lock>(b.db, fresh_name("renew"));
         auto g = std::make_shared<dblock::lease_guard>(lk->acquire(std::chrono::milliseconds(0)));
         return cycle_fn([lk, g] {
           g->renew();
           return true;
         });
       }});
}

}  // namespace

std::vector<row> lease_rows(backend_ctx& b, const options& o) {
  std::vector<row> ops;
  add_cycle_rows(ops, b, o.keys);
  add_tablesize_rows(ops, o.keys);
  add_fast_rows(ops, b, o.keys);
  add_hot_rows(ops);
  add_renew_rows(ops);
  return ops;
}

}  // namespace dblock::bench
