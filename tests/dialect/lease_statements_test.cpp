// The lease hot path: one round trip per acquire, per release and per renew, statements prepared
// once per connection, and a connection's prepared statements never outliving it.
#include <dirent.h>
#include <soci/mysql/soci-mysql.h>
#include <soci/postgresql/soci-postgresql.h>
#include <soci/soci.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "dialect/dialect.hpp"
#include "harness.hpp"
#include "internals.hpp"

using namespace std::chrono_literals;

namespace {

dblock::database one_connection(dblock::test::context& ctx) {
  auto o = ctx.options();
  o.pool_size = 1;
  return ctx.open(o);
}

// Counts the client's round trips on PostgreSQL from libpq's protocol trace: each Sync (extended
// protocol) or Query (simple protocol) message is one request the client waits for.
int pg_round_trips(dblock::database& db, const std::function<void()>& body) {
  char path[] = "/tmp/dblock-pqtrace-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  FILE* f = fdopen(fd, "w");
  {
    auto c = db.connect();
    PGconn* conn = static_cast<soci::postgresql_session_backend*>(c.session().get_backend())->conn_;
    PQtrace(conn, f);
    PQsetTraceFlags(conn, PQTRACE_SUPPRESS_TIMESTAMPS);
  }
  body();
  {
    auto c = db.connect();
    PQuntrace(static_cast<soci::postgresql_session_backend*>(c.session().get_backend())->conn_);
  }
  std::fclose(f);
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    // "F<tab><length><tab><message>..." for a message from the client (F) to the server.
    if (line.rfind("F\t", 0) != 0) continue;
    std::istringstream words(line);
    std::string dir, len, type;
    words >> dir >> len >> type;
    if (type == "Sync" || type == "Query") ++n;
  }
  std::remove(path);
  return n;
}

// MySQL counts the statements a session sent ("Questions"); reading it is one more.
long long mysql_questions(dblock::database& db) {
  auto c = db.connect();
  std::string name, value;
  c.session() << "SHOW SESSION STATUS LIKE 'Questions'", soci::into(name), soci::into(value);
  return std::stoll(value);
}

int open_fds_to(const std::string& path) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (auto* e = readdir(d)) {
    char target[4096];
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    ssize_t len = readlink(link.c_str(), target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = 0;
    if (std::string(target).rfind(path, 0) == 0) ++n;
  }
  closedir(d);
  return n;
}

}  // namespace

DBLOCK_TEST_ONLY("postgresql", "acquire, renew and release are one round trip each",
                 "[lease][statements]") {
  auto db = one_connection(ctx);
  dblock::lease_lock lock(db, "rt/" + dblock::test::random_suffix());
  lock.try_acquire()->release();  // the first use prepares the statements
  CHECK(pg_round_trips(db, [&] {
          auto g = lock.try_acquire();
          REQUIRE(g);
        }) == 2);  // acquire, then release by the guard's destructor
  auto g = lock.try_acquire();
  REQUIRE(g);
  g->renew();  // the first renew prepares it
  CHECK(pg_round_trips(db, [&] { g->renew(); }) == 1);
  CHECK(pg_round_trips(db, [&] { g->release(); }) == 1);
}

// A permit's release rings its semaphore's queue from the release statement itself: no extra
// round trip on a permit's cycle (the semaphore's count is declared on the first use).
DBLOCK_TEST_ONLY("postgresql", "a semaphore's permit: try and release are one round trip each",
                 "[semaphore][statements]") {
  auto db = one_connection(ctx);
  dblock::semaphore sem(db, "rt-sem/" + dblock::test::random_suffix(), 1);
  sem.try_acquire()->release();  // declares the count and prepares the statements
  auto g = sem.try_acquire();
  REQUIRE(g);
  CHECK(pg_round_trips(db, [&] { g->release(); }) == 1);
  CHECK(pg_round_trips(db, [&] {
          auto again = sem.try_acquire();
          REQUIRE(again);
        }) == 2);  // the try, then the release by the guard's destructor
}

DBLOCK_TEST_ONLY("mysql", "acquire, renew and release are one statement each",
                 "[lease][statements]") {
  auto db = one_connection(ctx);
  dblock::lease_lock lock(db, "rt/" + dblock::test::random_suffix());
  lock.try_acquire()->release();
  long long before = mysql_questions(db);
  auto g = lock.try_acquire();
  REQUIRE(g);
  g->renew();
  g->release();
  // acquire + renew + release, plus the second SHOW STATUS.
  CHECK(mysql_questions(db) - before == 4);
}

// Fair mode costs an uncontended acquire nothing: "nobody is queued" is checked by the acquire
// statement itself (it used to be a read first: 3 round trips for the pair below).
DBLOCK_TEST_ONLY("postgresql", "a fair try_acquire is one round trip", "[lease][statements]") {
  auto db = one_connection(ctx);
  dblock::lease_options lo;
  lo.fair = true;
  dblock::lease_lock lock(db, "rt-fair/" + dblock::test::random_suffix(), lo);
  lock.try_acquire()->release();  // the first use prepares the statements
  CHECK(pg_round_trips(db, [&] {
          auto g = lock.try_acquire();
          REQUIRE(g);
        }) == 2);  // acquire, then release by the guard's destructor
}

DBLOCK_TEST_ONLY("mysql", "a fair try_acquire is one statement", "[lease][statements]") {
  auto db = one_connection(ctx);
  dblock::lease_options lo;
  lo.fair = true;
  dblock::lease_lock lock(db, "rt-fair/" + dblock::test::random_suffix(), lo);
  lock.try_acquire()->release();
  long long before = mysql_questions(db);
  auto g = lock.try_acquire();
  REQUIRE(g);
  g->release();
  // acquire + release, plus the second SHOW STATUS.
  CHECK(mysql_questions(db) - before == 3);
}

DBLOCK_TEST_ONLY("postgresql", "a connection that forgot its prepared statements re-prepares",
                 "[lease][statements]") {
  auto db = one_connection(ctx);
  dblock::lease_lock lock(db, "forgot/" + dblock::test::random_suffix());
  auto g = lock.try_acquire();
  REQUIRE(g);
  const auto fence = g->fence();
  g->release();
  {
    auto c = db.connect();
    c.session() << "DEALLOCATE ALL";  // what a transaction-mode pooler does between clients
  }
  auto g2 = lock.try_acquire();
  REQUIRE(g2);
  CHECK(g2->fence() == fence + 1);
  g2->renew();
  g2->release();
  CHECK_FALSE(g2->valid());
}

DBLOCK_TEST_SERVERS("a killed connection drops its prepared statements with it",
                    "[lease][statements][direct]") {
  auto db = one_connection(ctx);
  dblock::lease_lock lock(db, "killed/" + dblock::test::random_suffix());
  lock.try_acquire()->release();
  long long id = 0;
  {
    auto c = db.connect();
    c.session() << (ctx.backend == "postgresql" ? "SELECT pg_backend_pid()"
                                                : "SELECT CONNECTION_ID()"),
        soci::into(id);
  }
  ctx.exec(ctx.backend == "postgresql" ? "SELECT pg_terminate_backend(" + std::to_string(id) + ")"
                                       : "KILL CONNECTION " + std::to_string(id));
  // The first use may see the dead connection; the pool reconnects, and the new connection
  // prepares its own statements.
  for (int i = 0; i < 3; ++i) {
    try {
      auto g = lock.try_acquire();
      REQUIRE(g);
      g->release();
      break;
    } catch (const dblock::error& e) {
      UNSCOPED_INFO(e.what());
      CHECK((e.code() == dblock::errc::connection_lost || e.code() == dblock::errc::in_doubt));
    }
  }
  auto g = lock.try_acquire();
  if (!g) {
    auto rows = dblock::list_locks(db);
    for (auto& r : rows)
      UNSCOPED_INFO(r.name << " fence " << r.fence << " holds " << r.hold_count);
  }
  REQUIRE(g);
  g->renew();
  g->release();
}

DBLOCK_TEST_ONLY("sqlite", "cached statements are finalized so the file is closed",
                 "[lease][statements]") {
  // A file of its own: the test's other handles keep theirs open.
  const std::string file = ctx.url.substr(std::string("sqlite://").size()) + "-fd.db";
  {
    dblock::database db("sqlite://" + file, ctx.options());
    dblock::migrate(db);
    dblock::lease_lock lock(db, "fd/" + dblock::test::random_suffix());
    for (int i = 0; i < 3; ++i) {
      auto g = lock.try_acquire();
      REQUIRE(g);
      g->renew();
    }
    CHECK(open_fds_to(file) > 0);
  }
  // sqlite3_close() refuses to close while statements are unfinalized: the file would stay open.
  CHECK(open_fds_to(file) == 0);
}

DBLOCK_TEST("the lease statements match the ones the library runs", "[lease][statements]") {
  const auto& d = dblock::test::dialect_of(ctx.db);
  (void)d;
  const auto& s = dblock::test::statements_of(ctx.db);
  for (const auto* text : {&s.acquire.text, &s.release.text, &s.renew.text}) {
    INFO(*text);
    CHECK(text->find(ctx.db.lock_table()) != std::string::npos);
  }
  CHECK(dblock::detail::to_positional("a = :x AND b = :y::int OR c = :x", {"x", "y"}) ==
        "a = $1 AND b = $2::int OR c = $1");
  CHECK_THROWS_AS(dblock::detail::to_positional("a = :z", {"x"}), dblock::error);
}

DBLOCK_TEST_ONLY("postgresql", "conditional and versioned updates cost one round trip a statement",
                 "[optimistic][statements]") {
  auto db = one_connection(ctx);
  const std::string t = ctx.table("rt_item");
  ctx.exec("CREATE TABLE " + t +
           " (id BIGINT PRIMARY KEY, stock BIGINT NOT NULL, version BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, stock, version) VALUES (1, 10, 0)");
  const dblock::cas_update cas{t, "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}};
  // Prepared on its first use (PREPARE, then EXECUTE), then one round trip each time. Behind a
  // transaction-mode pooler nothing is prepared: one unnamed round trip each time.
  const bool pooled = ctx.url.find("pooler=transaction") != std::string::npos;
  CHECK(pg_round_trips(db, [&] { CHECK(dblock::compare_and_set(db, cas) == 1); }) ==
        (pooled ? 1 : 2));
  CHECK(pg_round_trips(db, [&] { CHECK(dblock::compare_and_set(db, cas) == 1); }) == 1);
  // A value SOCI must bind with its type (a double) takes SOCI's unprepared path: one round
  // trip too, parsed and planned each time.
  const dblock::cas_update typed{t,
                                 "stock = stock - 1",
                                 "id = :id AND stock > CAST(:floor AS DOUBLE PRECISION)",
                                 {{"id", 1LL}, {"floor", 0.5}}};
  CHECK(pg_round_trips(db, [&] { CHECK(dblock::compare_and_set(db, typed) == 1); }) == 1);
  const dblock::versioned_table spec{t, "id", "version", {"stock"}};
  // The first run caches the index check, reads through SOCI (which describes the columns) and
  // prepares the UPDATE; the second prepares the read. From then on: two round trips.
  dblock::versioned_update(db, spec, 1LL, [](dblock::record&) {});
  dblock::versioned_update(db, spec, 1LL, [](dblock::record&) {});
  CHECK(pg_round_trips(db, [&] {
          dblock::versioned_update(db, spec, 1LL,
                                   [](dblock::record& r) { std::get<long long>(r["stock"]) -= 1; });
        }) == 2);  // read, then the conditional UPDATE
}

// Statements a server session ran, from the server's own count: PostgreSQL through libpq's
// protocol trace (pg_round_trips), MySQL from the session's "Questions" status (calibrated by
// two reads with nothing between them). The MySQL session keeps a transaction's lock wait for
// the next transaction until database::connect() hands it to a caller, who gets the default.
int server_round_trips(dblock::test::context& ctx, dblock::database& db,
                       const std::function<void()>& body) {
  if (ctx.backend == "postgresql") return pg_round_trips(db, body);
  auto questions = [&] {
    // Not database::connect(), which would give the session its default lock wait back.
    const auto& impl = dblock::detail::access::impl(db);
    auto c = dblock::detail::access::make_connection(impl->lease(impl));
    std::string name;
    long long n = 0;
    c.session() << "SHOW SESSION STATUS LIKE 'Questions'", soci::into(name), soci::into(n);
    return n;
  };
  const long long a = questions(), b = questions();
  body();
  const long long c = questions();
  return static_cast<int>((c - b) - (b - a));
}

DBLOCK_TEST_SERVERS("a transaction's lock timeout costs no round trip of its own",
                    "[transaction][statements]") {
  auto db = one_connection(ctx);
  auto txn = [&] {
    dblock::run_transaction(db, [](dblock::transaction& t) { t.session() << "SELECT 1"; });
  };
  txn();  // MySQL: the session gets the transactions' lock wait once
  // BEGIN (PostgreSQL: with SET LOCAL lock_timeout in the same query), SELECT 1, COMMIT.
  CHECK(server_round_trips(ctx, db, txn) == 3);
  CHECK(server_round_trips(ctx, db, txn) == 3);
  // Negative control: a different lock timeout costs MySQL one SET (PostgreSQL none: SET LOCAL).
  auto other = [&] {
    dblock::transaction_options o;
    o.lock_timeout = std::chrono::seconds(3);
    dblock::run_transaction(
        db, [](dblock::transaction& t) { t.session() << "SELECT 1"; },
        dblock::transaction_retry_policy(), o);
  };
  CHECK(server_round_trips(ctx, db, other) == (ctx.backend == "mysql" ? 4 : 3));
}

// compare_and_set() prepares its statements once per connection, at most 64 of them; more
// distinct statements still run (uncached), and every one updates its row.
DBLOCK_TEST("compare_and_set keeps at most 64 statements prepared per connection",
            "[optimistic][statements]") {
  auto db = one_connection(ctx);
  const std::string t = ctx.table("cap_item");
  ctx.exec("CREATE TABLE " + t + " (id BIGINT PRIMARY KEY, stock BIGINT NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, stock) VALUES (1, 1000)");
  for (int round = 0; round < 2; ++round)
    for (int k = 0; k < 70; ++k) {
      const dblock::cas_update u{t,
                                 "stock = stock - " + std::to_string(k % 7 + 1),
                                 "id = :id AND stock >= " + std::to_string(k),
                                 {{"id", 1LL}}};
      INFO("statement " << k << " round " << round);
      CHECK(dblock::compare_and_set(db, u) == 1);
    }
  long long stock = -1;
  {
    auto c = db.connect();
    c.session() << "SELECT stock FROM " << t << " WHERE id = 1", soci::into(stock);
    if (ctx.backend == "postgresql") {
      long long prepared = -1;
      c.session() << "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE "
                     "'dblock\\_caller\\_%'",
          soci::into(prepared);
      // Behind a transaction-mode pooler nothing is prepared (and the query may land on another
      // server session).
      CHECK(prepared == (ctx.url.find("pooler=transaction") == std::string::npos ? 64 : 0));
    }
  }
  long long taken = 0;
  for (int k = 0; k < 70; ++k)
    taken += k % 7 + 1;
  CHECK(stock == 1000 - 2 * taken);
}
