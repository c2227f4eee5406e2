#include "fault_support.hpp"
#include "internals.hpp"
#include "rows.hpp"
#include "test_paths.hpp"
#include "workload_lock.hpp"

#include <fcntl.h>
#include <soci/soci.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace dblock::test::faults {

using std::chrono::milliseconds;

bool full() {
  const char* v = std::getenv("DBLOCK_FAULTS_FULL");
  return v && std::string(v) == "1";
}

int count(int reduced, int full_count) {
  if (full()) return full_count;
  // Under the sanitizers the scenarios check memory and thread safety, which half the trials
  // cover: the plain build runs them whole (and DBLOCK_FAULTS_FULL=1 runs the full counts).
  if (sanitized_build()) return std::max(1, reduced / 2);
  return reduced;
}

long long raw_monotonic_ns() {
  timespec ts{};
  ::syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

long long log_lines(const workload& w, int from, int to, const std::string& k) {
  long long n = 0;
  for (int id = from; id < to; ++id) {
    const std::string path = w.dir + "/w" + std::to_string(id) + ".log";
    if (::access(path.c_str(), R_OK) != 0) continue;  // not started yet
    std::istringstream in(read_file(path));
    std::string line;
    while (std::getline(in, line))
      if (line.compare(0, k.size() + 1, k + " ") == 0) ++n;
  }
  return n;
}

bool wait_for_progress(const std::function<bool()>& progressed, std::chrono::milliseconds most,
                       const std::function<void()>& tick) {
  const long long until = monotonic_ns() + most.count() * 1000000LL;
  const long long from = monotonic_ns();
  while (!progressed()) {
    if (monotonic_ns() >= until) return false;
    if (tick) tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (monotonic_ns() - from > 150000000LL)
    std::cerr << "note: the workload needed " << (monotonic_ns() - from) / 1000000
              << " ms more than its window to make progress (a slow machine)" << std::endl;
  return true;
}

long long rnd(long long lo, long long hi) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return std::uniform_int_distribution<long long>(lo, hi)(rng);
}

void create_workload_tables(const context& ctx) {
  ctx.exec("CREATE TABLE " + ctx.table("counter") + " (id INT PRIMARY KEY, n BIGINT)");
  ctx.exec("INSERT INTO " + ctx.table("counter") + " (id, n) VALUES (1, 0)");
  ctx.exec("CREATE TABLE " + ctx.table("items") +
           " (n BIGINT NOT NULL, fence BIGINT NOT NULL, worker INT NOT NULL, token "
           "VARCHAR(40) NOT NULL)");
}

std::vector<std::string> workload::args(int id) const {
  return {"url=" + url,
          "direct=" + direct_url,
          "prefix=" + prefix,
          "lock=" + lock,
          "dir=" + dir,
          "id=" + std::to_string(id),
          "ttl=" + std::to_string(ttl_ms),
          "work=" + std::to_string(work_ms),
          std::string("fenced=") + (fenced ? "1" : "0"),
          std::string("check_valid=") + (check_valid ? "1" : "0"),
          std::string("try=") + (try_mode ? "1" : "0"),
          "poll_max=" + std::to_string(poll_max_ms),
          "pool=" + std::to_string(pool),
          "slots=" + slots,
          "in_txn=" + std::to_string(in_txn_ms),
          "idle=" + std::to_string(idle_ms),
          std::string("own_lock=") + (own_lock ? "1" : "0"),
          "kind=" + kind};
}

int spawn_counter_worker(process_set& ps, const workload& w, int id,
                         const std::vector<std::string>& env) {
  // analyze() requires a log of every worker started here (but those killed on purpose).
  write_file_atomic(w.dir + "/w" + std::to_string(id) + ".spawned", "");
  return ps.spawn("fault_counter_worker", w.args(id), env);
}

int spawn_sql_worker(process_set& ps, const workload& w, int id) {
  write_file_atomic(w.dir + "/w" + std::to_string(id) + ".spawned", "");
  return ps.spawn("sql_counter_worker", w.args(id));
}

std::vector<int> spawn_mixed_workers(process_set& ps, const workload& w, int n, int sql_workers) {
  std::vector<int> pids;
  for (int i = 0; i < n; ++i)
    pids.push_back(i < n - sql_workers ? spawn_counter_worker(ps, w, i)
                                       : spawn_sql_worker(ps, w, i));
  return pids;
}

void mark_killed(const workload& w, int id) {
  write_file_atomic(w.dir + "/w" + std::to_string(id) + ".killed", "");
}

void stop_workers(const workload& w) {
  write_file_atomic(w.dir + "/stop", "stop\n");
}

workload make_workload(const std::string& url, const std::string& prefix, const std::string& stem,
                       const temp_dir& dir, int ttl_ms) {
  workload w;
  w.url = url;
  w.direct_url = url;
  w.prefix = prefix;
  w.lock = stem + "-" + random_suffix();
  w.dir = dir.path;
  w.ttl_ms = ttl_ms;
  return w;
}

void require_clean_exit(process_set& ps, const workload& w, std::chrono::seconds timeout) {
  auto st = ps.wait_all(timeout);
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("worker " << i << " exit status " << st[i]
                   << " (-1: killed at the deadline); the end of its log:\n"
                   << worker_log_tail(w, static_cast<int>(i)));
    CHECK(st[i] == 0);
  }
}

std::string worker_log_tail(const workload& w, int id, int lines) {
  const std::string text = read_file(w.dir + "/w" + std::to_string(id) + ".log");
  std::size_t pos = text.size();
  for (int n = 0; n <= lines && pos > 0; ++n) {
    const std::size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    if (n < lines) pos = nl;
  }
  return text.substr(pos);
}

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    skip_test(std::string("needs control of the test servers: ") + name +
              " is not set (scripts/test-servers.sh sets it)");
  return v;
}

std::string server_instance(const context& ctx) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    try {
      dblock::database db(ctx.url);
      std::string v;
      if (ctx.backend == "postgresql") {
        db.connect().session() << "SELECT CAST(pg_postmaster_start_time() AS TEXT)", soci::into(v);
        return v;
      }
      db.connect().session() << "SELECT @@pid_file", soci::into(v);
      const std::string pid = read_file(v);
      if (pid.empty()) FAIL("cannot read the server's pid file " << v);
      return pid;
    } catch (const std::exception& e) {  // not Catch's own failure, which FAIL throws
      if (std::chrono::steady_clock::now() > give_up) FAIL("server instance: " << e.what());
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
}

bool run_env_cmd(const char* var, const std::string& arg) {
  const std::string cmd = env_or_fail(var);
  // The command's output is kept and shown only when it fails, so that a failed restart in CI
  // says why (a server log, a timeout) instead of a bare "false".
  temp_dir dir("env-cmd");
  const std::string out = dir.file("out");
  std::string c = cmd + " " + arg + " >" + out + " 2>&1";
  const int rc = std::system(c.c_str());
  if (rc == 0) return true;
  std::string text = read_file(out);
  if (text.size() > 6000) text = "[...]\n" + text.substr(text.size() - 6000);
  std::cerr << "command failed (status " << rc << "): " << var << " " << arg << "\n"
            << text << std::endl;
  return false;
}

void report(const std::string& scenario, const std::string& backend, long long trials,
            long long faults, long long violations, const std::string& extra) {
  std::ostringstream line;
  line << "FAULTS-REPORT scenario=" << scenario << " backend=" << backend << " trials=" << trials
       << " faults=" << faults << " violations=" << violations << " full=" << (full() ? 1 : 0)
       << (extra.empty() ? "" : " " + extra);
  std::cout << line.str() << std::endl;
  if (const char* f = std::getenv("DBLOCK_FAULTS_REPORT")) {
    std::ofstream out(f, std::ios::app);
    out << line.str() << "\n";
  }
}

shared_slots::shared_slots(const std::string& path, int count, bool create) : n(count) {
  int fd = ::open(path.c_str(), create ? O_RDWR | O_CREAT : O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error("open " + path);
  if (create && ::ftruncate(fd, static_cast<off_t>(sizeof(long long)) * count) != 0) {
    ::close(fd);
    throw std::runtime_error("ftruncate " + path);
  }
  void* p = ::mmap(nullptr, sizeof(long long) * static_cast<std::size_t>(count),
                   PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("mmap " + path);
  v = static_cast<long long*>(p);
}

shared_slots::~shared_slots() {
  ::munmap(v, sizeof(long long) * static_cast<std::size_t>(n));
}

bool wait_stopped(int pid, milliseconds timeout) {
  long long deadline = monotonic_ns() + std::chrono::nanoseconds(timeout).count();
  for (;;) {
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    auto p = stat.rfind(')');
    if (p != std::string::npos && p + 2 < stat.size() && (stat[p + 2] == 'T' || stat[p + 2] == 't'))
      return true;
    if (monotonic_ns() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// ---- the worker ------------------------------------------------------------------------------

namespace {

struct log_file {
  int fd = -1;
  explicit log_file(const std::string& path) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) throw std::runtime_error("open " + path);
  }
  ~log_file() { ::close(fd); }
  void line(const std::string& s) {
    std::string l = s;
    for (char& ch : l)
      if (ch == '\n') ch = ' ';
    l += "\n";
    [[maybe_unused]] ssize_t w = ::write(fd, l.data(), l.size());
  }
};

std::map<std::string, std::string> parse_args(const std::vector<std::string>& args) {
  std::map<std::string, std::string> m;
  for (const auto& a : args) {
    auto eq = a.find('=');
    m[a.substr(0, eq)] = eq == std::string::npos ? "" : a.substr(eq + 1);
  }
  return m;
}

// Reads the items log by owner token until the database answers (at most `patience`).
std::optional<bool> written_by(database& direct, const std::string& items, const std::string& token,
                               milliseconds patience) {
  long long deadline = monotonic_ns() + std::chrono::nanoseconds(patience).count();
  for (;;) {
    try {
      auto c = direct.connect();
      int n = 0;
      c.session() << "SELECT count(*) FROM " << items << " WHERE token = :t", soci::use(token),
          soci::into(n);
      return n > 0;
    } catch (const std::exception&) {
      if (monotonic_ns() > deadline) return std::nullopt;
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
}

}  // namespace

DBLOCK_WORKER(fault_counter_worker) {
  auto a = parse_args(args);
  const int id = std::stoi(a.at("id"));
  const std::string dir = a.at("dir"), prefix = a.at("prefix");
  const std::string counter = prefix + "counter", items = prefix + "items";
  const bool fenced = a.at("fenced") == "1", check_valid = a.at("check_valid") == "1";
  const bool try_mode = a.at("try") == "1";
  const int work_ms = std::stoi(a.at("work")), in_txn_ms = std::stoi(a.at("in_txn"));
  const int idle_ms = std::stoi(a.at("idle"));
  const std::string stop = dir + "/stop";
  log_file log(dir + "/w" + std::to_string(id) + ".log");
  log.line("S " + std::to_string(::getpid()));  // started: analyze() counts a missing log
  auto db = open_db(a.at("url"), prefix, static_cast<std::size_t>(std::stoi(a.at("pool"))));
  auto direct = open_db(a.at("direct"), prefix, 2);
  std::unique_ptr<shared_slots> slots;
  if (!a.at("slots").empty()) slots = std::make_unique<shared_slots>(a.at("slots"), 64, false);
  auto set_slot = [&](long long v) {
    if (slots) __atomic_store_n(&slots->v[id], v, __ATOMIC_SEQ_CST);
  };
  dblock::lease_options lo;
  lo.ttl = milliseconds(std::stoi(a.at("ttl")));
  lo.poll_initial = milliseconds(1);
  lo.poll_max = milliseconds(std::stoi(a.at("poll_max")));
  // own_lock=1 (negative control): every worker has its own lock, so nothing excludes them.
  const std::string lock_name = a.count("own_lock") && a.at("own_lock") == "1"
                                    ? a.at("lock") + std::to_string(id)
                                    : a.at("lock");
  // kind: lease, semaphore (the one permit of a semaphore of 1) or election (a leadership).
  workload_lock lock(db, a.at("kind"), lock_name, lo, "w" + std::to_string(id));
  const std::string row_name = lock.row_name();
  auto try_acquire = [&] { return lock.try_acquire(); };
  auto acquire = [&] { return lock.acquire(std::chrono::seconds(30)); };
  std::set<long long> known;  // fences we know are (or were) ours
  const long long my_pid = ::getpid();

  auto increment = [&](soci::session& sql, long long fence, const std::string& token) {
    long long n = 0;
    sql << "SELECT n FROM " << counter << " WHERE id = 1", soci::into(n);
    if (in_txn_ms > 0) std::this_thread::sleep_for(milliseconds(rnd(0, in_txn_ms)));
    long long next = n + 1;
    sql << "UPDATE " << counter << " SET n = :n WHERE id = 1", soci::use(next);
    sql << "INSERT INTO " << items << " (n, fence, worker, token) VALUES (:n, :f, :w, :t)",
        soci::use(next), soci::use(fence), soci::use(id), soci::use(token);
    return next;
  };

  while (::access(stop.c_str(), F_OK) != 0) {
    std::optional<workload_hold> g;
    try {
      if (try_mode) {
        g = try_acquire();
        if (!g) {
          // Not acquired: the row must not carry an unexpired lease of ours that we never got.
          try {
            auto c = direct.connect();
            auto row = dblock::test::read_lease(c, row_name);
            if (row && row->holder_pid == my_pid && row->hold_count > 0 &&
                row->expires_at_us > row->now_us && !known.count(row->fence))
              log.line("N " + std::to_string(row->fence));
          } catch (const std::exception& e) {
            log.line(std::string("E check: ") + e.what());
          }
          std::this_thread::sleep_for(milliseconds(rnd(1, 10)));
          continue;
        }
      } else {
        g = acquire();
      }
    } catch (const dblock::error& e) {
      log.line(std::string("E acquire ") + dblock::to_string(e.kind()) + ": " + e.what());
      // The lease may be ours (nobody renews it; it expires): remember its fence. So after an
      // in_doubt, and after a leadership whose announcement failed on a cut connection once the
      // lease was granted: the guard releases it on the way out, and that release can fail too.
      if (e.code() == errc::in_doubt ||
          (a.at("kind") == "election" && e.code() == errc::connection_lost)) {
        try {
          auto c = direct.connect();
          auto row = dblock::test::read_lease(c, row_name);
          if (row && row->holder_pid == my_pid) known.insert(row->fence);
        } catch (...) {
        }
      }
      std::this_thread::sleep_for(milliseconds(rnd(5, 30)));
      continue;
    }
    const long long fence = g->fence();
    const std::string token = g->owner_token();
    known.insert(fence);
    const long long enter = raw_monotonic_ns();
    log.line("G " + std::to_string(fence) + " " + std::to_string(enter));
    set_slot(fence);
    if (work_ms > 0) std::this_thread::sleep_for(milliseconds(rnd(0, work_ms)));
    set_slot(-fence);
    if (check_valid && !g->valid()) {
      log.line("V " + std::to_string(fence));
    } else if (fenced) {
      log.line("A " + std::to_string(fence));
      long long n = 0, written = 0;
      try {
        // The section's exit is taken when its statements have run, before the COMMIT: the
        // commit comes later, so an overlap found is real; a holder descheduled after its
        // commit (past its TTL on a busy machine) is not taken for one.
        g->fenced([&](soci::session& sql) {
          n = increment(sql, fence, token);
          written = raw_monotonic_ns();
        });
        log.line("K " + std::to_string(fence) + " " + std::to_string(n) + " " +
                 std::to_string(enter) + " " + std::to_string(written));
      } catch (const dblock::error& e) {
        if (e.code() == errc::lease_lost) {
          log.line("L " + std::to_string(fence));
        } else if (e.code() == errc::in_doubt) {
          // Not final ("could not be confirmed ended"): the COMMIT may still land until the
          // server notices the broken connection; read once the outcome has settled.
          if (std::string(e.what()).find("could not be confirmed") != std::string::npos) {
            log.line("U " + std::to_string(fence));
            std::this_thread::sleep_for(std::chrono::seconds(5));
          }
          auto w = written_by(direct, items, token, std::chrono::seconds(60));
          if (w)
            log.line("D " + std::to_string(fence) + " " + (*w ? "1" : "0"));
          else
            log.line("E unresolved in_doubt for fence " + std::to_string(fence));
        } else {
          log.line("X " + std::to_string(fence) + " " + dblock::to_string(e.kind()));
        }
      }
    } else {
      // Negative control: the same statements in autocommit, guarded by nothing but the lease.
      log.line("A " + std::to_string(fence));
      try {
        auto c = db.connect();
        long long n = increment(c.session(), fence, token);
        log.line("K " + std::to_string(fence) + " " + std::to_string(n) + " " +
                 std::to_string(enter) + " " + std::to_string(raw_monotonic_ns()));
      } catch (const std::exception& e) {
        log.line(std::string("E plain write: ") + e.what());
      }
    }
    set_slot(0);
    log.line("r " + std::to_string(fence) + " " + std::to_string(raw_monotonic_ns()));
    try {
      g->release();
    } catch (const std::exception&) {
      // lease_lost, in_doubt or a dead connection: the lease expires on its own.
    }
    g.reset();
    if (idle_ms > 0) std::this_thread::sleep_for(milliseconds(rnd(0, idle_ms)));
  }
  return 0;
}

// The SQL API's worker: this process becomes Debian's Python running tests/faults/sql_worker.py
// with the same arguments (same pid, so the parent stops, pauses and reaps it like any worker).
DBLOCK_WORKER(sql_counter_worker) {
  // -I: Debian's own modules, whatever PYTHONPATH or a user site directory say.
  exec_argv argv(
      {"/usr/bin/python3", "-I", std::string(DBLOCK_SOURCE_DIR) + "/tests/faults/sql_worker.py"},
      args);
  ::execv(argv[0], argv.data());
  std::cerr << "sql_counter_worker: cannot run " << argv[0] << ": " << std::strerror(errno)
            << std::endl;
  return 127;
}

// ---- analysis ----------------------------------------------------------------------------------

std::string analysis::summary() const {
  std::ostringstream o;
  o << "counter=" << counter << " rows=" << rows << " grants=" << grants << " acked=" << acked
    << " lease_lost=" << lost << " rolled_back=" << rolled_back
    << " in_doubt_written=" << doubt_written << " in_doubt_not_written=" << doubt_not_written
    << " killed_mid_write=" << killed_mid_write << " missing_logs=" << missing_logs
    << " invalid_skips=" << invalid_skips << " errors=" << errors << " overlaps=" << overlaps
    << " violations=" << violations;
  for (std::size_t i = 0; i < problems.size() && i < 8; ++i)
    o << "\n  problem: " << problems[i];
  for (const auto& e : error_samples)
    o << "\n  error: " << e;
  return o.str();
}

analysis analyze(const database& db, const context& ctx, const workload& w, bool check_overlap) {
  analysis r;
  auto problem = [&](const std::string& p) {
    ++r.violations;
    r.problems.push_back(p);
  };
  struct section {
    long long fence, n, enter, exit;
  };
  std::vector<section> acked;
  std::map<long long, int> grants;                           // fence -> how many grants
  std::vector<std::pair<long long, long long>> grant_order;  // enter, fence
  std::set<long long> maybe, doubt1, doubt0, outcome;
  std::set<long long> attempted;
  std::set<long long> invalid;  // grants whose guard was no longer valid when they returned
  auto exists = [](const std::string& path) { return ::access(path.c_str(), F_OK) == 0; };
  for (int id = 0; id < 64; ++id) {
    const std::string stem = w.dir + "/w" + std::to_string(id);
    std::string text = read_file(stem + ".log");
    if (text.empty() && exists(stem + ".spawned") && !exists(stem + ".killed")) {
      ++r.missing_logs;
      problem("worker " + std::to_string(id) + " was started but left no log");
    }
    if (text.empty()) continue;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      std::string k;
      l >> k;
      long long f = 0;
      if (k == "G") {
        long long enter = 0;
        l >> f >> enter;
        ++r.grants;
        ++grants[f];
        grant_order.push_back({enter, f});
      } else if (k == "A") {
        l >> f;
        attempted.insert(f);
      } else if (k == "K") {
        section s{};
        l >> s.fence >> s.n >> s.enter >> s.exit;
        acked.push_back(s);
        outcome.insert(s.fence);
        ++r.acked;
      } else if (k == "L" || k == "X") {
        l >> f;
        outcome.insert(f);
        ++(k == "L" ? r.lost : r.rolled_back);
      } else if (k == "D") {
        int wr = 0;
        l >> f >> wr;
        outcome.insert(f);
        (wr ? doubt1 : doubt0).insert(f);
        ++(wr ? r.doubt_written : r.doubt_not_written);
      } else if (k == "V") {
        l >> f;
        invalid.insert(f);
        ++r.invalid_skips;
      } else if (k == "N") {
        l >> f;
        problem(
            "try_acquire reported 'not acquired' while the row carried our unexpired lease "
            "(fence " +
            std::to_string(f) + ")");
      } else if (k == "E") {
        ++r.errors;
        if (r.error_samples.size() < 6)
          r.error_samples.push_back("w" + std::to_string(id) + ": " + line);
      }
    }
  }
  for (long long f : attempted)
    if (!outcome.count(f)) maybe.insert(f);
  r.killed_mid_write = static_cast<long long>(maybe.size());
  for (const auto& kv : grants)
    if (kv.second > 1) problem("fence " + std::to_string(kv.first) + " granted twice");

  auto c = db.connect();
  c.session() << "SELECT n FROM " << ctx.table("counter") << " WHERE id = 1", soci::into(r.counter);
  std::vector<std::pair<long long, long long>> rows;  // n, fence
  {
    soci::rowset<soci::row> rs =
        (c.session().prepare << "SELECT n, fence FROM " << ctx.table("items") << " ORDER BY n");
    for (const auto& row : rs) {
      rows.push_back({row_int(row, 0), row_int(row, 1)});
    }
  }
  r.rows = static_cast<long long>(rows.size());
  if (r.counter != r.rows)
    problem("counter " + std::to_string(r.counter) + " but " + std::to_string(r.rows) +
            " logged writes (lost update)");
  std::map<long long, long long> fence_of_n;
  std::set<long long> row_fences;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].first != static_cast<long long>(i) + 1)
      problem("write #" + std::to_string(i + 1) + " has n = " + std::to_string(rows[i].first) +
              " (a duplicate n is a lost update)");
    if (i > 0 && rows[i].second <= rows[i - 1].second)
      problem("stale write: fence " + std::to_string(rows[i].second) + " committed n = " +
              std::to_string(rows[i].first) + " after fence " + std::to_string(rows[i - 1].second));
    fence_of_n[rows[i].first] = rows[i].second;
    row_fences.insert(rows[i].second);
  }
  for (const auto& s : acked) {
    auto it = fence_of_n.find(s.n);
    if (it == fence_of_n.end() || it->second != s.fence)
      problem("acknowledged increment n = " + std::to_string(s.n) + " of fence " +
              std::to_string(s.fence) + " is missing");
    r.ack_exit_ns.push_back(s.exit);
  }
  for (long long f : doubt1)
    if (!row_fences.count(f))
      problem("in_doubt resolved as written, but fence " + std::to_string(f) + " has no write");
  for (long long f : doubt0)
    if (row_fences.count(f))
      problem("in_doubt resolved as not written, but fence " + std::to_string(f) + " wrote");
  std::set<long long> acked_fences;
  for (const auto& s : acked)
    acked_fences.insert(s.fence);
  for (long long f : row_fences)
    if (!acked_fences.count(f) && !doubt1.count(f) && !maybe.count(f))
      problem("fence " + std::to_string(f) + " wrote but its worker reported no write");
  if (check_overlap) {
    std::sort(acked.begin(), acked.end(),
              [](const section& x, const section& y) { return x.enter < y.enter; });
    long long max_exit = 0;
    for (std::size_t i = 0; i < acked.size(); ++i) {
      if (i > 0 && acked[i].enter < max_exit) {
        ++r.overlaps;
        problem("acknowledged section of fence " + std::to_string(acked[i].fence) + " entered " +
                std::to_string((max_exit - acked[i].enter) / 1000) +
                " us before an earlier one exited");
      }
      max_exit = std::max(max_exit, acked[i].exit);
    }
    // A grant whose reply came back after its lease's local validity (a node stalled by a view
    // change, say) was refused by its own holder (no write): a later fence may have been granted
    // before it returned, legitimately. Only the grants that were used must come in fence order.
    grant_order.erase(std::remove_if(grant_order.begin(), grant_order.end(),
                                     [&](const auto& g) { return invalid.count(g.second) > 0; }),
                      grant_order.end());
    std::sort(grant_order.begin(), grant_order.end());
    for (std::size_t i = 1; i < grant_order.size(); ++i)
      if (grant_order[i].second <= grant_order[i - 1].second)
        problem("fence " + std::to_string(grant_order[i].second) + " granted after fence " +
                std::to_string(grant_order[i - 1].second));
  }
  std::sort(r.ack_exit_ns.begin(), r.ack_exit_ns.end());
  if (r.violations > 0 && keep_temp_dirs()) {
    // The evidence of a failed run, beside the workers' logs: every item row in insertion
    // order (the table has no key: InnoDB and SQLite return it so), the counter, the lock's row.
    std::ofstream out(w.dir + "/tables.txt");
    out << "counter " << r.counter << "\n";
    soci::rowset<soci::row> rs =
        (c.session().prepare << "SELECT n, fence, worker, token FROM " << ctx.table("items"));
    for (const auto& row : rs)
      out << "item " << row_int(row, 0) << " " << row_int(row, 1) << " " << row_int(row, 2) << " "
          << row.get<std::string>(3) << "\n";
    try {
      auto lease = dblock::test::read_lease(c, w.lock);
      if (lease)
        out << "lock fence " << lease->fence << " holder_pid " << lease->holder_pid << "\n";
    } catch (const std::exception& e) {
      out << "lock: " << e.what() << "\n";
    }
    std::cerr << "analyze: " << r.violations << " violations; kept " << w.dir << "\n";
  }
  return r;
}

std::string acquire_request_pattern(const std::string& url, const std::string& lock_table) {
  if (url.rfind("postgresql://", 0) == 0) return "dblock_lease_acquire";
  return "INSERT INTO " + lock_table;
}

std::string renew_release_request_pattern(const std::string& url, const std::string& lock_table) {
  if (url.rfind("postgresql://", 0) == 0) return "dblock_lease_re";  // renew and release
  return "UPDATE " + lock_table;
}

}  // namespace dblock::test::faults
