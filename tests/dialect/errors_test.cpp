// Every errc class the dialects classify is provoked on the real servers.
#include <soci/soci.h>

#include <future>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"

using dblock::errc;

namespace {

// Runs `sql_text` on `c`, classified like dblock's own calls; returns the code (or nothing).
std::optional<errc> run(const dblock::database& db, dblock::database::connection& c,
                        const std::string& sql_text) {
  try {
    try {
      c.session() << sql_text;
    } catch (...) {
      throw dblock::test::dialect_of(db).errors.classify_current("test");
    }
  } catch (const dblock::error& e) {
    UNSCOPED_INFO("error: " << e.what());
    return e.kind();
  }
  return std::nullopt;
}

void create_items(dblock::test::context& ctx) {
  ctx.exec("CREATE TABLE " + ctx.table("items") + " (id INTEGER NOT NULL PRIMARY KEY, v INTEGER)");
  ctx.exec("INSERT INTO " + ctx.table("items") + " (id, v) VALUES (1, 0)");
  ctx.exec("INSERT INTO " + ctx.table("items") + " (id, v) VALUES (2, 0)");
}

// Two sessions, `a` and `b`, on a fresh table of items.
struct two_sessions {
  dblock::database::connection a, b;
};

two_sessions items_and_two_sessions(dblock::test::context& ctx) {
  create_items(ctx);
  return {ctx.db.connect(), ctx.db.connect()};
}

}  // namespace

DBLOCK_TEST("a duplicate key is unique_violation", "[errors]") {
  create_items(ctx);
  auto c = ctx.db.connect();
  CHECK(run(ctx.db, c, "INSERT INTO " + ctx.table("items") + " (id, v) VALUES (1, 5)") ==
        errc::unique_violation);
}

DBLOCK_TEST("a missing table is schema_missing", "[errors]") {
  auto c = ctx.db.connect();
  CHECK(run(ctx.db, c, "SELECT * FROM " + ctx.table("nope")) == errc::schema_missing);
}

DBLOCK_TEST_SERVERS("NOWAIT on a locked row is lock_not_available", "[errors]") {
  auto [a, b] = items_and_two_sessions(ctx);
  const auto& d = dblock::test::dialect_of(ctx.db);
  a.session() << "BEGIN";
  a.session() << "SELECT v FROM " << ctx.table("items") << " WHERE id = 1" << d.sql.for_update();
  b.session() << "BEGIN";
  CHECK(run(ctx.db, b,
            "SELECT v FROM " + ctx.table("items") + " WHERE id = 1" + d.sql.for_update_nowait()) ==
        errc::lock_not_available);
  b.session() << "ROLLBACK";
  a.session() << "ROLLBACK";
}

DBLOCK_TEST_SERVERS("a lock wait timeout is lock_not_available", "[errors][direct]") {
  auto [a, b] = items_and_two_sessions(ctx);
  const auto& d = dblock::test::dialect_of(ctx.db);
  a.session() << "BEGIN";
  a.session() << "UPDATE " << ctx.table("items") << " SET v = 1 WHERE id = 1";
  d.conn.set_lock_timeout(b.session(), dblock::detail::access::scope(b).state(),
                          std::chrono::milliseconds(200));
  b.session() << "BEGIN";
  auto t0 = std::chrono::steady_clock::now();
  CHECK(run(ctx.db, b, "UPDATE " + ctx.table("items") + " SET v = 2 WHERE id = 1") ==
        errc::lock_not_available);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(150));
  b.session() << "ROLLBACK";
  a.session() << "ROLLBACK";
}

DBLOCK_TEST_SERVERS("a deadlock between two sessions is deadlock for one of them", "[errors]") {
  auto [a, b] = items_and_two_sessions(ctx);
  const std::string t = ctx.table("items");
  a.session() << "BEGIN";
  b.session() << "BEGIN";
  a.session() << "UPDATE " << t << " SET v = 1 WHERE id = 1";
  b.session() << "UPDATE " << t << " SET v = 1 WHERE id = 2";
  // The victim rolls back at once so that the survivor can finish.
  auto second_update = [&](dblock::database::connection& c, int id) {
    auto r = run(ctx.db, c, "UPDATE " + t + " SET v = 2 WHERE id = " + std::to_string(id));
    if (r) c.session() << "ROLLBACK";
    return r;
  };
  // (C++17 lambdas cannot capture a structured binding itself: `a` is captured by an init-capture.)
  auto fa = std::async(std::launch::async, [&, &sa = a] { return second_update(sa, 2); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto rb = second_update(b, 1);
  auto ra = fa.get();
  CHECK((ra == errc::deadlock) != (rb == errc::deadlock));  // exactly one victim
  try {
    a.session() << "ROLLBACK";
  } catch (...) {
  }
  try {
    b.session() << "ROLLBACK";
  } catch (...) {
  }
}

DBLOCK_TEST_ONLY("postgresql", "a repeatable-read write conflict is serialization_failure",
                 "[errors]") {
  auto [a, b] = items_and_two_sessions(ctx);
  const std::string t = ctx.table("items");
  a.session() << "BEGIN ISOLATION LEVEL REPEATABLE READ";
  b.session() << "BEGIN ISOLATION LEVEL REPEATABLE READ";
  int v = 0;
  a.session() << "SELECT v FROM " << t << " WHERE id = 1", soci::into(v);
  b.session() << "SELECT v FROM " << t << " WHERE id = 1", soci::into(v);
  a.session() << "UPDATE " << t << " SET v = v + 1 WHERE id = 1";
  a.session() << "COMMIT";
  CHECK(run(ctx.db, b, "UPDATE " + t + " SET v = v + 1 WHERE id = 1") ==
        errc::serialization_failure);
  b.session() << "ROLLBACK";
}

DBLOCK_TEST_ONLY("sqlite", "a second writer is lock_not_available (SQLITE_BUSY)", "[errors]") {
  auto [a, b] = items_and_two_sessions(ctx);
  const auto& d = dblock::test::dialect_of(ctx.db);
  a.session() << "BEGIN IMMEDIATE";
  d.conn.set_lock_timeout(b.session(), dblock::detail::access::scope(b).state(),
                          std::chrono::milliseconds(100));
  CHECK(run(ctx.db, b, "BEGIN IMMEDIATE") == errc::lock_not_available);
  a.session() << "ROLLBACK";
  CHECK_FALSE(run(ctx.db, b, "BEGIN IMMEDIATE"));
  b.session() << "ROLLBACK";
}

DBLOCK_TEST_ONLY("sqlite", "a stale WAL snapshot upgrading to write is serialization_failure",
                 "[errors]") {
  auto [a, b] = items_and_two_sessions(ctx);
  const std::string t = ctx.table("items");
  int v = 0;
  b.session() << "BEGIN";  // deferred: reads from a snapshot
  b.session() << "SELECT v FROM " << t << " WHERE id = 1", soci::into(v);
  a.session() << "UPDATE " << t << " SET v = 7 WHERE id = 1";  // commits a newer version
  CHECK(run(ctx.db, b, "UPDATE " + t + " SET v = 8 WHERE id = 1") == errc::serialization_failure);
  b.session() << "ROLLBACK";
}

DBLOCK_TEST_SERVERS("a killed connection is connection_lost and the pool reconnects",
                    "[errors][direct]") {
  auto victim = ctx.db.connect();
  long long id = 0;
  const bool pg = ctx.backend == "postgresql";
  victim.session() << (pg ? "SELECT pg_backend_pid()" : "SELECT CONNECTION_ID()"), soci::into(id);
  {
    auto killer = ctx.db.connect();
    if (pg) {
      int ok = 0;
      killer.session() << "SELECT CAST(pg_terminate_backend(" << id << ") AS INTEGER)",
          soci::into(ok);
      REQUIRE(ok == 1);
    } else {
      killer.session() << "KILL CONNECTION " << id;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto code = run(ctx.db, victim, "SELECT 1");
  CHECK(code == errc::connection_lost);
  victim.discard();
  { auto gone = std::move(victim); }
  // Every pooled connection works again (the broken one is reopened on lease).
  std::vector<dblock::database::connection> all;
  for (std::size_t i = 0; i < ctx.db.options().pool_size; ++i)
    all.push_back(ctx.db.connect());
  for (auto& c : all) {
    int one = 0;
    c.session() << "SELECT 1", soci::into(one);
    CHECK(one == 1);
  }
}
