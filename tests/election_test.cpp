// Leader election (include/dblock/election.hpp) on every backend: one leader at a time, observed
// with its identity, fence and since; resign hands over at once; campaigns wait, time out and are
// cancelled; lost() fires when the lease is taken away and when no renewal is confirmed before
// the local validity ends (renewals held back by a real row lock); and repeated kill -9 of the
// leader process: the fenced writes, in commit order (a counter row each one reads and increments),
// are never lost and never come from an older leader than the one before, fences grow, takeover
// after the old lease's expiry on the database clock and within TTL + one poll.
#include <signal.h>
#include <soci/soci.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"
#include "rows.hpp"
#include "waiting_support.hpp"

using dblock::election;
using dblock::leadership;
using namespace dblock::test;

namespace {

// One counted write (as the fault suite's): reads the counter row, writes it back incremented and
// logs the new value with `fence`. Run inside a transaction (a fenced one, by the leaders).
void counted_write(soci::session& sql, const std::string& counter, const std::string& items,
                   long long fence) {
  long long n = 0;
  sql << "SELECT n FROM " << counter << " WHERE id = 1", soci::into(n);
  const long long next = n + 1;
  sql << "UPDATE " << counter << " SET n = :n WHERE id = 1", soci::use(next);
  sql << "INSERT INTO " << items << " (n, fence) VALUES (:n, :f)", soci::use(next),
      soci::use(fence);
}

}  // namespace

DBLOCK_TEST("election: one leader, observed with identity, fence and since; resign hands over",
            "[election]") {
  const std::string name = unique_name("primary");
  election a(ctx.db, name, "node-a http://10.0.0.1:8080"), b(ctx.db, name, "node-b");
  CHECK_FALSE(election::observe(ctx.db, name));  // nobody yet
  const auto before = std::chrono::system_clock::now();
  auto la = a.try_campaign();
  REQUIRE(la);
  CHECK(la->valid());
  CHECK_FALSE(la->lost().cancelled());
  CHECK(la->identity() == "node-a http://10.0.0.1:8080");
  CHECK_FALSE(b.try_campaign());  // one leader at a time
  auto seen = election::observe(ctx.db, name);
  REQUIRE(seen);
  CHECK(seen->identity == "node-a http://10.0.0.1:8080");
  CHECK(seen->fence == la->fence());
  CHECK(seen->holder_pid == ::getpid());
  CHECK(seen->expires_in > milliseconds(0));
  CHECK(seen->since > before - std::chrono::seconds(5));  // the database clock, on this host
  CHECK(seen->since < std::chrono::system_clock::now() + std::chrono::seconds(5));
  // A lock named like the election is another row.
  dblock::lease_lock same_name(ctx.db, name);
  CHECK(same_name.try_acquire());
  CHECK(election::election_of(election::lease_name(name)) == name);
  CHECK_FALSE(election::election_of(name));
  const std::int64_t first = la->fence();
  la->resign();
  CHECK_FALSE(la->valid());
  CHECK(la->lost().cancelled());
  CHECK(code_of([&] { la->resign(); }) == errc::not_owner);
  CHECK_FALSE(election::observe(ctx.db, name));  // resigned: no leader
  auto lb = b.try_campaign();                    // at once, no expiry to wait for
  REQUIRE(lb);
  CHECK(lb->fence() > first);
  seen = election::observe(ctx.db, name);
  REQUIRE(seen);
  CHECK(seen->identity == "node-b");
  CHECK(seen->fence == lb->fence());
}

DBLOCK_TEST("election: a campaign waits, times out, is cancelled, and wins on a resignation",
            "[election]") {
  const std::string name = unique_name("wait");
  election a(ctx.db, name, "a"), b(ctx.db, name, "b");
  auto la = a.try_campaign();
  REQUIRE(la);
  auto lb = check_wait_ends(
      ctx.db, [&](const auto&... args) { return b.campaign(args...); }, [&] { la->resign(); });
  auto seen = election::observe(ctx.db, name);
  REQUIRE(seen);
  CHECK(seen->identity == "b");
}

DBLOCK_TEST("election: bad names and identities are refused clearly", "[election]") {
  auto bad = [&](const std::string& name, const std::string& identity) {
    return code_of([&] { election e(ctx.db, name, identity); });
  };
  CHECK(bad("", "x") == errc::invalid_argument);
  CHECK(bad("e", "") == errc::invalid_argument);
  CHECK(bad("e", std::string(dblock::max_leader_identity_bytes + 1, 'i')) ==
        errc::invalid_argument);
  CHECK(bad("e", std::string("a\0b", 3)) == errc::invalid_argument);
  CHECK(bad("e", "\xff\xfe") == errc::invalid_argument);
  CHECK(bad(std::string(252, 'n'), "x") == errc::invalid_argument);
  CHECK(bad("p\xEF\xBF\xBF"
            "L",
            "x") == errc::invalid_argument);
  CHECK(code_of([&] { (void)election::observe(ctx.db, ""); }) == errc::invalid_argument);
  // The longest name and identity fit every backend's columns.
  const std::string longest(251, 'N');
  election e(ctx.db, longest, std::string(dblock::max_leader_identity_bytes, 'I'));
  auto l = e.try_campaign();
  REQUIRE(l);
  auto seen = election::observe(ctx.db, longest);
  REQUIRE(seen);
  CHECK(seen->identity.size() == dblock::max_leader_identity_bytes);
}

DBLOCK_TEST("election: lost() fires and on_lost is called when the leadership is taken away",
            "[election]") {
  // The leadership must outlive its TTL on renewals alone, and lost() must fire within a renewal
  // period of the forced release: both are the pace of the machine too, so a run that missed only
  // them runs again with twice and four times the TTL.
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const std::string name = unique_name("taken");
    std::atomic<int> on_lost{0};
    dblock::lease_options lo;
    lo.ttl = milliseconds(1500 * scale);  // renewed every 500 ms at scale 1
    lo.on_lost = [&](const dblock::error&) { ++on_lost; };
    election a(ctx.db, name, "a", lo);
    auto la = a.try_campaign();
    REQUIRE(la);
    std::this_thread::sleep_for(lo.ttl * 6 / 5);  // over the ttl: the watchdog renews
    const bool kept = la->valid() && !la->lost().cancelled();
    if (!last && !kept) return {"the leadership was not kept past its TTL"};
    CHECK(la->valid());
    CHECK_FALSE(la->lost().cancelled());
    // The next renewal finds the leadership gone: within a renewal period, plus the slack of
    // the machine's pace now.
    const long long bound = liveness_bound_ms(500 * scale, median_round_trip_us(ctx.db));
    const long long t0 = monotonic_ns();
    dblock::force_release(ctx.db, election::lease_name(name), "test: depose the leader", "test");
    CHECK(la->lost().sleep_for(std::chrono::seconds(30)));  // fired
    const long long fired_ms = (monotonic_ns() - t0) / ns_per_ms;
    INFO("lost() fired " << fired_ms << " ms after the forced release (watchdog every "
                         << 500 * scale << " ms, bound " << bound << " ms)");
    CHECK_FALSE(la->valid());
    CHECK(on_lost == 1);
    CHECK(code_of([&] { la->fenced([](soci::session&) {}); }) == errc::lease_lost);
    election b(ctx.db, name, "b", lo);
    CHECK(b.try_campaign());  // the forced release freed it
    if (!last && fired_ms >= bound)
      return {"lost() fired " + std::to_string(fired_ms) + " ms after the release, bound " +
              std::to_string(bound) + " ms"};
    CHECK(fired_ms < bound);
    return {};
  });
}

DBLOCK_TEST("election: lost() fires at the local validity deadline when renewals are held back",
            "[election]") {
  // "Not before the validity ran out" holds at any pace. "Before the database's expiry" has the
  // margin (250 ms) as slack for the watchdog's thread, and needs the blocker in before the
  // first renewal: on a loaded machine either can miss, so such a run goes again with twice and
  // four times the TTL and margin.
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const std::string name = unique_name("stalled");
    std::atomic<int> on_lost{0};
    dblock::lease_options lo;
    lo.ttl = milliseconds(1000 * scale);
    lo.safety_margin = milliseconds(250 * scale);
    lo.on_lost = [&](const dblock::error&) { ++on_lost; };
    election a(ctx.db, name, "a", lo);
    const long long t_sent = monotonic_ns();  // before the acquire request was sent
    auto la = a.try_campaign();
    REQUIRE(la);
    auto seen = election::observe(ctx.db, name);
    REQUIRE(seen);
    const long long t_read = monotonic_ns();
    const long long db_expiry_ns = t_read + seen->expires_in.count() * ns_per_ms;  // at the latest
    // Another session locks the leadership row (SQLite: the whole database) before the first
    // renewal (at ttl/3) and keeps it: no renewal can be confirmed.
    auto blocker = ctx.db.connect();
    auto& sql = blocker.session();
    if (ctx.backend == "sqlite") {
      sql << "BEGIN IMMEDIATE";
    } else {
      sql << "BEGIN";
      int one = 0;
      const std::string lease = election::lease_name(name);
      sql << "SELECT 1 FROM " << ctx.db.lock_table() << " WHERE resource_name = :n FOR UPDATE",
          soci::use(lease), soci::into(one);
    }
    REQUIRE(la->lost().sleep_for(std::chrono::seconds(10 * scale)));
    const long long fired = monotonic_ns();
    sql << "ROLLBACK";
    INFO("fired " << (fired - t_sent) / ns_per_ms << " ms after the acquire was sent (ttl "
                  << lo.ttl.count() << ", margin " << lo.safety_margin.count()
                  << "); the lease expired on the database " << (db_expiry_ns - fired) / ns_per_ms
                  << " ms later at the latest");
    // Not before the validity ran out.
    CHECK((fired - t_sent) / ns_per_ms >= (lo.ttl - lo.safety_margin).count() - 50);
    CHECK_FALSE(la->valid());
    CHECK(on_lost == 1);
    if (!last && fired >= db_expiry_ns)
      return {"fired " + std::to_string((fired - db_expiry_ns) / ns_per_ms) +
              " ms after the database's expiry"};
    CHECK(fired < db_expiry_ns);  // before another candidate could win
    return {};
  });
}

// ---- kill -9 of the leader, repeatedly ----------------------------------------------------------

// args: url prefix name counter_table items_table identity. Campaigns forever; while leader, one
// fenced write every 20 ms until lost() fires: it reads the counter row, writes it back
// incremented and logs the new value with its fence, all in the fenced transaction. The counter
// values are the commit order of the writes (an auto-increment id is the insert order, which a
// transaction that commits later can hold too).
DBLOCK_WORKER(election_worker) {
  auto db = open_db(args.at(0), args.at(1), 3);
  const std::string counter = args.at(3), items = args.at(4);
  dblock::lease_options lo;
  lo.ttl = milliseconds(1000);
  lo.poll_initial = milliseconds(5);
  lo.poll_max = milliseconds(50);
  election e(db, args.at(2), args.at(5), lo);
  for (;;) {
    try {
      auto l = e.campaign(std::chrono::seconds(60));
      const long long f = l.fence();
      while (!l.lost().cancelled()) {
        l.fenced([&](soci::session& sql) { counted_write(sql, counter, items, f); });
        l.lost().sleep_for(milliseconds(20));
      }
    } catch (const dblock::error& e2) {
      if (e2.code() != errc::lease_lost && e2.code() != errc::timeout) return 1;
    }
  }
}

namespace {

// The fenced writes in commit order: (counter value, fence) pairs. Each write set the counter to
// its value in the transaction that logged it, so the values are 1..counter exactly, once each
// (a value twice is a lost update: two writers read the same counter), and a leader's writes
// never come after a newer leader's: the fences never decrease along the counter values. The
// first problem, empty when none.
std::string check_write_order(long long counter,
                              std::vector<std::pair<long long, long long>> writes) {
  std::stable_sort(writes.begin(), writes.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  if (counter != static_cast<long long>(writes.size()))
    return "counter " + std::to_string(counter) + " but " + std::to_string(writes.size()) +
           " logged writes";
  for (std::size_t i = 0; i < writes.size(); ++i) {
    if (writes[i].first != static_cast<long long>(i) + 1)
      return "write #" + std::to_string(i + 1) + " has counter value " +
             std::to_string(writes[i].first) + " (a value twice is a lost update)";
    if (i > 0 && writes[i].second < writes[i - 1].second)
      return "stale write: fence " + std::to_string(writes[i].second) +
             " committed counter value " + std::to_string(writes[i].first) + " after fence " +
             std::to_string(writes[i - 1].second);
  }
  return {};
}

// The counter and the logged writes, read back in one transaction (behind a transaction-mode
// pooler the prepared statement and its execution must reach one server session).
std::pair<long long, std::vector<std::pair<long long, long long>>> read_writes(
    const dblock::test::context& ctx, const std::string& counter, const std::string& items) {
  std::pair<long long, std::vector<std::pair<long long, long long>>> out{-1, {}};
  auto c = ctx.db.connect();
  soci::transaction tr(c.session());
  c.session() << "SELECT n FROM " << counter << " WHERE id = 1", soci::into(out.first);
  {
    soci::rowset<soci::row> rows =
        (c.session().prepare << "SELECT n, fence FROM " << items << " ORDER BY n");
    for (const auto& r : rows)
      out.second.emplace_back(dblock::test::row_int(r, 0), dblock::test::row_int(r, 1));
  }
  tr.commit();
  return out;
}

}  // namespace

TEST_CASE("election: the write-order check catches a stale leader's write and a lost update",
          "[unit][election]") {
  CHECK(check_write_order(5, {{1, 1}, {2, 1}, {3, 2}, {4, 2}, {5, 3}}) == "");
  CHECK(check_write_order(3, {{3, 4}, {1, 2}, {2, 2}}) == "");  // read in any order
  // Negative controls: a stale fence (2) written after a newer one (3); a lost update; a write
  // the log is missing.
  CHECK(check_write_order(4, {{1, 2}, {2, 3}, {3, 2}, {4, 3}}) ==
        "stale write: fence 2 committed counter value 3 after fence 3");
  CHECK(check_write_order(2, {{1, 2}, {2, 2}, {2, 3}}) == "counter 2 but 3 logged writes");
  CHECK(check_write_order(3, {{1, 2}, {2, 2}, {2, 3}}) ==
        "write #3 has counter value 2 (a value twice is a lost update)");
  CHECK(check_write_order(3, {{1, 2}, {2, 3}}) == "counter 3 but 2 logged writes");
}

DBLOCK_TEST("election: kill -9 of the leader, repeatedly: one leader at a time, takeover in time",
            "[election][processes]") {
  const std::string name = unique_name("killed");
  const std::string counter = ctx.table("counter"), items = ctx.table("items");
  ctx.exec("CREATE TABLE " + counter + " (id INT PRIMARY KEY, n BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + counter + " (id, n) VALUES (1, 0)");
  // No key on n: a value written twice (a lost update) is logged, not refused.
  ctx.exec("CREATE TABLE " + items + " (n BIGINT NOT NULL, fence BIGINT NOT NULL)");
  process_set ps;
  std::vector<int> pids;
  int spawned = 0;
  auto spawn = [&] {
    pids.push_back(ps.spawn("election_worker", {ctx.url, ctx.prefix, name, counter, items,
                                                "candidate-" + std::to_string(spawned++)}));
  };
  for (int i = 0; i < 3; ++i)
    spawn();
  const int kills = full_run() ? 10 : 4;
  std::vector<long long> leader_fences;
  const std::string lease = election::lease_name(name);
  auto writes_by = [&](long long fence) {
    auto c = ctx.db.connect();
    int n = 0;
    c.session() << "SELECT count(*) FROM " << items << " WHERE fence = :f", soci::use(fence),
        soci::into(n);
    return n;
  };
  for (int k = 0; k <= kills; ++k) {
    // A leader that announced itself and wrote.
    std::optional<dblock::leader_info> cur;
    const long long give_up = monotonic_ns() + 30000 * ns_per_ms;
    while (monotonic_ns() < give_up) {
      cur = election::observe(ctx.db, name);
      if (cur && !cur->identity.empty() && writes_by(cur->fence) >= 3) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    REQUIRE(cur);
    REQUIRE(!cur->identity.empty());
    if (!leader_fences.empty()) CHECK(cur->fence > leader_fences.back());
    leader_fences.push_back(cur->fence);
    if (k == kills) break;
    auto before = dblock::test::read_lease(ctx.db.connect(), lease);
    REQUIRE(before);
    REQUIRE(before->fence == cur->fence);
    // TTL + one poll on a quiet machine (as 1000 + 1000 ms before), more at a slower pace.
    const long long takeover_bound_ms = scaled_bound_ms(ctx.db, 1000 + 1000);
    ::kill(static_cast<pid_t>(cur->holder_pid), SIGKILL);
    spawn();  // keep three candidates
    decltype(before) after;
    const long long wait_end = monotonic_ns() + 30000 * ns_per_ms;
    while (monotonic_ns() < wait_end) {
      after = dblock::test::read_lease(ctx.db.connect(), lease);
      if (after && after->fence > before->fence && after->hold_count > 0) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    REQUIRE(after);
    REQUIRE(after->fence > before->fence);
    // Never before the killed leader's lease expired (it may have renewed once more after our
    // read: its real expiry is at or after the one read), and within TTL + one poll of it.
    INFO("takeover " << (after->acquired_at_us - before->expires_at_us) / 1000
                     << " ms after the expiry read before the kill; bound " << takeover_bound_ms
                     << " ms");
    CHECK(after->acquired_at_us >= before->expires_at_us);
    CHECK(after->acquired_at_us <= before->expires_at_us + takeover_bound_ms * 1000LL);
  }
  // Stop every candidate before the history is read: no write can come after it.
  for (int pid : pids) {
    ::kill(pid, SIGKILL);
    ps.wait(pid, std::chrono::seconds(30));
  }
  auto [n, writes] = read_writes(ctx, counter, items);
  REQUIRE(!writes.empty());
  INFO(writes.size() << " fenced writes, counter " << n << ", " << leader_fences.size()
                     << " leaders observed");
  CHECK(check_write_order(n, writes) == "");
  std::set<long long> writers;
  for (const auto& w : writes)
    writers.insert(w.second);
  for (long long f : leader_fences)
    CHECK(writers.count(f) == 1);  // every observed leader wrote
  // Negative control, through the same tables and read-back: the first leader's fence writes once
  // more, now (unfenced, as a deposed leader whose writes were not fenced would), and the check
  // reports the stale write.
  {
    auto c = ctx.db.connect();
    soci::transaction tr(c.session());
    counted_write(c.session(), counter, items, leader_fences.front());
    tr.commit();
  }
  auto [n2, stale] = read_writes(ctx, counter, items);
  CHECK(check_write_order(n2, stale) == "stale write: fence " +
                                            std::to_string(leader_fences.front()) +
                                            " committed counter value " + std::to_string(n2) +
                                            " after fence " + std::to_string(writes.back().second));
}

// ---- following the leadership (await_change, watch) ---------------------------------------------

namespace {

using dblock::leader_info;
using steady = std::chrono::steady_clock;

// A candidate in another process: wins within 10 s, holds `hold_ms`, resigns.
DBLOCK_WORKER(resigning_leader) {
  auto db = open_db(args.at(0), args.at(1), 2);
  election e(db, args.at(2), args.at(3));
  auto l = e.campaign(std::chrono::seconds(10));
  std::this_thread::sleep_for(milliseconds(std::stoll(args.at(4))));
  l.resign();
  return 0;
}

// args: url prefix name identity hold_ms ttl_ms resign|crash out_file min_left_ms
// A candidate in another process with a lease of `ttl_ms`: wins within 10 s, holds `hold_ms`,
// then resigns ("resign") or dies without a word ("crash": its lease runs out at its TTL). A
// crash waits first until the leadership has at least `min_left_ms` left (remaining(), a
// conservative count: the lease lives at least that long after it was asked). Writes
// "<won> <end> <left_ms>" to `out_file` just before it ends (CLOCK_MONOTONIC ns: when the
// campaign returned, when it resigned or crashed, and remaining() asked at `end`; 0 for a
// resignation).
DBLOCK_WORKER(short_leader) {
  auto db = open_db(args.at(0), args.at(1), 2);
  dblock::lease_options o;
  o.ttl = milliseconds(std::stoll(args.at(5)));
  election e(db, args.at(2), args.at(3), o);
  auto l = e.campaign(std::chrono::seconds(10));
  const long long won = monotonic_ns();
  std::this_thread::sleep_for(milliseconds(std::stoll(args.at(4))));
  const bool crash = args.at(6) == "crash";
  const long long give_up = monotonic_ns() + 60000 * ns_per_ms;
  while (crash && l.remaining() < milliseconds(std::stoll(args.at(8)))) {
    if (monotonic_ns() > give_up) return 5;
    std::this_thread::sleep_for(milliseconds(5));
  }
  const long long end = monotonic_ns();
  const long long left_ms = crash ? l.remaining().count() : 0;
  write_file_atomic(args.at(7), std::to_string(won) + " " + std::to_string(end) + " " +
                                    std::to_string(left_ms) + "\n");
  if (crash) std::_Exit(0);
  l.resign();
  return 0;
}

std::string shown(const std::optional<leader_info>& l) {
  return l ? l->identity + "@" + std::to_string(l->fence) : std::string("none");
}

}  // namespace

DBLOCK_TEST("election: await_change is woken at once by changes in this process; nothing else",
            "[election]") {
  const std::string name = unique_name("await");
  const auto hour = std::chrono::hours(1);  // the poll: only a wake-up can end these waits early
  // Control: with no change the wait runs to its deadline.
  auto t0 = steady::now();
  CHECK(code_of([&] {
          (void)election::await_change(ctx.db, name, std::nullopt,
                                       steady::now() + milliseconds(300), {}, hour);
        }) == errc::timeout);
  const auto quiet = steady::now() - t0;
  CHECK(quiet >= milliseconds(300));
  // A win through another handle of this process.
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  auto other = ctx.open();
  election a(other, name, "here-a");
  auto won = std::async(std::launch::async, [&] {
    return election::await_change(ctx.db, name, std::nullopt,
                                  steady::now() + std::chrono::seconds(20), {}, hour);
  });
  std::this_thread::sleep_for(milliseconds(200));
  t0 = steady::now();
  auto l = a.try_campaign();
  REQUIRE(l);
  const auto seen = won.get();
  const auto after_win = steady::now() - t0;
  INFO("seen " << shown(seen) << " " << std::chrono::duration_cast<milliseconds>(after_win).count()
               << " ms after the win; bound " << bound << " ms");
  REQUIRE(seen);
  CHECK(seen->fence == l->fence());
  CHECK(seen->identity == "here-a");
  CHECK(after_win < milliseconds(bound));
  // The resignation, likewise.
  auto gone = std::async(std::launch::async, [&] {
    return election::await_change(ctx.db, name, seen, steady::now() + std::chrono::seconds(20), {},
                                  hour);
  });
  std::this_thread::sleep_for(milliseconds(200));
  t0 = steady::now();
  l->resign();
  CHECK_FALSE(gone.get());
  const auto after_resign = steady::now() - t0;
  INFO("gone " << std::chrono::duration_cast<milliseconds>(after_resign).count()
               << " ms after the resignation");
  CHECK(after_resign < milliseconds(bound));
  // Cancelled.
  dblock::cancellation cancel;
  auto waiting = std::async(std::launch::async, [&] {
    return code_of([&] {
      (void)election::await_change(ctx.db, name, std::nullopt, steady::time_point::max(), cancel,
                                   hour);
    });
  });
  std::this_thread::sleep_for(milliseconds(100));
  cancel.cancel();
  CHECK(waiting.get() == errc::cancelled);
  // Bad arguments.
  CHECK(code_of([&] {
          (void)election::await_change(ctx.db, name, std::nullopt, steady::now(), {},
                                       milliseconds(1));
        }) == errc::invalid_argument);
  CHECK(code_of([&] { (void)election::watch(ctx.db, name, nullptr); }) == errc::invalid_argument);
}

DBLOCK_TEST("election: watch follows a leader of another process: none, won, resigned",
            "[election][processes]") {
  const std::string name = unique_name("watched");
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  auto w = election::watch(
      ctx.db, name,
      [&](const std::optional<leader_info>& l) {
        if (l && l->identity.empty()) return;  // won, not announced yet: a moment
        std::lock_guard<std::mutex> g(mu);
        seen.push_back(l ? l->identity : std::string("none"));
        cv.notify_all();
      },
      milliseconds(100));
  auto wait_for = [&](std::size_t n) {
    std::unique_lock<std::mutex> g(mu);
    return cv.wait_for(g, std::chrono::seconds(15), [&] { return seen.size() >= n; });
  };
  REQUIRE(wait_for(1));  // the state at the start
  process_set ps;
  const int pid = ps.spawn("resigning_leader", {ctx.url, ctx.prefix, name, "far-away", "600"});
  CHECK(wait_for(3));
  CHECK(ps.wait(pid, std::chrono::seconds(20)) == 0);
  w.stop();
  std::lock_guard<std::mutex> g(mu);
  CHECK(seen == std::vector<std::string>{"none", "far-away", "none"});
}

// The cross-process wake-up of followers: with a poll of an hour, a leader of another process
// that wins and resigns is seen at once, each change by its ring (the follower's safety-net
// reads come at the leader's expiry, 20 s here, and at its entry's refresh, 10 s): the end
// within `rung` of the resignation (a liveness bound, scaled to the machine's pace). The
// control: a leader that dies rings nobody, and the follower sees the end only at the lease's
// expiry. It dies with at least `rung` of its lease left (it waits for that, its TTL three times
// `rung`), so the end is seen no sooner than that after the crash (never before the TTL) and the
// resignation's check fails on it at any speed. The followers start before the leader, once
// their queue entries are in and their handle's listener has confirmed them (ring_probe).
// Behind a transaction pooler no ring can reach the follower (no LISTEN): it reads every poll.
DBLOCK_TEST(
    "election: a follower is rung by a leader of another process, and a dead one is seen "
    "at its expiry",
    "[election][processes]") {
  const bool pooled = ctx.url.find("pooler=transaction") != std::string::npos;
  const milliseconds poll = pooled ? milliseconds(100) : milliseconds(std::chrono::hours(1));
  for (const std::string mode : {"resign", "crash"}) {
    INFO(mode);
    const std::string name = unique_name("rung");
    const long long rung = scaled_bound_ms(ctx.db, 1200);
    const std::string ttl = mode == "resign" ? "20000" : std::to_string(std::max(3000LL, 3 * rung));
    std::mutex mu;
    std::condition_variable cv;
    // Two followers on one handle: its wake-up channel carries both entries (MySQL: the
    // interrupted sleeper reads which to wake, rather than waking its only one).
    std::vector<std::pair<std::string, long long>> seen, seen2;  // (leader, monotonic ns)
    auto follow = [&](std::vector<std::pair<std::string, long long>>& out) {
      return election::watch(
          ctx.db, name,
          [&](const std::optional<leader_info>& l) {
            if (l && l->identity.empty()) return;  // won, not announced yet: a moment
            std::lock_guard<std::mutex> g(mu);
            out.emplace_back(l ? l->identity : std::string("none"), monotonic_ns());
            cv.notify_all();
          },
          poll);
    };
    auto w = follow(seen);
    auto w2 = follow(seen2);
    auto wait_for = [&](std::size_t n, std::chrono::seconds limit) {
      std::unique_lock<std::mutex> g(mu);
      return cv.wait_for(g, limit, [&] { return seen.size() >= n && seen2.size() >= n; });
    };
    REQUIRE(wait_for(1, std::chrono::seconds(15)));  // the state at the start
    if (!pooled) {  // both followers in the queue, reached by rings
      REQUIRE(wait_for_waiters(ctx, name + "\xEF\xBF\xBFW", 2, milliseconds(20000)));
      REQUIRE(wait_rings_reach(ctx.db, milliseconds(20000)));
    }
    temp_dir dir("rung");
    process_set ps;
    const int pid = ps.spawn("short_leader", {ctx.url, ctx.prefix, name, "far", "300", ttl, mode,
                                              dir.file("leader"), std::to_string(rung)});
    CHECK(wait_for(3, std::chrono::seconds(31 + std::stoll(ttl) / 1000)));
    CHECK(ps.wait(pid, std::chrono::seconds(90)) == 0);
    w.stop();
    w2.stop();
    long long won = 0, end = 0, left_ms = -1;
    std::istringstream(read_file(dir.file("leader"))) >> won >> end >> left_ms;
    REQUIRE(end > 0);
    std::lock_guard<std::mutex> g(mu);
    for (const auto* s : {&seen, &seen2}) {
      REQUIRE(s->size() == 3);
      CHECK((*s)[0].first == "none");
      CHECK((*s)[1].first == "far");
      CHECK((*s)[2].first == "none");
      const long long win_seen_ms = ((*s)[1].second - won) / ns_per_ms;
      const long long end_seen_ms = ((*s)[2].second - end) / ns_per_ms;
      INFO("the win was seen " << win_seen_ms << " ms after it, the end " << end_seen_ms
                               << " ms after the " << mode << " (TTL " << ttl << " ms, " << left_ms
                               << " ms of it left at a crash; rung within " << rung << " ms)");
      CHECK(win_seen_ms < 9000);  // by its ring, not at the follower's refresh read (10 s)
      if (mode == "resign") {
        CHECK(end_seen_ms < rung);  // rung at the resignation, not at the expiry (20 s)
      } else {
        CHECK(left_ms >= rung);
        CHECK(end_seen_ms >= left_ms);    // nothing rang: seen at the expiry, never before
        CHECK_FALSE(end_seen_ms < rung);  // so the resignation's check fails on it
      }
    }
  }
}
