// The watchdog as the database handle's renewer: many leases renewed in batches by two threads,
// a fenced write in progress delaying only its own lease, and losses still reported in time.
#include <dirent.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dblock/admin.hpp"
#include "dblock/error.hpp"
#include "dblock/lease_lock.hpp"
#include "dblock/listener.hpp"
#include "dblock/lock_set.hpp"
#include "harness.hpp"

using dblock::lease_lock;
using dblock::lease_options;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;

namespace {

// Counts the watchdog's batches and losses.
class renewal_counter : public dblock::listener {
 public:
  void renewed(std::size_t leases, std::size_t round_trips) override {
    std::lock_guard<std::mutex> lk(mu_);
    batches_.push_back({steady::now(), leases, round_trips});
  }
  void lease_lost(std::string_view, const dblock::error&) override { ++lost; }

  struct batch {
    steady::time_point at;
    std::size_t leases = 0;
    std::size_t round_trips = 0;
  };
  std::vector<batch> batches() const {
    std::lock_guard<std::mutex> lk(mu_);
    return batches_;
  }
  /// Forgets the batches and losses so far (a new attempt).
  void reset() {
    std::lock_guard<std::mutex> lk(mu_);
    batches_.clear();
    lost = 0;
  }
  std::atomic<int> lost{0};

 private:
  mutable std::mutex mu_;
  std::vector<batch> batches_;
};

// Threads of this process.
int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

dblock::database open_counted(const dblock::test::context& ctx,
                              const std::shared_ptr<renewal_counter>& events) {
  auto o = ctx.options();
  o.events = events;
  return ctx.open(o);
}

lease_options watched(milliseconds ttl) {
  lease_options o;
  o.ttl = ttl;
  o.watchdog = true;
  return o;
}

}  // namespace

DBLOCK_TEST("the watchdog renews a thousand leases in batches from two threads", "[watchdog]") {
  const int leases = dblock::test::full_run()          ? 10000
                     : dblock::test::sanitized_build() ? 300
                                                       : 1000;
  auto events = std::make_shared<renewal_counter>();
  auto db = open_counted(ctx, events);
  const std::string stem = "many/" + dblock::test::random_suffix() + "/";
  // The TTL: 1.5 s, or longer where the machine's durable writes are slow now (a SQLite commit
  // waits for the disk, which other jobs' writes can slow tenfold): at least the time twice
  // the acquires take at the pace of 20 acquire-release cycles measured here, so that the
  // batches keep up with the leases whatever the disk (the count of statements is what is
  // checked, not their speed).
  milliseconds ttl(1500);
  {
    lease_lock probe(db, stem + "probe");
    const auto t0 = steady::now();
    for (int i = 0; i < 20; ++i) {
      auto g = probe.try_acquire();
      REQUIRE(g);
      g->release();
    }
    const auto cycle =
        std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - t0) / 20;
    ttl = std::max(ttl, std::chrono::duration_cast<milliseconds>(cycle * leases));
  }
  // Whether the batches keep up depends on the pace of the machine as well (a busy one can hold
  // the renewer's threads off for seconds): a run in which only that missed, with no wrong count,
  // runs again with twice and four times the TTL, and only the last one's misses fail.
  dblock::test::at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const milliseconds t = ttl * scale;
    const std::string tag = stem + std::to_string(scale) + "/";
    events->reset();
    INFO("ttl " << t.count() << " ms for " << leases << " leases");
    const int threads_before = thread_count();
    std::vector<lease_lock> locks;
    std::vector<dblock::lease_guard> guards;
    locks.reserve(static_cast<std::size_t>(leases));
    for (int i = 0; i < leases; ++i) {
      locks.emplace_back(db, tag + std::to_string(i), watched(t));
      auto g = locks.back().try_acquire();
      REQUIRE(g);
      guards.push_back(std::move(*g));
    }
    const auto held_from = steady::now();
    // The renewer's two threads, whatever the number of leases (one thread per lease before).
    CHECK(thread_count() <= threads_before + 2);
    std::this_thread::sleep_for(3 * t);
    int valid = 0;
    for (const auto& g : guards)
      valid += g.valid() ? 1 : 0;
    dblock::list_options lo;
    lo.pattern = tag + "*";
    lo.limit = 100000;
    const std::size_t listed = dblock::list_locks(db, lo).size();
    if (!last && (events->lost.load() != 0 || valid != leases)) {
      const std::string miss = "the watchdog lost " + std::to_string(events->lost.load()) + " of " +
                               std::to_string(leases) + " leases at TTL " +
                               std::to_string(t.count()) + " ms";
      for (auto& g : guards) {
        try {
          g.release();
        } catch (const dblock::error&) {  // a lost one
        }
      }
      return {miss};
    }
    CHECK(events->lost.load() == 0);
    CHECK(valid == leases);
    CHECK(listed == static_cast<std::size_t>(leases));
    // Every lease renewed at least once per TTL, in batches: many renewals per statement.
    std::size_t renewed = 0, round_trips = 0, largest = 0;
    for (const auto& b : events->batches()) {
      if (b.at < held_from) continue;
      renewed += b.leases;
      round_trips += b.round_trips;
      largest = std::max(largest, b.leases);
    }
    INFO("renewals " << renewed << ", round trips " << round_trips << ", largest batch "
                     << largest);
    CHECK(renewed >= static_cast<std::size_t>(3 * leases));
    CHECK(renewed >= 10 * round_trips);
    CHECK(largest >= 100);
    for (auto& g : guards)
      g.release();
    CHECK(dblock::list_locks(db, lo).empty());
    CHECK(events->lost.load() == 0);
    return {};
  });
}

DBLOCK_TEST("a fenced write in progress delays only its own lease's renewal", "[watchdog]") {
  auto events = std::make_shared<renewal_counter>();
  auto db = open_counted(ctx, events);
  // A renewal round must fall inside the write and another after it: the watchdog's pace on
  // this machine as well, so a run that missed only that runs again with twice and four times
  // the TTL and the write's length.
  dblock::test::at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const milliseconds ttl(1500 * scale);  // renewed every 500 ms at scale 1
    const std::string stem = "busy/" + dblock::test::random_suffix() + "/";
    events->reset();
    std::vector<lease_lock> locks;
    std::vector<dblock::lease_guard> guards;
    for (int i = 0; i < 10; ++i) {
      locks.emplace_back(db, stem + std::to_string(i), watched(ttl));
      auto g = locks.back().try_acquire();
      REQUIRE(g);
      guards.push_back(std::move(*g));
    }
    // The first lease's row stays locked by its fenced write for longer than a renewal interval
    // (SQLite: the whole database, so every renewal waits for it).
    steady::time_point from, to;
    guards[0].fenced([&](soci::session&) {
      from = steady::now();
      std::this_thread::sleep_for(milliseconds(700 * scale));
      to = steady::now();
    });
    std::this_thread::sleep_for(ttl);
    std::size_t during = 0, largest_during = 0, after = 0;
    for (const auto& b : events->batches()) {
      if (b.at > from && b.at < to) {
        during += b.leases;
        largest_during = std::max(largest_during, b.leases);
      }
      if (b.at > to) after += b.leases;
    }
    INFO("renewed during the fenced write " << during << ", after " << after << " (ttl "
                                            << ttl.count() << " ms)");
    int valid = 0;
    for (const auto& g : guards)
      valid += g.valid() ? 1 : 0;
    const bool others_renewed = ctx.backend == "sqlite" || (during >= 9 && largest_during == 9);
    if (!last && (!others_renewed || after < 10 || events->lost.load() != 0 || valid != 10))
      return {"renewed during the write " + std::to_string(during) + " (largest batch " +
              std::to_string(largest_during) + "), after " + std::to_string(after) + ", lost " +
              std::to_string(events->lost.load()) + ", valid " + std::to_string(valid)};
    if (ctx.backend != "sqlite") {
      // The others went on being renewed; the locked one was skipped, not waited for.
      CHECK(during >= 9);
      CHECK(largest_during == 9);
    }
    CHECK(after >= 10);
    CHECK(events->lost.load() == 0);
    // Valid a TTL after the write: renewed once it committed (its last renewal before the write
    // began would have run out by now).
    CHECK(guards[0].valid());
    for (auto& g : guards) {
      CHECK(g.valid());
      g.release();
    }
    return {};
  });
}

DBLOCK_TEST("on_lost may release its own guard; a slow report delays no other lease's release",
            "[watchdog]") {
  const std::string stem = "report/" + dblock::test::random_suffix() + "/";
  const milliseconds ttl(900);
  // A: on_lost releases A's own guard (it finds the lease lost), on the watchdog's thread.
  std::mutex mu;
  std::optional<dblock::lease_guard> guard_a;
  std::promise<std::string> a_released;
  lease_options oa = watched(ttl);
  oa.on_lost = [&](const dblock::error&) {
    std::lock_guard<std::mutex> lk(mu);
    try {
      guard_a->release();
      a_released.set_value("released");
    } catch (const dblock::error& e) {
      a_released.set_value(dblock::to_string(e.kind()));
    }
  };
  // B: on_lost takes 800 ms; meanwhile C (same handle, not lost) is released on this thread.
  std::promise<void> b_reporting;
  lease_options ob = watched(ttl);
  ob.on_lost = [&](const dblock::error&) {
    b_reporting.set_value();
    std::this_thread::sleep_for(milliseconds(800));
  };
  lease_lock a(ctx.db, stem + "a", oa), b(ctx.db, stem + "b", ob),
      c(ctx.db, stem + "c", watched(ttl));
  {
    std::lock_guard<std::mutex> lk(mu);
    guard_a = a.try_acquire();
    REQUIRE(guard_a);
  }
  auto gb = b.try_acquire();
  auto gc = c.try_acquire();
  REQUIRE(gb);
  REQUIRE(gc);
  dblock::force_release(ctx.db, stem + "a", "test", "watchdog_test");
  auto a_outcome = a_released.get_future();
  REQUIRE(a_outcome.wait_for(milliseconds(3000)) == std::future_status::ready);
  CHECK(a_outcome.get() == "lease_lost");  // the release itself found the lease taken

  dblock::force_release(ctx.db, stem + "b", "test", "watchdog_test");
  REQUIRE(b_reporting.get_future().wait_for(milliseconds(3000)) == std::future_status::ready);
  const auto t0 = steady::now();
  gc->release();
  CHECK(steady::now() - t0 < milliseconds(500));  // not behind B's 800 ms report
  CHECK_FALSE(gb->valid());
  // B's own release waits for B's report to end, then finds the lease lost.
  CHECK(dblock::test::code_of([&] { gb->release(); }) == dblock::errc::lease_lost);
}

// ---- lost(): the end of a hold as a signal the work can watch ---------------------------------

namespace {

// A work loop as a service would run it: steps until the guard's signal fires. Returns the
// number of steps and when it stopped.
struct work_loop {
  std::atomic<long long> steps{0};
  std::atomic<bool> stopped{false};
  steady::time_point stopped_at;
  std::thread t;
  explicit work_loop(const dblock::cancellation& lost) {
    t = std::thread([this, lost] {
      while (!lost.sleep_for(milliseconds(5)))
        ++steps;
      stopped_at = steady::now();
      stopped = true;
    });
  }
  // Waits for the loop to stop, at most `most`; true when it did.
  bool join_within(milliseconds most) {
    for (auto end = steady::now() + most; !stopped && steady::now() < end;)
      std::this_thread::sleep_for(milliseconds(5));
    const bool ok = stopped;
    if (!ok) return false;
    t.join();
    return true;
  }
  ~work_loop() {
    if (t.joinable()) t.detach();  // a failed check above: the loop ends with the process
  }
};

// Runs a work loop on `lost` until it has stepped, then forces `name` free: true when the loop
// stopped by itself (the watchdog renews every TTL/3 and finds the row taken; the bound, many
// TTLs, is liveness only).
bool forced_release_stops_work(const dblock::test::context& ctx, const dblock::cancellation& lost,
                               const std::string& name, milliseconds ttl) {
  work_loop work(lost);
  while (work.steps.load() < 3)
    std::this_thread::sleep_for(milliseconds(5));
  if (lost.cancelled()) return false;  // fired before the loss
  dblock::force_release(ctx.db, name, "test: the loss signal", "test");
  return work.join_within(30 * ttl);
}

}  // namespace

DBLOCK_TEST("lost() fires when the watchdog finds the lease lost; the work loop watching it stops",
            "[watchdog][lost-signal]") {
  lease_options o;
  o.ttl = milliseconds(1500);
  o.watchdog = true;
  std::atomic<int> on_lost_calls{0};
  o.on_lost = [&](const dblock::error&) { ++on_lost_calls; };
  const std::string name = "lost-signal-" + dblock::test::random_suffix();
  lease_lock lock(ctx.db, name, o);
  auto g = lock.try_acquire();
  REQUIRE(g);
  REQUIRE(forced_release_stops_work(ctx, g->lost(), name, o.ttl));
  CHECK(g->lost().cancelled());
  CHECK_FALSE(g->valid());
  CHECK(on_lost_calls.load() == 1);  // on_lost stays
}

DBLOCK_TEST("lost() fires when the local validity runs out, without the watchdog",
            "[watchdog][lost-signal]") {
  lease_options o;
  o.ttl = milliseconds(800);
  o.watchdog = false;
  lease_lock lock(ctx.db, "lost-validity-" + dblock::test::random_suffix(), o);
  auto g = lock.try_acquire();
  REQUIRE(g);
  const auto acquired = steady::now();
  const auto left = g->remaining();
  REQUIRE(g->lost().sleep_for(std::chrono::seconds(60)));
  // Never before the validity ends: the signal comes once valid() is false.
  CHECK_FALSE(g->valid());
  CHECK(steady::now() - acquired >= left);
}

DBLOCK_TEST("lost() fires at the release of the last hold; a disarmed guard's has fired",
            "[watchdog][lost-signal]") {
  lease_options o;
  o.ttl = milliseconds(30000);
  lease_lock lock(ctx.db, "lost-release-" + dblock::test::random_suffix(), o);
  auto outer = lock.acquire(std::chrono::seconds(10));
  auto inner = lock.acquire(std::chrono::seconds(10));  // reentrant: one lease, two holds
  const dblock::cancellation& sig = outer.lost();
  inner.release();
  CHECK_FALSE(sig.cancelled());  // the lease is still held
  CHECK_FALSE(sig.sleep_for(milliseconds(50)));
  outer.release();
  CHECK(sig.cancelled());
  dblock::lease_guard moved = std::move(outer);
  CHECK(outer.lost().cancelled());  // NOLINT(bugprone-use-after-move): disarmed
}

DBLOCK_TEST("a lock set's lost() fires when one of its leases is lost", "[watchdog][lost-signal]") {
  lease_options o;
  o.ttl = milliseconds(1500);
  o.watchdog = true;
  const std::string a = "set-lost-a-" + dblock::test::random_suffix();
  const std::string b = "set-lost-b-" + dblock::test::random_suffix();
  dblock::lock_set set(ctx.db, {a, b}, o);
  auto g = set.try_acquire();
  REQUIRE(g);
  REQUIRE(forced_release_stops_work(ctx, g->lost(), b, o.ttl));
  CHECK_FALSE(g->valid());
}
