// Segmented stock (include/dblock/segmented_stock.hpp) on every backend: exact totals, stock that
// never strands in dry segments, takes inside the caller's transaction, bad input, and exactness
// under 16 processes (with a negative control: the same workload as an unconditional decrement
// oversells).
#include <soci/soci.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

using dblock::errc;
using dblock::segmented_stock;
using dblock::test::full_run;

namespace {

std::string fresh(const std::string& stem) {
  return stem + "-" + dblock::test::random_suffix();
}

errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dblock::error& e) {
    return e.code();
  }
  FAIL("no dblock::error thrown");
  return errc::backend_error;
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
  try {
    (void)segmented_stock(ctx.db, fresh("missing")).take();
  } catch (const dblock::error& e) {
    CHECK(std::string(e.what()).find("create it first") != std::string::npos);
  }
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
