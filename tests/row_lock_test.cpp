// Row locks and the transaction runner (include/dblock/row_lock.hpp), on PostgreSQL, MariaDB and
// SQLite, with threads and with worker processes.
//
// Every test checks invariants that do not depend on timing (exact counts, each stock level sold
// once, each job claimed once by the worker that logged it, uncommitted writes of a killed holder
// discarded). Where a bound on time is part of the promise (NOWAIT latency, the lock wait timeout,
// takeover after kill -9) it is measured and printed as a "[rowlock-metric]" line on stderr.
//
// A call that should return quickly but may block on a library bug is run on a helper thread
// with a deadline (run_bounded): past the deadline the test records the failure and releases the
// lock the call waits for, so that a bug costs seconds, never the server's 50 s lock wait.
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
#include "rows.hpp"

using namespace dblock::test;

using dblock::errc;
using dblock::lock_wait;
using dblock::row_selector;
using dblock::transaction;
using dblock::transaction_options;
using std::chrono::milliseconds;

namespace {

double ms_since(long long t0_ns) {
  return static_cast<double>(monotonic_ns() - t0_ns) / 1e6;
}

// One line per measurement, easy to grep out of a run.
void metric(const std::string& backend, const std::string& text) {
  std::cerr << "[rowlock-metric] " << backend << ": " << text << std::endl;
}

// ---- database helpers --------------------------------------------------------------------------

long long query_ll(const dblock::database& db, const std::string& sql) {
  auto c = db.connect();
  long long n = -1;
  c.session() << sql, soci::into(n);
  return n;
}

long long count_rows(const dblock::database& db, const std::string& table,
                     const std::string& where = "1 = 1") {
  return query_ll(db, "SELECT count(*) FROM " + table + " WHERE " + where);
}

long long lock_rows_for(const dblock::database& db, const std::string& name) {
  auto c = db.connect();
  long long n = -1;
  c.session() << "SELECT count(*) FROM " << db.lock_table() << " WHERE resource_name = :n",
      soci::use(name), soci::into(n);
  return n;
}

// Opens every pooled connection now, so that measured calls do not pay for connecting.
void warm_pool(const dblock::database& db, std::size_t n) {
  std::vector<dblock::database::connection> cs;
  for (std::size_t i = 0; i < n; ++i)
    cs.push_back(db.connect());
}

long long as_int(const dblock::value& v) {
  if (auto* i = std::get_if<long long>(&v)) return *i;
  if (auto* s = std::get_if<std::string>(&v)) return std::stoll(*s);
  if (auto* d = std::get_if<double>(&v)) return static_cast<long long>(*d);
  throw std::runtime_error("NULL where an integer was expected");
}

std::string as_text(const dblock::value& v) {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  if (auto* i = std::get_if<long long>(&v)) return std::to_string(*i);
  return "<null>";
}

void create_items(const dblock::test::context& ctx, long long stock, int n_items = 1) {
  ctx.exec("CREATE TABLE " + ctx.table("items") +
           " (item_id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)");
  for (int i = 1; i <= n_items; ++i)
    ctx.exec("INSERT INTO " + ctx.table("items") + " (item_id, stock) VALUES (" +
             std::to_string(i) + ", " + std::to_string(stock) + ")");
}

long long read_stock(const dblock::database& db, const std::string& table, long long id = 1) {
  return query_ll(db, "SELECT stock FROM " + table + " WHERE item_id = " + std::to_string(id));
}

row_selector item(const std::string& table, long long id = 1) {
  return row_selector{table, "item_id", id, {"stock"}};
}

// ---- outcomes of calls that may block --------------------------------------------------------

struct outcome {
  bool acquired = false;           // a lock was obtained (and released again by the probe)
  std::optional<errc> code;        // set when the call threw dblock::error
  std::string message;             // what() of any exception
  bool foreign_exception = false;  // threw something other than dblock::error
  double ms = 0;                   // duration of the call
  bool in_time = true;             // returned before run_bounded's limit
  long long end_ns = 0;            // CLOCK_MONOTONIC when the call returned
};

// Calls f (which returns true when it obtained a lock) and records how it ended.
outcome timed(const std::function<bool()>& f) {
  outcome o;
  long long t0 = monotonic_ns();
  try {
    o.acquired = f();
  } catch (const dblock::error& e) {
    o.code = e.kind();
    o.message = e.what();
  } catch (const std::exception& e) {
    o.foreign_exception = true;
    o.message = e.what();
  }
  o.end_ns = monotonic_ns();
  o.ms = static_cast<double>(o.end_ns - t0) / 1e6;
  return o;
}

// Runs f on another thread and waits up to `limit`. When it has not returned by then, calls
// `unblock` (which must make it return, e.g. by releasing the lock it waits for) and waits for it.
outcome run_bounded(const std::function<bool()>& f, milliseconds limit,
                    const std::function<void()>& unblock) {
  auto fut = std::async(std::launch::async, [f] { return timed(f); });
  if (fut.wait_for(limit) == std::future_status::ready) return fut.get();
  unblock();
  outcome o = fut.get();
  o.in_time = false;
  return o;
}

std::string describe(const outcome& o) {
  std::ostringstream s;
  s << (o.acquired ? "acquired" : "not acquired") << " after " << o.ms << " ms";
  if (o.code) s << ", error " << dblock::to_string(*o.code);
  if (o.foreign_exception) s << ", non-dblock exception";
  if (!o.message.empty()) s << " (" << o.message << ")";
  if (!o.in_time) s << " [did not return in time: the test released the lock to unblock it]";
  return s.str();
}

// try_lock_resource as a probe: true when it got the lock (released again at once).
std::function<bool()> try_resource(const dblock::database& db, const std::string& name) {
  return [db, name] {
    auto t = dblock::try_lock_resource(db, name);
    if (!t) return false;
    t->rollback();
    return true;
  };
}

// A cyclic barrier for threads, with a timeout so that a broken test cannot hang.
class rendezvous {
 public:
  explicit rendezvous(int parties) : parties_(parties) {}
  bool arrive_and_wait(milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lk(mu_);
    long gen = generation_;
    if (++waiting_ == parties_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    return cv_.wait_for(lk, timeout, [&] { return generation_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int parties_;
  int waiting_ = 0;
  long generation_ = 0;
};

// Runs `threads` threads over `names`: before each name every thread meets the others at `start`,
// then calls attempt(thread, name index). Returns each thread's first error as "<name>: <what>"
// ("" when none).
std::vector<std::string> all_threads_on_each_name(rendezvous& start, int threads,
                                                  const std::vector<std::string>& names,
                                                  const std::function<void(int, int)>& attempt) {
  std::vector<std::string> errors(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < static_cast<int>(names.size()); ++i) {
        start.arrive_and_wait();  // everyone hits the same name at the same moment
        try {
          attempt(t, i);
        } catch (const std::exception& e) {
          if (errors[t].empty()) errors[t] = names[i] + ": " + e.what();
        }
      }
    });
  for (auto& t : ts)
    t.join();
  return errors;
}

}  // namespace

// =================================================================================================
// 1. Flash sale under FOR UPDATE
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
      std::this_thread::sleep_for(std::chrono::microseconds(500));  // widen the race window
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
// 2. Lock-table rows: try_lock_resource, lock_resource with a timeout, first use
// =================================================================================================

DBLOCK_TEST("lock_resource: try fails fast while held, the wait times out on time, rows appear",
            "[rowlock]") {
  const std::string name = "rl-" + dblock::test::random_suffix();
  warm_pool(ctx.db, 4);
  CHECK(lock_rows_for(ctx.db, name) == 0);

  auto held = dblock::try_lock_resource(ctx.db, name);
  REQUIRE(held);
  CHECK(held->active());
  // Created on first use, outside the transaction (visible to others at once).
  CHECK(lock_rows_for(ctx.db, name) == 1);

  // While held, a second try returns nothing, quickly. Each probe runs on a helper thread: if
  // it blocks, the holder is released after 2 s so that the test goes on (and fails).
  std::vector<double> lat;
  for (int i = 0; i < 7 && held; ++i) {
    auto o = run_bounded(try_resource(ctx.db, name), std::chrono::seconds(2), [&] {
      held->rollback();
      held.reset();
    });
    INFO("try_lock_resource while held: " << describe(o));
    CHECK(o.in_time);
    CHECK_FALSE(o.acquired);
    CHECK_FALSE(o.code);
    CHECK_FALSE(o.foreign_exception);
    lat.push_back(o.ms);
  }
  std::sort(lat.begin(), lat.end());
  double median = lat.empty() ? 0 : lat[lat.size() / 2];
  std::ostringstream m;
  m << "try_lock_resource while held: median " << median << " ms, max "
    << (lat.empty() ? 0 : lat.back()) << " ms over " << lat.size() << " tries";
  metric(ctx.backend, m.str());
  CHECK(median < 50);

  // After commit (and after rollback) it can be taken again.
  if (held) held->commit();
  held.reset();
  auto again = dblock::try_lock_resource(ctx.db, name);
  REQUIRE(again);
  again->rollback();
  auto third = dblock::try_lock_resource(ctx.db, name);
  REQUIRE(third);

  // lock_resource with a 2 s timeout while held: lock_not_available after 2 s +- 25 %. A fresh
  // handle, so that no earlier transaction has touched its connection's session settings.
  const milliseconds timeout(2000);
  auto other = ctx.open();
  auto o = run_bounded(
      [&] {
        auto t = dblock::lock_resource(other, name, timeout);
        t.rollback();
        return true;
      },
      milliseconds(4000), [&] { third->rollback(); });
  INFO("lock_resource(2 s) while held: " << describe(o));
  metric(ctx.backend, "lock_resource(2000 ms) while held: " + describe(o));
  CHECK(o.in_time);
  CHECK_FALSE(o.acquired);
  CHECK(o.code == errc::lock_not_available);
  CHECK(o.ms >= 1500);
  CHECK(o.ms <= 2500);
  if (third) third->rollback();
}

DBLOCK_TEST("lock_resource: 8 threads on 16 fresh names at once raise no error", "[rowlock]") {
  const int threads = 8, names = 16;
  auto o = ctx.options();
  o.pool_size = threads + 2;
  auto db = ctx.open(o);  // fresh connections: nothing left over by other tests
  warm_pool(db, threads);
  std::vector<std::string> ns;
  for (int i = 0; i < names; ++i)
    ns.push_back("fresh-" + dblock::test::random_suffix() + "-" + std::to_string(i));
  rendezvous start(threads);
  std::vector<int> got(threads, 0);
  // Everyone hits the same absent name at the same moment.
  auto errors = all_threads_on_each_name(start, threads, ns, [&](int t, int i) {
    auto tx = dblock::lock_resource(db, ns[i], std::chrono::seconds(10));
    ++got[t];
    tx.commit();
  });
  for (int t = 0; t < threads; ++t) {
    INFO("thread " << t);
    CHECK(errors[t] == "");
    CHECK(got[t] == names);
  }
  for (const auto& n : ns)
    CHECK(lock_rows_for(db, n) == 1);

  // The same with try_lock_resource: at least one winner per name, no error.
  std::vector<std::string> tns;
  for (int i = 0; i < names; ++i)
    tns.push_back("fresh-try-" + dblock::test::random_suffix() + "-" + std::to_string(i));
  std::vector<std::atomic<int>> winners(names);
  auto errors2 = all_threads_on_each_name(start, threads, tns, [&](int, int i) {
    auto tx = dblock::try_lock_resource(db, tns[i]);
    if (tx) {
      ++winners[i];
      tx->commit();
    }
  });
  for (int t = 0; t < threads; ++t) {
    INFO("thread " << t);
    CHECK(errors2[t] == "");
  }
  for (int i = 0; i < names; ++i) {
    CHECK(winners[i].load() >= 1);
    CHECK(lock_rows_for(db, tns[i]) == 1);
  }
}

// =================================================================================================
// 3. NOWAIT and SKIP LOCKED on business rows
// =================================================================================================

// Row-level NOWAIT is a server phenomenon; SQLite's equivalent is the next test.
DBLOCK_TEST_SERVERS("lock_rows: nowait fails fast and skip_locked skips a row another tx holds",
                    "[rowlock]") {
  create_items(ctx, 10, 2);
  const std::string items = ctx.table("items");
  warm_pool(ctx.db, 4);
  transaction a(ctx.db);
  auto rows = a.lock_rows(item(items, 1));
  REQUIRE(rows.size() == 1);
  CHECK(as_int(rows[0].at("item_id")) == 1);
  CHECK(as_int(rows[0].at("stock")) == 10);

  std::vector<double> lat;
  for (int i = 0; i < 7; ++i) {
    transaction b(ctx.db);
    auto o = timed([&] {
      b.lock_rows(item(items, 1), lock_wait::nowait);
      return true;
    });
    INFO("nowait while held: " << describe(o));
    CHECK_FALSE(o.acquired);
    CHECK(o.code == errc::lock_not_available);
    lat.push_back(o.ms);
  }
  std::sort(lat.begin(), lat.end());
  std::ostringstream m;
  m << "lock_rows(nowait) while held: median " << lat[lat.size() / 2] << " ms, max " << lat.back()
    << " ms";
  metric(ctx.backend, m.str());
  CHECK(lat[lat.size() / 2] < 50);

  {
    transaction b(ctx.db);
    CHECK(b.lock_rows(item(items, 1), lock_wait::skip_locked).empty());
    // The other row is free: nowait takes it.
    auto r2 = b.lock_rows(item(items, 2), lock_wait::nowait);
    REQUIRE(r2.size() == 1);
    CHECK(as_int(r2[0].at("item_id")) == 2);
    // A key that matches nothing is an empty result, not an error.
    CHECK(b.lock_rows(item(items, 99), lock_wait::nowait).empty());
  }
  a.commit();
  transaction c(ctx.db);
  CHECK(c.lock_rows(item(items, 1), lock_wait::nowait).size() == 1);
  c.commit();
}

// SQLite has no row locks: a transaction takes the database's single write lock at BEGIN
// IMMEDIATE. The honest equivalent of NOWAIT is that a second writer cannot even begin.
DBLOCK_TEST_ONLY("sqlite", "sqlite: an open row-lock transaction excludes every other writer",
                 "[rowlock]") {
  create_items(ctx, 10, 2);
  const std::string items = ctx.table("items");
  warm_pool(ctx.db, 4);
  transaction a(ctx.db);
  REQUIRE(a.lock_rows(item(items, 1)).size() == 1);
  a.session() << "UPDATE " << items << " SET stock = 9 WHERE item_id = 1";

  // Even a different row: the whole database is locked for writers.
  transaction_options zero;
  zero.lock_timeout = milliseconds(0);
  for (long long id : {1LL, 2LL}) {
    transaction b(ctx.db, zero);
    auto o = timed([&] {
      b.lock_rows(item(items, id), lock_wait::nowait);
      return true;
    });
    INFO("second writer, row " << id << ": " << describe(o));
    metric(ctx.backend,
           "second writer (lock_timeout 0) while a transaction is open: " + describe(o));
    CHECK_FALSE(o.acquired);
    CHECK(o.code == errc::lock_not_available);
    CHECK(o.ms < 50);
  }
  // try_lock_resource: nothing, quickly (bounded: past 2 s the holder is released).
  bool released = false;
  auto o = run_bounded(try_resource(ctx.db, "sqlite-excl"), std::chrono::seconds(2), [&] {
    a.rollback();
    released = true;
  });
  INFO("try_lock_resource while another transaction is open: " << describe(o));
  metric(ctx.backend, "try_lock_resource while another transaction is open: " + describe(o));
  CHECK(o.in_time);
  CHECK_FALSE(o.acquired);
  CHECK(o.ms < 50);

  // Readers are not blocked (WAL) and see the committed state only.
  CHECK(read_stock(ctx.db, items) == 10);
  if (!released) {
    a.commit();
    CHECK(read_stock(ctx.db, items) == 9);
    transaction c(ctx.db, zero);
    CHECK(c.lock_rows(item(items, 2), lock_wait::nowait).size() == 1);
  }
}

// SKIP LOCKED on a server: a second claimer gets exactly the rows the first did not lock.
// (SQLite: the second claimer cannot begin while the first is open; the queue test covers it.)
DBLOCK_TEST_SERVERS("claim: a second claimer skips exactly the rows the first one holds",
                    "[rowlock]") {
  const std::string jobs = ctx.table("jobs");
  table_cleanup drop{ctx, {jobs}};
  ctx.exec("CREATE TABLE " + jobs +
           " (id INTEGER PRIMARY KEY, status VARCHAR(16) NOT NULL, claimed_by INTEGER)");
  for (int id = 1; id <= 7; ++id)
    ctx.exec("INSERT INTO " + jobs + " (id, status) VALUES (" + std::to_string(id) + ", '" +
             (id == 3 ? "done" : "new") + "')");
  const dblock::claim_spec spec{jobs, "id", {"status"}, "status = :s", {{"s", std::string("new")}}};
  auto ids = [](const std::vector<dblock::record>& rows) {
    std::vector<long long> out;
    for (const auto& r : rows)
      out.push_back(as_int(r.at("id")));
    return out;
  };
  warm_pool(ctx.db, 4);
  transaction a(ctx.db);
  auto first = a.claim(spec, 2);
  CHECK(ids(first) == std::vector<long long>{1, 2});  // in key order, 'done' rows left out
  transaction b(ctx.db);
  auto second = b.claim(spec, 10);
  CHECK(ids(second) == std::vector<long long>{4, 5, 6, 7});
  transaction c(ctx.db);
  CHECK(c.claim(spec, 10).empty());
  c.rollback();
  a.rollback();  // released: claimable again
  transaction d(ctx.db);
  CHECK(ids(d.claim(spec, 10)) == std::vector<long long>{1, 2});
  for (std::size_t bad : {std::size_t(0), std::size_t(100001)}) {
    try {
      d.claim(spec, bad);
      FAIL_CHECK("limit " << bad << " accepted");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
    }
  }
}

// lock_resource() on a transaction that has already begun: the row is created inside it;
// locking the same name again in the same transaction succeeds.
DBLOCK_TEST("lock_resource inside a begun transaction creates the row and is reentrant",
            "[rowlock]") {
  const std::string a = "inside-" + dblock::test::random_suffix(),
                    b = "inside-" + dblock::test::random_suffix();
  transaction t(ctx.db);
  t.session() << "SELECT 1";  // begins
  CHECK(t.lock_resource(a));
  CHECK(t.lock_resource(a));
  CHECK(t.lock_resource(b, lock_wait::nowait));
  t.commit();
  CHECK(lock_rows_for(ctx.db, a) == 1);
  CHECK(lock_rows_for(ctx.db, b) == 1);
  // Bad names are refused before anything is sent.
  transaction u(ctx.db);
  for (const std::string& bad : {std::string(), std::string(300, 'x')}) {
    try {
      u.lock_resource(bad);
      FAIL_CHECK("name of length " << bad.size() << " accepted");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
    }
  }
}

// The nowait and skip_locked modes of lock_resource() report "held" as false. On servers only:
// a second SQLite transaction cannot begin while the first is open.
DBLOCK_TEST_SERVERS("lock_resource: nowait and skip_locked return false while another holds",
                    "[rowlock]") {
  const std::string name = "held-" + dblock::test::random_suffix();
  const std::string log = ctx.table("log");
  table_cleanup drop{ctx, {log}};
  ctx.exec("CREATE TABLE " + log + " (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL)");
  warm_pool(ctx.db, 4);
  auto held = dblock::try_lock_resource(ctx.db, name);
  REQUIRE(held);
  int id = 0;
  for (auto mode : {lock_wait::nowait, lock_wait::skip_locked}) {
    INFO("mode " << (mode == lock_wait::nowait ? "nowait" : "skip_locked"));
    ++id;
    transaction t(ctx.db);
    t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (" << id << ", 0)";
    auto o = timed([&] { return t.lock_resource(name, mode); });
    INFO("lock_resource while held: " << describe(o));
    CHECK_FALSE(o.acquired);
    CHECK_FALSE(o.code);
    CHECK(o.ms < 50);
    // "false" is an answer, not a failure: the transaction stays usable, e.g. to take another
    // (free) resource or to run the caller's own statements, and its earlier writes commit.
    const std::string other = "free-" + dblock::test::random_suffix();
    auto o2 = timed([&] { return t.lock_resource(other, lock_wait::nowait); });
    INFO("then locking a free resource in the same transaction: " << describe(o2));
    CHECK(o2.acquired);
    auto o3 = timed([&] {
      int one = 0;
      t.session() << "SELECT 1", soci::into(one);
      return one == 1;
    });
    INFO("then SELECT 1 in the same transaction: " << describe(o3));
    CHECK(o3.acquired);
    auto o4 = timed([&] {
      t.commit();
      return true;
    });
    INFO("then commit: " << describe(o4));
    CHECK(o4.acquired);
    // commit() returned: the INSERT made before the refused lock must be there.
    CHECK((o4.acquired ? count_rows(ctx.db, log, "id = " + std::to_string(id)) : 1) == 1);
  }
  held->rollback();
  transaction t(ctx.db);
  t.session() << "SELECT 1";
  CHECK(t.lock_resource(name, lock_wait::nowait));
}

// A caller may catch lock_not_available from a NOWAIT lock and go on (lock something else, or
// just commit what it wrote). Then commit() must either make the earlier writes durable or
// throw; returning normally after a rollback would lose them silently. (PostgreSQL aborts the
// whole transaction on any error, and answers COMMIT of an aborted transaction with ROLLBACK.)
DBLOCK_TEST_SERVERS("commit after a caught nowait failure never loses writes silently",
                    "[rowlock]") {
  create_items(ctx, 10, 2);
  const std::string items = ctx.table("items"), log = ctx.table("log");
  table_cleanup drop{ctx, {log}};
  ctx.exec("CREATE TABLE " + log + " (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL)");
  warm_pool(ctx.db, 4);
  transaction holder(ctx.db);
  REQUIRE(holder.lock_rows(item(items, 1)).size() == 1);

  transaction t(ctx.db);
  t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (1, 0)";
  try {
    t.lock_rows(item(items, 1), lock_wait::nowait);
    FAIL_CHECK("nowait did not fail while the row is held");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::lock_not_available);
  }
  bool committed = false;
  std::string commit_error;
  try {
    t.commit();
    committed = true;
  } catch (const std::exception& e) {
    commit_error = e.what();
  }
  holder.rollback();
  long long rows = count_rows(ctx.db, log, "id = 1");
  INFO("commit " << (committed ? "returned normally" : "threw: " + commit_error) << "; row "
                 << (rows ? "present" : "absent"));
  CHECK(committed == (rows == 1));
}

// =================================================================================================
// 4. Keys without a unique index are refused
// =================================================================================================

DBLOCK_TEST("lock_rows refuses a key without a single-column unique index", "[rowlock]") {
  const std::string t = ctx.table("products");
  table_cleanup drop{ctx, {t}};
  ctx.exec("CREATE TABLE " + t +
           " (id INTEGER PRIMARY KEY, sku VARCHAR(32) NOT NULL, code VARCHAR(32) NOT NULL,"
           " ean VARCHAR(32) NOT NULL, region VARCHAR(8) NOT NULL, qty INTEGER NOT NULL)");
  ctx.exec("CREATE INDEX " + ctx.prefix + "products_code ON " + t + " (code)");
  ctx.exec("CREATE UNIQUE INDEX " + ctx.prefix + "products_ean ON " + t + " (ean)");
  ctx.exec("CREATE UNIQUE INDEX " + ctx.prefix + "products_region_sku ON " + t + " (region, sku)");
  ctx.exec("INSERT INTO " + t +
           " (id, sku, code, ean, region, qty) VALUES (1, 'A-1', 'C1', '4000000000001', 'eu', 5)");
  ctx.exec("INSERT INTO " + t +
           " (id, sku, code, ean, region, qty) VALUES (2, 'A-1', 'C1', '4000000000002', 'us', 6)");

  auto refused = [&](const std::string& column, const dblock::value& key) {
    transaction tx(ctx.db);
    try {
      tx.lock_rows(row_selector{t, column, key, {"qty"}});
      FAIL_CHECK("lock_rows by " << column << " was not refused");
    } catch (const dblock::error& e) {
      INFO("by " << column << ": " << e.what());
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("unique index") != std::string::npos);
    }
  };
  refused("sku", std::string("A-1"));    // no index at all
  refused("code", std::string("C1"));    // a non-unique index
  refused("region", std::string("eu"));  // first column of a two-column unique index
  refused("sku", std::string("A-1"));    // again: the refusal is not cached as a success

  {
    transaction tx(ctx.db);
    auto rows = tx.lock_rows(row_selector{t, "sku", std::string("A-1"), {"qty"}, true});
    CHECK(rows.size() == 2);
    auto rows2 = tx.lock_rows(row_selector{t, "code", std::string("C1"), {"qty", "ean"}, true});
    CHECK(rows2.size() == 2);
    tx.commit();
  }
  {
    transaction tx(ctx.db);
    auto by_ean = tx.lock_rows(row_selector{t, "ean", std::string("4000000000002"), {"qty"}});
    REQUIRE(by_ean.size() == 1);
    CHECK(as_int(by_ean[0].at("qty")) == 6);
    CHECK(as_text(by_ean[0].at("ean")) == "4000000000002");  // the key column is always there
    auto by_pk = tx.lock_rows(row_selector{t, "id", 1LL, {"qty", "sku"}});
    REQUIRE(by_pk.size() == 1);
    CHECK(as_int(by_pk[0].at("id")) == 1);
    CHECK(as_text(by_pk[0].at("sku")) == "A-1");
    CHECK(by_pk[0].size() == 3);
    tx.commit();
  }
  // Bad identifiers are rejected, never spliced.
  transaction tx(ctx.db);
  for (const auto& sel :
       {row_selector{t + "; DROP TABLE x", "id", 1LL, {}}, row_selector{t, "id = 1 OR 1", 1LL, {}},
        row_selector{t, "id", 1LL, {"qty, (SELECT 1)"}}}) {
    try {
      tx.lock_rows(sel);
      FAIL_CHECK("bad identifier accepted");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
    }
  }
  CHECK(count_rows(ctx.db, t) == 2);
}

// =================================================================================================
// 5. Deadlocks
// =================================================================================================

namespace {

void create_accounts(const dblock::test::context& ctx, const std::string& t) {
  ctx.exec("CREATE TABLE " + t + " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, v) VALUES (1, 0)");
  ctx.exec("INSERT INTO " + t + " (id, v) VALUES (2, 0)");
}

long long account(const dblock::database& db, const std::string& t, int id) {
  return query_ll(db, "SELECT v FROM " + t + " WHERE id = " + std::to_string(id));
}

row_selector acct(const std::string& t, long long id) {
  return row_selector{t, "id", id, {"v"}};
}

}  // namespace

// PostgreSQL detects the cycle after deadlock_timeout (1 s), InnoDB at once. SQLite cannot
// deadlock on rows: its second writer waits at BEGIN IMMEDIATE (shown by the SQLite test below).
DBLOCK_TEST_SERVERS("deadlock: without the runner one transaction gets errc::deadlock",
                    "[rowlock]") {
  const std::string t = ctx.table("acct");
  table_cleanup drop{ctx, {t}};
  create_accounts(ctx, t);
  warm_pool(ctx.db, 4);
  rendezvous both(2);
  struct result {
    bool committed = false;
    std::optional<errc> code;
    std::string message;
  };
  result r[2];
  auto run = [&](int k) {
    const long long first = k == 0 ? 1 : 2, second = k == 0 ? 2 : 1, delta = k == 0 ? 1 : 10;
    try {
      transaction tx(ctx.db);
      tx.lock_rows(acct(t, first));
      both.arrive_and_wait();
      tx.lock_rows(acct(t, second));
      tx.session() << "UPDATE " << t << " SET v = v + " << delta << " WHERE id IN (1, 2)";
      tx.commit();
      r[k].committed = true;
    } catch (const dblock::error& e) {
      r[k].code = e.kind();
      r[k].message = e.what();
    } catch (const std::exception& e) {
      r[k].message = std::string("non-dblock exception: ") + e.what();
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  INFO("tx 0: " << r[0].message << " / tx 1: " << r[1].message);
  CHECK(r[0].committed + r[1].committed == 1);
  int victim = r[0].committed ? 1 : 0;
  CHECK(r[victim].code == errc::deadlock);
  long long expected = r[0].committed ? 1 : 10;
  CHECK(account(ctx.db, t, 1) == expected);
  CHECK(account(ctx.db, t, 2) == expected);
}

DBLOCK_TEST_SERVERS("deadlock: run_transaction retries the victim, both apply exactly once",
                    "[rowlock]") {
  const std::string t = ctx.table("acct");
  table_cleanup drop{ctx, {t}};
  create_accounts(ctx, t);
  warm_pool(ctx.db, 4);
  rendezvous both(2);
  std::atomic<int> retries{0};
  std::atomic<int> deadlock_retries{0};
  dblock::retry_stats stats[2];
  std::string errors[2];
  auto run = [&](int k) {
    const long long first = k == 0 ? 1 : 2, second = k == 0 ? 2 : 1, delta = k == 0 ? 1 : 10;
    auto policy = dblock::transaction_retry_policy();
    policy.on_retry = [&](const dblock::retry_event& e) {
      ++retries;
      if (e.cause.code() == errc::deadlock) ++deadlock_retries;
    };
    int attempt = 0;
    try {
      dblock::run_transaction(
          ctx.db,
          [&](transaction& tx) {
            ++attempt;
            tx.lock_rows(acct(t, first));
            if (attempt == 1) both.arrive_and_wait();  // only the first attempts interleave
            tx.lock_rows(acct(t, second));
            tx.session() << "UPDATE " << t << " SET v = v + " << delta << " WHERE id IN (1, 2)";
          },
          policy, {}, &stats[k]);
    } catch (const std::exception& e) {
      errors[k] = e.what();
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  INFO("attempts " << stats[0].attempts << " + " << stats[1].attempts << ", retries "
                   << retries.load());
  CHECK(retries.load() >= 1);
  CHECK(deadlock_retries.load() >= 1);
  CHECK(stats[0].conflicts + stats[1].conflicts == retries.load());
  CHECK(stats[0].attempts + stats[1].attempts == 2 + retries.load());
  CHECK(account(ctx.db, t, 1) == 11);
  CHECK(account(ctx.db, t, 2) == 11);
}

// The body's own statements (t.session()) can deadlock too: the runner promises to retry the
// whole transaction on deadlock, whichever statement of the body hit it.
DBLOCK_TEST_SERVERS("deadlock in the body's own UPDATE (t.session()) is retried by the runner",
                    "[rowlock]") {
  const std::string t = ctx.table("acct");
  table_cleanup drop{ctx, {t}};
  create_accounts(ctx, t);
  warm_pool(ctx.db, 4);
  rendezvous both(2);
  std::atomic<int> retries{0};
  std::string errors[2];
  auto run = [&](int k) {
    const long long first = k == 0 ? 1 : 2, second = k == 0 ? 2 : 1, delta = k == 0 ? 1 : 10;
    auto policy = dblock::transaction_retry_policy();
    policy.on_retry = [&](const dblock::retry_event&) { ++retries; };
    int attempt = 0;
    try {
      dblock::run_transaction(
          ctx.db,
          [&](transaction& tx) {
            ++attempt;
            tx.session() << "UPDATE " << t << " SET v = v + " << delta << " WHERE id = " << first;
            if (attempt == 1) both.arrive_and_wait();
            tx.session() << "UPDATE " << t << " SET v = v + " << delta << " WHERE id = " << second;
          },
          policy);
    } catch (const dblock::error& e) {
      errors[k] = std::string("dblock::error ") + dblock::to_string(e.kind()) + ": " + e.what();
    } catch (const std::exception& e) {
      errors[k] = std::string("non-dblock exception escaped run_transaction: ") + e.what();
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(retries.load() >= 1);
  long long one = account(ctx.db, t, 1), two = account(ctx.db, t, 2);
  INFO("final values " << one << ", " << two);
  CHECK(one == 11);
  CHECK(two == 11);
}

// SQLite's honest equivalent: opposite lock orders cannot deadlock, because the second writer
// waits at BEGIN IMMEDIATE until the first commits; both apply exactly once.
DBLOCK_TEST_ONLY("sqlite", "sqlite: opposite lock orders serialise at BEGIN IMMEDIATE",
                 "[rowlock]") {
  const std::string t = ctx.table("acct");
  create_accounts(ctx, t);
  warm_pool(ctx.db, 4);
  std::atomic<long long> first_commit_sent_ns{0}, second_began_ns{0};
  std::atomic<bool> first_locked{false};
  std::string errors[2];
  std::thread a([&] {
    try {
      dblock::run_transaction(ctx.db, [&](transaction& tx) {
        tx.lock_rows(acct(t, 1));
        first_locked = true;
        std::this_thread::sleep_for(milliseconds(300));  // the other thread tries meanwhile
        tx.lock_rows(acct(t, 2));
        tx.session() << "UPDATE " << t << " SET v = v + 1 WHERE id IN (1, 2)";
        first_commit_sent_ns = monotonic_ns();
        tx.commit();
      });
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  while (!first_locked)
    std::this_thread::sleep_for(milliseconds(1));
  std::thread b([&] {
    try {
      dblock::run_transaction(ctx.db, [&](transaction& tx) {
        tx.lock_rows(acct(t, 2));
        second_began_ns = monotonic_ns();
        tx.lock_rows(acct(t, 1));
        tx.session() << "UPDATE " << t << " SET v = v + 10 WHERE id IN (1, 2)";
      });
    } catch (const std::exception& e) {
      errors[1] = e.what();
    }
  });
  a.join();
  b.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(second_began_ns.load() >= first_commit_sent_ns.load());
  CHECK(account(ctx.db, t, 1) == 11);
  CHECK(account(ctx.db, t, 2) == 11);
}

// =================================================================================================
// 6. Holder killed with SIGKILL
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
  int pid =
      ps.spawn("rowlock_holder_worker", {ctx.url, ctx.prefix, mode, target, dir.file("ready")});
  REQUIRE(wait_for_file(dir.file("ready"), std::chrono::seconds(15)));

  // While the holder lives, a try fails (bounded: a blocked try is left running; it may only
  // succeed after the kill).
  auto probe =
      std::async(std::launch::async, [f = try_mode(ctx.db, mode, target)] { return timed(f); });
  bool probe_in_time = probe.wait_for(std::chrono::seconds(1)) == std::future_status::ready;
  std::optional<outcome> before;
  if (probe_in_time) before = probe.get();
  CHECK(probe_in_time);
  if (before) {
    INFO("try while the holder lives: " << describe(*before));
    CHECK_FALSE(before->acquired);
    CHECK_FALSE(before->code);
    CHECK_FALSE(before->foreign_exception);
    CHECK(before->ms < 50);
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
  CHECK(takeover_ms < 3000);
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
// 7. A work queue with SKIP LOCKED
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

// =================================================================================================
// 8. The transaction runner
// =================================================================================================

namespace {

void create_log(const dblock::test::context& ctx, const std::string& t) {
  ctx.exec("CREATE TABLE " + t + " (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL)");
}

}  // namespace

DBLOCK_TEST("run_transaction: a non-retryable error rolls back and propagates unchanged",
            "[rowlock]") {
  const std::string log = ctx.table("log");
  table_cleanup drop{ctx, {log}};
  create_log(ctx, log);
  dblock::retry_stats stats;
  int calls = 0;
  try {
    dblock::run_transaction(
        ctx.db,
        [&](transaction& t) {
          ++calls;
          t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (1, 1)";
          throw std::runtime_error("boom");
        },
        dblock::transaction_retry_policy(), {}, &stats);
    FAIL_CHECK("no exception");
  } catch (const dblock::error& e) {
    FAIL_CHECK("std::runtime_error turned into dblock::error: " << e.what());
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "boom");
  }
  CHECK(calls == 1);
  CHECK(stats.attempts == 1);
  CHECK(count_rows(ctx.db, log) == 0);

  calls = 0;
  try {
    dblock::run_transaction(
        ctx.db,
        [&](transaction& t) {
          ++calls;
          t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (2, 1)";
          throw dblock::error(errc::not_found, "no such order");
        },
        dblock::transaction_retry_policy(), {}, &stats);
    FAIL_CHECK("no exception");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::not_found);
    CHECK(std::string(e.what()) == "no such order");
  }
  CHECK(calls == 1);
  CHECK(count_rows(ctx.db, log) == 0);

  // A body that commits itself is not committed again; one that rolls back leaves nothing.
  dblock::run_transaction(ctx.db, [&](transaction& t) {
    t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (3, 1)";
    t.commit();
  });
  dblock::run_transaction(ctx.db, [&](transaction& t) {
    t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (4, 1)";
    t.rollback();
  });
  CHECK(count_rows(ctx.db, log) == 1);
  CHECK(count_rows(ctx.db, log, "id = 3") == 1);

  // The returned value comes from the committed attempt.
  int v = dblock::run_transaction(ctx.db, [&](transaction& t) {
    int n = 0;
    t.session() << "SELECT count(*) FROM " << log, soci::into(n);
    return n + 41;
  });
  CHECK(v == 42);
}

DBLOCK_TEST("run_transaction: lock_not_available twice, then success, commits once", "[rowlock]") {
  const std::string log = ctx.table("log");
  table_cleanup drop{ctx, {log}};
  create_log(ctx, log);
  dblock::retry_stats stats;
  std::vector<int> seen_retries;
  auto policy = dblock::transaction_retry_policy();
  policy.on_retry = [&](const dblock::retry_event& e) {
    seen_retries.push_back(e.attempt);
    CHECK(e.cause.code() == errc::lock_not_available);
  };
  int attempt = 0;
  dblock::run_transaction(
      ctx.db,
      [&](transaction& t) {
        ++attempt;
        t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (1, " << attempt << ")";
        if (attempt <= 2) throw dblock::error(errc::lock_not_available, "simulated");
      },
      policy, {}, &stats);
  CHECK(attempt == 3);
  CHECK(stats.attempts == 3);
  CHECK(stats.conflicts == 2);
  CHECK(seen_retries == std::vector<int>{1, 2});
  CHECK(count_rows(ctx.db, log) == 1);
  CHECK(query_ll(ctx.db, "SELECT attempt FROM " + log + " WHERE id = 1") == 3);

  // Exhausted: the cause (deadlock) with the attempt count, nothing committed.
  auto p2 = dblock::transaction_retry_policy();
  p2.max_attempts = 2;
  int n = 0;
  try {
    dblock::run_transaction(
        ctx.db,
        [&](transaction& t) {
          ++n;
          t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (2, " << n << ")";
          throw dblock::error(errc::deadlock, "simulated");
        },
        p2);
    FAIL_CHECK("no exception");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::deadlock);
    CHECK(e.attempts() == 2);
  }
  CHECK(n == 2);
  CHECK(count_rows(ctx.db, log) == 1);
}

namespace {

// A runner transaction whose lock_rows times out on the first attempt (another transaction
// holds the row), after an INSERT in the same attempt. The holder is released in on_retry.
// `own_statement`: the statement that times out is the body's own UPDATE through t.session()
// instead of lock_rows.
void timeout_then_retry(dblock::test::context& ctx, bool own_statement) {
  create_items(ctx, 100);
  const std::string items = ctx.table("items"), log = ctx.table("log");
  table_cleanup drop{ctx, {log}};
  create_log(ctx, log);
  warm_pool(ctx.db, 4);
  std::optional<transaction> holder;
  holder.emplace(ctx.db);
  REQUIRE(holder->lock_rows(item(items)).size() == 1);

  transaction_options o;
  o.lock_timeout = milliseconds(1000);
  std::vector<std::string> causes;
  auto policy = dblock::transaction_retry_policy();
  policy.on_retry = [&](const dblock::retry_event& e) {
    causes.push_back(std::string(dblock::to_string(e.cause.kind())) + " native " +
                     std::to_string(e.cause.native_code()) + " sqlstate " + e.cause.sqlstate());
    if (holder) {
      holder->rollback();
      holder.reset();
    }
  };
  int attempt = 0;
  dblock::retry_stats stats;
  std::string escaped;
  long long t0 = monotonic_ns();
  try {
    dblock::run_transaction(
        ctx.db,
        [&](transaction& t) {
          ++attempt;
          t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (" << attempt << ", "
                      << attempt << ")";
          if (own_statement)
            t.session() << "UPDATE " << items << " SET stock = stock - 1 WHERE item_id = 1";
          else
            t.lock_rows(item(items));
          t.session() << "UPDATE " << items << " SET stock = 99 WHERE item_id = 1";
        },
        policy, o, &stats);
  } catch (const std::exception& e) {
    escaped = e.what();
  }
  double ms = ms_since(t0);
  if (holder) holder->rollback();
  INFO("retry causes: " << (causes.empty() ? std::string("none") : causes.front())
                        << "; escaped: " << escaped);
  metric(ctx.backend, std::string("runner with a ") +
                          (own_statement ? "timed-out own UPDATE" : "timed-out lock_rows") + ": " +
                          std::to_string(static_cast<long long>(ms)) + " ms, " +
                          std::to_string(stats.attempts) + " attempts");
  CHECK(escaped == "");
  CHECK(attempt == 2);
  CHECK(stats.attempts == 2);
  REQUIRE(causes.size() == 1);
  CHECK(causes[0].rfind("lock_not_available", 0) == 0);
  if (ctx.backend == "mysql") CHECK(causes[0].find("native 1205") != std::string::npos);
  // Nothing of the failed attempt remains (MySQL's 1205 rolled back only the statement).
  CHECK(count_rows(ctx.db, log) == 1);
  CHECK(count_rows(ctx.db, log, "attempt = 2") == 1);
  CHECK(read_stock(ctx.db, items) == 99);
}

}  // namespace

// Lock wait timeouts on rows are a server phenomenon; SQLite's wait is at BEGIN IMMEDIATE
// (the lock_resource timeout test covers it).
DBLOCK_TEST_SERVERS("run_transaction: a lock wait timeout (MySQL 1205) leaves no partial attempt",
                    "[rowlock]") {
  timeout_then_retry(ctx, false);
}

DBLOCK_TEST_SERVERS("run_transaction: a lock wait timeout in the body's own UPDATE is retried",
                    "[rowlock]") {
  timeout_then_retry(ctx, true);
}

// =================================================================================================
// 9. Transaction basics
// =================================================================================================

DBLOCK_TEST("transaction: destructor rolls back, commit publishes, ended means not_owner",
            "[rowlock]") {
  const std::string log = ctx.table("log");
  table_cleanup drop{ctx, {log}};
  create_log(ctx, log);
  {
    transaction t(ctx.db);
    CHECK(t.active());
    t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (1, 0)";
  }
  CHECK(count_rows(ctx.db, log) == 0);

  transaction t(ctx.db);
  t.session() << "INSERT INTO " << log << " (id, attempt) VALUES (2, 0)";
  CHECK(count_rows(ctx.db, log) == 0);  // not visible to others before commit
  t.commit();
  CHECK_FALSE(t.active());
  CHECK(count_rows(ctx.db, log, "id = 2") == 1);

  auto not_owner = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      FAIL_CHECK(what << ": no exception");
    } catch (const dblock::error& e) {
      INFO(what << ": " << e.what());
      CHECK(e.code() == errc::not_owner);
    }
  };
  not_owner([&] { t.commit(); }, "second commit");
  not_owner([&] { t.session(); }, "session() after commit");
  not_owner([&] { t.connection(); }, "connection() after commit");
  not_owner([&] { t.lock_rows(row_selector{log, "id", 2LL, {}}); }, "lock_rows after commit");
  not_owner([&] { t.lock_resource("after-commit"); }, "lock_resource after commit");
  t.rollback();  // a no-op now
  CHECK(count_rows(ctx.db, log, "id = 2") == 1);

  // Explicit rollback; then the same not_owner rules.
  transaction r(ctx.db);
  r.session() << "INSERT INTO " << log << " (id, attempt) VALUES (3, 0)";
  r.rollback();
  CHECK_FALSE(r.active());
  not_owner([&] { r.commit(); }, "commit after rollback");
  CHECK(count_rows(ctx.db, log, "id = 3") == 0);

  // A transaction never used commits without error.
  transaction unused(ctx.db);
  unused.commit();
  CHECK_FALSE(unused.active());

  // Move: the moved-from transaction is inactive; assigning over an open one rolls it back.
  // (m2 has not begun yet: on SQLite two write transactions cannot be open at once.)
  transaction m1(ctx.db);
  transaction m2(std::move(m1));
  CHECK_FALSE(m1.active());
  CHECK(m2.active());
  not_owner([&] { m1.commit(); }, "commit of a moved-from transaction");
  m1.rollback();  // a no-op
  transaction m3(ctx.db);
  m3.session() << "INSERT INTO " << log << " (id, attempt) VALUES (5, 0)";
  m3 = std::move(m2);  // m3's own insert (5) is rolled back; it now is m2's transaction
  m3.session() << "INSERT INTO " << log << " (id, attempt) VALUES (4, 0)";
  m3.commit();
  CHECK(count_rows(ctx.db, log, "id = 4") == 1);
  CHECK(count_rows(ctx.db, log, "id = 5") == 0);

  // The connection goes back to the pool when the transaction ends.
  auto o = ctx.options();
  o.pool_size = 1;
  o.pool_wait = milliseconds(2000);
  auto one = ctx.open(o);
  for (int i = 0; i < 3; ++i) {
    transaction x(one);
    x.session() << "SELECT 1";
    if (i == 1) x.commit();
  }
  CHECK(query_ll(one, "SELECT 1") == 1);
}

// args: url prefix. Calls members of a moved-from transaction; exit 0 when each throws
// not_owner (a crash shows as 128 + signal).
DBLOCK_WORKER(rowlock_moved_from_worker) {
  auto db = open_db(args.at(0), args.at(1), 2);
  transaction a(db);
  transaction b(std::move(a));
  int failures = 0;
  auto expect = [&](const std::function<void()>& f) {
    try {
      f();
      ++failures;
    } catch (const dblock::error& e) {
      if (e.code() != errc::not_owner) ++failures;
    }
  };
  expect([&] { a.commit(); });
  expect([&] { a.session(); });
  expect([&] { a.connection(); });
  expect([&] { a.lock_resource("x"); });
  expect([&] { a.lock_rows(row_selector{"t", "id", 1LL, {}}); });
  return failures;
}

DBLOCK_TEST("transaction: a moved-from transaction throws not_owner instead of crashing",
            "[rowlock][process]") {
  process_set ps;
  int pid = ps.spawn("rowlock_moved_from_worker", {ctx.url, ctx.prefix});
  int status = ps.wait(pid, std::chrono::seconds(30));
  INFO("worker exit status " << status
                             << " (128+11 = SIGSEGV; 1..5 = calls not throwing "
                                "not_owner)");
  CHECK(status == 0);
}

// The per-transaction lock timeout must not stay on the pooled connection afterwards, or the
// next user of that connection (a plain query, a lease lock, the next lock_resource) inherits it.
DBLOCK_TEST("transaction: its lock timeout does not leak into the pooled connection", "[rowlock]") {
  auto o = ctx.options();
  o.pool_size = 1;
  auto db = ctx.open(o);
  auto setting = [&] {
    auto c = db.connect();
    std::string v;
    long long n = -1;
    if (ctx.backend == "postgresql") {
      c.session() << "SHOW lock_timeout", soci::into(v);
      return v;
    }
    if (ctx.backend == "mysql")
      c.session() << "SELECT @@SESSION.innodb_lock_wait_timeout", soci::into(n);
    else
      c.session() << "PRAGMA busy_timeout", soci::into(n);
    return std::to_string(n);
  };
  const std::string before = setting();
  const std::string name = "leak-" + dblock::test::random_suffix();
  {
    auto t = dblock::try_lock_resource(db, name);
    REQUIRE(t);
    t->commit();
  }
  CHECK(setting() == before);
  {
    auto t = dblock::lock_resource(db, name, milliseconds(3000));
    t.rollback();
  }
  CHECK(setting() == before);
  {
    transaction_options to;
    to.lock_timeout = milliseconds(0);
    transaction t(db, to);
    t.session() << "SELECT 1";
  }
  INFO("session setting before: " << before
                                  << ", after a transaction with lock_timeout 0: " << setting());
  CHECK(setting() == before);

  // Consequence: lock_resource(3 s) on that connection while another handle holds the lock must
  // wait (about) 3 s, not give up at once.
  auto other = ctx.open();
  auto held = dblock::try_lock_resource(other, name);
  REQUIRE(held);
  auto out = run_bounded(
      [&] {
        auto t = dblock::lock_resource(db, name, milliseconds(3000));
        t.rollback();
        return true;
      },
      milliseconds(6000), [&] { held->rollback(); });
  INFO("lock_resource(3 s) on the reused connection: " << describe(out));
  metric(ctx.backend,
         "lock_resource(3000 ms) on a connection reused after lock_timeout 0: " + describe(out));
  CHECK(out.ms >= 2250);
  CHECK(out.code == errc::lock_not_available);
  if (held) held->rollback();
}

// #19: after its first run on a connection, a lock_rows() or versioned_update() read runs as a
// statement prepared once per connection (no SOCI re-parse), decoded to the types SOCI gave it
// the first time: integers past 2^53, doubles, text and NULL come back identical on every run.
DBLOCK_TEST("lock_rows and versioned_update read the same typed values through the cache",
            "[rowlock][optimistic]") {
  const std::string t = ctx.table("typed");
  table_cleanup drop{ctx, {t}};
  ctx.exec("CREATE TABLE " + t +
           " (id BIGINT NOT NULL PRIMARY KEY, i BIGINT, d DOUBLE PRECISION, s VARCHAR(64),"
           " n BIGINT, version BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, i, d, s, n, version) VALUES" +
           " (1, 9007199254740993, 0.1, 'text', NULL, 0)");
  auto one = ctx.options();
  one.pool_size = 1;  // every run on the same connection
  auto db = ctx.open(one);
  for (int run = 0; run < 4; ++run) {
    INFO("run " << run);
    dblock::run_transaction(db, [&](transaction& tx) {
      auto rows = tx.lock_rows(row_selector{t, "id", 1LL, {"i", "d", "s", "n"}});
      REQUIRE(rows.size() == 1);
      auto& r = rows[0];
      CHECK(std::get<long long>(r.at("id")) == 1);
      CHECK(std::get<long long>(r.at("i")) == 9007199254740993LL);
      CHECK(std::get<double>(r.at("d")) == 0.1);
      CHECK(std::get<std::string>(r.at("s")) == "text");
      CHECK(std::holds_alternative<std::monostate>(r.at("n")));
      CHECK(tx.lock_rows(row_selector{t, "id", 2LL, {"i"}}).empty());  // no row: no record
    });
    dblock::versioned_table spec{t, "id", "version", {"i", "d", "s", "n"}};
    auto w = dblock::versioned_update(db, spec, 1LL, [&](dblock::record& v) {
      CHECK(std::get<long long>(v.at("i")) == 9007199254740993LL);
      CHECK(std::get<double>(v.at("d")) == 0.1);
      CHECK(std::get<std::string>(v.at("s")) == "text");
      CHECK(std::holds_alternative<std::monostate>(v.at("n")));
      v["i"] = std::get<long long>(v.at("i")) + 1;
    });
    CHECK(w.version == run + 1);
    // Back to the first value for the next run (written outside the cache).
    ctx.exec("UPDATE " + t + " SET i = i - 1 WHERE id = 1");
  }
  if (ctx.backend == "postgresql" && ctx.url.find("pooler=transaction") == std::string::npos) {
    // The reads were prepared on the connection (its named statements).
    auto c = db.connect();
    long long prepared = 0;
    const std::string pattern = "%" + t + "%";
    c.session() << "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE :p",
        soci::use(pattern), soci::into(prepared);
    CHECK(prepared >= 2);
  }
}
