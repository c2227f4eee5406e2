// A lease handed over in the release (docs/waiting.md, "Handed over in the release"). On
// PostgreSQL a fair holder that came through the waiter queue releases with a statement that
// hands the freed lease to the head of the queue when that head is fair and waits through the
// releasing process's own host relay; on SQLite with two statements of one write transaction,
// for any fair head: the head holds it at fence + 1 without a statement of its own. On MySQL
// (and for waiters that are not fair, the negative control) the woken head takes the lease with
// its own acquire. Also: a reentrant holder hands over only at its last release; a head that is
// not fair is rung, not handed the lease; a head whose ring is lost finds the lease its own at
// its next poll and holds it once; a head that gives up after it was handed the lease passes it
// on at once; a head that died holds it until its TTL runs out, then the queue moves on.
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/url.hpp"
#include "dialect/doorbell.hpp"
#include "dialect/host_doorbell.hpp"
#include "harness.hpp"
#include "waiting_support.hpp"

using namespace dblock::test;

namespace {

struct lock_row {
  std::string owner, thread;
  long long fence = 0;
  int holds = 0;
};

lock_row read_row(const dblock::test::context& ctx, const std::string& name) {
  auto c = ctx.db.connect();
  lock_row r;
  c.session() << "SELECT owner_token, fence, hold_count, holder_thread FROM "
              << ctx.table("resource_lock") << " WHERE resource_name = :n",
      soci::use(name), soci::into(r.owner), soci::into(r.fence), soci::into(r.holds),
      soci::into(r.thread);
  return r;
}

// One waiting acquire on a thread of its own: it holds the lease until `release` is set.
struct waiter {
  std::thread t;
  std::atomic<bool> got{false}, release{false};
  std::atomic<long long> at_ns{0};
  long long fence = 0;
  std::string token, error;
  dblock::errc code = dblock::errc::backend_error;  // until it fails otherwise

  dblock::cancellation cancel;

  void start(dblock::database db, const std::string& name, dblock::lease_options lo,
             milliseconds wait) {
    t = std::thread([this, db, name, lo, wait] {
      try {
        dblock::lease_lock lk(db, name, lo);
        auto g = lk.acquire(wait, cancel);
        fence = g.fence();
        token = g.owner_token();
        at_ns.store(monotonic_ns());
        got.store(true);
        while (!release.load())
          std::this_thread::sleep_for(milliseconds(2));
        g.release();
      } catch (const dblock::error& e) {
        code = e.kind();
        error = e.what();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  bool await(milliseconds limit) const {
    const long long until = monotonic_ns() + limit.count() * ns_per_ms;
    while (!got.load() && monotonic_ns() < until)
      std::this_thread::sleep_for(milliseconds(2));
    return got.load();
  }
  void finish() {
    release.store(true);
    if (t.joinable()) t.join();
  }
  ~waiter() { finish(); }
};

dblock::lease_options waiting(bool fair, milliseconds poll_max = milliseconds(20000)) {
  dblock::lease_options lo;
  lo.fair = fair;
  lo.ttl = std::chrono::seconds(30);
  lo.poll_max = poll_max;
  return lo;
}

// The database clock in SQL, and `seconds` after it (PostgreSQL: timestamps; SQLite: integer
// microseconds, dblock_now_us() being registered on dblock's connections).
std::string db_now(const dblock::test::context& ctx) {
  return ctx.backend == "sqlite" ? "dblock_now_us()" : "now()";
}
std::string db_now_plus(const dblock::test::context& ctx, int seconds) {
  return ctx.backend == "sqlite" ? "(dblock_now_us() + " + std::to_string(seconds) + "000000)"
                                 : "(now() + interval '" + std::to_string(seconds) + " seconds')";
}

// A bell of a handle that does not exist: PostgreSQL, a handle of the same host relay as the
// entry's own; SQLite, a handle directory nobody made.
std::string dead_bell_sql(const dblock::test::context& ctx) {
  return ctx.backend == "sqlite" ? "'f00d000000000000'"
                                 : "split_part(CAST(bell AS TEXT), '.', 1) || '.f00d00000000000'";
}

// Overwrites the bell of the first queue entry of `name` with that of a handle that does not
// exist: a ring for it reaches nobody.
void misdirect(const dblock::test::context& ctx, const std::string& name) {
  auto c = ctx.db.connect();
  const std::string t = ctx.table("lock_waiter");
  c.session() << "UPDATE " << t << " SET bell = " << dead_bell_sql(ctx)
              << " WHERE ticket = (SELECT MIN(ticket) FROM " << t << " WHERE resource_name = :n)",
      soci::use(name);
}

// `name` held at fence 7 by a process that is gone, for an hour.
void hold_elsewhere(const dblock::test::context& ctx, const std::string& name) {
  auto c = ctx.db.connect();
  c.session() << "INSERT INTO " << ctx.table("resource_lock")
              << " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
                 " holder_host, holder_pid, holder_thread) VALUES (:n, 'dddddddddddddddddddddddddd"
                 "dddddd', 7, 1, "
              << db_now(ctx) << ", " << db_now_plus(ctx, 3600) << ", 'gone', 1, '1')",
      soci::use(name);
}

// X holds `name` (fair); H, a fair waiter, queues and takes it when X releases: H came through
// the queue, so its release may hand the lease over.
struct queued_holder {
  std::unique_ptr<dblock::lease_lock> x_lock;
  waiter h;
  queued_holder(const dblock::test::context& ctx, const std::string& name, bool fair) {
    x_lock = std::make_unique<dblock::lease_lock>(ctx.db, name, waiting(fair));
    auto x = x_lock->try_acquire();
    REQUIRE(x);
    const bool pooled = ctx.url.find("pooler=transaction") != std::string::npos;  // no rings
    h.start(ctx.db, name, waiting(fair, milliseconds(pooled ? 100 : 20000)), milliseconds(30000));
    REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
    const long long cap = std::max(5000LL, 2 * scaled_bound_ms(ctx.db, 2000));
    x->release();
    INFO("H given up on after " << cap << " ms");
    REQUIRE(h.await(milliseconds(cap)));
  }
};

// The releasing holder H, which came through the queue (X held the lease first), and the
// waiter W queued behind it; H's release hands W the lease where the backend does that, when
// both are fair (`fair`: H and X; `head_fair`: W).
void hand_over_case(const dblock::test::context& ctx, bool fair, bool own_handle, bool head_fair) {
  const std::string name = "handover-" + dblock::test::random_suffix();
  // Behind PgBouncer's transaction mode (tests/topology/pgbouncer.sh) there is no host relay:
  // nothing is handed over (the release statement runs as a routine all the same), and waiters
  // poll.
  const bool pooled = ctx.url.find("pooler=transaction") != std::string::npos;
  queued_holder q(ctx, name, fair);
  CHECK_FALSE(read_row(ctx, name).thread.empty());  // H took it with its own acquire
  waiter w;
  w.start(own_handle ? ctx.open(ctx.options()) : ctx.db, name,
          waiting(head_fair, milliseconds(pooled ? 100 : 20000)), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  // Past W's re-check after joining (PostgreSQL reads again within 10 ms): a read that lands
  // between the handover's commit and its ring finds the lease W's and takes it with W's own
  // acquire (correct, and the lost-ring test's path), which names W's thread.
  std::this_thread::sleep_for(milliseconds(200));
  const long long released = monotonic_ns();
  q.h.release.store(true);
  const bool got = w.await(milliseconds(std::max(5000LL, 2 * bound)));
  q.h.finish();
  INFO("H: " << q.h.error << "; W: " << w.error << "; W got it "
             << (w.at_ns.load() - released) / ns_per_ms << " ms after the release; bound " << bound
             << " ms");
  REQUIRE(got);
  if (!pooled)  // rung (poll_max 20 s)
    CHECK((w.at_ns.load() - released) / ns_per_ms < bound);
  const lock_row r = read_row(ctx, name);
  CHECK(r.owner == w.token);
  CHECK(r.fence == q.h.fence + 1);
  CHECK(w.fence == r.fence);
  CHECK(r.holds == 1);
  // Handed over in the release, which names no thread; else W's own acquire named its thread.
  const bool handed =
      fair && head_fair && ((ctx.backend == "postgresql" && !pooled) || ctx.backend == "sqlite");
  CHECK(r.thread.empty() == handed);
  if (ctx.backend != "mysql") CHECK(count_waiters(ctx, name) == 0);  // (MySQL: during the hold)
  w.finish();
  CHECK(read_row(ctx, name).holds == 0);
}

}  // namespace

DBLOCK_TEST(
    "a fair holder that came through the queue hands the lease to the next in line "
    "(PostgreSQL, SQLite); the head holds it at fence + 1 without an acquire of its own",
    "[waiting][handover]") {
  SECTION("the head waits on the same database handle") {
    hand_over_case(ctx, true, false, true);
  }
  SECTION("the head waits on a handle of its own") {
    hand_over_case(ctx, true, true, true);
  }
  SECTION("a head that is not fair is rung, and takes the lease with its own acquire") {
    hand_over_case(ctx, true, true, false);
  }
  SECTION("negative control: not fair, the woken head takes the lease itself") {
    hand_over_case(ctx, false, true, false);
  }
}

// H, a fair holder that came through the queue, holds the lease twice (reentry) while W, fair,
// queues behind it. H's first release keeps the lease (one hold left): nothing is handed over
// and W keeps waiting. H's last release frees it, handed to W where the backend hands over.
// (The statements themselves hand over only a lease at its last hold: with the library asking
// for a handover at the inner release as well, this test still passed.)
DBLOCK_TEST("a fair reentrant holder's inner release hands nothing over; its last one does",
            "[waiting][handover]") {
  const std::string name = "handover-reentrant-" + dblock::test::random_suffix();
  const bool pooled = ctx.url.find("pooler=transaction") != std::string::npos;
  const milliseconds poll_max(pooled ? 100 : 20000);
  dblock::lease_lock first(ctx.db, name, waiting(true)),
      holder(ctx.db, name, waiting(true, poll_max));
  dblock::lease_guard outer = dblock::test::acquire_through_queue(ctx, name, first, holder);
  auto inner = holder.try_acquire();  // reentry: a second hold
  REQUIRE(inner);
  CHECK(read_row(ctx, name).holds == 2);
  waiter w;
  w.start(ctx.open(ctx.options()), name, waiting(true, poll_max), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  std::this_thread::sleep_for(milliseconds(200));  // past W's re-check after joining
  inner->release();
  std::this_thread::sleep_for(milliseconds(500));  // W would have been rung and have taken it
  const lock_row kept = read_row(ctx, name);
  CHECK_FALSE(w.got.load());
  CHECK(kept.owner == outer.owner_token());
  CHECK(kept.fence == outer.fence());
  CHECK(kept.holds == 1);
  const std::int64_t fence = outer.fence();
  const long long released = monotonic_ns();
  outer.release();
  const bool got = w.await(milliseconds(std::max(5000LL, 2 * bound)));
  INFO("W: " << w.error << "; got it " << (w.at_ns.load() - released) / ns_per_ms
             << " ms after the release; bound " << bound << " ms");
  REQUIRE(got);
  if (!pooled)  // rung
    CHECK((w.at_ns.load() - released) / ns_per_ms < bound);
  const lock_row r = read_row(ctx, name);
  CHECK(r.owner == w.token);
  CHECK(r.fence == fence + 1);
  CHECK(r.holds == 1);
  const bool handed = (ctx.backend == "postgresql" && !pooled) || ctx.backend == "sqlite";
  CHECK(r.thread.empty() == handed);
  w.finish();
  CHECK(read_row(ctx, name).holds == 0);
}

// The ring that carries the handover reaches nobody (the head's entry names a handle of the
// relay that does not exist): the head, polling every 200 ms, finds the lease its own and takes
// it with its acquire, as one hold (released, the lease is free).
DBLOCK_TEST_ON_TWO("postgresql", "sqlite",
                   "a head handed the lease whose ring is lost takes it at its next poll, as one "
                   "hold",
                   "[waiting][handover][direct]") {
  const std::string name = "handover-lost-" + dblock::test::random_suffix();
  queued_holder q(ctx, name, true);
  waiter w;
  w.start(ctx.open(ctx.options()), name, waiting(true, milliseconds(1500)), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  // W's next poll (1.5 s) with a slack at the machine's pace, twice over.
  const long long cap = std::max(5000LL, 2 * scaled_bound_ms(ctx.db, 2000));
  std::string entry_token;  // W's queue entry's
  {
    auto c = ctx.db.connect();
    c.session() << "SELECT owner_token FROM " << ctx.table("lock_waiter")
                << " WHERE resource_name = :n",
        soci::use(name), soci::into(entry_token);
  }
  misdirect(ctx, name);
  q.h.release.store(true);
  q.h.finish();
  // Handed over by the release (the row W's, no thread named) before W's next poll finds it.
  const lock_row handed = read_row(ctx, name);
  const bool early = !w.got.load();
  const bool got = w.await(milliseconds(cap));
  q.h.finish();
  INFO("W: " << w.error << "; given up on after " << cap << " ms");
  REQUIRE(got);
  const lock_row r = read_row(ctx, name);
  CHECK(r.owner == w.token);
  CHECK(r.fence == q.h.fence + 1);  // the fence the release handed over
  CHECK(r.holds == 1);              // taken as it was, not as a second hold
  CHECK_FALSE(r.thread.empty());    // by W's own acquire
  if (early) {  // read before W's poll (1.5 s) took it: the release had handed it over
    CHECK(handed.owner == entry_token);
    CHECK(handed.thread.empty());
    CHECK(handed.fence == q.h.fence + 1);
  }
  w.finish();
  CHECK(read_row(ctx, name).holds == 0);
}

// W1 gives up (cancelled) just as a release hands it the lease: its DELETE of its queue entry
// waits for the handover, which the test performs as the release does, in a transaction that
// first locks that entry (so W1 cannot have seen the lease before it gives up). The DELETE then
// matches nothing, W1 finds the lease its own and releases it, which rings W2, queued behind it,
// long before W1's TTL (30 s) would have freed the lease.
DBLOCK_TEST_ON_TWO("postgresql", "sqlite",
                   "a head that gives up as it is handed the lease passes it on at once",
                   "[waiting][handover][direct]") {
  const std::string name = "handover-give-up-" + dblock::test::random_suffix();
  const std::string lock = ctx.table("resource_lock"), queue = ctx.table("lock_waiter");
  auto c = ctx.db.connect();
  hold_elsewhere(ctx, name);
  waiter w1, w2;
  w1.start(ctx.open(ctx.options()), name, waiting(true), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  w2.start(ctx.open(ctx.options()), name, waiting(true), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 2, milliseconds(10000)));
  std::string w1_token;
  long long w1_ticket = 0;
  c.session() << "SELECT CAST(owner_token AS TEXT), ticket FROM " << queue
              << " WHERE resource_name = :n ORDER BY ticket LIMIT 1",
      soci::use(name), soci::into(w1_token), soci::into(w1_ticket);
  // PostgreSQL: the entry's row lock; SQLite: the one write lock.
  if (ctx.backend == "sqlite") {
    c.session() << "BEGIN IMMEDIATE";
  } else {
    c.session() << "BEGIN";
    c.session() << "SELECT 1 FROM " << queue << " WHERE ticket = " << w1_ticket << " FOR UPDATE";
  }
  w1.cancel.cancel();
  std::this_thread::sleep_for(milliseconds(300));  // W1's DELETE waits for this transaction
  c.session() << "UPDATE " << lock
              << " SET owner_token = :t, fence = fence + 1, hold_count = 1, acquired_at = "
              << db_now(ctx) << ", expires_at = " << db_now_plus(ctx, 30)
              << ", holder_thread = '' WHERE resource_name = :n",
      soci::use(w1_token), soci::use(name);
  c.session() << "DELETE FROM " << queue << " WHERE ticket = " << w1_ticket;
  c.session() << "COMMIT";
  const long long handed = monotonic_ns();
  const bool got = w2.await(milliseconds(10000));
  w1.finish();
  INFO("W1: " << w1.error << "; W2: " << w2.error);
  CHECK(w1.code == dblock::errc::cancelled);
  REQUIRE(got);
  CHECK((w2.at_ns.load() - handed) / ns_per_ms < scaled_bound_ms(ctx.db, 3000));
  CHECK(w2.fence == 9);  // W1 held it at 8 and passed it on
  w2.finish();
  CHECK(read_row(ctx, name).holds == 0);
  CHECK(count_waiters(ctx, name) == 0);
}

// A head handed the lease that is gone (a queue entry of a dead process, planted with a TTL of
// 600 ms): the lease runs out at that TTL, as a dead holder's would, and the next waiter takes
// it then.
DBLOCK_TEST_ON_TWO("postgresql", "sqlite",
                   "a dead head handed the lease holds it until its TTL, then the queue moves on",
                   "[waiting][handover][direct]") {
  const std::string name = "handover-dead-" + dblock::test::random_suffix();
  const std::string lock = ctx.table("resource_lock"), queue = ctx.table("lock_waiter");
  auto c = ctx.db.connect();
  hold_elsewhere(ctx, name);
  waiter h, w;
  h.start(ctx.db, name, waiting(true, milliseconds(100)), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  // A handle that does not exist; on PostgreSQL of H's host relay, which the dead head then
  // waits "through" too.
  std::string dead_bell;
  c.session() << "SELECT " << dead_bell_sql(ctx) << " FROM " << queue
              << " WHERE resource_name = :n",
      soci::use(name), soci::into(dead_bell);
  c.session() << "UPDATE " << lock << " SET hold_count = 0 WHERE resource_name = :n",
      soci::use(name);
  const long long cap = std::max(5000LL, 2 * scaled_bound_ms(ctx.db, 2000));
  INFO("H given up on after " << cap << " ms");
  REQUIRE(h.await(milliseconds(cap)));  // H came through the queue: fence 8
  c.session() << "INSERT INTO " << queue
              << " (resource_name, owner_token, enqueued_at, expires_at, holder_host, holder_pid,"
                 " bell, grant_ttl_us) VALUES (:n, 'eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee', "
              << db_now(ctx) << ", " << db_now_plus(ctx, 3600) << ", 'gone', 1, :b, 600000)",
      soci::use(name), soci::use(dead_bell);
  w.start(ctx.open(ctx.options()), name, waiting(true, milliseconds(200)), milliseconds(30000));
  REQUIRE(wait_for_waiters(ctx, name, 2, milliseconds(10000)));
  const long long released = monotonic_ns();
  h.release.store(true);
  const bool got = w.await(milliseconds(10000));
  h.finish();
  INFO("H: " << h.error << "; W: " << w.error);
  REQUIRE(got);
  const long long waited_ms = (w.at_ns.load() - released) / ns_per_ms;
  CHECK(h.fence == 8);
  CHECK(waited_ms >= 500);                           // the dead head's lease ran its TTL
  CHECK(waited_ms < scaled_bound_ms(ctx.db, 5000));  // and then the queue moved on
  CHECK(w.fence == 10);                              // the dead head's was 9
  w.finish();
}

// SQLite's doorbell directories are open to every user of the database file, so a ring that
// says a lease was handed over can be forged there: the waiter reads the row before it holds the
// lease (doorbell::private_rings()). W is queued behind a holder that is gone for an hour; a
// forged grant in W's handle directory costs W one refused try, and W never holds the lease.
DBLOCK_TEST_ONLY("sqlite", "a forged handover ring does not make a waiter a holder",
                 "[waiting][handover]") {
  const std::string name = "handover-forged-" + dblock::test::random_suffix();
  hold_elsewhere(ctx, name);
  waiter w;
  w.start(ctx.open(ctx.options()), name, waiting(true), milliseconds(3000));
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  std::string bell;
  long long ticket = 0;
  {
    auto c = ctx.db.connect();
    c.session() << "SELECT bell, ticket FROM " << ctx.table("lock_waiter")
                << " WHERE resource_name = :n",
        soci::use(name), soci::into(bell), soci::into(ticket);
  }
  const std::string dir = dblock::detail::parse_url(ctx.url).path + ".dblock-wake/h." + bell;
  for (int i = 0; i < 200 && !std::filesystem::is_directory(dir); ++i)
    std::this_thread::sleep_for(milliseconds(10));
  REQUIRE(std::filesystem::is_directory(dir));
  const std::string entry = dir + "/" +
                            dblock::detail::ring_entry(dblock::detail::name_hash(name), 8,
                                                       dblock::detail::granted_head(ticket));
  { std::ofstream(entry).put('x'); }  // what a ring makes and removes
  std::filesystem::remove(entry);
  CHECK_FALSE(w.await(milliseconds(1000)));  // negative control: taken at its word, W held it
  w.finish();
  INFO("W: " << w.error);
  CHECK(w.code == dblock::errc::timeout);
  const lock_row r = read_row(ctx, name);
  CHECK(r.fence == 7);  // still the holder's that is gone
  CHECK(r.holds == 1);
}
