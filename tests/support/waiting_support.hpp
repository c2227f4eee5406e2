// Shared by the waiting, handover and wake-up tests: reading the waiter queue of a test, taking a
// lease through the queue, a listener that counts wake-ups, holding a lease long, the three ends
// of a wait behind a holder, and cutting server connections (PostgreSQL backends, MySQL queries).
#pragma once

#include <soci/soci.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"
#include "wake/hub.hpp"

namespace dblock::test {

/// A test's look at whether rings from other processes and handles reach the waiters of one
/// database handle: a probe waiter enlisted in the handle's wake hub (under a name of its own,
/// which no release rings, so it never takes a ring from a real waiter) and asked what the hub
/// answers each waiter before it decides to sleep relying on rings (wake_hub::live()). The
/// handle's listener confirms its waiters together, in the order they came (PostgreSQL: the
/// LISTEN in place; MySQL: a sleep in flight after they came; SQLite: the watch armed), so once
/// the probe is confirmed, every waiter that enlisted before it is too. Leaves on destruction.
class ring_probe {
 public:
  explicit ring_probe(const dblock::database& db)
      : hub_(detail::access::impl(db)->hub),
        w_(hub_->enlist("dblock-test-probe/" + random_suffix(12), random_suffix(32),
                        dblock::cancellation())) {}
  ~ring_probe() { hub_->leave(w_, false); }
  ring_probe(const ring_probe&) = delete;
  ring_probe& operator=(const ring_probe&) = delete;
  /// Polls until rings reach the probe (and so every waiter enlisted before it); false after
  /// `timeout`, or at once where no ring from another handle can reach this one.
  bool wait_reached(std::chrono::milliseconds timeout) const {
    if (!hub_->rings_across()) return false;
    const long long deadline = monotonic_ns() + timeout.count() * 1000000LL;
    while (!hub_->live(*w_)) {
      if (monotonic_ns() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

 private:
  std::shared_ptr<detail::wake_hub> hub_;
  std::shared_ptr<detail::wake_waiter> w_;
};

/// Waits until the waiters of `db`'s handle that have enlisted so far are reached by rings from
/// other handles and processes (ring_probe); false after `timeout`.
inline bool wait_rings_reach(const dblock::database& db, std::chrono::milliseconds timeout) {
  return ring_probe(db).wait_reached(timeout);
}

/// After wait_rings_reach(): waits (up to 20 s) until `n` waiters of `db`'s handle sleep relying
/// on rings (wake_hub::asleep_on_rings()): each has taken its last look at the lock (the one after
/// it queued, or the one its confirmation gives it) and found it taken, so a release from here on
/// reaches it by a ring, never by its own read. False when they do not get there in time.
inline bool let_confirmation_look_end(const dblock::database& db, std::size_t n = 1) {
  const auto hub = detail::access::impl(db)->hub;
  const long long deadline = monotonic_ns() + 20000LL * 1000000LL;
  while (hub->asleep_on_rings() < n) {
    if (monotonic_ns() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// Checks the three ends of a wait behind a holder, `wait(timeout)` and `wait(timeout, c)` (an
/// acquire() or campaign()): 300 ms time out (errc::timeout, not before 290 ms), a cancellation
/// 200 ms in ends a 20 s wait (errc::cancelled), and `release()` 200 ms into a 20 s wait lets it
/// in, after 195 ms to 5 s (scaled_bound_ms at the pace of `db`). Returns what that last wait got
/// (valid), still held.
template <class Wait, class Release>
auto check_wait_ends(const dblock::database& db, Wait&& wait, Release&& release) {
  const long long t0 = monotonic_ns();
  CHECK(code_of([&] { (void)wait(milliseconds(300)); }) == errc::timeout);
  CHECK((monotonic_ns() - t0) / ns_per_ms >= 290);
  CHECK(code_when_cancelled(milliseconds(200), [&](const dblock::cancellation& c) {
          (void)wait(std::chrono::seconds(20), c);
        }) == errc::cancelled);
  std::optional<decltype(wait(std::chrono::seconds(20)))> got;
  const long long bound = scaled_bound_ms(db, 5000);
  const long long waited_ms = ms_until_ended(milliseconds(200), release,
                                             [&] { got.emplace(wait(std::chrono::seconds(20))); });
  CHECK(got->valid());
  INFO("waited " << waited_ms << " ms (released 200 ms in); bound " << bound << " ms");
  CHECK(waited_ms >= 195);
  CHECK(waited_ms < bound);
  return std::move(*got);
}

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

// Inserts a live queue entry for `name` (expiring in 2200) of a waiter on `host` that is not
// there: nothing refreshes it, nothing rings it.
inline void plant_waiter(const dblock::test::context& ctx, const std::string& name,
                         const std::string& host) {
  const std::string later = ctx.backend == "postgresql" ? "'2200-01-01 00:00:00+00'"
                            : ctx.backend == "mysql"    ? "'2200-01-01 00:00:00'"
                                                        : "7258118400000000";
  auto c = ctx.db.connect();
  c.session() << "INSERT INTO " << ctx.table("lock_waiter")
              << " (resource_name, owner_token, enqueued_at, expires_at, holder_host,"
                 " holder_pid) VALUES (:n, 'ffffffffffffffffffffffffffffffff', "
              << later << ", " << later << ", :h, 1)",
      soci::use(name), soci::use(host);
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

// Runs body(0..n-1) on n threads and returns the errors they threw (what()).
inline std::vector<std::string> on_threads(int n, const std::function<void(int)>& body) {
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      try {
        body(t);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        errors.push_back(e.what());
      }
    });
  for (auto& t : ts)
    t.join();
  return errors;
}

// Takes `name` on ctx.db with a 60 s lease: only its release (or a forced one) frees it soon.
inline dblock::lease_guard hold_long(const dblock::test::context& ctx, const std::string& name) {
  dblock::lease_options ho;
  ho.ttl = std::chrono::seconds(60);
  dblock::lease_lock holder(ctx.db, name, ho);
  auto h = holder.try_acquire();
  REQUIRE(h);
  return std::move(*h);
}

// PostgreSQL: terminates the server processes that pg_stat_activity shows matching `where`
// (:p bound to `p`); returns how many.
inline int terminate_backends(const dblock::test::context& ctx, const std::string& where,
                              const std::string& p) {
  const char* admin = std::getenv("DBLOCK_TEST_POSTGRESQL_ADMIN_URL");
  dblock::database adb = admin && *admin ? dblock::database(admin) : ctx.db;
  auto c = adb.connect();
  long long n = 0;
  c.session() << "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE " + where,
      soci::use(p), soci::into(n);
  return static_cast<int>(n);
}

// MySQL: kills the connections whose running statement is LIKE `like`; returns how many. A
// statement that ended between the read and its KILL (a closed handle's sleep, say) is gone
// already: MySQL answers "Unknown thread id" (1094), which is no failure.
inline int kill_queries(const dblock::test::context& ctx, const std::string& like) {
  auto c = ctx.db.connect();
  std::vector<long long> ids(16);
  c.session() << "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND "
                 "INFO LIKE :q",
      soci::use(like), soci::into(ids);
  int killed = 0;
  for (const long long id : ids) {
    try {
      c.session() << "KILL CONNECTION " << id;
      ++killed;
    } catch (const soci::soci_error& e) {
      if (std::string(e.what()).find("Unknown thread id") == std::string::npos) throw;
    }
  }
  return killed;
}

}  // namespace dblock::test
