// Row locks with NOWAIT and SKIP LOCKED on business rows and on lock-table rows (lock_rows, claim,
// lock_resource), SQLite's whole-database equivalent, and a commit after a caught NOWAIT failure.
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
// NOWAIT and SKIP LOCKED on business rows
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
  CHECK(lat[lat.size() / 2] < no_wait_bound_ms(ctx.db));

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
    CHECK(o.ms < no_wait_bound_ms(ctx.db));
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
  CHECK(o.ms < no_wait_bound_ms(ctx.db));

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
    CHECK(o.ms < no_wait_bound_ms(ctx.db));
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
