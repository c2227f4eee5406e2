// Test harness: runs one test body on PostgreSQL, MySQL/MariaDB and SQLite.
//
// Servers come from environment variables set by scripts/test-servers.sh (or by you):
//   DBLOCK_TEST_POSTGRESQL_URL, DBLOCK_TEST_MYSQL_URL, DBLOCK_TEST_SQLITE_DIR (optional).
// A missing server is announced loudly; with CI=true it fails the test.
// Each test gets its own random table prefix (and, on SQLite, its own file), so tests can run
// in parallel against the same servers.
#pragma once

#include <dblock/dblock.hpp>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dblock::test {

// The names nearly every test uses; `using namespace dblock::test` brings them in.
using dblock::errc;
using std::chrono::milliseconds;

/// Everything a backend-parametrised test body needs.
struct context {
  std::string backend;                     // "postgresql", "mysql", "sqlite"
  std::string url;                         // the URL (SQLite: a fresh file for this test)
  std::string prefix;                      // random table prefix of this test
  database db;                             // migrated, with `prefix`
  std::vector<std::string> prefixes = {};  // every prefix to drop afterwards

  /// Another handle on the same database and prefix (its own pool).
  database open() const;
  /// Another handle on the same database with these options (prefix included).
  database open(database_options o) const;
  /// Options with this test's prefix.
  database_options options() const;
  /// Runs SQL on a pooled connection of `db` (for test set-up).
  void exec(const std::string& sql) const;
  /// A fresh, unmigrated table prefix; its tables are dropped after the test like ours.
  std::string new_prefix();
  /// Creates a test table name unique to this test: "<prefix><stem>".
  std::string table(const std::string& stem) const { return prefix + stem; }
};

/// Whether `db`'s connections take the MySQL 8 flavor (docs/mysql.md): a MySQL server, or the
/// suite's flavor run on MariaDB (DBLOCK_TEST_MYSQL_FLAVOR=mysql, tests/CMakeLists.txt).
inline bool mysql8_flavor(const database& db) {
  if (db.backend() != "mysql") return false;
  const char* f = std::getenv("DBLOCK_TEST_MYSQL_FLAVOR");
  return (f && std::string(f) == "mysql") || db.server().product == "MySQL";
}

/// Database options with a table prefix.
inline database_options with_prefix(const std::string& prefix) {
  database_options o;
  o.table_prefix = prefix;
  return o;
}

/// A random lower-case identifier fragment (for names of tables and locks).
std::string random_suffix(std::size_t n = 8);

/// A lock name of its own for one test: "<stem>/<random suffix>".
inline std::string unique_name(const std::string& stem) {
  return stem + "/" + random_suffix();
}

/// Nanoseconds in a millisecond (monotonic_ns() arithmetic).
constexpr long long ns_per_ms = 1000000LL;

/// Lease options of a waiting worker: leases of `ttl`, polls from 1 ms up to `poll_max`.
inline lease_options polling_lease(std::chrono::milliseconds ttl,
                                   std::chrono::milliseconds poll_max) {
  lease_options o;
  o.ttl = ttl;
  o.poll_initial = std::chrono::milliseconds(1);
  o.poll_max = poll_max;
  return o;
}

/// Lease options with this TTL.
inline lease_options ttl_of(std::chrono::milliseconds ttl) {
  lease_options o;
  o.ttl = ttl;
  return o;
}

/// The machine's pace now: the median of `n` plain round trips (`db.ping()`) in microseconds.
/// A liveness bound scales with it (liveness_bound_ms), so that a loaded or instrumented machine,
/// slower at everything, does not fail a check that is about dblock.
long long median_round_trip_us(const database& db, int n = 9);

/// A liveness bound: `base_ms` (the mechanism's own delay: a poll, a TTL) plus a slack of 200
/// round trips at the measured pace, never less than 500 ms. Safety bounds ("never before the
/// TTL", order, exact counts) never scale.
inline long long liveness_bound_ms(long long base_ms, long long round_trip_us) {
  const long long slack = 200 * round_trip_us / 1000;
  return base_ms + (slack > 500 ? slack : 500);
}

/// A liveness bound that is `usual_ms` at a normal pace (200 round trips within 500 ms) and grows
/// by the rest of liveness_bound_ms's slack on a slower machine: for the bounds that tell a ring
/// from a poll of many seconds, or a deadline from a hang, written as they were on a quiet
/// machine.
inline long long scaled_bound_ms(const database& db, long long usual_ms) {
  return liveness_bound_ms(usual_ms - 500, median_round_trip_us(db));
}

/// The bound of a call that must not wait (nowait, try, skip_locked): what a call that waited
/// would exceed (a lock wait of seconds), not the machine's speed: 50 ms plus the slack of
/// liveness_bound_ms at the pace of `db` measured now.
inline long long no_wait_bound_ms(const database& db) {
  return liveness_bound_ms(50, median_round_trip_us(db));
}

/// A scenario whose liveness checks depend on the machine's pace (renewals keeping up with a TTL,
/// reports coming in time), run at scale 1, then 2 and 4 (of its TTL or window) while needed:
/// `attempt(scale, last)` makes its exact checks (counts, safety) every time and returns what
/// missed that a slower machine explains; misses of an attempt that is not the last are printed
/// and the scenario runs again, scaled; the last attempt checks them itself. A call of an attempt
/// that is not the last failing with errc::timeout or errc::connection_failed (a deadline that
/// the scenario's TTL sets, run out on a slow machine) counts as such a miss.
void at_machine_pace(const std::function<std::vector<std::string>(int scale, bool last)>& attempt);

/// True under DBLOCK_TEST_FULL=1: the full trial counts instead of CI's reduced ones.
inline bool full_run() {
  const char* v = std::getenv("DBLOCK_TEST_FULL");
  return v && std::string(v) == "1";
}

/// True in a sanitizer build (ASan, TSan): the heaviest load tests scale their counts down there,
/// where they check memory and thread safety, not capacity (which the plain build checks).
constexpr bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

/// How often `needle` occurs in `text` (overlapping occurrences counted).
inline std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1))
    ++n;
  return n;
}

/// The most of the intervals [enter, exit) open at one instant (at an instant where one ends and
/// another begins, the one ending first).
int most_at_once(const std::vector<std::pair<long long, long long>>& intervals);

/// A retry policy of `attempts` attempts within `budget` (0: no time budget), its backoff growing
/// from `initial` to at most `max`.
inline retry_policy retry_of(int attempts, std::chrono::milliseconds budget,
                             std::chrono::milliseconds initial, std::chrono::milliseconds max) {
  retry_policy p;
  p.max_attempts = attempts;
  p.time_budget = budget;
  p.initial_backoff = initial;
  p.max_backoff = max;
  return p;
}

/// Runs `f` on a thread of its own after `delay` (a canceller, a releaser); join the thread before
/// checking what `f` did.
inline std::thread run_after(std::chrono::milliseconds delay, std::function<void()> f) {
  return std::thread([delay, f = std::move(f)] {
    std::this_thread::sleep_for(delay);
    f();
  });
}

/// Runs `body` on `backend` (skipping loudly when it is not configured, failing under CI).
void run_on(const std::string& backend, const std::function<void(context&)>& body);

/// URL of a configured backend (SQLite: a fresh file path each call), or nothing.
std::optional<std::string> backend_url(const std::string& backend);

/// The environment variable that configures `backend`.
std::string backend_env(const std::string& backend);

// ---- worker processes ----------------------------------------------------------------------

/// A worker entry point: the test binary runs it when started as `<exe> --worker NAME ARGS...`.
using worker_fn = int (*)(const std::vector<std::string>& args);

/// Registers a worker (use DBLOCK_WORKER).
struct worker_registration {
  worker_registration(const char* name, worker_fn fn);
};

/// The argument vector of a program to exec or posix_spawn: `head` then `tail`, ending in a null
/// pointer; argv[0] is the program's path. The strings live as long as the object.
class exec_argv {
 public:
  exec_argv(std::vector<std::string> head, const std::vector<std::string>& tail)
      : words_(std::move(head)) {
    words_.insert(words_.end(), tail.begin(), tail.end());
    for (auto& w : words_)
      ptrs_.push_back(w.data());
    ptrs_.push_back(nullptr);
  }
  exec_argv(const exec_argv&) = delete;
  exec_argv& operator=(const exec_argv&) = delete;
  char* const* data() const { return ptrs_.data(); }
  char* operator[](std::size_t i) const { return ptrs_[i]; }

 private:
  std::vector<std::string> words_;
  std::vector<char*> ptrs_;
};

/// In a child between fork() and exec: stdout to `out`, stderr to `err`, stdin from /dev/null
/// (async-signal-safe calls only).
void redirect_child_stdio(int out, int err);

/// Prints to stderr what a child process that outlived its deadline is doing, before it is
/// killed: each thread's kernel wait channel and, where gdb is installed, every thread's
/// backtrace. A hang in CI then says where it hung.
void describe_hung_process(int pid);

/// Starts the test binary as a worker process; returns its pid.
int spawn_worker(const std::string& name, const std::vector<std::string>& args,
                 const std::vector<std::string>& extra_env = {});
/// Waits for a worker; returns its exit status (128+signal when killed).
int wait_worker(int pid);
/// Runs a worker registered under `name` in this process (used by main).
int run_worker(const std::string& name, const std::vector<std::string>& args);

/// Set by run_on and skip() when the current test was skipped (read by the summary listener).
bool& skipped_test();

/// Marks the current test skipped because `why` (it could not test what it is for): counted as
/// skipped in the summary, which fails a CI=true run, and a failure at once under CI=true. The
/// caller returns right after (see DBLOCK_SKIP).
void skip(const std::string& why);

/// Thrown by skip_test(); the test case's runner catches it (DBLOCK_TEST and its kin).
struct test_skipped {};

/// skip(), then leaves the test case from any depth (a helper that finds the test cannot run
/// here, e.g. without control of the server). Under CI=true, a failure at once as skip() is.
/// Never from inside an assertion (REQUIRE(f()) where f skips): Catch takes the throw for an
/// unexpected exception and fails the test; call it first and assert on its result.
[[noreturn]] void skip_test(const std::string& why);

/// Wall time in ns on CLOCK_MONOTONIC (comparable across processes on one host).
long long monotonic_ns();

/// Sleeps until the CLOCK_MONOTONIC instant `t_ns` (a common start for threads and processes).
void sleep_until_monotonic(long long t_ns);

/// Worker processes of one test; the destructor kills and reaps those not waited for, so that a
/// failed REQUIRE never leaves processes behind.
class process_set {
 public:
  process_set() = default;
  process_set(const process_set&) = delete;
  process_set& operator=(const process_set&) = delete;
  /// Kills (SIGKILL) and reaps every worker not yet waited for.
  ~process_set();
  /// Starts worker `name` (see spawn_worker) and returns its pid.
  int spawn(const std::string& name, const std::vector<std::string>& args,
            const std::vector<std::string>& env = {});
  /// Exit status (128+signal when killed); -1 when still running at the deadline (then killed).
  int wait(int pid, std::chrono::milliseconds timeout);
  /// Waits for all within one deadline; returns their exit statuses (as wait) in spawn order.
  std::vector<int> wait_all(std::chrono::milliseconds timeout);
  /// Waits for all without a deadline; returns their exit statuses (as wait_worker) in spawn order.
  std::vector<int> wait_all();
  /// Stops tracking `pid` (the destructor will not kill it).
  void forget(int pid);

 private:
  std::vector<int> pids_;
};

// ---- files and databases of worker processes -------------------------------------------------

/// True when DBLOCK_TEST_KEEP_DIRS is set (not "0"): temporary directories are left in place
/// and the fault analysis writes the tables of a run that broke an invariant beside its logs.
bool keep_temp_dirs();

/// A fresh directory $TMPDIR/dblock-<tag>-XXXXXX for the files workers write; removed with
/// everything in it (kept under DBLOCK_TEST_KEEP_DIRS).
struct temp_dir {
  std::string path;
  explicit temp_dir(const std::string& tag);
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir();
  /// The path of `name` inside the directory.
  std::string file(const std::string& name) const { return path + "/" + name; }
};

/// libfaketime's library (Debian's faketime package), "" when it is not installed.
std::string faketime_lib();

/// Writes a whole file atomically (the reader never sees it half-written).
void write_file_atomic(const std::string& path, const std::string& text);

/// The whole content of a file ("" when it cannot be read).
std::string read_file(const std::string& path);

/// Waits until a file exists; false after `timeout`.
bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout);

/// A rendezvous of `parties` threads or processes through files in `dir` (a negative control
/// forcing the overlap it needs): party `me` (0 .. parties-1) writes "<dir>/<tag>.<me>", then
/// waits until the files of every party exist. False after `timeout` (a party that never came).
inline bool file_rendezvous(const std::string& dir, const std::string& tag, int me, int parties,
                            std::chrono::milliseconds timeout) {
  write_file_atomic(dir + "/" + tag + "." + std::to_string(me), "here\n");
  const long long deadline = monotonic_ns() + timeout.count() * ns_per_ms;
  for (int p = 0; p < parties; ++p) {
    const long long left_ms = (deadline - monotonic_ns()) / ns_per_ms;
    if (left_ms < 0 || !wait_for_file(dir + "/" + tag + "." + std::to_string(p),
                                      std::chrono::milliseconds(left_ms)))
      return false;
  }
  return true;
}

/// A database on `url` with table prefix `prefix` and `pool` pooled connections.
database open_db(const std::string& url, const std::string& prefix, std::size_t pool);

/// Drops the test's own tables when the test ends, each best effort (the harness drops only
/// dblock's tables, "counter" and "items"; on SQLite the whole file goes away anyway).
struct table_cleanup {
  const context& ctx;
  std::vector<std::string> names;
  ~table_cleanup();
  /// Adds a table to drop and returns its name.
  std::string add(const std::string& name) {
    names.push_back(name);
    return name;
  }
};

/// The code of the dblock::error that `f` throws, or nothing when it returns.
template <class F>
std::optional<errc> code_of(F&& f) {
  try {
    f();
  } catch (const dblock::error& e) {
    return e.kind();
  }
  return std::nullopt;
}

/// The code of the dblock::error that `wait(c)` throws when another thread cancels `c` after
/// `delay` (nothing when it returns).
inline std::optional<errc> code_when_cancelled(
    std::chrono::milliseconds delay, const std::function<void(const cancellation&)>& wait) {
  cancellation cancel;
  std::thread canceller = run_after(delay, [&] { cancel.cancel(); });
  auto code = code_of([&] { wait(cancel); });
  canceller.join();
  return code;
}

/// Checks that `wait()` gives up with errc::timeout, with `says` in its message, no sooner than
/// `at_least_ms` after it began; FAILs with `got_in` when it returns instead.
inline void check_times_out(const std::function<void()>& wait, const std::string& says,
                            long long at_least_ms, const std::string& got_in) {
  const long long t0 = monotonic_ns();
  try {
    wait();
    FAIL(got_in);
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK(std::string(e.what()).find(says) != std::string::npos);
  }
  CHECK((monotonic_ns() - t0) / ns_per_ms >= at_least_ms);
}

/// A lease of `name` through its own lease_lock, taken at once with try_acquire() (REQUIRE: the
/// test stops when it is not granted) and held until this is destroyed or `guard` released.
struct held_lease {
  held_lease(const database& db, const std::string& name, const lease_options& options = {})
      : lock(db, name, options), guard(lock.try_acquire()) {
    REQUIRE(guard);
  }
  lease_lock lock;
  std::optional<lease_guard> guard;
};

/// Campaigns through `e`, which must win at once (REQUIRE), and checks that election::observe()
/// then shows `identity` as the leader of `e`'s election; returns the leadership, held.
inline leadership win_observed(const database& db, election& e, const std::string& identity) {
  auto lead = e.try_campaign();
  REQUIRE(lead);
  auto seen = election::observe(db, e.name());
  REQUIRE(seen);
  CHECK(seen->identity == identity);
  return std::move(*lead);
}

/// How many milliseconds `wait()` took while another thread ran `end()` after `delay` (a release
/// that ends the wait); the clock starts before that thread does.
inline long long ms_until_ended(std::chrono::milliseconds delay, const std::function<void()>& end,
                                const std::function<void()>& wait) {
  const long long t0 = monotonic_ns();
  std::thread ender = run_after(delay, end);
  wait();
  const long long ms = (monotonic_ns() - t0) / ns_per_ms;
  ender.join();
  return ms;
}

}  // namespace dblock::test

/// Skips the rest of the current test body (see dblock::test::skip()).
#define DBLOCK_SKIP(WHY)       \
  do {                         \
    ::dblock::test::skip(WHY); \
    return;                    \
  } while (false)

#define DBLOCK_CAT2(a, b) a##b
#define DBLOCK_CAT(a, b) DBLOCK_CAT2(a, b)

#define DBLOCK_TEST_CASE_ON(BACKEND, FN, NAME, TAGS)       \
  TEST_CASE(NAME " <" BACKEND ">", TAGS "[" BACKEND "]") { \
    ::dblock::test::run_on(BACKEND, FN);                   \
  }

/// A test body run on all three backends; `ctx` is a dblock::test::context&.
#define DBLOCK_TEST(NAME, TAGS) DBLOCK_TEST_IMPL(DBLOCK_CAT(dblock_body_, __LINE__), NAME, TAGS)
#define DBLOCK_TEST_IMPL(FN, NAME, TAGS)            \
  static void FN(::dblock::test::context& ctx);     \
  DBLOCK_TEST_CASE_ON("postgresql", FN, NAME, TAGS) \
  DBLOCK_TEST_CASE_ON("mysql", FN, NAME, TAGS)      \
  DBLOCK_TEST_CASE_ON("sqlite", FN, NAME, TAGS)     \
  static void FN([[maybe_unused]] ::dblock::test::context& ctx)

/// A test body run on the two client/server backends only (phenomena SQLite does not have).
#define DBLOCK_TEST_SERVERS(NAME, TAGS) \
  DBLOCK_TEST_SERVERS_IMPL(DBLOCK_CAT(dblock_body_, __LINE__), NAME, TAGS)
#define DBLOCK_TEST_SERVERS_IMPL(FN, NAME, TAGS)    \
  static void FN(::dblock::test::context& ctx);     \
  DBLOCK_TEST_CASE_ON("postgresql", FN, NAME, TAGS) \
  DBLOCK_TEST_CASE_ON("mysql", FN, NAME, TAGS)      \
  static void FN([[maybe_unused]] ::dblock::test::context& ctx)

/// A test body run on two of the backends (`A` and `B`, e.g. "postgresql" and "sqlite").
#define DBLOCK_TEST_ON_TWO(A, B, NAME, TAGS) \
  DBLOCK_TEST_ON_TWO_IMPL(DBLOCK_CAT(dblock_body_, __LINE__), A, B, NAME, TAGS)
#define DBLOCK_TEST_ON_TWO_IMPL(FN, A, B, NAME, TAGS) \
  static void FN(::dblock::test::context& ctx);       \
  DBLOCK_TEST_CASE_ON(A, FN, NAME, TAGS)              \
  DBLOCK_TEST_CASE_ON(B, FN, NAME, TAGS)              \
  static void FN([[maybe_unused]] ::dblock::test::context& ctx)

/// A test body for one backend.
#define DBLOCK_TEST_ONLY(BACKEND, NAME, TAGS) \
  DBLOCK_TEST_ONLY_IMPL(DBLOCK_CAT(dblock_body_, __LINE__), BACKEND, NAME, TAGS)
#define DBLOCK_TEST_ONLY_IMPL(FN, BACKEND, NAME, TAGS) \
  static void FN(::dblock::test::context& ctx);        \
  DBLOCK_TEST_CASE_ON(BACKEND, FN, NAME, TAGS)         \
  static void FN([[maybe_unused]] ::dblock::test::context& ctx)

/// Registers a worker function `int NAME(const std::vector<std::string>& args)`.
#define DBLOCK_WORKER(NAME)                                                                 \
  static int NAME(const std::vector<std::string>& args);                                    \
  static ::dblock::test::worker_registration DBLOCK_CAT(NAME, _registration)(#NAME, &NAME); \
  static int NAME([[maybe_unused]] const std::vector<std::string>& args)
