// The reaper: batched deletion of long-expired lease rows, safe beside live leases and other
// reapers, with fences that stay monotonic after deletion.
#include <soci/soci.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"

using namespace dblock::test;

namespace {

// Inserts `n` rows named "<stem><i>" whose lease ends `offset_us` from now (database clock).
void insert_rows(const dblock::database& db, const std::string& stem, int n, long long offset_us) {
  const auto& d = dblock::test::dialect_of(db);
  const auto& t = dblock::test::tables_of(db);
  auto c = db.connect();
  auto& sql = c.session();
  const int chunk = 250;
  for (int base = 0; base < n; base += chunk) {
    std::string q = "INSERT INTO " + t.lock +
                    " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
                    " holder_host, holder_pid, holder_thread) VALUES ";
    for (int i = base; i < std::min(n, base + chunk); ++i) {
      if (i > base) q += ", ";
      // Names are generated here (digits), so splicing them is safe in this test.
      q += "('" + stem + std::to_string(i) + "', '00000000000000000000000000000000', " +
           std::to_string(i + 1) + ", 1, " + d.sql.now() + ", " +
           d.sql.plus_us(d.sql.now(), "off") + ", 'test', 1, 't')";
    }
    sql << d.sql.begin_write();
    sql << q, soci::use(offset_us, "off");
    sql << "COMMIT";
  }
}

long long count_where(const dblock::database& db, const std::string& where) {
  auto c = db.connect();
  long long n = -1;
  c.session() << "SELECT count(*) FROM " << db.lock_table() << " WHERE " << where, soci::into(n);
  return n;
}

dblock::reaper_options quick(milliseconds retention) {
  dblock::reaper_options o;
  o.retention = retention;
  o.floor_grace = milliseconds(0);
  return o;
}

const long long hour_us = 3600LL * 1000000;

}  // namespace

DBLOCK_TEST("20,000 expired rows go, 1,000 live rows stay", "[reaper]") {
  insert_rows(ctx.db, "old-", 20000, -2 * hour_us);
  insert_rows(ctx.db, "live-", 1000, hour_us);
  auto o = quick(std::chrono::hours(1));
  std::uint64_t seen_batches = 0;
  o.on_batch = [&](const dblock::reap_result& r) { seen_batches = r.batches; };
  auto r = dblock::reap_once(ctx.db, o);
  CHECK(r.rows_reaped == 20000);
  CHECK(r.complete);
  CHECK(r.batches >= 20);  // batch_size 1000
  CHECK(seen_batches == r.batches);
  CHECK(count_where(ctx.db, "resource_name LIKE 'old-%'") == 0);
  CHECK(count_where(ctx.db, "resource_name LIKE 'live-%'") == 1000);
  // Rows that expired less than the retention ago also stay.
  insert_rows(ctx.db, "recent-", 10, -60LL * 1000000);
  CHECK(dblock::reap_once(ctx.db, o).rows_reaped == 0);
  CHECK(count_where(ctx.db, "resource_name LIKE 'recent-%'") == 10);
  INFO("reaped 20000 rows in " << r.elapsed.count() / 1000 << " ms");
}

// Reaps once after a shared start instant; writes its count to the file in args[2].
DBLOCK_TEST_SERVERS(
    "expired rows between live ones, a few locked meanwhile: one run reaps them all", "[reaper]") {
  // Names of both kinds interleave in key order (the order of PostgreSQL's walk), batches are
  // small, and another transaction holds three expired rows for the first 400 ms of the run:
  // the batches skip them, and the run comes back for them once they are free.
  for (int i = 0; i < 60; ++i)
    insert_rows(ctx.db, "k" + std::to_string(i) + (i % 3 ? "-old-" : "-live-"), 5,
                i % 3 ? -2 * hour_us : hour_us);
  REQUIRE(count_where(ctx.db, "resource_name LIKE '%-old-%'") == 40 * 5);
  std::atomic<int> locked{-1};  // rows the other transaction holds, once it holds them
  std::thread holder([&] {
    dblock::transaction t(ctx.db);
    int n = 0;
    for (const char* name : {"k1-old-0", "k31-old-4", "k59-old-2"})
      n += static_cast<int>(
          t.lock_rows({ctx.db.lock_table(), "resource_name", std::string(name), {}}).size());
    locked = n;
    std::this_thread::sleep_for(milliseconds(400));
    t.commit();
  });
  while (locked < 0)
    std::this_thread::sleep_for(milliseconds(1));
  CHECK(locked == 3);
  auto o = quick(std::chrono::hours(1));
  o.batch_size = 7;
  auto r = dblock::reap_once(ctx.db, o);
  holder.join();
  CHECK(r.complete);
  CHECK(r.rows_reaped == 200);
  CHECK(r.batches >= 200 / 7);
  CHECK(count_where(ctx.db, "resource_name LIKE '%-old-%'") == 0);
  CHECK(count_where(ctx.db, "resource_name LIKE '%-live-%'") == 20 * 5);
}

DBLOCK_TEST_ONLY("postgresql", "lease writes are HOT updates: the lock table has no expiry index",
                 "[reaper]") {
  // Migration 0010. Acquire, renew and release of one name rewrite its row in place; with an
  // index on expires_at (the negative control) none of them can. One pooled connection, so that
  // the server session that wrote is the one told to publish its statistics.
  auto db = dblock::test::open_db(ctx.url, ctx.prefix, 1);
  using counts = std::pair<long long, long long>;  // updates, HOT updates of the lock table
  // A server session publishes its statistics when it goes idle, at most once a second (or
  // 10 s later); behind PgBouncer the writer's server session is not necessarily ours.
  auto read_counts = [&](long long at_least) {
    counts c{0, 0};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    do {
      auto conn = db.connect();
      auto& sql = conn.session();
      sql << "SELECT pg_stat_force_next_flush()";
      sql << "SELECT 1";
      sql << "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = :t",
          soci::use(db.lock_table()), soci::into(c.first), soci::into(c.second);
      if (c.first >= at_least) break;
      std::this_thread::sleep_for(milliseconds(200));
    } while (std::chrono::steady_clock::now() < give_up);
    return c;
  };
  counts seen{0, 0};
  auto hot_share = [&](int cycles) {
    dblock::lease_lock lk(db, "hot-name");
    const counts before = read_counts(seen.first);
    for (int i = 0; i < cycles; ++i) {
      auto g = lk.try_acquire();
      REQUIRE(g);
      g->renew();
      g->release();
    }
    const counts after = read_counts(before.first + 3 * cycles - 1);  // the first may insert
    seen = after;
    const long long upd = after.first - before.first, hot = after.second - before.second;
    INFO("updates " << upd << ", HOT " << hot);
    CHECK(upd >= 3 * cycles - 1);
    return upd > 0 ? static_cast<double>(hot) / static_cast<double>(upd) : 0.0;
  };
  CHECK(hot_share(200) > 0.9);
  {
    auto c = db.connect();
    c.session() << "CREATE INDEX " + ctx.prefix + "test_expires_idx ON " + db.lock_table() +
                       " (expires_at)";
  }
  CHECK(hot_share(200) < 0.1);
  auto c = db.connect();
  c.session() << "DROP INDEX " + ctx.prefix + "test_expires_idx";
}

DBLOCK_WORKER(reaper_worker) {
  dblock::database db(args.at(0), dblock::test::with_prefix(args.at(1)));
  db.ping();
  long long start = std::stoll(args.at(3));
  while (dblock::test::monotonic_ns() < start)
    std::this_thread::sleep_for(milliseconds(1));
  dblock::reaper_options o;
  o.retention = std::chrono::hours(1);
  o.floor_grace = milliseconds(0);
  o.batch_size = 200;
  auto r = dblock::reap_once(db, o);
  std::ofstream(args.at(2)) << r.rows_reaped << "\n";
  return 0;
}

DBLOCK_TEST("4 reapers in 4 processes: no errors, counts add up exactly", "[reaper][process]") {
  const int expired = full_run() ? 20000 : 8000;
  insert_rows(ctx.db, "old-", expired, -2 * hour_us);
  insert_rows(ctx.db, "live-", 500, hour_us);
  // Raise the floor first, as a previous reaper run would have.
  dblock::reap_once(ctx.db, [] {
    auto o = quick(std::chrono::hours(1));
    o.batch_size = 1;
    o.time_budget = milliseconds(1);  // only the floor, (almost) no deleting
    return o;
  }());
  const long long left_before = count_where(ctx.db, "resource_name LIKE 'old-%'");
  std::string dir =
      std::getenv("DBLOCK_TEST_SQLITE_DIR") ? std::getenv("DBLOCK_TEST_SQLITE_DIR") : "/tmp";
  long long start = dblock::test::monotonic_ns() + 1500LL * 1000000;
  std::vector<int> pids;
  std::vector<std::string> files;
  for (int i = 0; i < 4; ++i) {
    files.push_back(dir + "/reaper-" + ctx.prefix + std::to_string(i) + ".txt");
    pids.push_back(dblock::test::spawn_worker(
        "reaper_worker", {ctx.url, ctx.prefix, files.back(), std::to_string(start)}));
  }
  long long total = 0;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    CHECK(dblock::test::wait_worker(pids[i]) == 0);
    long long n = -1;
    std::ifstream(files[i]) >> n;
    ::unlink(files[i].c_str());
    total += n;
  }
  CHECK(total == left_before);
  CHECK(count_where(ctx.db, "resource_name LIKE 'old-%'") == 0);
  CHECK(count_where(ctx.db, "resource_name LIKE 'live-%'") == 500);
}

DBLOCK_TEST("a reaper racing acquirers and renewers never removes a live lease", "[reaper]") {
  dblock::reaper_options o = quick(milliseconds(0));  // reap anything expired at all
  o.interval = milliseconds(20);
  std::atomic<int> reaper_errors{0};
  o.on_error = [&](const dblock::error&) { ++reaper_errors; };
  auto db = ctx.open();
  dblock::reaper reaper(db, o);
  std::atomic<int> lost{0}, renewals{0}, cycles{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      dblock::database_options opts = ctx.options();
      opts.pool_size = 2;
      dblock::database mine(ctx.url, opts);
      dblock::lease_options lo;
      lo.ttl = milliseconds(2000);
      int round = 0;
      while (!stop) {
        // Alternate short-lived names (released at once, reapable) with a held, renewed one.
        dblock::lease_lock held(mine, "race/held/" + std::to_string(i), lo);
        auto g = held.acquire(std::chrono::seconds(10));
        for (int k = 0; k < 5; ++k) {
          dblock::lease_lock churn(
              mine, "race/churn/" + std::to_string(i) + "/" + std::to_string(round++ % 20), lo);
          if (auto c = churn.try_acquire()) ++cycles;
          // Leave the database some room: SQLite has one writer and an unfair busy handler, and
          // a saturated file would starve the reaper thread this test is about.
          std::this_thread::sleep_for(milliseconds(3));
          const auto deadline = std::chrono::steady_clock::now() + g.remaining();
          try {
            g.renew();
            ++renewals;
          } catch (const dblock::error& e) {
            // Failing before the local deadline means the row was live for the whole call
            // (the database's expiry is later still), so someone removed or took it.
            if (std::chrono::steady_clock::now() < deadline) {
              UNSCOPED_INFO("renew of a live lease failed: " << e.what());
              ++lost;
            }
            break;
          }
        }
        try {
          g.release();
        } catch (const dblock::error&) {
          // Expired under contention (SQLite's single writer can keep us waiting); the
          // renewals above are the check.
        }
      }
    });
  }
  // Three seconds of it, and then on until the workload has done enough to mean something (a
  // loaded machine does less in three seconds): the amounts below are progress, not speed.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < cap &&
         (renewals <= 100 || cycles <= 100 || reaper.metrics().rows_reaped == 0))
    std::this_thread::sleep_for(milliseconds(100));
  stop = true;
  for (auto& t : threads)
    t.join();
  reaper.stop();
  CHECK(lost == 0);
  CHECK(renewals > 100);
  CHECK(cycles > 100);
  CHECK(reaper_errors == 0);
  auto m = reaper.metrics();
  INFO("runs " << m.runs << " failed " << m.failed_runs << " batches " << m.batches << " last "
               << m.last_error.value_or("-"));
  CHECK(m.rows_reaped > 0);  // it really was deleting meanwhile
}

DBLOCK_TEST("churn with a reaper: fences per name keep growing, rows stay bounded", "[reaper]") {
  const int names = full_run() ? 5000 : 500;
  const int threads_n = 8;
  const int per_thread = full_run() ? 50000 / threads_n : 4000 / threads_n;
  dblock::reaper_options o = quick(milliseconds(0));
  o.interval = milliseconds(10);
  auto db = ctx.open();
  dblock::reaper reaper(db, o);
  std::mutex mu;
  std::map<std::string, std::int64_t> last_fence;
  std::atomic<int> regressions{0}, done{0};
  std::atomic<long long> max_rows{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&, t] {
      dblock::database_options opts = ctx.options();
      opts.pool_size = 2;
      dblock::database mine(ctx.url, opts);
      std::mt19937 rng(t);
      for (int i = 0; i < per_thread; ++i) {
        // Each thread owns the names congruent to t, so fences per name are seen in order.
        int k = static_cast<int>(rng() % (names / threads_n)) * threads_n + t;
        std::string name = "churn/" + std::to_string(k);
        dblock::lease_lock lock(mine, name);
        auto g = lock.try_acquire();
        if (!g) continue;
        {
          std::lock_guard<std::mutex> lk(mu);
          auto& last = last_fence[name];
          if (g->fence() <= last) ++regressions;
          last = g->fence();
        }
        g->release();
        ++done;
        // Give the reaper thread a chance on SQLite's single writer (see the test above).
        if (i % 8 == 0) std::this_thread::sleep_for(milliseconds(1));
      }
    });
  }
  std::thread sampler([&] {
    while (done < threads_n * per_thread * 9 / 10) {
      max_rows = std::max<long long>(max_rows, count_where(ctx.db, "1 = 1"));
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  for (auto& t : threads)
    t.join();
  sampler.join();
  reaper.stop();
  CHECK(regressions == 0);
  CHECK(done == threads_n * per_thread);
  CHECK(max_rows <= names);
  auto m = reaper.metrics();
  INFO("runs " << m.runs << " failed " << m.failed_runs << " batches " << m.batches << " last "
               << m.last_error.value_or("-") << " rows now " << count_where(ctx.db, "1 = 1"));
  CHECK(m.rows_reaped > 0);
}

DBLOCK_TEST("acquire, release, reap, acquire: the fence is strictly greater", "[reaper]") {
  const std::string name = "t16/" + dblock::test::random_suffix();
  std::int64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    dblock::lease_lock lock(ctx.db, name);
    auto g = lock.try_acquire();
    REQUIRE(g);
    CHECK(g->fence() > last);
    last = g->fence();
    g->release();
    auto r = dblock::reap_once(ctx.db, quick(milliseconds(0)));
    CHECK(r.rows_reaped >= 1);
    CHECK(count_where(ctx.db, "1 = 1") == 0);  // the row is really gone
  }
}

DBLOCK_TEST("the background reaper stops promptly and reports errors, then retries", "[reaper]") {
  // An unmigrated prefix: every run fails with schema_missing.
  auto broken = ctx.open(dblock::test::with_prefix(ctx.new_prefix()));
  std::atomic<int> errors{0};
  dblock::reaper_options o;
  o.interval = milliseconds(30);
  o.on_error = [&](const dblock::error& e) {
    if (e.code() == errc::schema_missing) ++errors;
  };
  {
    dblock::reaper r(broken, o);
    // Every 30 ms a run fails; three of them within a generous bound (how many fit in a fixed
    // time is the machine's pace, not the reaper's).
    const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((r.metrics().failed_runs < 3 || errors < 3) && std::chrono::steady_clock::now() < cap)
      std::this_thread::sleep_for(milliseconds(10));
    auto m = r.metrics();
    CHECK(m.failed_runs >= 3);
    CHECK(m.runs == m.failed_runs);
    REQUIRE(m.last_error);
    CHECK(m.last_error->find("dblock migrate") != std::string::npos);
  }
  CHECK(errors >= 3);
  // A long interval does not delay the destructor.
  o.interval = std::chrono::hours(1);
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  auto t0 = std::chrono::steady_clock::now();
  { dblock::reaper idle(ctx.db, o); }
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO("started and stopped in " << std::chrono::duration_cast<milliseconds>(took).count()
                                 << " ms; bound " << bound << " ms");
  CHECK(took < milliseconds(bound));
  dblock::reaper_options bad;
  bad.batch_size = 0;
  CHECK_THROWS_AS(dblock::reaper(ctx.db, bad), dblock::error);
}
