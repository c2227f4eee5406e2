// Shared by waiting_test.cpp and waiting_process_test.cpp: reading the waiter queue of a test.
#pragma once

#include <soci/soci.h>

#include <chrono>
#include <string>
#include <thread>

#include "harness.hpp"

namespace dblock::test {

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

}  // namespace dblock::test
