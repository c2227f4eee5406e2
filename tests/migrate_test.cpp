// Migrations: idempotent, checksummed, safe with several migrators at once.
#include <soci/soci.h>

#include <ctime>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"

using dblock::errc;

namespace {
int count_rows(const dblock::database& db, const std::string& table) {
  auto c = db.connect();
  int n = -1;
  c.session() << "SELECT count(*) FROM " << table, soci::into(n);
  return n;
}
}  // namespace

DBLOCK_TEST("migrating twice changes nothing", "[migrate]") {
  auto prefix = ctx.new_prefix();
  auto db = ctx.open(dblock::test::with_prefix(prefix));
  auto first = dblock::migrate(db);
  REQUIRE(!first.files.empty());
  CHECK(first.applied_now.size() == first.files.size());
  CHECK(dblock::schema_up_to_date(db));
  auto second = dblock::migrate(db);
  CHECK(second.applied_now.empty());
  for (const auto& f : second.files)
    CHECK(f.applied);
  CHECK(count_rows(db, prefix + "dblock_schema_migrations") ==
        static_cast<int>(first.files.size()));
  CHECK(count_rows(db, prefix + "resource_lock_fence_floor") == 1);
}

DBLOCK_TEST("a dry run reports pending files and creates nothing", "[migrate]") {
  auto prefix = ctx.new_prefix();
  auto db = ctx.open(dblock::test::with_prefix(prefix));
  auto r = dblock::migrate(db, dblock::migrate_options{true});
  CHECK(r.applied_now.empty());
  for (const auto& f : r.files)
    CHECK_FALSE(f.applied);
  CHECK_FALSE(dblock::test::dialect_of(db).conn.table_exists(db.connect().session(),
                                                             prefix + "resource_lock"));
  CHECK_FALSE(dblock::schema_up_to_date(db));
}

DBLOCK_TEST("an edited applied migration is refused", "[migrate]") {
  ctx.exec("UPDATE " + ctx.prefix +
           "dblock_schema_migrations SET checksum = '0000000000000000'"
           " WHERE version = 1");
  try {
    dblock::migrate(ctx.db);
    FAIL("migrate accepted a changed checksum");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::schema_mismatch);
    CHECK(std::string(e.what()).find("0001_resource_lock.sql") != std::string::npos);
  }
}

DBLOCK_TEST("using an unmigrated database says to run dblock migrate", "[migrate]") {
  auto prefix = ctx.new_prefix();
  auto db = ctx.open(dblock::test::with_prefix(prefix));
  dblock::lease_lock lock(db, "x");
  try {
    (void)lock.try_acquire();
    FAIL("acquired without tables");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::schema_missing);
    CHECK(std::string(e.what()).find("dblock migrate") != std::string::npos);
    CHECK(std::string(e.what()).find(prefix) != std::string::npos);
  }
}

// Waits until a shared start instant, then migrates; exit status 10 + files applied here.
DBLOCK_WORKER(migrate_worker) {
  const std::string& url = args.at(0);
  dblock::database_options o;
  o.table_prefix = args.at(1);
  long long start_ns = std::stoll(args.at(2));
  dblock::database db(url, o);
  db.ping();
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  long long now = ts.tv_sec * 1000000000LL + ts.tv_nsec;
  if (start_ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(start_ns - now));
  auto r = dblock::migrate(db);
  return 10 + static_cast<int>(r.applied_now.size());
}

DBLOCK_TEST("8 processes migrating one empty database apply each file once", "[migrate][process]") {
  auto prefix = ctx.new_prefix();
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  long long start = ts.tv_sec * 1000000000LL + ts.tv_nsec + 1500000000LL;  // 1.5 s from now
  std::vector<int> pids;
  for (int i = 0; i < 8; ++i)
    pids.push_back(
        dblock::test::spawn_worker("migrate_worker", {ctx.url, prefix, std::to_string(start)}));
  int applied = 0;
  for (int pid : pids) {
    int rc = dblock::test::wait_worker(pid);
    INFO("worker exit status " << rc);
    REQUIRE(rc >= 10);
    applied += rc - 10;
  }
  auto db = ctx.open(dblock::test::with_prefix(prefix));
  auto files = dblock::migrate(db, dblock::migrate_options{true}).files.size();
  CHECK(applied == static_cast<int>(files));
  CHECK(count_rows(db, prefix + "dblock_schema_migrations") == static_cast<int>(files));
  CHECK(count_rows(db, prefix + "resource_lock_fence_floor") == 1);
}

// MySQL 8 and MariaDB: the server's flavor picks a version's migration file where the two differ,
// and session leases, refused on MySQL 8. The suite runs this once per flavor: in the mysql entry
// (MariaDB's) and in mysql_flavor (DBLOCK_TEST_MYSQL_FLAVOR=mysql: MySQL 8's, on MariaDB).
DBLOCK_TEST_ONLY("mysql", "the server's flavor picks the migration files and allows session leases",
                 "[migrate]") {
  const bool mysql8 = dblock::test::mysql8_flavor(ctx.db);
  INFO("flavor: " << (mysql8 ? "MySQL 8 (DBLOCK_TEST_MYSQL_FLAVOR=mysql)" : "MariaDB"));
  std::string name, name17;
  int sequences = -1, functions = -1;
  {
    auto c = ctx.db.connect();
    c.session() << "SELECT name FROM " << ctx.prefix
                << "dblock_schema_migrations WHERE version = 14",
        soci::into(name);
    // MariaDB's file creates the sequence of the session fences; MySQL 8's creates nothing.
    const std::string sequence = ctx.prefix + "session_fence";  // bound: must outlive the run
    c.session() << "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
                   "DATABASE() AND TABLE_NAME = :t",
        soci::use(sequence), soci::into(sequences);
    // MariaDB's 0017 creates the marker read, a stored function; MySQL 8's creates none (a
    // stored function needs SUPER where the binary log is on, as it is by default there).
    c.session() << "SELECT name FROM " << ctx.prefix
                << "dblock_schema_migrations WHERE version = 17",
        soci::into(name17);
    const std::string function = ctx.prefix + "dblock_session_marker";
    c.session() << "SELECT count(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = "
                   "DATABASE() AND ROUTINE_TYPE = 'FUNCTION' AND ROUTINE_NAME = :f",
        soci::use(function), soci::into(functions);
  }
  CHECK(name == (mysql8 ? "0014_session_fences.mysql.sql" : "0014_session_fences.sql"));
  CHECK(sequences == (mysql8 ? 0 : 1));
  CHECK(name17 == (mysql8 ? "0017_session_marker_read.mysql.sql" : "0017_session_marker_read.sql"));
  CHECK(functions == (mysql8 ? 0 : 1));
  // The whole script of the server's flavor says which it is.
  const std::string script = dblock::migration_sql(ctx.db);
  CHECK(script.find(mysql8 ? " (MySQL 8)" : " (MariaDB)") != std::string::npos);
  dblock::lease_lock lock(ctx.db, dblock::test::unique_name("flavor"), {},
                          dblock::lease_mode::session);
  if (mysql8) {
    try {
      (void)lock.try_acquire();
      FAIL("a session lease was granted in the MySQL 8 flavor");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("not available on MySQL 8") != std::string::npos);
    }
  } else {
    auto g = lock.try_acquire();
    REQUIRE(g);
    CHECK(g->fence() > 0);
  }
}
