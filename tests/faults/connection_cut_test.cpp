// Scenario 2 (docs/safety.md T7, E1): connections are killed at random points while 4 worker
// processes run the fenced counter workload through a loopback proxy (tcp_proxy): all
// connections reset, a reset after N bytes, the reply to the next COMMIT / acquire upsert /
// release dropped (the statement ran, the client never hears of it), and server-side kills
// (pg_terminate_backend, KILL CONNECTION) of the proxy's upstream sessions.
// Every try_acquire outcome must be acquired, not acquired or in_doubt, and never "not acquired"
// while the row carries an unexpired lease of ours (workers check the row directly after every
// "not acquired"); fenced COMMITs in doubt are resolved by reading the items log by owner token;
// then the exactness, fence and non-overlap checks of fault_support.hpp must hold.
#include <soci/soci.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "proxy.hpp"

using namespace dblock::test::faults;

namespace {

// Kills one server session whose client port is `port`; true when one was killed.
bool kill_session(const context& ctx, int port) {
  try {
    auto c = ctx.db.connect();
    if (ctx.backend == "postgresql") {
      int n = 0;
      c.session() << "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                     "client_port = :p",
          soci::use(port), soci::into(n);
      return n > 0;
    }
    long long id = 0;
    soci::indicator ind = soci::i_null;
    std::string host = "127.0.0.1:" + std::to_string(port);
    c.session() << "SELECT id FROM information_schema.processlist WHERE host = :h", soci::use(host),
        soci::into(id, ind);
    if (!c.session().got_data() || ind == soci::i_null) return false;
    c.session() << "KILL CONNECTION " << id;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// True while worker `pid` has not exited (a child that exited but is not reaped yet is 'Z').
bool still_running(int pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// What the server's sessions are doing, printed when workers outlive the stop: which session
// waits, for what, and (PostgreSQL) which sessions block it.
void print_server_sessions(const context& ctx) {
  try {
    auto c = ctx.db.connect();
    std::cerr << "server sessions (" << ctx.backend << "), workers still running:\n";
    if (ctx.backend == "postgresql") {
      soci::rowset<soci::row> rows =
          (c.session().prepare << "SELECT pid, coalesce(client_port, -1), "
                                  "coalesce(state, ''), coalesce(wait_event_type, ''), "
                                  "coalesce(wait_event, ''), "
                                  "coalesce(extract(epoch FROM now() - xact_start), -1), "
                                  "CAST(pg_blocking_pids(pid) AS TEXT), "
                                  "left(coalesce(query, ''), 100) FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND pid <> "
                                  "pg_backend_pid()");
      for (const auto& r : rows)
        std::cerr << "  pid " << r.get<int>(0) << " port " << r.get<int>(1) << " state '"
                  << r.get<std::string>(2) << "' wait " << r.get<std::string>(3) << "/"
                  << r.get<std::string>(4) << " xact_age_s " << r.get<double>(5) << " blocked_by "
                  << r.get<std::string>(6) << " query: " << r.get<std::string>(7) << "\n";
    } else {
      soci::rowset<soci::row> rows =
          (c.session().prepare << "SELECT CAST(ID AS CHAR), COMMAND, CAST(TIME AS CHAR), "
                                  "coalesce(STATE, ''), left(coalesce(INFO, ''), 100) FROM "
                                  "information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()");
      for (const auto& r : rows)
        std::cerr << "  id " << r.get<std::string>(0) << " " << r.get<std::string>(1) << " "
                  << r.get<std::string>(2) << " s state '" << r.get<std::string>(3)
                  << "' query: " << r.get<std::string>(4) << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "server sessions: cannot read them: " << e.what() << "\n";
  }
}

}  // namespace

namespace {

// `sql_workers` of the 4 workers (the last ones) are Python clients of the SQL API.
void run_cuts(context& ctx, int seconds, const std::string& lock_kind, const std::string& scenario,
              int sql_workers = 0) {
  create_workload_tables(ctx);
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  temp_dir dir("faults-cut");
  auto w = make_workload(ctx, "cut", dir, 700);
  w.url = url_via(ctx.url, proxy.port());
  w.try_mode = true;
  w.pool = 2;
  w.kind = lock_kind;
  process_set ps;
  const int cpp_workers = 4 - sql_workers;
  const std::vector<int> pids = spawn_mixed_workers(ps, w, 4, sql_workers);
  std::this_thread::sleep_for(milliseconds(800));
  // With SQL workers, the one-shot reply cuts aim at their routines half of the time.
  const bool sql = sql_workers > 0;
  const std::string lock_table = ctx.db.lock_table();
  long long server_kills = 0, commands = 0;
  std::map<int, long long> kinds;
  const long long end = monotonic_ns() + seconds * 1000000000LL;
  auto one_fault = [&] {
    int kind = static_cast<int>(rnd(0, 5));
    ++kinds[kind];
    ++commands;
    switch (kind) {
      case 0:
        proxy.cut_all();
        break;
      case 1:
        proxy.cut_after_bytes(rnd(1, 3000));
        break;
      case 2:
        proxy.cut_reply_to("COMMIT");
        break;
      case 3:
        proxy.cut_reply_to(sql && rnd(0, 1) ? "dblock_acquire("
                                            : acquire_request_pattern(ctx.url, lock_table));
        break;
      case 4:
        proxy.cut_reply_to(sql && rnd(0, 2) == 0 ? "dblock_check_fence("
                           : sql && rnd(0, 1)    ? "dblock_release("
                                              : renew_release_request_pattern(ctx.url, lock_table));
        break;
      default: {
        auto ports = proxy.upstream_ports();
        if (!ports.empty() &&
            kill_session(
                ctx,
                ports[static_cast<std::size_t>(rnd(0, static_cast<long long>(ports.size()) - 1))]))
          ++server_kills;
      }
    }
  };
  while (monotonic_ns() < end) {
    std::this_thread::sleep_for(milliseconds(rnd(30, 200)));
    one_fault();
  }
  // Every kind of client must have written and (SQL) met a fault. On a loaded machine the
  // window can pass before that: the faults go on, a few times a second, until it has (at most a
  // minute more), so that only a workload that makes no progress at all fails the checks below.
  auto progressed = [&] {
    if (log_lines(w, 0, cpp_workers, "K") == 0) return false;
    if (!sql) return true;
    return log_lines(w, cpp_workers, 4, "K") > 0 && log_lines(w, cpp_workers, 4, "E") +
                                                            log_lines(w, cpp_workers, 4, "X") +
                                                            log_lines(w, cpp_workers, 4, "D") >
                                                        0;
  };
  long long last_fault = monotonic_ns();
  wait_for_progress(progressed, std::chrono::seconds(60), [&] {
    if (monotonic_ns() - last_fault < 500 * ns_per_ms) return;
    one_fault();
    last_fault = monotonic_ns();
  });
  stop_workers(w);
  // Workers normally stop within seconds. If they do not within 30 s, say what the server's
  // sessions are doing before the deadline below kills the workers (it prints their stacks).
  const long long look = monotonic_ns() + 30LL * 1000000000LL;
  auto running = [&] {
    return std::any_of(pids.begin(), pids.end(), [](int p) { return still_running(p); });
  };
  while (running() && monotonic_ns() < look)
    std::this_thread::sleep_for(milliseconds(100));
  // DBLOCK_FAULTS_SHOW_SESSIONS=1 prints them anyway (to check this report).
  if (running() || std::getenv("DBLOCK_FAULTS_SHOW_SESSIONS")) print_server_sessions(ctx);
  require_clean_exit(ps, w, std::chrono::seconds(60));
  auto a = analyze(ctx.db, ctx, w, true);
  for (const auto& e : a.error_samples)
    std::cerr << scenario << " " << ctx.backend << " worker error: " << e << std::endl;
  const long long faults = proxy.cuts() + server_kills;
  INFO(a.summary() << "\nfaults: proxy resets " << proxy.cuts() << ", server-side kills "
                   << server_kills << " (" << commands << " commands)");
  CHECK(a.violations == 0);
  CHECK(a.acked > 0);
  CHECK(faults > 0);
  if (sql) {
    // Both kinds of client wrote, and the SQL clients met the faults too (a statement failed).
    const long long cpp_acked = log_lines(w, 0, cpp_workers, "K");
    const long long sql_acked = log_lines(w, cpp_workers, 4, "K");
    const long long sql_failed = log_lines(w, cpp_workers, 4, "E") +
                                 log_lines(w, cpp_workers, 4, "X") +
                                 log_lines(w, cpp_workers, 4, "D");
    INFO("C++ workers acknowledged " << cpp_acked << ", SQL workers " << sql_acked
                                     << "; SQL workers' failed statements " << sql_failed);
    CHECK(cpp_acked > 0);
    CHECK(sql_acked > 0);
    CHECK(sql_failed > 0);
  }
  report(scenario, ctx.backend, commands, faults, a.violations,
         "acked=" + std::to_string(a.acked) +
             " in_doubt_commit=" + std::to_string(a.doubt_written + a.doubt_not_written) +
             " rolled_back=" + std::to_string(a.rolled_back) + " acquire_errors=" +
             std::to_string(a.errors) + " server_kills=" + std::to_string(server_kills));
}

}  // namespace

DBLOCK_TEST_SERVERS("connections cut at random points, including between COMMIT and its reply",
                    "[faults][cut]") {
  run_cuts(ctx, count(10, 60), "lease", "2-connection-cut");
}

// The same with the lock being the one permit of a semaphore (declaration, probe and the read of
// held permits all cut too).
DBLOCK_TEST_SERVERS("semaphore permits: connections cut at random points, also before replies",
                    "[faults][cut][semaphore]") {
  run_cuts(ctx, count(6, 60), "semaphore", "2-connection-cut-permit");
}

// The same with the lock being the leadership of an election (its watchdog renewals and the
// monitor thread's loss signal under cuts too).
DBLOCK_TEST_SERVERS("leaderships: connections cut at random points, also before replies",
                    "[faults][cut][election]") {
  run_cuts(ctx, count(6, 60), "election", "2-connection-cut-leader");
}

// The lock protocol spoken by two kinds of client at once (docs/sql-api.md): two C++ workers on
// the library and two Python workers calling the SQL routines (psycopg2, MySQLdb) share one
// lease and the fenced counter while connections are cut, replies to the routines lost
// (acquire, check_fence, release) and sessions killed: 0 lost or doubled writes.
DBLOCK_TEST_SERVERS("SQL API: C++ and Python workers share the fenced counter under cuts",
                    "[faults][cut][sql_api]") {
  // Shorter under the sanitizers: the Python side gains nothing there.
  run_cuts(ctx, count(sanitized_build() ? 4 : 8, 60), "lease", "2-connection-cut-sql-api", 2);
}
