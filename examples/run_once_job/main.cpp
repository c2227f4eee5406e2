// Run-once job: N instances of a scheduled job (processes, as on N hosts) share a schedule of one
// run per period, and each period's job must run exactly once.
//
// At the start of period k every instance tries the lease "job/report/<k>" once:
//   lock at most for   the lease TTL: if the runner dies, the lock frees itself after it;
//   lock at least for  the runner keeps holding the lease until this long after the period
//                      started (by its own clock) and only then releases it, even when the job
//                      was quicker, so that an instance whose clock runs late, and therefore
//                      starts "the same" period later, finds the lock still taken.
// The job body records (period, instance, fence) in `job_runs` with guard.fenced(), which
// commits only while the lease is still ours (a job that overruns at-most-for writes nothing).
// The instances' clocks are skewed on purpose: instance i runs late by i * max-skew / (N - 1).
//
// Invariant: exactly one run per period, and within a period the fences increase (fencing
// tokens are per lock name, so each period has its own sequence; extra runs of a period, as
// with --at-least-for 0, show up with higher fences). The exit status is 0 when it held.
//
// Usage: run_once_job [--url URL] [--instances 4] [--periods 3] [--period-ms 1000]
//                     [--at-most-for 800] [--at-least-for 300] [--max-skew 200] [--job-ms 50]
// Default URL: sqlite://run_once_job.db (created in the current directory).
#include <soci/soci.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;  // CLOCK_MONOTONIC: shared by all processes
using std::chrono::milliseconds;

struct settings {
  std::string url = "sqlite://run_once_job.db";
  std::string prefix = "rj_";
  int instances = 4;
  int periods = 3;
  int period_ms = 1000;
  int at_most_for = 800;
  int at_least_for = 300;
  int max_skew = 200;
  int job_ms = 50;
};

std::string runs_table(const settings& s) {
  return s.prefix + "job_runs";
}

dblock::database open(const settings& s, std::size_t pool_size) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  o.pool_size = pool_size;
  return dblock::database(s.url, o);
}

void reset_tables(const settings& s) {
  auto db = open(s, 1);
  dblock::migrate(db);  // the leases live in dblock's own table
  auto c = db.connect();
  auto& sql = c.session();
  sql << "DROP TABLE IF EXISTS " << runs_table(s);
  sql << "CREATE TABLE " << runs_table(s)
      << " (run_id BIGINT PRIMARY KEY, period INTEGER NOT NULL, instance INTEGER NOT NULL,"
         " fence BIGINT NOT NULL, started_ms BIGINT NOT NULL, finished_ms BIGINT NOT NULL)";
}

// How late instance i's clock runs.
int skew_of(const settings& s, int instance) {
  return s.instances > 1 ? s.max_skew * instance / (s.instances - 1) : 0;
}

struct instance_report {
  int ran = 0;      // periods this instance ran the job for
  int skipped = 0;  // periods whose lease someone else held
  int lost = 0;     // runs whose fenced write was refused (the lease had run out)
  int errors = 0;   // anything else
};

long long ms_between(clock_type::time_point from, clock_type::time_point to) {
  return std::chrono::duration_cast<milliseconds>(to - from).count();
}

// One scheduled run of period k (1-based) on this instance.
void run_period(const dblock::database& db, const settings& s, int instance, int k,
                clock_type::time_point nominal, instance_report& r) {
  // This instance's clock runs late: to it, the period starts only now.
  const auto period_start = nominal + milliseconds(skew_of(s, instance));
  std::this_thread::sleep_until(period_start);

  dblock::lease_options lo;
  lo.ttl = milliseconds(s.at_most_for);  // lock at most for
  dblock::lease_lock lock(db, "job/report/" + std::to_string(k), lo);
  auto guard = lock.try_acquire();
  if (!guard) {
    ++r.skipped;  // another instance runs (or has run) this period
    return;
  }

  // The job itself.
  const auto started = clock_type::now();
  std::this_thread::sleep_for(milliseconds(s.job_ms));
  try {
    guard->fenced([&](soci::session& sql) {
      long long run_id = static_cast<long long>(k) * 1000 + instance;
      long long fence = guard->fence();
      long long start_ms = ms_between(nominal, started);
      long long end_ms = ms_between(nominal, clock_type::now());
      sql << "INSERT INTO " << runs_table(s)
          << " (run_id, period, instance, fence, started_ms, finished_ms)"
             " VALUES (:id, :p, :i, :f, :s, :e)",
          soci::use(run_id), soci::use(k), soci::use(instance), soci::use(fence),
          soci::use(start_ms), soci::use(end_ms);
    });
    ++r.ran;
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::lease_lost) throw;
    ++r.lost;  // the job overran at-most-for: its result was not committed
    std::cerr << "instance " << instance << ", period " << k << ": " << e.what() << "\n";
    return;
  }

  // Lock at least for: hold the lease until at-least-for has passed since the period started
  // (by this instance's clock), then release it.
  std::this_thread::sleep_until(period_start + milliseconds(s.at_least_for));
  try {
    guard->release();
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::lease_lost) throw;  // at-most-for ended it first: fine
  }
}

// Runs in a forked child: its own database handle and connections.
instance_report run_instance(const settings& s, int instance, clock_type::time_point t0) {
  instance_report r;
  try {
    auto db = open(s, 2);
    db.ping();  // connect before the schedule starts
    for (int k = 1; k <= s.periods; ++k) {
      try {
        run_period(db, s, instance, k, t0 + milliseconds(s.period_ms) * (k - 1), r);
      } catch (const std::exception& e) {
        if (++r.errors <= 3)
          std::cerr << "instance " << instance << ", period " << k << ": " << e.what() << "\n";
      }
    }
  } catch (const std::exception& e) {
    ++r.errors;
    std::cerr << "instance " << instance << ": " << e.what() << "\n";
  }
  return r;
}

// Forks the instances and collects their reports (in instance order).
std::vector<instance_report> run_instances(const settings& s, clock_type::time_point t0,
                                           int& failed_processes) {
  std::vector<std::pair<pid_t, int>> children;  // pid, read end of its report pipe
  std::cout.flush();
  for (int i = 0; i < s.instances; ++i) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(fds[0]);
      instance_report r = run_instance(s, i, t0);
      if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
      _exit(0);
    }
    close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  std::vector<instance_report> out;
  failed_processes = 0;
  for (auto& [pid, fd] : children) {
    instance_report r;
    bool got = read(fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed_processes;
      r = instance_report{};
      r.errors = 1;
    }
    out.push_back(r);
  }
  return out;
}

struct run_row {
  int period = 0, instance = 0;
  long long fence = 0, started_ms = 0, finished_ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Run-once job: N instances, one run per period, with lock-at-most/least-for"};
  app.add_option("--url", s.url, "database URL (sqlite://..., postgresql://..., mysql://...)")
      ->capture_default_str();
  app.add_option("--table-prefix", s.prefix, "prefix of every table this demo uses")
      ->capture_default_str();
  app.add_option("--instances", s.instances, "job instances (processes)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--periods", s.periods, "periods to run")
      ->check(CLI::Range(1, 999))
      ->capture_default_str();
  app.add_option("--period-ms", s.period_ms, "length of a period")
      ->check(CLI::Range(50, 3600000))
      ->capture_default_str();
  app.add_option("--at-most-for", s.at_most_for,
                 "lease TTL in ms: a crashed runner's lock frees after it")
      ->check(CLI::Range(10, 3600000))
      ->capture_default_str();
  app.add_option("--at-least-for", s.at_least_for,
                 "ms after the period start before the runner releases (0: at once)")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--max-skew", s.max_skew, "how late the last instance's clock runs, in ms")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--job-ms", s.job_ms, "how long the job takes")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (s.at_least_for >= s.at_most_for) {
    std::cerr << "run_once_job: --at-least-for must be below --at-most-for\n";
    return 2;
  }
  if (s.max_skew >= s.period_ms) {
    std::cerr << "run_once_job: --max-skew must be below --period-ms\n";
    return 2;
  }

  std::vector<instance_report> reports;
  std::vector<run_row> runs;
  int failed_processes = 0;
  try {
    std::cout << "run-once job on " << dblock::database(s.url).redacted_url() << ": " << s.instances
              << " instances, " << s.periods << " periods of " << s.period_ms << " ms\n"
              << "lease \"job/report/<period>\": lock at most for " << s.at_most_for
              << " ms (TTL), at least for " << s.at_least_for
              << " ms (held that long after the period start)\n"
              << "instance clocks run late by 0.." << s.max_skew << " ms; the job takes "
              << s.job_ms << " ms\n";
    if (s.at_least_for <= s.max_skew)
      std::cout << "note: at-least-for <= clock skew: a late instance may find the lock free "
                   "and run a period again\n";
    std::cout << "\n";
    reset_tables(s);  // its database handle (and connections) are gone before we fork
    const auto t0 = clock_type::now() + milliseconds(300);  // time for every instance to connect
    reports = run_instances(s, t0, failed_processes);

    auto db = open(s, 1);
    auto c = db.connect();
    const std::size_t max_rows = static_cast<std::size_t>(s.periods) * s.instances + 1;
    std::vector<long long> period(max_rows), instance(max_rows), fence(max_rows), started(max_rows),
        finished(max_rows);
    c.session() << "SELECT period, instance, fence, started_ms, finished_ms FROM " << runs_table(s)
                << " ORDER BY period, started_ms, fence",
        soci::into(period), soci::into(instance), soci::into(fence), soci::into(started),
        soci::into(finished);
    for (std::size_t i = 0; i < period.size(); ++i)
      runs.push_back({static_cast<int>(period[i]), static_cast<int>(instance[i]), fence[i],
                      started[i], finished[i]});
  } catch (const std::exception& e) {
    std::cerr << "run_once_job: " << e.what() << "\n";
    return 2;
  }

  // Check: one run per period; within a period, fences increase in the order the runs started.
  std::map<int, int> per_period;
  std::map<int, long long> last_fence;
  bool fences_increase = true;
  for (const auto& r : runs) {
    ++per_period[r.period];
    auto it = last_fence.find(r.period);
    if (it != last_fence.end() && r.fence <= it->second) fences_increase = false;
    last_fence[r.period] = r.fence;
  }
  std::printf("%6s %9s %6s %13s %14s %15s\n", "period", "instance", "fence", "started (ms)",
              "finished (ms)", "runs in period");
  for (const auto& r : runs)
    std::printf("%6d %9d %6lld %13lld %14lld %15d\n", r.period, r.instance, r.fence, r.started_ms,
                r.finished_ms, per_period[r.period]);
  int exactly_once = 0, twice_or_more = 0, never = 0;
  for (int k = 1; k <= s.periods; ++k) {
    int n = per_period.count(k) ? per_period[k] : 0;
    if (n == 0) {
      ++never;
      std::printf("%6d %9s %6s %13s %14s %15d\n", k, "-", "-", "-", "-", 0);
    }
    if (n == 1) ++exactly_once;
    if (n > 1) ++twice_or_more;
  }

  std::printf("\n%8s %10s %4s %8s %5s %7s\n", "instance", "skew (ms)", "ran", "skipped", "lost",
              "errors");
  int errors = failed_processes, lost = 0;
  for (int i = 0; i < static_cast<int>(reports.size()); ++i) {
    const auto& r = reports[static_cast<std::size_t>(i)];
    std::printf("%8d %10d %4d %8d %5d %7d\n", i, skew_of(s, i), r.ran, r.skipped, r.lost, r.errors);
    errors += r.errors;
    lost += r.lost;
  }
  std::printf("\nperiods %d: run exactly once %d, more than once %d, never %d\n", s.periods,
              exactly_once, twice_or_more, never);

  const bool held = exactly_once == s.periods && fences_increase && errors == 0 && lost == 0;
  if (held)
    std::cout << "verdict: invariant held: exactly one run per period (" << s.periods
              << " periods), fences increasing\n";
  else
    std::cout << "verdict: invariant BROKEN: " << twice_or_more << " periods ran more than once, "
              << never << " never" << (fences_increase ? "" : ", fences not increasing") << ", "
              << lost << " runs lost their lease, " << errors << " errors"
              << (twice_or_more > 0 && s.at_least_for <= s.max_skew
                      ? " (expected: at-least-for does not cover the clock skew)"
                      : "")
              << "\n";
  return held ? 0 : 1;
}
