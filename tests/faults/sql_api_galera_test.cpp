// The SQL API (docs/sql-api.md) on a MariaDB Galera cluster, across nodes: a lease taken through
// the procedures on node 1 excludes the library on node 3 and the reverse, fences interleave
// increasing, and a transaction on node 1 that checked its fence with dblock_check_fence() is
// rolled back at COMMIT (certification, 1213) once node 3 took the lease over: its write never
// lands. Negative control: the same transaction without the check commits.
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "dblock/lease_lock.hpp"
#include "dblock/migrate.hpp"
#include "fault_support.hpp"
#include "harness.hpp"
#include "mysql_client.hpp"

using namespace dblock::test::faults;

namespace {

// A connection of a client outside dblock (the MariaDB C client) to one node.
class node_client {
 public:
  explicit node_client(const std::string& url) : m_(connect_mysql(url, CLIENT_MULTI_RESULTS)) {}
  ~node_client() { mysql_close(m_); }
  node_client(const node_client&) = delete;
  node_client& operator=(const node_client&) = delete;

  std::optional<long long> run(const std::string& sql) { return mysql_run(m_, sql); }
  // The server's error number of running `sql`, 0 when it succeeded.
  unsigned error_of(const std::string& sql) {
    try {
      run(sql);
      return 0;
    } catch (const mysql_failure& e) {
      return e.number;
    }
  }

 private:
  MYSQL* m_;
};

}  // namespace

DBLOCK_TEST_ONLY("mysql",
                 "galera: the SQL API on one node and the library on another exclude each "
                 "other, and a stale fenced transaction is rolled back at COMMIT",
                 "[faults][topology][galera][sql_api]") {
  const std::string node1 = env_or_fail("DBLOCK_TEST_GALERA_NODE1_URL");
  const std::string node3 = env_or_fail("DBLOCK_TEST_GALERA_NODE3_URL");
  dblock::database_options o;
  o.table_prefix = ctx.prefix;
  dblock::database db3(node3, o);
  dblock::migrate(db3);  // tables and routines, replicated to every node
  const std::string p = ctx.prefix;
  const std::string counter = p + "sqlapi_counter";
  node_client c1(node1);
  c1.run("CREATE TABLE " + counter + " (id INT PRIMARY KEY, n INT NOT NULL)");
  c1.run("INSERT INTO " + counter + " (id, n) VALUES (1, 0)");
  c1.run("SET SESSION wsrep_sync_wait = 1");  // its reads see what node 3 committed
  const std::string name = "galera-sql-" + random_suffix();
  // Inside a transaction: one try (a 1213 there rolled the whole transaction back).
  auto call_once = [&](const std::string& routine, const std::string& args) {
    return c1.run("CALL " + p + "dblock_" + routine + "('" + name + "', " + args + ")");
  };
  // A call of its own is sent again after 1213, as docs/sql-api.md tells clients to do: a write
  // certified on another node at the same moment (here: the library's, on node 3) aborted it,
  // and nothing of it happened.
  int certification_retries = 0;
  auto call = [&](const std::string& routine, const std::string& args) {
    for (int attempt = 1;; ++attempt) {
      try {
        return call_once(routine, args);
      } catch (const mysql_failure& e) {
        if (e.number != 1213 || attempt >= 5) throw;
        ++certification_retries;
        std::this_thread::sleep_for(milliseconds(10 * attempt));
      }
    }
  };

  // Interop across nodes.
  dblock::lease_options lo;
  lo.ttl = milliseconds(1500);
  dblock::lease_lock lock(db3, name, lo);
  const auto f1 = call("acquire", "'sql-a', 30000");
  REQUIRE(f1);
  CHECK_FALSE(lock.try_acquire());  // held through SQL on node 1: refused on node 3
  CHECK(call("release", "'sql-a', " + std::to_string(*f1)) == 1);
  // Node 3 sees the release once it has applied it (Galera applies after certification, and
  // the library's upsert does not wait for that): a short wait, not one try.
  std::optional<dblock::lease_guard> g;
  g.emplace(lock.acquire(milliseconds(5000)));
  CHECK(g->fence() > *f1);
  CHECK_FALSE(call("acquire", "'sql-a', 30000"));  // held by the library on node 3
  const auto f2 = g->fence();
  g->release();
  const auto f3 = call("acquire", "'sql-a', 1000");
  REQUIRE(f3);
  CHECK(*f3 > f2);

  // A fenced transaction on node 1 whose lease expires and is taken over on node 3 meanwhile.
  auto stale_commit = [&](bool check, long long fence) {
    c1.run("BEGIN");
    if (check) call_once("check_fence", std::to_string(fence));
    c1.run("UPDATE " + counter + " SET n = n + 1 WHERE id = 1");
    std::this_thread::sleep_for(milliseconds(1300));  // past the 1 s TTL
    auto taken = lock.try_acquire();                  // node 3: the lease is free
    REQUIRE(taken);
    CHECK(taken->fence() > fence);
    const unsigned err = c1.error_of("COMMIT");
    taken->release();
    return err;
  };
  const unsigned err = stale_commit(true, *f3);
  INFO("COMMIT of the stale fenced transaction: error " << err);
  CHECK(err == 1213);  // certification failed: rolled back
  c1.run("ROLLBACK");
  CHECK(c1.run("SELECT n FROM " + counter + " WHERE id = 1") == 0);  // nothing landed

  // Negative control: without dblock_check_fence() the same stale transaction commits.
  const auto f4 = call("acquire", "'sql-a', 1000");
  REQUIRE(f4);
  CHECK(stale_commit(false, *f4) == 0);
  CHECK(c1.run("SELECT n FROM " + counter + " WHERE id = 1") == 1);
  c1.run("DROP TABLE " + counter);
  report("galera-sql-api", "galera", 2, 2, err == 1213 ? 0 : 1,
         "stale_commit_error=" + std::to_string(err) +
             " certification_retries=" + std::to_string(certification_retries));
}

// Session leases (docs/session-leases.md) are refused on Galera: GET_LOCK is local to one node,
// so a session of another node would get the same lock. The refusal names the reason, and the
// durable mode of the same name works (the control: the cluster and the schema are fine).
DBLOCK_TEST_ONLY("mysql", "galera: session leases are refused with the reason; durable ones work",
                 "[faults][topology][galera][session_lease]") {
  const std::string node1 = env_or_fail("DBLOCK_TEST_GALERA_NODE1_URL");
  dblock::database_options o;
  o.table_prefix = ctx.prefix;
  dblock::database db(node1, o);
  dblock::migrate(db);
  const std::string name = "galera-session-" + random_suffix();
  dblock::lease_lock session(db, name, {}, dblock::lease_mode::session);
  std::string refused;
  try {
    (void)session.try_acquire();
  } catch (const dblock::error& e) {
    CHECK(e.code() == dblock::errc::invalid_argument);
    refused = e.what();
  }
  INFO(refused);
  CHECK(refused.find("Galera") != std::string::npos);
  CHECK_THROWS_AS(session.acquire(std::chrono::milliseconds(200)), dblock::error);
  dblock::lease_lock durable(db, name);
  auto g = durable.try_acquire();
  REQUIRE(g);
  CHECK(g->fence() > 0);
}
