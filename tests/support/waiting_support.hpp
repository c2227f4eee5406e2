// Shared by the waiting, handover and wake-up tests: reading the waiter queue of a test, taking a
// lease through the queue, and a listener that counts wake-ups.
#pragma once

#include <soci/soci.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "harness.hpp"

namespace dblock::test {

// Counts the wake-ups and releases a database handle reports, and keeps its log messages.
struct counting_listener : dblock::listener {
  std::atomic<std::uint64_t> woken_n{0}, released_n{0};
  void woken(std::string_view) override { woken_n.fetch_add(1); }
  void released(std::string_view, std::chrono::microseconds) override { released_n.fetch_add(1); }
  void log(dblock::log_level, std::string_view m) override {
    std::lock_guard<std::mutex> l(mu);
    logs += std::string(m) + "\n";
  }
  std::string logged() {
    std::lock_guard<std::mutex> l(mu);
    return logs;
  }
  std::mutex mu;
  std::string logs;
};

// count(*) of this test's waiter queue: all entries, those of `name`, or those of `name` that
// process `pid` made.
inline long long count_waiters(const dblock::test::context& ctx, const std::string& name = "",
                               long long pid = 0) {
  auto c = ctx.db.connect();
  long long n = -1;
  const std::string t = ctx.table("lock_waiter");
  if (name.empty())
    c.session() << "SELECT count(*) FROM " << t, soci::into(n);
  else if (pid == 0)
    c.session() << "SELECT count(*) FROM " << t << " WHERE resource_name = :n", soci::use(name),
        soci::into(n);
  else
    c.session() << "SELECT count(*) FROM " << t << " WHERE resource_name = :n AND holder_pid = :p",
        soci::use(name), soci::use(pid), soci::into(n);
  return n;
}

/// Polls until the queue of `name` holds at least `n` entries; false after `timeout`.
inline bool wait_for_waiters(const dblock::test::context& ctx, const std::string& name, long long n,
                             std::chrono::milliseconds timeout) {
  const long long deadline = monotonic_ns() + timeout.count() * 1000000LL;
  while (count_waiters(ctx, name) < n) {
    if (monotonic_ns() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// `holder` takes the lease of `name` through the waiter queue: `first` (another lock object on
/// `name`) holds it, `holder` queues behind it, then `first` releases. A fair holder that came
/// through the queue may hand the lease over at its release. Fails the test when a step does not
/// happen.
inline dblock::lease_guard acquire_through_queue(const dblock::test::context& ctx,
                                                 const std::string& name, dblock::lease_lock& first,
                                                 dblock::lease_lock& holder) {
  auto x = first.try_acquire();
  REQUIRE(x);
  // `holder` waits on this thread (a lease_lock's acquisition belongs to the thread that made
  // it: the tests re-enter it here); another one releases `first` once it is queued.
  bool queued = false;
  std::thread t([&] {
    queued = wait_for_waiters(ctx, name, 1, std::chrono::milliseconds(10000));
    x->release();
  });
  std::optional<dblock::lease_guard> got;
  std::string failure;
  try {
    got.emplace(holder.acquire(std::chrono::seconds(30)));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  t.join();
  INFO("holder: " << failure);
  REQUIRE(queued);
  REQUIRE(got);
  return std::move(*got);
}

}  // namespace dblock::test
