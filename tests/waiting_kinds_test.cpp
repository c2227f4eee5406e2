// The one waiting engine for the kinds that wait for more than one lease row (lease/queue_wait):
// a semaphore's waiters and a read-write lock's readers and draining writer join the queue of
// waiters, a release rings them across database handles (as across processes), fair semaphores
// let no newcomer past a queued waiter (with the unfair control, which does), and list_locks()
// and `dblock status` show the waiters. [direct]: rings across handles need LISTEN, which
// PgBouncer's transaction mode cannot carry.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"
#include "waiting_support.hpp"

using dblock::lease_guard;
using namespace dblock::test;

namespace {

// Waits long enough that only a ring ends a wait early: leases and queue entries of 30 s, and
// a safety-net poll of 30 s.
dblock::lease_options ring_only() {
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(30);
  lo.poll_max = std::chrono::seconds(30);
  return lo;
}

// The queue a semaphore's waiters join.
std::string queue_of(const std::string& semaphore) {
  return semaphore +
         "\xEF\xBF\xBF"
         "Q";
}

// A handle of its own with a listener counting its wake-ups.
struct counted_handle {
  std::shared_ptr<counting_listener> events = std::make_shared<counting_listener>();
  dblock::database db;
  explicit counted_handle(const context& ctx)
      : db([&] {
          auto o = ctx.options();
          o.events = events;
          return ctx.open(o);
        }()) {}
};

// `wait` runs on a thread of its own until it returns; `granted` is when (monotonic ns).
struct waiter_thread {
  long long granted = 0;
  std::string error;
  std::thread t;
  explicit waiter_thread(std::function<lease_guard()> wait)
      : t([this, wait] {
          try {
            auto g = wait();
            granted = monotonic_ns();
            g.release();
          } catch (const std::exception& e) {
            error = e.what();
          }
        }) {}
  void join() { t.join(); }
};

// A wait of another handle (`wait`, on its own thread) queued in `queue` and then freed by
// `free_it`: how long after the freeing it was granted (ms), whether a ring reached it, and the
// rows list_locks() showed for `queue` with one waiter while it waited. Fails the test when the
// waiter never queued or failed, or was not rung. The handle listens before the waiter comes (a
// probe keeps it listening), so the waiter is confirmed as it enlists and sleeps relying on
// rings from its first read; the freeing waits until it is queued and confirmed (ring_probe).
struct rung_wait {
  long long after_ms = -1;
  bool woken = false;
  int listed = 0;
};
rung_wait wait_rung(const context& ctx, const std::string& queue, counted_handle& h,
                    const std::function<lease_guard()>& wait,
                    const std::function<void()>& free_it) {
  ring_probe early(h.db);
  const bool listening = early.wait_reached(milliseconds(20000));
  waiter_thread waiter(wait);
  const bool queued = wait_for_waiters(ctx, queue, 1, milliseconds(20000)) &&
                      wait_rings_reach(h.db, milliseconds(20000));
  const bool asleep = queued && let_confirmation_look_end(h.db);
  rung_wait r;
  for (const auto& l : dblock::list_locks(ctx.db))
    if (l.name == queue && l.waiters == 1) ++r.listed;
  const long long freed = monotonic_ns();
  free_it();
  waiter.join();
  REQUIRE(listening);
  REQUIRE(queued);
  REQUIRE(asleep);
  INFO("waiter: " << waiter.error);
  REQUIRE(waiter.error.empty());
  r.after_ms = (waiter.granted - freed) / ns_per_ms;
  r.woken = h.events->woken_n.load() >= 1;
  CHECK(count_waiters(ctx, queue) == 0);  // the waiter left the queue
  INFO("granted " << r.after_ms << " ms after the release (safety net 30 s)");
  CHECK(r.after_ms < scaled_bound_ms(ctx.db, 3000));
  CHECK(r.woken);
  return r;
}

}  // namespace

// A waiter of another handle queued for a semaphore's one permit; the permit is freed by its
// holder's release or by a forced release. The waiter must be rung: granted well before its
// 30 s safety net, with a wake-up counted by its handle.
void rung_when_freed(const context& ctx, bool forced) {
  const std::string name = unique_name("ring");
  dblock::semaphore holder(ctx.db, name, 1, ring_only());
  auto h = holder.try_acquire();
  REQUIRE(h);
  counted_handle w(ctx);
  dblock::semaphore sem(w.db, name, 1, ring_only());
  const rung_wait r = wait_rung(
      ctx, queue_of(name), w, [&] { return sem.acquire(std::chrono::seconds(25)); },
      [&] {
        if (forced)
          (void)dblock::force_release(ctx.open(), h->name(), "test: stuck permit",
                                      "waiting_kinds_test");
        else
          h->release();
      });
  CHECK(r.listed == 1);  // list_locks() showed the semaphore's waiter
}

DBLOCK_TEST("semaphore: a waiter of another handle is rung by a permit's release, not polled",
            "[semaphore][waiting][direct]") {
  rung_when_freed(ctx, false);
}

DBLOCK_TEST("semaphore: a forced release of a permit rings the semaphore's waiter",
            "[semaphore][waiting][direct]") {
  rung_when_freed(ctx, true);
}

DBLOCK_TEST("negative control: a permit that expires unreleased rings nobody",
            "[semaphore][waiting][direct][control]") {
  // The waiter's wake-up count above counts rings only: here the permit comes back at its TTL,
  // found by the waiter's safety net (bounded by the holder's expiry), and nothing rang.
  const std::string name = unique_name("expire");
  auto lo = ring_only();
  lo.ttl = milliseconds(1500);
  dblock::semaphore holder(ctx.db, name, 1, lo);
  auto h = holder.try_acquire();  // never released
  REQUIRE(h);
  counted_handle w(ctx);
  // The waiter's own polls find it (every 2 s at most here; a 30 s safety net made this control
  // take 10 s, 60 s of every CI run over the backends and the ASan run).
  auto wo = ring_only();
  wo.poll_max = milliseconds(2000);
  dblock::semaphore sem(w.db, name, 1, wo);
  auto g = sem.acquire(std::chrono::seconds(20));
  CHECK(g.valid());
  CHECK(w.events->woken_n.load() == 0);
}

DBLOCK_TEST("semaphore: list_locks shows the waiters of a semaphore, by pattern too",
            "[semaphore][waiting]") {
  const std::string name = unique_name("status");
  dblock::semaphore holder(ctx.db, name, 1, ring_only());
  auto h = holder.try_acquire();
  REQUIRE(h);
  auto wdb = ctx.open();
  dblock::semaphore sem(wdb, name, 1, ring_only());
  waiter_thread waiter([&] { return sem.acquire(std::chrono::seconds(25)); });
  const bool queued = wait_for_waiters(ctx, queue_of(name), 1, milliseconds(20000));
  auto rows = dblock::list_locks(ctx.db);
  dblock::list_options mine;
  mine.pattern = name + "*";
  auto matching = dblock::list_locks(ctx.db, mine);
  dblock::list_options other;
  other.pattern = "no-such-name*";
  auto none = dblock::list_locks(ctx.db, other);
  h->release();
  waiter.join();
  REQUIRE(queued);
  REQUIRE(waiter.error.empty());
  int found = 0;
  for (const auto& r : rows) {
    if (r.name != queue_of(name)) continue;
    ++found;
    CHECK(!r.held);
    CHECK(r.waiters == 1);
    CHECK(!r.head_waiter.empty());
    CHECK(dblock::semaphore::queue_of(r.name) == name);
  }
  CHECK(found == 1);
  // The held permit and the queue: both match the semaphore's name.
  CHECK(matching.size() == 2);
  CHECK(none.empty());
  CHECK(!dblock::semaphore::queue_of(name));
}

// A fair semaphore: a newcomer that tries over and over around a release finds the waiter queued
// and is refused; the permit goes to the waiter (whoever got it first holds it until the other's
// grant is impossible, so comparing the two grant times is exact).
DBLOCK_TEST("semaphore: fair, a newcomer never takes a permit a queued waiter waits for",
            "[semaphore][waiting][direct]") {
  auto lo = ring_only();
  lo.fair = true;
  for (int round = 0; round < 3; ++round) {
    const std::string name = unique_name("fair");
    dblock::semaphore holder(ctx.db, name, 1, lo);
    auto h = holder.try_acquire();
    REQUIRE(h);
    auto wdb = ctx.open();
    dblock::semaphore sem(wdb, name, 1, lo);
    waiter_thread waiter([&] { return sem.acquire(std::chrono::seconds(25)); });
    REQUIRE(wait_for_waiters(ctx, queue_of(name), 1, milliseconds(20000)));
    auto ndb = ctx.open();
    dblock::semaphore newcomer(ndb, name, 1, lo);
    CHECK(!newcomer.try_acquire());  // held, and a waiter queued
    std::atomic<bool> stop{false};
    long long newcomer_at = 0;
    std::thread spinner([&] {
      while (!stop.load()) {
        if (auto n = newcomer.try_acquire()) {
          newcomer_at = monotonic_ns();
          n->release();
          return;
        }
      }
    });
    std::this_thread::sleep_for(milliseconds(20));
    h->release();
    waiter.join();
    stop = true;
    spinner.join();
    INFO("waiter: " << waiter.error);
    REQUIRE(waiter.error.empty());
    INFO("round " << round << ": the newcomer got a permit "
                  << (newcomer_at - waiter.granted) / 1000 << " us after the waiter (0: never)");
    CHECK((newcomer_at == 0 || newcomer_at > waiter.granted));
  }
}

// A waiter that stalls in the queue (its entry planted: nothing rings or refreshes it) while
// the lock is free. Fair, a newcomer is refused: a semaphore's try and its own wait, which
// queues behind the stalled entry and times out; a read-write lock's reader and writer tries.
// The control, unfair, takes the permit or the read at once.
void stalled_waiter_ahead(const context& ctx, bool fair, bool rwlock) {
  auto lo = ring_only();
  lo.fair = fair;
  const std::string name = unique_name("stalled");
  if (rwlock) {
    dblock::rwlock rw(ctx.db, name, lo);
    rw.try_acquire()->release();  // the writer row exists, as when a real waiter queued
    plant_waiter(ctx, name, "stalled-host");
    auto r = rw.try_acquire_shared();
    CHECK(r.has_value() == !fair);
    if (fair) CHECK(!rw.try_acquire());
    return;
  }
  dblock::semaphore sem(ctx.db, name, 1, lo);
  plant_waiter(ctx, queue_of(name), "stalled-host");
  auto g = sem.try_acquire();
  CHECK(g.has_value() == !fair);
  if (fair) {
    CHECK(code_of([&] { (void)sem.acquire(milliseconds(300)); }) == errc::timeout);
    CHECK(count_waiters(ctx, queue_of(name)) == 1);  // its own entry left with it
  }
}

DBLOCK_TEST("semaphore: fair, a free permit waits for a stalled waiter ahead", "[semaphore]") {
  stalled_waiter_ahead(ctx, true, false);
}

DBLOCK_TEST("negative control: an unfair semaphore takes the permit past a stalled waiter",
            "[semaphore][control]") {
  stalled_waiter_ahead(ctx, false, false);
}

DBLOCK_TEST("rwlock: fair, neither a reader nor a writer gets past a stalled waiter", "[rwlock]") {
  stalled_waiter_ahead(ctx, true, true);
}

DBLOCK_TEST("negative control: an unfair reader reads past a stalled waiter", "[rwlock][control]") {
  stalled_waiter_ahead(ctx, false, true);
}

// A read-write lock's waiter of another handle: a reader held back by a writer (it waits in the
// writer's queue, listed as a waiter of the writer's held row), or a writer waiting for a
// reader to leave (it holds its row and waits in the readers' semaphore's queue). Either is
// rung when the other side releases.
void rwlock_rung(const context& ctx, bool reader_waits) {
  const std::string name = unique_name(reader_waits ? "rw-read" : "rw-drain");
  dblock::rwlock first(ctx.db, name, ring_only());
  auto held = reader_waits ? first.try_acquire() : first.try_acquire_shared();
  REQUIRE(held);
  counted_handle h(ctx);
  dblock::rwlock second(h.db, name, ring_only());
  const std::string queue = reader_waits ? name
                                         : queue_of(name +
                                                    "\xEF\xBF\xBF"
                                                    "R");
  const rung_wait r = wait_rung(
      ctx, queue, h,
      [&] {
        return reader_waits ? second.acquire_shared(std::chrono::seconds(25))
                            : second.acquire(std::chrono::seconds(25));
      },
      [&] { held->release(); });
  CHECK(r.listed == 1);
}

DBLOCK_TEST("rwlock: a waiting reader of another handle is rung by the writer's release",
            "[rwlock][waiting][direct]") {
  rwlock_rung(ctx, true);
}

DBLOCK_TEST("rwlock: a writer waiting for readers is rung by the last reader's release",
            "[rwlock][waiting][direct]") {
  rwlock_rung(ctx, false);
}
