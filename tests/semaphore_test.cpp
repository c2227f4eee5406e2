// Semaphores (include/dblock/semaphore.hpp) on every backend: N permits and no more, the declared
// count enforced, permits as leases (expiry, watchdog, fenced writes, kill -9), waiting with
// timeout and cancellation, and processes holding permits concurrently: never more than N at
// once, really N at once (the first N holders wait for each other), per-permit fences strictly
// increasing and per-permit read-then-write counters exact, with a negative control.
#include <signal.h>
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"
#include "waiting_support.hpp"

using dblock::lease_guard;
using dblock::semaphore;
using namespace dblock::test;

namespace {

int declared_permits(const dblock::test::context& ctx, const std::string& name) {
  auto c = ctx.db.connect();
  int n = -1;
  c.session() << "SELECT permits FROM " << ctx.table("semaphore") << " WHERE semaphore_name = :n",
      soci::use(name), soci::into(n);
  return n;
}

// ---- processes holding permits ------------------------------------------------------------------

struct section {
  int slot = -1;
  long long fence = 0;
  long long enter_ns = 0;  // CLOCK_MONOTONIC just after acquire returned
  long long exit_ns = 0;   // CLOCK_MONOTONIC just before release was sent
};

// The most sections open at one instant (exits before enters at equal instants).
int max_concurrency(const std::vector<section>& all) {
  std::vector<std::pair<long long, long long>> spans;
  for (const auto& s : all)
    spans.emplace_back(s.enter_ns, s.exit_ns);
  return most_at_once(spans);
}

// Per permit slot: sections never overlap and fences strictly increase in time order. Returns
// the first problem, empty when none.
std::string check_slots(std::vector<section> all) {
  std::sort(all.begin(), all.end(),
            [](const section& a, const section& b) { return a.enter_ns < b.enter_ns; });
  std::map<int, section> last;
  for (const auto& s : all) {
    auto it = last.find(s.slot);
    if (it != last.end()) {
      if (s.enter_ns < it->second.exit_ns)
        return "slot " + std::to_string(s.slot) + ": fence " + std::to_string(s.fence) +
               " entered before fence " + std::to_string(it->second.fence) + " exited";
      if (s.fence <= it->second.fence)
        return "slot " + std::to_string(s.slot) + ": fence " + std::to_string(s.fence) +
               " granted after fence " + std::to_string(it->second.fence);
    }
    last[s.slot] = s;
  }
  return {};
}

struct run_result {
  std::vector<section> sections;
  std::map<int, int> counters;  // per permit slot: the increments that committed
};

// The sections of each permit slot: what its counter must read.
std::map<int, int> sections_per_slot(const std::vector<section>& all, int declared) {
  std::map<int, int> n;
  for (int slot = 0; slot < declared; ++slot)
    n[slot] = 0;
  for (const auto& s : all)
    ++n[s.slot];
  return n;
}

// "slot:count ..." for a message.
std::string counts(const std::map<int, int>& m) {
  std::ostringstream s;
  for (const auto& kv : m)
    s << kv.first << ":" << kv.second << " ";
  return s.str();
}

// `procs` workers take a permit of `name` (declared with `declared` permits) `iterations` times
// each; holding it, each reads its permit's counter, sleeps `hold_ms` and writes the value + 1 in
// a separate fenced statement, so that two holders of one permit at once lose an increment. With
// `barrier` > 0, a worker holding its first permit waits until `barrier` workers hold theirs.
run_result run_workers(const dblock::test::context& ctx, const std::string& name, int declared,
                       int procs, int iterations, int hold_ms, int barrier) {
  ctx.exec("CREATE TABLE " + ctx.table("counter") + " (id INT PRIMARY KEY, n INT)");
  for (int slot = 0; slot < declared; ++slot)
    ctx.exec("INSERT INTO " + ctx.table("counter") + " (id, n) VALUES (" + std::to_string(slot) +
             ", 0)");
  temp_dir dir("semaphore");
  process_set ps;
  const long long start_ns = monotonic_ns() + 800 * ns_per_ms;  // after every worker connected
  for (int i = 0; i < procs; ++i)
    ps.spawn("semaphore_worker",
             {ctx.url, ctx.prefix, name, std::to_string(declared), std::to_string(iterations),
              std::to_string(start_ns), std::to_string(hold_ms), ctx.table("counter"),
              dir.file("w" + std::to_string(i) + ".log"), std::to_string(barrier)});
  const auto st = ps.wait_all(std::chrono::seconds(240));
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("semaphore worker " << i << " exit status " << st[i]);
    REQUIRE(st[i] == 0);
  }
  run_result r;
  for (int i = 0; i < procs; ++i) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(i) + ".log")));
    section s;
    while (in >> s.slot >> s.fence >> s.enter_ns >> s.exit_ns)
      r.sections.push_back(s);
  }
  auto c = ctx.db.connect();
  for (int slot = 0; slot < declared; ++slot) {
    int n = -1;
    c.session() << "SELECT n FROM " << ctx.table("counter") << " WHERE id = :id", soci::use(slot),
        soci::into(n);
    r.counters[slot] = n;
  }
  return r;
}

// Holders that reach `barrier` each leave a file "<out_file>.held" next to their log; waits up
// to 5 s (half the TTL) until `barrier` such files exist, then says on stderr that they did not.
void wait_at_barrier(const std::string& out_file, int barrier) {
  write_file_atomic(out_file + ".held", "");
  const auto dir = std::filesystem::path(out_file).parent_path();
  const long long until = monotonic_ns() + 5000 * ns_per_ms;
  for (;;) {
    int arrived = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".held") ++arrived;
    if (arrived >= barrier) return;
    if (monotonic_ns() > until) {
      std::cerr << "semaphore_worker: " << arrived << " of " << barrier
                << " holders at the barrier after 5 s\n";
      return;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
}

}  // namespace

// args: url prefix name permits iterations start_ns hold_ms counter_table out_file barrier
DBLOCK_WORKER(semaphore_worker) {
  const std::string name = args.at(2);
  const int permits = std::stoi(args.at(3));
  const int iterations = std::stoi(args.at(4));
  const long long start_ns = std::stoll(args.at(5));
  const int hold_ms = std::stoi(args.at(6));
  const std::string table = args.at(7);
  const int barrier = std::stoi(args.at(9));
  auto db = open_db(args.at(0), args.at(1), 3);
  db.ping();
  const auto lo = polling_lease(std::chrono::seconds(10), milliseconds(10));
  semaphore sem(db, name, permits, lo);
  std::ostringstream out;
  sleep_until_monotonic(start_ns);
  for (int i = 0; i < iterations; ++i) {
    auto g = sem.acquire(std::chrono::seconds(120));
    section s;
    s.enter_ns = monotonic_ns();
    s.slot = semaphore::permit_slot(g);
    s.fence = g.fence();
    int n = -1;
    {
      auto c = db.connect();
      c.session() << "SELECT n FROM " << table << " WHERE id = :id", soci::use(s.slot),
          soci::into(n);
    }
    if (i == 0 && barrier > 0) wait_at_barrier(args.at(8), barrier);
    std::this_thread::sleep_for(milliseconds(hold_ms));
    g.fenced([&](soci::session& sql) {
      const int next = n + 1;
      sql << "UPDATE " << table << " SET n = :n WHERE id = :id", soci::use(next), soci::use(s.slot);
    });
    s.exit_ns = monotonic_ns();
    g.release();
    out << s.slot << " " << s.fence << " " << s.enter_ns << " " << s.exit_ns << "\n";
  }
  write_file_atomic(args.at(8), out.str());
  return 0;
}

DBLOCK_TEST("semaphore: N permits and no more; a released permit is taken again", "[semaphore]") {
  const std::string name = unique_name("pool");
  semaphore a(ctx.db, name, 3), b(ctx.db, name, 3);
  std::vector<lease_guard> held;
  std::set<int> slots;
  for (int i = 0; i < 3; ++i) {
    auto g = (i % 2 ? b : a).try_acquire();
    REQUIRE(g);
    CHECK(g->fence() > 0);
    CHECK(g->owner_token().size() == 32);
    slots.insert(semaphore::permit_slot(*g));
    held.push_back(std::move(*g));
  }
  CHECK(slots == std::set<int>{0, 1, 2});  // three distinct permits
  CHECK_FALSE(a.try_acquire());            // a fourth: none
  CHECK_FALSE(b.try_acquire());
  CHECK(declared_permits(ctx, name) == 3);
  const int freed = semaphore::permit_slot(held[1]);
  const long long old_fence = held[1].fence();
  held[1].release();
  auto again = b.try_acquire();
  REQUIRE(again);
  CHECK(semaphore::permit_slot(*again) == freed);
  CHECK(again->fence() > old_fence);  // the permit's fence only grows
  CHECK_FALSE(a.try_acquire());
  // A plain lease_lock guard is no permit.
  dblock::lease_lock plain(ctx.db, name);
  auto pg = plain.try_acquire();
  REQUIRE(pg);
  CHECK(semaphore::permit_slot(*pg) == -1);
  CHECK_FALSE(a.try_acquire());  // the lock of the same name holds no permit
}

DBLOCK_TEST("semaphore: another permit count is refused, never a silent resize", "[semaphore]") {
  const std::string name = unique_name("declared");
  semaphore three(ctx.db, name, 3);
  auto g = three.try_acquire();
  REQUIRE(g);
  semaphore four(ctx.db, name, 4);
  try {
    (void)four.try_acquire();
    FAIL("a semaphore of 4 permits was accepted where 3 were declared");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::invalid_argument);
    const std::string m = e.what();
    CHECK(m.find("declared with 3 permits, not 4") != std::string::npos);
  }
  CHECK(code_of([&] { (void)four.acquire(milliseconds(100)); }) == errc::invalid_argument);
  CHECK(declared_permits(ctx, name) == 3);
  semaphore again(ctx.db, name, 3);
  CHECK(again.try_acquire());  // the declared count still works
}

DBLOCK_TEST("semaphore: bad names, counts and options are refused clearly", "[semaphore]") {
  auto bad = [&](const std::string& name, int permits, dblock::lease_options lo = {}) {
    return code_of([&] { semaphore s(ctx.db, name, permits, lo); });
  };
  CHECK(bad("", 1) == errc::invalid_argument);
  CHECK(bad("x", 0) == errc::invalid_argument);
  CHECK(bad("x", dblock::max_semaphore_permits + 1) == errc::invalid_argument);
  CHECK(bad("a\xEF\xBF\xBF"
            "0",
            1) == errc::invalid_argument);  // U+FFFF is reserved
  CHECK(bad(std::string(250, 'n'), 1) == errc::invalid_argument);
  dblock::lease_options short_ttl;
  short_ttl.ttl = milliseconds(1);
  CHECK(bad("x", 2, short_ttl) == errc::invalid_argument);
  // No user lock can name a permit's row.
  CHECK(code_of([&] {
          dblock::lease_lock l(ctx.db,
                               "p\xEF\xBF\xBF"
                               "1");
        }) == errc::invalid_argument);
  // The longest name fits the lock table with the permit suffix, on every backend.
  const std::string longest(249, 'L');
  semaphore s(ctx.db, longest, dblock::max_semaphore_permits);
  auto g = s.try_acquire();
  REQUIRE(g);
  CHECK(g->name().size() == 249 + 3 + std::to_string(semaphore::permit_slot(*g)).size());
}

DBLOCK_TEST("semaphore: acquire waits for a released permit, times out, is cancelled",
            "[semaphore]") {
  const std::string name = unique_name("wait");
  semaphore holder(ctx.db, name, 2);
  auto g1 = holder.try_acquire();
  auto g2 = holder.try_acquire();
  REQUIRE(g1);
  REQUIRE(g2);
  semaphore waiter(ctx.db, name, 2);
  auto g3 = check_wait_ends(
      ctx.db, [&](const auto&... args) { return waiter.acquire(args...); }, [&] { g2->release(); });
}

DBLOCK_TEST("semaphore: a permit never released comes back when its lease expires, not before",
            "[semaphore]") {
  const std::string name = unique_name("expiry");
  dblock::lease_options lo;
  lo.ttl = milliseconds(600);
  semaphore holder(ctx.db, name, 1, lo);
  const long long bound = liveness_bound_ms(2500, median_round_trip_us(ctx.db));
  const long long t0 = monotonic_ns();
  auto g = holder.try_acquire();  // kept, never released: as if its holder had died
  REQUIRE(g);
  semaphore other(ctx.db, name, 1, lo);
  auto g2 = other.acquire(std::chrono::seconds(20));
  const long long after_ms = (monotonic_ns() - t0) / ns_per_ms;
  INFO("taken over " << after_ms << " ms after the first acquire (ttl 600 ms, bound " << bound
                     << " ms)");
  CHECK(after_ms >= 550);   // the database's clock and ours tick alike on one host
  CHECK(after_ms < bound);  // the TTL, the waiter's poll and the machine's pace
  CHECK(g2.fence() > g->fence());
  CHECK(code_of([&] { g->release(); }) == errc::lease_lost);
}

DBLOCK_TEST("semaphore: the watchdog keeps a permit past its ttl; fenced writes need it",
            "[semaphore]") {
  const std::string name = unique_name("watchdog");
  ctx.exec("CREATE TABLE " + ctx.table("items") + " (id INT PRIMARY KEY)");
  // Renewals every third of the TTL keep the permit only if the machine runs the watchdog in
  // time: a run that lost it only that way runs again with twice and four times the TTL.
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const std::string n = name + "-" + std::to_string(scale);
    dblock::lease_options lo;
    lo.ttl = milliseconds(1000 * scale);
    lo.watchdog = true;
    semaphore s(ctx.db, n, 1, lo);
    auto g = s.try_acquire();
    REQUIRE(g);
    std::this_thread::sleep_for(lo.ttl * 16 / 5);  // over 3 ttl: renewed meanwhile
    const bool kept = g->valid();
    semaphore other(ctx.db, n, 1, lo);
    const bool taken = kept && other.try_acquire().has_value();
    if (!last && (!kept || taken)) return {"the permit was not kept past its TTL"};
    CHECK(kept);
    CHECK_FALSE(taken);
    g->fenced(
        [&](soci::session& sql) { sql << "INSERT INTO " << ctx.table("items") << " VALUES (1)"; });
    return {};
  });
  // A stale permit cannot write: take it over with a short lease that is never renewed.
  dblock::lease_options short_lo;
  short_lo.ttl = milliseconds(200);
  semaphore brief(ctx.db, name + "-b", 1, short_lo);
  auto stale = brief.try_acquire();
  REQUIRE(stale);
  std::this_thread::sleep_for(milliseconds(400));
  semaphore taker(ctx.db, name + "-b", 1, short_lo);
  auto fresh = taker.try_acquire();
  REQUIRE(fresh);
  CHECK(code_of([&] {
          stale->fenced([&](soci::session& sql) {
            sql << "INSERT INTO " << ctx.table("items") << " VALUES (2)";
          });
        }) == errc::lease_lost);
  auto c = ctx.db.connect();
  int n = -1;
  c.session() << "SELECT count(*) FROM " << ctx.table("items"), soci::into(n);
  CHECK(n == 1);
}

DBLOCK_TEST("semaphore: processes on 3 permits: never more than 3 holders, really 3",
            "[semaphore][process]") {
  const int procs = full_run() ? 16 : 8;
  const int iterations = full_run() ? 60 : 20;
  const std::string name = unique_name("procs");
  // The first three holders wait for each other while holding: 3 at once, if 3 can hold.
  const auto r = run_workers(ctx, name, 3, procs, iterations, 5, 3);
  REQUIRE(r.sections.size() == static_cast<std::size_t>(procs * iterations));
  const int most = max_concurrency(r.sections);
  INFO("at most " << most << " holders at once");
  CHECK(most <= 3);
  CHECK(most >= 3);  // permits are really held concurrently: all three at once
  CHECK(check_slots(r.sections) == "");
  // Per permit, read then write the value + 1: two holders of one permit at once lose one.
  const auto expected = sections_per_slot(r.sections, 3);
  INFO("per-permit counters " << counts(r.counters) << "; sections per permit "
                              << counts(expected));
  CHECK(r.counters == expected);
  std::set<int> slots;
  for (const auto& s : r.sections)
    slots.insert(s.slot);
  CHECK(slots == std::set<int>{0, 1, 2});
}

// The same workload with the count ignored (every worker's semaphore has 16 permits): the
// parent's check for 3 must catch it. The first holds meet at a barrier of 4, so 4 are in at
// once at any speed of the machine (without it, slow starts could leave them one after another).
DBLOCK_TEST("negative control: processes ignoring N are caught holding more than 3",
            "[semaphore][process][control]") {
  const std::string name = unique_name("control");
  const auto r = run_workers(ctx, name, 16, 8, 5, 30, 4);
  const int most = max_concurrency(r.sections);
  INFO("at most " << most << " holders at once");
  CHECK(most > 3);
  CHECK(check_slots(r.sections) == "");  // per permit still exclusive
  const auto expected = sections_per_slot(r.sections, 16);
  INFO("per-permit counters " << counts(r.counters) << "; sections per permit "
                              << counts(expected));
  CHECK(r.counters == expected);
}

// args: url prefix name ttl_ms ready_file
DBLOCK_WORKER(semaphore_holder) {
  auto db = open_db(args.at(0), args.at(1), 2);
  dblock::lease_options lo;
  lo.ttl = milliseconds(std::stoi(args.at(3)));
  lo.watchdog = true;  // renewed until killed
  semaphore s(db, args.at(2), 1, lo);
  auto g = s.acquire(std::chrono::seconds(30));
  write_file_atomic(args.at(4), std::to_string(g.fence()));
  for (;;)
    std::this_thread::sleep_for(std::chrono::seconds(1));
}

DBLOCK_TEST("semaphore: the permit of a kill -9ed holder comes back within its TTL, not before",
            "[semaphore][process]") {
  // The holder must keep its permit past one TTL on its watchdog alone, and the takeover come
  // within a TTL and a poll of the kill: both are the pace of the machine too, so a run that
  // missed only them runs again with twice and four times the TTL. "Not before" holds at any pace.
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const std::string name = unique_name("killed");
    const int ttl_ms = 1000 * scale;
    temp_dir dir("semaphore-kill");
    process_set ps;
    const int pid = ps.spawn(
        "semaphore_holder", {ctx.url, ctx.prefix, name, std::to_string(ttl_ms), dir.file("ready")});
    REQUIRE(wait_for_file(dir.file("ready"), std::chrono::seconds(30)));
    const long long held_fence = std::stoll(read_file(dir.file("ready")));
    std::this_thread::sleep_for(milliseconds(ttl_ms * 3 / 2));  // past one ttl: renewed
    dblock::lease_options lo;
    lo.ttl = milliseconds(ttl_ms);
    lo.poll_max = milliseconds(50);
    semaphore s(ctx.db, name, 1, lo);
    const bool taken = s.try_acquire().has_value();
    if (!last && taken) {
      ::kill(pid, SIGKILL);
      return {"the holder's watchdog did not keep its permit past the TTL"};
    }
    CHECK_FALSE(taken);  // still held by the renewing holder
    const std::string row = semaphore::permit_lease_name(name, 0);
    const auto before = dblock::test::read_lease(ctx.db.connect(), row);
    REQUIRE(before);
    const long long bound = ttl_ms + scaled_bound_ms(ctx.db, 1000);  // TTL + one poll + slack
    const long long killed = monotonic_ns();
    ::kill(pid, SIGKILL);
    auto g = s.acquire(std::chrono::seconds(20 * scale));
    const long long after_ms = (monotonic_ns() - killed) / ns_per_ms;
    INFO("taken over " << after_ms << " ms after the kill (ttl " << ttl_ms << " ms); bound "
                       << bound << " ms");
    CHECK(g.fence() > held_fence);
    // Never before the holder's lease ran out, on the database clock: the takeover's acquired_at
    // is at or after the expiry seen before the kill (a later renewal only moves it later).
    const auto after = dblock::test::read_lease(ctx.db.connect(), row);
    REQUIRE(after);
    CHECK(after->fence == g.fence());
    CHECK(after->acquired_at_us >= before->expires_at_us);
    if (!last && after_ms > bound)
      return {"taken over " + std::to_string(after_ms) + " ms after the kill, bound " +
              std::to_string(bound) + " ms"};
    CHECK(after_ms <= bound);
    return {};
  });
}
