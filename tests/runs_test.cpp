// The library's recorded runs (include/dblock/runs.hpp) on every backend: periodic_runner in
// three replicas (their own handles and pools) runs each slot of the database clock once, the
// others find it done; complete_run() commits the job's last write with the run's success, so
// a holder that lost its lease before it leaves neither (and the next caller runs the job once
// more, writing once); the control without complete_run() writes twice.
#include <soci/soci.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dblock/admin.hpp"
#include "dblock/runs.hpp"
#include "harness.hpp"

using namespace dblock::test;
using std::chrono::milliseconds;

namespace {

long long rows_of(const context& ctx, const std::string& table) {
  long long n = -1;
  auto c = ctx.db.connect();
  c.session() << "SELECT COUNT(*) FROM " + table, soci::into(n);
  return n;
}

// Makes the lease `name` lost under its holder: a forced release from another handle.
void take_away(const context& ctx, const std::string& name) {
  dblock::force_release(ctx.open(), name, "runs test: the lease is lost", "runs_test");
}

}  // namespace

DBLOCK_TEST("periodic runners in three replicas: one run of each slot, the others find it done",
            "[runs][periodic]") {
  const std::string name = "periodic-" + random_suffix();
  const milliseconds period(1000);
  std::mutex m;
  std::map<std::int64_t, std::vector<int>> runs;  // slot -> replicas that ran it
  std::vector<dblock::database> handles;
  for (int i = 0; i < 3; ++i)
    handles.push_back(ctx.open());
  std::vector<std::unique_ptr<dblock::periodic_runner>> replicas;
  std::atomic<int> errors{0};
  for (int i = 0; i < 3; ++i) {
    dblock::periodic_options o;
    o.run.lease.ttl = milliseconds(3000);
    o.run.wait = milliseconds(2000);  // a replica that arrives while another runs waits for it
    o.on_error = [&](std::exception_ptr) { ++errors; };
    replicas.push_back(std::make_unique<dblock::periodic_runner>(
        handles[i], name, period,
        [&, i](dblock::lease_guard& lease, std::int64_t slot) {
          CHECK(lease.valid());
          {
            const std::lock_guard<std::mutex> l(m);
            runs[slot].push_back(i);
          }
          std::this_thread::sleep_for(milliseconds(30));
          return 0;
        },
        o));
  }
  // Until four slots have run (a hang detector, not a pace: each runner wakes at its own slot
  // starts); then the runners stop, most of them from their sleep.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    {
      const std::lock_guard<std::mutex> l(m);
      if (runs.size() >= 4) break;
    }
    REQUIRE(std::chrono::steady_clock::now() < give_up);
    std::this_thread::sleep_for(milliseconds(50));
  }
  for (auto& r : replicas)
    r->stop();
  std::uint64_t ran = 0, elsewhere = 0;
  for (auto& r : replicas) {
    const auto st = r->stats();
    ran += st.ran;
    elsewhere += st.done_elsewhere;
    CHECK(st.ran == st.succeeded);
    CHECK(st.ran + st.done_elsewhere >= 1);  // every replica took part
    CHECK(st.last_slot > 0);
  }
  CHECK(errors == 0);
  INFO("slots run: " << runs.size() << ", runs " << ran << ", found done elsewhere " << elsewhere);
  for (const auto& [slot, who] : runs) {
    INFO("slot " << slot);
    CHECK(who.size() == 1);  // never twice, whichever replica woke first
  }
  CHECK(runs.size() >= 4);  // it fired by itself, slot after slot
  CHECK(ran == runs.size());
  CHECK(elsewhere >= runs.size() - 2);  // the others woke in those slots too and found them done
  // The record agrees: one success per slot.
  std::map<std::int64_t, int> recorded;
  for (const auto& r : dblock::list_runs(ctx.db, name, 1000)) {
    CHECK(r.period == period);
    if (r.succeeded) ++recorded[r.slot];
  }
  CHECK(recorded.size() == runs.size());
  for (const auto& [slot, n] : recorded)
    CHECK(n == 1);
  // Stopping again, and the argument checks.
  replicas[0]->stop();
  CHECK(code_of([&] {
          dblock::periodic_runner bad(ctx.db, name, milliseconds(0), [](auto&, auto) { return 0; });
        }) == dblock::errc::invalid_argument);
  CHECK(code_of([&] {
          dblock::periodic_runner bad(ctx.db, "", period, [](auto&, auto) { return 0; });
        }) == dblock::errc::invalid_argument);
}

DBLOCK_TEST("complete_run(): the job's last write and the run's success commit together",
            "[runs][complete_run]") {
  const std::string data = ctx.table("run_effects");
  ctx.exec("CREATE TABLE " + data + " (id INTEGER NOT NULL)");
  const std::string key = "complete-" + random_suffix();
  auto write_one = [&](soci::session& s) { s << "INSERT INTO " + data + " (id) VALUES (1)"; };

  // The lease is lost before complete_run(): nothing lands, the run is not done.
  int calls = 0;
  auto first = [&](dblock::lease_guard& lease, std::int64_t) {
    ++calls;
    take_away(ctx, key);
    dblock::complete_run(lease, write_one);
    return 0;
  };
  CHECK(code_of([&] { (void)dblock::run_once(ctx.db, key, first); }) == dblock::errc::lease_lost);
  CHECK(rows_of(ctx, data) == 0);
  // The next caller runs it; its complete_run() writes once and records the success.
  auto second = [&](dblock::lease_guard& lease, std::int64_t) {
    ++calls;
    dblock::complete_run(lease, write_one);
    CHECK(code_of([&] { dblock::complete_run(lease, write_one); }) == dblock::errc::not_owner);
    return 7;  // ignored: the run succeeded with its write
  };
  const auto r = dblock::run_once(ctx.db, key, second);
  CHECK(r.what == dblock::run_result::outcome::ran);
  CHECK(r.status == 0);
  CHECK(calls == 2);
  CHECK(rows_of(ctx, data) == 1);
  const auto again = dblock::run_once(ctx.db, key, second);
  CHECK(again.what == dblock::run_result::outcome::done_already);
  CHECK(rows_of(ctx, data) == 1);
  // An exception after complete_run() is rethrown; the success stays.
  const std::string key2 = key + "-throws";
  CHECK_THROWS_AS(dblock::run_once(ctx.db, key2,
                                   [&](dblock::lease_guard& lease, std::int64_t) -> int {
                                     dblock::complete_run(lease, write_one);
                                     throw std::runtime_error("after the write");
                                   }),
                  std::runtime_error);
  CHECK(dblock::run_once(ctx.db, key2, second).what == dblock::run_result::outcome::done_already);
  // Outside a job, or with another job's guard: refused.
  dblock::lease_lock other(ctx.db, key + "-other");
  auto g = other.acquire(milliseconds(5000));
  CHECK(code_of([&] { dblock::complete_run(g, write_one); }) == dblock::errc::not_owner);
}

DBLOCK_TEST(
    "negative control: without complete_run(), a lease lost after the job's last fenced "
    "write runs the job again and writes twice",
    "[runs][complete_run][control]") {
  const std::string data = ctx.table("run_effects");
  ctx.exec("CREATE TABLE " + data + " (id INTEGER NOT NULL)");
  const std::string key = "uncompleted-" + random_suffix();
  bool lose = true;
  auto job = [&](dblock::lease_guard& lease, std::int64_t) {
    lease.fenced([&](soci::session& s) { s << "INSERT INTO " + data + " (id) VALUES (1)"; });
    if (lose) take_away(ctx, key);  // after the write landed, before the end is recorded
    lose = false;
    return 0;
  };
  CHECK(code_of([&] { (void)dblock::run_once(ctx.db, key, job); }) == dblock::errc::lease_lost);
  CHECK(dblock::run_once(ctx.db, key, job).what == dblock::run_result::outcome::ran);
  CHECK(rows_of(ctx, data) == 2);  // the effect twice: what complete_run() prevents
}
