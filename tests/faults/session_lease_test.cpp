// Session leases (docs/session-leases.md) under faults.
//
// The server crashes: PostgreSQL killed with SIGKILL (postmaster and every server process at
// once) and started again while threads take session leases on a few names and write each
// grant's fence under it (fenced()). Checked: the server restarted (its start time changed);
// every fence acknowledged after the crash is above every fence acknowledged before it, per name;
// no fence was written twice for a name (no double grant). Negative control: with the fence
// sequence UNLOGGED (which a crash resets), a fence after the crash is at or below one
// acknowledged before it: what the logged sequence prevents.
//
// A waiter's connection is cut: the wait rides it out; an interrupt storm leaves no lock (below).
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dblock/admin.hpp"
#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "proxy.hpp"

using namespace dblock::test::faults;

namespace {

dblock::lease_options session_mode() {
  dblock::lease_options o;
  o.ttl = std::chrono::seconds(2);
  return o;
}

// One grant of `name` with its fence written under it; its fence, or 0 when refused or failed.
long long grant_and_write(dblock::database& db, const std::string& name, const std::string& items) {
  try {
    dblock::lease_lock l(db, name, session_mode(), dblock::lease_mode::session);
    auto g = l.try_acquire();
    if (!g) return 0;
    const long long fence = g->fence();
    g->fenced([&](soci::session& sql) {
      sql << "INSERT INTO " << items << " (name, fence) VALUES (:n, :f)", soci::use(name),
          soci::use(fence);
    });
    g->release();
    return fence;
  } catch (const dblock::error&) {
    return 0;  // the crash: connections break, leases are lost
  }
}

}  // namespace

DBLOCK_TEST_SERVERS("session leases: kill -9 of the server, fences never go back",
                    "[faults][restart][serial][session_lease]") {
  const bool pg = ctx.backend == "postgresql";
  const char* restart = pg ? "DBLOCK_TEST_PG_RESTART_CMD" : "DBLOCK_TEST_MYSQL_RESTART_CMD";
  const char* kill9 = pg ? "kill9" : "KILL";
  (void)env_or_fail(restart);
  const std::string items = ctx.table("session_items");
  ctx.exec("CREATE TABLE " + items + " (name VARCHAR(64) NOT NULL, fence BIGINT NOT NULL)");
  const std::vector<std::string> names = {"session-crash/a", "session-crash/b", "session-crash/c"};
  const int crashes = count(2, 5);
  for (int c = 0; c < crashes; ++c) {
    // Grants acknowledged before the crash, and after it: per name, the highest before and the
    // lowest after.
    std::mutex mu;
    std::map<std::string, long long> high_before, low_after;
    std::atomic<int> phase{0};  // 0: before the crash, 1: crashing, 2: after the restart
    std::atomic<bool> stop{false};
    std::atomic<long long> after_grants{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t)
      ts.emplace_back([&, t] {
        auto db = ctx.open();
        for (unsigned k = 0; !stop.load(); ++k) {
          const std::string& name = names[(k + static_cast<unsigned>(t)) % names.size()];
          const int at_start = phase.load();
          const long long f = grant_and_write(db, name, items);
          if (f == 0) continue;
          std::lock_guard<std::mutex> lk(mu);
          if (at_start == 0 && phase.load() == 0) {
            high_before[name] = std::max(high_before[name], f);
          } else if (at_start == 2) {
            auto it = low_after.find(name);
            if (it == low_after.end() || f < it->second) low_after[name] = f;
            ++after_grants;
          }
        }
      });
    std::this_thread::sleep_for(milliseconds(800));
    const std::string started = server_instance(ctx);
    phase.store(1);
    const bool ran = run_env_cmd(restart, kill9);
    const bool restarted = server_instance(ctx) != started;
    phase.store(2);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (after_grants.load() < 30 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(20));
    stop.store(true);
    for (auto& th : ts)
      th.join();
    REQUIRE(ran);
    REQUIRE(restarted);
    INFO("crash " << c + 1 << ": grants after the restart " << after_grants.load());
    REQUIRE(after_grants.load() > 0);
    for (const auto& [name, low] : low_after) {
      INFO(name << ": highest fence before the crash " << high_before[name] << ", lowest after "
                << low);
      CHECK(low > high_before[name]);
    }
  }
  ctx.db = ctx.open();
  int doubled = -1;
  ctx.db.connect().session() << "SELECT count(*) FROM (SELECT name, fence FROM " << items
                             << " GROUP BY name, fence HAVING count(*) > 1) d",
      soci::into(doubled);
  CHECK(doubled == 0);

  // Negative control (PostgreSQL): an UNLOGGED fence sequence starts again after a crash, and
  // the fence of the first grant after it is at or below one acknowledged before it. (MariaDB has
  // no cheap equivalent: a sequence of a non-durable engine is emptied, and NEXTVAL then fails.)
  if (!pg) return;
  const std::string seq = ctx.prefix + "session_fence";
  ctx.exec("ALTER SEQUENCE " + seq + " SET UNLOGGED");
  long long before = 0;
  for (int k = 0; k < 5; ++k)
    before = std::max(before, grant_and_write(ctx.db, names[0], items));
  REQUIRE(before > 0);
  REQUIRE(run_env_cmd("DBLOCK_TEST_PG_RESTART_CMD", "kill9"));
  ctx.db = ctx.open();
  long long after = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (after == 0 && std::chrono::steady_clock::now() < until)
    after = grant_and_write(ctx.db, names[0], items);
  ctx.exec("ALTER SEQUENCE " + seq + " SET LOGGED");
  INFO("control: acknowledged before the crash " << before << ", first after it " << after);
  REQUIRE(after > 0);
  CHECK(after <= before);
}

// A fence sequence can go back in a crash, on both servers. MariaDB: NEXTVAL's write (a refill
// of its cache) is not flushed with its statement. PostgreSQL: nextval logs 32 values ahead in
// the WAL, and the next 31 calls, in any session, hand them out without waiting for that record
// to be flushed, which only its own transaction's commit does. Session fences add the fence
// epoch * 2^32, raised durably by each connection before its first grant, so a fence after the
// crash is still above one before it. The fault is proved, not assumed: the sequence's part of
// the fence (fence mod 2^32: the marker's fence plus the sequence's value, both small here) is
// seen at or below its value before the crash. MariaDB: FLUSH TABLES empties the cache, so the
// grant just before the kill refills it, unflushed. PostgreSQL: after a CHECKPOINT the next
// nextval logs, in a transaction left open, and the grant then takes the value after it.
DBLOCK_TEST_SERVERS(
    "session leases: a crash takes the fence sequence back; the fence epoch "
    "keeps fences growing",
    "[faults][restart][serial][session_lease]") {
  const bool pg = ctx.backend == "postgresql";
  const char* restart = pg ? "DBLOCK_TEST_PG_RESTART_CMD" : "DBLOCK_TEST_MYSQL_RESTART_CMD";
  (void)env_or_fail(restart);
  const std::string admin_url =
      env_or_fail(pg ? "DBLOCK_TEST_POSTGRESQL_ADMIN_URL" : "DBLOCK_TEST_MYSQL_ADMIN_URL");
  const std::string name = "session-epoch-" + random_suffix();
  const std::string seq = ctx.prefix + "session_fence";
  const long long low_bits = 4294967296LL;
  int went_back = 0;
  long long last = 0;
  for (int attempt = 0; attempt < 3 && went_back == 0; ++attempt) {
    long long before = 0;
    {
      dblock::database db(ctx.url, ctx.options());
      dblock::lease_lock l(db, name, session_mode(), dblock::lease_mode::session);
      l.try_acquire()->release();  // marked, this connection's epoch raised
      dblock::database admin(admin_url);
      auto logger = admin.connect();  // PostgreSQL: the transaction whose nextval logs
      if (pg) {
        admin.connect().session() << "CHECKPOINT";
        long long v = 0;
        logger.session() << "BEGIN";
        logger.session() << "SELECT nextval('" << seq << "')", soci::into(v);
      } else {
        admin.connect().session() << "FLUSH TABLES " << seq;
      }
      auto g = l.try_acquire();
      REQUIRE(g);
      before = g->fence();
      const std::string started = server_instance(ctx);
      REQUIRE(run_env_cmd(restart, pg ? "kill9" : "KILL"));  // at once: nothing flushed since
      REQUIRE(server_instance(ctx) != started);
    }
    REQUIRE(before > last);
    dblock::database db(ctx.url, ctx.options());
    dblock::lease_lock l(db, name, session_mode(), dblock::lease_mode::session);
    auto g = l.acquire(std::chrono::seconds(10));
    const long long after = g.fence();
    INFO("attempt " << attempt + 1 << ": fence before the crash " << before << ", after " << after
                    << "; the sequence's part " << before % low_bits << " -> " << after % low_bits);
    CHECK(after > before);
    if (after % low_bits <= before % low_bits) ++went_back;
    last = after;
  }
  CHECK(went_back > 0);  // the fault happened: the sequence went back
  ctx.db = ctx.open();
}

namespace {

// The warnings a handle logs.
struct warnings : dblock::listener {
  std::mutex mu;
  std::vector<std::string> seen;
  void log(dblock::log_level level, std::string_view m) override {
    if (level != dblock::log_level::warning) return;
    std::lock_guard<std::mutex> g(mu);
    seen.emplace_back(m);
  }
  int containing(const std::string& part) {
    std::lock_guard<std::mutex> g(mu);
    return static_cast<int>(std::count_if(seen.begin(), seen.end(), [&](const std::string& s) {
      return s.find(part) != std::string::npos;
    }));
  }
};

// A server session waiting for `name` in session mode other than `other`, waited for up to 10 s;
// empty when none came. PostgreSQL: the head or a second waiter list_locks() shows
// ("address:pid"); MariaDB, which does not show which user lock a session waits for: a session of
// this database waiting for a user lock (its id; the test runs alone).
std::string wait_for_session_waiter(const context& ctx, const std::string& name,
                                    const std::string& other = {}) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    if (ctx.backend == "postgresql") {
      for (const auto& l : dblock::list_locks(ctx.db))
        if (l.name == name && l.session_mode && l.waiters > 0 &&
            (l.head_waiter != other || l.waiters > 1))
          return l.head_waiter;
    } else {
      std::vector<long long> ids(8);
      ctx.db.connect().session() << "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = "
                                    "DATABASE() AND STATE = 'User lock'",
          soci::into(ids);
      for (const long long id : ids)
        if (std::to_string(id) != other) return std::to_string(id);
    }
    if (std::chrono::steady_clock::now() > until) return {};
    std::this_thread::sleep_for(milliseconds(20));
  }
}

}  // namespace

// A session wait rides out a cut of its connection, as a row-mode wait does (promise D2): every
// connection through the proxy is cut while the waiter waits in the server's queue; it waits
// again from a new session and is granted the lock when the holder releases, at a greater fence.
// The fault is proved: the waiter logged the retry and waits from another server session.
// Control, seen failing: before session waits rode out, the wait ended with connection_lost.
DBLOCK_TEST_SERVERS("session leases: a wait rides out a cut of its connection",
                    "[faults][session_lease]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  auto logged = std::make_shared<warnings>();
  dblock::database_options o = ctx.options();
  o.pool_size = 2;
  o.events = logged;
  dblock::database via(url_via(ctx.url, proxy.port()), o);
  const std::string name = "session-ride-" + random_suffix();
  dblock::lease_options lo = session_mode();
  lo.ttl = std::chrono::seconds(30);
  dblock::lease_lock holder(ctx.db, name, lo, dblock::lease_mode::session),
      waiter(via, name, lo, dblock::lease_mode::session);
  auto h = holder.try_acquire();
  REQUIRE(h);
  const std::int64_t held_fence = h->fence();
  std::int64_t got = 0;
  std::string failure;
  std::thread t([&] {
    try {
      auto g = waiter.acquire(std::chrono::seconds(15));
      got = g.fence();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  const std::string first = wait_for_session_waiter(ctx, name);
  REQUIRE(!first.empty());
  proxy.cut_all();
  // Gone from the server's queue with its session, then back in it from a new one.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (logged->containing("waiting again") == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(10));
  CHECK(logged->containing("waiting again") >= 1);
  INFO("waiting first as " << first);
  // Another server session waits (the cut one may stay in the queue until the server notices).
  CHECK(!wait_for_session_waiter(ctx, name, first).empty());
  h->release();
  t.join();
  INFO("waiter: " << failure);
  CHECK(failure.empty());
  CHECK(got > held_fence);
}

// An interrupt storm on session-mode waits: threads wait for one name again and again, each wait
// ended by a random cancel (from another thread) or a deadline of 1..30 ms, and a wait that gets
// the lock holds it briefly. A cancel or a deadline may land while the server grants the lock: the
// waiting connection is then dropped, which ends its session and the lock with it. Checked: no
// two holders at once, both endings and grants really happened (not vacuous), and afterwards no
// server session holds or waits for the name and a new try gets it at once.
DBLOCK_TEST_SERVERS("session leases: an interrupt storm leaves no lock held",
                    "[faults][session_lease]") {
  const int threads = 6;
  const auto storm_for = milliseconds(full() ? 10000 : 2000);
  dblock::database_options o = ctx.options();
  o.pool_size = threads * 2;
  dblock::database db(ctx.url, o);
  const std::string name = "session-storm-" + random_suffix();
  dblock::lease_options lo = session_mode();
  std::mutex mu;
  std::vector<dblock::cancellation> slots(threads);  // each thread's current wait
  std::atomic<bool> stop{false};
  std::atomic<int> inside{0}, overlaps{0}, acquired{0}, cancelled{0}, timed_out{0};
  std::vector<std::string> errors;
  std::thread canceller([&] {
    std::mt19937 rng(std::random_device{}());
    while (!stop.load()) {
      std::this_thread::sleep_for(milliseconds(1 + static_cast<int>(rng() % 10)));
      std::lock_guard<std::mutex> g(mu);
      slots[rng() % threads].cancel();
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng(std::random_device{}());
      dblock::lease_lock lock(db, name, lo, dblock::lease_mode::session);
      while (!stop.load()) {
        dblock::cancellation c;
        {
          std::lock_guard<std::mutex> g(mu);
          slots[static_cast<std::size_t>(t)] = c;
        }
        const auto wait = rng() % 2 ? std::chrono::seconds(30) : milliseconds(1 + rng() % 30);
        try {
          auto g = lock.acquire_until(std::chrono::steady_clock::now() + wait, c);
          ++acquired;
          if (inside.fetch_add(1) != 0) ++overlaps;
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
          inside.fetch_sub(1);
          g.release();
        } catch (const dblock::error& e) {
          if (e.code() == dblock::errc::cancelled) {
            ++cancelled;
          } else if (e.code() == dblock::errc::timeout) {
            ++timed_out;
          } else {
            std::lock_guard<std::mutex> g(mu);
            errors.push_back(e.what());
          }
        }
      }
    });
  std::this_thread::sleep_for(storm_for);
  // Until each outcome has been seen (30 s more at most): a slow machine gets a longer storm
  // instead of failing one of the three checks below.
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       (acquired == 0 || cancelled == 0 || timed_out == 0) &&
       std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(milliseconds(100));
  stop.store(true);
  for (auto& t : ts)
    t.join();
  canceller.join();
  INFO("acquired " << acquired << ", cancelled " << cancelled << ", timed out " << timed_out
                   << ", other errors " << errors.size() << (errors.empty() ? "" : ": ")
                   << (errors.empty() ? "" : errors.front()));
  CHECK(overlaps == 0);
  CHECK(errors.empty());
  CHECK(acquired > 0);
  CHECK(cancelled > 0);
  CHECK(timed_out > 0);
  // Nothing held or waiting once the server has ended the dropped sessions.
  bool clear = false;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !clear && std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(milliseconds(20))) {
    clear = true;
    for (const auto& l : dblock::list_locks(ctx.db))
      if (l.name == name && (l.held || l.waiters > 0)) clear = false;
  }
  CHECK(clear);
  dblock::lease_lock after(ctx.db, name, lo, dblock::lease_mode::session);
  CHECK(after.try_acquire().has_value());
}
