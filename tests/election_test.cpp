// Leader election (include/dblock/election.hpp) on every backend: one leader at a time, observed
// with its identity, fence and since; resign hands over at once; campaigns wait, time out and are
// cancelled; lost() fires when the lease is taken away and when no renewal is confirmed before
// the local validity ends (renewals held back by a real row lock); and repeated kill -9 of the
// leader process: fenced writes never interleave, fences grow, takeover after the old lease's
// expiry on the database clock and within TTL + one poll.
#include <signal.h>
#include <soci/soci.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"

using dblock::election;
using dblock::errc;
using dblock::leadership;
using dblock::test::code_of;
using dblock::test::full_run;
using dblock::test::monotonic_ns;
using dblock::test::open_db;
using dblock::test::process_set;
using std::chrono::milliseconds;

namespace {

constexpr long long ns_per_ms = 1000000LL;

std::string election_name(const std::string& stem) {
  return stem + "/" + dblock::test::random_suffix();
}

}  // namespace

DBLOCK_TEST("election: one leader, observed with identity, fence and since; resign hands over",
            "[election]") {
  const std::string name = election_name("primary");
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
  const std::string name = election_name("wait");
  election a(ctx.db, name, "a"), b(ctx.db, name, "b");
  auto la = a.try_campaign();
  REQUIRE(la);
  const long long t0 = monotonic_ns();
  CHECK(code_of([&] { (void)b.campaign(milliseconds(300)); }) == errc::timeout);
  CHECK((monotonic_ns() - t0) / ns_per_ms >= 290);
  dblock::cancellation cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(200));
    cancel.cancel();
  });
  CHECK(code_of([&] { (void)b.campaign(std::chrono::seconds(20), cancel); }) == errc::cancelled);
  canceller.join();
  const long long t1 = monotonic_ns();
  std::thread resigner([&] {
    std::this_thread::sleep_for(milliseconds(200));
    la->resign();
  });
  auto lb = b.campaign(std::chrono::seconds(20));
  const long long waited_ms = (monotonic_ns() - t1) / ns_per_ms;
  resigner.join();
  CHECK(lb.valid());
  CHECK(waited_ms >= 195);
  CHECK(waited_ms < 5000);
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
  const std::string name = election_name("taken");
  std::atomic<int> on_lost{0};
  dblock::lease_options lo;
  lo.ttl = milliseconds(600);
  lo.on_lost = [&](const dblock::error&) { ++on_lost; };
  election a(ctx.db, name, "a", lo);
  auto la = a.try_campaign();
  REQUIRE(la);
  std::this_thread::sleep_for(milliseconds(1000));  // over the ttl: the watchdog renews
  CHECK(la->valid());
  CHECK_FALSE(la->lost().cancelled());
  const long long t0 = monotonic_ns();
  dblock::force_release(ctx.db, election::lease_name(name), "test: depose the leader", "test");
  CHECK(la->lost().sleep_for(std::chrono::seconds(5)));  // fired
  const long long fired_ms = (monotonic_ns() - t0) / ns_per_ms;
  INFO("lost() fired " << fired_ms << " ms after the forced release (watchdog every 200 ms)");
  CHECK(fired_ms < 2000);
  CHECK_FALSE(la->valid());
  CHECK(on_lost == 1);
  CHECK(code_of([&] { la->fenced([](soci::session&) {}); }) == errc::lease_lost);
  election b(ctx.db, name, "b", lo);
  CHECK(b.try_campaign());  // the forced release freed it
}

DBLOCK_TEST("election: lost() fires at the local validity deadline when renewals are held back",
            "[election]") {
  const std::string name = election_name("stalled");
  std::atomic<int> on_lost{0};
  dblock::lease_options lo;
  lo.ttl = milliseconds(1000);
  lo.safety_margin = milliseconds(250);
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
  REQUIRE(la->lost().sleep_for(std::chrono::seconds(10)));
  const long long fired = monotonic_ns();
  sql << "ROLLBACK";
  INFO("fired " << (fired - t_sent) / ns_per_ms << " ms after the acquire was sent (ttl 1000, "
                << "margin 250: validity 750 ms); the lease expired on the database "
                << (db_expiry_ns - fired) / ns_per_ms << " ms later at the latest");
  CHECK((fired - t_sent) / ns_per_ms >= 700);  // not before the validity ran out
  CHECK(fired < db_expiry_ns);                 // before another candidate could win
  CHECK_FALSE(la->valid());
  CHECK(on_lost == 1);
}

// ---- kill -9 of the leader, repeatedly ----------------------------------------------------------

// args: url prefix name items_table identity. Campaigns forever; while leader, one fenced insert
// of its fence every 20 ms until lost() fires.
DBLOCK_WORKER(election_worker) {
  auto db = open_db(args.at(0), args.at(1), 3);
  const std::string table = args.at(3);
  dblock::lease_options lo;
  lo.ttl = milliseconds(1000);
  lo.poll_initial = milliseconds(5);
  lo.poll_max = milliseconds(50);
  election e(db, args.at(2), args.at(4), lo);
  for (;;) {
    try {
      auto l = e.campaign(std::chrono::seconds(60));
      const long long f = l.fence();
      while (!l.lost().cancelled()) {
        l.fenced([&](soci::session& sql) {
          sql << "INSERT INTO " << table << " (fence) VALUES (:f)", soci::use(f);
        });
        l.lost().sleep_for(milliseconds(20));
      }
    } catch (const dblock::error& e2) {
      if (e2.code() != errc::lease_lost && e2.code() != errc::timeout) return 1;
    }
  }
}

namespace {

// The fences of the fenced writes in commit order: a leader's writes never come after a newer
// leader's (non-decreasing). The first problem, empty when none.
std::string check_write_order(const std::vector<long long>& fences) {
  for (std::size_t i = 1; i < fences.size(); ++i)
    if (fences[i] < fences[i - 1])
      return "write " + std::to_string(i) + " under fence " + std::to_string(fences[i]) +
             " after a write under fence " + std::to_string(fences[i - 1]);
  return {};
}

}  // namespace

TEST_CASE("election: the write-order check catches an old leader writing after a new one",
          "[election]") {
  CHECK(check_write_order({1, 1, 2, 2, 3}).empty());
  CHECK_FALSE(check_write_order({1, 2, 1, 3}).empty());  // negative control of the checker
}

DBLOCK_TEST("election: kill -9 of the leader, repeatedly: one leader at a time, takeover in time",
            "[election][processes]") {
  const std::string name = election_name("killed");
  const std::string items = ctx.table("items");
  const std::string ident = ctx.backend == "mysql"    ? "id BIGINT AUTO_INCREMENT PRIMARY KEY"
                            : ctx.backend == "sqlite" ? "id INTEGER PRIMARY KEY AUTOINCREMENT"
                                                      : "id BIGSERIAL PRIMARY KEY";
  ctx.exec("CREATE TABLE " + items + " (" + ident + ", fence BIGINT NOT NULL)");
  process_set ps;
  int spawned = 0;
  auto spawn = [&] {
    ps.spawn("election_worker",
             {ctx.url, ctx.prefix, name, items, "candidate-" + std::to_string(spawned++)});
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
                     << " ms after the expiry read before the kill");
    CHECK(after->acquired_at_us >= before->expires_at_us);
    CHECK(after->acquired_at_us <= before->expires_at_us + (1000 + 1000) * 1000LL);
  }
  std::vector<long long> fences;
  {
    // In a transaction: behind a transaction-mode pooler the prepared statement and its
    // execution must reach one server session.
    auto c = ctx.db.connect();
    soci::transaction tr(c.session());
    {
      soci::rowset<long long> rows =
          (c.session().prepare << "SELECT fence FROM " << items << " ORDER BY id");
      for (long long f : rows)
        fences.push_back(f);
    }
    tr.commit();
  }
  CHECK(check_write_order(fences).empty());
  std::set<long long> writers(fences.begin(), fences.end());
  for (long long f : leader_fences)
    CHECK(writers.count(f) == 1);  // every observed leader wrote
}
