// Waiting acquires (lease_lock::acquire(wait)) and the waiter queue: a storm of cancelled waits
// that must leave no queue entry behind, the queue entry of the waiter that took the lease (and
// of one that gave up), the queue order kept by the acquire statement, and a queued waiter
// killed with SIGKILL.
//
// The wake-ups are in waiting_wakeup_test.cpp, the local gate in waiting_gate_test.cpp, the
// other process tests (fair order, round-robin, counters) in waiting_process_test.cpp.
#include <signal.h>
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"
#include "waiting_support.hpp"

using namespace dblock::test;

// ---- interrupt storm --------------------------------------------------------------------------

namespace {

// Cancels each registered cancellation at its instant (CLOCK_MONOTONIC).
struct canceller {
  std::mutex mu;
  std::vector<std::pair<dblock::cancellation, long long>> due;
  std::atomic<bool> stop{false};
  void add(const dblock::cancellation& c, long long at_ns) {
    std::lock_guard<std::mutex> l(mu);
    due.emplace_back(c, at_ns);
  }
  void run() {
    while (!stop.load()) {
      const long long now = monotonic_ns();
      {
        std::lock_guard<std::mutex> l(mu);
        for (auto it = due.begin(); it != due.end();) {
          if (it->second > now) {
            ++it;
            continue;
          }
          it->first.cancel();
          it = due.erase(it);
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  }
};

struct storm_outcome {
  std::atomic<int> cancelled{0}, acquired{0};
  std::mutex mu;
  std::vector<std::string> errors;
};

// One storm thread: waits for the held lease again and again, each wait cancelled after 1..20 ms.
void storm_thread(const dblock::database& db, const std::string& name, canceller& cc,
                  const std::atomic<bool>& stop, storm_outcome& out) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<long long> after_ms(1, 20);
  dblock::lease_options lo;
  lo.ttl = milliseconds(500);
  dblock::lease_lock lock(db, name, lo);
  while (!stop.load()) {
    dblock::cancellation c;
    cc.add(c, monotonic_ns() + after_ms(rng) * ns_per_ms);
    try {
      auto g = lock.acquire(std::chrono::seconds(30), c);
      out.acquired.fetch_add(1);
    } catch (const dblock::error& e) {
      if (e.code() == errc::cancelled) {
        out.cancelled.fetch_add(1);
        continue;
      }
      std::lock_guard<std::mutex> l(out.mu);
      out.errors.push_back(e.what());
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(out.mu);
      out.errors.push_back(e.what());
    }
  }
}

}  // namespace

DBLOCK_TEST("interrupt storm: cancelled waits leave no live queue entry behind", "[waiting]") {
  const int threads = 8;
  const auto storm_for = milliseconds(full_run() ? 10000 : 2000);
  auto events = std::make_shared<counting_listener>();  // keeps a failed deletion's warning
  auto o = ctx.options();
  o.pool_size = threads + 4;
  o.events = events;
  auto db = ctx.open(o);
  const std::string name = "storm-" + dblock::test::random_suffix();
  auto h = hold_long(ctx, name);
  canceller cc;
  storm_outcome out;
  std::atomic<bool> stop{false};
  std::thread cancel_thread([&] { cc.run(); });
  // Half the threads share one handle (their waits are mostly at its local gate), the other
  // half have a handle each (each wait is a queued entry in the database).
  std::vector<dblock::database> dbs(threads / 2, db);
  for (int t = threads / 2; t < threads; ++t) {
    auto own = ctx.options();
    own.events = events;
    dbs.push_back(ctx.open(own));
  }
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back(
        [&, t] { storm_thread(dbs[static_cast<std::size_t>(t)], name, cc, stop, out); });
  long long most_queued = 0;  // the storm really queues waiters (not vacuous)
  for (const long long end = monotonic_ns() + storm_for.count() * ns_per_ms;
       monotonic_ns() < end;) {
    std::this_thread::sleep_for(milliseconds(10));
    try {
      most_queued = std::max(most_queued, count_waiters(ctx, name));
    } catch (const std::exception&) {  // a busy SQLite file: sample again
    }
  }
  stop.store(true);
  for (auto& t : ts)
    t.join();
  // Every wait has returned, and a wait that gives up deletes its entry before it returns: none
  // may be left, live or expired (a failed deletion would be logged and its entry left to expire
  // within the TTL, which this test counts as a leak too). Counted at once, before anything
  // could reap or expire them.
  const long long left = count_waiters(ctx, name), left_all = count_waiters(ctx);
  cc.stop.store(true);
  cancel_thread.join();
  INFO(out.cancelled.load() << " waits cancelled, at most " << most_queued
                            << " queued at once; first error: "
                            << (out.errors.empty() ? "" : out.errors.front()) << "; " << left
                            << " queue entries of the lock left (" << left_all << " in all)");
  CHECK(out.errors.empty());
  CHECK(out.acquired.load() == 0);
  CHECK(out.cancelled.load() >= threads);
  CHECK(most_queued > 1);
  INFO("logged: " << events->logged().substr(0, 2000));
  CHECK(left == 0);
  CHECK(left_all == 0);
  h.release();
}

// ---- the queue entry of the waiter that took the lease ------------------------------------

// Fair, with a 30 s TTL (nothing runs out while a test looks).
dblock::lease_options fair_30s() {
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(30);
  lo.fair = true;
  return lo;
}

// lock.acquire(30 s) on a thread of its own: the guard, or what it threw.
struct background_acquire {
  std::optional<dblock::lease_guard> got;
  std::string failure;
  std::thread t;
  explicit background_acquire(dblock::lease_lock& lock)
      : t([this, &lock] {
          try {
            got.emplace(lock.acquire(std::chrono::seconds(30)));
          } catch (const std::exception& e) {
            failure = e.what();
          }
        }) {}
  ~background_acquire() {
    if (t.joinable()) t.join();
  }
  void join() { t.join(); }
};

// A waiter that takes the lease through the queue leaves no entry behind: on PostgreSQL and
// SQLite the acquire deletes it in its own write; on MySQL, where that would be a second
// autocommit write on the handoff's path, the handle's renewer thread deletes it during the
// hold, and the release finishes it before freeing the lease (the next test stalls that
// deletion). Checked three ways: during a long hold the entry goes; after a release right
// after the acquire no entry is left; and a fair try_acquire of a third handle, which refuses
// while anyone other than the last holder is queued, then succeeds.
DBLOCK_TEST("a waiter that took the lease leaves no queue entry, also when it releases at once",
            "[waiting]") {
  const int rounds = full_run() ? 40 : 12;
  auto waiter_db = ctx.open(ctx.options());
  auto third_db = ctx.open(ctx.options());
  const std::string name = "left-queue-" + dblock::test::random_suffix();
  const dblock::lease_options lo = fair_30s();
  dblock::lease_lock waiter(waiter_db, name, lo);
  dblock::lease_lock third(third_db, name, lo);
  for (int round = 0; round < rounds; ++round) {
    INFO("round " << round);
    auto h = hold_long(ctx, name);
    background_acquire bg(waiter);
    auto& got = bg.got;
    const bool queued = wait_for_waiters(ctx, name, 1, milliseconds(20000));
    h.release();
    bg.join();
    REQUIRE(queued);
    INFO("waiter: " << bg.failure);
    REQUIRE(got);
    if (round == 0) {
      // A long hold: the entry goes while the lease is held.
      const long long until = monotonic_ns() + 5000 * ns_per_ms;
      while (count_waiters(ctx, name) != 0 && monotonic_ns() < until)
        std::this_thread::sleep_for(milliseconds(5));
      CHECK(count_waiters(ctx, name) == 0);
      CHECK(got->valid());
    }
    got->release();  // at once, in every later round
    CHECK(count_waiters(ctx, name) == 0);
    // Another holder in between: the waiter's entry, had it stayed, would head the queue now.
    {
      dblock::lease_options plain;
      plain.ttl = std::chrono::seconds(30);
      dblock::lease_lock other(ctx.db, name, plain);
      auto g = other.try_acquire();
      REQUIRE(g);
    }
    auto f = third.try_acquire();
    CHECK(f);
  }
  // Negative control: a live entry of someone other than the last holder does make the fair
  // try_acquire refuse, so the check above can fail.
  plant_waiter(ctx, name, "nowhere");
  CHECK_FALSE(third.try_acquire());
  {
    auto c = ctx.db.connect();
    c.session() << "DELETE FROM " << ctx.table("lock_waiter") << " WHERE resource_name = :n",
        soci::use(name);
  }
  CHECK(third.try_acquire());
}

// MySQL, where the new holder's entry is deleted off the acquire's path: with that deletion
// stalled (another connection holds the entry's row lock), the entry is still there during the
// hold, and the release waits for the deletion before it frees the lease, so that once release()
// returns the entry is gone. (Without that wait the release returns at once and the entry is
// still there: the checks below then fail.) The first holder's lease runs out rather than being
// released: a MySQL release reads the queue with shared row locks, and would wait too.
DBLOCK_TEST_ONLY("mysql",
                 "a stalled deletion of the new holder's queue entry is finished before release",
                 "[waiting]") {
  auto waiter_db = ctx.open(ctx.options());
  const std::string name = "stalled-exit-" + dblock::test::random_suffix();
  const dblock::lease_options lo = fair_30s();
  dblock::lease_lock waiter(waiter_db, name, lo);
  dblock::lease_options short_lease;
  short_lease.ttl = milliseconds(1500);
  dblock::lease_lock first(ctx.db, name, short_lease);
  auto h = first.try_acquire();
  REQUIRE(h);
  background_acquire bg(waiter);
  auto& got = bg.got;
  const bool queued = wait_for_waiters(ctx, name, 1, milliseconds(20000));
  // Holds a shared lock on the entry's row: the renewer's DELETE waits for this transaction.
  // (Not FOR UPDATE: the waiter's acquire in queue order reads the queue up to its own entry
  // with shared locks, and would wait too.)
  auto blocker = ctx.db.connect();
  blocker.session().begin();
  long long ticket = 0;
  if (queued)
    blocker.session() << "SELECT ticket FROM " << ctx.table("lock_waiter")
                      << " WHERE resource_name = :n LOCK IN SHARE MODE",
        soci::use(name), soci::into(ticket);
  bg.join();  // the first lease ran out
  REQUIRE(queued);
  INFO("waiter: " << bg.failure);
  REQUIRE(got);
  CHECK(ticket > 0);
  std::this_thread::sleep_for(milliseconds(300));
  CHECK(count_waiters(ctx, name) == 1);  // the deletion is stalled
  std::thread unblock = run_after(milliseconds(500), [&] { blocker.session().commit(); });
  const long long before = monotonic_ns();
  got->release();
  const long long took_ms = (monotonic_ns() - before) / ns_per_ms;
  const long long left = count_waiters(ctx, name);
  unblock.join();
  INFO("release took " << took_ms << " ms");
  CHECK(left == 0);
  CHECK(took_ms >= 300);  // it waited for the deletion
  try {
    h->release();  // long expired
  } catch (const dblock::error&) {
  }
}

namespace {

// Kills the connections whose DELETE of a queue entry waits for a row lock (PostgreSQL,
// MySQL); returns how many.
int kill_queue_deletes(const dblock::test::context& ctx) {
  const std::string like = "DELETE FROM " + ctx.table("lock_waiter") + " WHERE%";
  if (ctx.backend == "postgresql")
    return terminate_backends(ctx, "query LIKE :p AND wait_event_type = 'Lock'", like);
  return kill_queries(ctx, like);
}

}  // namespace

// A waiter that gives up deletes its queue entry, and tries again when a try fails on the way:
// on SQLite its busy timeout (300 ms here) runs out behind another writer; on PostgreSQL and
// MySQL the connection that runs the DELETE is killed while the DELETE waits for the entry's row
// lock. The other writer finishes during the second try, which deletes the entry before the
// acquire returns. Negative control, run second: the other writer outlasts every try (SQLite:
// holds the write lock, the servers: each DELETE is killed, until the acquire returns), as it
// outlasted the one try before the retries came; the entry stays (for its TTL, 30 s), and the
// same count finds it.
DBLOCK_TEST("a waiter that gives up deletes its queue entry after a failed try", "[waiting]") {
  const bool sqlite = ctx.backend == "sqlite";
  dblock::database_options o = ctx.options();
  o.sqlite_busy_timeout = milliseconds(300);
  auto waiter_db = ctx.open(o);
  for (const bool outlast : {false, true}) {
    INFO((outlast ? "negative control: the other writer outlasts every try"
                  : "the other writer finishes during the second try"));
    const std::string name = "leave-retried-" + dblock::test::random_suffix();
    auto h = hold_long(ctx, name);
    dblock::lease_lock waiter(waiter_db, name, fair_30s());
    dblock::cancellation cancel;
    std::atomic<bool> done{false};
    errc code = errc::backend_error;
    std::string failure = "acquired";
    std::thread t([&] {
      try {
        auto g = waiter.acquire(std::chrono::seconds(30), cancel);
      } catch (const dblock::error& e) {
        code = e.kind();
        failure = e.what();
      }
      done = true;
    });
    const bool queued = wait_for_waiters(ctx, name, 1, milliseconds(20000));
    auto blocker = ctx.db.connect();
    if (sqlite) {
      blocker.session() << "BEGIN IMMEDIATE";  // the one write lock
    } else {
      long long ticket = 0;
      blocker.session().begin();
      blocker.session() << "SELECT ticket FROM " << ctx.table("lock_waiter")
                        << " WHERE resource_name = :n FOR UPDATE",
          soci::use(name), soci::into(ticket);
    }
    cancel.cancel();
    int killed = 0;
    const long long until = monotonic_ns() + 10000 * ns_per_ms;
    if (outlast) {
      while (!done.load() && monotonic_ns() < until) {
        if (!sqlite) killed += kill_queue_deletes(ctx);
        std::this_thread::sleep_for(milliseconds(10));
      }
    } else if (sqlite) {
      std::this_thread::sleep_for(milliseconds(450));  // the first try's busy timeout has run out
    } else {
      // Once the DELETE waits for the row lock (a slow build may take a while to get there).
      while ((killed = kill_queue_deletes(ctx)) == 0 && monotonic_ns() < until)
        std::this_thread::sleep_for(milliseconds(10));
      std::this_thread::sleep_for(milliseconds(300));  // the second try waits in turn
    }
    const bool waited = !done.load();
    if (sqlite)
      blocker.session() << "COMMIT";
    else
      blocker.session().commit();
    t.join();
    const long long left = count_waiters(ctx, name);
    INFO("waiter: " << failure << "; " << killed << " DELETEs killed; " << left
                    << " queue entries left");
    REQUIRE(queued);
    CHECK(code == errc::cancelled);
    if (outlast) {
      CHECK_FALSE(waited);  // the acquire returned while the other writer still held on
      if (!sqlite) CHECK(killed >= 1);
      CHECK(left == 1);  // what the first run's `left == 0` would have caught
    } else {
      CHECK(waited);  // still deleting when the other writer finished
      if (!sqlite) CHECK(killed == 1);
      CHECK(left == 0);
    }
  }
}

// ---- queue order kept by the acquire statement --------------------------------------------

// A live queue entry planted ahead of a fair waiter (as a waiter of another process whose
// rings never arrive would be): the waiter, on the holder's own handle, is woken by the
// release (PostgreSQL and MySQL: the handle's local ring, which names no head, wakes its
// lowest ticket; SQLite: polling), tries at once, and its acquire statement refuses while the
// earlier entry lives. Once that entry is gone it takes the lease. Negative control: a waiter
// that is not fair takes the freed lease past the same entry. The entry lives until the test
// removes it, after the look: the fair waiter is watched for a window that grows with the
// machine's pace (not taking it is the safety property), the unfair one until it has taken the
// lease (20 s at most), so that it overtakes every time, however slow its poll or ring.
DBLOCK_TEST("a fair waiter woken out of turn does not take the lease past an earlier entry",
            "[waiting]") {
  const std::string name = "order-" + dblock::test::random_suffix();
  auto unplant = [&] {
    auto c = ctx.db.connect();
    c.session() << "DELETE FROM " << ctx.table("lock_waiter")
                << " WHERE resource_name = :n AND holder_host = 'elsewhere'",
        soci::use(name);
  };
  for (const bool fair : {true, false}) {
    INFO((fair ? "fair" : "not fair (negative control)"));
    auto h = hold_long(ctx, name);
    plant_waiter(ctx, name, "elsewhere");
    dblock::lease_options lo;
    lo.fair = fair;
    lo.ttl = std::chrono::seconds(30);
    lo.poll_max = milliseconds(50);
    dblock::lease_lock waiter(ctx.db, name, lo);
    std::atomic<bool> acquired{false};
    std::optional<dblock::lease_guard> got;
    std::string failure;
    std::thread t([&] {
      try {
        got.emplace(waiter.acquire(std::chrono::seconds(30)));
        acquired.store(true);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    });
    const bool queued = wait_for_waiters(ctx, name, 2, milliseconds(20000));
    const long long window_ms = fair ? scaled_bound_ms(ctx.db, 800) : 20000;
    h.release();
    const long long until = monotonic_ns() + window_ms * ns_per_ms;
    while (!acquired.load() && monotonic_ns() < until)
      std::this_thread::sleep_for(milliseconds(5));
    const bool overtook = acquired.load();
    unplant();
    t.join();
    REQUIRE(queued);
    INFO("waiter: " << failure);
    REQUIRE(got);
    INFO("watched for " << window_ms << " ms after the release");
    CHECK(overtook == !fair);
    got->release();
  }
}

// ---- a queued waiter killed ---------------------------------------------------------------------

// Fair, waiter ttl 1 s: A queues first, B second; A is killed while queued. B must get the lease
// once A's entry has expired (A's last refresh was before the kill, so by kill + ttl), within
// 2 s of that, and not while A's entry could still be live (at least ttl/3 after the kill: A
// refreshed it at most ttl/3 before). Afterwards only A's expired entry may be left. The waiters
// are queued_worker processes (waiting_process_test.cpp).
DBLOCK_TEST(
    "queued waiter killed with SIGKILL: the next waiter gets the lease after its entry expires",
    "[waiting][process]") {
  const long long ttl_ns = 1000 * ns_per_ms;
  temp_dir dir("wait");
  process_set ps;
  const std::string name = "killq-" + dblock::test::random_suffix();
  dblock::lease_options ho;
  ho.fair = true;
  ho.ttl = std::chrono::seconds(60);
  dblock::lease_lock holder(ctx.db, name, ho);
  auto h = holder.try_acquire();
  REQUIRE(h);
  const long long holder_fence = h->fence();
  auto waiter = [&](int i) {
    return ps.spawn("queued_worker", {ctx.url, ctx.prefix, name, std::to_string(i), "1000", "1000",
                                      "0", dir.file("w" + std::to_string(i))});
  };
  const int a = waiter(0);
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(30000)));
  const int b = waiter(1);
  REQUIRE(wait_for_waiters(ctx, name, 2, milliseconds(30000)));
  const long long slack_ms = scaled_bound_ms(ctx.db, 2000);  // 2 s on a quiet machine
  REQUIRE(::kill(a, SIGKILL) == 0);
  const long long killed_ns = monotonic_ns();
  CHECK(ps.wait(a, milliseconds(5000)) == 128 + SIGKILL);
  const long long released_ns = monotonic_ns();
  h->release();
  REQUIRE(ps.wait(b, milliseconds(30000)) == 0);
  std::istringstream report(read_file(dir.file("w1")));  // queued_worker's grant line
  long long proc = -1, fence = 0, request_ns = 0, enter_ns = 0;
  REQUIRE(report >> proc >> fence >> request_ns >> enter_ns);
  INFO("B granted " << (enter_ns - killed_ns) / ns_per_ms << " ms after A was killed, "
                    << (enter_ns - released_ns) / ns_per_ms << " ms after the release; slack "
                    << slack_ms << " ms");
  CHECK(fence > holder_fence);
  CHECK(enter_ns <= std::max(released_ns, killed_ns + ttl_ns) + slack_ms * ns_per_ms);
  CHECK(enter_ns >= killed_ns + ttl_ns / 3);
  // No live entry of A: whatever is left of it is expired, so reaping removes it all.
  const long long a_pid = a;
  const long long left = count_waiters(ctx, name);
  CHECK(count_waiters(ctx, name, a_pid) == left);
  dblock::reaper_options ro;
  ro.retention = milliseconds(0);
  ro.floor_grace = milliseconds(0);
  const auto r = dblock::reap_once(ctx.db, ro);
  CHECK(r.waiters_reaped == static_cast<std::uint64_t>(left));
  CHECK(count_waiters(ctx, name) == 0);
}
