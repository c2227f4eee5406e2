// Opening databases from URLs: connection, pool, and clear connection errors.
#include <soci/soci.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/url.hpp"
#include "dblock/version.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "test_paths.hpp"

using dblock::errc;

namespace {
// The configured URL with another password (or user).
std::string with_credentials(const std::string& url, const std::string& user,
                             const std::string& password) {
  auto u = dblock::detail::parse_url(url);
  std::string out = u.scheme + "://" + user + ":" + password + "@" + u.host;
  if (u.port) out += ":" + std::to_string(*u.port);
  return out + "/" + u.path;
}

// Removes an SQLite database file and its WAL files when it goes out of scope.
struct unlink_after {
  std::string n;
  ~unlink_after() {
    for (const char* ext : {"", "-wal", "-shm"})
      ::unlink((n + ext).c_str());
  }
};
}  // namespace

DBLOCK_TEST("a database handle connects lazily and pings", "[database]") {
  dblock::database db(ctx.url);
  CHECK(db.backend() == ctx.backend);
  CHECK_NOTHROW(db.ping());
  auto c = db.connect();
  int two = 0;
  c.session() << "SELECT 1 + 1", soci::into(two);
  CHECK(two == 2);
}

DBLOCK_TEST("database::server names the server and its version as the server reports them",
            "[database]") {
  dblock::database db(ctx.url);
  const dblock::server_info info = db.server();
  std::string reported;
  auto c = db.connect();
  if (ctx.backend == "postgresql") {
    CHECK(info.product == "PostgreSQL");
    c.session() << "SHOW server_version", soci::into(reported);
  } else if (ctx.backend == "mysql") {
    // The test servers are MariaDB's (Debian 12 ships no MySQL 8 server); the MySQL 8 flavor
    // run keeps the server's own name.
    CHECK(info.product == "MariaDB");
    c.session() << "SELECT @@version", soci::into(reported);
  } else {
    CHECK(info.product == "SQLite");
    c.session() << "SELECT sqlite_version()", soci::into(reported);
  }
  INFO("reported " << reported << ", kept " << info.version);
  CHECK(!info.version.empty());
  CHECK(info.version == reported);
}

DBLOCK_TEST("the pool hands out at most pool_size connections", "[database]") {
  dblock::database_options o;
  o.pool_size = 2;
  o.pool_wait = std::chrono::milliseconds(200);
  dblock::database db(ctx.url, o);
  auto a = db.connect();
  auto b = db.connect();
  try {
    auto c = db.connect();
    FAIL("a third connection was handed out");
  } catch (const dblock::error& e) {
    // The pool's own limit has a code of its own, not a contended wait's.
    CHECK(e.code() == errc::pool_exhausted);
    CHECK(e.code() != errc::timeout);
    CHECK(std::string(e.what()).find("pool_size 2") != std::string::npos);
  }
  { auto moved = std::move(a); }  // returned to the pool
  CHECK_NOTHROW(db.connect());
}

// The caller closes the session it borrowed: given back, the slot is reopened on its next use
// (it crashed the library). Not on SQLite, where closing a connection that dblock's cached
// statements still use fails (SQLITE_BUSY) and leaks it.
DBLOCK_TEST_ON_TWO("postgresql", "mysql",
                   "a connection whose session the caller closed is reopened, not handed on",
                   "[database]") {
  dblock::database_options o = ctx.options();
  o.pool_size = 1;
  dblock::database db = ctx.open(o);
  {
    auto c = db.connect();
    c.session().close();
  }
  dblock::lease_lock lock(db, "closed-" + dblock::test::random_suffix());
  auto g = lock.try_acquire();
  CHECK(g);
  int one = 0;
  db.connect().session() << "SELECT 1", soci::into(one);
  CHECK(one == 1);
}

// connect() and transactions borrowed their connection armed with call_timeout: with the
// defaults (pool_wait = call_timeout = 30 s) a full pool was errc::timeout, not pool_exhausted
// as transaction.hpp and database.hpp say.
DBLOCK_TEST("a full pool is pool_exhausted for connect() and transactions, whatever call_timeout",
            "[database]") {
  dblock::database_options o = ctx.options();
  o.pool_size = 1;
  o.pool_wait = std::chrono::milliseconds(300);
  o.call_timeout = o.pool_wait;  // as the defaults: both 30 s
  dblock::database db = ctx.open(o);
  auto held = db.connect();
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"connect()", [&] { (void)db.connect(); }},
      {"transaction", [&] { dblock::transaction t(db); }},
      {"try_lock_resource", [&] { (void)dblock::try_lock_resource(db, "pool-full"); }}};
  for (const auto& [what, call] : calls) {
    INFO(what);
    try {
      call();
      FAIL("got a connection from a full pool");
    } catch (const dblock::error& e) {
      INFO(e.what());
      CHECK(e.code() == errc::pool_exhausted);
    }
  }
}

// The same arming cut a connection handed to the caller at call_timeout after it was borrowed
// (PostgreSQL and MySQL: the socket shut down under an idle session), whereas docs/safety.md
// says such statements have no deadline of dblock's.
DBLOCK_TEST("a connection or transaction of the caller's outlives call_timeout", "[database]") {
  dblock::database_options o = ctx.options();
  o.call_timeout = std::chrono::milliseconds(200);
  dblock::database db = ctx.open(o);
  auto c = db.connect();
  dblock::transaction t(db);
  int one = 0;
  t.session() << "SELECT 1", soci::into(one);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // 4 x call_timeout, + the cut
  one = 0;
  c.session() << "SELECT 1", soci::into(one);
  CHECK(one == 1);
  one = 0;
  t.session() << "SELECT 1", soci::into(one);
  CHECK(one == 1);
  CHECK_NOTHROW(t.commit());
}

DBLOCK_TEST("a call's deadline that ends before pool_wait is its timeout, not pool_exhausted",
            "[database]") {
  dblock::database_options o = ctx.options();
  o.pool_size = 1;
  o.pool_wait = std::chrono::seconds(20);
  dblock::database db = ctx.open(o);
  auto held = db.connect();
  dblock::lease_lock lock(db, "pool-" + dblock::test::random_suffix());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)lock.acquire(std::chrono::milliseconds(100));
    FAIL("acquired without a connection");
  } catch (const dblock::error& e) {
    INFO(e.what());
    CHECK(e.code() == errc::timeout);
  }
  // Bounded by the call (its statements get at least a second), far below pool_wait.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

DBLOCK_TEST_SERVERS("a wrong password gives connection_failed without echoing it",
                    "[database][direct]") {
  auto u = dblock::detail::parse_url(ctx.url);
  dblock::database db(with_credentials(ctx.url, u.user, "Wr0ng-Passw0rd-xyzzy"));
  try {
    db.ping();
    FAIL("connected with a wrong password");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::connection_failed);
    std::string m = e.what();
    CHECK(m.find("Wr0ng-Passw0rd-xyzzy") == std::string::npos);
    CHECK(m.find(":***@") != std::string::npos);
    CHECK(e.backend() == ctx.backend);
  }
}

DBLOCK_TEST_SERVERS("an unreachable server gives connection_failed", "[database]") {
  auto u = dblock::detail::parse_url(ctx.url);
  std::string url = u.scheme + "://" + u.user + ":secret@127.0.0.1:1/" + u.path;
  dblock::database db(url);
  try {
    db.ping();
    FAIL("connected to port 1");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::connection_failed);
    CHECK(std::string(e.what()).find("secret") == std::string::npos);
  }
}

DBLOCK_TEST_ONLY("sqlite", "an unopenable sqlite path gives connection_failed", "[database]") {
  dblock::database db("sqlite:///nonexistent-dir-" + dblock::test::random_suffix() + "/x.db");
  try {
    db.ping();
    FAIL("opened a file in a missing directory");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::connection_failed);
  }
}

DBLOCK_TEST("the database clock moves inside a transaction", "[database][dialect]") {
  auto& d = dblock::test::dialect_of(ctx.db);
  auto c = ctx.db.connect();
  long long a = 0, b = 0;
  // Inside one transaction: PostgreSQL's now() would stand still here, clock_timestamp() moves.
  soci::transaction tx(c.session());
  c.session() << "SELECT " << d.sql.epoch_us(d.sql.now()), soci::into(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.session() << "SELECT " << d.sql.epoch_us(d.sql.now()), soci::into(b);
  tx.commit();
  // Microsecond resolution and moving forward (20 ms apart, allow scheduling slack).
  CHECK(b - a >= 19000);
  CHECK(b - a < 5000000);
  auto sys_us = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  CHECK(std::llabs(sys_us - b) < 60LL * 1000000);  // same host: clocks agree within a minute
}

DBLOCK_TEST("a connection returned inside a transaction is rolled back before reuse",
            "[database]") {
  dblock::database_options o = ctx.options();
  o.pool_size = 1;  // the next connect() gets the very same connection
  auto db = ctx.open(o);
  const std::string begin = dblock::test::dialect_of(db).sql.begin_write();
  ctx.exec("CREATE TABLE " + ctx.table("items") + " (id INTEGER PRIMARY KEY, v INTEGER)");
  {
    auto c = db.connect();
    c.session() << begin;
    c.session() << "INSERT INTO " << ctx.table("items") << " (id, v) VALUES (1, 1)";
  }  // handed back with the transaction open
  auto c = db.connect();
  int n = -1;
  c.session() << "SELECT count(*) FROM " << ctx.table("items"), soci::into(n);
  CHECK(n == 0);
  CHECK_NOTHROW(c.session() << begin);  // not "already in a transaction"
  c.session() << "ROLLBACK";
}

DBLOCK_TEST_SERVERS("a multi-host URL skips a dead host and connects to the next one",
                    "[database][multihost][direct]") {
  auto u = dblock::detail::parse_url(ctx.url);
  REQUIRE(u.port);
  // Port 1 on loopback refuses at once: a dead node. The real server comes second.
  const std::string auth = with_credentials(ctx.url, u.user, *u.password);
  const std::string creds = auth.substr(0, auth.find('@') + 1);
  const std::string hosts = "127.0.0.1:1,127.0.0.1:" + std::to_string(*u.port);
  std::string query;
  auto q = ctx.url.find('?');
  if (q != std::string::npos) query = ctx.url.substr(q);
  dblock::database db(creds + hosts + "/" + u.path + query);
  CHECK_NOTHROW(db.ping());
  // Leases work through it, on every pooled connection (each connects past the dead host).
  dblock::migrate(db);
  dblock::lease_lock lock(db, "multihost/" + ctx.prefix);
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(g->fence() > 0);
  // Negative control: only dead hosts give connection_failed naming every host tried.
  dblock::database dead(creds + "127.0.0.1:1,127.0.0.1:2/" + u.path + query);
  try {
    dead.ping();
    FAIL("connected to dead hosts");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::connection_failed);
    CHECK(std::string(e.what()).find(*u.password) == std::string::npos);
  }
}

// ---- pooler=transaction (PgBouncer's transaction mode, docs/deployment.md) ------------------
// The mode's promises are checked on the direct server here (the pgbouncer entry runs the suite
// through a real PgBouncer): nothing prepared by name, no session setting, the isolation level in
// each BEGIN. The same steps without the key are the negative control.

namespace {

struct session_traces {
  long long prepared = -1;      // named prepared statements on the pooled connection
  std::string session_iso;      // the session's isolation level outside a transaction
  std::string transaction_iso;  // inside a dblock transaction
};

session_traces traces_of(const dblock::test::context& ctx, const std::string& url) {
  auto o = ctx.options();
  o.pool_size = 1;  // one connection: the lease, the transaction and the probes share it
  o.isolation = dblock::isolation_level::repeatable_read;
  dblock::database db(url, o);
  dblock::lease_lock lock(db, "pooler-" + dblock::test::random_suffix());
  lock.try_acquire().value().release();
  session_traces t;
  {
    dblock::transaction tx(db);
    tx.session() << "SHOW transaction_isolation", soci::into(t.transaction_iso);
    tx.commit();
  }
  auto c = db.connect();
  c.session() << "SELECT count(*) FROM pg_prepared_statements", soci::into(t.prepared);
  c.session() << "SHOW transaction_isolation", soci::into(t.session_iso);
  return t;
}

}  // namespace

DBLOCK_TEST_ONLY("postgresql",
                 "pooler=transaction: nothing prepared by name, no session setting, isolation "
                 "in each BEGIN",
                 "[database][pooler][direct]") {
  const std::string sep = ctx.url.find('?') == std::string::npos ? "?" : "&";
  const auto pooled = traces_of(ctx, ctx.url + sep + "pooler=transaction");
  CHECK(pooled.prepared == 0);
  CHECK(pooled.session_iso == "read committed");  // the server's default, untouched
  CHECK(pooled.transaction_iso == "repeatable read");
  // Negative control: a direct connection prepares the lease statements and sets the session.
  const auto direct = traces_of(ctx, ctx.url);
  CHECK(direct.prepared > 0);
  CHECK(direct.session_iso == "repeatable read");
  CHECK(direct.transaction_iso == "repeatable read");
}

namespace {

// dblock's routines on this connection's server session whose text names `table`.
long long routines_on(dblock::database::connection& c, const std::string& table) {
  long long n = -1;
  const std::string pattern = "%" + table + "%";
  c.session() << "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = pg_my_temp_schema()"
                 " AND p.proname LIKE 'dblock\\_lease\\_%' AND p.prosrc LIKE :t",
      soci::use(pattern, "t"), soci::into(n);
  return n;
}

std::string with_pooler(const std::string& url) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "pooler=transaction";
}

}  // namespace

DBLOCK_TEST_ONLY("postgresql",
                 "pooler=transaction: the lease statements run through routines on the server "
                 "session, created again where they are missing",
                 "[database][pooler][direct]") {
  auto o = ctx.options();
  o.pool_size = 1;  // the lease and the probes share one server session
  const std::string table = o.table_prefix + "resource_lock";
  dblock::database db(with_pooler(ctx.url), o);
  dblock::lease_lock lock(db, "routines-" + dblock::test::random_suffix());
  std::int64_t last = 0;
  {
    auto g = lock.try_acquire().value();
    g.renew();
    last = g.fence();
    g.release();
  }
  {
    auto c = db.connect();
    CHECK(routines_on(c, table) == 3);  // acquire, renew, release
    // What a pooler's DISCARD ALL or a new server session leaves: none.
    c.session() << "DISCARD TEMP";
    CHECK(routines_on(c, table) == 0);
  }
  {
    auto g = lock.try_acquire().value();  // created again in the same round trip
    CHECK(g.fence() > last);
    CHECK(g.valid());
    g.renew();
    g.release();
  }
  {
    auto c = db.connect();
    CHECK(routines_on(c, table) == 3);
  }
  // Another lock on a rival handle sees the lease as it should: one grant at a time.
  auto first = lock.try_acquire();
  REQUIRE(first);
  dblock::lease_lock rival(ctx.open(), lock.name());
  CHECK_FALSE(rival.try_acquire());
  first->release();
  CHECK(rival.try_acquire());
  // Negative control: a direct connection prepares its statements and keeps no routine.
  dblock::database direct(ctx.url, o);
  dblock::lease_lock(direct, lock.name() + "-direct").try_acquire().value().release();
  auto c = direct.connect();
  CHECK(routines_on(c, table) == 0);
}

DBLOCK_TEST_ONLY("postgresql",
                 "pooler=transaction without the TEMP privilege: unnamed statements instead of "
                 "routines, the lease cycle unchanged",
                 "[database][pooler][direct]") {
  // The database's owner (the test user) takes TEMP from everyone, itself included, for a moment;
  // a server session checks it when it first creates a temporary object.
  std::string dbname;
  ctx.db.connect().session() << "SELECT current_database()", soci::into(dbname);
  const std::string who = "PUBLIC, CURRENT_USER";
  ctx.exec("REVOKE TEMPORARY ON DATABASE \"" + dbname + "\" FROM " + who);
  struct regrant {
    const dblock::test::context& ctx;
    std::string sql;
    ~regrant() {
      try {
        ctx.exec(sql);
      } catch (...) {
      }
    }
  } restore{ctx, "GRANT TEMPORARY ON DATABASE \"" + dbname + "\" TO " + who};
  auto o = ctx.options();
  o.pool_size = 1;
  dblock::database db(with_pooler(ctx.url), o);
  dblock::lease_lock lock(db, "notemp-" + dblock::test::random_suffix());
  auto g = lock.try_acquire().value();
  g.renew();
  CHECK(g.valid());
  CHECK_FALSE(dblock::lease_lock(ctx.open(), lock.name()).try_acquire());
  g.release();
  CHECK(dblock::lease_lock(ctx.open(), lock.name()).try_acquire());
  auto c = db.connect();
  CHECK(routines_on(c, o.table_prefix + "resource_lock") == 0);
  // Negative control: the privilege is really gone for a new server session.
  dblock::database probe(ctx.url, o);
  CHECK_THROWS(probe.connect().session() << "CREATE TEMPORARY TABLE t_notemp (x int)");
}

TEST_CASE("pooler: bad values and other backends are refused clearly", "[unit][database]") {
  auto code_and_text = [](const std::string& url, dblock::database_options o = {}) {
    try {
      dblock::database db(url, o);
    } catch (const dblock::error& e) {
      return std::make_pair(e.kind(), std::string(e.what()));
    }
    return std::make_pair(errc::backend_error, std::string("accepted"));
  };
  auto r = code_and_text("postgresql://u@h/db?pooler=bogus");
  CHECK(r.first == errc::invalid_argument);
  CHECK(r.second.find("expected none, session or transaction") != std::string::npos);
  r = code_and_text("mysql://u@h/db?pooler=transaction");
  CHECK(r.first == errc::invalid_argument);
  dblock::database_options o;
  o.pooler = dblock::pooler_mode::transaction;
  r = code_and_text("sqlite:///tmp/dblock-pooler-unit.db", o);
  CHECK(r.first == errc::invalid_argument);
  CHECK(r.second.find("PostgreSQL only") != std::string::npos);
  CHECK_NOTHROW(dblock::database("postgresql://u@h/db?pooler=session"));
  CHECK(dblock::database("postgresql://u@h/db?pooler=transaction").options().pooler ==
        dblock::pooler_mode::transaction);
}

TEST_CASE("listen_url: refused where there is no listener, and when not PostgreSQL",
          "[unit][database][waiting]") {
  dblock::database_options o;
  o.listen_url = "postgresql://u@h/db";
  for (const char* url : {"mysql://u@h/db", "sqlite:///tmp/dblock-listen-unit.db"}) {
    INFO(url);
    try {
      dblock::database db(url, o);
      FAIL("accepted");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("PostgreSQL only") != std::string::npos);
    }
  }
  o.listen_url = "mysql://u@h/db";
  CHECK_THROWS_AS(dblock::database("postgresql://u@h/db?pooler=transaction", o), dblock::error);
  o.listen_url = "postgresql://u@h/db";
  CHECK_NOTHROW(dblock::database("postgresql://u@h/db?pooler=transaction", o));
}

namespace {

struct wake_count : dblock::listener {
  std::atomic<int> n{0};
  void woken(std::string_view) override { ++n; }
};

// A waiter on its own handle (as another process would be) behind pooler=transaction: woken by
// the release only when its handle has a direct listen_url. Returns its wake-ups.
int pooled_waiter_wakeups(dblock::test::context& ctx, const std::string& listen_url) {
  auto o = ctx.options();
  dblock::database holder_db(with_pooler(ctx.url), o);
  auto count = std::make_shared<wake_count>();
  o.events = count;
  o.listen_url = listen_url;
  dblock::database waiter_db(with_pooler(ctx.url), o);
  const std::string name = "listen-" + dblock::test::random_suffix();
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);
  dblock::lease_lock holder(holder_db, name, lo), waiter(waiter_db, name, lo);
  auto g = holder.try_acquire().value();
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the waiter is queued
    g.release();
  });
  auto w = waiter.acquire(std::chrono::seconds(20));
  release.join();
  CHECK(w.fence() > 0);
  return count->n.load();
}

}  // namespace

DBLOCK_TEST_ONLY("postgresql",
                 "pooler=transaction: waiters are woken through listen_url, and poll without it",
                 "[database][pooler][direct][waiting]") {
  CHECK(pooled_waiter_wakeups(ctx, ctx.url) >= 1);
  CHECK(pooled_waiter_wakeups(ctx, "") == 0);  // control: no listener behind the pooler
}

// ---- failover window: which TTL survives the loss of a node -----------------------------------

namespace {

std::string with_query(const std::string& url, const std::string& kv) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + kv;
}

struct short_ttl_events : dblock::listener {
  std::mutex mu;
  struct event {
    std::string name;
    long long ttl_ms, min_ttl_ms;
    std::string message;
  };
  std::vector<event> seen;
  void short_ttl(std::string_view name, std::chrono::milliseconds ttl,
                 std::chrono::milliseconds min_ttl, std::string_view message) override {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back({std::string(name), ttl.count(), min_ttl.count(), std::string(message)});
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lk(mu);
    return seen.size();
  }
};

struct warning_log : dblock::listener {
  std::mutex mu;
  std::vector<std::string> warnings;
  void log(dblock::log_level level, std::string_view m) override {
    std::lock_guard<std::mutex> lk(mu);
    if (level == dblock::log_level::warning) warnings.emplace_back(m);
  }
};

// Takes and releases lease `name` with `ttl` on `db`.
void take_once(const dblock::database& db, const std::string& name, std::chrono::milliseconds ttl) {
  dblock::lease_options lo;
  lo.ttl = ttl;
  dblock::lease_lock lk(db, name, lo);
  auto g = lk.try_acquire();
  REQUIRE(g);
  g->release();
}

}  // namespace

TEST_CASE("min_surviving_ttl: the least TTL with 2/3 ttl - margin above the window",
          "[unit][database][failover]") {
  using std::chrono::milliseconds;
  CHECK(dblock::min_surviving_ttl(milliseconds(0)) == milliseconds(0));
  for (long long w : {1LL, 100LL, 3000LL, 4000LL, 6000LL, 30000LL, 86400000LL}) {
    INFO("window " << w);
    // Default margin, ttl/10.
    const long long t = dblock::min_surviving_ttl(milliseconds(w)).count();
    CHECK(2 * t - 3 * std::max(t / 10, 1LL) > 3 * w);
    if (t > 10) CHECK_FALSE(2 * (t - 1) - 3 * std::max((t - 1) / 10, 1LL) > 3 * w);
    CHECK(t >= 10);  // a lease's least TTL
    // An explicit margin.
    const long long e = dblock::min_surviving_ttl(milliseconds(w), milliseconds(500)).count();
    CHECK(2 * e - 1500 > 3 * w);
    if (e > 10) CHECK_FALSE(2 * (e - 1) - 1500 > 3 * w);
  }
  // Galera's default evs.suspect_timeout (5 s) + 1 s: about 10.6 s.
  CHECK(dblock::min_surviving_ttl(std::chrono::seconds(6)) == milliseconds(10588));
}

TEST_CASE("failover_window: the URL key is a duration; anything else is refused clearly",
          "[unit][database][failover]") {
  CHECK(dblock::database("postgresql://u@h/db?failover_window=30s").options().failover_window ==
        std::chrono::seconds(30));
  CHECK(dblock::database("mysql://u@h/db?failover_window=1500ms").options().failover_window ==
        std::chrono::milliseconds(1500));
  CHECK(dblock::database("sqlite:///tmp/dblock-fw-unit.db?failover_window=2m")
            .options()
            .failover_window == std::chrono::minutes(2));
  for (const char* bad : {"30", "-1s", "1.5s", "s", "30sec", "99999999999999s", "3d"}) {
    INFO(bad);
    try {
      dblock::database db(std::string("postgresql://u:secret@h/db?failover_window=") + bad);
      FAIL("accepted");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      const std::string m = e.what();
      CHECK(m.find("failover_window") != std::string::npos);
      CHECK(m.find("30s or 1500ms") != std::string::npos);
      CHECK(m.find("secret") == std::string::npos);
    }
  }
  dblock::database_options o;
  o.failover_window = std::chrono::milliseconds(-1);
  CHECK(dblock::test::code_of([&] { dblock::database db("postgresql://u@h/db", o); }) ==
        errc::invalid_argument);
}

DBLOCK_TEST("failover_window: a lease too short to survive a node loss is reported once per TTL",
            "[database][failover]") {
  using std::chrono::milliseconds;
  auto events = std::make_shared<short_ttl_events>();
  auto o = ctx.options();
  o.events = events;
  dblock::database db(with_query(ctx.url, "failover_window=4s"), o);
  const auto fo = db.failover();
  CHECK(fo.window == std::chrono::seconds(4));
  CHECK(fo.min_ttl == dblock::min_surviving_ttl(std::chrono::seconds(4)));
  CHECK(fo.source.find("failover_window") != std::string::npos);

  const std::string name = "fw-" + dblock::test::random_suffix();
  take_once(db, name, std::chrono::seconds(5));
  REQUIRE(events->count() == 1);
  CHECK(events->seen[0].name == name);
  CHECK(events->seen[0].ttl_ms == 5000);
  CHECK(events->seen[0].min_ttl_ms == fo.min_ttl.count());
  CHECK(events->seen[0].message.find("lease '" + name + "' has a TTL of 5000 ms") !=
        std::string::npos);
  CHECK(events->seen[0].message.find(std::to_string(fo.min_ttl.count()) + " ms survives") !=
        std::string::npos);
  take_once(db, name, std::chrono::seconds(5));  // the same TTL again: already said
  take_once(db, name + "-b", std::chrono::seconds(5));
  CHECK(events->count() == 1);
  take_once(db, name, fo.min_ttl);  // enough: nothing to say
  take_once(db, name, std::chrono::seconds(30));
  CHECK(events->count() == 1);
  take_once(db, name, fo.min_ttl - milliseconds(1));  // another TTL, just short
  CHECK(events->count() == 2);
  // A waiting acquire is reported alike (its grant takes the other path).
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(3);
  auto g = dblock::lease_lock(db, name, lo).acquire(std::chrono::seconds(5));
  CHECK(events->count() == 3);

  // Control: the same server without the window (none of the main suite's servers is a Galera
  // node) knows no window and says nothing.
  auto quiet = std::make_shared<short_ttl_events>();
  o.events = quiet;
  dblock::database plain(ctx.url, o);
  CHECK(plain.failover().window.count() == 0);
  CHECK(plain.failover().min_ttl.count() == 0);
  take_once(plain, name + "-c", std::chrono::milliseconds(100));
  CHECK(quiet->count() == 0);

  // A listener with only log() gets the message as a warning (the default short_ttl()).
  auto logs = std::make_shared<warning_log>();
  o.events = logs;
  dblock::database logged(with_query(ctx.url, "failover_window=4s"), o);
  take_once(logged, name + "-d", std::chrono::seconds(2));
  REQUIRE(logs->warnings.size() == 1);
  CHECK(logs->warnings[0].find("has a TTL of 2000 ms") != std::string::npos);
}

// A relative SQLite path that begins with a space names that file (SOCI's connection-string
// parser would read before the value's start: dblock writes it as "./ name").
DBLOCK_TEST_ONLY("sqlite", "a relative sqlite path beginning with a space opens that file",
                 "[database]") {
  const std::string name = " dblock-space-" + dblock::test::random_suffix(8) + ".db";
  const unlink_after cleanup{name};
  dblock::database db("sqlite://%20" + name.substr(1));
  CHECK_NOTHROW(db.ping());
  CHECK(::access(name.c_str(), F_OK) == 0);
}

// Opens the SQLite file args[0] 150 times, each time on a new handle that inserts a row and closes.
// Exit status: the number of opens that failed, at most 100.
DBLOCK_WORKER(sqlite_open_close_worker) {
  dblock::database_options o;
  o.pool_size = 1;
  int failed = 0;
  for (int i = 0; i < 150; ++i)
    try {
      dblock::database db("sqlite://" + args.at(0), o);
      db.connect().session() << "INSERT INTO t VALUES (1)";
    } catch (const dblock::error& e) {
      if (failed++ == 0) std::fprintf(stderr, "open failed: %s\n", e.what());
    }
  return std::min(failed, 100);
}

// The last connection to close a WAL database checkpoints it under an exclusive lock, so a
// connection that another process opens at that moment finds the database busy on its first
// statement. Opening waits for that as for any busy database (the flash_sale example's 8 processes
// failed about 1 run in 10 when it did not).
DBLOCK_TEST_ONLY("sqlite", "connections opened while other processes close and checkpoint wait",
                 "[database][process]") {
  const std::string file = "/tmp/dblock-open-" + dblock::test::random_suffix(8) + ".db";
  const unlink_after cleanup{file};
  {
    dblock::database first("sqlite://" + file);
    first.connect().session() << "CREATE TABLE t (x INTEGER)";
  }
  std::vector<int> pids;
  for (int i = 0; i < 8; ++i)
    pids.push_back(dblock::test::spawn_worker("sqlite_open_close_worker", {file}));
  int failed = 0;
  for (int pid : pids)
    failed += dblock::test::wait_worker(pid);
  CHECK(failed == 0);
  dblock::database db("sqlite://" + file);
  int rows = 0;
  db.connect().session() << "SELECT COUNT(*) FROM t", soci::into(rows);
  CHECK(rows == 8 * 150);
}

TEST_CASE("version: the headers, the library and the CMake project agree", "[unit][database]") {
  CHECK(std::string(dblock::version()) == DBLOCK_VERSION_STRING);
  CHECK(std::string(DBLOCK_VERSION_STRING) == DBLOCK_PROJECT_VERSION);
  CHECK(std::string(DBLOCK_VERSION_STRING) == std::to_string(DBLOCK_VERSION_MAJOR) + "." +
                                                  std::to_string(DBLOCK_VERSION_MINOR) + "." +
                                                  std::to_string(DBLOCK_VERSION_PATCH));
}

// Through PgBouncer in transaction mode without ?pooler=transaction, dblock's prepared
// statements meet server connections that have them already (42P05) or not (26000). Each such
// call fails with an error that says what to add to the URL, and nothing is lost or counted
// twice. Under the pgbouncer entry (its URL carries pooler=transaction) the key is taken off and
// the fault must be seen; on a direct connection the same workload is the control: no error.
DBLOCK_TEST_ONLY("postgresql",
                 "a transaction-mode pooler without ?pooler=transaction: a clear "
                 "error, nothing lost or doubled",
                 "[database][pooler]") {
  std::string url = ctx.url;
  const bool pooled = url.find("pooler=transaction") != std::string::npos;
  for (const char* key : {"&pooler=transaction", "?pooler=transaction"})
    if (auto at = url.find(key); at != std::string::npos) url.erase(at, std::strlen(key));
  const std::string counter = ctx.table("pooler_counter");
  ctx.exec("CREATE TABLE " + counter + " (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + counter + " (id, n) VALUES (1, 0)");
  const int threads = 4, rounds = 15;
  std::mutex mu;
  int ok = 0;
  std::vector<std::string> errors;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      dblock::database db(url, ctx.options());
      for (int i = 0; i < rounds; ++i) {
        try {
          dblock::lease_options o;
          o.ttl = std::chrono::seconds(2);  // a lease left by a failed release ends soon
          dblock::lease_lock lock(db, "pooler/k" + std::to_string(t % 2), o);
          auto g = lock.acquire(std::chrono::seconds(20));
          g.fenced([&](soci::session& sql) {
            sql << "UPDATE " + counter + " SET n = n + 1 WHERE id = 1";
          });
          {
            std::lock_guard<std::mutex> l(mu);
            ++ok;  // the write committed: counted once
          }
          try {
            g.release();
          } catch (const dblock::error& e) {  // the lease then expires by its TTL
            std::lock_guard<std::mutex> l(mu);
            errors.push_back(std::string("release: ") + e.what() + " [" +
                             dblock::to_string(e.kind()) + "]");
          }
        } catch (const dblock::error& e) {
          std::lock_guard<std::mutex> l(mu);
          errors.push_back(std::string(e.what()) + " [" + dblock::to_string(e.kind()) + "]");
        }
      }
    });
  for (auto& t : ts)
    t.join();
  int n = -1;
  {
    dblock::lease_lock reader(ctx.db, "pooler/read");
    auto g = reader.acquire(std::chrono::seconds(20));
    g.fenced([&](soci::session& sql) {
      sql << "SELECT n FROM " + counter + " WHERE id = 1", soci::into(n);
    });
  }
  INFO("pooled: " << pooled << ", ok: " << ok << ", errors: " << errors.size());
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("add ?pooler=transaction to the URL") != std::string::npos);
    CHECK(e.find("[invalid_argument]") != std::string::npos);
    CHECK(e.find("ERROR:") == std::string::npos);  // not the server's raw text
  }
  CHECK(n == ok);  // every committed write once, no other
  if (pooled)
    CHECK(!errors.empty());  // the fault happened
  else
    CHECK(errors.empty());  // the control: a direct connection
}
