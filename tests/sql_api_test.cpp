// The SQL API (migration 0012, docs/sql-api.md, sql_api.hpp): leases taken, renewed and released
// through the SQL functions (PostgreSQL) and procedures (MySQL/MariaDB) are the library's own,
// and a fence check in the caller's own transaction lets its COMMIT land only under the current
// grant. SQLite, which has no routines, runs the check as a statement (sql_api.hpp); its
// statements from Python are tests/sql_api/.
#include <libpq-fe.h>
#include <mysql.h>
#include <soci/soci.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "dblock/admin.hpp"
#include "dblock/lease_lock.hpp"
#include "dblock/migrate.hpp"
#include "dblock/sql_api.hpp"
#include "dblock/sql_api_libpq.hpp"
#include "dblock/sql_api_mysql.hpp"
#include "support/harness.hpp"
#include "support/mysql_client.hpp"

using namespace dblock::test;

namespace {

// One call of the SQL API as any client makes it, on a connection of its own: PostgreSQL
// SELECTs the function (libpq), MySQL/MariaDB CALLs the procedure (the C client, which reads
// the procedure's row and the status after it); its one value (nullopt: NULL). A server error
// throws std::runtime_error with the server's message.
class sql_client {
 public:
  explicit sql_client(const dblock::test::context& ctx) : ctx_(ctx) {
    if (ctx.backend == "postgresql") {
      pg_ = PQconnectdb(ctx.url.substr(0, ctx.url.find('?')).c_str());  // libpq reads the URL
      REQUIRE(PQstatus(pg_) == CONNECTION_OK);
    } else {
      my_ = connect_mysql(ctx.url, CLIENT_MULTI_RESULTS);
    }
  }
  ~sql_client() {
    if (pg_) PQfinish(pg_);
    if (my_) mysql_close(my_);
  }
  sql_client(const sql_client&) = delete;
  sql_client& operator=(const sql_client&) = delete;

  std::optional<long long> call(const std::string& routine, const std::string& args) {
    if (pg_) {
      const std::string text = "SELECT CAST(" + ctx_.prefix + "dblock_" + routine + "(" + args +
                               ") AS INTEGER)";  // a boolean as 1 or 0
      std::unique_ptr<PGresult, void (*)(PGresult*)> r(PQexec(pg_, text.c_str()), PQclear);
      if (PQresultStatus(r.get()) != PGRES_TUPLES_OK)
        throw std::runtime_error(PQresultErrorMessage(r.get()));
      if (PQgetisnull(r.get(), 0, 0)) return std::nullopt;
      return std::stoll(PQgetvalue(r.get(), 0, 0));
    }
    return dblock::test::mysql_run(my_,
                                   "CALL " + ctx_.prefix + "dblock_" + routine + "(" + args + ")");
  }
  static std::string quoted(const std::string& v) {
    std::string out = "'";
    for (char c : v)
      out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  std::optional<long long> acquire(const std::string& name, const std::string& owner, long ttl) {
    return call("acquire", quoted(name) + ", " + quoted(owner) + ", " + std::to_string(ttl));
  }
  long long renew(const std::string& name, const std::string& owner, long long fence, long ttl) {
    return call("renew", quoted(name) + ", " + quoted(owner) + ", " + std::to_string(fence) + ", " +
                             std::to_string(ttl))
        .value_or(-1);
  }
  long long release(const std::string& name, const std::string& owner, long long fence) {
    return call("release", quoted(name) + ", " + quoted(owner) + ", " + std::to_string(fence))
        .value_or(-1);
  }

 private:
  const dblock::test::context& ctx_;
  PGconn* pg_ = nullptr;
  MYSQL* my_ = nullptr;
};

}  // namespace

DBLOCK_TEST(
    "sql api: leases through SQL and through the library exclude each other, and their "
    "fences interleave increasing",
    "[sql_api]") {
  if (ctx.backend == "sqlite") {
    // No routines on SQLite: tests/sql_api/ runs its statements from Python on a file the
    // library also uses. The fence check through the library is the next test's.
    SUCCEED("SQLite: see tests/sql_api/");
    return;
  }
  sql_client c(ctx);
  const std::string name = "sql-" + dblock::test::random_suffix() + " 'quoted' ü";
  dblock::lease_lock lock(ctx.db, name);
  const auto f1 = c.acquire(name, "job-a", 5000);
  REQUIRE(f1);
  CHECK_FALSE(lock.try_acquire());                    // held through SQL: refused to the library
  CHECK_FALSE(c.acquire(name, "job-b", 5000));        // and to another SQL owner
  CHECK(c.acquire(name, "job-a", 5000) == f1);        // reentry keeps the fence
  CHECK(c.renew(name, "job-b", *f1, 5000) == 0);      // not the owner
  CHECK(c.renew(name, "job-a", *f1 + 1, 5000) == 0);  // not the fence
  CHECK(c.renew(name, "job-a", *f1, 5000) == 1);
  CHECK(c.release(name, "job-a", *f1) == 1);  // one hold left
  CHECK_FALSE(lock.try_acquire());
  CHECK(c.release(name, "job-a", *f1) == 1);  // freed
  CHECK(c.release(name, "job-a", *f1) == 0);  // nothing left to release
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(g->fence() > *f1);
  CHECK_FALSE(c.acquire(name, "job-a", 5000));  // held by the library: refused to SQL
  const std::int64_t f2 = g->fence();
  g->release();
  const auto f3 = c.acquire(name, "job-a", 5000);
  REQUIRE(f3);
  CHECK(*f3 > f2);
  // dblock status shows the SQL holder, marked "sql".
  dblock::list_options lo;
  lo.pattern = name;
  const auto rows = dblock::list_locks(ctx.db, lo);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].fence == *f3);
  CHECK(rows[0].holder_host.rfind("sql ", 0) == 0);
  CHECK(c.release(name, "job-a", *f3) == 1);
  // A release through SQL wakes a library waiter, which polls only every 20 s here (behind a
  // transaction pooler there is no LISTEN: it polls every 100 ms).
  const bool pooled = ctx.url.find("pooler=transaction") != std::string::npos;
  const auto f4 = c.acquire(name, "job-a", 20000);
  REQUIRE(f4);
  dblock::lease_options slow;
  slow.poll_max = milliseconds(pooled ? 100 : 20000);
  dblock::lease_lock waiter(ctx.open(), name, slow);
  long long got_ns = 0;
  std::int64_t got_fence = 0;
  std::thread w([&] {
    auto held = waiter.acquire(milliseconds(15000));
    got_ns = dblock::test::monotonic_ns();
    got_fence = held.fence();
  });
  // Waiting, its entry queued (polled: a busy machine may take longer to get there).
  const auto queued_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const auto now_rows = dblock::list_locks(ctx.db, lo);
    if ((!now_rows.empty() && now_rows[0].waiters > 0) ||
        std::chrono::steady_clock::now() > queued_by)
      break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  const long long released_ns = dblock::test::monotonic_ns();
  CHECK(c.release(name, "job-a", *f4) == 1);
  w.join();
  INFO("the waiter took the lease " << (got_ns - released_ns) / 1000000 << " ms after the release");
  CHECK(got_fence > *f4);
  CHECK(got_ns - released_ns < scaled_bound_ms(ctx.db, 2000) * 1000000);  // rung, not polled (20 s)
  // Bad arguments: refused with SQLSTATE 22023, nothing written.
  const std::vector<std::string> bads = {"'', 'o', 100", "'n', 'forced-x', 100", "'n', 'a b', 100",
                                         "'n', 'o', 5",
                                         "'" + std::string(256, 'n') + "', 'o', 100"};
  for (const std::string& bad : bads) {
    INFO(bad);
    bool refused = false;
    try {
      c.call("acquire", bad);
    } catch (const std::runtime_error& e) {
      refused = std::string(e.what()).find("dblock: ") != std::string::npos;
    }
    CHECK(refused);
  }
}

namespace {

// The caller's own transaction on a SOCI session.
struct own_transaction {
  const dblock::test::context& ctx;
  soci::session& s;
  void begin() {
    if (ctx.backend == "sqlite")
      s << "BEGIN IMMEDIATE";  // holds the write lock: nobody takes the lease meanwhile
    else
      s.begin();
  }
  void commit() {
    if (ctx.backend == "sqlite")
      s << "COMMIT";
    else
      s.commit();
  }
  void rollback() {
    if (ctx.backend == "sqlite")
      s << "ROLLBACK";
    else
      s.rollback();
  }
};

}  // namespace

DBLOCK_TEST("sql api: check_fence lets a transaction commit only under the current grant",
            "[sql_api]") {
  auto conn = ctx.db.connect();
  soci::session& s = conn.session();
  const std::string t = ctx.table("sqlapi_counter");
  ctx.exec("CREATE TABLE " + t + " (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, n) VALUES (1, 0)");
  const std::string name = "fenced-" + dblock::test::random_suffix();
  own_transaction tx{ctx, s};
  auto counter = [&] {
    long long n = -1;
    s << "SELECT n FROM " + t + " WHERE id = 1", soci::into(n);
    return n;
  };
  // One write guarded by `fence` (`check`: else the control, unguarded): true when it committed.
  auto guarded = [&](std::int64_t fence, bool check) {
    tx.begin();
    try {
      if (check) dblock::check_fence(s, ctx.db, name, fence);
      s << "UPDATE " + t + " SET n = n + 1 WHERE id = 1";
      tx.commit();
      return true;
    } catch (const dblock::error& e) {
      INFO(e.what());
      CHECK(e.code() == errc::lease_lost);
      tx.rollback();
      return false;
    }
  };
  dblock::lease_options o;
  o.ttl = milliseconds(300);
  dblock::lease_lock a(ctx.db, name, o);
  auto g = a.try_acquire();
  REQUIRE(g);
  const std::int64_t f1 = g->fence();
  CHECK(guarded(f1, true));  // the current grant
  CHECK(counter() == 1);
  // Expired: refused, and the write never lands. The control: unchecked, it lands.
  std::this_thread::sleep_for(milliseconds(450));
  CHECK_FALSE(guarded(f1, true));
  CHECK(counter() == 1);
  CHECK(guarded(f1, false));
  CHECK(counter() == 2);
  // Taken over by another owner: the old fence is refused, the new one passes.
  dblock::lease_options longer;
  longer.ttl = milliseconds(10000);
  dblock::lease_lock b(ctx.open(), name, longer);
  auto g2 = b.try_acquire();
  REQUIRE(g2);
  CHECK_FALSE(guarded(f1, true));
  CHECK(guarded(g2->fence(), true));
  CHECK(counter() == 3);
  // Released by force (dblock release --force): refused.
  (void)dblock::force_release(ctx.db, name, "sql api test", "tests");
  CHECK_FALSE(guarded(g2->fence(), true));
  CHECK(counter() == 3);
  // A fence never granted, a bad name: refused before any statement.
  CHECK(code_of([&] { dblock::check_fence(s, ctx.db, name, 0); }) == errc::invalid_argument);
  CHECK(code_of([&] { dblock::check_fence(s, ctx.db, "", 1); }) == errc::invalid_argument);
  // The check holds the lease row until the COMMIT: a new owner cannot take the lease, expired
  // meanwhile, before the guarded write commits.
  auto g3 = a.try_acquire();
  REQUIRE(g3);
  tx.begin();
  dblock::check_fence(s, ctx.db, name, g3->fence());
  std::this_thread::sleep_for(milliseconds(450));  // past the TTL
  long long committed_ns = 0, taken_ns = 0;
  std::int64_t taken_fence = 0;
  std::thread other([&] {
    dblock::lease_lock c(ctx.open(), name, longer);
    auto got = c.acquire(milliseconds(10000));
    taken_ns = dblock::test::monotonic_ns();
    taken_fence = got.fence();
  });
  std::this_thread::sleep_for(milliseconds(300));
  s << "UPDATE " + t + " SET n = n + 1 WHERE id = 1";
  committed_ns = dblock::test::monotonic_ns();
  tx.commit();
  other.join();
  CHECK(counter() == 4);
  CHECK(taken_ns >= committed_ns);  // taken only once the guarded write had committed
  CHECK(taken_fence > g3->fence());
}

// The check on the caller's own libpq or MariaDB connection, and the statement for any client.
DBLOCK_TEST("sql api: check_fence on a caller's own PGconn or MYSQL, and its statement",
            "[sql_api]") {
  const auto st = dblock::check_fence_statement(ctx.db, "n", 7);
  CHECK(st.values == std::vector<std::string>{"n", "7"});
  if (ctx.backend == "sqlite") {
    CHECK(st.text.find("SELECT fence FROM " + ctx.prefix + "resource_lock") == 0);
    return;
  }
  CHECK(st.text.find(ctx.prefix + "dblock_check_fence(") != std::string::npos);
  const std::string name = "own-" + dblock::test::random_suffix();
  dblock::lease_lock a(ctx.db, name);
  auto g = a.try_acquire();
  REQUIRE(g);
  if (ctx.backend == "postgresql") {
    const std::string uri = ctx.url.substr(0, ctx.url.find('?'));  // libpq reads the URL
    PGconn* c = PQconnectdb(uri.c_str());
    REQUIRE(PQstatus(c) == CONNECTION_OK);
    PQclear(PQexec(c, "BEGIN"));
    CHECK_NOTHROW(dblock::check_fence(c, ctx.prefix, name, g->fence()));
    PQclear(PQexec(c, "COMMIT"));
    PQclear(PQexec(c, "BEGIN"));
    CHECK(code_of([&] { dblock::check_fence(c, ctx.prefix, name, g->fence() + 1); }) ==
          errc::lease_lost);
    PQclear(PQexec(c, "ROLLBACK"));
    CHECK(code_of([&] { dblock::check_fence(c, "bad prefix", name, 1); }) ==
          errc::invalid_argument);
    CHECK(code_of([&] { dblock::check_fence(static_cast<PGconn*>(nullptr), "", name, 1); }) ==
          errc::invalid_argument);
    // The server ends the connection: the check says so (the dialect reads libpq's state).
    // Not behind PgBouncer, whose client connection has no server process of its own to end.
    if (ctx.url.find("pooler=transaction") == std::string::npos) {
      {
        auto k = ctx.db.connect();
        k.session() << "SELECT pg_terminate_backend(" + std::to_string(PQbackendPID(c)) + ")";
      }
      CHECK(code_of([&] { dblock::check_fence(c, ctx.prefix, name, g->fence()); }) ==
            errc::connection_lost);
    }
    PQfinish(c);
  } else {
    MYSQL* m = connect_mysql(ctx.url, 0);
    mysql_autocommit(m, 0);
    CHECK_NOTHROW(dblock::check_fence(m, ctx.prefix, name, g->fence()));
    mysql_commit(m);
    CHECK(code_of([&] { dblock::check_fence(m, ctx.prefix, name, g->fence() + 1); }) ==
          errc::lease_lost);
    mysql_rollback(m);
    // The connection is in sync after a refusal: it runs the next statement.
    CHECK(mysql_query(m, "SELECT 1") == 0);
    if (MYSQL_RES* r = mysql_store_result(m)) mysql_free_result(r);
    CHECK(code_of([&] { dblock::check_fence(static_cast<MYSQL*>(nullptr), "", name, 1); }) ==
          errc::invalid_argument);
    // The server ends the connection: the check says so (the dialect reads the error number).
    {
      auto k = ctx.db.connect();
      k.session() << "KILL " + std::to_string(mysql_thread_id(m));
    }
    CHECK(code_of([&] { dblock::check_fence(m, ctx.prefix, name, g->fence()); }) ==
          errc::connection_lost);
    mysql_close(m);
  }
}

// PostgreSQL: dblock_release(..., durable => false) that frees the lease does not wait for the
// WAL flush (as the library's release), unless its transaction wrote before it; the default is
// durable. What the transaction's synchronous_commit is right after the release shows it: a
// query string of two statements is one transaction, its second statement reading the first's
// setting.
DBLOCK_TEST_ONLY("postgresql",
                 "sql api: dblock_release(durable => false) skips the WAL flush only where "
                 "nothing was written before it",
                 "[sql_api]") {
  const std::string uri = ctx.url.substr(0, ctx.url.find('?'));  // libpq reads the URL
  PGconn* c = PQconnectdb(uri.c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  const std::string p = ctx.prefix, name = "sync-" + dblock::test::random_suffix();
  // The last result of `sql` (one or more statements): its first value.
  auto last = [&](const std::string& sql) {
    REQUIRE(PQsendQuery(c, sql.c_str()) == 1);
    std::string out;
    while (PGresult* r = PQgetResult(c)) {
      INFO(sql << ": " << PQresultErrorMessage(r));
      CHECK((PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK));
      if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
      PQclear(r);
    }
    return out;
  };
  const std::string acquire = "SELECT " + p + "dblock_acquire('" + name + "', 'o', 30000)";
  auto release = [&](const std::string& fence, const std::string& durable) {
    return "SELECT " + p + "dblock_release('" + name + "', 'o', " + fence +
           (durable.empty() ? "" : ", " + durable) + ")";
  };
  const std::string setting = "SELECT current_setting('synchronous_commit')";
  // The server's own setting (on, remote_apply, ...): what every durable release leaves.
  const std::string base = last(setting);
  REQUIRE(base != "off");
  // The default: durable.
  std::string f = last(acquire);
  CHECK(last(release(f, "") + "; " + setting) == base);
  // durable => false: off for that transaction only.
  f = last(acquire);
  CHECK(last(release(f, "durable => false") + "; " + setting) == "off");
  CHECK(last(setting) == base);
  // A hold that does not free the lease: nothing changes.
  f = last(acquire);
  last(acquire);
  CHECK(last(release(f, "false") + "; " + setting) == base);
  CHECK(last(release(f, "false")) == "t");
  // After a write in the same transaction: that commit stays durable.
  const std::string t = ctx.table("sqlapi_sync");
  ctx.exec("CREATE TABLE " + t + " (x INT)");
  f = last(acquire);
  CHECK(last("INSERT INTO " + t + " VALUES (1); " + release(f, "false") + "; " + setting) == base);
  f = last(acquire);
  last("BEGIN");
  last("INSERT INTO " + t + " VALUES (2)");
  last(release(f, "false"));
  CHECK(last(setting) == base);
  last("COMMIT");
  PQfinish(c);
}

// A database migrated before the SQL API existed (migration 0012 neither applied nor recorded)
// gets it from the next `dblock migrate`, and a lease through it blocks the library.
DBLOCK_TEST("sql api: an upgrade from the previous schema installs the routines", "[sql_api]") {
  if (ctx.backend == "sqlite") {
    SUCCEED("SQLite: migration 0012 has no routines to install there");
    return;
  }
  const std::string p = ctx.prefix;
  if (ctx.backend == "postgresql")
    for (const char* f :
         {"dblock_acquire(text, text, bigint)", "dblock_renew(text, text, bigint, bigint)",
          "dblock_release(text, text, bigint, boolean)", "dblock_check_fence(text, bigint)",
          "dblock_check_args(text, text, bigint, bigint, boolean)", "dblock_check_durable()"})
      ctx.exec("DROP FUNCTION " + p + f);
  else
    for (const char* f : {"dblock_acquire", "dblock_renew", "dblock_release", "dblock_check_fence"})
      ctx.exec("DROP PROCEDURE " + p + f);
  ctx.exec("DELETE FROM " + p + "dblock_schema_migrations WHERE version = 12");
  {
    sql_client c(ctx);
    CHECK_THROWS(c.acquire("upgraded", "job-a", 5000));  // the control: no routine yet
  }
  CHECK_FALSE(dblock::schema_up_to_date(ctx.db));
  const auto r = dblock::migrate(ctx.db);
  CHECK(r.applied_now == std::vector<int>{12});
  sql_client c(ctx);
  const auto f = c.acquire("upgraded", "job-a", 5000);
  REQUIRE(f);
  dblock::lease_lock lock(ctx.db, "upgraded");
  CHECK_FALSE(lock.try_acquire());
  CHECK(c.release("upgraded", "job-a", *f) == 1);
  CHECK(lock.try_acquire());
}
