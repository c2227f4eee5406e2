// Segmented stock (include/dblock/segmented_stock.hpp) on every backend: exact totals, stock that
// never strands in dry segments, takes inside the caller's transaction (committed or rolled back
// with it, concurrent ones without deadlocks, waiting for stock another transaction holds), bad
// input, and exactness under 16 processes (with a negative control: the same workload as an
// unconditional decrement oversells).
#include <soci/soci.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

using dblock::errc;
using dblock::segmented_stock;
using namespace dblock::test;  // code_of: nothing when the call returns (a check on its code fails)

namespace {

std::string fresh(const std::string& stem) {
  return stem + "-" + dblock::test::random_suffix();
}

long long sum(const std::vector<std::int64_t>& v) {
  long long s = 0;
  for (auto x : v)
    s += x;
  return s;
}

}  // namespace

DBLOCK_TEST("segmented stock: created evenly, takes and puts keep the total exact", "[stock]") {
  segmented_stock stock(ctx.db, fresh("item"));
  stock.create(100, 7);
  const auto segs = stock.segments();
  REQUIRE(segs.size() == 7);
  for (auto a : segs)
    CHECK((a == 14 || a == 15));
  CHECK(sum(segs) == 100);
  CHECK(stock.total() == 100);
  CHECK(stock.take());
  CHECK(stock.take(5));
  CHECK(stock.total() == 94);
  stock.put(3);
  CHECK(stock.total() == 97);
  CHECK(sum(stock.segments()) == 97);
  // Another handle (its own segment count cache) sees the same stock.
  CHECK(segmented_stock(ctx.open(), stock.name()).total() == 97);
  CHECK(stock.drop());
  CHECK_FALSE(stock.drop());
  CHECK(code_of([&] { (void)stock.total(); }) == errc::not_found);
}

DBLOCK_TEST("segmented stock: no stock strands in dry segments", "[stock]") {
  segmented_stock stock(ctx.db, fresh("strand"));
  stock.create(10, 4);  // 3, 3, 2, 2
  for (int i = 0; i < 10; ++i) {
    INFO("take " << i);
    CHECK(stock.take());
  }
  CHECK_FALSE(stock.take());
  CHECK(stock.total() == 0);
  // Every segment holds 1: a take of 3 needs the rebalance, and gets it.
  segmented_stock spread(ctx.db, fresh("spread"));
  spread.create(5, 5);
  CHECK(spread.take(3));
  CHECK(spread.total() == 2);
  CHECK(sum(spread.segments()) == 2);
  CHECK(spread.take(2));
  CHECK_FALSE(spread.take(1));
  CHECK(spread.total() == 0);
  // More than is left: nothing changes.
  segmented_stock few(ctx.db, fresh("few"));
  few.create(4, 2);
  CHECK_FALSE(few.take(5));
  CHECK(few.total() == 4);
  // Returned stock can be taken again.
  few.put(2);
  CHECK(few.take(6));
  CHECK(few.total() == 0);
}

DBLOCK_TEST("segmented stock: a take inside the caller's transaction commits or rolls back with it",
            "[stock]") {
  segmented_stock stock(ctx.db, fresh("tx"));
  stock.create(3, 2);
  const std::string orders = ctx.table("orders");
  ctx.exec("CREATE TABLE " + orders + " (id INTEGER NOT NULL PRIMARY KEY)");
  {
    dblock::transaction tx(ctx.db);
    CHECK(stock.take(tx.connection(), 1));
    tx.session() << "INSERT INTO " + orders + " (id) VALUES (1)";
    tx.rollback();
  }
  CHECK(stock.total() == 3);
  {
    dblock::transaction tx(ctx.db);
    CHECK(stock.take(tx.connection(), 2));
    tx.session() << "INSERT INTO " + orders + " (id) VALUES (2)";
    tx.commit();
  }
  CHECK(stock.total() == 1);
  long long rows = -1;
  ctx.db.connect().session() << "SELECT count(*) FROM " + orders, soci::into(rows);
  CHECK(rows == 1);
  {
    // A rebalance inside the transaction (each segment may hold less than 1 + 0): then a put.
    dblock::transaction tx(ctx.db);
    CHECK(stock.take(tx.connection(), 1));
    CHECK_FALSE(stock.take(tx.connection(), 1));
    stock.put(tx.connection(), 4);
    tx.commit();
  }
  CHECK(stock.total() == 4);
  // Without a transaction each write commits by itself.
  auto c = ctx.db.connect();
  CHECK(stock.take(c, 4));
  CHECK(stock.total() == 0);
}

namespace {

struct orders_outcome {
  int taken = 0, refused = 0, deadlocks = 0, other_errors = 0, unfinished = 0;
  long long order_rows = -1, total = -1, segment_sum = -1;
  double seconds = 0;
  std::string error;
};

// The flash-sale shape (examples/flash_sale): 8 threads x 25 orders, each order one transaction
// of its own that takes 1 and inserts its order row, from a stock of 100 in 16 segments, so that
// the sale runs dry half-way. A failed order is retried as a whole (what run_transaction() would
// do, up to 10 times) and each failure counted.
orders_outcome concurrent_orders(dblock::test::context& ctx, dblock::database_options o) {
  segmented_stock stock(ctx.db, fresh("orders"));
  stock.create(100, 16);
  const std::string orders = ctx.table("orders_" + dblock::test::random_suffix(4));
  ctx.exec("CREATE TABLE " + orders + " (id INTEGER NOT NULL PRIMARY KEY)");
  const int threads = 8, per_thread = 25;
  o.pool_size = threads + 2;
  auto db = ctx.open(o);
  db.ping();
  std::vector<orders_outcome> out(threads);
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      auto& me = out[static_cast<std::size_t>(t)];
      segmented_stock mine(db, stock.name());
      for (int i = 0; i < per_thread; ++i) {
        bool done = false;
        for (int attempt = 0; attempt < 10 && !done; ++attempt) {
          try {
            dblock::transaction tx(db);
            const bool took = mine.take(tx.connection(), 1);
            if (took)
              tx.session() << "INSERT INTO " + orders + " (id) VALUES (" +
                                  std::to_string(t * 1000 + i) + ")";
            tx.commit();
            ++(took ? me.taken : me.refused);
            done = true;
          } catch (const dblock::error& e) {
            ++(e.code() == errc::deadlock ? me.deadlocks : me.other_errors);
            me.error = e.what();
          }
        }
        if (!done) ++me.unfinished;
      }
    });
  for (auto& t : ts)
    t.join();
  orders_outcome all;
  all.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& me : out) {
    all.taken += me.taken;
    all.refused += me.refused;
    all.deadlocks += me.deadlocks;
    all.other_errors += me.other_errors;
    all.unfinished += me.unfinished;
    if (!me.error.empty()) all.error = me.error;
  }
  ctx.db.connect().session() << "SELECT count(*) FROM " + orders, soci::into(all.order_rows);
  all.total = stock.total();
  all.segment_sum = sum(stock.segments());
  ctx.exec("DROP TABLE " + orders);
  return all;
}

}  // namespace

// Exactness: the orders are the stock sold, the total ends at 0, never below. No deadlock: before
// a take waited only for segments that still hold stock, a take that waited for a segment and
// found it emptied kept its lock, then waited for the next segment or rebalanced (locking every
// row) while holding it. Measured with the code before the change (this test, 6 runs):
// PostgreSQL 3 to 15 deadlocks per 200 orders (each after its 1 s deadlock_timeout), MariaDB 549
// to 590 at its default REPEATABLE READ (35 to 41 orders still failing after 10 tries) and 160 to
// 291 at READ COMMITTED. After it: PostgreSQL 0 in 30 runs; MariaDB 0 to 4 (see below).
DBLOCK_TEST("segmented stock: takes in concurrent transactions never deadlock", "[stock]") {
  struct level {
    dblock::isolation_level iso;
    const char* name;
  };
  for (const auto l : {level{dblock::isolation_level::server_default, "server default"},
                       level{dblock::isolation_level::read_committed, "read committed"}}) {
    auto o = ctx.options();
    o.isolation = l.iso;
    const orders_outcome r = concurrent_orders(ctx, o);
    INFO(ctx.backend << " at " << l.name << ": " << r.taken << " taken, " << r.refused
                     << " refused, " << r.deadlocks << " deadlocks, " << r.other_errors
                     << " other errors (" << r.error << "), " << r.unfinished << " unfinished, in "
                     << r.seconds << " s");
    if (ctx.backend == "mysql") {
      // InnoDB locks a row it reads through the primary key whatever the rest of the WHERE says,
      // and waits for it first, at every isolation level. A take whose plain read is a moment
      // old can still wait for a segment that another take holds emptied, and two of those
      // deadlock: 0-4 per run here (against hundreds before), reported at once as
      // errc::deadlock (retry the transaction).
      CHECK(r.deadlocks <= 10);
      if (r.deadlocks > 0)
        WARN(ctx.backend << " at " << l.name << ": " << r.deadlocks << " deadlocks");
    } else {
      CHECK(r.deadlocks == 0);
    }
    CHECK(r.other_errors == 0);
    CHECK(r.unfinished == 0);
    CHECK(r.taken == 100);
    CHECK(r.refused == 200 - 100);
    CHECK(r.order_rows == 100);
    CHECK(r.total == 0);
    CHECK(r.segment_sum == 0);
  }
}

// A take that finds the only stock locked by another transaction waits for it rather than
// answering "not enough": SKIP LOCKED alone would answer no here. Once the holder commits the
// answer is no; once it rolls back, the waiting take gets the unit.
DBLOCK_TEST("segmented stock: a take waits for stock another transaction holds", "[stock]") {
  for (const bool holder_commits : {true, false}) {
    INFO("the holder " << (holder_commits ? "commits" : "rolls back"));
    segmented_stock stock(ctx.db, fresh("held"));
    stock.create(1, 4);  // one segment holds the only unit
    auto o = ctx.options();
    o.pool_size = 4;
    auto db = ctx.open(o);
    db.ping();
    dblock::transaction holder(db);
    REQUIRE(stock.take(holder.connection(), 1));
    std::atomic<bool> started{false};
    std::optional<bool> took;
    long long waited_ms = -1;
    std::chrono::steady_clock::time_point answered{}, released{};
    std::string error;
    std::thread taker([&] {
      try {
        started = true;
        const auto t0 = std::chrono::steady_clock::now();
        dblock::transaction tx(db);
        took = segmented_stock(db, stock.name()).take(tx.connection(), 1);
        answered = std::chrono::steady_clock::now();
        tx.commit();
        waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    while (!started.load())
      std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    released = std::chrono::steady_clock::now();
    if (holder_commits)
      holder.commit();
    else
      holder.rollback();
    taker.join();
    INFO("error: " << error << "; waited " << waited_ms << " ms");
    REQUIRE(error.empty());
    REQUIRE(took.has_value());
    CHECK(*took == !holder_commits);
    // It waited for the holder, not answered at once: its answer came after the holder's end
    // began (an order, which holds at any speed; a time from a clock read in the taker could be
    // short when the taker's thread was descheduled before reading it).
    CHECK(answered >= released);
    CHECK(stock.total() == 0);
    CHECK(stock.drop());
  }
}

DBLOCK_TEST("segmented stock: bad input gets clear errors", "[stock]") {
  CHECK(code_of([&] { segmented_stock(ctx.db, ""); }) == errc::invalid_argument);
  CHECK(code_of([&] { segmented_stock(ctx.db, std::string(256, 'x')); }) == errc::invalid_argument);
  CHECK(code_of([&] { segmented_stock(ctx.db, std::string("a\0b", 3)); }) ==
        errc::invalid_argument);
  segmented_stock stock(ctx.db, fresh("bad"));
  CHECK(code_of([&] { stock.create(-1, 4); }) == errc::invalid_argument);
  CHECK(code_of([&] { stock.create(10, 0); }) == errc::invalid_argument);
  CHECK(code_of([&] { stock.create(10, 1025); }) == errc::invalid_argument);
  CHECK(code_of([&] { (void)stock.take(); }) == errc::not_found);
  CHECK(code_of([&] { stock.put(); }) == errc::not_found);
  stock.create(10, 4);
  CHECK(code_of([&] { stock.create(10, 4); }) == errc::unique_violation);
  CHECK(code_of([&] { (void)stock.take(0); }) == errc::invalid_argument);
  CHECK(code_of([&] { stock.put(-2); }) == errc::invalid_argument);
  CHECK(stock.total() == 10);
  std::string missing;
  CHECK(code_of([&] {
          try {
            (void)segmented_stock(ctx.db, fresh("missing")).take();
          } catch (const dblock::error& e) {
            missing = e.what();
            throw;
          }
        }) == errc::not_found);
  INFO(missing);
  CHECK(missing.find("create it first") != std::string::npos);
  // A hostile name is a name like any other.
  segmented_stock hostile(ctx.db, "'; DROP TABLE x; -- \xe2\x9c\x93");
  hostile.create(2, 2);
  CHECK(hostile.take(2));
  CHECK(hostile.total() == 0);
  hostile.drop();
}

DBLOCK_TEST("segmented stock: threads taking and putting keep the total exact", "[stock]") {
  segmented_stock stock(ctx.db, fresh("threads"));
  stock.create(200, 16);
  std::atomic<long long> taken{0}, put{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t)
    ts.emplace_back([&, t] {
      segmented_stock mine(ctx.db, stock.name());
      for (int i = 0; i < 80; ++i) {
        if (t % 3 == 0 && i % 4 == 0) {
          mine.put(1);
          ++put;
        } else if (mine.take(1)) {
          ++taken;
        }
      }
    });
  for (auto& t : ts)
    t.join();
  CHECK(stock.total() == 200 - taken.load() + put.load());
  CHECK(sum(stock.segments()) == stock.total());
  CHECK(taken.load() > 0);
}

// args: url prefix stock takes out_file mode(take|blind) ready_file go_file
// take: segmented_stock::take(1). blind (the negative control): read a plain counter row, and if
// it is positive decrement it unconditionally: the check-then-act that oversells.
DBLOCK_WORKER(stock_worker) {
  auto db = dblock::test::open_db(args.at(0), args.at(1), 2);
  const int takes = std::stoi(args.at(3));
  const bool blind = args.at(5) == "blind";
  segmented_stock stock(db, args.at(2));
  const std::string naive = args.at(1) + "naive";
  db.ping();  // connected before the common start
  // All start together: each says it is ready, then waits for the parent's go.
  dblock::test::write_file_atomic(args.at(6), "ready");
  if (!dblock::test::wait_for_file(args.at(7), std::chrono::seconds(120))) return 3;
  long long sold = 0;
  for (int i = 0; i < takes; ++i) {
    if (!blind) {
      sold += stock.take(1) ? 1 : 0;
      continue;
    }
    auto c = db.connect();
    long long n = 0;
    c.session() << "SELECT n FROM " + naive + " WHERE id = 1", soci::into(n);
    if (n <= 0) continue;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // "check the cart"
    c.session() << "UPDATE " + naive + " SET n = n - 1 WHERE id = 1";
    ++sold;
  }
  dblock::test::write_file_atomic(args.at(4), std::to_string(sold));
  return 0;
}

DBLOCK_TEST("segmented stock: 16 processes sell exactly the stock, never more",
            "[stock][process]") {
  const int procs = 16;
  auto run = [&](const std::string& mode, int stock_size, int takes) {
    segmented_stock stock(ctx.db, fresh("sale-" + mode));
    stock.create(stock_size, 16);
    dblock::test::temp_dir dir("stock");
    dblock::test::process_set ps;
    const std::string go = dir.file("go");
    for (int i = 0; i < procs; ++i)
      ps.spawn("stock_worker", {ctx.url, ctx.prefix, stock.name(), std::to_string(takes),
                                dir.file("sold" + std::to_string(i)), mode,
                                dir.file("ready" + std::to_string(i)), go});
    for (int i = 0; i < procs; ++i)
      REQUIRE(dblock::test::wait_for_file(dir.file("ready" + std::to_string(i)),
                                          std::chrono::seconds(120)));
    dblock::test::write_file_atomic(go, "go");  // all at once
    for (int st : ps.wait_all(std::chrono::minutes(5)))
      REQUIRE(st == 0);
    long long sold = 0;
    for (int i = 0; i < procs; ++i)
      sold += std::stoll(dblock::test::read_file(dir.file("sold" + std::to_string(i))));
    return std::make_pair(sold, stock.total());
  };
  // 1,000 units, 16 x 90 = 1,440 tries (16 x 200 in a full run).
  const auto [sold, left] = run("take", 1000, full_run() ? 200 : 90);
  CHECK(sold == 1000);
  CHECK(left == 0);
  // Negative control: the same processes on a plain counter of 8 with check-then-act, all
  // starting at once, sell more than there is.
  const std::string naive = ctx.table("naive");
  ctx.exec("CREATE TABLE " + naive + " (id INTEGER NOT NULL PRIMARY KEY, n BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + naive + " (id, n) VALUES (1, 8)");
  const auto [oversold, ignored] = run("blind", 8, 2);
  (void)ignored;
  long long n = 0;
  ctx.db.connect().session() << "SELECT n FROM " + naive + " WHERE id = 1", soci::into(n);
  INFO("check-then-act sold " << oversold << " of 8; the counter ended at " << n);
  CHECK(oversold > 8);
  CHECK(n < 0);
}
