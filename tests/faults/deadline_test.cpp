// Promise D1 (docs/safety.md TD1, docs/safety.md "Deadlines"): no call outlives its deadline,
// whatever the database does. Each scenario holds a lease, then injects its fault and times
// every kind of call against its documented bound (a lease's calls and try_acquire: TTL less the
// safety margin; acquire(wait): its wait; reads: call_timeout), allowing 1 s on top:
//   - a network black hole (the loopback proxy forwards nothing and keeps the sockets open);
//   - a foreign transaction holding the lease row (SQLite: the database's write lock);
//   - the server frozen with SIGSTOP (serial: it stops the shared server), with a fenced counter
//     workload running across the freeze: afterwards no acknowledged write is missing and no
//     write is present that was neither acknowledged nor reported in_doubt.
// Each scenario proves its fault happened (the calls fail; the sentinel counted interrupts).
// Negative controls: with the sentinel off (as before deadlines) a call into the black hole, and
// one into the frozen server, are still running 2 s after their bound.
#include <signal.h>
#include <soci/soci.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dblock/admin.hpp"
#include "fault_support.hpp"
#include "harness.hpp"
#include "proxy.hpp"
#include "storage/deadline.hpp"

using namespace dblock::test::faults;

namespace {

using steady = std::chrono::steady_clock;

// The leases live 10 s in the database but are bounded like a 2 s lease (TTL less safety
// margin: 1.8 s), so that a lease stays ours through the sequence of calls that each wait out
// their bound.
constexpr milliseconds ttl{10000};
constexpr milliseconds margin{8200};
constexpr milliseconds bound = ttl - margin;
constexpr milliseconds wait{1500};
constexpr milliseconds read_timeout{2500};  // database_options::call_timeout in these tests
// How late past its bound a call may return: the sentinel's wake-up and the call's unwinding,
// 1 s plus 200 round trips at the pace measured before each fault (warm()), so that a loaded or
// instrumented machine does not fail a check that is about the deadline firing at all.
milliseconds slack{1000};

struct outcome {
  long long ms = 0;
  bool threw = false;
  std::string what;
  errc code = errc::backend_error;
};

template <class F>
outcome timed(F&& f) {
  outcome o;
  const auto t0 = steady::now();
  try {
    f();
  } catch (const error& e) {
    o.threw = true;
    o.what = e.what();
    o.code = e.kind();
  } catch (const std::exception& e) {
    o.threw = true;
    o.what = e.what();
  }
  o.ms = std::chrono::duration_cast<milliseconds>(steady::now() - t0).count();
  return o;
}

// Renewal failures seen by the watchdog, with when.
struct renew_watch : listener {
  std::atomic<long long> first_failure_ns{0};
  void renew_failed(std::string_view, const error&) override {
    long long zero = 0;
    first_failure_ns.compare_exchange_strong(zero, monotonic_ns());
  }
};

database_options test_options(const context& ctx, std::shared_ptr<listener> events = nullptr) {
  database_options o = ctx.options();
  o.pool_size = 12;
  o.call_timeout = read_timeout;
  o.events = std::move(events);
  return o;
}

lease_options short_lease(bool watchdog = false) {
  lease_options lo;
  lo.ttl = watchdog ? milliseconds(2000) : ttl;  // the watchdog's: renewed often, bound 1.8 s
  lo.safety_margin = watchdog ? milliseconds(200) : margin;
  lo.watchdog = watchdog;
  return lo;
}

// Every kind of call while the fault holds; each must end by its bound + the slack, and fail (the
// fault is real). `held` is a lease taken before the fault. `reader` is a handle of one pooled
// connection opened before the fault: its list_locks() meets an open connection, which the
// deadline has to cut (db's may have to connect, which ends at the deadline on its own).
void calls_end_by_deadline(const std::string& fault, database& db, lease_guard& held,
                           const std::string& contended, bool everything_fails, database& reader) {
  const std::string name2 = "dl-other-" + random_suffix();
  struct call {
    std::string name;
    milliseconds limit;
    std::function<void()> run;
  };
  lease_lock other(db, name2, short_lease());
  lease_lock rival(db, contended, short_lease());
  std::string answer;  // what a call that returned answered
  const std::vector<call> calls = {
      {"try_acquire", bound,
       [&] {
         auto got = other.try_acquire();
         answer = got ? "acquired, fence " + std::to_string(got->fence()) : "refused (held)";
       }},
      {"acquire(1500 ms) of the held name", wait, [&] { (void)rival.acquire(wait); }},
      {"renew", bound, [&] { held.renew(); }},
      {"fenced", bound, [&] { held.fenced([&](soci::session& sql) { sql << "SELECT 1"; }); }},
      {"list_locks", read_timeout, [&] { (void)list_locks(db); }},
      {"list_locks on an open connection", read_timeout, [&] { (void)list_locks(reader); }},
      {"release", bound, [&] { held.release(); }},
  };
  for (const auto& c : calls) {
    answer = "returned";
    const long long fired_before = detail::deadlines_fired();
    const outcome o = timed(c.run);
    INFO(fault << ": " << c.name << " took " << o.ms << " ms (bound " << c.limit.count() << " ms + "
               << slack.count() << " ms slack); " << (o.threw ? o.what : "no error: " + answer)
               << "; deadlines fired meanwhile: " << detail::deadlines_fired() - fired_before);
    CHECK(o.ms <= (c.limit + slack).count());
    const bool touches_held_row = c.name != "try_acquire" && c.name.rfind("list_locks", 0) != 0;
    if (everything_fails || touches_held_row) CHECK(o.threw);  // the fault is real
    if (o.threw && c.name != "acquire(1500 ms) of the held name" && c.name != "try_acquire")
      CHECK(o.code != errc::lease_lost);  // the lease was never lost, only unreachable
    // A read that did not finish by its deadline is a timeout (database_options::call_timeout,
    // docs/safety.md), as an acquire whose wait ran out is: also when the connection had to be
    // cut (a frozen server never answers the cancel request); it was connection_lost.
    if (o.threw && c.name.rfind("list_locks", 0) == 0) CHECK(o.code == errc::timeout);
  }
}

// Opens `n` pooled connections, so that each call under the fault meets an open one (a
// statement in flight is cut off) rather than a connect (bounded on its own).
void calibrate(const database& db) {
  slack = milliseconds(1000 + 200 * median_round_trip_us(db) / 1000);
}

// A handle of one pooled connection, open now (see calls_end_by_deadline()).
database open_reader(const std::string& url, const context& ctx) {
  database_options o = test_options(ctx);
  o.pool_size = 1;
  database reader(url, o);
  reader.ping();
  return reader;
}

void warm(database& db, int n) {
  std::vector<database::connection> held;
  for (int i = 0; i < n; ++i)
    held.push_back(db.connect());
  held.clear();
  calibrate(db);
}

// The server's processes (the postmaster or mariadbd, and their children).
std::vector<pid_t> server_pids(const std::string& backend) {
  const std::string pid_file = backend == "postgresql"
                                   ? env_or_fail("DBLOCK_TEST_PG_DATA") + "/postmaster.pid"
                                   : env_or_fail("DBLOCK_TEST_MYSQL_PID_FILE");
  std::vector<pid_t> out;
  std::ifstream in(pid_file);
  long long pid = 0;
  if (!(in >> pid) || pid <= 0) return out;
  out.push_back(static_cast<pid_t>(pid));
  FILE* p = ::popen(("pgrep -P " + std::to_string(pid)).c_str(), "r");
  if (p) {
    long long child = 0;
    while (std::fscanf(p, "%lld", &child) == 1)
      out.push_back(static_cast<pid_t>(child));
    ::pclose(p);
  }
  return out;
}

// True when every thread of the process is stopped ('T' or 't' in /proc/<pid>/task/*/stat).
bool process_stopped(pid_t pid) {
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  int seen = 0;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(t.path() / "stat");
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos || close + 2 >= line.size()) continue;  // the thread ended
    const char st = line[close + 2];
    if (st != 'T' && st != 't') return false;
    ++seen;
  }
  return !ec && seen > 0;
}

// SIGSTOP of the whole server for the life of the object (SIGCONT in any case at the end).
// `stopped` says that every process was seen stopped before the calls begin: kill() only queues
// the signal, and on a loaded machine the stop may take effect later.
struct frozen_server {
  std::vector<pid_t> pids;
  bool stopped = false;
  explicit frozen_server(const std::string& backend) : pids(server_pids(backend)) {
    for (pid_t p : pids)
      ::kill(p, SIGSTOP);
    const auto until = steady::now() + milliseconds(3000);
    while (!stopped && steady::now() < until) {
      stopped = !pids.empty() && std::all_of(pids.begin(), pids.end(), process_stopped);
      if (!stopped) std::this_thread::sleep_for(milliseconds(1));
    }
  }
  void thaw() {
    for (pid_t p : pids)
      ::kill(p, SIGCONT);
    pids.clear();
  }
  ~frozen_server() { thaw(); }
};

// A call with the sentinel off must still be running `limit` + 2 s after it began; `end`
// then ends the fault so that it returns.
void hangs_without_deadlines(database& db, const std::function<void()>& end,
                             const lease_options& lo = short_lease(),
                             lease_mode mode = lease_mode::row) {
  lease_lock l(db, "dl-control-" + random_suffix(), lo, mode);
  detail::set_deadlines_enforced(false);
  std::atomic<bool> returned{false};
  std::string answer = "acquired";
  std::thread t([&] {
    try {
      if (!l.try_acquire()) answer = "refused";
    } catch (const std::exception& e) {
      answer = e.what();
    }
    returned.store(true);
  });
  std::this_thread::sleep_for(bound + milliseconds(2000));
  const bool hung = !returned.load();
  detail::set_deadlines_enforced(true);
  end();
  t.join();
  INFO("with the sentinel off, try_acquire was " << (hung ? "still running" : "already back") << " "
                                                 << (bound + milliseconds(2000)).count()
                                                 << " ms after it began; it answered: " << answer);
  CHECK(hung);
}

lease_options session_lease() {
  lease_options lo = short_lease();
  return lo;
}

// A session lease held on `db` (`lk`'s), a rival handle of its name, and another name in
// session mode, free (its try is the lock statement alone).
struct session_hold {
  std::string name;
  lease_lock lk, other, rival;
  std::optional<lease_guard> g;
  std::int64_t fence = 0;
  session_hold(database& db, const std::string& tag)
      : name(tag + random_suffix()),
        lk(db, name, session_lease(), lease_mode::session),
        other(db, tag + "o-" + random_suffix(), session_lease(), lease_mode::session),
        rival(db, name, session_lease(), lease_mode::session) {
    other.try_acquire()->release();
    g = lk.try_acquire();
    REQUIRE(g);
    fence = g->fence();
  }
};

// Session-mode calls into a fault in place (`other`'s name is marked and free, `rival`'s is the
// one `held` holds): each ends by its bound + the slack (an acquire: its wait) and fails.
void session_calls_end_by_deadline(const std::string& fault, session_hold& h) {
  lease_lock &other = h.other, &rival = h.rival;
  lease_guard& held = *h.g;
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"try_acquire", [&] { (void)other.try_acquire(); }},
      {"acquire(1500 ms) of the held name", [&] { (void)rival.acquire(wait); }},
      {"renew", [&] { held.renew(); }},
      {"fenced", [&] { held.fenced([](soci::session& sql) { sql << "SELECT 1"; }); }},
      {"release", [&] { held.release(); }}};
  for (const auto& [what, run] : calls) {
    const outcome o = timed(run);
    const milliseconds limit = what.rfind("acquire(", 0) == 0 ? wait : bound;
    INFO(fault << ": session-mode " << what << " took " << o.ms << " ms (bound " << limit.count()
               << " ms + " << slack.count() << " ms); " << (o.threw ? o.what : "no error"));
    CHECK(o.ms <= (limit + slack).count());
    CHECK(o.threw);  // the fault is real
  }
}

// `sql`, another client's connection, opens a transaction that holds `name`'s lock row in `db`'s
// table locked (SQLite: the whole database's write lock) until it is rolled back.
void lock_row_elsewhere(const context& ctx, const database& db, soci::session& sql,
                        const std::string& name) {
  if (ctx.backend == "sqlite") {
    sql << "BEGIN IMMEDIATE";
    return;
  }
  sql << "BEGIN";
  std::string got;
  sql << "SELECT resource_name FROM " << db.lock_table() << " WHERE resource_name = '" << name
      << "' FOR UPDATE",
      soci::into(got);
  REQUIRE(got == name);  // the fault is in place
}

}  // namespace

DBLOCK_TEST_SERVERS("deadline: behind a network black hole every call returns by its deadline",
                    "[faults][deadline]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  auto watch = std::make_shared<renew_watch>();
  database db(url_via(ctx.url, proxy.port()), test_options(ctx, watch));
  db.ping();
  const std::string name = "dl-bh-" + random_suffix();
  lease_lock lk(db, name, short_lease());
  auto g = lk.try_acquire();
  REQUIRE(g);
  lease_lock watched(db, "dl-bh-w-" + random_suffix(), short_lease(true));
  auto gw = watched.try_acquire();
  REQUIRE(gw);
  warm(db, 8);
  database reader = open_reader(url_via(ctx.url, proxy.port()), ctx);
  const long long fired_before = detail::deadlines_fired();
  const long long t0 = monotonic_ns();
  proxy.set_blackhole(true);
  calls_end_by_deadline("black hole", db, *g, name, true, reader);
  // The watchdog's batch into the black hole failed by its bound too (it would hang for ever
  // otherwise, and no failure would ever be reported).
  const long long first = watch->first_failure_ns.load();
  INFO("first renewal failure of the watchdog " << (first ? (first - t0) / 1000000 : -1)
                                                << " ms into the black hole");
  CHECK(first > 0);
  CHECK((first - t0) / 1000000 <= (milliseconds(2000) + bound + slack).count());
  CHECK(detail::deadlines_fired() > fired_before);  // the sentinel did stop them
  // Negative control: the same call, the sentinel off, hangs. On a handle of its own, whose one
  // connection is open before the black hole: the control's thread takes the first free slot of
  // a pool, and db's may be one the deadlines cut (the watchdog's renewals into the black hole
  // cut some): a call that has to connect returns at its deadline without the sentinel.
  proxy.set_blackhole(false);
  gw.reset();
  database control = open_reader(url_via(ctx.url, proxy.port()), ctx);
  proxy.set_blackhole(true);
  hangs_without_deadlines(control, [&] {
    proxy.set_blackhole(false);
    proxy.cut_all();
  });
  // Recovery: the path is back.
  lease_lock after(db, "dl-bh-after-" + random_suffix(), short_lease());
  CHECK(after.try_acquire().has_value());
}

// The same black hole for session leases (docs/session-leases.md), whose calls use the holding
// session's pinned connection: each ends by its bound + the slack and fails, the connections it cut
// off are never reused, and once the path is back the server has ended the held session: the name
// is free, at a greater fence. Negative control: a session try with the sentinel off hangs.
DBLOCK_TEST_SERVERS(
    "deadline: session leases behind a network black hole return by their deadlines",
    "[faults][deadline][session_lease]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  database db(url_via(ctx.url, proxy.port()), test_options(ctx));
  db.ping();
  const lease_options lo = session_lease();
  session_hold h(db, "dl-sbh-");
  warm(db, 8);
  const long long fired_before = detail::deadlines_fired();
  proxy.set_blackhole(true);
  session_calls_end_by_deadline("black hole", h);
  CHECK(detail::deadlines_fired() > fired_before);
  // The control on a handle of its own whose one connection is open before the black hole, as
  // the durable one's: db's free slot may be one a deadline cut, and a connect returns at its
  // deadline without the sentinel ("could not connect ... within the call's deadline").
  proxy.set_blackhole(false);
  database control = open_reader(url_via(ctx.url, proxy.port()), ctx);
  proxy.set_blackhole(true);
  hangs_without_deadlines(
      control,
      [&] {
        proxy.set_blackhole(false);
        proxy.cut_all();
      },
      lo, lease_mode::session);
  // The path is back: the server ends the sessions the proxy held (at once, or at the TTL).
  lease_lock after(ctx.db, h.name, lo, lease_mode::session);
  auto a = after.acquire(ttl + slack);
  CHECK(a.fence() > h.fence);
}

DBLOCK_TEST(
    "deadline: a foreign transaction holding the lease row blocks no call past its "
    "deadline",
    "[faults][deadline]") {
  database db(ctx.url, test_options(ctx));
  const std::string name = "dl-row-" + random_suffix();
  lease_lock lk(db, name, short_lease());
  auto g = lk.try_acquire();
  REQUIRE(g);
  calibrate(db);
  database reader = open_reader(ctx.url, ctx);
  // Another client locks the row (SQLite: the whole database's write lock) and never commits.
  database foreign_db(ctx.url, ctx.options());
  auto foreign = foreign_db.connect();
  soci::session& sql = foreign.session();
  lock_row_elsewhere(ctx, db, sql, name);
  calls_end_by_deadline("foreign row lock", db, *g, name, false, reader);
  sql << "ROLLBACK";
}

// One fenced write for every kind (src/lease/fenced.hpp): a lock set's write waits for its rows no
// longer than its leases' bound (TTL less the safety margin), as a lease guard's does, however
// long the database's call_timeout (20 s here, which bounded it before: the test then took 20 s).
DBLOCK_TEST("deadline: a lock set's fenced write ends by its leases' bound, not call_timeout",
            "[faults][deadline][lock_set]") {
  database_options o = test_options(ctx);
  o.call_timeout = milliseconds(20000);
  database db(ctx.url, o);
  const std::string a = "dl-set-a-" + random_suffix(), b = "dl-set-b-" + random_suffix();
  lock_set set(db, {a, b}, short_lease());
  auto g = set.try_acquire();
  REQUIRE(g);
  calibrate(db);
  // Another client locks the second lease's row (SQLite: the database's write lock).
  database foreign_db(ctx.url, ctx.options());
  auto foreign = foreign_db.connect();
  soci::session& sql = foreign.session();
  lock_row_elsewhere(ctx, db, sql, b);
  const outcome out = timed([&] { g->fenced([](soci::session& s) { s << "SELECT 1"; }); });
  sql << "ROLLBACK";
  INFO("the lock set's fenced write took " << out.ms << " ms (bound " << bound.count() << " ms + "
                                           << slack.count() << " ms slack); "
                                           << (out.threw ? out.what : "no error"));
  CHECK(out.threw);  // the fault is real: the row stayed locked past the bound
  CHECK(out.code != errc::lease_lost);
  CHECK(out.ms <= (bound + slack).count());
  // Both leases are still ours, and the write goes through once the row is free.
  int wrote = 0;
  g->fenced([&](soci::session& s) { s << "SELECT 1", soci::into(wrote); });
  CHECK(wrote == 1);
}

DBLOCK_TEST_SERVERS(
    "deadline: a frozen server (SIGSTOP) stops no call past its deadline; the "
    "fenced counter loses and doubles nothing",
    "[faults][deadline][serial]") {
  auto watch = std::make_shared<renew_watch>();
  database db(ctx.url, test_options(ctx, watch));
  const std::string counter = ctx.table("dl_counter"), items = ctx.table("dl_items");
  ctx.exec("CREATE TABLE " + counter + " (id INT PRIMARY KEY, n BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + counter + " (id, n) VALUES (1, 0)");
  ctx.exec("CREATE TABLE " + items + " (item VARCHAR(64) PRIMARY KEY)");
  // Outside the assertion: without the test servers' pid file, server_pids() skips the test.
  const auto pids = server_pids(ctx.backend);
  REQUIRE(!pids.empty());

  // The fenced counter workload, running across the freeze.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::set<std::string> acked, doubtful;
  std::atomic<long long> longest_ms{0};
  const std::string work_lock = "dl-work-" + random_suffix();
  auto worker = [&](int id) {
    database wdb(ctx.url, test_options(ctx));
    lease_lock l(wdb, work_lock, short_lease());
    for (int seq = 0; !stop.load(); ++seq) {
      const std::string item = std::to_string(id) + "-" + std::to_string(seq);
      bool ok = false, doubt = false;
      const outcome o = timed([&] {
        auto g = l.acquire(wait);
        try {
          g.fenced([&](soci::session& s) {
            s << "UPDATE " << counter << " SET n = n + 1 WHERE id = 1";
            s << "INSERT INTO " << items << " (item) VALUES ('" << item << "')";
          });
          ok = true;
        } catch (const error& e) {
          doubt = e.code() == errc::in_doubt || e.code() == errc::connection_lost;
          throw;
        }
      });
      long long prev = longest_ms.load();
      while (o.ms > prev && !longest_ms.compare_exchange_weak(prev, o.ms)) {
      }
      std::lock_guard<std::mutex> lk(mu);
      if (ok) acked.insert(item);
      if (doubt) doubtful.insert(item);
      if (o.threw) std::this_thread::sleep_for(milliseconds(20));
    }
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i)
    workers.emplace_back(worker, i);
  std::this_thread::sleep_for(milliseconds(500));

  const std::string name = "dl-frozen-" + random_suffix();
  lease_lock lk(db, name, short_lease());
  auto g = lk.try_acquire();
  REQUIRE(g);
  lease_lock watched(db, "dl-frozen-w-" + random_suffix(), short_lease(true));
  auto gw = watched.try_acquire();
  REQUIRE(gw);
  // For the negative control: a connection opened before the freeze (a new one would wait for
  // its connect, which is bounded on its own).
  database control(ctx.url, test_options(ctx));
  control.ping();
  warm(db, 8);
  database reader = open_reader(ctx.url, ctx);
  const long long fired_before = detail::deadlines_fired();
  {
    frozen_server frozen(ctx.backend);
    REQUIRE(frozen.stopped);  // the fault is in place before the first call
    const long long t0 = monotonic_ns();
    calls_end_by_deadline("frozen server", db, *g, name, true, reader);
    const long long first = watch->first_failure_ns.load();
    INFO("first renewal failure of the watchdog " << (first ? (first - t0) / 1000000 : -1)
                                                  << " ms into the freeze");
    CHECK(first > 0);
    CHECK(detail::deadlines_fired() > fired_before);
    gw.reset();  // its release fails by its deadline too
    // Negative control: with the sentinel off, a call into the frozen server hangs until
    // SIGCONT.
    hangs_without_deadlines(control, [&] { frozen.thaw(); });
  }
  auto acked_count = [&] {
    std::lock_guard<std::mutex> lk(mu);
    return acked.size();
  };
  const std::size_t acked_at_thaw = acked_count();
  std::this_thread::sleep_for(milliseconds(1500));  // the workload recovers
  // On a loaded machine the workload may have acknowledged nothing yet (none before the freeze,
  // and a lease the freeze left behind lasts its 10 s): it runs on until it acknowledges a write
  // after the thaw, at most a minute more, rather than fail "acked > 0". Lost and phantom writes
  // are counted strictly below whatever the pace.
  wait_for_progress([&] { return acked_count() > acked_at_thaw; }, std::chrono::seconds(60));
  stop.store(true);
  for (auto& t : workers)
    t.join();
  // Every call of the workload ended by its bound too (an acquire: its wait, then its fenced
  // write: the lease's bound), the thaw aside (the control's freeze ran 2 s past a bound).
  INFO("longest workload iteration " << longest_ms.load() << " ms");

  // No lost and no doubled write: every acknowledged item is there, and nothing is there that
  // was neither acknowledged nor reported in doubt; the counter is the number of items.
  database check(ctx.url, ctx.options());
  auto conn = check.connect();
  soci::session& sql = conn.session();
  long long n = 0;
  sql << "SELECT n FROM " << counter << " WHERE id = 1", soci::into(n);
  soci::rowset<std::string> rs = (sql.prepare << "SELECT item FROM " << items);
  std::set<std::string> present(rs.begin(), rs.end());
  long long lost = 0, phantom = 0;
  for (const auto& a : acked)
    lost += present.count(a) ? 0 : 1;
  for (const auto& p : present)
    phantom += (acked.count(p) || doubtful.count(p)) ? 0 : 1;
  INFO("acknowledged " << acked.size() << " (" << acked_at_thaw << " by the thaw), in doubt "
                       << doubtful.size() << ", present " << present.size() << ", counter " << n);
  CHECK(acked.size() > 0);
  CHECK(lost == 0);
  CHECK(phantom == 0);
  CHECK(n == static_cast<long long>(present.size()));
  report("deadline-frozen-server", ctx.backend, static_cast<long long>(acked.size()),
         static_cast<long long>(acked.size()), lost + phantom,
         "in_doubt=" + std::to_string(doubtful.size()));
}

// The frozen server for session leases: every call on the holding session's pinned connection
// (and a try, and a wait) ends by its bound + the slack and fails; after the thaw the server ends
// the sessions whose connections dblock dropped, and the name is granted at a greater fence.
// Negative control: a session try with the sentinel off is still running 2 s past its bound.
DBLOCK_TEST_SERVERS(
    "deadline: session leases into a frozen server (SIGSTOP) return by their deadlines",
    "[faults][deadline][session_lease][serial]") {
  database db(ctx.url, test_options(ctx));
  const lease_options lo = session_lease();
  session_hold h(db, "dl-sfz-");
  database control(ctx.url, test_options(ctx));
  control.ping();  // a connection opened before the freeze
  warm(db, 8);
  const long long fired_before = detail::deadlines_fired();
  {
    frozen_server frozen(ctx.backend);
    REQUIRE(frozen.stopped);  // the fault is in place before the first call
    session_calls_end_by_deadline("frozen server", h);
    CHECK(detail::deadlines_fired() > fired_before);
    hangs_without_deadlines(
        control, [&] { frozen.thaw(); }, lo, lease_mode::session);
  }
  lease_lock after(ctx.db, h.name, lo, lease_mode::session);
  auto a = after.acquire(ttl + slack);
  CHECK(a.fence() > h.fence);
}
