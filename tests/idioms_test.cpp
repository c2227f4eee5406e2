// The C++ idioms (include/dblock/lockable.hpp, deadline.hpp, error.hpp) on every backend: the
// standard lock wrappers over dblock::lockable and dblock::shared_lockable (compile-time checks,
// then exclusion, timeouts and deadlines in the past), waits of any std::chrono duration with
// saturating deadlines (max() waits for ever: UBSan checks the arithmetic in the ASan run), the
// std::error_code forms of the try calls, and a lease_lock shared by threads refused loudly.
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "dblock/lockable.hpp"
#include "harness.hpp"

using dblock::lease_lock;
using dblock::lockable;
using dblock::shared_lockable;
using dblock::steady_clock;
using namespace dblock::test;

namespace {

// Compile-time: the standard wrappers accept the adapters (instantiating them is the check).
template <class M>
void use_timed_lockable(M& m) {
  { std::lock_guard<M> g(m); }
  {
    std::unique_lock<M> u(m, std::defer_lock);
    (void)u.try_lock();
    (void)u.try_lock_for(milliseconds(1));
    (void)u.try_lock_until(steady_clock::now());
  }
}
template <class M>
void use_shared_timed_lockable(M& m) {
  use_timed_lockable(m);
  std::shared_lock<M> s(m, std::defer_lock);
  (void)s.try_lock_for(std::chrono::microseconds(1));
}
[[maybe_unused]] void compile_checks(lockable<lease_lock>& a, lockable<dblock::semaphore>& b,
                                     lockable<dblock::lock_set>& c,
                                     shared_lockable<dblock::rwlock>& d) {
  use_timed_lockable(a);
  use_timed_lockable(b);
  use_timed_lockable(c);
  use_shared_timed_lockable(d);
  std::scoped_lock both(a, c);
}

double ms_since(steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(steady_clock::now() - t0).count();
}

// Runs `fn` on another thread and waits for it (its exceptions fail the test there).
template <class F>
void on_thread(F&& fn) {
  std::thread t(std::forward<F>(fn));
  t.join();
}

}  // namespace

TEST_CASE("deadline_after and deadline_from saturate and round up", "[unit][idioms]") {
  using dblock::deadline_after;
  using dblock::deadline_from;
  const auto never = steady_clock::time_point::max();
  CHECK(deadline_after(milliseconds::max()) == never);
  CHECK(deadline_after(std::chrono::hours::max()) == never);
  CHECK(deadline_after(std::chrono::nanoseconds::max()) == never);
  CHECK(deadline_after(std::chrono::duration<double>(std::numeric_limits<double>::infinity())) ==
        never);
  CHECK(deadline_after(std::chrono::duration<double>(1e300)) == never);
  // Negative controls of the saturation: finite waits are not "never".
  CHECK(deadline_after(std::chrono::hours(24 * 365)) != never);
  CHECK(deadline_after(std::chrono::duration<double>(2.5)) != never);

  // (Each value is taken before the clock is read again: the operands of a comparison are
  // evaluated in no set order.)
  const auto before = steady_clock::now();
  const auto zero = deadline_after(milliseconds(0));
  const auto negative = deadline_after(milliseconds(-5));
  const auto lowest = deadline_after(milliseconds::min());
  const auto nan = deadline_after(std::chrono::duration<double>(std::nan("")));
  const auto after = steady_clock::now();
  for (const auto& t : {zero, negative, lowest, nan}) {
    CHECK(t >= before);  // now: one try, never a point before the call
    CHECK(t <= after);
  }
  // A fraction of a tick rounds up, so a tiny positive wait is not zero.
  const auto t0 = steady_clock::now();
  CHECK(deadline_after(std::chrono::duration<long long, std::pico>(1)) > t0);
  const auto q0 = steady_clock::now();
  const auto quarter = deadline_after(std::chrono::duration<double>(0.25));
  const auto q1 = steady_clock::now();
  CHECK(quarter - q0 >= milliseconds(250));
  CHECK(quarter - q1 <= milliseconds(250));
  const auto u0 = steady_clock::now();
  const auto us = deadline_after(std::chrono::microseconds(1500));
  const auto u1 = steady_clock::now();
  CHECK(us - u0 >= std::chrono::microseconds(1500));
  CHECK(us - u1 <= std::chrono::microseconds(1500));

  CHECK(deadline_from(never) == never);
  CHECK(deadline_from(std::chrono::time_point<steady_clock, std::chrono::hours>::max()) == never);
  CHECK(deadline_from(std::chrono::system_clock::time_point::max()) == never);
  CHECK(deadline_from(
            std::chrono::time_point<std::chrono::system_clock, std::chrono::hours>::max()) ==
        never);
  const auto sys_min = deadline_from(std::chrono::system_clock::time_point::min());
  const auto sys_hours_min =
      deadline_from(std::chrono::time_point<std::chrono::system_clock, std::chrono::hours>::min());
  const auto past_end = steady_clock::now();
  CHECK(sys_min <= past_end);
  CHECK(sys_hours_min <= past_end);
  const auto sys = deadline_from(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const auto sys_end = steady_clock::now();
  CHECK(sys - sys_end > std::chrono::seconds(9));
  CHECK(sys - sys_end <= std::chrono::seconds(10));
}

DBLOCK_TEST("std::lock_guard over a shared lockable<lease_lock>: threads exclude each other",
            "[idioms]") {
  const std::string name = "idiom-" + dblock::test::random_suffix();
  dblock::lease_options o;
  o.ttl = std::chrono::seconds(20);
  lockable<lease_lock> m(ctx.db, name, o);
  lockable<lease_lock> control(ctx.db, name + "-control", o);
  // The counter is written as read-sleep-write, so an overlap loses updates.
  auto run = [&](auto& mutex_for, bool locked) {
    constexpr int threads = 4, rounds = 8;
    // Relaxed atomics: a lost update stays possible (read, sleep, write), a data race is not
    // (the threads synchronise through the database, which ThreadSanitizer cannot see).
    std::atomic<int> counter{0};
    std::atomic<int> inside{0}, most{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < rounds; ++i) {
          std::optional<std::lock_guard<lockable<lease_lock>>> g;
          if (locked) g.emplace(mutex_for(t));
          const int now = ++inside;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          const int v = counter.load(std::memory_order_relaxed);
          std::this_thread::sleep_for(milliseconds(2));
          counter.store(v + 1, std::memory_order_relaxed);
          --inside;
        }
      });
    for (auto& t : ts)
      t.join();
    return std::make_pair(counter.load(), most.load());
  };
  auto shared = [&](int) -> lockable<lease_lock>& { return m; };
  const auto [count, most] = run(shared, true);
  CHECK(count == 32);
  CHECK(most == 1);
  // Negative control: the same workload without the lock overlaps and loses updates.
  const auto [lost, overlap] = run(shared, false);
  CHECK(overlap > 1);
  CHECK(lost < 32);
  (void)control;
}

DBLOCK_TEST("lockable: try_lock_for and try_lock_until time out, in the past try once",
            "[idioms]") {
  const std::string name = "idiom-" + dblock::test::random_suffix();
  lockable<lease_lock> m(ctx.db, name);
  std::unique_lock<lockable<lease_lock>> held(m);  // this thread holds it
  CHECK(held.owns_lock());
  const std::int64_t fence = m.guard().fence();
  CHECK(fence > 0);
  const long long no_wait_ms = no_wait_bound_ms(ctx.db);
  on_thread([&] {
    auto t0 = steady_clock::now();
    CHECK_FALSE(m.try_lock());
    CHECK_FALSE(m.try_lock_for(milliseconds(150)));
    CHECK(ms_since(t0) >= 150);
    t0 = steady_clock::now();
    CHECK_FALSE(m.try_lock_until(steady_clock::now() - std::chrono::seconds(1)));
    CHECK_FALSE(m.try_lock_for(std::chrono::duration<double>(-1.0)));
    const double tries_ms = ms_since(t0);
    INFO("two tries took " << tries_ms << " ms; bound " << no_wait_ms << " ms");
    CHECK(tries_ms < no_wait_ms);  // one try each, no wait
    t0 = steady_clock::now();
    CHECK_FALSE(m.try_lock_until(std::chrono::system_clock::now() + milliseconds(120)));
    CHECK(ms_since(t0) >= 110);
    CHECK(code_of([&] { m.unlock(); }) == errc::not_owner);  // this thread holds nothing
    CHECK(code_of([&] { (void)m.guard(); }) == errc::not_owner);
  });
  // Not recursive: locking again on the holding thread is refused, not a self-deadlock.
  CHECK(code_of([&] { (void)m.try_lock(); }) == errc::invalid_argument);
  held.unlock();
  on_thread([&] {
    std::unique_lock<lockable<lease_lock>> u(m, std::defer_lock);
    CHECK(u.try_lock_for(milliseconds(500)));
    CHECK(m.guard().fence() > fence);  // a new acquisition, a greater fence
  });
  // A deadline in the past still takes a free lock (one try).
  CHECK(m.try_lock_until(steady_clock::time_point::min()));
  m.unlock();
}

DBLOCK_TEST("lockable: lock() waits for ever until the holder on another thread unlocks",
            "[idioms]") {
  const std::string name = "idiom-" + dblock::test::random_suffix();
  lockable<lease_lock> m(ctx.db, name);
  m.lock();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    std::lock_guard<lockable<lease_lock>> g(m);
    got = true;
  });
  std::this_thread::sleep_for(milliseconds(300));
  CHECK_FALSE(got.load());  // control: it is really waiting
  m.unlock();
  waiter.join();
  CHECK(got.load());
}

DBLOCK_TEST("std::scoped_lock over two lockables, and lockable<semaphore> admits N threads",
            "[idioms]") {
  const std::string p = "idiom-" + dblock::test::random_suffix();
  lockable<lease_lock> a(ctx.db, p + "-a");
  lockable<dblock::lock_set> set(ctx.db, std::vector<std::string>{p + "-b", p + "-c"});
  {
    std::scoped_lock both(a, set);
    CHECK(a.guard().valid());
    CHECK(set.guard().size() == 2);
    on_thread([&] {
      CHECK_FALSE(a.try_lock());
      CHECK_FALSE(set.try_lock());
    });
  }
  on_thread([&] {
    std::scoped_lock both(a, set);  // both free again
    CHECK(set.guard().valid());
  });

  lockable<dblock::semaphore> sem(ctx.db, p + "-sem", 2);
  sem.lock();
  std::optional<bool> second, third;
  std::thread t2([&] {
    second = sem.try_lock_for(milliseconds(2000));
    std::thread t3([&] { third = sem.try_lock_for(milliseconds(200)); });
    t3.join();
    if (*second) sem.unlock();
  });
  t2.join();
  CHECK(second == true);  // two permits: a second thread gets one
  CHECK(third == false);  // a third does not
  sem.unlock();
}

DBLOCK_TEST("std::shared_lock over shared_lockable<rwlock>: readers together, writers alone",
            "[idioms]") {
  const std::string name = "idiom-" + dblock::test::random_suffix();
  shared_lockable<dblock::rwlock> rw(ctx.db, name);
  {
    std::shared_lock<shared_lockable<dblock::rwlock>> r1(rw);
    std::optional<bool> other_reader;
    std::optional<errc> upgrade;
    on_thread([&] {
      std::shared_lock<shared_lockable<dblock::rwlock>> r2(rw, std::defer_lock);
      other_reader = r2.try_lock_for(milliseconds(2000));
      // Not recursive: no upgrade from a read to a write on one thread.
      upgrade = code_of([&] { (void)rw.try_lock_for(milliseconds(200)); });
    });
    CHECK(other_reader == true);
    CHECK(upgrade == errc::invalid_argument);
    on_thread([&] { CHECK_FALSE(rw.try_lock_for(milliseconds(200))); });  // readers are in
  }
  std::unique_lock<shared_lockable<dblock::rwlock>> w(rw);
  on_thread([&] { CHECK_FALSE(rw.try_lock_shared_for(milliseconds(200))); });
  CHECK(w.owns_lock());
}

DBLOCK_TEST("waits take any duration: max() waits for ever, zero or negative tries once",
            "[idioms]") {
  const std::string name = "idiom-" + dblock::test::random_suffix();
  lease_lock holder(ctx.db, name);
  auto held = holder.acquire(milliseconds::max());  // free: at once
  const std::int64_t first = held.fence();
  // A wait for ever ends when the holder releases (on another thread, after 300 ms).
  std::thread releaser = run_after(milliseconds(300), [&] { held.release(); });
  lease_lock waiter(ctx.db, name);
  auto t0 = steady_clock::now();
  auto g = waiter.acquire(std::chrono::hours::max());
  releaser.join();
  CHECK(ms_since(t0) >= 250);
  CHECK(g.fence() > first);
  // Held: every finite form times out near its own length.
  lease_lock other(ctx.db, name);
  const long long no_wait_ms = no_wait_bound_ms(ctx.db);
  t0 = steady_clock::now();
  CHECK(code_of([&] { (void)other.acquire(std::chrono::duration<double>(0.2)); }) == errc::timeout);
  CHECK(ms_since(t0) >= 200);
  t0 = steady_clock::now();
  CHECK(code_of([&] { (void)other.acquire(std::chrono::microseconds(150000)); }) == errc::timeout);
  CHECK(ms_since(t0) >= 150);
  t0 = steady_clock::now();
  CHECK(code_of([&] { (void)other.acquire(milliseconds(-5)); }) == errc::timeout);
  CHECK(code_of([&] { (void)other.acquire(std::chrono::seconds(0)); }) == errc::timeout);
  CHECK(code_of([&] { (void)other.acquire_until(steady_clock::now() - std::chrono::hours(1)); }) ==
        errc::timeout);
  const double tries_ms = ms_since(t0);
  INFO("three tries took " << tries_ms << " ms; bound " << no_wait_ms << " ms");
  CHECK(tries_ms < no_wait_ms);  // one try each
  g.release();
  // Free: a negative wait still makes its one try, and takes it.
  auto again = other.acquire(milliseconds(-1));
  CHECK(again.fence() > g.fence());
}

DBLOCK_TEST("every kind's wait takes any duration and max()", "[idioms]") {
  const std::string p = "idiom-" + dblock::test::random_suffix();
  dblock::semaphore sem(ctx.db, p + "-sem", 1);
  auto s1 = sem.acquire(std::chrono::seconds::max());
  CHECK(code_of([&] {
          dblock::semaphore s(ctx.db, p + "-sem", 1);
          (void)s.acquire(std::chrono::duration<double, std::milli>(120.5));
        }) == errc::timeout);
  CHECK(code_of([&] {
          dblock::semaphore s(ctx.db, p + "-sem", 1);
          (void)s.acquire(milliseconds(-1));  // was refused as invalid_argument before
        }) == errc::timeout);

  dblock::rwlock rw(ctx.db, p + "-rw");
  auto r = rw.acquire_shared(milliseconds::max());
  dblock::rwlock rw2(ctx.db, p + "-rw");
  auto r2 = rw2.acquire_shared(std::chrono::microseconds(2000000));
  CHECK(code_of([&] { (void)rw2.acquire(std::chrono::duration<float>(0.1f)); }) == errc::timeout);
  CHECK(code_of([&] { (void)rw2.acquire(milliseconds(-1)); }) == errc::timeout);

  dblock::lock_set set(ctx.db, std::vector<std::string>{p + "-x", p + "-y"});
  auto sg = set.acquire(std::chrono::minutes::max());
  dblock::lock_set set2(ctx.db, std::vector<std::string>{p + "-y"});
  CHECK(code_of([&] { (void)set2.acquire(std::chrono::duration<double>(0.1)); }) == errc::timeout);

  dblock::election e(ctx.db, p + "-el", "me");
  auto lead = e.campaign(milliseconds::max());
  dblock::election e2(ctx.db, p + "-el", "you");
  CHECK(code_of([&] { (void)e2.campaign(std::chrono::duration<double>(0.1)); }) == errc::timeout);
  CHECK(code_of([&] { (void)e2.campaign_until(steady_clock::time_point::min()); }) ==
        errc::timeout);
}

DBLOCK_TEST("the try calls' std::error_code forms report failures without throwing", "[idioms]") {
  // An unmigrated table prefix: every statement finds dblock's tables missing.
  dblock::database_options o = ctx.options();
  o.table_prefix = ctx.new_prefix();
  dblock::database bare = ctx.open(o);
  const std::string p = "idiom-" + dblock::test::random_suffix();
  std::error_code ec = errc::timeout;  // cleared on success
  lease_lock ok(ctx.db, p);
  auto g = ok.try_acquire(ec);
  CHECK(g);
  CHECK_FALSE(ec);
  lease_lock busy(ctx.db, p);
  ec = errc::timeout;
  CHECK_FALSE(busy.try_acquire(ec));  // contention: empty, no error
  CHECK_FALSE(ec);

  lease_lock missing(bare, p);
  CHECK_FALSE(missing.try_acquire(ec));
  CHECK(ec == errc::schema_missing);
  dblock::semaphore sem(bare, p, 2);
  ec.clear();
  CHECK_FALSE(sem.try_acquire(ec));
  CHECK(ec == errc::schema_missing);
  dblock::rwlock rw(bare, p);
  ec.clear();
  CHECK_FALSE(rw.try_acquire_shared(ec));
  CHECK(ec == errc::schema_missing);
  ec.clear();
  CHECK_FALSE(rw.try_acquire(ec));
  CHECK(ec == errc::schema_missing);
  dblock::lock_set set(bare, std::vector<std::string>{p});
  ec.clear();
  CHECK_FALSE(set.try_acquire(ec));
  CHECK(ec == errc::schema_missing);
  dblock::election el(bare, p, "me");
  ec.clear();
  CHECK_FALSE(el.try_campaign(ec));
  CHECK(ec == errc::schema_missing);
  // Control: the throwing form throws that same code.
  CHECK(code_of([&] { (void)missing.try_acquire(); }) == errc::schema_missing);
}

DBLOCK_TEST("a lease_lock shared by threads is refused, not re-entered across threads",
            "[idioms]") {
  const std::string name = "idiom-" + dblock::test::random_suffix();
  lease_lock shared(ctx.db, name);
  auto g = shared.try_acquire();
  REQUIRE(g);
  // Another thread through the same object would "re-enter" this thread's lease: refused.
  on_thread([&] {
    CHECK(code_of([&] { (void)shared.try_acquire(); }) == errc::invalid_argument);
    CHECK(code_of([&] { (void)shared.acquire(milliseconds(100)); }) == errc::invalid_argument);
  });
  // The holding thread re-enters as before (control).
  auto again = shared.try_acquire();
  REQUIRE(again);
  CHECK(again->hold_count() == 2);
  again->release();
  g->release();
  // Released: handing the object to another thread is fine.
  on_thread([&] {
    auto h = shared.try_acquire();
    CHECK(h);
  });
  // Two threads inside it at once: the second is refused while the first waits.
  lease_lock blocker(ctx.db, name);
  auto b = blocker.try_acquire();
  REQUIRE(b);
  std::optional<errc> first;
  std::thread waiting([&] { first = code_of([&] { (void)shared.acquire(milliseconds(1500)); }); });
  std::this_thread::sleep_for(milliseconds(300));
  CHECK(code_of([&] { (void)shared.try_acquire(); }) == errc::invalid_argument);
  waiting.join();
  CHECK(first == errc::timeout);
}
