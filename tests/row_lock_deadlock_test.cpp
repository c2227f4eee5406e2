// Deadlocks between row-lock transactions: the error without the runner, run_transaction retrying
// the victim (also for the body's own statements), and SQLite's serialisation at BEGIN IMMEDIATE.
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
// Deadlocks
// =================================================================================================

namespace {

// The table <prefix>acct with accounts 1 and 2 (v = 0), which two transactions lock in opposite
// orders, dropped after the test; the pool is warmed so that neither side waits to connect.
struct accounts {
  const std::string t;
  table_cleanup drop;
  explicit accounts(const dblock::test::context& ctx) : t(ctx.table("acct")), drop{ctx, {t}} {
    ctx.exec("CREATE TABLE " + t + " (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)");
    ctx.exec("INSERT INTO " + t + " (id, v) VALUES (1, 0)");
    ctx.exec("INSERT INTO " + t + " (id, v) VALUES (2, 0)");
    warm_pool(ctx.db, 4);
  }
};

// Runs run(0) and run(1) on two threads at once and waits for both.
void on_two_threads(const std::function<void(int)>& run) {
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
}

long long account(const dblock::database& db, const std::string& t, int id) {
  return query_ll(db, "SELECT v FROM " + t + " WHERE id = " + std::to_string(id));
}

row_selector acct(const std::string& t, long long id) {
  return row_selector{t, "id", id, {"v"}};
}

// How two transactions take accounts 1 and 2: row locks (then one UPDATE of both), or an UPDATE
// of each.
enum class take_by { lock_rows, update };

// What run_opposite_orders() came to: each side's escaped error ("" for none), the retries (those
// for errc::deadlock apart) and each side's retry_stats.
struct retried_pair {
  std::string errors[2];
  std::atomic<int> retries{0};
  std::atomic<int> deadlock_retries{0};
  dblock::retry_stats stats[2];
};

// Runs two transactions under run_transaction() on two threads at once, adding 1 and 10 to
// accounts 1 and 2 of `t`: the first takes 1 then 2, the second 2 then 1, and on their first
// attempts only both have taken their first account before either goes on (a deadlock).
void run_opposite_orders(const dblock::test::context& ctx, const std::string& t, take_by how,
                         retried_pair& out) {
  rendezvous both(2);
  auto run = [&](int k) {
    const long long first = k == 0 ? 1 : 2, second = k == 0 ? 2 : 1, delta = k == 0 ? 1 : 10;
    auto policy = dblock::transaction_retry_policy();
    policy.on_retry = [&](const dblock::retry_event& e) {
      ++out.retries;
      if (e.cause.code() == errc::deadlock) ++out.deadlock_retries;
    };
    auto take = [&](transaction& tx, long long id) {
      if (how == take_by::lock_rows)
        tx.lock_rows(acct(t, id));
      else
        tx.session() << "UPDATE " << t << " SET v = v + " << delta << " WHERE id = " << id;
    };
    int attempt = 0;
    try {
      dblock::run_transaction(
          ctx.db,
          [&](transaction& tx) {
            ++attempt;
            take(tx, first);
            if (attempt == 1) both.arrive_and_wait();  // only the first attempts interleave
            take(tx, second);
            if (how == take_by::lock_rows)
              tx.session() << "UPDATE " << t << " SET v = v + " << delta << " WHERE id IN (1, 2)";
          },
          policy, {}, &out.stats[k]);
    } catch (const dblock::error& e) {
      out.errors[k] = std::string("dblock::error ") + dblock::to_string(e.kind()) + ": " + e.what();
    } catch (const std::exception& e) {
      out.errors[k] = std::string("non-dblock exception escaped run_transaction: ") + e.what();
    }
  };
  on_two_threads(run);
}

// Runs the two transactions (run_opposite_orders()) on a fresh accounts table and checks that
// neither failed, that the runner retried, and that both applied exactly once (1 + 10 on each
// account); `r` is what happened.
void check_both_apply_once(const dblock::test::context& ctx, take_by how, retried_pair& r) {
  const accounts acc(ctx);
  run_opposite_orders(ctx, acc.t, how, r);
  CHECK(r.errors[0] == "");
  CHECK(r.errors[1] == "");
  CHECK(r.retries.load() >= 1);
  long long one = account(ctx.db, acc.t, 1), two = account(ctx.db, acc.t, 2);
  INFO("final values " << one << ", " << two);
  CHECK(one == 11);
  CHECK(two == 11);
}

}  // namespace

// PostgreSQL detects the cycle after deadlock_timeout (1 s), InnoDB at once. SQLite cannot
// deadlock on rows: its second writer waits at BEGIN IMMEDIATE (shown by the SQLite test below).
DBLOCK_TEST_SERVERS("deadlock: without the runner one transaction gets errc::deadlock",
                    "[rowlock]") {
  const accounts acc(ctx);
  const std::string& t = acc.t;
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
  on_two_threads(run);
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
  retried_pair r;
  check_both_apply_once(ctx, take_by::lock_rows, r);
  INFO("attempts " << r.stats[0].attempts << " + " << r.stats[1].attempts << ", retries "
                   << r.retries.load());
  CHECK(r.deadlock_retries.load() >= 1);
  CHECK(r.stats[0].conflicts + r.stats[1].conflicts == r.retries.load());
  CHECK(r.stats[0].attempts + r.stats[1].attempts == 2 + r.retries.load());
}

// The body's own statements (t.session()) can deadlock too: the runner promises to retry the
// whole transaction on deadlock, whichever statement of the body hit it.
DBLOCK_TEST_SERVERS("deadlock in the body's own UPDATE (t.session()) is retried by the runner",
                    "[rowlock]") {
  retried_pair r;
  check_both_apply_once(ctx, take_by::update, r);
}

// SQLite's honest equivalent: opposite lock orders cannot deadlock, because the second writer
// waits at BEGIN IMMEDIATE until the first commits; both apply exactly once.
DBLOCK_TEST_ONLY("sqlite", "sqlite: opposite lock orders serialise at BEGIN IMMEDIATE",
                 "[rowlock]") {
  const accounts acc(ctx);
  const std::string& t = acc.t;
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
