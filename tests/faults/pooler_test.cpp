// PgBouncer in transaction mode (docs/deployment.md), the real one started by
// scripts/test-servers.sh (DBLOCK_TEST_PGBOUNCER_URL, DBLOCK_TEST_PGBOUNCER_CMD):
//   - a lost COMMIT reply behind the pooler is in_doubt and never called final: dblock cannot
//     identify, let alone end, the server session that ran it; the outcome read back after the
//     pooler settled is all or nothing;
//   - PgBouncer restarted under the 8-process fenced counter workload: exact counts, fences
//     strictly increasing, no double grant, and clients resume after each restart.
#include <soci/soci.h>

#include <cstdlib>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "proxy.hpp"

using namespace dblock::test::faults;

namespace {

std::string pgbouncer_url() {
  const char* u = std::getenv("DBLOCK_TEST_PGBOUNCER_URL");
  if (!u || !*u)
    FAIL("DBLOCK_TEST_PGBOUNCER_URL is not set: scripts/test-servers.sh starts PgBouncer");
  return u;
}

std::string transaction_pooled(const std::string& url) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "pooler=transaction";
}

}  // namespace

DBLOCK_TEST_ONLY("postgresql",
                 "pgbouncer: a lost COMMIT reply is in_doubt, not final, and all or nothing",
                 "[faults][pooler]") {
  const int trials = count(6, 30);
  auto [host, port] = url_host_port(pgbouncer_url());
  tcp_proxy proxy(host, port);
  const std::string via_url = transaction_pooled(url_via(pgbouncer_url(), proxy.port()));
  lease_options lo;
  lo.ttl = std::chrono::seconds(60);
  long long hits = 0, in_doubt = 0, pooler_msgs = 0, applied = 0, nothing = 0;
  std::vector<std::string> problems;
  std::string trace;
  for (int i = 0; i < trials; ++i) {
    const bool cut_reply = i % 2 == 0;  // else the request carrying COMMIT is dropped
    const std::string name = "pooled-fr-" + std::to_string(i) + "-" + random_suffix();
    lease_lock holder(ctx.db, name, lo);
    auto g = holder.try_acquire();
    REQUIRE(g);
    auto via = open_db(via_url, ctx.prefix, 2);
    via.ping();
    const long long cuts_before = proxy.cuts();
    if (cut_reply)
      proxy.cut_reply_to("COMMIT");
    else
      proxy.cut_request_to("COMMIT", false);
    std::optional<errc> code;
    std::string message;
    try {
      (void)force_release(via, name, "pooled trial", "pooler_test");
    } catch (const error& e) {
      code = e.kind();
      message = e.what();
    }
    const bool hit = proxy.cuts() > cuts_before;
    proxy.cut_reply_to("");
    proxy.cut_request_to("", false);
    hits += hit;
    trace += " " + std::to_string(i) + (hit ? "cut" : "-") + ":" +
             (code ? std::string(to_string(*code)) : "ok");
    in_doubt += code == errc::in_doubt;
    pooler_msgs += message.find("transaction-mode pooler") != std::string::npos;
    // Never final behind the pooler: give the server time to finish, then read back directly.
    std::this_thread::sleep_for(milliseconds(1500));
    auto row = read_lease(ctx.db.connect(), name);
    REQUIRE(row);
    const bool taken = row->fence == g->fence() + 1 && row->owner_token != g->owner_token();
    const bool kept = row->fence == g->fence() && row->owner_token == g->owner_token();
    applied += taken;
    nothing += kept;
    if (!hit && code)
      problems.push_back("trial " + std::to_string(i) + ": no cut, but " +
                         std::string(to_string(*code)) + ": " + message);
    if (hit && code != errc::in_doubt)
      problems.push_back("trial " + std::to_string(i) + ": COMMIT cut but " +
                         (code ? std::string(to_string(*code)) + ": " + message : "no error"));
    if (hit && message.find("has been ended") != std::string::npos)
      problems.push_back("trial " + std::to_string(i) + ": called final: " + message);
    if (!taken && !kept)
      problems.push_back("trial " + std::to_string(i) + ": half-applied row, fence " +
                         std::to_string(row->fence));
    if (hit && cut_reply && !taken)
      problems.push_back("trial " + std::to_string(i) + ": reply cut (committed) but not applied");
    if (hit && !cut_reply && !kept)
      problems.push_back("trial " + std::to_string(i) + ": COMMIT never sent but applied");
  }
  INFO(trials << " trials: cuts " << hits << ", in_doubt " << in_doubt << " (naming the pooler "
              << pooler_msgs << "), applied " << applied << ", nothing " << nothing);
  INFO("per trial:" << trace);
  for (const auto& p : problems)
    UNSCOPED_INFO(p);
  CHECK(problems.empty());
  REQUIRE(hits > 0);
  CHECK(in_doubt == hits);
  CHECK(pooler_msgs == hits);
  report("pooler-lost-commit", "postgresql", trials, hits, static_cast<long long>(problems.size()),
         "in_doubt=" + std::to_string(in_doubt) + " applied=" + std::to_string(applied));
}

DBLOCK_TEST_ONLY("postgresql",
                 "pgbouncer restarted mid-run: 8 fenced counter processes lose and double nothing",
                 "[faults][pooler][serial]") {
  if (!std::getenv("DBLOCK_TEST_PGBOUNCER_CMD"))
    FAIL("DBLOCK_TEST_PGBOUNCER_CMD is not set: scripts/test-servers.sh starts PgBouncer");
  const int ttl_ms = 1000;
  const int restarts = count(2, 5);
  create_workload_tables(ctx);
  temp_dir dir("faults-pgbouncer");
  auto w = make_workload(ctx, "counter", dir, ttl_ms);
  w.url = transaction_pooled(pgbouncer_url());  // in_doubt resolution and checks bypass the pooler
  process_set ps;
  for (int i = 0; i < 8; ++i)
    spawn_counter_worker(ps, w, i);
  std::this_thread::sleep_for(milliseconds(1500));
  std::vector<std::pair<long long, long long>> windows;
  std::vector<long long> bounds;  // each recovery's bound: 5 s + the slack at the pace then
  int failed = 0;
  for (int r = 0; r < restarts; ++r) {
    const long long t0 = monotonic_ns();
    if (!run_env_cmd("DBLOCK_TEST_PGBOUNCER_CMD", "restart")) ++failed;
    windows.push_back({t0, monotonic_ns()});
    const long long acked_before = log_lines(w, 0, 8, "K");
    bounds.push_back(liveness_bound_ms(5000, median_round_trip_us(ctx.db)));
    std::this_thread::sleep_for(milliseconds(rnd(2000, 3000)));
    // A write after the restart before the next one (the bound below judges how soon it came).
    wait_for_progress([&] { return log_lines(w, 0, 8, "K") > acked_before; },
                      std::chrono::seconds(60));
  }
  stop_workers(w);
  require_clean_exit(ps, w, std::chrono::seconds(90));
  CHECK(failed == 0);
  auto a = analyze(ctx.db, ctx, w, true);
  INFO(a.summary());
  long long late = 0;
  std::string recovery;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const auto& win = windows[i];
    auto it = std::upper_bound(a.ack_exit_ns.begin(), a.ack_exit_ns.end(), win.second);
    const long long rec_ms = it == a.ack_exit_ns.end() ? -1 : (*it - win.second) / 1000000;
    recovery += " " + std::to_string((win.second - win.first) / 1000000) + "+" +
                std::to_string(rec_ms) + "ms(bound " + std::to_string(bounds[i]) + ")";
    if (rec_ms < 0 || rec_ms > bounds[i]) ++late;
  }
  INFO("restart duration + first acknowledged write after it:" << recovery);
  CHECK(a.violations == 0);
  CHECK(late == 0);
  CHECK(a.acked > 0);
  report("pgbouncer-restart", "postgresql", restarts, restarts - failed, a.violations + late,
         "acked=" + std::to_string(a.acked) + " recovery=" + recovery);
}
