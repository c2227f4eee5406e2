// Session leases (docs/session-leases.md) when the server crashes: PostgreSQL killed with SIGKILL
// (postmaster and every server process at once) and started again while threads take session
// leases on a few names and write each grant's fence under it (fenced()). Checked: the server
// restarted (its start time changed); every fence acknowledged after the crash is above every
// fence acknowledged before it, per name; no fence was written twice for a name (no double
// grant). Negative control: with the fence sequence UNLOGGED (which a crash resets), a fence
// after the crash is at or below one acknowledged before it: what the logged sequence prevents.
#include <soci/soci.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"

using namespace dblock::test::faults;

namespace {

std::string postmaster_start(const std::string& url) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    try {
      dblock::database db(url);
      std::string v;
      db.connect().session() << "SELECT CAST(pg_postmaster_start_time() AS TEXT)", soci::into(v);
      return v;
    } catch (const std::exception& e) {
      if (std::chrono::steady_clock::now() > give_up) FAIL("server start time: " << e.what());
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
}

dblock::lease_options session_mode() {
  dblock::lease_options o;
  o.mode = dblock::lease_mode::session;
  o.ttl = std::chrono::seconds(2);
  return o;
}

// One grant of `name` with its fence written under it; its fence, or 0 when refused or failed.
long long grant_and_write(dblock::database& db, const std::string& name, const std::string& items) {
  try {
    dblock::lease_lock l(db, name, session_mode());
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

DBLOCK_TEST_ONLY("postgresql", "session leases: kill -9 of the server, fences never go back",
                 "[faults][restart][serial][session_lease]") {
  if (!std::getenv("DBLOCK_TEST_PG_RESTART_CMD"))
    FAIL("DBLOCK_TEST_PG_RESTART_CMD is not set: start the servers with scripts/test-servers.sh");
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
    const std::string started = postmaster_start(ctx.url);
    phase.store(1);
    const bool ran = run_env_cmd("DBLOCK_TEST_PG_RESTART_CMD", "kill9");
    const bool restarted = postmaster_start(ctx.url) != started;
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

  // Negative control: an UNLOGGED fence sequence starts again after a crash, and the fence of
  // the first grant after it is at or below one acknowledged before it.
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
