// Cache rebuild: a derived table (the "cache", --rows rows) is read by --readers processes and
// rebuilt by one rebuilder process, row by row, --rebuilds times. A rebuild writes generation g+1
// into every row, one statement at a time (as a real rebuild of many rows would, in pieces). Each
// reader reads the whole cache under a read lock and checks that every row carries the same
// generation: a reader that met a half-rebuilt cache counts a mixed read. With the read-write
// lock (dblock::rwlock) readers share it, the rebuilder writes alone, and a waiting rebuilder
// holds back new readers, so it is never starved. --no-lock (the negative control) reads and
// rebuilds with no lock: mixed reads happen.
//
// Exit status 0 when no read was mixed, every rebuild ran and readers really read together (with
// the lock); 1 when a read was mixed (--no-lock expects this); 2 on errors.
//
// Usage: cache_rebuild [--url URL] [--table-prefix cr_] [--readers 4] [--rows 20]
//                      [--rebuilds 5] [--reads 40] [--no-lock]
// Default URL: sqlite://cache_rebuild.db (created in the current directory).
#include <soci/soci.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using std::chrono::milliseconds;

struct settings {
  std::string url = "sqlite://cache_rebuild.db";
  std::string prefix = "cr_";
  int readers = 4, rows = 20, rebuilds = 5, reads = 40;
  bool no_lock = false;
  std::string table() const { return prefix + "cache"; }
};

long long mono_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000LL + ts.tv_nsec / 1000000;
}

// Readers and the rebuilder poll briskly while the other side holds the lock.
dblock::lease_options lock_options() {
  dblock::lease_options lo;
  lo.poll_initial = milliseconds(1);
  lo.poll_max = milliseconds(50);
  return lo;
}

dblock::database open_db(const settings& s) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  o.pool_size = 3;
  return dblock::database(s.url, o);
}

void reset(const settings& s) {
  auto db = open_db(s);
  dblock::migrate(db);
  auto c = db.connect();
  c.session() << "DROP TABLE IF EXISTS " << s.table();
  c.session() << "CREATE TABLE " << s.table() << " (k INT PRIMARY KEY, generation INT NOT NULL)";
  for (int k = 0; k < s.rows; ++k)
    c.session() << "INSERT INTO " << s.table() << " (k, generation) VALUES (:k, 0)", soci::use(k);
}

// What one process did, passed to the parent through a pipe.
struct report {
  int reads = 0, mixed = 0, rebuilds = 0, errors = 0;
  long long longest_wait_ms = 0;
};

// One read of the whole cache: true when every row carries the same generation.
bool read_consistent(dblock::database& db, const settings& s) {
  auto c = db.connect();
  int lo = 0, hi = 0;
  c.session() << "SELECT MIN(generation), MAX(generation) FROM " << s.table(), soci::into(lo),
      soci::into(hi);
  return lo == hi;
}

void rebuild(dblock::database& db, const settings& s, int generation) {
  auto c = db.connect();
  for (int k = 0; k < s.rows; ++k) {
    c.session() << "UPDATE " << s.table() << " SET generation = :g WHERE k = :k",
        soci::use(generation), soci::use(k);
    std::this_thread::sleep_for(milliseconds(2));  // a real rebuild computes each piece
  }
}

report run_reader(const settings& s) {
  report r;
  auto db = open_db(s);
  dblock::rwlock cache(db, "cache/" + s.prefix, lock_options());
  for (int i = 0; i < s.reads; ++i) {
    std::optional<dblock::lease_guard> g;
    const long long asked = mono_ms();
    if (!s.no_lock) g.emplace(cache.acquire_shared(std::chrono::seconds(60)));
    r.longest_wait_ms = std::max(r.longest_wait_ms, mono_ms() - asked);
    if (!read_consistent(db, s)) ++r.mixed;
    std::this_thread::sleep_for(milliseconds(10));  // serve from what was read
    ++r.reads;
  }
  return r;
}

report run_rebuilder(const settings& s) {
  report r;
  auto db = open_db(s);
  dblock::rwlock cache(db, "cache/" + s.prefix, lock_options());
  for (int g = 1; g <= s.rebuilds; ++g) {
    std::this_thread::sleep_for(milliseconds(60));
    std::optional<dblock::lease_guard> w;
    const long long asked = mono_ms();
    if (!s.no_lock) w.emplace(cache.acquire(std::chrono::seconds(60)));
    r.longest_wait_ms = std::max(r.longest_wait_ms, mono_ms() - asked);
    rebuild(db, s, g);
    ++r.rebuilds;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Cache rebuild: readers share a read-write lock, one rebuilder writes alone"};
  app.add_option("--url", s.url, "database URL")->capture_default_str();
  app.add_option("--table-prefix", s.prefix, "prefix of every table")->capture_default_str();
  app.add_option("--readers", s.readers, "reader processes")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  app.add_option("--rows", s.rows, "rows in the cache")->check(CLI::Range(2, 1000));
  app.add_option("--rebuilds", s.rebuilds, "rebuilds")->check(CLI::Range(1, 100));
  app.add_option("--reads", s.reads, "reads per reader")->check(CLI::Range(1, 10000));
  app.add_flag("--no-lock", s.no_lock, "negative control: no read-write lock");
  CLI11_PARSE(app, argc, argv);
  try {
    reset(s);
  } catch (const std::exception& e) {
    std::cerr << "cache_rebuild: " << e.what() << "\n";
    return 2;
  }
  std::vector<std::pair<pid_t, int>> kids;
  for (int i = 0; i <= s.readers; ++i) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      report r;
      try {
        r = i < s.readers ? run_reader(s) : run_rebuilder(s);
      } catch (const std::exception& e) {
        std::cerr << "cache_rebuild: " << (i < s.readers ? "reader: " : "rebuilder: ") << e.what()
                  << "\n";
        r.errors = 1;
      }
      _exit(write(fds[1], &r, sizeof r) == static_cast<ssize_t>(sizeof r) ? 0 : 3);
    }
    close(fds[1]);
    kids.emplace_back(pid, fds[0]);
  }
  report readers, rebuilder;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    report r;
    const bool got = read(kids[i].second, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    close(kids[i].second);
    int status = 0;
    waitpid(kids[i].first, &status, 0);
    if (!got) r.errors = 1;
    report& into = i + 1 < kids.size() ? readers : rebuilder;
    into.reads += r.reads;
    into.mixed += r.mixed;
    into.rebuilds += r.rebuilds;
    into.errors += r.errors;
    into.longest_wait_ms = std::max(into.longest_wait_ms, r.longest_wait_ms);
  }
  std::cout << "reads " << readers.reads << ", mixed reads " << readers.mixed << ", rebuilds "
            << rebuilder.rebuilds << " of " << s.rebuilds << ", longest reader wait "
            << readers.longest_wait_ms << " ms, longest rebuilder wait "
            << rebuilder.longest_wait_ms << " ms, errors " << readers.errors + rebuilder.errors
            << (s.no_lock ? " (no lock)" : " (read-write lock)") << "\n";
  if (readers.errors + rebuilder.errors > 0) return 2;
  if (readers.mixed > 0) {
    std::cout << "verdict: invariant BROKEN: readers saw a half-rebuilt cache\n";
    return 1;
  }
  if (rebuilder.rebuilds != s.rebuilds) return 2;
  std::cout << "verdict: invariant held: no reader saw a half-rebuilt cache\n";
  return 0;
}
