// The privileges docs/getting-started.md ("Privileges") says the application's database user
// needs, on the two server backends: a user made with exactly those (SELECT, INSERT, UPDATE,
// DELETE on dblock's tables and the test's own table, on PostgreSQL also CONNECT and USAGE on
// the schema) runs every kind of lock, a woken wait, the reaper and the admin calls on tables
// that another user migrated. The control: the same user before the grants is refused.
#include <soci/soci.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/url.hpp"
#include "harness.hpp"

using dblock::errc;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

// A database user with nothing but a login, dropped again at the end of the test.
class app_user {
 public:
  app_user(const dblock::test::context& ctx, dblock::database admin)
      : ctx_(ctx), admin_(std::move(admin)) {
    name_ = "dblock_app_" + dblock::test::random_suffix(8);
    password_ = "pw" + dblock::test::random_suffix(12);
    auto c = admin_.connect();
    if (ctx.backend == "postgresql") {
      const auto u = dblock::detail::parse_url(ctx.url);
      c.session() << "CREATE ROLE " + name_ + " LOGIN PASSWORD '" + password_ + "'";
      c.session() << "GRANT CONNECT ON DATABASE " + u.path + " TO " + name_;
      c.session() << "GRANT USAGE ON SCHEMA public TO " + name_;
    } else {
      for (const char* host : {"127.0.0.1", "localhost"})
        c.session() << "CREATE USER '" + name_ + "'@'" + host + "' IDENTIFIED BY '" + password_ +
                           "'";
    }
  }
  ~app_user() {
    try {
      auto c = admin_.connect();
      if (ctx_.backend == "postgresql") {
        c.session() << "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                       "usename = '" +
                           name_ + "'";
        c.session() << "DROP OWNED BY " + name_;
        c.session() << "DROP ROLE " + name_;
      } else {
        for (const char* host : {"127.0.0.1", "localhost"})
          c.session() << "DROP USER '" + name_ + "'@'" + host + "'";
      }
    } catch (const std::exception&) {
    }
  }
  app_user(const app_user&) = delete;
  app_user& operator=(const app_user&) = delete;

  // SELECT, INSERT, UPDATE, DELETE on every table of the test's prefix (dblock's and its own).
  void grant_tables() {
    auto c = admin_.connect();
    std::vector<std::string> tables(256);
    if (ctx_.backend == "postgresql")
      c.session() << "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND "
                     "tablename LIKE '" +
                         ctx_.prefix + "%'",
          soci::into(tables);
    else
      c.session() << "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                     "DATABASE() AND table_name LIKE '" +
                         ctx_.prefix + "%'",
          soci::into(tables);
    REQUIRE(tables.size() >= 9);
    for (const auto& t : tables) {
      if (ctx_.backend == "postgresql")
        c.session() << "GRANT SELECT, INSERT, UPDATE, DELETE ON " + t + " TO " + name_;
      else
        for (const char* host : {"127.0.0.1", "localhost"})
          c.session() << "GRANT SELECT, INSERT, UPDATE, DELETE ON `" + t + "` TO '" + name_ +
                             "'@'" + host + "'";
    }
  }

  // What session leases need beyond the tables: PostgreSQL, USAGE and UPDATE on the fence
  // sequence (migration 0014; MariaDB's sequence is a table, granted with them); MariaDB,
  // EXECUTE on the marker read (migration 0017; PostgreSQL grants it to PUBLIC).
  void grant_session_leases() {
    auto c = admin_.connect();
    if (ctx_.backend == "postgresql")
      c.session() << "GRANT USAGE, UPDATE ON SEQUENCE " + ctx_.prefix + "session_fence TO " + name_;
    else
      for (const char* host : {"127.0.0.1", "localhost"})
        c.session() << "GRANT EXECUTE ON FUNCTION " + ctx_.prefix + "dblock_session_marker TO '" +
                           name_ + "'@'" + host + "'";
  }

  // EXECUTE on the SQL API's routine `routine` (migration 0012): `on` grants it to this user;
  // off, on PostgreSQL, revokes it from PUBLIC, which has it by default.
  void execute(const std::string& routine, const std::string& signature, bool on) {
    auto c = admin_.connect();
    const std::string r = ctx_.prefix + routine;
    if (ctx_.backend == "postgresql")
      c.session() << (on ? "GRANT EXECUTE ON FUNCTION " + r + signature + " TO " + name_
                         : "REVOKE EXECUTE ON FUNCTION " + r + signature + " FROM PUBLIC");
    else if (on)
      for (const char* host : {"127.0.0.1", "localhost"})
        c.session() << "GRANT EXECUTE ON PROCEDURE " + r + " TO '" + name_ + "'@'" + host + "'";
  }

  // The test's URL with this user's name and password.
  std::string url() const {
    const std::string& s = ctx_.url;
    const auto scheme_end = s.find("://") + 3;
    const auto at = s.find('@', scheme_end);
    return s.substr(0, scheme_end) + name_ + ":" + password_ + s.substr(at);
  }

 private:
  const dblock::test::context& ctx_;
  dblock::database admin_;
  std::string name_, password_;
};

std::optional<dblock::database> admin_db(const dblock::test::context& ctx) {
  const char* env = std::getenv(ctx.backend == "postgresql" ? "DBLOCK_TEST_POSTGRESQL_ADMIN_URL"
                                                            : "DBLOCK_TEST_MYSQL_ADMIN_URL");
  if (!env || !*env) return std::nullopt;
  return dblock::database(env);
}

}  // namespace

DBLOCK_TEST_SERVERS("privileges: the documented grants are enough for the application's user",
                    "[privileges][direct]") {
  auto admin = admin_db(ctx);
  if (!admin) {
    DBLOCK_SKIP("no admin URL (DBLOCK_TEST_*_ADMIN_URL) to create a database user");
  }
  const std::string counter = ctx.table("privilege_counter");
  ctx.exec("CREATE TABLE " + counter + " (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + counter + " (id, n) VALUES (1, 0)");
  app_user user(ctx, *admin);

  {
    // The control: a user with a login and nothing else cannot take a lease.
    dblock::database bare(user.url(), ctx.options());
    dblock::lease_lock lock(bare, "priv/control");
    const auto code = dblock::test::code_of([&] { (void)lock.try_acquire(); });
    REQUIRE(code);  // refused: the grants below are what makes the rest work
    INFO(dblock::to_string(*code));
    // PostgreSQL: permission denied on the table; MariaDB: no access to the database at all.
    CHECK((*code == errc::backend_error || *code == errc::connection_failed));
  }

  user.grant_tables();
  dblock::database db(user.url(), ctx.options());
  CHECK(dblock::schema_up_to_date(db));

  // A lease, a fenced write, a wait woken by the release of another handle of the same user.
  dblock::lease_lock a(db, "priv/lease");
  auto ga = a.try_acquire();
  REQUIRE(ga);
  ga->fenced(
      [&](soci::session& sql) { sql << "UPDATE " + counter + " SET n = n + 1 WHERE id = 1"; });
  dblock::database other(user.url(), ctx.options());
  // Under the 10 s poll however slow the machine, or a poll would pass for a wake-up.
  const long long bound = std::min(dblock::test::scaled_bound_ms(ctx.db, 3000), 9000LL);
  auto waiter = std::async(std::launch::async, [&] {
    dblock::lease_options slow;  // a poll would come after 10 s: only a wake-up is quick
    slow.poll_initial = seconds(10);
    slow.poll_max = seconds(10);
    dblock::lease_lock b(other, "priv/lease", slow);
    auto gb = b.acquire(seconds(20));
    return gb.fence();
  });
  std::this_thread::sleep_for(milliseconds(300));
  const auto fence = ga->fence();
  const auto released = std::chrono::steady_clock::now();
  ga->release();
  CHECK(waiter.get() == fence + 1);
  const auto woken = std::chrono::steady_clock::now() - released;
  INFO("woken after " << std::chrono::duration_cast<milliseconds>(woken).count() << " ms; bound "
                      << bound << " ms");
  CHECK(woken < milliseconds(bound));

  // The other kinds.
  dblock::semaphore sem(db, "priv/sem", 2);
  auto p1 = sem.try_acquire();
  auto p2 = sem.try_acquire();
  CHECK(p1);
  CHECK(p2);
  CHECK_FALSE(sem.try_acquire());
  dblock::rwlock rw(db, "priv/rw");
  {
    auto r = rw.try_acquire_shared();
    CHECK(r);
  }
  CHECK(rw.try_acquire());
  dblock::election el(db, "priv/election", "me");
  auto lead = dblock::test::win_observed(db, el, "me");
  dblock::id_generator ids(db, "priv/ids");
  const auto id1 = ids.next(), id2 = ids.next();
  CHECK(id1 > 0);
  CHECK(id2 > 0);
  CHECK(id1 != id2);
  dblock::segmented_stock stock(db, "priv/stock");
  stock.create(10, 2);
  CHECK(stock.take(3));
  stock.put(1);

  // A session lease, held past its first renewal (which reports it for status). The control:
  // refused without the grants for session leases. The MySQL 8 flavor refuses it whatever the
  // grants (docs/mysql.md); the counter gets the write a durable lease instead.
  dblock::lease_lock sl(db, "priv/session", {}, dblock::lease_mode::session);
  const bool mysql8 = dblock::test::mysql8_flavor(db);
  {
    const auto refused = dblock::test::code_of([&] { (void)sl.try_acquire(); });
    REQUIRE(refused);
    CHECK(*refused == (mysql8 ? errc::invalid_argument : errc::backend_error));
  }
  if (mysql8) {
    dblock::lease_lock durable(db, "priv/session");
    auto gd = durable.try_acquire();
    REQUIRE(gd);
    gd->fenced(
        [&](soci::session& sql) { sql << "UPDATE " + counter + " SET n = n + 1 WHERE id = 1"; });
  } else {
    user.grant_session_leases();
    {
      auto gs = sl.try_acquire();
      REQUIRE(gs);
      gs->renew();
      dblock::list_options lo;
      lo.pattern = "priv/session";
      const auto listed = dblock::list_locks(db, lo);
      REQUIRE(listed.size() == 1);
      CHECK(listed[0].fence == gs->fence());
      gs->fenced(
          [&](soci::session& sql) { sql << "UPDATE " + counter + " SET n = n + 1 WHERE id = 1"; });
    }
  }

  // Admin: listing, forced release with its audit row, the reaper.
  CHECK(dblock::list_locks(db).size() >= 3);
  dblock::lease_lock held(db, "priv/forced");
  auto gh = held.try_acquire();
  REQUIRE(gh);
  CHECK_NOTHROW(dblock::force_release(db, "priv/forced", "privileges test", "test"));
  CHECK(dblock::recent_forced_releases(db, 10).size() >= 1);
  dblock::reaper_options ro;
  ro.retention = milliseconds(0);
  ro.floor_grace = milliseconds(0);
  CHECK_NOTHROW(dblock::reap_once(db, ro));

  int n = -1;
  dblock::lease_lock reader(db, "priv/read");
  auto g = reader.try_acquire();
  REQUIRE(g);
  g->fenced([&](soci::session& sql) {
    sql << "SELECT n FROM " + counter + " WHERE id = 1", soci::into(n);
  });
  CHECK(n == 2);

  // The SQL API: EXECUTE on its fence check (and the table privileges above) is enough. The
  // control: without EXECUTE, the call is refused (not taken for a lost lease).
  auto conn = db.connect();
  user.execute("dblock_check_fence", "(text, bigint)", false);
  const auto denied = dblock::test::code_of(
      [&] { dblock::check_fence(conn.session(), db, "priv/read", g->fence()); });
  REQUIRE(denied);
  CHECK(*denied == errc::backend_error);
  user.execute("dblock_check_fence", "(text, bigint)", true);
  conn.session().begin();
  CHECK_NOTHROW(dblock::check_fence(conn.session(), db, "priv/read", g->fence()));
  conn.session().commit();
}
