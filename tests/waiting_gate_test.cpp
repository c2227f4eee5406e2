// The local gate of waiting acquires: threads of one handle reach the database one at a time,
// a holder whose lease ran out keeps no local waiter out, waits at the gate end on their timeout
// or cancellation, and one cancellation shared by many waits.
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

// ---- the local gate ----------------------------------------------------------------------------
// Waiting acquires of one handle that are not fair line up in the process before they go to the
// database (src/wake/gate.hpp): one thread per handle and name contends there at a time.

namespace {

// `threads` threads spread over `handles` handles, each with its own lease_lock of one name, take
// it `cycles` times each (hold 1 ms); returns the tries the database refused over the handles.
// Checks exclusion (an in-memory section flag) and the exact count.
std::uint64_t gate_run(const dblock::test::context& ctx, int handles, int threads, int cycles) {
  std::vector<dblock::database> dbs;
  for (int h = 0; h < handles; ++h) {
    auto o = ctx.options();
    o.pool_size = threads + 2;
    dbs.push_back(ctx.open(o));
  }
  const std::string name = "gate-" + dblock::test::random_suffix();
  std::atomic<int> inside{0}, overlaps{0}, count{0};
  const long long start = monotonic_ns() + 200 * ns_per_ms;
  const auto errors = on_threads(threads, [&](int t) {
    dblock::lease_options lo;
    lo.ttl = std::chrono::seconds(10);
    dblock::lease_lock lock(dbs[static_cast<std::size_t>(t % handles)], name, lo);
    dblock::test::sleep_until_monotonic(start);
    for (int i = 0; i < cycles; ++i) {
      auto g = lock.acquire(std::chrono::seconds(60));
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      std::this_thread::sleep_for(milliseconds(1));
      count.fetch_add(1);
      inside.fetch_sub(1);
      g.release();
    }
  });
  INFO("first error: " << (errors.empty() ? "" : errors.front()));
  REQUIRE(errors.empty());
  CHECK(overlaps.load() == 0);
  CHECK(count.load() == threads * cycles);
  std::uint64_t refused = 0;
  for (const auto& db : dbs)
    refused += dblock::test::refused_tries_of(db);
  return refused;
}

}  // namespace

DBLOCK_TEST("local gate: threads of one handle reach the database one at a time, no failed try",
            "[waiting][gate]") {
  const int threads = 8, cycles = full_run() ? 100 : 20;
  // Each release passes the gate on after the row is free: the next local try cannot fail.
  CHECK(gate_run(ctx, 1, threads, cycles) == 0);
  // Negative control: the same load over two handles (a gate each) meets a held row.
  const auto failed = gate_run(ctx, 2, threads, cycles);
  WARN(ctx.backend << ": " << failed << " failed tries over two handles");
  CHECK(failed > 0);
}

DBLOCK_TEST("local gate: a holder whose lease ran out keeps no local waiter out",
            "[waiting][gate]") {
  const std::string name = "gate-stale-" + dblock::test::random_suffix();
  dblock::lease_options ho;
  ho.ttl = milliseconds(400);
  ho.watchdog = false;
  dblock::lease_lock holder(ctx.db, name, ho);
  const long long bound = scaled_bound_ms(ctx.db, 2500);
  const long long taken = monotonic_ns();
  auto h = holder.acquire(std::chrono::seconds(5));  // through the gate, which it keeps
  long long granted = 0;
  std::string err;
  std::thread t([&] {
    try {
      dblock::lease_options lo;
      lo.ttl = std::chrono::seconds(10);
      dblock::lease_lock lock(ctx.db, name, lo);
      auto g = lock.acquire(std::chrono::seconds(3));  // the holder stalls for 5 s
      granted = monotonic_ns();
      g.release();
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  t.join();
  INFO("waiter: " << err);
  REQUIRE(err.empty());
  const long long after_ms = (granted - taken) / ns_per_ms;
  INFO("granted " << after_ms << " ms after the holder's acquire; bound " << bound << " ms");
  CHECK(after_ms >= 300);    // not before the holder's lease could have run out
  CHECK(after_ms <= bound);  // at its expiry, not at the holder's release
  CHECK_FALSE(h.valid());
  // Its lease was taken over: the release reports it (a release that returns fails this), and
  // leaves the successor untouched.
  CHECK(code_of([&] { h.release(); }) == errc::lease_lost);
}

DBLOCK_TEST("local gate: waits there end on their timeout or cancellation; reentry passes",
            "[waiting][gate]") {
  const std::string name = "gate-wait-" + dblock::test::random_suffix();
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);
  dblock::lease_lock holder(ctx.db, name, lo);
  auto h = holder.acquire(std::chrono::seconds(5));
  auto again = holder.acquire(std::chrono::seconds(1));  // reentry: not behind its own gate
  CHECK(again.hold_count() == 2);
  CHECK(again.fence() == h.fence());
  again.release();

  // The code of the dblock::error the call throws (nothing when it returns), and its duration.
  auto timed = [&](const std::function<void()>& f) {
    const long long t0 = monotonic_ns();
    const std::optional<errc> code = code_of(f);
    return std::make_pair(code, (monotonic_ns() - t0) / ns_per_ms);
  };
  const long long bound = scaled_bound_ms(ctx.db, 3000);
  const long long at_once_bound = scaled_bound_ms(ctx.db, 1000);
  INFO("bounds: " << bound << " ms for a timeout or cancellation, " << at_once_bound
                  << " ms at once");
  dblock::lease_lock other(ctx.db, name, lo);
  const auto [c1, ms1] = timed([&] { auto g = other.acquire(milliseconds(150)); });
  INFO("timed out after " << ms1 << " ms");
  CHECK(c1 == errc::timeout);
  CHECK(ms1 >= 140);
  CHECK(ms1 < bound);
  dblock::cancellation cancel;
  std::thread canceller = run_after(milliseconds(100), [&] { cancel.cancel(); });
  const auto [c2, ms2] = timed([&] { auto g = other.acquire(std::chrono::seconds(30), cancel); });
  canceller.join();
  INFO("cancelled after " << ms2 << " ms");
  CHECK(c2 == errc::cancelled);
  CHECK(ms2 < bound);
  // The abandoned waits left the gate to the holder: its release lets the next one in at once.
  h.release();
  const auto [c3, ms3] = timed([&] { other.acquire(std::chrono::seconds(5)).release(); });
  INFO("let in after " << ms3 << " ms");
  CHECK_FALSE(c3.has_value());  // nothing thrown
  CHECK(ms3 < at_once_bound);
}

// One cancellation shared by every wait (a service's shutdown flag): each waiter still sleeps on a
// wake-up of its own, so a release hands the lease to one waiter while the others keep waiting,
// and the one cancel() ends every wait, at the local gate (threads of one handle behind the
// first) and in the hub (the first of each handle, queued in the database).
DBLOCK_TEST("one cancellation shared by many waits: a release grants one, cancel ends the rest",
            "[waiting][gate]") {
  const std::string name = "shared-cancel-" + dblock::test::random_suffix();
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);
  auto o = ctx.options();
  o.pool_size = 8;
  auto other = ctx.open(o);
  dblock::lease_lock holder(ctx.db, name, lo);
  auto h = holder.acquire(std::chrono::seconds(5));
  const long long bound = scaled_bound_ms(ctx.db, 3000);
  const long long cap_ns = std::max(5000LL, 2 * bound) * ns_per_ms;  // polls give up after this
  dblock::cancellation shutdown;
  const int threads = 6;
  std::atomic<int> granted{0}, cancelled{0}, other_errors{0};
  std::atomic<bool> release_granted{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      try {
        dblock::lease_lock lock(t % 2 ? other : ctx.db, name, lo);
        auto g = lock.acquire(std::chrono::seconds(30), shutdown);
        granted.fetch_add(1);
        while (!release_granted.load())
          std::this_thread::sleep_for(milliseconds(5));
        g.release();
      } catch (const dblock::error& e) {
        (e.code() == errc::cancelled ? cancelled : other_errors).fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(500));  // all waiting: at the gate or queued
  CHECK(granted.load() == 0);
  h.release();
  const long long t0 = monotonic_ns();
  while (granted.load() == 0 && monotonic_ns() - t0 < cap_ns)
    std::this_thread::sleep_for(milliseconds(2));
  std::this_thread::sleep_for(milliseconds(300));
  CHECK(granted.load() == 1);  // exactly one got the lease; the rest still wait
  CHECK(cancelled.load() == 0);
  const long long t1 = monotonic_ns();
  shutdown.cancel();
  while (cancelled.load() < threads - 1 && monotonic_ns() - t1 < cap_ns)
    std::this_thread::sleep_for(milliseconds(2));
  const long long cancel_ms = (monotonic_ns() - t1) / ns_per_ms;
  release_granted.store(true);
  for (auto& t : ts)
    t.join();
  INFO("every other wait cancelled within " << cancel_ms << " ms; bound " << bound << " ms");
  CHECK(cancelled.load() == threads - 1);
  CHECK(other_errors.load() == 0);
  CHECK(cancel_ms < bound);
  CHECK(count_waiters(ctx, name) == 0);  // the cancelled waits left the queue
}
