// Scenario 5 (docs/safety.md T11): right after a watchdog-renewed lease is acquired, every renewal
// fails. PostgreSQL/MariaDB: the worker's own proxy either blackholes (renewals hang) or resets
// and refuses every connection (renewals fail fast). SQLite: another connection holds BEGIN
// EXCLUSIVE, with the busy timeout at 5 s (renewals hang) or 50 ms (they fail fast).
// Checked per trial: on_lost fires, less than TTL after the acquire request was sent, and at
// that moment the row read directly on the database clock still carries our unexpired lease (the
// loss is reported before the lease can have expired); valid() is false afterwards; the guard's
// lost() signal stops a work loop watching it, also less than TTL after the send.
// Negative control: with the watchdog off, the same check must find no report.
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "proxy.hpp"

using namespace dblock::test::faults;

// args: backend url prefix trials ttl_ms watchdog(0|1) out_file
// Writes one line per trial: "T <variant> <reported 0|1> <ms from send to report>
// <row unexpired at report 0|1> <valid after 0|1> <work loop stopped by lost() 0|1>
// <ms from send to its stop>".
DBLOCK_WORKER(renewal_blackhole_worker) {
  const std::string backend = args.at(0), url = args.at(1), prefix = args.at(2);
  const int trials = std::stoi(args.at(3)), ttl_ms = std::stoi(args.at(4));
  const bool watchdog = args.at(5) == "1";
  const bool sqlite = backend == "sqlite";
  std::unique_ptr<tcp_proxy> proxy;
  std::string via = url;
  if (!sqlite) {
    auto [host, port] = url_host_port(url);
    proxy = std::make_unique<tcp_proxy>(host, port);
    via = url_via(url, proxy->port());
  }
  auto direct = open_db(url, prefix, 2);
  std::ostringstream out;
  for (int t = 0; t < trials; ++t) {
    const int variant = t % 2;
    database_options o = with_prefix(prefix);
    o.pool_size = 3;
    // Variant 0's busy timeout outlasts the TTL (renewals hang), at any scale of the TTL.
    o.sqlite_busy_timeout = milliseconds(variant == 0 ? std::max(5000, 5 * ttl_ms / 2) : 50);
    database db(via, o);
    db.ping();
    std::mutex mu;
    std::condition_variable cv;
    bool reported = false;
    long long reported_ns = 0;
    lease_options lo;
    lo.ttl = milliseconds(ttl_ms);
    lo.watchdog = watchdog;
    lo.on_lost = [&](const error&) {
      std::lock_guard<std::mutex> g(mu);
      reported = true;
      reported_ns = monotonic_ns();
      cv.notify_all();
    };
    lease_lock lock(db, "renew-" + random_suffix(), lo);
    const long long sent = monotonic_ns();
    auto g = lock.try_acquire();
    if (!g) return 10;
    // The guarded work: a loop that steps until the guard's lost() fires.
    std::atomic<long long> stopped_ns{0};
    std::thread work([&stopped_ns, lost = g->lost()] {
      while (!lost.sleep_for(milliseconds(5))) {
      }
      stopped_ns = monotonic_ns();
    });
    // From now on every renewal fails.
    auto blocker = direct.connect();
    if (sqlite) {
      blocker.session() << "BEGIN EXCLUSIVE";
    } else if (variant == 0) {
      proxy->set_blackhole(true);
    } else {
      proxy->set_refuse(true);
      proxy->cut_all();
    }
    bool unexpired = false;
    bool seen = false;  // reported within 3 x TTL (release() below may report later)
    long long seen_ns = 0;
    {
      std::unique_lock<std::mutex> l(mu);
      seen = cv.wait_for(l, milliseconds(3 * ttl_ms), [&] { return reported; });
      seen_ns = reported_ns;
    }
    if (seen) {
      // Read the row at once on the database clock (SQLite: through the connection holding the
      // exclusive lock; it is the only one that can read now).
      // Unexpired at the report: the database's now, less the time the read took since the
      // report (which a loaded machine stretches), still before the lease's end.
      auto row = dblock::test::read_lease(blocker, lock.name());
      const long long since_report_us = (monotonic_ns() - seen_ns) / 1000;
      unexpired = row && row->owner_token == g->owner_token() &&
                  row->expires_at_us > row->now_us - since_report_us;
    }
    const bool valid_after = g->valid();
    // The loop stopped by itself before the release (which fires lost() as well).
    const long long stopped_at = stopped_ns.load();
    if (sqlite) blocker.session() << "COMMIT";
    if (proxy) {
      proxy->set_blackhole(false);
      proxy->set_refuse(false);
      proxy->cut_all();
    }
    try {
      g->release();
    } catch (const std::exception&) {
    }
    g.reset();
    work.join();
    out << "T " << variant << " " << (seen ? 1 : 0) << " "
        << (seen ? (seen_ns - sent) / 1000000 : -1) << " " << (unexpired ? 1 : 0) << " "
        << (valid_after ? 1 : 0) << " " << (stopped_at > 0 ? 1 : 0) << " "
        << (stopped_at > 0 ? (stopped_at - sent) / 1000000 : -1) << "\n";
  }
  write_file_atomic(args.at(6), out.str());
  return 0;
}

namespace {

struct renewal_result {
  long long trials = 0, reported = 0, late = 0, expired_at_report = 0, valid_after = 0;
  // Reports in time by the local clock (before send + TTL) that found the row expired on the
  // database clock: a lease that ended before its TTL, whatever the machine's pace.
  long long expired_in_time = 0;
  long long work_stopped = 0, work_late = 0;  // by lost(), before the release; after the TTL
  std::string lines;
};

renewal_result run_renewal(const context& ctx, int trials, int ttl_ms, bool watchdog) {
  temp_dir dir("faults-renew");
  process_set ps;
  int pid = ps.spawn("renewal_blackhole_worker",
                     {ctx.backend, ctx.url, ctx.prefix, std::to_string(trials),
                      std::to_string(ttl_ms), watchdog ? "1" : "0", dir.file("out")});
  // Each trial waits at most 3 x TTL for the report.
  int rc = ps.wait(pid, std::chrono::seconds(std::max(120, 60 + trials * 3 * ttl_ms / 1000)));
  INFO("worker exit status " << rc);
  REQUIRE(rc == 0);
  renewal_result r;
  r.lines = read_file(dir.file("out"));
  std::istringstream in(r.lines);
  std::string k;
  int variant = 0, rep = 0, unexp = 0, valid = 0, stopped = 0;
  long long ms = 0, stop_ms = 0;
  while (in >> k >> variant >> rep >> ms >> unexp >> valid >> stopped >> stop_ms) {
    ++r.trials;
    r.reported += rep;
    if (rep && ms >= ttl_ms) ++r.late;
    if (rep && !unexp) ++r.expired_at_report;
    if (rep && !unexp && ms < ttl_ms) ++r.expired_in_time;
    r.valid_after += valid;
    r.work_stopped += stopped;
    if (stopped && stop_ms >= ttl_ms) ++r.work_late;
  }
  return r;
}

}  // namespace

// The TTL is 2 s (at scale 1): the watchdog reports at the default safety margin (a tenth of it)
// before the end, 200 ms, which a thread of a loaded 2-core machine usually reaches.
// Safety, strict at every scale: the guard is never valid() afterwards (its local deadline), and
// a report that came in time by the local clock finds the lease unexpired on the database clock.
// Liveness, which a machine that keeps the watchdog's or the work loop's thread off the CPU for
// more than the margin misses: every trial reported, before the TTL, with the row unexpired, and
// the work loop stopped by lost() before the TTL. Such misses run the trials again with twice
// and four times the TTL (and so the margin); only the last attempt's misses fail.
DBLOCK_TEST("renewal blackhole: the guard reports the loss before the lease can expire",
            "[faults][renewal][serial]") {
  const int trials = count(4, 20);
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const int ttl_ms = 2000 * scale;
    auto r = run_renewal(ctx, trials, ttl_ms, true);
    INFO("TTL " << ttl_ms << " ms\n" << r.lines);
    CHECK(r.trials == trials);
    CHECK(r.valid_after == 0);
    CHECK(r.expired_in_time == 0);
    if (!last && (r.reported != trials || r.late != 0 || r.expired_at_report != 0 ||
                  r.work_stopped != trials || r.work_late != 0)) {
      std::ostringstream m;
      m << "TTL " << ttl_ms << " ms: reported " << r.reported << " of " << trials << ", late "
        << r.late << ", expired at the report " << r.expired_at_report << ", work loops stopped "
        << r.work_stopped << ", late " << r.work_late;
      return {m.str()};
    }
    CHECK(r.reported == trials);
    CHECK(r.late == 0);
    CHECK(r.expired_at_report == 0);
    CHECK(r.work_stopped == trials);
    CHECK(r.work_late == 0);
    long long violations = (trials - r.reported) + r.late + r.expired_at_report + r.valid_after +
                           (trials - r.work_stopped) + r.work_late;
    report("5-renewal-blackhole", ctx.backend, r.trials, r.trials, violations,
           "ttl_ms=" + std::to_string(ttl_ms));
    return {};
  });
}

DBLOCK_TEST("negative control: without the watchdog no loss is reported",
            "[faults][renewal][control]") {
  auto r = run_renewal(ctx, 1, 300, false);
  INFO(r.lines);
  CHECK(r.trials == 1);
  CHECK(r.reported == 0);
  report("control-5-no-watchdog", ctx.backend, r.trials, r.trials, r.trials - r.reported,
         "expected=violations>0");
}
