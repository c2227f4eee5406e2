#include "suite.hpp"

#include <dirent.h>
#include <libpq-fe.h>
#include <sys/select.h>
#include <unistd.h>
#include <dblock/dblock.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "core/url.hpp"
#include "raw.hpp"
#include "round_trips.hpp"
#include "storage/lock_table.hpp"
#include "storage/session.hpp"

#ifdef DBLOCK_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace dblock::bench {
namespace {

using clk = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- measurement -----------------------------------------------------------------------------

/// One thread's operation: returns true when it succeeded (only successes are counted).
using cycle_fn = std::function<bool()>;
/// Builds one thread's operation (and its own connection) for thread `i`.
using setup_fn = std::function<cycle_fn(int i)>;

struct result {
  std::string backend;  ///< postgresql, mysql, sqlite, redis
  std::string label;    ///< the backend as the table names it (backend_ctx::label)
  std::string operation, kind, floor, note;
  int clients = 0;
  double per_second = 0, p50_us = 0, p99_us = 0;
  long long operations = 0, successes = 0, errors = 0;
  int rounds = 1;
  std::string first_error;
  std::optional<double> ratio;
  /// Handoff rows: waiters woken per release, and the longest acquire wait over the mean one.
  std::optional<double> woken_per_release, fairness;
  double wait_mean_us = 0, wait_max_us = 0;  ///< handoff rows: acquire() waits
  std::map<std::string, double> figures;     ///< further named figures (the watchdog rows)
  /// Requests sent per operation by the measuring threads (round_trips.hpp): round trips.
  std::optional<double> round_trips;
};

double percentile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

// The end of the measurement the calling thread takes part in (set by measure() for its threads).
thread_local clk::time_point measurement_end = clk::time_point::max();
/// When the measuring thread's window starts (after the warm-up): figures that a cycle records
/// itself (handoff latencies, waits) count only from then.
thread_local clk::time_point measurement_start = clk::time_point::min();

// Runs `clients` threads for `seconds` (after a warm-up of a tenth of it, at least 0.1 s but not
// longer than the measurement itself) and reports successful operations per second and the
// latency of every operation.
result measure(int clients, double seconds, const setup_fn& setup) {
  std::vector<std::vector<float>> lat(clients);
  std::vector<long long> ok(clients, 0), ops(clients, 0), errs(clients, 0);
  std::vector<std::uint64_t> sent(clients, 0);
  std::vector<std::string> first_err(clients);
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  bool go = false;
  clk::time_point start, end;
  const auto warm = std::chrono::duration<double>(std::max(std::min(0.1, seconds), seconds / 10));
  std::vector<std::thread> ts;
  std::atomic<bool> setup_failed{false};
  std::string setup_error;
  for (int i = 0; i < clients; ++i)
    ts.emplace_back([&, i] {
      cycle_fn f;
      try {
        f = setup(i);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu);
        setup_failed = true;
        setup_error = e.what();
      }
      {
        std::unique_lock<std::mutex> l(mu);
        ++ready;
        cv.notify_all();
        cv.wait(l, [&] { return go; });
      }
      if (setup_failed) return;
      measurement_start = start;
      measurement_end = end;
      auto run_one = [&](bool record) {
        auto t0 = clk::now();
        bool s = false;
        try {
          s = f();
        } catch (const std::exception& e) {
          if (record && errs[i]++ == 0) first_err[i] = e.what();
        }
        if (!record) return;
        ++ops[i];
        if (s) ++ok[i];
        lat[i].push_back(std::chrono::duration<float, std::micro>(clk::now() - t0).count());
      };
      while (clk::now() < start)
        run_one(false);
      const std::uint64_t sent_before = sends_on_this_thread();
      while (clk::now() < end)
        run_one(true);
      sent[i] = sends_on_this_thread() - sent_before;
    });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return ready == clients; });
    start = clk::now() + std::chrono::duration_cast<clk::duration>(warm);
    end = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(seconds));
    go = true;
  }
  cv.notify_all();
  for (auto& t : ts)
    t.join();
  if (setup_failed) throw std::runtime_error(setup_error);
  result r;
  r.clients = clients;
  std::vector<float> all;
  std::uint64_t sent_all = 0;
  for (int i = 0; i < clients; ++i) {
    sent_all += sent[i];
    all.insert(all.end(), lat[i].begin(), lat[i].end());
    r.operations += ops[i];
    r.successes += ok[i];
    r.errors += errs[i];
    if (r.first_error.empty()) r.first_error = first_err[i];
  }
  r.per_second = r.successes / seconds;
  r.p50_us = percentile(all, 0.50);
  r.p99_us = percentile(all, 0.99);
  if (r.operations > 0) r.round_trips = static_cast<double>(sent_all) / r.operations;
  return r;
}

// ---- shared set-up ---------------------------------------------------------------------------

std::string token() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

// A name no earlier measurement used (leases held for a whole measurement are not released).
std::string fresh_name(const std::string& what) {
  static std::atomic<long long> n{0};
  return "bench/" + what + "/" + std::to_string(++n);
}

int rand_below(int n) {
  static thread_local std::mt19937 rng(std::random_device{}());
  return std::uniform_int_distribution<int>(0, n - 1)(rng);
}

constexpr int kItems = 10000;           // rows of the business table
constexpr long long kTtlUs = 30000000;  // 30 s: no lease expires during a measurement
constexpr const char* kStockName = "bench/stock";
constexpr int kStockSegments = 16;

struct backend_ctx {
  std::string url, backend, version;
  std::string prefix;  ///< the benchmark's table prefix
  /// How results name this URL: the backend, "/pooler" behind a transaction-mode pooler, and
  /// "#N" for a further URL that would otherwise read the same.
  std::string label;
  dblock::lease_options wait_options;  // for acquire(wait): the polling being measured
  dblock::database db;
  struct {
    std::string acquire, release, renew;
    bool write_transaction = false;  // SQLite: each statement inside BEGIN IMMEDIATE ... COMMIT
  } sql;
  std::string item;  // business table
  std::string for_update;
  std::string begin_write;
  /// The dblock.tablesize_* operations' databases: N -> tables holding N released lease rows.
  std::map<long long, dblock::database> sized;
  /// PostgreSQL's fast lease mode: the same set-up on tables of their own (prefix + "fast_")
  /// whose lease table is UNLOGGED (set_lease_durability); made when an operation needs it.
  std::unique_ptr<backend_ctx> fast;
};

// Names a result row: the backend it ran on (as the table labels it), its operation and kind.
void name_row(result& r, const backend_ctx& b, std::string operation, std::string kind) {
  r.backend = b.backend;
  r.label = b.label;
  r.operation = std::move(operation);
  r.kind = std::move(kind);
}

// A raw lease acquire: the very statements dblock runs, through the C client.
std::optional<long long> raw_acquire(raw_client& c, const backend_ctx& b, const std::string& name,
                                     const std::string& tok, long long floor = 0) {
  if (b.sql.write_transaction) c.run("begin", "BEGIN IMMEDIATE", {});
  outcome o;
  try {
    o = c.run("acquire", b.sql.acquire,
              {{"name", name},
               {"token", tok},
               {"ttl", kTtlUs},
               {"host", std::string("bench")},
               {"pid", static_cast<long long>(::getpid())},
               {"thread", std::string("1")},
               {"floor", floor}});
  } catch (...) {
    if (b.sql.write_transaction) c.exec("ROLLBACK");
    throw;
  }
  if (b.sql.write_transaction) c.run("commit", "COMMIT", {});
  if (b.backend == "mysql")
    return o.insert_id > 0 ? std::optional<long long>(o.insert_id) : std::nullopt;
  return o.value;
}

bool raw_simple_write(raw_client& c, const backend_ctx& b, const std::string& key,
                      const std::string& sql, const params& p) {
  if (b.sql.write_transaction) c.run("begin", "BEGIN IMMEDIATE", {});
  outcome o;
  try {
    o = c.run(key, sql, p);
  } catch (...) {
    if (b.sql.write_transaction) c.exec("ROLLBACK");
    throw;
  }
  if (b.sql.write_transaction) c.run("commit", "COMMIT", {});
  return o.affected == 1;
}

bool raw_release(raw_client& c, const backend_ctx& b, const std::string& name,
                 const std::string& tok, long long fence) {
  // As dblock does on SQLite: the release's commit does not sync the WAL, unless the URL set
  // NORMAL already (PostgreSQL's statement text says so itself).
  if (c.synchronous < 0)
    c.synchronous =
        b.backend == "sqlite" ? c.run("level", "PRAGMA synchronous", {}).value.value_or(0) : 0;
  const long long level = c.synchronous;
  if (level > 1) c.run("relax", "PRAGMA synchronous = NORMAL", {});
  params p{{"name", name}, {"token", tok}, {"fence", fence}};
  if (b.sql.release.find(":bell") != std::string::npos) p.push_back({"bell", std::string()});
  const bool ok = raw_simple_write(c, b, "release", b.sql.release, p);
  if (level > 1) c.exec("PRAGMA synchronous = " + std::to_string(level));
  return ok;
}

// Why a hot-key row took the lease not once: who holds the key (a lease that an earlier row
// left held, or another process's), for the row's note.
std::string hot_key_holder(const backend_ctx& b) {
  try {
    dblock::list_options lo;
    lo.pattern = "bench/hot";
    lo.include_free = true;
    for (const auto& l : dblock::list_locks(b.db, lo))
      if (l.name == "bench/hot")
        return "no try succeeded: bench/hot " +
               (l.held ? "was held by " + l.holder_host + " pid " + std::to_string(l.holder_pid) +
                             " thread " + l.holder_thread + " (fence " + std::to_string(l.fence) +
                             ", " + std::to_string(l.hold_count) + " holds, expires in " +
                             std::to_string(l.expires_in.count() / 1000) + " ms)"
                       : std::string("is free now"));
    return "no try succeeded: bench/hot has no row";
  } catch (const std::exception& e) {
    return std::string("no try succeeded (reading bench/hot: ") + e.what() + ")";
  }
}

// ---- the operations --------------------------------------------------------------------------

struct operation {
  std::string name;   // e.g. "dblock.lease"
  std::string kind;   // floor, dblock, alternative
  std::string floor;  // the floor operation a dblock figure is divided by
  std::string note;
  std::function<cycle_fn(backend_ctx&, int thread)> setup;  // empty: not on this backend
  bool named_only = false;  // runs only when --only names it (it costs a long set-up)
};

// --only: comma-separated parts; an operation runs when its name contains one of them, or is
// one preceded by '=' (all run when it is empty).
bool selected(const std::string& only, const std::string& name) {
  if (only.empty()) return true;
  for (std::size_t start = 0;;) {
    const std::size_t end = only.find(',', start);
    const std::string part = only.substr(start, end == std::string::npos ? end : end - start);
    if (part.size() > 1 && part[0] == '=') {
      if (name == part.substr(1)) return true;
    } else if (!part.empty() && name.find(part) != std::string::npos) {
      return true;
    }
    if (end == std::string::npos) return false;
    start = end + 1;
  }
}

// try_acquire()+release() of one of the lease names <base>0 ... <base><keys-1> on `db`, at random.
cycle_fn lease_cycle(const dblock::database& db, const std::string& base, int keys) {
  auto locks = std::make_shared<std::vector<dblock::lease_lock>>();
  for (int k = 0; k < keys; ++k)
    locks->emplace_back(db, base + std::to_string(k));
  return cycle_fn([locks, keys] {
    auto g = (*locks)[rand_below(keys)].try_acquire();
    if (!g) return false;
    g->release();
    return true;
  });
}

std::vector<operation> operations_for(backend_ctx& b, int keys) {
  std::vector<operation> ops;
  const bool pg = b.backend == "postgresql", my = b.backend == "mysql";
  auto key_name = [keys](int thread) {
    return "bench/" + std::to_string(thread) + "/" + std::to_string(rand_below(keys));
  };

  ops.push_back({"raw.select1", "floor", "", "SELECT 1 round trip", [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   return cycle_fn([c] { return c->run("s1", "SELECT 1", {}).value == 1; });
                 }});
  ops.push_back({"dblock.ping", "dblock", "raw.select1", "database::ping(): SELECT 1 via SOCI",
                 [](backend_ctx& b, int) {
                   return cycle_fn([&b] {
                     b.db.ping();
                     return true;
                   });
                 }});

  ops.push_back({"raw.lease", "floor", "", "acquire+release, distinct keys",
                 [key_name](backend_ctx& b, int t) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   return cycle_fn([c, &b, t, key_name] {
                     const std::string name = key_name(t), tok = token();
                     auto f = raw_acquire(*c, b, name, tok);
                     return f && raw_release(*c, b, name, tok, *f);
                   });
                 }});
  ops.push_back({"dblock.lease", "dblock", "raw.lease", "try_acquire()+release(), distinct keys",
                 [keys](backend_ctx& b, int t) {
                   return lease_cycle(b.db, "bench/" + std::to_string(t) + "/", keys);
                 }});

  // The SQL API (docs/sql-api.md): the same lease cycle as a client in any language runs it,
  // through the routines that `dblock migrate` installs (PostgreSQL functions, MariaDB
  // procedures), on the C client library; as a ratio to dblock.lease. On PostgreSQL the release
  // passes durable => false (no wait for the WAL flush), as the library's own release does.
  if (pg || my)
    ops.push_back({"sql.lease", "feature", "dblock.lease",
                   "SQL API: dblock_acquire()+dblock_release() from libpq / the MySQL client, "
                   "distinct keys; ratio to dblock.lease",
                   [key_name](backend_ctx& b, int t) {
                     auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                     const bool on_pg = b.backend == "postgresql";
                     const std::string acq = (on_pg ? "SELECT " : "CALL ") + b.prefix +
                                             "dblock_acquire(:name, :owner, 30000)";
                     const std::string rel =
                         on_pg ? "SELECT CAST(" + b.prefix +
                                     "dblock_release(:name, :owner, :fence, false) AS INTEGER)"
                               : "CALL " + b.prefix + "dblock_release(:name, :owner, :fence)";
                     return cycle_fn([c, t, key_name, acq, rel] {
                       const std::string name = key_name(t), tok = token();
                       const auto f = c->run("sql_acquire", acq, {{"name", name}, {"owner", tok}});
                       return f.value &&
                              c->run("sql_release", rel,
                                     {{"name", name}, {"owner", tok}, {"fence", *f.value}})
                                      .value == 1;
                     });
                   }});

  // Semaphores: a permit's try_acquire()+release() as a ratio to the lease cycle, with 0, 10 and
  // 100 of the semaphore's 101 permits held meanwhile (each client its own semaphore). With a
  // free permit a try is one upsert; the more are held, the likelier its first probe meets a
  // held one and reads which are free.
  auto semaphore_op = [](int held) {
    return [held](backend_ctx& b, int t) {
      struct state {
        std::unique_ptr<dblock::semaphore> sem;
        std::vector<dblock::lease_guard> held;  // released when the measurement ends
      };
      auto st = std::make_shared<state>();
      const std::string name = "bench/sem/" + std::to_string(held) + "/" + std::to_string(t);
      dblock::lease_options lo;
      lo.ttl = std::chrono::minutes(10);
      st->sem = std::make_unique<dblock::semaphore>(b.db, name, 101, lo);
      for (int tries = 0; static_cast<int>(st->held.size()) < held; ++tries) {
        if (tries > 3 * held + 10)
          throw std::runtime_error("semaphore '" + name + "': cannot hold " + std::to_string(held) +
                                   " permits (left over from a crash? "
                                   "they expire within 10 minutes)");
        if (auto g = st->sem->try_acquire()) st->held.push_back(std::move(*g));
      }
      return cycle_fn([st] {
        auto g = st->sem->try_acquire();
        if (!g) return false;
        g->release();
        return true;
      });
    };
  };
  ops.push_back({"dblock.semaphore", "feature", "dblock.lease",
                 "semaphore (101 permits, none held): try_acquire()+release() of a permit; "
                 "ratio to dblock.lease",
                 semaphore_op(0)});
  ops.push_back({"dblock.semaphore_held10", "feature", "dblock.lease",
                 "the same with 10 of the 101 permits held", semaphore_op(10)});
  ops.push_back({"dblock.semaphore_held100", "feature", "dblock.lease",
                 "the same with 100 of the 101 permits held", semaphore_op(100)});

  // Read-write locks: a reader's try_lock_shared()+release() (three statements: take a reader
  // row, read the writer row, release) with 0, 10 and 100 other readers in, and a writer's
  // try_lock()+release() with no reader in (take, read the reader rows, release), as ratios to
  // the lease cycle (two statements). Each client has its own lock.
  auto rwlock_op = [](bool write, int others) {
    return [write, others](backend_ctx& b, int t) {
      struct state {
        std::unique_ptr<dblock::rwlock> lock;
        std::vector<dblock::rwlock> other_locks;
        std::vector<dblock::lease_guard> held;  // the other readers, released at the end
      };
      auto st = std::make_shared<state>();
      const std::string name = std::string("bench/rw/") + (write ? "w/" : "r/") +
                               std::to_string(others) + "/" + std::to_string(t);
      dblock::lease_options lo;
      lo.ttl = std::chrono::minutes(10);
      st->lock = std::make_unique<dblock::rwlock>(b.db, name, lo);
      for (int k = 0; k < others; ++k) {
        st->other_locks.emplace_back(b.db, name, lo);
        auto g = st->other_locks.back().try_acquire_shared();
        if (!g)
          throw std::runtime_error("read-write lock '" + name +
                                   "': cannot admit the other readers (left over from a crash? "
                                   "they expire within 10 minutes)");
        st->held.push_back(std::move(*g));
      }
      return cycle_fn([st, write] {
        auto g = write ? st->lock->try_acquire() : st->lock->try_acquire_shared();
        if (!g) return false;
        g->release();
        return true;
      });
    };
  };
  ops.push_back({"dblock.read_lock", "feature", "dblock.lease",
                 "read-write lock, no other reader: try_lock_shared()+release(); ratio to "
                 "dblock.lease",
                 rwlock_op(false, 0)});
  ops.push_back({"dblock.read_lock_held10", "feature", "dblock.lease",
                 "the same with 10 other readers in", rwlock_op(false, 10)});
  ops.push_back({"dblock.read_lock_held100", "feature", "dblock.lease",
                 "the same with 100 other readers in", rwlock_op(false, 100)});
  ops.push_back({"dblock.write_lock", "feature", "dblock.lease",
                 "read-write lock, no reader in: try_lock()+release(); ratio to dblock.lease",
                 rwlock_op(true, 0)});

  // The lease cycle as the lock table grows: try_acquire()+release() of distinct names against
  // tables that already hold 10, 10,000 or 1,000,000 released rows (as before the reaper ran),
  // each size in its own tables (prepare_sized()). Ratios to the 10-row figure: flat when the
  // primary-key index keeps the cost of a row independent of the table's size.
  auto tablesize_op = [keys](long long rows) {
    return [rows, keys](backend_ctx& b, int t) {
      auto it = b.sized.find(rows);
      if (it == b.sized.end()) throw std::runtime_error("the sized tables were not prepared");
      return lease_cycle(it->second, "bench/size/" + std::to_string(t) + "/", keys);
    };
  };
  ops.push_back({"dblock.tablesize_10", "feature", "dblock.lease",
                 "try_acquire()+release(), distinct names, 10 other rows in the lock table; "
                 "ratio to dblock.lease",
                 tablesize_op(10)});
  ops.push_back({"dblock.tablesize_10k", "feature", "dblock.tablesize_10",
                 "the same with 10,000 released rows in the lock table; ratio to 10 rows",
                 tablesize_op(10000)});
  ops.push_back({"dblock.tablesize_1m", "feature", "dblock.tablesize_10",
                 "the same with 1,000,000 released rows (filled once, kept; runs only when --only "
                 "names it); ratio to 10 rows",
                 tablesize_op(1000000), true});

  // PostgreSQL's fast lease mode: the lease cycle on an UNLOGGED lease table (b.fast), the raw
  // client raising the fence epoch once per connection as dblock does. Compare with pg.advisory.
  if (pg && b.fast) {
    ops.push_back(
        {"raw.lease_fast", "floor", "",
         "acquire+release, distinct keys, UNLOGGED lease table (fast mode), fence epoch raised "
         "once per connection",
         [key_name](backend_ctx& b, int t) {
           backend_ctx& f = *b.fast;
           auto c = std::shared_ptr<raw_client>(connect_raw(f.url));
           // dblock's own statements for the raise (the dialect's durable commit, the floor
           // table's epoch), as lock_table::fence_floor() runs them.
           const auto& st = detail::access::impl(f.db)->statements;
           c->exec("BEGIN");
           if (!st.durable_commit.text.empty()) c->exec(st.durable_commit.text);
           const std::optional<long long> epoch = c->run("epoch", st.epoch_raise.text, {}).value;
           c->exec("COMMIT");
           if (!epoch) throw std::runtime_error("raising the fence epoch returned nothing");
           const long long floor = *epoch << detail::lock_table::fence_epoch_shift;
           return cycle_fn([c, &f, t, key_name, floor] {
             const std::string name = key_name(t), tok = token();
             auto fence = raw_acquire(*c, f, name, tok, floor);
             return fence && raw_release(*c, f, name, tok, *fence);
           });
         }});
    ops.push_back({"dblock.lease_fast", "dblock", "raw.lease_fast",
                   "try_acquire()+release(), distinct keys, fast lease mode "
                   "(set_lease_durability(fast)); compare with pg.advisory",
                   [keys](backend_ctx& b, int t) {
                     return lease_cycle(b.fast->db, "bench/" + std::to_string(t) + "/", keys);
                   }});
  }

  ops.push_back({"raw.lease_hot", "floor", "",
                 "one key, polling: one try per operation, successes counted",
                 [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   return cycle_fn([c, &b] {
                     const std::string tok = token();
                     auto f = raw_acquire(*c, b, "bench/hot", tok);
                     return f && raw_release(*c, b, "bench/hot", tok, *f);
                   });
                 }});
  ops.push_back({"dblock.lease_hot", "dblock", "raw.lease_hot",
                 "one key: acquire(wait)+release, default polling", [](backend_ctx& b, int) {
                   auto lk =
                       std::make_shared<dblock::lease_lock>(b.db, "bench/hot", b.wait_options);
                   return cycle_fn([lk] {
                     auto g = lk->acquire(std::chrono::seconds(30));
                     g.release();
                     return true;
                   });
                 }});

  ops.push_back({"raw.renew", "floor", "", "renew a held lease", [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   const std::string name = fresh_name("renew"), tok = token();
                   auto f = raw_acquire(*c, b, name, tok);
                   if (!f) throw std::runtime_error("cannot acquire " + name);
                   const long long fence = *f;
                   return cycle_fn([c, &b, name, tok, fence] {
                     return raw_simple_write(
                         *c, b, "renew", b.sql.renew,
                         {{"ttl", kTtlUs}, {"name", name}, {"token", tok}, {"fence", fence}});
                   });
                 }});
  ops.push_back(
      {"dblock.renew", "dblock", "raw.renew", "lease_guard::renew()", [](backend_ctx& b, int) {
         auto lk = std::make_shared<dblock::lease_lock>(b.db, fresh_name("renew"));
         auto g = std::make_shared<dblock::lease_guard>(lk->acquire(milliseconds(0)));
         return cycle_fn([lk, g] {
           g->renew();
           return true;
         });
       }});

  ops.push_back(
      {"raw.for_update", "floor", "",
       "BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT on a random row", [](backend_ctx& b, int) {
         auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
         return cycle_fn([c, &b] {
           const long long id = 1 + rand_below(kItems);
           c->run("begin_w", b.begin_write, {});
           try {
             c->run("fu_select",
                    "SELECT id, stock FROM " + b.item + " WHERE id = :id" + b.for_update,
                    {{"id", id}});
             c->run("fu_update", "UPDATE " + b.item + " SET stock = stock - 1 WHERE id = :id",
                    {{"id", id}});
             c->run("commit", "COMMIT", {});
           } catch (...) {
             c->exec("ROLLBACK");
             throw;
           }
           return true;
         });
       }});
  // The UPDATE through compare_and_set() on the transaction's connection: prepared once per
  // connection like the raw floor's (an UPDATE sent through t.session() is parsed every time).
  ops.push_back({"dblock.for_update", "dblock", "raw.for_update",
                 "run_transaction + lock_rows + compare_and_set(t.connection()) UPDATE on a "
                 "random row",
                 [](backend_ctx& b, int) {
                   return cycle_fn([&b] {
                     const long long id = 1 + rand_below(kItems);
                     dblock::run_transaction(b.db, [&](dblock::transaction& t) {
                       t.lock_rows({b.item, "id", id, {"stock"}});
                       dblock::compare_and_set(
                           t.connection(), {b.item, "stock = stock - 1", "id = :id", {{"id", id}}});
                     });
                     return true;
                   });
                 }});

  auto raw_opt = [](bool hot) {
    return [hot](backend_ctx& b, int) {
      auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
      return cycle_fn([c, &b, hot] {
        const long long id = hot ? 1 : 1 + rand_below(kItems);
        for (;;) {
          // One read of both columns: version * 2^32 + stock packs them into the first column.
          auto r = c->run("opt_read",
                          "SELECT version * 4294967296 + stock FROM " + b.item + " WHERE id = :id",
                          {{"id", id}});
          const long long v = r.value.value_or(0);
          auto o = c->run("opt_write",
                          "UPDATE " + b.item +
                              " SET stock = :stock, version = version + 1 WHERE id = :id AND "
                              "version = :version",
                          {{"stock", (v & 0xffffffffLL) - 1}, {"id", id}, {"version", v >> 32}});
          if (o.affected == 1) return true;
        }
      });
    };
  };
  auto dblock_opt = [](bool hot) {
    return [hot](backend_ctx& b, int) {
      auto spec = std::make_shared<dblock::versioned_table>(
          dblock::versioned_table{b.item, "id", "version", {"stock"}});
      return cycle_fn([&b, spec, hot] {
        const long long id = hot ? 1 : 1 + rand_below(kItems);
        dblock::versioned_update(
            b.db, *spec, id, [](dblock::record& r) { std::get<long long>(r["stock"]) -= 1; },
            dblock::retry_policy::until_success());
        return true;
      });
    };
  };
  ops.push_back({"raw.optimistic_hot", "floor", "",
                 "read; UPDATE ... WHERE version = ?; again on conflict; one row", raw_opt(true)});
  ops.push_back({"dblock.optimistic_hot", "dblock", "raw.optimistic_hot",
                 "versioned_update, until success; one row", dblock_opt(true)});
  ops.push_back(
      {"raw.optimistic_spread", "floor", "", "the same on random rows of 10,000", raw_opt(false)});
  ops.push_back({"dblock.optimistic_spread", "dblock", "raw.optimistic_spread",
                 "versioned_update on random rows of 10,000", dblock_opt(false)});

  ops.push_back(
      {"raw.cas", "floor", "", "UPDATE ... SET stock = stock - 1 WHERE id = 1 AND stock > 0",
       [](backend_ctx& b, int) {
         auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
         return cycle_fn([c, &b] {
           return c->run("cas",
                         "UPDATE " + b.item + " SET stock = stock - 1 WHERE id = :id AND stock > 0",
                         {{"id", 1LL}})
                      .affected == 1;
         });
       }});
  ops.push_back(
      {"dblock.cas", "dblock", "raw.cas", "compare_and_set on one row", [](backend_ctx& b, int) {
         auto u = std::make_shared<dblock::cas_update>(dblock::cas_update{
             b.item, "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}});
         return cycle_fn([&b, u] { return dblock::compare_and_set(b.db, *u) == 1; });
       }});

  // Segmented stock: the same hot item split into 16 rows; its floor is the same conditional
  // update on a random segment.
  ops.push_back({"raw.stock_take", "floor", "",
                 "UPDATE ... SET amount = amount - 1 WHERE <segment> AND amount >= 1, random "
                 "segment of 16",
                 [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   const std::string sql = "UPDATE " + b.prefix +
                                           "stock_segment SET amount = amount - :k WHERE "
                                           "stock_name = :name AND segment = :seg AND amount >= :k";
                   return cycle_fn([c, &b, sql] {
                     if (b.sql.write_transaction) c->run("begin", "BEGIN IMMEDIATE", {});
                     const bool ok =
                         c->run("stock_take", sql,
                                {{"k", 1LL},
                                 {"name", std::string(kStockName)},
                                 {"seg", static_cast<long long>(rand_below(kStockSegments))}})
                             .affected == 1;
                     if (b.sql.write_transaction) c->run("commit", "COMMIT", {});
                     return ok;
                   });
                 }});
  ops.push_back({"dblock.stock_take", "dblock", "raw.stock_take",
                 "segmented_stock::take(1) on one hot item of 16 segments (compare dblock.cas: "
                 "the same item as one row)",
                 [](backend_ctx& b, int) {
                   auto stock = std::make_shared<dblock::segmented_stock>(b.db, kStockName);
                   return cycle_fn([stock] { return stock->take(1); });
                 }});

  // The seeds' flash sale: the decrement and the order row in one transaction, so the hot row
  // stays locked until COMMIT; the same on one row (CAS) and on 16 segments.
  auto order_op = [](bool segmented) {
    return [segmented](backend_ctx& b, int) {
      auto stock = std::make_shared<dblock::segmented_stock>(b.db, kStockName);
      auto cas = std::make_shared<dblock::cas_update>(
          dblock::cas_update{b.item, "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}});
      const std::string insert = "INSERT INTO " + b.prefix + "order_row (id) VALUES (:id)";
      return cycle_fn([&b, stock, cas, insert, segmented] {
        static thread_local std::mt19937_64 rng(std::random_device{}());
        return dblock::run_transaction(b.db, [&](dblock::transaction& t) {
          const bool taken = segmented ? stock->take(t.connection(), 1)
                                       : dblock::compare_and_set(t.connection(), *cas) == 1;
          if (!taken) return false;
          const long long id = static_cast<long long>(rng() >> 1);
          t.session() << insert, soci::use(id, "id");
          return true;
        });
      });
    };
  };
  ops.push_back({"dblock.cas_order", "feature", "",
                 "transaction: compare_and_set on one hot row + INSERT of an order row",
                 order_op(false)});
  ops.push_back({"dblock.stock_order", "feature", "",
                 "transaction: segmented_stock::take(1) on 16 segments + INSERT of an order row",
                 order_op(true)});

  // The ID generator: one next() per operation, blocks of 1,000 reserved in the background.
  ops.push_back({"dblock.id_next", "feature", "",
                 "id_generator::next(), blocks of 1,000, prefetch on; one generator per client, "
                 "all on one name",
                 [](backend_ctx& b, int) {
                   auto gen = std::make_shared<dblock::id_generator>(b.db, "bench/ids");
                   return cycle_fn([gen] { return gen->next() > 0; });
                 }});

  // A session-level advisory lock cannot be kept behind a transaction-mode pooler.
  if (pg && b.db.options().pooler != dblock::pooler_mode::transaction)
    ops.push_back(
        {"pg.advisory", "alternative", "",
         "pg_try_advisory_lock + pg_advisory_unlock, distinct keys (no fencing, no "
         "lease: dies with the session)",
         [keys](backend_ctx& b, int t) {
           auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
           return cycle_fn([c, t, keys] {
             const long long k = 1000000LL * (t + 1) + rand_below(keys);
             if (c->run("adv_lock", "SELECT pg_try_advisory_lock(:k)::int", {{"k", k}}).value != 1)
               return false;
             return c->run("adv_unlock", "SELECT pg_advisory_unlock(:k)::int", {{"k", k}}).value ==
                    1;
           });
         }});
  if (my)
    ops.push_back({"mysql.get_lock", "alternative", "",
                   "GET_LOCK(name, 0) + RELEASE_LOCK, distinct names (no fencing, no lease)",
                   [key_name](backend_ctx& b, int t) {
                     auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                     return cycle_fn([c, t, key_name] {
                       const std::string k = key_name(t);
                       if (c->run("gl", "SELECT GET_LOCK(:k, 0)", {{"k", k}}).value != 1)
                         return false;
                       return c->run("rl", "SELECT RELEASE_LOCK(:k)", {{"k", k}}).value == 1;
                     });
                   }});
  return ops;
}

// ---- many watched leases ---------------------------------------------------------------------

// Counts the watchdog's batches and losses.
class renewal_counter : public dblock::listener {
 public:
  void renewed(std::size_t leases, std::size_t round_trips) override {
    renewals += static_cast<long long>(leases);
    statements += static_cast<long long>(round_trips);
    ++batches;
  }
  void lease_lost(std::string_view, const dblock::error&) override { ++lost; }
  std::atomic<long long> renewals{0}, statements{0}, batches{0}, lost{0};
};

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

double rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// The floor of acquiring `n` distinct names: the very acquire statement, through the C client,
// one after another; then the releases.
result raw_acquire_many(backend_ctx& b, int n) {
  auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
  const std::string base = fresh_name("bench/raw_many") + "/";
  std::vector<std::pair<std::string, long long>> held;
  const std::string tok = token();
  const auto t0 = clk::now();
  for (int i = 0; i < n; ++i) {
    const std::string name = base + std::to_string(i);
    if (auto f = raw_acquire(*c, b, name, tok)) held.emplace_back(name, *f);
  }
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  for (const auto& [name, fence] : held)
    raw_release(*c, b, name, tok, fence);
  result r;
  r.clients = 1;
  r.operations = n;
  r.successes = static_cast<long long>(held.size());
  r.errors = n - r.successes;
  r.per_second = static_cast<double>(held.size()) / took;
  return r;
}

// `n` leases of distinct names acquired with the watchdog on one database handle, held for
// three TTLs, then released: the acquire rate, and what holding them cost.
result watchdog_scale(backend_ctx& b, int n, int ttl_ms, std::ostream& progress) {
  const auto ttl = std::chrono::milliseconds(ttl_ms);
  auto events = std::make_shared<renewal_counter>();
  dblock::database_options o = b.db.options();
  o.events = events;
  dblock::database db(b.url, o);
  const std::string base = fresh_name("bench/watchdog") + "/";
  dblock::lease_options lo;
  lo.ttl = ttl;
  lo.watchdog = true;
  std::vector<dblock::lease_lock> locks;
  std::vector<dblock::lease_guard> guards;
  locks.reserve(static_cast<std::size_t>(n));
  const int threads0 = thread_count();
  const double rss0 = rss_mb();
  const auto t0 = clk::now();
  for (int i = 0; i < n; ++i) {
    locks.emplace_back(db, base + std::to_string(i), lo);
    if (auto g = locks.back().try_acquire()) guards.push_back(std::move(*g));
  }
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  const int threads1 = thread_count();
  const double rss1 = rss_mb();
  const long long renewals0 = events->renewals.load(), statements0 = events->statements.load(),
                  batches0 = events->batches.load();
  progress << "bench: " << b.label << " dblock.watchdog: " << guards.size()
           << " leases held; holding them for 3 TTLs (" << 3 * ttl.count() / 1000.0 << " s)\n";
  std::this_thread::sleep_for(3 * ttl);
  long long valid = 0;
  for (const auto& g : guards)
    valid += g.valid() ? 1 : 0;
  const long long renewals = events->renewals.load() - renewals0,
                  statements = events->statements.load() - statements0,
                  batches = events->batches.load() - batches0;
  for (auto& g : guards) {
    try {
      g.release();
    } catch (const std::exception&) {
    }
  }
  result r;
  r.clients = 1;
  r.operations = n;
  r.successes = static_cast<long long>(guards.size());
  r.errors = n - r.successes + (r.successes - valid);
  r.per_second = static_cast<double>(guards.size()) / took;
  r.figures = {{"leases", n},
               {"still_valid", static_cast<double>(valid)},
               {"lost", static_cast<double>(events->lost.load())},
               {"threads_added", threads1 - threads0},
               {"rss_added_mb", rss1 - rss0},
               {"renewals", static_cast<double>(renewals)},
               {"renewal_batches", static_cast<double>(batches)},
               {"renewal_statements", static_cast<double>(statements)},
               {"statements_per_100_renewals",
                renewals > 0 ? 100.0 * static_cast<double>(statements) / renewals : 0}};
  char note[320];
  std::snprintf(note, sizeof note,
                "%d leases, watchdog on, TTL %.1f s, held %.1f s: acquire/s as ops/s; %d threads "
                "added, RSS +%.1f MB; %lld renewals in %lld batches, %.2f statements per 100 "
                "renewals; %lld lost, %lld still valid",
                n, ttl_ms / 1000.0, 3 * ttl_ms / 1000.0, threads1 - threads0, rss1 - rss0, renewals,
                batches, renewals > 0 ? 100.0 * static_cast<double>(statements) / renewals : 0.0,
                events->lost.load(), valid);
  r.note = note;
  return r;
}

// ---- handoff latency -------------------------------------------------------------------------

// A releaser stays out of the race until another thread has taken the lock (at most 2 s, and not
// past the end of the measurement, when the others stop taking it), so that every measured
// handoff goes to a waiter, not back to the releaser. It sleeps on a condition variable: a
// releaser that polled would take CPU from the very handoff it measures on a small machine
// (polling every 50 us cost about 10 wake-ups per handoff).
class turns {
 public:
  /// A new holder took the lock, or a holder starts its release: the number of that event.
  long long next() {
    std::lock_guard<std::mutex> l(mu_);
    ++generation_;
    cv_.notify_all();
    return generation_;
  }
  /// Waits until another event than `released` (the caller's release) happened.
  void wait_for_successor(long long released) {
    const auto give_up = std::min(clk::now() + std::chrono::seconds(2), measurement_end);
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_until(l, give_up, [&] { return generation_ != released; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  long long generation_ = 0;
};

// Each handoff row also checks what it measures: one holder at a time, and every grant's fence
// above the one before. A violation fails that cycle (an error of the row, the fences in its
// note); the holder leaves before its release starts, so a successor never overlaps it.
class exclusion_check {
 public:
  /// Empty, or what was broken.
  std::string enter(std::int64_t fence) {
    std::lock_guard<std::mutex> l(mu_);
    std::string broken;
    if (holders_++ > 0)
      broken = "two holders at once: fence " + std::to_string(fence) + " granted while fence " +
               std::to_string(held_) + " was held";
    else if (fence <= last_)
      broken = "fence " + std::to_string(fence) + " granted after fence " + std::to_string(last_);
    held_ = fence;
    last_ = std::max(last_, fence);
    return broken;
  }
  void leave() {
    std::lock_guard<std::mutex> l(mu_);
    --holders_;
  }

 private:
  std::mutex mu_;
  int holders_ = 0;
  std::int64_t held_ = 0, last_ = 0;
};

// K = clients - 1 waiters on one lock. Each holder keeps it hold_us, notes when it starts
// release(), and the next holder measures from that instant to the return of its acquire().
// With `own_handles` every client opens its own database handle, as separate processes would:
// a release then reaches the waiters only through the database (PostgreSQL NOTIFY), the
// doorbell (SQLite) or the interrupted sleep of their wake-up connection (MySQL); otherwise all
// share the bench's handle and are woken within the process. Only handoffs, waits, holds,
// releases and wake-ups within the measurement window count: in the warm-up, the handles
// connect and their wake-up connections start, and waiters poll until those are in place.
// Counts the wake-ups of waiting acquires (listener::woken) within the measurement window.
struct wake_counter : dblock::listener {
  std::atomic<long long> n{0};
  std::atomic<clk::rep> from{clk::time_point::max().time_since_epoch().count()},
      to{clk::time_point::max().time_since_epoch().count()};
  void window(clk::time_point start, clk::time_point end) {
    from = start.time_since_epoch().count();
    to = end.time_since_epoch().count();
  }
  void woken(std::string_view) override {
    const auto now = clk::now().time_since_epoch().count();
    if (now >= from.load() && now < to.load()) ++n;
  }
};

result handoff_dblock(backend_ctx& b, int clients, double seconds, int hold_us, bool own_handles,
                      const dblock::lease_options& lo) {
  std::atomic<long long> release_started{0}, releases{0};
  std::atomic<long long> grants{0};  // acquires so far, for the turns a wait lasted
  turns turn;
  exclusion_check exclusion;
  std::mutex mu;
  std::vector<float> lat, waits;
  std::vector<long long> waited_turns;  // grants to other clients during each counted wait
  double held_ns = 0;  // how long holders really kept the lock (sleep_for() oversleeps)
  long long holds = 0;
  auto now_ns = [] { return clk::now().time_since_epoch().count(); };
  auto counter = std::make_shared<wake_counter>();
  // On the measuring thread: within its window (not in the warm-up, not after the end).
  auto in_window = [](long long t) {
    return t >= measurement_start.time_since_epoch().count() &&
           t < measurement_end.time_since_epoch().count();
  };
  // Waits for the fairness figure: asked in the window but not in its last fifth. A wait asked
  // later can end after the window, while the clients leave and close their handles (no longer
  // the constant contention that figure is about); leaving out the waits that end after the
  // window instead would leave out only the long ones of those asked near its end.
  auto before_last_fifth = [](long long t) {
    const long long s = measurement_start.time_since_epoch().count();
    const long long e = measurement_end.time_since_epoch().count();
    return t >= s && t < e - (e - s) / 5;
  };
  auto o = b.db.options();
  o.events = counter;
  o.pool_size = own_handles ? 2 : std::max<std::size_t>(o.pool_size, clients + 2);
  dblock::database shared(b.url, o);
  auto r = measure(clients, seconds, [&](int) {
    auto lk = std::make_shared<dblock::lease_lock>(
        own_handles ? dblock::database(b.url, o) : shared, "bench/handoff", lo);
    auto cycles = std::make_shared<int>(0);
    return cycle_fn([&, lk, cycles] {
      counter->window(measurement_start, measurement_end);  // set once the threads start
      const long long asked = now_ns(), grants_before = grants.load();
      auto g = lk->acquire(std::chrono::seconds(30));
      const long long got = now_ns(), rel = release_started.exchange(0);
      const long long overtaken = grants.fetch_add(1) - grants_before;
      const std::string broken = exclusion.enter(g.fence());
      turn.next();
      const bool counted = in_window(asked);
      {
        std::lock_guard<std::mutex> l(mu);
        if (rel && in_window(rel)) lat.push_back(static_cast<float>((got - rel) / 1000.0));
        // The first waits of a client include connecting its handle and joining the race.
        if (++*cycles > 2 && counted && before_last_fifth(asked)) {
          waits.push_back(static_cast<float>((got - asked) / 1000.0));
          waited_turns.push_back(overtaken);
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
      const long long gen = turn.next();
      exclusion.leave();
      const long long start = now_ns();
      release_started = start;
      if (counted) {
        std::lock_guard<std::mutex> l(mu);
        held_ns += static_cast<double>(start - got);
        ++holds;
      }
      g.release();
      if (in_window(start)) ++releases;
      turn.wait_for_successor(gen);
      if (!broken.empty()) throw std::runtime_error(broken);
      return true;
    });
  });
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  if (releases.load() > 0)
    r.woken_per_release = static_cast<double>(counter->n.load()) / releases.load();
  if (holds > 0) r.figures["hold_mean_us"] = held_ns / static_cast<double>(holds) / 1000.0;
  if (!waits.empty()) {
    double sum = 0, top = 0;
    for (float w : waits) {
      sum += w;
      top = std::max<double>(top, w);
    }
    r.wait_mean_us = sum / waits.size();
    r.wait_max_us = top;
    if (sum > 0) r.fairness = top / (sum / waits.size());
    // The same in turns, which machine hiccups do not lengthen: how many grants went to other
    // clients during a wait (in queue order with K waiters, K - 1 every time).
    long long turns_sum = 0, turns_top = 0;
    for (long long t : waited_turns) {
      turns_sum += t;
      turns_top = std::max(turns_top, t);
    }
    const double turns_mean = static_cast<double>(turns_sum) / waited_turns.size();
    r.figures["turns_mean"] = turns_mean;
    r.figures["turns_max"] = static_cast<double>(turns_top);
    if (turns_mean > 0) r.figures["fairness_max_over_mean_turns"] = turns_top / turns_mean;
  }
  return r;
}

// The same with PostgreSQL LISTEN/NOTIFY: a waiter sleeps until the holder's release notifies
// it (or 100 ms pass), instead of polling. Raw libpq, the lease statements of dblock.
result handoff_notify(backend_ctx& b, int clients, double seconds, int hold_us) {
  std::atomic<long long> release_started{0};
  turns turn;
  std::mutex mu;
  std::vector<float> lat;
  auto now_ns = [] { return clk::now().time_since_epoch().count(); };
  auto r = measure(clients, seconds, [&](int) {
    auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
    c->exec("LISTEN dblock_bench_handoff");
    return cycle_fn([&, c] {
      auto* conn = static_cast<PGconn*>(c->handle());
      for (;;) {
        const std::string tok = token();
        auto f = raw_acquire(*c, b, "bench/handoff_notify", tok);
        if (f) {
          const long long got = now_ns(), rel = release_started.exchange(0);
          turn.next();
          if (rel && rel >= measurement_start.time_since_epoch().count() &&
              rel < measurement_end.time_since_epoch().count()) {
            std::lock_guard<std::mutex> l(mu);
            lat.push_back(static_cast<float>((got - rel) / 1000.0));
          }
          std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
          const long long gen = turn.next();
          release_started = now_ns();
          raw_release(*c, b, "bench/handoff_notify", tok, *f);
          c->exec("NOTIFY dblock_bench_handoff");
          turn.wait_for_successor(gen);
          return true;
        }
        // Wait for a notification (or 100 ms), then drain them all and try again.
        while (PGnotify* n = PQnotifies(conn))
          PQfreemem(n);
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(PQsocket(conn), &fds);
        timeval tv{0, 100000};
        select(PQsocket(conn) + 1, &fds, nullptr, nullptr, &tv);
        PQconsumeInput(conn);
        while (PGnotify* n = PQnotifies(conn))
          PQfreemem(n);
      }
    });
  });
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

// ---- Redis -----------------------------------------------------------------------------------

#ifdef DBLOCK_HAVE_HIREDIS
setup_fn redis_setup(const std::string& hostport, int keys) {
  return [hostport, keys](int t) {
    auto colon = hostport.rfind(':');
    const std::string host = hostport.substr(0, colon);
    const int port = std::stoi(hostport.substr(colon + 1));
    std::shared_ptr<redisContext> c(redisConnect(host.c_str(), port), redisFree);
    if (!c || c->err)
      throw std::runtime_error("redis: cannot connect to " + hostport + ": " +
                               (c ? c->errstr : "out of memory"));
    // Compare-and-delete: delete the key only while it still carries our token.
    auto* load = static_cast<redisReply*>(redisCommand(
        c.get(), "SCRIPT LOAD %s",
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
        "else return 0 end"));
    if (!load || load->type != REDIS_REPLY_STRING)
      throw std::runtime_error("redis: SCRIPT LOAD failed");
    const std::string sha(load->str, load->len);
    freeReplyObject(load);
    return cycle_fn([c, sha, t, keys] {
      const std::string k = "bench:" + std::to_string(t) + ":" + std::to_string(rand_below(keys));
      const std::string tok = token();
      auto* r = static_cast<redisReply*>(
          redisCommand(c.get(), "SET %s %s NX PX 30000", k.c_str(), tok.c_str()));
      if (!r) throw std::runtime_error("redis: connection lost");
      const bool got = r->type == REDIS_REPLY_STATUS;
      freeReplyObject(r);
      if (!got) return false;
      r = static_cast<redisReply*>(
          redisCommand(c.get(), "EVALSHA %s 1 %s %s", sha.c_str(), k.c_str(), tok.c_str()));
      if (!r) throw std::runtime_error("redis: connection lost");
      const bool del = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
      freeReplyObject(r);
      return del;
    });
  };
}
#endif

// ---- set-up of one backend -------------------------------------------------------------------

std::unique_ptr<backend_ctx> open_backend(const std::string& url, const options& o) {
  dblock::database_options dbo;
  dbo.share_listener = !o.listener_per_handle;
  dblock::detail::set_handover_enabled(!o.no_handover);
  dbo.table_prefix = o.prefix;
  dbo.pool_size =
      static_cast<std::size_t>(*std::max_element(o.clients.begin(), o.clients.end())) + 2;
  dblock::database db(url, dbo);
  dblock::migrate(db);
  auto b = std::unique_ptr<backend_ctx>(
      new backend_ctx{url, db.backend(), "", "", "", {}, db, {}, "", "", "", {}, nullptr});
  const auto& impl = detail::access::impl(db);
  b->sql = {impl->statements.acquire.text, impl->statements.release.text,
            impl->statements.renew.text, impl->dia->exec.statement_in_transaction()};
  b->item = o.prefix + "item";
  b->prefix = o.prefix;
  b->for_update = impl->dia->sql.for_update();
  b->begin_write = impl->dia->sql.begin_write();
  b->version = connect_raw(url)->server_version();
  if (o.poll_max_ms > 0) b->wait_options.poll_max = milliseconds(o.poll_max_ms);
  if (b->backend == "postgresql" && db.options().pooler != dblock::pooler_mode::transaction &&
      (selected(o.only, "raw.lease_fast") || selected(o.only, "dblock.lease_fast") ||
       selected(o.only, "dblock.handoff_fast")) &&
      o.prefix.find("fast_") == std::string::npos) {
    options fo = o;
    fo.prefix = o.prefix + "fast_";
    b->fast = open_backend(url, fo);
    dblock::set_lease_durability(b->fast->db, dblock::lease_durability::fast);
  }
  auto c = db.connect();
  c.session() << "DROP TABLE IF EXISTS " << b->item;
  c.session() << "DROP TABLE IF EXISTS " << b->prefix << "order_row";
  c.session() << "CREATE TABLE " << b->prefix << "order_row (id BIGINT NOT NULL PRIMARY KEY)";
  c.session() << "CREATE TABLE " << b->item
              << " (id BIGINT NOT NULL PRIMARY KEY, stock BIGINT NOT NULL, version BIGINT NOT "
                 "NULL)";
  for (int first = 1; first <= kItems; first += 500) {
    std::string q = "INSERT INTO " + b->item + " (id, stock, version) VALUES ";
    for (int id = first; id < first + 500 && id <= kItems; ++id)
      q += (id == first ? "" : ",") + ("(" + std::to_string(id) + ", 1000000000, 0)");
    c.session() << q;
  }
  // Lease rows of the hot and handoff keys start free.
  c.session() << "DELETE FROM " << db.lock_table() << " WHERE resource_name LIKE 'bench/%'";
  // The hot item of the segmented-stock rows: more stock than any run can sell.
  dblock::segmented_stock stock(db, kStockName);
  stock.drop();
  stock.create(1000000000000000LL, kStockSegments);
  return b;
}

// The tables of a dblock.tablesize_* operation: prefix <prefix>rows<N>_, holding the released
// lease rows "fill/0" ... "fill/<N-1>" (expired two hours ago). Filled once, in batches of 1,000
// rows, and kept for later runs.
void prepare_sized(backend_ctx& b, long long rows, std::ostream& progress) {
  dblock::database_options dbo = b.db.options();
  dbo.table_prefix = b.prefix + "rows" + std::to_string(rows) + "_";
  dblock::database db(b.url, dbo);
  dblock::migrate(db);
  auto c = db.connect();
  auto& sql = c.session();
  long long have = 0;
  sql << "SELECT COUNT(*) FROM " << db.lock_table() << " WHERE resource_name LIKE 'fill/%'",
      soci::into(have);
  const std::string past = b.backend == "postgresql" ? "clock_timestamp() - INTERVAL '2 hours'"
                           : b.backend == "mysql"    ? "UTC_TIMESTAMP(6) - INTERVAL 2 HOUR"
                                                     : "0";
  if (have < rows)
    progress << "bench: " << b.label << ": filling " << db.lock_table() << " from " << have
             << " to " << rows << " rows (once; kept for later runs)\n";
  const auto t0 = clk::now();
  const long long batch = 1000, per_txn = 50;
  for (long long first = have; first < rows;) {
    sql << b.begin_write;
    for (long long n = 0; n < per_txn && first < rows; ++n, first += batch) {
      std::string q = "INSERT INTO " + db.lock_table() +
                      " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
                      " holder_host, holder_pid, holder_thread) VALUES ";
      for (long long i = first; i < std::min(rows, first + batch); ++i)
        q += std::string(i > first ? ", " : "") + "('fill/" + std::to_string(i) + "', '', " +
             std::to_string(i + 1) + ", 0, " + past + ", " + past + ", '', 0, '')";
      sql << q;
    }
    sql << "COMMIT";
    if (rows >= 100000 && first % 100000 == 0)
      progress << "bench: " << b.label << ": " << first << " of " << rows << " rows\n";
  }
  if (have < rows)
    progress << "bench: " << b.label << ": filled in "
             << std::chrono::duration_cast<milliseconds>(clk::now() - t0).count() << " ms\n";
  b.sized.emplace(rows, db);
}

// ---- reporting -------------------------------------------------------------------------------

// Handoff rows: handoffs/s against 1 / (hold + the one-client lease cycle), the rate a lock
// reaches when each handoff costs no more than one uncontended acquire and release. The hold is
// the one measured (sleep_for() oversleeps); the cycle is dblock.lease at one client of the
// same run (no figure without it).
void rate_against_lease_cycle(std::vector<result>& results) {
  for (auto& r : results) {
    const auto hold = r.figures.find("hold_mean_us");
    if (r.kind != "handoff" || hold == r.figures.end() || r.per_second <= 0) continue;
    for (const auto& l : results)
      if (l.label == r.label && l.operation == "dblock.lease" && l.clients == 1 &&
          l.per_second > 0) {
        const double bound = 1e6 / (hold->second + 1e6 / l.per_second);
        r.figures["rate_over_hold_plus_lease_cycle"] = r.per_second / bound;
        char extra[96];
        std::snprintf(extra, sizeof extra, "; %.2f x 1/(hold %.0f us + lease cycle %.0f us)",
                      r.per_second / bound, hold->second, 1e6 / l.per_second);
        r.note += extra;
      }
  }
}

std::string fmt_rate(double v) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(v < 100 ? 1 : 0) << v;
  std::string out = s.str();
  auto dot = out.find('.');
  int pos = static_cast<int>(dot == std::string::npos ? out.size() : dot) - 3;
  for (; pos > 0; pos -= 3)
    out.insert(static_cast<std::size_t>(pos), ",");
  return out;
}

constexpr int label_width = 20;

void print_table(std::ostream& out, const std::vector<result>& rs) {
  out << std::left << std::setw(label_width) << "backend" << std::setw(26) << "operation"
      << std::right << std::setw(8) << "clients" << std::setw(12) << "ops/s" << std::setw(10)
      << "p50 us" << std::setw(10) << "p99 us" << std::setw(7) << "rt/op" << std::setw(8) << "ratio"
      << "  vs\n";
  std::string last;
  for (const auto& r : rs) {
    if (!last.empty() && last != r.label + "|" + r.operation) {
      if (last.substr(0, r.label.size() + 1) != r.label + "|") out << '\n';
    }
    last = r.label + "|" + r.operation;
    out << std::left << std::setw(label_width) << r.label << std::setw(26) << r.operation
        << std::right << std::setw(8) << r.clients << std::setw(12) << fmt_rate(r.per_second)
        << std::setw(10) << std::fixed << std::setprecision(0) << r.p50_us << std::setw(10)
        << r.p99_us << std::setw(7) << std::setprecision(1);
    if (r.round_trips)
      out << *r.round_trips;
    else
      out << "";
    if (r.ratio) {
      out << std::setw(8) << std::setprecision(2) << *r.ratio << "  " << r.floor;
    } else {
      out << std::setw(8) << "";
    }
    if (r.errors) out << "  (" << r.errors << " errors: " << r.first_error.substr(0, 80) << ")";
    out << '\n';
  }
}

nlohmann::json to_json(const result& r) {
  nlohmann::json j = {{"backend", r.backend},
                      {"label", r.label},
                      {"operation", r.operation},
                      {"kind", r.kind},
                      {"clients", r.clients},
                      {"per_second", r.per_second},
                      {"p50_us", r.p50_us},
                      {"p99_us", r.p99_us},
                      {"operations", r.operations},
                      {"successes", r.successes},
                      {"errors", r.errors},
                      {"rounds", r.rounds},
                      {"note", r.note}};
  if (!r.floor.empty()) j["floor"] = r.floor;
  if (r.ratio) j["ratio"] = *r.ratio;
  if (r.round_trips) j["round_trips_per_op"] = *r.round_trips;
  if (r.woken_per_release) j["woken_per_release"] = *r.woken_per_release;
  if (r.fairness) {
    j["fairness_max_over_mean_wait"] = *r.fairness;
    j["wait_mean_us"] = r.wait_mean_us;
    j["wait_max_us"] = r.wait_max_us;
  }
  for (const auto& [k, v] : r.figures)
    j[k] = v;
  if (r.errors) j["first_error"] = r.first_error;
  return j;
}

// Draws ops/s against clients: one panel per backend, one line per operation.
bool plot(const std::string& path, const std::vector<result>& rs, std::ostream& progress) {
  std::map<std::string, std::map<std::string, std::vector<std::pair<int, double>>>> series;
  for (const auto& r : rs)
    if (r.kind != "handoff" && r.kind != "scale")
      series[r.label][r.operation].push_back({r.clients, r.per_second});
  char dir[] = "/tmp/dblock-plot-XXXXXX";
  if (!mkdtemp(dir)) return false;
  std::ofstream gp(std::string(dir) + "/plot.gp");
  gp << "set terminal svg size 1400," << 420 * ((series.size() + 1) / 2)
     << " dynamic font 'sans,10'\nset output '" << path << "'\n";
  gp << "set multiplot layout " << (series.size() + 1) / 2 << ",2\n";
  gp << "set logscale xy\nset xtics (1,4,16)\nset grid\nset key outside right\n"
        "set xlabel 'clients'\nset ylabel 'successful ops/s'\n";
  int file = 0;
  for (const auto& [backend, ops] : series) {
    gp << "set title '" << backend << "'\nplot ";
    bool first = true;
    for (const auto& [op, pts] : ops) {
      const std::string data = std::string(dir) + "/" + std::to_string(file++) + ".dat";
      std::ofstream d(data);
      for (const auto& p : pts)
        d << p.first << ' ' << std::max(p.second, 0.1) << '\n';
      gp << (first ? "" : ", ") << "'" << data << "' using 1:2 with linespoints title '" << op
         << "'" << (op.rfind("raw.", 0) == 0 ? " dashtype 2" : "");
      first = false;
    }
    gp << '\n';
  }
  gp << "unset multiplot\n";
  gp.close();
  const std::string cmd = "gnuplot '" + std::string(dir) + "/plot.gp' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    progress << "bench: gnuplot failed or is not installed (apt-get install gnuplot-nox); no plot "
                "written\n";
    return false;
  }
  progress << "bench: plot written to " << path << '\n';
  return true;
}

}  // namespace

int run(const options& o, std::ostream& out, std::ostream& progress) {
  if (o.urls.empty()) {
    progress << "bench: no database URL given (--url, repeatable)\n";
    return 2;
  }
  std::vector<result> results;
  nlohmann::json backends = nlohmann::json::array();
  const auto t_start = std::chrono::system_clock::now();
  const int max_clients = *std::max_element(o.clients.begin(), o.clients.end());

  // Plan first, so progress can say "n of N".
  struct planned {
    backend_ctx* b;
    operation op;
    int clients;
  };
  std::vector<std::unique_ptr<backend_ctx>> ctxs;
  std::vector<planned> plan;
  for (const auto& url : o.urls) {
    progress << "bench: preparing " << detail::parse_url(url).redacted << "\n";
    ctxs.push_back(open_backend(url, o));
    auto& b = *ctxs.back();
    const std::string base =
        b.backend + (b.db.options().pooler == dblock::pooler_mode::transaction ? "/pooler" : "");
    b.label = base;
    for (int k = 2; std::any_of(ctxs.begin(), ctxs.end() - 1,
                                [&](const auto& other) { return other->label == b.label; });
         ++k)
      b.label = base + "#" + std::to_string(k);
    backends.push_back({{"backend", b.backend},
                        {"label", b.label},
                        {"url", b.db.redacted_url()},
                        {"server_version", b.version}});
    // Rounds: every operation once per client count, repeated; the figures are medians over
    // the rounds, so a drift of the machine hits the floor and dblock alike.
    auto ops = operations_for(b, o.keys);
    for (int c : o.clients)
      for (int round = 0; round < o.repeat; ++round)
        for (auto& op : ops) {
          if (!selected(o.only, op.name) || (op.named_only && o.only.empty())) continue;
          plan.push_back({&b, op, c});
        }
    for (const auto& [suffix, rows] : std::vector<std::pair<std::string, long long>>{
             {"10", 10}, {"10k", 10000}, {"1m", 1000000}})
      if (std::any_of(plan.begin(), plan.end(), [&](const planned& p) {
            return p.b == &b && p.op.name == "dblock.tablesize_" + suffix;
          }))
        prepare_sized(b, rows, progress);
  }
  // The handoff rows: each runs when --only selects it.
  const bool want_plain = selected(o.only, "dblock.handoff");
  const bool want_shared = selected(o.only, "dblock.handoff_shared");
  const bool want_fair = selected(o.only, "dblock.handoff_fair");
  const bool want_fast = selected(o.only, "dblock.handoff_fast");
  const bool want_notify = selected(o.only, "pg.notify_handoff");
  const auto notify_on = [](const backend_ctx& b) {  // LISTEN needs a session of its own
    return b.backend == "postgresql" && b.db.options().pooler != dblock::pooler_mode::transaction;
  };
  std::size_t total = plan.size();
  for (auto& b : ctxs)
    for (int c : o.clients)
      if (c > 1)
        total += (want_plain ? 1 : 0) + (want_shared ? 1 : 0) + (want_fair ? 1 : 0) +
                 (want_fast && b->fast ? 1 : 0) + (want_notify && notify_on(*b) ? 1 : 0);
  // Costs a long set-up (and minutes at 10,000 leases): only when --only names it.
  const bool want_watchdog = !o.only.empty() && selected(o.only, "dblock.watchdog");
  if (want_watchdog) total += 2 * ctxs.size();
  const bool want_redis = selected(o.only, "redis.lock");
  if (want_redis && !o.redis.empty()) total += o.clients.size();
  progress << "bench: " << total << " measurements of " << o.seconds << " s each (" << o.repeat
           << " rounds of each; about " << static_cast<int>(total * o.seconds * 1.15 + 0.5)
           << " s)\n";

  std::size_t n = 0;
  auto report = [&](result r) {
    ++n;
    progress << "bench: [" << n << "/" << total << "] " << r.label << " " << r.operation
             << " clients=" << r.clients << ": " << fmt_rate(r.per_second) << " ops/s, p50 "
             << static_cast<long long>(r.p50_us) << " us"
             << (r.errors ? " (" + std::to_string(r.errors) + " errors)" : "") << "\n";
    results.push_back(std::move(r));
  };
  std::map<std::tuple<std::string, std::string, int>, std::vector<result>> rounds;
  for (auto& p : plan) {
    result r;
    try {
      r = measure(p.clients, o.seconds, [&](int i) { return p.op.setup(*p.b, i); });
    } catch (const std::exception& e) {
      r.clients = p.clients;
      r.errors = 1;
      r.first_error = e.what();
    }
    name_row(r, *p.b, p.op.name, p.op.kind);
    r.floor = p.op.floor;
    r.note = p.op.note;
    if (r.operations > 0 && r.successes == 0 && p.op.name.find("lease_hot") != std::string::npos)
      r.note += "; " + hot_key_holder(*p.b);
    auto& v = rounds[{r.label, r.operation, r.clients}];
    v.push_back(r);
    if (static_cast<int>(v.size()) < o.repeat) {
      ++n;
      progress << "bench: [" << n << "/" << total << "] " << r.label << " " << r.operation
               << " clients=" << r.clients << ": " << fmt_rate(r.per_second) << " ops/s\n";
      continue;
    }
    // The last round: report the median (its latencies are those of the median run).
    std::sort(v.begin(), v.end(),
              [](const result& a, const result& b) { return a.per_second < b.per_second; });
    result med = v[v.size() / 2];
    long long errors = 0;
    for (const auto& x : v) {
      errors += x.errors;
      if (med.first_error.empty()) med.first_error = x.first_error;
      // A round that succeeded not once says why in its note (hot_key_holder()).
      if (x.operations > 0 && x.successes == 0 && med.successes > 0) med.note = x.note;
    }
    med.errors = errors;
    med.rounds = static_cast<int>(v.size());
    report(std::move(med));
  }
  for (auto& b : ctxs)
    for (int c : o.clients) {
      if (c < 2) continue;
      struct variant {
        const char* op;
        bool own, fair, wanted;
      };
      for (const variant v : {variant{"dblock.handoff", true, false, want_plain},
                              variant{"dblock.handoff_shared", false, false, want_shared},
                              variant{"dblock.handoff_fair", true, true, want_fair}}) {
        if (!v.wanted) continue;
        auto lo = b->wait_options;
        lo.fair = v.fair;
        result r = handoff_dblock(*b, c, o.seconds, o.hold_us, v.own, lo);
        name_row(r, *b, v.op, "handoff");
        char extra[96];
        std::snprintf(extra, sizeof extra, "; woken per release %.2f; max/mean wait %.2f",
                      r.woken_per_release.value_or(0), r.fairness.value_or(0));
        r.note = std::string(v.own ? "one database handle per client (as processes)"
                                   : "one database handle shared by the clients") +
                 (v.fair ? (o.no_handover ? ", fair, no handover" : ", fair") : "") +
                 "; K=clients-1 waiters; latency from release() start to the next acquire() "
                 "return (p50/p99); ops/s = handoffs/s; hold " +
                 std::to_string(o.hold_us) + " us" + extra;
        report(std::move(r));
      }
      // The same across handles on PostgreSQL's fast lease table: the wake-up path without
      // the two commits' WAL flushes.
      if (b->fast && want_fast) {
        result r = handoff_dblock(*b->fast, c, o.seconds, o.hold_us, true, b->wait_options);
        name_row(r, *b, "dblock.handoff_fast", "handoff");
        r.note =
            "as dblock.handoff on the fast lease table (UNLOGGED, docs/fast-leases.md): the "
            "wake-up path without the WAL flushes of the release and the acquire; hold " +
            std::to_string(o.hold_us) + " us";
        report(std::move(r));
      }
      if (want_notify && notify_on(*b)) {
        result q = handoff_notify(*b, c, o.seconds, o.hold_us);
        name_row(q, *b, "pg.notify_handoff", "handoff");
        q.note = "raw libpq: waiters LISTEN and retry on NOTIFY from the releaser";
        report(std::move(q));
      }
    }
  if (want_watchdog)
    for (auto& b : ctxs) {
      result f = raw_acquire_many(*b, o.watchdog_leases);
      name_row(f, *b, "raw.acquire_many", "floor");
      f.note = std::to_string(o.watchdog_leases) +
               " distinct names acquired one after another (the acquire statement, C client)";
      report(std::move(f));
      result r;
      try {
        r = watchdog_scale(*b, o.watchdog_leases, o.watchdog_ttl_ms, progress);
      } catch (const std::exception& e) {
        r.clients = 1;
        r.errors = 1;
        r.first_error = e.what();
      }
      name_row(r, *b, "dblock.watchdog", "scale");
      r.floor = "raw.acquire_many";
      report(std::move(r));
    }
  if (want_redis && !o.redis.empty()) {
#ifdef DBLOCK_HAVE_HIREDIS
    for (int c : o.clients) {
      result r;
      try {
        r = measure(c, o.seconds, redis_setup(o.redis, o.keys));
      } catch (const std::exception& e) {
        r.clients = c;
        r.errors = 1;
        r.first_error = e.what();
      }
      r.backend = r.label = "redis";
      r.operation = "redis.lock";
      r.kind = "alternative";
      r.note = "SET key token NX PX + compare-and-delete Lua (EVALSHA); in memory, no fencing";
      report(std::move(r));
    }
#else
    progress << "bench: redis.lock skipped: this dblock was built without hiredis "
                "(libhiredis-dev)\n";
#endif
  } else if (want_redis) {
    progress << "bench: redis.lock skipped: no --redis HOST:PORT given (scripts/bench.sh starts "
                "a throwaway redis-server when one is installed)\n";
  }

  // Ratios: a dblock figure divided by its floor at the same backend and client count.
  for (auto& r : results) {
    if (r.floor.empty()) continue;
    for (const auto& f : results)
      if (f.label == r.label && f.operation == r.floor && f.clients == r.clients &&
          f.per_second > 0)
        r.ratio = r.per_second / f.per_second;
  }
  std::stable_sort(results.begin(), results.end(), [](const result& a, const result& b) {
    return std::tie(a.label, a.operation, a.clients) < std::tie(b.label, b.operation, b.clients);
  });
  rate_against_lease_cycle(results);
  out << "\n";
  print_table(out, results);

  // Many watched leases: what holding them cost.
  for (const auto& r : results)
    if (r.operation == "dblock.watchdog")
      out << "\nwatchdog, " << r.label << ": " << r.note
          << (r.errors && !r.first_error.empty() ? " (" + r.first_error + ")" : "") << "\n";

  // Handoffs: wake-ups per release, fairness, and the rate against 1/(hold + lease cycle).
  bool handoff_header = false;
  for (const auto& r : results) {
    if (r.kind != "handoff" || !r.woken_per_release) continue;
    if (!handoff_header)
      out << "\nhandoffs (waiters woken per release; longest / mean acquire wait, in time and "
             "in turns, the grants to others during a wait; handoffs/s over 1 / (measured hold + "
             "one-client dblock.lease cycle)):\n";
    handoff_header = true;
    const auto rate = r.figures.find("rate_over_hold_plus_lease_cycle");
    out << "  " << std::left << std::setw(label_width) << r.label << std::setw(22) << r.operation
        << std::right << std::setw(4) << r.clients << " clients  woken " << std::fixed
        << std::setprecision(2) << *r.woken_per_release << "  max/mean " << r.fairness.value_or(0);
    const auto turns = r.figures.find("fairness_max_over_mean_turns");
    if (turns != r.figures.end()) out << "  in turns " << turns->second;
    out << "  rate ";
    if (rate != r.figures.end())
      out << rate->second << "x\n";
    else
      out << "- (no one-client dblock.lease row)\n";
  }

  // Contention collapse: hot-key successful cycles at the most clients over one client.
  nlohmann::json collapse = nlohmann::json::object();
  out << "\ncontention collapse (one hot key, successful cycles/s at " << max_clients
      << " clients / at 1 client):\n";
  for (auto& b : ctxs)
    for (const char* op : {"raw.lease_hot", "dblock.lease_hot"}) {
      double one = 0, many = 0;
      for (const auto& r : results)
        if (r.label == b->label && r.operation == op) {
          if (r.clients == 1) one = r.per_second;
          if (r.clients == max_clients) many = r.per_second;
        }
      if (one <= 0 || max_clients == 1) continue;
      out << "  " << std::left << std::setw(label_width) << b->label << std::setw(18) << op
          << std::right << std::fixed << std::setprecision(2) << many / one << "x\n";
      collapse[b->label][op] = many / one;
    }

  // The hot item as 16 segments against the same item as one row (successful decrements/s).
  bool stock_header = false;
  for (const auto& r : results) {
    const std::string one_row = r.operation == "dblock.stock_take"    ? "dblock.cas"
                                : r.operation == "dblock.stock_order" ? "dblock.cas_order"
                                                                      : "";
    if (one_row.empty()) continue;
    for (const auto& c : results)
      if (c.label == r.label && c.operation == one_row && c.clients == r.clients &&
          c.per_second > 0) {
        if (!stock_header)
          out << "\nhot item: segmented stock (16 segments) / one row with compare_and_set:\n";
        stock_header = true;
        out << "  " << std::left << std::setw(label_width) << r.label << std::setw(20)
            << (r.operation == "dblock.stock_take" ? "decrement alone" : "with an order row")
            << std::right << std::setw(4) << r.clients << " clients " << std::fixed
            << std::setprecision(2) << r.per_second / c.per_second << "x\n";
      }
  }

  // Through a transaction-mode pooler against the same backend measured directly (the first
  // direct URL of that backend): dblock's lease cycle and its raw floor.
  for (auto& b : ctxs) {
    if (b->db.options().pooler != dblock::pooler_mode::transaction) continue;
    const auto direct = std::find_if(ctxs.begin(), ctxs.end(), [&](const auto& d) {
      return d->backend == b->backend && d->db.options().pooler != dblock::pooler_mode::transaction;
    });
    if (direct == ctxs.end()) continue;
    bool header = false;
    for (const auto& r : results) {
      if (r.label != b->label || r.kind == "handoff") continue;
      for (const auto& d : results)
        if (d.label == (*direct)->label && d.operation == r.operation && d.clients == r.clients &&
            d.per_second > 0) {
          if (!header)
            out << "\nthrough the pooler / direct (" << b->label << " / " << (*direct)->label
                << "):\n";
          header = true;
          out << "  " << std::left << std::setw(26) << r.operation << std::right << std::setw(4)
              << r.clients << " clients " << std::fixed << std::setprecision(2)
              << r.per_second / d.per_second << "x\n";
        }
    }
  }

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["format"] = "dblock-bench/1";
    const std::time_t t = std::chrono::system_clock::to_time_t(t_start);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    j["started"] = when;
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    j["host"] = host;
    j["cpus"] = std::thread::hardware_concurrency();
    j["seconds_per_measurement"] = o.seconds;
    j["rounds"] = o.repeat;
    j["clients"] = o.clients;
    j["backends"] = backends;
    j["results"] = nlohmann::json::array();
    for (const auto& r : results)
      j["results"].push_back(to_json(r));
    j["contention_collapse"] = collapse;
    std::ofstream f(o.json_path);
    f << j.dump(2) << '\n';
    if (!f) {
      progress << "bench: cannot write " << o.json_path << "\n";
      return 73;
    }
    progress << "bench: results written to " << o.json_path << "\n";
  }
  for (auto& b : ctxs) {
    auto c = b->db.connect();
    c.session() << "DROP TABLE IF EXISTS " << b->item;
    c.session() << "DROP TABLE IF EXISTS " << b->prefix << "order_row";
  }
  if (!o.plot_path.empty() && !plot(o.plot_path, results, progress)) return 1;
  return 0;
}

}  // namespace dblock::bench
