// The transaction runner (run_transaction: retries of lock_not_available and lock wait timeouts,
// non-retryable errors) and dblock::transaction itself (rollback, commit, moved-from objects, its
// lock timeout, typed values).
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
// The transaction runner
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
// Transaction basics
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
