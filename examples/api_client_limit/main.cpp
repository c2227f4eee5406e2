// Connection-limited API client: a partner API allows at most K concurrent connections per
// customer; N worker processes (as on N hosts) call it, each call holding one permit of the
// dblock semaphore "partner-api" of K permits.
//
// The "API" is a gauge row in the database that every call raises when it connects and lowers
// when it hangs up, keeping the peak: what the partner would see. Each call also records itself
// with a fenced write under its permit, which commits only while the permit's lease is ours.
//
// Invariant: the peak number of concurrent calls is at most K, and every call was recorded once.
// With --no-semaphore (the negative control) the workers call without permits and the peak
// exceeds K. The exit status is 0 when the invariant held.
//
// Usage: api_client_limit [--url URL] [--permits 3] [--workers 8] [--calls 10] [--call-ms 20]
//                         [--no-semaphore]
// Default URL: sqlite://api_client_limit.db (created in the current directory).
#include <soci/soci.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct settings {
  std::string url = "sqlite://api_client_limit.db";
  std::string prefix = "acl_";
  int permits = 3;
  int workers = 8;
  int calls = 10;
  int call_ms = 20;
  bool use_semaphore = true;
};

dblock::database open(const settings& s, std::size_t pool_size) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  o.pool_size = pool_size;
  return dblock::database(s.url, o);
}

void reset_tables(const settings& s) {
  auto db = open(s, 1);
  dblock::migrate(db);  // the permits live in dblock's own tables
  auto c = db.connect();
  auto& sql = c.session();
  sql << "DROP TABLE IF EXISTS " << s.prefix << "api_gauge";
  sql << "DROP TABLE IF EXISTS " << s.prefix << "api_calls";
  sql << "CREATE TABLE " << s.prefix
      << "api_gauge (id INTEGER PRIMARY KEY, active INTEGER, peak INTEGER)";
  sql << "INSERT INTO " << s.prefix << "api_gauge (id, active, peak) VALUES (1, 0, 0)";
  sql << "CREATE TABLE " << s.prefix
      << "api_calls (call_id INTEGER PRIMARY KEY, worker INTEGER NOT NULL, permit INTEGER NOT NULL,"
         " fence BIGINT NOT NULL)";
}

struct worker_report {
  int calls = 0;              // calls made (and recorded)
  long long max_wait_ms = 0;  // longest wait for a permit
  int errors = 0;
};

// One call to the partner API: connect (raise the gauge), talk, hang up (lower it).
void call_api(dblock::database& db, const settings& s) {
  auto c = db.connect();
  // peak first: MySQL evaluates SET left to right, the others on the old row; both see the old
  // `active` here.
  c.session() << "UPDATE " << s.prefix
              << "api_gauge SET peak = CASE WHEN active + 1 > peak THEN active + 1 ELSE peak END,"
                 " active = active + 1 WHERE id = 1";
  std::this_thread::sleep_for(milliseconds(s.call_ms));
  c.session() << "UPDATE " << s.prefix << "api_gauge SET active = active - 1 WHERE id = 1";
}

worker_report run_worker(const settings& s, int worker, clock_type::time_point start) {
  worker_report r;
  try {
    auto db = open(s, 3);
    db.ping();
    dblock::lease_options lo;
    lo.ttl = std::chrono::seconds(10);
    lo.watchdog = true;  // a slow call keeps its permit
    lo.poll_initial = milliseconds(1);
    lo.poll_max = milliseconds(20);
    dblock::semaphore api(db, "partner-api", s.permits, lo);
    std::this_thread::sleep_until(start);
    for (int i = 0; i < s.calls; ++i) {
      const long long call_id = static_cast<long long>(worker) * 100000 + i;
      if (!s.use_semaphore) {
        call_api(db, s);
        auto c = db.connect();
        long long none = -1;
        c.session() << "INSERT INTO " << s.prefix
                    << "api_calls (call_id, worker, permit, fence) VALUES (:c, :w, -1, :f)",
            soci::use(call_id), soci::use(worker), soci::use(none);
        ++r.calls;
        continue;
      }
      const auto asked = clock_type::now();
      auto permit = api.acquire(std::chrono::seconds(60));
      r.max_wait_ms = std::max<long long>(
          r.max_wait_ms,
          std::chrono::duration_cast<milliseconds>(clock_type::now() - asked).count());
      call_api(db, s);
      int slot = dblock::semaphore::permit_slot(permit);
      long long fence = permit.fence();
      permit.fenced([&](soci::session& sql) {
        sql << "INSERT INTO " << s.prefix
            << "api_calls (call_id, worker, permit, fence) VALUES (:c, :w, :p, :f)",
            soci::use(call_id), soci::use(worker), soci::use(slot), soci::use(fence);
      });
      permit.release();
      ++r.calls;
    }
  } catch (const std::exception& e) {
    ++r.errors;
    std::cerr << "worker " << worker << ": " << e.what() << "\n";
  }
  return r;
}

// Forks the workers (each with its own database handle) and collects their reports.
std::vector<worker_report> run_workers(const settings& s, int& failed) {
  const auto start = clock_type::now() + milliseconds(400);  // time for every worker to connect
  std::vector<std::pair<pid_t, int>> children;
  std::cout.flush();
  for (int i = 0; i < s.workers; ++i) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(fds[0]);
      const worker_report r = run_worker(s, i, start);
      if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
      _exit(0);
    }
    close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  std::vector<worker_report> out;
  failed = 0;
  for (auto& [pid, fd] : children) {
    worker_report r;
    const bool got = read(fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      r = worker_report{};
      r.errors = 1;
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  bool no_semaphore = false;
  CLI::App app{"Connection-limited API client: N workers, at most K calls at once"};
  app.add_option("--url", s.url, "database URL (sqlite://..., postgresql://..., mysql://...)")
      ->capture_default_str();
  app.add_option("--table-prefix", s.prefix, "prefix of every table this demo uses")
      ->capture_default_str();
  app.add_option("--permits", s.permits, "concurrent calls the API allows (K)")
      ->check(CLI::Range(1, dblock::max_semaphore_permits))
      ->capture_default_str();
  app.add_option("--workers", s.workers, "worker processes (N)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--calls", s.calls, "calls per worker")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--call-ms", s.call_ms, "how long a call keeps its connection")
      ->check(CLI::Range(0, 60000))
      ->capture_default_str();
  app.add_flag("--no-semaphore", no_semaphore, "call without permits (the negative control)");
  CLI11_PARSE(app, argc, argv);
  s.use_semaphore = !no_semaphore;

  std::vector<worker_report> reports;
  int failed = 0, active = -1, peak = -1, recorded = -1;
  try {
    std::cout << "API client on " << dblock::database(s.url).redacted_url() << ": " << s.workers
              << " workers x " << s.calls << " calls of " << s.call_ms << " ms; the API allows "
              << s.permits << " at once; "
              << (s.use_semaphore ? "each call holds a permit of semaphore \"partner-api\""
                                  : "no semaphore (negative control)")
              << "\n\n";
    reset_tables(s);  // its handle is gone before we fork
    reports = run_workers(s, failed);
    auto db = open(s, 1);
    auto c = db.connect();
    c.session() << "SELECT active, peak FROM " << s.prefix << "api_gauge WHERE id = 1",
        soci::into(active), soci::into(peak);
    c.session() << "SELECT count(*) FROM " << s.prefix << "api_calls", soci::into(recorded);
  } catch (const std::exception& e) {
    std::cerr << "api_client_limit: " << e.what() << "\n";
    return 2;
  }

  std::printf("%6s %6s %16s %7s\n", "worker", "calls", "max wait (ms)", "errors");
  int calls = 0, errors = failed;
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    std::printf("%6zu %6d %16lld %7d\n", i, r.calls, r.max_wait_ms, r.errors);
    calls += r.calls;
    errors += r.errors;
  }
  const int expected = s.workers * s.calls;
  std::printf(
      "\ncalls %d of %d, recorded %d; peak concurrent calls %d (allowed %d); %d still "
      "connected\n",
      calls, expected, recorded, peak, s.permits, active);
  const bool held =
      peak <= s.permits && calls == expected && recorded == expected && errors == 0 && active == 0;
  if (held)
    std::cout << "verdict: invariant held: at most " << s.permits << " concurrent calls (peak "
              << peak << "), every call recorded once\n";
  else
    std::cout << "verdict: invariant BROKEN: peak " << peak << " concurrent calls where "
              << s.permits << " are allowed, " << recorded << " of " << expected
              << " calls recorded, " << errors << " errors"
              << (s.use_semaphore ? "" : " (expected without the semaphore)") << "\n";
  return held ? 0 : 1;
}
