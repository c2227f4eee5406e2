// Row locks with worker processes: a flash sale under FOR UPDATE (and without, the negative
// control), a holder killed with SIGKILL, and a work queue claimed with SKIP LOCKED.
//
// Every test checks invariants that do not depend on timing (exact counts, each stock level sold
// once, each job claimed once by the worker that logged it, uncommitted writes of a killed holder
// discarded). Where a bound on time is part of the promise (takeover after kill -9) it is measured
// and printed as a "[rowlock-metric]" line on stderr.
#include <signal.h>
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "row_lock_support.hpp"
#include "rows.hpp"

using namespace dblock::test;
using namespace dblock::test::rowlock;

// =================================================================================================
// Flash sale under FOR UPDATE
// =================================================================================================

// args: url prefix items_table sales_table attempts worker_id out_file start_ns
// Each attempt is one run_transaction: lock the item row, sell one if stock > 0 (decrement and
// insert a sale row in the same transaction). Writes "sold N", "min M" and one "s <stock_before>"
// line per sale.
DBLOCK_WORKER(rowlock_flash_worker) {
  const std::string url = args.at(0), prefix = args.at(1), items = args.at(2), sales = args.at(3);
  const int attempts = std::stoi(args.at(4));
  const int worker = std::stoi(args.at(5));
  const std::string out_file = args.at(6);
  const long long start_ns = std::stoll(args.at(7));
  const bool use_lock = args.at(8) == "lock";
  auto db = open_db(url, prefix, 2);
  db.ping();
  sleep_until_monotonic(start_ns);
  int sold = 0;
  long long min_seen = LLONG_MAX;
  std::ostringstream log;
  for (int a = 0; a < attempts; ++a) {
    long long before = dblock::run_transaction(db, [&](transaction& t) -> long long {
      long long stock = -1000000;
      if (use_lock) {
        auto rows = t.lock_rows(row_selector{items, "item_id", 1LL, {"stock"}});
        if (rows.size() != 1) throw std::runtime_error("item row not found");
        stock = as_int(rows[0].at("stock"));
      } else {  // negative control: a plain read, no row lock
        t.session() << "SELECT stock FROM " << items << " WHERE item_id = 1", soci::into(stock);
      }
      min_seen = std::min(min_seen, stock);
      if (stock <= 0) return 0;
      // Widen the race window (the unlocked control's wider: on a loaded machine 500 µs once
      // let its 16 processes sell in turn, and the control saw no oversell).
      std::this_thread::sleep_for(std::chrono::microseconds(use_lock ? 500 : 2000));
      t.session() << "UPDATE " << items << " SET stock = stock - 1 WHERE item_id = 1";
      t.session() << "INSERT INTO " << sales
                  << " (worker, attempt, stock_before) VALUES (:w, :a, :s)",
          soci::use(worker, "w"), soci::use(a, "a"), soci::use(stock, "s");
      return stock;
    });
    if (before > 0) {
      ++sold;
      log << "s " << before << "\n";
    }
  }
  write_file_atomic(out_file, "sold " + std::to_string(sold) + "\nmin " + std::to_string(min_seen) +
                                  "\n" + log.str());
  return 0;
}

namespace {

struct flash_result {
  long long sold = 0, min_seen = LLONG_MAX, final_stock = 0, sales_rows = 0;
  std::vector<long long> befores;  // stock level before each sale, sorted
};

flash_result run_flash_sale(dblock::test::context& ctx, int procs, int attempts, long long stock,
                            bool use_lock) {
  const std::string items = ctx.table("items"), sales = ctx.table("sales");
  create_items(ctx, stock);
  ctx.exec("CREATE TABLE " + sales +
           " (worker INTEGER NOT NULL, attempt INTEGER NOT NULL, stock_before INTEGER NOT NULL,"
           " PRIMARY KEY (worker, attempt))");
  temp_dir dir("rowlock");
  process_set ps;
  const long long start_ns = monotonic_ns() + 1500 * ns_per_ms;  // after all have connected
  for (int w = 0; w < procs; ++w)
    ps.spawn("rowlock_flash_worker", {ctx.url, ctx.prefix, items, sales, std::to_string(attempts),
                                      std::to_string(w), dir.file("w" + std::to_string(w)),
                                      std::to_string(start_ns), use_lock ? "lock" : "nolock"});
  auto statuses = ps.wait_all(std::chrono::seconds(120));
  for (std::size_t i = 0; i < statuses.size(); ++i) {
    INFO("flash worker " << i << " exit status " << statuses[i] << " (see its stderr above)");
    REQUIRE(statuses[i] == 0);
  }
  double run_ms = ms_since(start_ns);
  flash_result r;
  for (int w = 0; w < procs; ++w) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(w))));
    std::string tag;
    long long v = 0;
    while (in >> tag >> v) {
      if (tag == "sold") r.sold += v;
      if (tag == "min") r.min_seen = std::min(r.min_seen, v);
      if (tag == "s") r.befores.push_back(v);
    }
  }
  std::sort(r.befores.begin(), r.befores.end());
  r.final_stock = read_stock(ctx.db, items);
  r.sales_rows = count_rows(ctx.db, sales);
  metric(ctx.backend, std::string("flash sale") + (use_lock ? "" : " WITHOUT the lock") + ": " +
                          std::to_string(procs * attempts) + " purchases in " +
                          std::to_string(static_cast<long long>(run_ms)) + " ms, sold " +
                          std::to_string(r.sold) + ", final stock " +
                          std::to_string(r.final_stock));
  return r;
}

}  // namespace

// SQLite runs the same workload: BEGIN IMMEDIATE serialises the 16 processes (the default busy
// handler is not fair, but 800 short transactions finish well inside the 10 s lock timeout).
DBLOCK_TEST("flash sale: 16 processes x 50 purchases under FOR UPDATE sell exactly the stock",
            "[rowlock][process]") {
  const long long stock = 100;
  const std::string sales = ctx.table("sales");
  table_cleanup drop{ctx, {sales}};
  auto r = run_flash_sale(ctx, 16, 50, stock, true);
  CHECK(r.sold == stock);
  CHECK(r.final_stock == 0);
  CHECK(r.min_seen >= 0);
  CHECK(r.sales_rows == stock);
  // Each stock level was sold exactly once: the reads under the lock were never stale.
  std::vector<long long> expected;
  for (long long s = 1; s <= stock; ++s)
    expected.push_back(s);
  CHECK(r.befores == expected);
  CHECK(query_ll(ctx.db, "SELECT count(DISTINCT stock_before) FROM " + sales) == stock);
  CHECK(query_ll(ctx.db, "SELECT min(stock_before) FROM " + sales) == 1);
  CHECK(query_ll(ctx.db, "SELECT max(stock_before) FROM " + sales) == stock);
}

// Negative control: the same workload with a plain read instead of lock_rows must be caught
// overselling, so the checks above can fail. (Not on SQLite: BEGIN IMMEDIATE serialises even
// the unlocked variant, so it cannot oversell.)
DBLOCK_TEST_SERVERS("flash sale without the row lock oversells (negative control)",
                    "[rowlock][process]") {
  const long long stock = 100;
  table_cleanup drop{ctx, {ctx.table("sales")}};
  auto r = run_flash_sale(ctx, 16, 50, stock, false);
  INFO("sold " << r.sold << ", final stock " << r.final_stock);
  CHECK(r.sold > stock);
  CHECK(r.final_stock < 0);
  CHECK(r.sales_rows == r.sold);
}

// =================================================================================================
// Holder killed with SIGKILL
// =================================================================================================

// args: url prefix mode(resource|rows) name_or_table ready_file
// Takes the lock, makes an uncommitted write (rows mode), signals readiness, then sleeps (exits
// by itself after a minute so it never outlives a broken test for long).
DBLOCK_WORKER(rowlock_holder_worker) {
  const std::string url = args.at(0), prefix = args.at(1), mode = args.at(2), target = args.at(3),
                    ready = args.at(4);
  auto db = open_db(url, prefix, 2);
  std::optional<transaction> tx;
  if (mode == "resource") {
    tx.emplace(dblock::lock_resource(db, target, std::chrono::seconds(10)));
  } else {
    tx.emplace(db);
    auto rows = tx->lock_rows(row_selector{target, "item_id", 1LL, {"stock"}});
    if (rows.size() != 1) return 4;
    tx->session() << "UPDATE " << target << " SET stock = -1 WHERE item_id = 1";
  }
  write_file_atomic(ready, "locked\n");
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 5;
}

namespace {

// The lock of one mode: true when obtained without waiting (released again at once).
std::function<bool()> try_mode(const dblock::database& db, const std::string& mode,
                               const std::string& target) {
  if (mode == "resource") return try_resource(db, target);
  return [db, target] {
    transaction_options zero;
    zero.lock_timeout = milliseconds(0);
    transaction t(db, zero);
    try {
      auto rows = t.lock_rows(row_selector{target, "item_id", 1LL, {"stock"}}, lock_wait::nowait);
      if (rows.size() != 1) throw std::runtime_error("item row not found");
      // The killed holder's uncommitted write must be gone.
      if (as_int(rows[0].at("stock")) != 100)
        throw std::runtime_error("stock is " + as_text(rows[0].at("stock")) + ", not 100");
      t.rollback();
      return true;
    } catch (const dblock::error& e) {
      if (e.code() == errc::lock_not_available) return false;
      throw;
    }
  };
}

void killed_holder(dblock::test::context& ctx, const std::string& mode) {
  const std::string target =
      mode == "resource" ? "killed-" + dblock::test::random_suffix() : ctx.table("items");
  temp_dir dir("rowlock");
  process_set ps;
  warm_pool(ctx.db, 4);
  const long long no_wait_ms = dblock::test::no_wait_bound_ms(ctx.db);
  int pid =
      ps.spawn("rowlock_holder_worker", {ctx.url, ctx.prefix, mode, target, dir.file("ready")});
  REQUIRE(wait_for_file(dir.file("ready"), std::chrono::seconds(15)));

  // While the holder lives, a try fails (bounded: a blocked try is left running; it may only
  // succeed after the kill).
  auto probe =
      std::async(std::launch::async, [f = try_mode(ctx.db, mode, target)] { return timed(f); });
  bool probe_in_time = probe.wait_for(milliseconds(no_wait_ms)) == std::future_status::ready;
  std::optional<outcome> before;
  if (probe_in_time) before = probe.get();
  INFO("the try while the holder lives " << (probe_in_time ? "ended" : "did not end") << " within "
                                         << no_wait_ms << " ms");
  CHECK(probe_in_time);
  if (before) {
    INFO("try while the holder lives: " << describe(*before));
    CHECK_FALSE(before->acquired);
    CHECK_FALSE(before->code);
    CHECK_FALSE(before->foreign_exception);
    CHECK(before->ms < no_wait_ms);
  }

  REQUIRE(::kill(pid, SIGKILL) == 0);
  const long long kill_ns = monotonic_ns();
  CHECK(ps.wait(pid, std::chrono::seconds(10)) == 128 + SIGKILL);  // it was alive until then
  std::optional<double> late_takeover_ms;
  if (!probe_in_time) {
    outcome late = probe.get();
    INFO("the blocked try ended " << (late.end_ns - kill_ns) / 1000000
                                  << " ms after the kill: " << describe(late));
    CHECK(late.end_ns >= kill_ns);  // never granted while the holder was alive
    if (late.acquired) late_takeover_ms = static_cast<double>(late.end_ns - kill_ns) / 1e6;
    metric(ctx.backend,
           "the try blocked while the holder lived ended after the kill: " + describe(late));
  }

  outcome got;
  int tries = 0;
  const long long deadline = kill_ns + 10000 * ns_per_ms;
  while (monotonic_ns() < deadline) {
    ++tries;
    got = timed(try_mode(ctx.db, mode, target));
    if (got.acquired || got.code || got.foreign_exception) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  double takeover_ms = static_cast<double>(got.end_ns - kill_ns) / 1e6;
  if (late_takeover_ms) takeover_ms = std::min(takeover_ms, *late_takeover_ms);
  std::ostringstream m;
  m << "takeover after kill -9 (" << mode << "): " << takeover_ms << " ms, " << tries << " tries";
  metric(ctx.backend, m.str());
  INFO(m.str() << "; last try: " << describe(got));
  CHECK_FALSE(got.code);
  CHECK_FALSE(got.foreign_exception);
  REQUIRE(got.acquired);
  CHECK(takeover_ms < scaled_bound_ms(ctx.db, 3000));
  if (mode == "rows") CHECK(read_stock(ctx.db, ctx.table("items")) == 100);
}

}  // namespace

DBLOCK_TEST("holder of lock_resource killed with SIGKILL: the lock frees within seconds",
            "[rowlock][process]") {
  killed_holder(ctx, "resource");
}

DBLOCK_TEST("holder of lock_rows killed with SIGKILL: the row frees, its write is discarded",
            "[rowlock][process]") {
  create_items(ctx, 100);
  killed_holder(ctx, "rows");
}

// =================================================================================================
// A work queue with SKIP LOCKED
// =================================================================================================

// args: url prefix jobs_table worker_id out_file start_ns
// Claims batches of 10 until no 'new' job is left; logs "c <id>" per job it marked done and
// "d <id>" per claimed job someone else had already done (a double claim), "x <id>" per claimed
// row that was not 'new'.
DBLOCK_WORKER(rowlock_queue_worker) {
  const std::string url = args.at(0), prefix = args.at(1), jobs = args.at(2);
  const int worker = std::stoi(args.at(3));
  const std::string out_file = args.at(4);
  const long long start_ns = std::stoll(args.at(5));
  auto db = open_db(url, prefix, 2);
  db.ping();
  sleep_until_monotonic(start_ns);
  std::ostringstream log;
  int empty_rounds = 0;
  for (;;) {
    auto lines = dblock::run_transaction(db, [&](transaction& t) {
      std::vector<std::string> out;
      auto rows = t.claim(
          dblock::claim_spec{jobs, "id", {"status"}, "status = :s", {{"s", std::string("new")}}},
          10);
      if (!rows.empty()) std::this_thread::sleep_for(milliseconds(2));  // the work, under lock
      for (const auto& r : rows) {
        long long id = as_int(r.at("id"));
        if (as_text(r.at("status")) != "new") out.push_back("x " + std::to_string(id));
        soci::statement st =
            (t.session().prepare << "UPDATE " << jobs
                                 << " SET status = 'done', claimed_by = :w WHERE id = :id AND"
                                    " status = 'new'",
             soci::use(worker, "w"), soci::use(id, "id"));
        st.execute(true);
        out.push_back((st.get_affected_rows() == 1 ? "c " : "d ") + std::to_string(id));
      }
      return out;
    });
    for (const auto& l : lines)
      log << l << "\n";
    if (!lines.empty()) {
      std::this_thread::sleep_for(milliseconds(1));  // between batches, outside the transaction
      continue;
    }
    // Nothing claimable: done when no job is new, else the rest is locked by others.
    if (count_rows(db, jobs, "status = 'new'") == 0) break;
    ++empty_rounds;
    std::this_thread::sleep_for(milliseconds(2));
  }
  log << "e " << empty_rounds << "\n";
  write_file_atomic(out_file, log.str());
  return 0;
}

// On SQLite the claimers' write transactions exclude each other, so this runs too.
DBLOCK_TEST("work queue: 8 processes claim 1000 jobs with SKIP LOCKED, each exactly once",
            "[rowlock][process]") {
  const int procs = 8, n_jobs = 1000;
  const std::string jobs = ctx.table("jobs");
  table_cleanup drop{ctx, {jobs}};
  ctx.exec("CREATE TABLE " + jobs +
           " (id INTEGER PRIMARY KEY, status VARCHAR(16) NOT NULL, claimed_by INTEGER)");
  dblock::run_transaction(ctx.db, [&](transaction& t) {
    for (int base = 1; base <= n_jobs; base += 100) {
      std::string q = "INSERT INTO " + jobs + " (id, status) VALUES ";
      for (int id = base; id < base + 100; ++id)
        q += (id == base ? "(" : ", (") + std::to_string(id) + ", 'new')";
      t.session() << q;
    }
  });
  REQUIRE(count_rows(ctx.db, jobs, "status = 'new'") == n_jobs);

  temp_dir dir("rowlock");
  process_set ps;
  const long long start_ns = monotonic_ns() + 1000 * ns_per_ms;
  for (int w = 1; w <= procs; ++w)
    ps.spawn("rowlock_queue_worker", {ctx.url, ctx.prefix, jobs, std::to_string(w),
                                      dir.file("w" + std::to_string(w)), std::to_string(start_ns)});
  auto statuses = ps.wait_all(std::chrono::seconds(120));
  for (std::size_t i = 0; i < statuses.size(); ++i) {
    INFO("queue worker " << i + 1 << " exit status " << statuses[i] << " (see its stderr above)");
    REQUIRE(statuses[i] == 0);
  }
  double run_ms = ms_since(start_ns);
  std::map<long long, std::vector<int>> claimed;  // id -> workers that logged it done
  long long doubles = 0, not_new = 0, empty_rounds = 0;
  std::map<int, int> per_worker;
  for (int w = 1; w <= procs; ++w) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(w))));
    std::string tag;
    long long v = 0;
    while (in >> tag >> v) {
      if (tag == "c") {
        claimed[v].push_back(w);
        ++per_worker[w];
      }
      if (tag == "d") ++doubles;
      if (tag == "x") ++not_new;
      if (tag == "e") empty_rounds += v;
    }
  }
  std::ostringstream m;
  m << "queue: " << n_jobs << " jobs in " << static_cast<long long>(run_ms) << " ms; per worker";
  for (const auto& kv : per_worker)
    m << " " << kv.second;
  m << "; empty claims " << empty_rounds;
  metric(ctx.backend, m.str());
  CHECK(doubles == 0);
  CHECK(not_new == 0);
  CHECK(claimed.size() == static_cast<std::size_t>(n_jobs));
  long long twice = 0;
  for (const auto& kv : claimed)
    if (kv.second.size() != 1) ++twice;
  CHECK(twice == 0);
  CHECK(claimed.begin()->first == 1);
  CHECK(claimed.rbegin()->first == n_jobs);
  CHECK(count_rows(ctx.db, jobs, "status = 'done'") == n_jobs);
  CHECK(count_rows(ctx.db, jobs) == n_jobs);
  // The database agrees with the logs on who did each job.
  auto c = ctx.db.connect();
  soci::rowset<soci::row> rs = (c.session().prepare << "SELECT id, claimed_by FROM " << jobs);
  long long mismatches = 0;
  for (const auto& r : rs) {
    long long id = r.get_indicator(0) == soci::i_ok ? row_int(r, 0) : -1;
    long long by = r.get_indicator(1) == soci::i_ok ? row_int(r, 1) : -1;
    auto it = claimed.find(id);
    if (it == claimed.end() || it->second.empty() || it->second.front() != by) ++mismatches;
  }
  CHECK(mismatches == 0);
}
