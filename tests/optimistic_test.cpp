// Optimistic updates and compare-and-set (docs/safety.md C1, T13): the retry policy on its own,
// exact version sequences under contention from threads and from processes, every isolation level,
// bounded retries that leave no trace, CAS that never oversells, matched-rows semantics, use
// inside the caller's transaction (including a stale REPEATABLE READ snapshot), and errors.
//
// Catch2 assertions are not thread-safe: worker threads only record what they saw, and the
// test thread asserts afterwards.
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"

using dblock::retry_policy;
using namespace dblock::test;

namespace {

// <prefix><stem> (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)
// with the row (1, 0, 0).
std::string create_acct(const dblock::test::context& ctx, table_cleanup& cleanup,
                        const std::string& stem = "acct") {
  std::string t = cleanup.add(ctx.table(stem));
  ctx.exec("CREATE TABLE " + t +
           " (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, balance, version) VALUES (1, 0, 0)");
  return t;
}

// <prefix><stem> (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL CHECK (stock >= 0)) with the
// row (1, stock). The CHECK makes the database itself refuse a negative stock.
std::string create_stock(const dblock::test::context& ctx, table_cleanup& cleanup, int stock,
                         const std::string& stem = "stock") {
  std::string t = cleanup.add(ctx.table(stem));
  ctx.exec("CREATE TABLE " + t +
           " (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL CHECK (stock >= 0))");
  ctx.exec("INSERT INTO " + t + " (id, stock) VALUES (1, " + std::to_string(stock) + ")");
  return t;
}

dblock::versioned_table acct_spec(const std::string& table) {
  dblock::versioned_table s;
  s.table = table;
  s.key_column = "id";
  s.version_column = "version";
  s.columns = {"balance"};
  return s;
}

dblock::cas_update buy_one(const std::string& table) {
  return {table, "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}};
}

void increment(dblock::record& r) {
  r["balance"] = std::get<long long>(r.at("balance")) + 1;
}

struct acct_state {
  long long balance = -1;
  long long version = -1;
};

acct_state read_acct(const dblock::database& db, const std::string& table) {
  auto c = db.connect();
  acct_state s;
  c.session() << "SELECT balance, version FROM " << table << " WHERE id = 1", soci::into(s.balance),
      soci::into(s.version);
  return s;
}

long long read_stock(const dblock::database& db, const std::string& table) {
  auto c = db.connect();
  long long n = -1;
  c.session() << "SELECT stock FROM " << table << " WHERE id = 1", soci::into(n);
  return n;
}

std::vector<long long> one_to(long long n) {
  std::vector<long long> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 1LL);
  return v;
}

// Starts `n` threads running body(i) at the same moment and joins them.
template <class F>
void run_threads(int n, F body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      ++ready;
      while (!go.load())
        std::this_thread::yield();
      body(i);
    });
  while (ready.load() < n)
    std::this_thread::yield();
  go = true;
  for (auto& t : ts)
    t.join();
}

// Per-thread outcome of the exactness workload.
struct exact_outcome {
  std::vector<long long> versions;
  int mismatched_values = 0;  // results whose written balance differs from their version
  long long attempts = 0;
  std::string error;
};

// T13/C1: `threads` x `per_thread` increments under until_success(); every version from 1 to
// the total is returned exactly once and the row ends at exactly the total.
void thread_exactness(dblock::test::context& ctx, dblock::database_options o,
                      const std::string& stem, int threads, int per_thread) {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup, stem);
  o.pool_size = static_cast<std::size_t>(threads) + 2;
  auto db = ctx.open(o);
  db.ping();
  const auto spec = acct_spec(table);
  std::vector<exact_outcome> out(static_cast<std::size_t>(threads));
  run_threads(threads, [&](int t) {
    auto& me = out[static_cast<std::size_t>(t)];
    try {
      for (int i = 0; i < per_thread; ++i) {
        auto r = dblock::versioned_update(db, spec, 1LL, increment, retry_policy::until_success());
        me.versions.push_back(r.version);
        me.attempts += r.stats.attempts;
        auto it = r.values.find("balance");
        if (it == r.values.end() || it->second != dblock::value(r.version)) ++me.mismatched_values;
      }
    } catch (const std::exception& e) {
      me.error = e.what();
    }
  });
  std::vector<long long> all;
  long long attempts = 0;
  for (const auto& me : out) {
    INFO("thread error: " << me.error);
    CHECK(me.error.empty());
    CHECK(me.mismatched_values == 0);
    // One thread's own versions strictly increase (a later call starts after an earlier ended).
    CHECK(std::is_sorted(me.versions.begin(), me.versions.end()));
    all.insert(all.end(), me.versions.begin(), me.versions.end());
    attempts += me.attempts;
  }
  const long long total = static_cast<long long>(threads) * per_thread;
  std::sort(all.begin(), all.end());
  CHECK(static_cast<long long>(all.size()) == total);
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no version twice
  CHECK(all == one_to(total));                                     // none lost
  auto s = read_acct(ctx.db, table);
  CHECK(s.balance == total);
  CHECK(s.version == total);
  CHECK(attempts >= total);
  UNSCOPED_INFO(ctx.backend << " " << stem << ": " << total << " updates in " << attempts
                            << " attempts");
}

// ---- worker processes ------------------------------------------------------------------------

std::string temp_path(const std::string& what) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/dblock-opt-" + what + "-" +
         dblock::test::random_suffix(10) + ".txt";
}

struct file_cleanup {
  std::vector<std::string> paths;
  ~file_cleanup() {
    for (const auto& p : paths)
      std::remove(p.c_str());
  }
};

dblock::database worker_db(const std::string& url, const std::string& prefix) {
  auto db = dblock::test::open_db(url, prefix, 1);
  db.ping();
  return db;
}

}  // namespace

// args: url prefix table count out_path start_ns. Writes "version balance" per successful call;
// exit status 0 when all calls succeeded and the file was written.
DBLOCK_WORKER(optimistic_increment_worker) {
  auto db = worker_db(args.at(0), args.at(1));
  const auto spec = acct_spec(args.at(2));
  const int count = std::stoi(args.at(3));
  std::ofstream out(args.at(4), std::ios::trunc);
  sleep_until_monotonic(std::stoll(args.at(5)));
  for (int i = 0; i < count; ++i) {
    auto r = dblock::versioned_update(db, spec, 1LL, increment, retry_policy::until_success());
    out << r.version << ' ' << std::get<long long>(r.values.at("balance")) << '\n';
  }
  out.flush();
  return out ? 0 : 4;
}

// args: url prefix table buyers start_ns. Exit status 10 + units bought, 5 when a call
// reported more than one matched row.
DBLOCK_WORKER(optimistic_buyer_worker) {
  auto db = worker_db(args.at(0), args.at(1));
  const auto update = buy_one(args.at(2));
  const int buyers = std::stoi(args.at(3));
  sleep_until_monotonic(std::stoll(args.at(4)));
  int sold = 0;
  for (int i = 0; i < buyers; ++i) {
    auto n = dblock::compare_and_set(db, update, retry_policy::until_success());
    if (n > 1) return 5;
    sold += static_cast<int>(n);
  }
  return 10 + sold;
}

// ---- 1. the retry policy alone -----------------------------------------------------------------

namespace {

retry_policy fast_policy(int max_attempts) {
  return retry_of(max_attempts, milliseconds(0), milliseconds(0), milliseconds(0));
}

}  // namespace

TEST_CASE("retry: max_attempts is honoured exactly", "[unit][retry][optimistic]") {
  for (int max : {1, 2, 5, 17}) {
    int calls = 0;
    try {
      dblock::retry(fast_policy(max), [&] {
        ++calls;
        throw dblock::error(errc::version_conflict, "conflict");
      });
      FAIL("retry returned although every attempt failed");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::version_conflict);
      CHECK(e.attempts() == max);
    }
    CHECK(calls == max);
  }
}

TEST_CASE("retry: success after failures returns the value and stops",
          "[unit][retry][optimistic]") {
  int calls = 0;
  dblock::retry_stats stats;
  auto p = fast_policy(10);
  std::string v = dblock::retry(
      p,
      [&]() -> std::string {
        ++calls;
        if (calls < 4) throw dblock::error(errc::deadlock, "victim");
        return "done";
      },
      &stats);
  CHECK(v == "done");
  CHECK(calls == 4);
  CHECK(stats.attempts == 4);
  CHECK(stats.conflicts == 3);
}

TEST_CASE("retry: the time budget stops the loop early", "[unit][retry][optimistic]") {
  retry_policy p = retry_of(1000000, milliseconds(60), milliseconds(1), milliseconds(4));
  int calls = 0;
  long long longest_ms = 0;  // the longest attempt (5 ms asked; more on a busy machine)
  const long long t0 = dblock::test::monotonic_ns();
  try {
    dblock::retry(p, [&] {
      ++calls;
      const long long a0 = dblock::test::monotonic_ns();
      std::this_thread::sleep_for(milliseconds(5));
      longest_ms = std::max(longest_ms, (dblock::test::monotonic_ns() - a0) / ns_per_ms + 1);
      throw dblock::error(errc::serialization_failure, "40001");
    });
    FAIL("retry returned although every attempt failed");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::serialization_failure);  // the cause is kept
    CHECK(e.attempts() == calls);
    CHECK(std::string(e.what()).find("time_budget") != std::string::npos);
    CHECK(std::string(e.what()).find("40001") != std::string::npos);  // the last cause
    // No attempt starts after the budget: the loop ran at most budget + its longest attempt
    // (+ slack).
    INFO("longest attempt " << longest_ms << " ms");
    CHECK(e.elapsed() >= milliseconds(5));
    CHECK(e.elapsed() < milliseconds(60 + longest_ms + 500));
  }
  const long long wall_ms = (dblock::test::monotonic_ns() - t0) / ns_per_ms;
  CHECK(calls >= 1);
  CHECK(calls <= 12);  // at least 5 ms per attempt within a 60 ms budget
  CHECK(wall_ms < 60 + longest_ms + 1000);
}

TEST_CASE("retry: a non-retryable error propagates at once, unchanged",
          "[unit][retry][optimistic]") {
  for (errc code : {errc::unique_violation, errc::not_found, errc::invalid_argument, errc::in_doubt,
                    errc::timeout, errc::connection_lost}) {
    int calls = 0;
    int retries = 0;
    dblock::retry_stats stats;
    auto p = fast_policy(10);
    p.on_retry = [&](const dblock::retry_event&) { ++retries; };
    try {
      dblock::retry(
          p,
          [&] {
            ++calls;
            throw dblock::error(code, "original message", "postgresql", "23505", 77);
          },
          &stats);
      FAIL("retry swallowed the error");
    } catch (const dblock::error& e) {
      CHECK(e.code() == code);
      CHECK(std::string(e.what()) == "original message");
      CHECK(e.backend() == "postgresql");
      CHECK(e.sqlstate() == "23505");
      CHECK(e.native_code() == 77);
      CHECK(e.attempts() == 0);  // not a give-up of the retry loop
    }
    CHECK(calls == 1);
    CHECK(retries == 0);
    CHECK(stats.attempts == 1);
    CHECK(stats.conflicts == 0);
  }
  // Exceptions that are not dblock errors pass through as well.
  int calls = 0;
  CHECK_THROWS_AS(dblock::retry(fast_policy(10),
                                [&] {
                                  ++calls;
                                  throw std::logic_error("not ours");
                                }),
                  std::logic_error);
  CHECK(calls == 1);
  // A code removed from `retryable` is not retried.
  auto p = fast_policy(10);
  p.retryable = {errc::deadlock};
  calls = 0;
  CHECK(code_of([&] {
          dblock::retry(p, [&] {
            ++calls;
            throw dblock::error(errc::version_conflict, "x");
          });
        }) == errc::version_conflict);
  CHECK(calls == 1);
}

TEST_CASE("retry: on_retry sees attempts 1..n-1", "[unit][retry][optimistic]") {
  retry_policy p = retry_of(6, milliseconds(0), milliseconds(1), milliseconds(3));
  std::vector<int> seen;
  std::vector<errc> causes;
  std::vector<std::chrono::microseconds> elapsed;
  bool backoff_ok = true;
  p.on_retry = [&](const dblock::retry_event& ev) {
    seen.push_back(ev.attempt);
    causes.push_back(ev.cause.kind());
    elapsed.push_back(ev.elapsed);
    if (ev.backoff < std::chrono::microseconds(0) || ev.backoff > milliseconds(3))
      backoff_ok = false;
  };
  int calls = 0;
  CHECK(code_of([&] {
          dblock::retry(p, [&] {
            ++calls;
            throw dblock::error(calls % 2 ? errc::deadlock : errc::lock_not_available, "x");
          });
        }) == errc::lock_not_available);  // the last cause is kept
  CHECK(calls == 6);
  CHECK(seen == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(causes == std::vector<errc>{errc::deadlock, errc::lock_not_available, errc::deadlock,
                                    errc::lock_not_available, errc::deadlock});
  CHECK(std::is_sorted(elapsed.begin(), elapsed.end()));
  CHECK(backoff_ok);
}

TEST_CASE("retry: an exhausted loop throws version_conflict with attempts and elapsed",
          "[unit][retry][optimistic]") {
  retry_policy p;
  p.max_attempts = 3;
  p.time_budget = milliseconds(0);
  dblock::retry_stats stats;
  try {
    dblock::retry(
        p,
        [&] {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
          throw dblock::error(errc::deadlock, "deadlock detected", "mysql", "40001", 1213);
        },
        &stats);
    FAIL("retry returned although every attempt failed");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::deadlock);  // the cause is kept
    CHECK(e.attempts() == 3);
    CHECK(e.elapsed() >= std::chrono::microseconds(900));
    CHECK(e.elapsed() > std::chrono::microseconds(0));
    CHECK(std::string(e.what()).find("deadlock detected") != std::string::npos);
    CHECK(std::string(e.what()).find("max_attempts") != std::string::npos);
    CHECK(e.advice() == dblock::retry_advice::retry_transaction);
  }
  CHECK(stats.attempts == 3);
  CHECK(stats.conflicts == 3);
  CHECK(stats.elapsed >= std::chrono::microseconds(900));
}

TEST_CASE("retry: retry_stats are filled on success, give-up and non-retryable errors",
          "[unit][retry][optimistic]") {
  dblock::retry_stats stats;
  stats.attempts = 99;  // stale values are overwritten
  stats.conflicts = 99;
  dblock::retry(
      fast_policy(5), [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); }, &stats);
  CHECK(stats.attempts == 1);
  CHECK(stats.conflicts == 0);
  CHECK(stats.elapsed >= std::chrono::microseconds(200));

  int calls = 0;
  dblock::retry(
      fast_policy(5),
      [&] {
        if (++calls <= 2) throw dblock::error(errc::serialization_failure, "x");
      },
      &stats);
  CHECK(stats.attempts == 3);
  CHECK(stats.conflicts == 2);

  (void)code_of([&] {
    dblock::retry(
        fast_policy(4), [] { throw dblock::error(errc::version_conflict, "x"); }, &stats);
  });
  CHECK(stats.attempts == 4);
  CHECK(stats.conflicts == 4);

  (void)code_of([&] {
    dblock::retry(
        fast_policy(4), [] { throw dblock::error(errc::unique_violation, "x"); }, &stats);
  });
  CHECK(stats.attempts == 1);
  CHECK(stats.conflicts == 0);
}

TEST_CASE("retry: max_attempts below 1 is invalid_argument and nothing runs",
          "[unit][retry][optimistic]") {
  for (int max : {0, -1, -1000}) {
    int calls = 0;
    retry_policy p;
    p.max_attempts = max;
    CHECK(code_of([&] { dblock::retry(p, [&] { ++calls; }); }) == errc::invalid_argument);
    CHECK(calls == 0);
  }
}

TEST_CASE("retry: backoff never exceeds max_backoff", "[unit][retry][optimistic]") {
  retry_policy p = retry_of(12, milliseconds(0), milliseconds(4), milliseconds(5));
  std::vector<std::chrono::microseconds> backoffs;
  p.on_retry = [&](const dblock::retry_event& ev) { backoffs.push_back(ev.backoff); };
  const long long t0 = dblock::test::monotonic_ns();
  CHECK(code_of([&] {
          dblock::retry(p, [] { throw dblock::error(errc::version_conflict, "x"); });
        }) == errc::version_conflict);
  const long long wall_ms = (dblock::test::monotonic_ns() - t0) / ns_per_ms;
  REQUIRE(backoffs.size() == 11);
  std::chrono::microseconds sum{0};
  for (std::size_t i = 0; i < backoffs.size(); ++i) {
    INFO("retry " << i + 1 << " backoff " << backoffs[i].count() << " us");
    CHECK(backoffs[i] >= std::chrono::microseconds(0));
    CHECK(backoffs[i] <= milliseconds(5));  // max_backoff
    CHECK(backoffs[i] <=
          milliseconds(4) * (1LL << std::min<std::size_t>(i, 20)));  // 4 ms * 2^(n-1)
    sum += backoffs[i];
  }
  CHECK(sum <= milliseconds(55));
  // Loose upper bound on the real sleeping: 11 x 5 ms at most, plus scheduling slack. Without
  // the cap the expected sleep would be seconds.
  CHECK(wall_ms < 55 + 1000);

  // Zero backoff: never sleeps.
  auto z = fast_policy(50);
  bool all_zero = true;
  z.on_retry = [&](const dblock::retry_event& ev) {
    all_zero = all_zero && ev.backoff.count() == 0;
  };
  (void)code_of([&] { dblock::retry(z, [] { throw dblock::error(errc::deadlock, "x"); }); });
  CHECK(all_zero);
}

TEST_CASE("retry: the named policies", "[unit][retry][optimistic]") {
  auto u = retry_policy::until_success();
  CHECK(u.max_attempts == 0x7fffffff);
  CHECK(u.time_budget.count() == 0);
  CHECK(retry_policy::once().max_attempts == 1);
  retry_policy d;
  for (errc c : {errc::version_conflict, errc::serialization_failure, errc::deadlock,
                 errc::lock_not_available})
    CHECK(d.is_retryable(c));
  for (errc c : {errc::in_doubt, errc::unique_violation, errc::not_found, errc::invalid_argument,
                 errc::timeout, errc::connection_lost, errc::backend_error})
    CHECK_FALSE(d.is_retryable(c));
  int calls = 0;
  CHECK(code_of([&] {
          dblock::retry(retry_policy::once(), [&] {
            ++calls;
            throw dblock::error(errc::deadlock, "x");
          });
        }) == errc::deadlock);  // the cause is kept
  CHECK(calls == 1);
}

// ---- 2. exactness with threads -----------------------------------------------------------------

DBLOCK_TEST("16 threads of versioned updates write every version exactly once", "[optimistic]") {
  // 16 x 200 runs in a few seconds on every backend (SQLite included, although it has one
  // writer at a time), so there is no reduced variant.
  thread_exactness(ctx, ctx.options(), "acct", 16, 200);
}

// ---- 3. exactness with processes ---------------------------------------------------------------

DBLOCK_TEST("8 processes of versioned updates write every version exactly once",
            "[optimistic][process]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup);
  const int procs = 8;
  const int per_proc = 50;
  file_cleanup files;
  process_set workers;
  const long long start = dblock::test::monotonic_ns() + 1000 * ns_per_ms;
  for (int i = 0; i < procs; ++i) {
    files.paths.push_back(temp_path("versions"));
    workers.spawn("optimistic_increment_worker",
                  {ctx.url, ctx.prefix, table, std::to_string(per_proc), files.paths.back(),
                   std::to_string(start)});
  }
  auto rcs = workers.wait_all();
  for (int rc : rcs)
    CHECK(rc == 0);
  std::vector<long long> all;
  int mismatched = 0;
  for (const auto& path : files.paths) {
    std::ifstream in(path);
    long long version = 0, balance = 0;
    int lines = 0;
    while (in >> version >> balance) {
      all.push_back(version);
      if (balance != version) ++mismatched;
      ++lines;
    }
    INFO("worker file " << path);
    CHECK(lines == per_proc);
  }
  CHECK(mismatched == 0);
  std::sort(all.begin(), all.end());
  CHECK(all == one_to(procs * per_proc));
  auto s = read_acct(ctx.db, table);
  CHECK(s.balance == procs * per_proc);
  CHECK(s.version == procs * per_proc);
}

// ---- 4. isolation levels -----------------------------------------------------------------------

namespace {

// The isolation level of a pooled connection, lower case with spaces ("repeatable read").
std::string session_isolation(const dblock::database& db) {
  auto c = db.connect();
  std::string level;
  if (db.backend() == "postgresql") {
    c.session() << "SHOW transaction_isolation", soci::into(level);
  } else {
    try {  // MySQL 8 and MariaDB 11.1+
      c.session() << "SELECT @@SESSION.transaction_isolation", soci::into(level);
    } catch (const std::exception&) {  // older MariaDB
      c.session() << "SELECT @@SESSION.tx_isolation", soci::into(level);
    }
  }
  for (char& ch : level)
    ch = ch == '-' ? ' ' : static_cast<char>(std::tolower(ch));
  return level;
}

std::string expected_isolation(dblock::isolation_level l) {
  switch (l) {
    case dblock::isolation_level::read_committed:
      return "read committed";
    case dblock::isolation_level::repeatable_read:
      return "repeatable read";
    case dblock::isolation_level::serializable:
      return "serializable";
    default:
      return "";
  }
}

}  // namespace

DBLOCK_TEST("versioned updates stay exact at every isolation level", "[optimistic][direct]") {
  // SQLite ignores the option (it is always serializable); running it there is harmless.
  struct level {
    dblock::isolation_level iso;
    const char* stem;
  };
  for (auto l : {level{dblock::isolation_level::read_committed, "acct_rc"},
                 level{dblock::isolation_level::repeatable_read, "acct_rr"},
                 level{dblock::isolation_level::serializable, "acct_ser"}}) {
    INFO("isolation " << l.stem);
    auto o = ctx.options();
    o.isolation = l.iso;
    // The option really is in effect on the pooled connections.
    if (ctx.backend != "sqlite") {
      auto probe = ctx.open(o);
      CHECK(session_isolation(probe) == expected_isolation(l.iso));
    }
    thread_exactness(ctx, o, l.stem, 8, ctx.backend == "sqlite" ? 25 : 50);
  }
}

// ---- 5. bounded retries
// --------------------------------------------------------------------------

DBLOCK_TEST("bounded retries: failed calls leave no trace, successes are exact", "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup);
  const int threads = 16;
  const int per_thread = 50;
  auto o = ctx.options();
  o.pool_size = threads + 2;
  // On SQLite contention also shows as BUSY (the UPDATE's write lock is taken while another
  // attempt's UPDATE holds it), which a zero busy timeout makes immediate.
  o.sqlite_busy_timeout = milliseconds(0);
  auto db = ctx.open(o);
  db.ping();
  const auto spec = acct_spec(table);
  retry_policy p = retry_of(3, milliseconds(0), milliseconds(0), milliseconds(0));

  struct outcome {
    std::vector<long long> versions;
    int failures = 0;
    int bad_failures = 0;  // wrong code or attempt count
    std::string error;
  };
  std::vector<outcome> out(threads);
  run_threads(threads, [&](int t) {
    auto& me = out[static_cast<std::size_t>(t)];
    for (int i = 0; i < per_thread; ++i) {
      try {
        auto r = dblock::versioned_update(db, spec, 1LL, increment, p);
        me.versions.push_back(r.version);
      } catch (const dblock::error& e) {
        ++me.failures;
        // Exhausted: the last cause is kept (SQLite's BUSY is lock_not_available).
        const bool cause_ok = e.code() == errc::version_conflict ||
                              (ctx.backend == "sqlite" && e.code() == errc::lock_not_available);
        if (!cause_ok || e.attempts() != 3) {
          ++me.bad_failures;
          me.error = e.what();
        }
      } catch (const std::exception& e) {
        ++me.bad_failures;
        me.error = e.what();
      }
    }
  });
  std::vector<long long> all;
  int failures = 0;
  for (const auto& me : out) {
    INFO("unexpected failure: " << me.error);
    CHECK(me.bad_failures == 0);
    failures += me.failures;
    all.insert(all.end(), me.versions.begin(), me.versions.end());
  }
  const long long successes = static_cast<long long>(all.size());
  INFO(ctx.backend << ": " << successes << " successes, " << failures << " failures");
  CHECK(successes + failures == threads * per_thread);
  CHECK(successes >= 1);
  CHECK(failures >= 1);
  std::sort(all.begin(), all.end());
  CHECK(all == one_to(successes));
  auto s = read_acct(ctx.db, table);
  CHECK(s.balance == successes);
  CHECK(s.version == successes);
}

// ---- 5b. no wait the caller did not ask for (docs/safety.md D3)
// ----------------------------------
//
// versioned_update(db, ...) reads, calls `mutate`, then sends one conditional UPDATE; only that
// UPDATE may hold a lock. Negative control, run against the code before this change (which on
// SQLite ran the read, `mutate` and the UPDATE inside one BEGIN IMMEDIATE): the other handle's
// writes below each took ~800 ms (the whole callback) instead of a few, and of the two racing
// once() updates both succeeded (the second waited for the first's COMMIT, then read its
// version), with the callbacks never overlapping. PostgreSQL and MySQL passed before and after:
// their read is a plain read.

namespace {

long long ms_since(long long t0_ns) {
  return (dblock::test::monotonic_ns() - t0_ns) / ns_per_ms;
}

}  // namespace

DBLOCK_TEST("a slow mutate holds no lock: other writes and leases do not wait for it",
            "[optimistic][d3]") {
  table_cleanup cleanup{ctx, {}};
  const std::string acct = create_acct(ctx, cleanup);
  const std::string other = create_acct(ctx, cleanup, "other");
  const auto spec = acct_spec(acct);
  // Another handle, connected before the callback starts (SQLite: its own connections to the
  // same file), so that only waiting shows in the times.
  auto other_db = ctx.open();
  other_db.ping();
  dblock::lease_lock lease(other_db, "d3-" + dblock::test::random_suffix());

  // Two writers start together once the callback runs: a plain UPDATE of an unrelated table,
  // and a lease acquire and release (the lock table, in the same file on SQLite). Then an
  // UPDATE of the very row being updated.
  std::atomic<bool> in_mutate{false}, writes_done{false};
  std::atomic<int> timed_done{0};
  long long unrelated_ms = -1, acquire_ms = -1, release_ms = -1, same_row_ms = -1;
  bool acquired = false;
  std::string writer_error, lease_error;
  auto wait_for_mutate = [&] {
    while (!in_mutate.load())
      std::this_thread::sleep_for(milliseconds(1));
  };
  std::thread leaser([&] {
    wait_for_mutate();
    try {
      long long t0 = dblock::test::monotonic_ns();
      auto g = lease.try_acquire();
      acquire_ms = ms_since(t0);
      acquired = g.has_value();
      if (g) {
        t0 = dblock::test::monotonic_ns();
        g->release();
        release_ms = ms_since(t0);
      }
    } catch (const std::exception& e) {
      lease_error = e.what();
    }
    ++timed_done;
  });
  std::thread writer([&] {
    wait_for_mutate();
    try {
      auto c = other_db.connect();
      long long t0 = dblock::test::monotonic_ns();
      c.session() << "UPDATE " << other << " SET balance = balance + 1 WHERE id = 1";
      unrelated_ms = ms_since(t0);
      ++timed_done;
      while (timed_done.load() < 2)
        std::this_thread::sleep_for(milliseconds(1));
      // The row being updated itself: no row lock either (the read is a plain read).
      t0 = dblock::test::monotonic_ns();
      c.session() << "UPDATE " << acct << " SET balance = 1000, version = version + 1 WHERE id = 1";
      same_row_ms = ms_since(t0);
    } catch (const std::exception& e) {
      writer_error = e.what();
      ++timed_done;
    }
    writes_done = true;
  });

  int calls = 0;
  bool ended_during_callback = false;
  std::optional<errc> code;
  std::string message;
  try {
    (void)dblock::versioned_update(
        ctx.db, spec, 1LL,
        [&](dblock::record& r) {
          ++calls;
          in_mutate = true;
          // The callback lasts until every other write has ended (30 s at most): a write that
          // waited for a lock this callback held could not end before it, so "ended while the
          // callback ran" tells a write that did not wait at any speed of the machine (under
          // the old code they were queued behind this callback's write lock: 30 s, then false).
          const long long until = dblock::test::monotonic_ns() + 30000 * ns_per_ms;
          while (!(timed_done.load() == 2 && writes_done.load()) &&
                 dblock::test::monotonic_ns() < until)
            std::this_thread::sleep_for(milliseconds(1));
          ended_during_callback = timed_done.load() == 2 && writes_done.load();
          increment(r);
        },
        retry_policy::once());
  } catch (const dblock::error& e) {
    code = e.kind();
    message = e.what();
  }
  writer.join();
  leaser.join();
  INFO(ctx.backend << ": unrelated UPDATE " << unrelated_ms << " ms, lease acquire " << acquire_ms
                   << " ms, release " << release_ms << " ms, same-row UPDATE " << same_row_ms
                   << " ms; writer error: " << writer_error << "; lease error: " << lease_error
                   << "; update error: " << message);
  CHECK(writer_error.empty());
  CHECK(lease_error.empty());
  CHECK(acquired);
  CHECK(unrelated_ms >= 0);
  CHECK(acquire_ms >= 0);
  CHECK(release_ms >= 0);
  CHECK(same_row_ms >= 0);
  CHECK(ended_during_callback);  // none of them waited for the callback
  // The row moved on under the callback: the one attempt conflicts instead of overwriting.
  CHECK(calls == 1);
  REQUIRE(code.has_value());
  CHECK(*code == errc::version_conflict);
  auto s = read_acct(ctx.db, acct);
  CHECK(s.balance == 1000);
  CHECK(s.version == 1);
  // With retries the next attempt reads the new version and succeeds.
  auto r = dblock::versioned_update(ctx.db, spec, 1LL, increment);
  CHECK(r.version == 2);
  CHECK(r.values.at("balance") == dblock::value(1001LL));
}

DBLOCK_TEST("two racing versioned updates without retry: one writes, one conflicts",
            "[optimistic][d3]") {
  table_cleanup cleanup{ctx, {}};
  const std::string acct = create_acct(ctx, cleanup);
  const auto spec = acct_spec(acct);
  auto o = ctx.options();
  o.pool_size = 4;
  auto db = ctx.open(o);
  db.ping();
  // Each callback waits (up to 2 s) until both have read: both then hold version 0, and the
  // conditional UPDATEs decide. Under the old SQLite code the second could not even read until
  // the first committed, so the wait ran out and both succeeded one after the other.
  std::atomic<int> entered{0};
  std::atomic<int> overlapped{0};
  struct outcome {
    long long version = -1;
    std::optional<errc> code;
    int attempts = 0;
    std::string message;
  };
  std::vector<outcome> out(2);
  run_threads(2, [&](int t) {
    auto& me = out[static_cast<std::size_t>(t)];
    try {
      me.version = dblock::versioned_update(
                       db, spec, 1LL,
                       [&](dblock::record& r) {
                         ++entered;
                         const long long until = dblock::test::monotonic_ns() + 2000 * ns_per_ms;
                         while (entered.load() < 2 && dblock::test::monotonic_ns() < until)
                           std::this_thread::sleep_for(milliseconds(1));
                         if (entered.load() >= 2) ++overlapped;
                         increment(r);
                       },
                       retry_policy::once())
                       .version;
    } catch (const dblock::error& e) {
      me.code = e.kind();
      me.attempts = e.attempts();
      me.message = e.what();
    }
  });
  INFO(ctx.backend << ": " << out[0].version << " / " << out[1].version
                   << "; errors: " << out[0].message << " / " << out[1].message);
  CHECK(overlapped.load() == 2);  // the callbacks ran at the same time
  const int wins = (out[0].version == 1 ? 1 : 0) + (out[1].version == 1 ? 1 : 0);
  CHECK(wins == 1);
  for (const auto& me : out) {
    if (me.version == 1) continue;
    REQUIRE(me.code.has_value());
    CHECK(*me.code == errc::version_conflict);
    CHECK(me.attempts == 1);
  }
  auto s = read_acct(ctx.db, acct);
  CHECK(s.balance == 1);
  CHECK(s.version == 1);
}

// ---- 6. CAS stock ----------------------------------------------------------------------------

DBLOCK_TEST("CAS with 16 threads sells exactly the stock, never more", "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_stock(ctx, cleanup, 100);
  const int threads = 16;
  const int buyers = 20;
  auto o = ctx.options();
  o.pool_size = threads + 2;
  auto db = ctx.open(o);
  db.ping();
  const auto update = buy_one(table);
  struct outcome {
    int sold = 0, refused = 0, over = 0;
    std::string error;
  };
  std::vector<outcome> out(threads);
  run_threads(threads, [&](int t) {
    auto& me = out[static_cast<std::size_t>(t)];
    try {
      for (int i = 0; i < buyers; ++i) {
        auto n = dblock::compare_and_set(db, update, retry_policy::until_success());
        if (n == 1)
          ++me.sold;
        else if (n == 0)
          ++me.refused;
        else
          ++me.over;
      }
    } catch (const std::exception& e) {
      me.error = e.what();
    }
  });
  int sold = 0, refused = 0;
  for (const auto& me : out) {
    INFO("thread error: " << me.error);
    CHECK(me.error.empty());
    CHECK(me.over == 0);  // no call ever matched more than the one row
    sold += me.sold;
    refused += me.refused;
  }
  CHECK(sold == 100);
  CHECK(refused == threads * buyers - 100);
  CHECK(read_stock(ctx.db, table) == 0);
}

DBLOCK_TEST("CAS with 8 processes sells exactly the stock, never more", "[optimistic][process]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_stock(ctx, cleanup, 100);
  const int procs = 8;
  const int buyers = 20;
  process_set workers;
  const long long start = dblock::test::monotonic_ns() + 1000 * ns_per_ms;
  for (int i = 0; i < procs; ++i)
    workers.spawn("optimistic_buyer_worker",
                  {ctx.url, ctx.prefix, table, std::to_string(buyers), std::to_string(start)});
  int sold = 0;
  for (int rc : workers.wait_all()) {
    INFO("worker exit status " << rc);
    CHECK(rc >= 10);
    CHECK(rc <= 10 + buyers);
    if (rc >= 10) sold += rc - 10;
  }
  CHECK(sold == 100);
  CHECK(read_stock(ctx.db, table) == 0);
}

// ---- 7. matched rows, not changed rows -------------------------------------------------------

DBLOCK_TEST("affected rows mean matched rows on every backend", "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string stock = create_stock(ctx, cleanup, 5);
  const std::string acct = create_acct(ctx, cleanup);

  // Unchanged values still count as a match (MySQL needs CLIENT_FOUND_ROWS for this).
  CHECK(dblock::compare_and_set(ctx.db, {stock, "stock = stock", "id = :id", {{"id", 1LL}}}) == 1);
  CHECK(dblock::compare_and_set(
            ctx.db, {stock, "stock = :s", "id = :id AND stock = :s", {{"id", 1LL}, {"s", 5LL}}}) ==
        1);
  {
    auto c = ctx.db.connect();
    CHECK(dblock::compare_and_set(c, {stock, "stock = stock", "id = :id", {{"id", 1LL}}}) == 1);
  }
  CHECK(read_stock(ctx.db, stock) == 5);

  // A mutation that changes nothing is still a successful write: the version moves on.
  int mutate_calls = 0;
  auto r1 = dblock::versioned_update(ctx.db, acct_spec(acct), 1LL,
                                     [&](dblock::record&) { ++mutate_calls; });
  CHECK(r1.version == 1);
  CHECK(r1.stats.attempts == 1);
  CHECK(r1.stats.conflicts == 0);
  CHECK(r1.values.at("balance") == dblock::value(0LL));
  {
    auto c = ctx.db.connect();
    auto r2 =
        dblock::versioned_update(c, acct_spec(acct), 1LL, [&](dblock::record&) { ++mutate_calls; });
    CHECK(r2.version == 2);
  }
  CHECK(mutate_calls == 2);
  auto s = read_acct(ctx.db, acct);
  CHECK(s.balance == 0);
  CHECK(s.version == 2);

  // No match is an answer, not a conflict: 0, and never retried.
  int retries = 0;
  retry_policy p;
  p.max_attempts = 5;
  p.on_retry = [&](const dblock::retry_event&) { ++retries; };
  CHECK(dblock::compare_and_set(ctx.db, {stock, "stock = stock - 1", "id = :id", {{"id", 999LL}}},
                                p) == 0);
  CHECK(dblock::compare_and_set(
            ctx.db,
            {stock, "stock = stock - 1", "id = :id AND stock > :n", {{"id", 1LL}, {"n", 100LL}}},
            p) == 0);
  CHECK(retries == 0);
  CHECK(read_stock(ctx.db, stock) == 5);
}

// ---- 8. inside the caller's transaction --------------------------------------------------------

DBLOCK_TEST("inside the caller's transaction: rollback undoes, commit publishes", "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string acct = create_acct(ctx, cleanup);
  const std::string stock = create_stock(ctx, cleanup, 10);
  const std::string begin = dblock::test::dialect_of(ctx.db).sql.begin_write();
  const auto spec = acct_spec(acct);

  for (const char* end : {"ROLLBACK", "COMMIT"}) {
    INFO("ending with " << end);
    auto s0 = read_acct(ctx.db, acct);
    const long long stock0 = read_stock(ctx.db, stock);
    auto c = ctx.db.connect();
    c.session() << begin;
    auto r1 = dblock::versioned_update(c, spec, 1LL, increment);
    auto r2 = dblock::versioned_update(c, spec, 1LL, increment);  // reads its own write
    CHECK(r1.version == s0.version + 1);
    CHECK(r2.version == s0.version + 2);
    CHECK(r2.values.at("balance") == dblock::value(s0.balance + 2));
    CHECK(dblock::compare_and_set(c, buy_one(stock)) == 1);
    // Not visible to anyone else before the end of the transaction.
    auto mid = read_acct(ctx.db, acct);
    CHECK(mid.balance == s0.balance);
    CHECK(mid.version == s0.version);
    CHECK(read_stock(ctx.db, stock) == stock0);
    c.session() << end;
    auto s1 = read_acct(ctx.db, acct);
    if (std::string(end) == "ROLLBACK") {
      CHECK(s1.balance == s0.balance);
      CHECK(s1.version == s0.version);
      CHECK(read_stock(ctx.db, stock) == stock0);
    } else {
      CHECK(s1.balance == s0.balance + 2);
      CHECK(s1.version == s0.version + 2);
      CHECK(read_stock(ctx.db, stock) == stock0 - 1);
    }
  }
}

namespace {

// A stale snapshot in a REPEATABLE READ transaction must not overwrite a newer version. `setup`
// runs on connection A before its transaction begins.
void stale_snapshot_case(dblock::test::context& ctx,
                         const std::function<void(soci::session&)>& setup) {
  table_cleanup cleanup{ctx, {}};
  const std::string acct = create_acct(ctx, cleanup);
  const auto spec = acct_spec(acct);
  auto o = ctx.options();
  o.isolation = dblock::isolation_level::repeatable_read;
  auto db_a = ctx.open(o);
  auto a = db_a.connect();
  setup(a.session());
  a.session() << "BEGIN";
  long long balance = -1, version = -1;
  a.session() << "SELECT balance, version FROM " << acct << " WHERE id = 1", soci::into(balance),
      soci::into(version);  // fixes A's snapshot
  REQUIRE(version == 0);

  // Someone else writes version 1 outside A.
  auto outside =
      dblock::versioned_update(ctx.db, spec, 1LL, [](dblock::record& r) { r["balance"] = 100LL; });
  REQUIRE(outside.version == 1);

  int mutate_calls = 0;
  std::optional<errc> code;
  std::string message;
  try {
    dblock::versioned_update(a, spec, 1LL, [&](dblock::record& r) {
      ++mutate_calls;
      increment(r);
    });
  } catch (const dblock::error& e) {
    code = e.kind();
    message = e.what();
  }
  INFO("error: " << message);
  REQUIRE(code.has_value());
  if (ctx.backend == "postgresql")
    CHECK((*code == errc::serialization_failure || *code == errc::version_conflict));
  else
    CHECK((*code == errc::version_conflict || *code == errc::serialization_failure));
  CHECK(dblock::advice_for(*code) == dblock::retry_advice::retry_transaction);
  a.session() << "ROLLBACK";

  auto s = read_acct(ctx.db, acct);
  CHECK(s.balance == 100);
  CHECK(s.version == 1);

  // A is usable again, and a fresh attempt sees the new version.
  auto r = dblock::versioned_update(a, spec, 1LL, increment);
  CHECK(r.version == 2);
  s = read_acct(ctx.db, acct);
  CHECK(s.balance == 101);
  CHECK(s.version == 2);
}

}  // namespace

DBLOCK_TEST_SERVERS("a stale REPEATABLE READ snapshot conflicts instead of overwriting",
                    "[optimistic][direct]") {
  stale_snapshot_case(ctx, [](soci::session&) {});
}

// MariaDB 11.6+ turns innodb_snapshot_isolation on by default: an UPDATE of a row changed after
// the snapshot then fails with ER_CHECKREAD (1020) instead of matching zero rows. Either way it
// must surface as a conflict the caller retries, never as an overwrite or a generic error.
DBLOCK_TEST_ONLY("mysql", "a stale snapshot conflicts with innodb_snapshot_isolation on",
                 "[optimistic]") {
  bool supported = true;
  try {
    auto c = ctx.db.connect();
    int v = 0;
    c.session() << "SELECT @@innodb_snapshot_isolation", soci::into(v);
  } catch (const std::exception&) {
    supported = false;
  }
  if (!supported) DBLOCK_SKIP("innodb_snapshot_isolation is not available on this server");
  stale_snapshot_case(ctx,
                      [](soci::session& s) { s << "SET SESSION innodb_snapshot_isolation = ON"; });
}

// ---- 9. errors -------------------------------------------------------------------------------

DBLOCK_TEST("versioned update errors: missing key, bad identifiers, foreign columns",
            "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string acct = create_acct(ctx, cleanup);
  const auto spec = acct_spec(acct);

  // A missing key is not_found, at once: no retry, mutate never called.
  int mutate_calls = 0, retries = 0;
  retry_policy p;
  p.max_attempts = 5;
  p.on_retry = [&](const dblock::retry_event&) { ++retries; };
  auto count_mutate = [&](dblock::record& r) {
    ++mutate_calls;
    increment(r);
  };
  CHECK(code_of([&] { dblock::versioned_update(ctx.db, spec, 42LL, count_mutate, p); }) ==
        errc::not_found);
  {
    auto c = ctx.db.connect();
    CHECK(code_of([&] { dblock::versioned_update(c, spec, 42LL, count_mutate); }) ==
          errc::not_found);
  }
  CHECK(mutate_calls == 0);
  CHECK(retries == 0);

  // Bad identifiers are refused before any SQL runs: this handle's only connection is held,
  // so anything that tried to reach the database would wait and then time out.
  auto o = ctx.options();
  o.pool_size = 1;
  o.pool_wait = milliseconds(300);
  auto db1 = ctx.open(o);
  auto held = db1.connect();
  auto bad = [&](auto edit) {
    auto s = spec;
    edit(s);
    return code_of([&] { dblock::versioned_update(db1, s, 1LL, count_mutate, p); });
  };
  using vt = dblock::versioned_table;
  CHECK(bad([](vt& s) { s.table = "x;drop"; }) == errc::invalid_argument);
  CHECK(bad([&](vt& s) { s.table = acct + "; DROP TABLE " + acct; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.table = ""; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.key_column = "id = id OR 1"; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.version_column = "version`"; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.columns = {"a b"}; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.columns = {"balance", "a\"b"}; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.columns = {}; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.columns = {"balance", "version"}; }) == errc::invalid_argument);
  CHECK(bad([](vt& s) { s.columns = {"id"}; }) == errc::invalid_argument);
  CHECK(mutate_calls == 0);
  // Same on the connection form (its SQL would run on `held`).
  {
    auto s = spec;
    s.columns = {"a b"};
    CHECK(code_of([&] { dblock::versioned_update(held, s, 1LL, count_mutate); }) ==
          errc::invalid_argument);
  }
  CHECK(mutate_calls == 0);

  // A mutation that sets a column outside `columns` is refused, not retried, writes nothing.
  int foreign_calls = 0;
  CHECK(code_of([&] {
          dblock::versioned_update(
              ctx.db, spec, 1LL,
              [&](dblock::record& r) {
                ++foreign_calls;
                increment(r);
                r["id"] = 7LL;
              },
              p);
        }) == errc::invalid_argument);
  CHECK(code_of([&] {
          dblock::versioned_update(ctx.db, spec, 1LL, [&](dblock::record& r) {
            ++foreign_calls;
            r["not_a_column"] = 1LL;
          });
        }) == errc::invalid_argument);
  CHECK(foreign_calls == 2);
  CHECK(retries == 0);
  auto s = read_acct(ctx.db, acct);
  CHECK(s.balance == 0);
  CHECK(s.version == 0);
  // The hostile names above touched nothing: the table is still there and still works.
  CHECK(dblock::versioned_update(ctx.db, spec, 1LL, increment).version == 1);
}

DBLOCK_TEST("compare_and_set errors: bad identifiers and empty clauses", "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string stock = create_stock(ctx, cleanup, 3);
  // Refused before any SQL runs (see above: the only pooled connection is held).
  auto o = ctx.options();
  o.pool_size = 1;
  o.pool_wait = milliseconds(300);
  auto db1 = ctx.open(o);
  auto held = db1.connect();
  const dblock::cas_update bad_updates[] = {
      {"x;drop", "stock = stock - 1", "id = :id", {{"id", 1LL}}},
      {stock + " SET stock = 0 --", "stock = stock - 1", "id = :id", {{"id", 1LL}}},
      {stock, "stock = stock - 1", "id = :a b", {{"a b", 1LL}}},
      {stock, "", "id = :id", {{"id", 1LL}}},
      {stock, "stock = stock - 1", "", {}},
  };
  for (const auto& u : bad_updates) {
    INFO("table '" << u.table << "' set '" << u.set << "' where '" << u.where << "'");
    CHECK(code_of([&] { dblock::compare_and_set(held, u); }) == errc::invalid_argument);
    CHECK(code_of([&] { dblock::compare_and_set(db1, u); }) == errc::invalid_argument);
    CHECK(code_of([&] { dblock::compare_and_set(ctx.db, u); }) == errc::invalid_argument);
  }
  CHECK(read_stock(ctx.db, stock) == 3);
}

// ---- values of every supported type --------------------------------------------------------

DBLOCK_TEST("versioned updates carry text, floating-point and NULL values", "[optimistic]") {
  table_cleanup cleanup{ctx, {}};
  const std::string t = cleanup.add(ctx.table("kv"));
  ctx.exec("CREATE TABLE " + t +
           " (k VARCHAR(64) PRIMARY KEY, name VARCHAR(100), score DOUBLE PRECISION,"
           " note VARCHAR(100), ver INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (k, name, score, note, ver) VALUES ('alice', 'A', 1.5, NULL, 7)");
  dblock::versioned_table spec{t, "k", "ver", {"name", "score", "note"}};
  auto r = dblock::versioned_update(ctx.db, spec, std::string("alice"), [](dblock::record& v) {
    CHECK(v.at("name") == dblock::value(std::string("A")));
    CHECK(v.at("score") == dblock::value(1.5));
    CHECK(std::holds_alternative<std::monostate>(v.at("note")));
    v["name"] = std::string("it's \"quoted\"; DROP");
    v["score"] = -2.25;
    v["note"] = std::string("n");
  });
  CHECK(r.version == 8);
  r = dblock::versioned_update(ctx.db, spec, std::string("alice"), [](dblock::record& v) {
    CHECK(v.at("name") == dblock::value(std::string("it's \"quoted\"; DROP")));
    CHECK(v.at("score") == dblock::value(-2.25));
    CHECK(v.at("note") == dblock::value(std::string("n")));
    v["note"] = std::monostate{};
  });
  CHECK(r.version == 9);
  auto c = ctx.db.connect();
  std::string name, note;
  double score = 0;
  soci::indicator note_ind = soci::i_ok;
  long long ver = 0;
  c.session() << "SELECT name, score, note, ver FROM " << t << " WHERE k = 'alice'",
      soci::into(name), soci::into(score), soci::into(note, note_ind), soci::into(ver);
  CHECK(name == "it's \"quoted\"; DROP");
  CHECK(score == -2.25);
  CHECK(note_ind == soci::i_null);
  CHECK(ver == 9);
  CHECK(code_of([&] {
          dblock::versioned_update(ctx.db, spec, std::string("bob"), [](dblock::record&) {});
        }) == errc::not_found);
}

DBLOCK_TEST("64-bit values survive versioned updates and row locks (SQLite INTEGER too)",
            "[optimistic]") {
  // SQLite's usual declaration is INTEGER, which SOCI would read through a 32-bit int.
  const std::string big = ctx.backend == "sqlite" ? "INTEGER" : "BIGINT";
  const std::string t = ctx.table("wide");
  ctx.exec("CREATE TABLE " + t + " (id INTEGER PRIMARY KEY, amount " + big +
           " NOT NULL, ratio DOUBLE PRECISION, note VARCHAR(20), version " + big + " NOT NULL)");
  ctx.exec("INSERT INTO " + t +
           " (id, amount, ratio, note, version) VALUES (1, 5000000000, 0.1,"
           " NULL, 4000000000)");
  auto r = dblock::versioned_update(ctx.db, {t, "id", "version", {"amount", "ratio", "note"}}, 1LL,
                                    [](dblock::record& rec) {
                                      CHECK(std::get<long long>(rec["amount"]) == 5000000000LL);
                                      CHECK(std::get<double>(rec["ratio"]) == 0.1);
                                      CHECK(std::holds_alternative<std::monostate>(rec["note"]));
                                      std::get<long long>(rec["amount"]) += 1;
                                    });
  CHECK(r.version == 4000000001LL);
  dblock::run_transaction(ctx.db, [&](dblock::transaction& tx) {
    auto rows = tx.lock_rows({t, "id", 1LL, {"amount", "version"}});
    REQUIRE(rows.size() == 1);
    CHECK(std::get<long long>(rows[0]["amount"]) == 5000000001LL);
    CHECK(std::get<long long>(rows[0]["version"]) == 4000000001LL);
  });
  ctx.exec("DROP TABLE " + t);
}

// docs/safety.md's store outside the lock's database: it keeps the highest fence it accepted and
// takes a write whose fence is at least that one. The holder's second write with the same fence
// goes through, a stale holder's is refused; the control shows that `fence < :mine` (the
// earlier text of the doc) refuses the holder's own second write.
DBLOCK_TEST("a store that keeps the highest fence takes the holder's second write, not a stale one",
            "[optimistic][fence]") {
  table_cleanup cleanup{ctx, {}};
  const std::string doc = cleanup.add(ctx.table("document"));
  ctx.exec("CREATE TABLE " + doc +
           " (id INTEGER PRIMARY KEY, body VARCHAR(64) NOT NULL, fence BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + doc + " (id, body, fence) VALUES (42, 'old', 0)");
  const std::string name = "doc-" + dblock::test::random_suffix();
  dblock::lease_lock lock(ctx.db, name);
  auto stale = lock.try_acquire();
  REQUIRE(stale);
  const long long stale_fence = stale->fence();
  dblock::force_release(ctx.db, name, "test: the first holder paused", "test");
  auto lease = lock.try_acquire();
  REQUIRE(lease);
  const long long fence = lease->fence();
  REQUIRE(fence > stale_fence);
  auto write = [&](const std::string& body, long long f, const char* cond) {
    return dblock::compare_and_set(
        ctx.db,
        {doc, "body = :body, fence = :fence", cond, {{"body", body}, {"fence", f}, {"mine", f}}});
  };
  const char* doc_cond = "id = 42 AND fence <= :mine";
  CHECK(write("first", fence, doc_cond) == 1);
  CHECK(write("second", fence, doc_cond) == 1);  // the holder's own second write
  CHECK(write("stale", stale_fence, doc_cond) == 0);
  {
    auto c = ctx.db.connect();
    std::string body;
    c.session() << "SELECT body FROM " << doc << " WHERE id = 42", soci::into(body);
    CHECK(body == "second");
  }
  // Control: a strict comparison refuses the holder's second write.
  CHECK(write("third", fence, "id = 42 AND fence < :mine") == 0);
}
