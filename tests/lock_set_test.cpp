// Lock sets (include/dblock/lock_set.hpp) on every backend: all or nothing, one fence per name,
// sorted and deduplicated names, waits that time out or are cancelled keeping nothing, fenced
// writes over every lease, and processes taking random overlapping sets in random order: no
// deadlock, no overlap on any name, exact per-name counters, with a negative control that takes
// the same names one by one in the callers' order and deadlocks.
#include <soci/soci.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"

using dblock::lease_guard;
using dblock::lock_set;
using namespace dblock::test;

namespace {

// True when a lease_lock can take `name` now (and gives it back at once).
bool free_now(const dblock::database& db, const std::string& name) {
  dblock::lease_lock probe(db, name);
  auto g = probe.try_acquire();
  return g.has_value();
}

}  // namespace

DBLOCK_TEST("lock set: all or nothing, one fence per name, names sorted and deduplicated",
            "[lock_set]") {
  const std::string p = "set-" + dblock::test::random_suffix() + "/";
  lock_set set(ctx.db, {p + "c", p + "a", p + "b", p + "a"});
  CHECK(set.names() == std::vector<std::string>{p + "a", p + "b", p + "c"});
  auto g = set.try_acquire();
  REQUIRE(g);
  REQUIRE(g->size() == 3);
  CHECK(g->valid());
  std::set<std::string> tokens;
  for (const auto& n : set.names()) {
    CHECK(g->lease(n).name() == n);
    CHECK(g->fence(n) > 0);
    tokens.insert(g->lease(n).owner_token());
  }
  CHECK(tokens.size() == 3);  // each name is its own lease
  CHECK(code_of([&] { (void)g->fence(p + "z"); }) == errc::invalid_argument);
  // Overlapping set: nothing, and its free name is left free (not kept).
  lock_set other(ctx.db, {p + "d", p + "b"});
  CHECK_FALSE(other.try_acquire());
  CHECK(free_now(ctx.db, p + "d"));
  // A plain lease on a member is excluded too.
  dblock::lease_lock plain(ctx.db, p + "c");
  CHECK_FALSE(plain.try_acquire());
  std::map<std::string, std::int64_t> fences;
  for (const auto& n : set.names())
    fences[n] = g->fence(n);
  g->release();
  CHECK(g->size() == 0);
  CHECK_FALSE(g->valid());
  CHECK(code_of([&] { g->release(); }) == errc::not_owner);
  auto again = set.try_acquire();
  REQUIRE(again);
  for (const auto& n : set.names())
    CHECK(again->fence(n) > fences[n]);  // every name's fence grew
  again.reset();                         // the destructor releases every lease
  for (const auto& n : set.names())
    CHECK(free_now(ctx.db, n));
}

DBLOCK_TEST("lock set: a wait gets every lease, or times out or is cancelled keeping none",
            "[lock_set]") {
  const std::string p = "wait-" + dblock::test::random_suffix() + "/";
  dblock::lease_lock blocker(ctx.db, p + "b");
  auto held = blocker.try_acquire();
  REQUIRE(held);
  lock_set set(ctx.db, {p + "a", p + "b", p + "c"});
  // Names the busy one.
  check_times_out([&] { (void)set.acquire(milliseconds(300)); }, p + "b", 290,
                  "acquired a set with a member held elsewhere");
  CHECK(free_now(ctx.db, p + "a"));  // taken while waiting for b, and given back
  CHECK(free_now(ctx.db, p + "c"));  // never taken
  CHECK(code_when_cancelled(milliseconds(200), [&](const dblock::cancellation& c) {
          (void)set.acquire(std::chrono::seconds(20), c);
        }) == errc::cancelled);
  CHECK(free_now(ctx.db, p + "a"));
  std::optional<dblock::lock_set_guard> g;
  const long long waited_ms = ms_until_ended(
      milliseconds(200), [&] { held->release(); },
      [&] { g.emplace(set.acquire(std::chrono::seconds(20))); });
  CHECK(g->size() == 3);
  CHECK(g->valid());
  CHECK(waited_ms >= 195);
  CHECK(waited_ms < scaled_bound_ms(ctx.db, 5000));
}

DBLOCK_TEST("lock set: bad names and options are refused clearly", "[lock_set]") {
  auto bad = [&](std::vector<std::string> names, dblock::lease_options lo = {}) {
    return code_of([&] { lock_set s(ctx.db, std::move(names), lo); });
  };
  CHECK(bad({}) == errc::invalid_argument);
  CHECK(bad({"ok", ""}) == errc::invalid_argument);
  CHECK(bad({"ok", std::string(256, 'n')}) == errc::invalid_argument);
  CHECK(bad({"ok",
             "p\xEF\xBF\xBF"
             "1"}) == errc::invalid_argument);  // a semaphore permit's row
  CHECK(bad({"ok", std::string("a\0b", 3)}) == errc::invalid_argument);
  std::vector<std::string> many;
  for (std::size_t i = 0; i <= dblock::max_lock_set_names; ++i)
    many.push_back("n" + std::to_string(i));
  CHECK(bad(many) == errc::invalid_argument);
  dblock::lease_options short_ttl;
  short_ttl.ttl = milliseconds(1);
  CHECK(bad({"ok"}, short_ttl) == errc::invalid_argument);
  try {
    lock_set s(ctx.db, {"fine", std::string(300, 'x')});
    FAIL("a 300-byte name was accepted");
  } catch (const dblock::error& e) {
    CHECK(std::string(e.what()).find("xxxxxxxx") != std::string::npos);  // names the bad one
  }
  many.pop_back();  // exactly the limit is fine
  CHECK(lock_set(ctx.db, many).names().size() == dblock::max_lock_set_names);
}

DBLOCK_TEST("lock set: fenced writes check every lease; a lost one writes nothing", "[lock_set]") {
  const std::string p = "fenced-" + dblock::test::random_suffix() + "/";
  ctx.exec("CREATE TABLE " + ctx.table("items") + " (id INT PRIMARY KEY)");
  auto items = [&] {
    auto c = ctx.db.connect();
    int n = -1;
    c.session() << "SELECT count(*) FROM " << ctx.table("items"), soci::into(n);
    return n;
  };
  dblock::lease_options lo;
  lo.ttl = milliseconds(300);
  lock_set set(ctx.db, {p + "a", p + "b"}, lo);
  auto g = set.try_acquire();
  REQUIRE(g);
  g->fenced(
      [&](soci::session& sql) { sql << "INSERT INTO " << ctx.table("items") << " VALUES (1)"; });
  CHECK(items() == 1);
  // b expires (no watchdog) and another owner takes it: the set may no longer write.
  std::this_thread::sleep_for(milliseconds(500));
  dblock::lease_lock taker(ctx.db, p + "b");
  auto t = taker.try_acquire();
  REQUIRE(t);
  try {
    g->fenced(
        [&](soci::session& sql) { sql << "INSERT INTO " << ctx.table("items") << " VALUES (2)"; });
    FAIL("a lock set with a lost lease wrote");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::lease_lost);
    // Both leases expired; the first in the set's order is the one named.
    CHECK(std::string(e.what()).find(p + "a") != std::string::npos);
  }
  CHECK(items() == 1);
  CHECK_FALSE(g->valid());
  // Release tries every lease, reports the lost one, and leaves the new owner's row alone.
  CHECK(code_of([&] { g->release(); }) == errc::lease_lost);
  CHECK(t->valid());
  t->fenced(
      [&](soci::session& sql) { sql << "INSERT INTO " << ctx.table("items") << " VALUES (3)"; });
  CHECK(items() == 2);
}

// ---- processes taking overlapping sets ---------------------------------------------------------

namespace {

struct section {
  std::string name;
  long long fence = 0, enter_ns = 0, exit_ns = 0;
};

// The names of one iteration: 1..4 distinct of `pool` in random order.
std::vector<std::string> random_names(std::mt19937_64& rng, const std::vector<std::string>& pool) {
  std::vector<std::string> all = pool;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<std::size_t>(1 + rng() % 4));
  return all;
}

}  // namespace

// args: url prefix name_prefix pool_size iterations start_ns counter_table out_file seed mode
//       index workers dir
// mode "set": lock_set.acquire, hold, a read-sleep-write increment per name (the writes fenced);
// log "name fence enter exit"; an acquire that times out is logged as "T" and ends the worker.
// mode "one-by-one" (negative control): worker `index` of `workers` takes the names `index` and
// `index` + 1 (mod `workers`) one by one, each with its own lease_lock, holding the first; the
// workers meet (files in `dir`) once each holds its first name, so the second names close a
// cycle of holders every time; the first timeout is logged as "T" and ends the worker.
DBLOCK_WORKER(lock_set_worker) {
  const std::string name_prefix = args.at(2);
  const int pool_size = std::stoi(args.at(3)), iterations = std::stoi(args.at(4));
  const long long start_ns = std::stoll(args.at(5));
  const std::string table = args.at(6), mode = args.at(9);
  const int index = std::stoi(args.at(10)), workers = std::stoi(args.at(11));
  const std::string dir = args.at(12);
  std::mt19937_64 rng(std::stoull(args.at(8)));
  auto db = open_db(args.at(0), args.at(1), 3);
  db.ping();
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);
  lo.watchdog = true;
  lo.poll_initial = milliseconds(1);
  lo.poll_max = milliseconds(20);
  std::vector<std::string> pool;
  for (int i = 0; i < pool_size; ++i)
    pool.push_back(name_prefix + std::to_string(i));
  // A cycle of one-by-one holders never resolves (the watchdog keeps every lease): 2 s shows it
  // as well as 5 and saves CI time. A set acquire gets the margin of slow machines: its waits
  // are not fair, so under CI's parallel load a set can lose the race for its first name for
  // over 5 s (seen once on MySQL) without any cycle; a deadlock still shows, at 20 s.
  const auto wait = std::chrono::seconds(mode == "one-by-one" ? 2 : 20);
  std::ostringstream out;
  sleep_until_monotonic(start_ns);
  for (int i = 0; i < iterations; ++i) {
    const auto names = random_names(rng, pool);
    if (mode == "one-by-one") {
      // (workers <= pool_size)
      const std::vector<std::string> mine = {
          pool.at(static_cast<std::size_t>(index)),
          pool.at(static_cast<std::size_t>((index + 1) % workers))};
      std::vector<lease_guard> held;
      try {
        for (const auto& n : mine) {
          held.push_back(dblock::lease_lock(db, n, lo).acquire(wait));
          if (held.size() == 1 && !file_rendezvous(dir, "first" + std::to_string(i), index, workers,
                                                   std::chrono::seconds(60)))
            throw std::runtime_error("the other workers did not take their first name in 60 s");
        }
      } catch (const dblock::error& e) {
        if (e.code() != errc::timeout) throw;
        out << "T\n";
        break;
      }
      std::this_thread::sleep_for(milliseconds(static_cast<long long>(rng() % 3)));
      continue;
    }
    lock_set set(db, names, lo);
    std::optional<dblock::lock_set_guard> g;
    try {
      g.emplace(set.acquire(wait));
    } catch (const dblock::error& e) {
      if (e.code() != errc::timeout) throw;
      out << "T\n";
      break;
    }
    const long long enter = monotonic_ns();
    // Read every counter, sleep, then write each value + 1 in a separate (fenced) statement: two
    // holders of one name at once would lose an increment.
    std::vector<int> values;
    {
      auto c = db.connect();
      for (const auto& n : set.names()) {
        int v = -1;
        c.session() << "SELECT n FROM " << table << " WHERE name = :n", soci::use(n), soci::into(v);
        values.push_back(v);
      }
    }
    std::this_thread::sleep_for(milliseconds(1 + static_cast<long long>(rng() % 2)));
    g->fenced([&](soci::session& sql) {
      for (std::size_t k = 0; k < set.names().size(); ++k) {
        const int next = values[k] + 1;
        sql << "UPDATE " << table << " SET n = :v WHERE name = :n", soci::use(next),
            soci::use(set.names()[k]);
      }
    });
    const long long exit = monotonic_ns();
    for (const auto& n : set.names())
      out << n << " " << g->fence(n) << " " << enter << " " << exit << "\n";
    g->release();
  }
  write_file_atomic(args.at(7), out.str());
  return 0;
}

namespace {

struct set_run {
  std::vector<section> sections;
  std::map<std::string, int> counters;
  int timeouts = 0;
  bool overlapping_sets = false;  // two sets held at one instant (disjoint ones run together)
};

set_run run_set_workers(const dblock::test::context& ctx, const std::string& mode, int procs,
                        int iterations) {
  const std::string name_prefix = "ls-" + dblock::test::random_suffix() + "-";
  const int pool_size = 6;
  ctx.exec("CREATE TABLE " + ctx.table("counter") + " (name VARCHAR(64) PRIMARY KEY, n INT)");
  for (int i = 0; i < pool_size; ++i)
    ctx.exec("INSERT INTO " + ctx.table("counter") + " (name, n) VALUES ('" + name_prefix +
             std::to_string(i) + "', 0)");
  temp_dir dir("lock-set");
  process_set ps;
  const long long start_ns = monotonic_ns() + 800 * ns_per_ms;
  std::random_device rd;
  for (int i = 0; i < procs; ++i)
    ps.spawn(
        "lock_set_worker",
        {ctx.url, ctx.prefix, name_prefix, std::to_string(pool_size), std::to_string(iterations),
         std::to_string(start_ns), ctx.table("counter"), dir.file("w" + std::to_string(i) + ".log"),
         std::to_string(rd()), mode, std::to_string(i), std::to_string(procs), dir.path});
  const auto st = ps.wait_all(std::chrono::seconds(240));
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("lock set worker " << i << " exit status " << st[i]
                            << " (any error escaping exits non-zero)");
    REQUIRE(st[i] == 0);
  }
  set_run r;
  std::vector<std::pair<long long, int>> set_events;
  for (int i = 0; i < procs; ++i) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(i) + ".log")));
    std::string first;
    long long last_enter = -1;
    while (in >> first) {
      if (first == "T") {
        ++r.timeouts;
        continue;
      }
      section s;
      s.name = first;
      in >> s.fence >> s.enter_ns >> s.exit_ns;
      r.sections.push_back(s);
      if (s.enter_ns != last_enter) {
        set_events.emplace_back(s.enter_ns, 1);
        set_events.emplace_back(s.exit_ns, -1);
        last_enter = s.enter_ns;
      }
    }
  }
  std::sort(set_events.begin(), set_events.end());
  int open = 0;
  for (const auto& e : set_events)
    r.overlapping_sets = r.overlapping_sets || (open += e.second) >= 2;
  // In a transaction: behind a transaction-mode pooler the prepared statement and its
  // execution must reach one server session.
  auto c = ctx.db.connect();
  soci::transaction tr(c.session());
  {
    soci::rowset<soci::row> rows =
        (c.session().prepare << "SELECT name, n FROM " << ctx.table("counter"));
    for (const auto& row : rows)
      r.counters[row.get<std::string>(0)] = row.get<int>(1);
  }
  tr.commit();
  return r;
}

// Per name: sections never overlap and fences strictly increase in time order; the first
// problem, empty when none.
std::string check_names(std::vector<section> all) {
  std::sort(all.begin(), all.end(),
            [](const section& a, const section& b) { return a.enter_ns < b.enter_ns; });
  std::map<std::string, section> last;
  for (const auto& s : all) {
    auto it = last.find(s.name);
    if (it != last.end()) {
      if (s.enter_ns < it->second.exit_ns)
        return s.name + ": fence " + std::to_string(s.fence) + " entered before fence " +
               std::to_string(it->second.fence) + " exited";
      if (s.fence <= it->second.fence)
        return s.name + ": fence " + std::to_string(s.fence) + " granted after fence " +
               std::to_string(it->second.fence);
    }
    last[s.name] = s;
  }
  return {};
}

}  // namespace

DBLOCK_TEST("lock set: processes taking random overlapping sets in random order never deadlock",
            "[lock_set][processes]") {
  const int procs = full_run() ? 16 : 8;
  const int iterations = full_run() ? 60 : 15;
  auto r = run_set_workers(ctx, "set", procs, iterations);
  std::map<std::string, int> expected;
  for (const auto& s : r.sections)
    ++expected[s.name];
  INFO(r.sections.size() << " name-holds by " << procs << " processes, " << r.timeouts
                         << " set acquires timed out (20 s: a deadlock)");
  CHECK(r.timeouts == 0);
  CHECK(check_names(r.sections).empty());
  // Every increment of every name, exactly once: each read the value and wrote it + 1 later, so
  // two holders of one name at once would have lost one.
  std::ostringstream counts;
  for (const auto& kv : r.counters) {
    expected.emplace(kv.first, 0);  // a name no set held: its counter must read 0
    counts << kv.first << ":" << kv.second << " of " << expected.at(kv.first) << " ";
  }
  INFO("per-name counters of holds: " << counts.str());
  CHECK(r.counters == expected);
  long long sets = 0;
  for (const auto& kv : expected)
    sets += kv.second;
  CHECK(sets >= procs * iterations);  // every iteration held at least one name
  CHECK(r.overlapping_sets);          // disjoint sets really ran at the same time
}

// The cycle is forced, not hoped for from random orders: three workers take two names each in
// their own order (0 then 1, 1 then 2, 2 then 0) and meet once each holds its first, so every
// second name is held by the next worker of the cycle, at any speed. No one can go on before
// someone's wait runs out (the watchdog keeps every lease), so at least one times out.
DBLOCK_TEST("negative control: the same names taken one by one in the callers' order deadlock",
            "[lock_set][processes][control]") {
  auto r = run_set_workers(ctx, "one-by-one", 3, 1);
  INFO("workers that waited 2 s in a cycle of holders: " << r.timeouts);
  CHECK(r.timeouts > 0);
}
