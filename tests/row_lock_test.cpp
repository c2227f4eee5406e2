// Row locks (include/dblock/row_lock.hpp) on PostgreSQL, MariaDB and SQLite: the rows of the lock
// table (try_lock_resource, lock_resource with a timeout, first use by many threads) and keys
// lock_rows refuses. NOWAIT and SKIP LOCKED are in row_lock_nowait_test.cpp, deadlocks in
// row_lock_deadlock_test.cpp, worker processes in row_lock_process_test.cpp, the transaction and
// its runner in row_lock_transaction_test.cpp.
//
// Every test checks invariants that do not depend on timing. Where a bound on time is part of the
// promise it is measured and printed as a "[rowlock-metric]" line on stderr.
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
// Lock-table rows: try_lock_resource, lock_resource with a timeout, first use
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
  CHECK(median < no_wait_bound_ms(ctx.db));

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
  CHECK(o.ms <= scaled_bound_ms(ctx.db, 2500));
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
// Keys without a unique index are refused
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
