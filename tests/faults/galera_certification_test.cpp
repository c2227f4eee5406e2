// Galera certifies the rows a transaction wrote, not the rows it locked (docs/deployment.md). The
// row lock and the fence check are therefore writes of the lock row on a Galera node (migration
// 0019, vocabulary::lock_by_writing): a row lock taken on one node and a row lock of the same
// name taken on another cannot both commit, and a fenced write whose lease is taken over on
// another node before its COMMIT never lands, whichever of certification and the node's applier
// reaches it first. Control: the same two row locks as locking reads (SELECT ... FOR UPDATE,
// what dblock did before) both commit, every time.
#include <soci/soci.h>

#include <chrono>
#include <string>

#include "dblock/admin.hpp"
#include "dblock/lease_lock.hpp"
#include "dblock/migrate.hpp"
#include "dblock/transaction.hpp"
#include "fault_support.hpp"
#include "harness.hpp"

using namespace dblock::test::faults;
using std::chrono::milliseconds;

namespace {

struct two_nodes {
  explicit two_nodes(const dblock::test::context& ctx)
      : db1(env_or_fail("DBLOCK_TEST_GALERA_NODE1_URL"), options(ctx)),
        db3(env_or_fail("DBLOCK_TEST_GALERA_NODE3_URL"), options(ctx)) {
    dblock::migrate(db1);  // tables and routines, replicated to every node
    rows = ctx.prefix + "cert_rows";
    dblock::transaction t(db1);
    t.session() << "CREATE TABLE IF NOT EXISTS " + rows +
                       " (id INT PRIMARY KEY, node INT NOT NULL)";
    t.commit();
  }
  static dblock::database_options options(const dblock::test::context& ctx) {
    dblock::database_options o;
    o.table_prefix = ctx.prefix;
    return o;
  }
  // Rows with `id` as each node sees them once it has applied everything committed before
  // (dblock's sessions read with wsrep_sync_wait = 1).
  long long count(const dblock::database& db, int id) const {
    long long n = -1;
    dblock::transaction t(db);
    t.session() << "SELECT COUNT(*) FROM " + rows + " WHERE id = " + std::to_string(id),
        soci::into(n);
    t.commit();
    return n;
  }
  void insert(dblock::transaction& t, int id, int node) const {
    t.session() << "INSERT INTO " + rows + " (id, node) VALUES (" + std::to_string(id) + ", " +
                       std::to_string(node) + ")";
  }
  dblock::database db1, db3;
  std::string rows;
};

// COMMIT of `t`: 0 when it committed, else the error's kind (1213 is errc::deadlock).
int commit_outcome(dblock::transaction& t) {
  try {
    t.commit();
    return 0;
  } catch (const dblock::error& e) {
    INFO("COMMIT failed: " << e.what());
    return static_cast<int>(e.kind());
  }
}

}  // namespace

DBLOCK_TEST_ONLY("mysql",
                 "galera: row locks of one name taken on two nodes cannot both commit; the "
                 "later COMMIT is rolled back whole",
                 "[faults][topology][galera][row_lock]") {
  two_nodes n(ctx);
  // Each round: the transaction on `first` takes the lock and writes, the one on `second` takes
  // the lock of the same name (it does not wait: row locks are not held across nodes), writes
  // and commits; the first one's COMMIT then must fail, and its row must not land.
  int round = 0;
  for (const bool node1_first : {true, false, true}) {
    ++round;
    const std::string name = "cert-row-" + std::to_string(round) + "-" + random_suffix();
    dblock::database& first = node1_first ? n.db1 : n.db3;
    dblock::database& second = node1_first ? n.db3 : n.db1;
    {
      auto make = dblock::lock_resource(second, name, milliseconds(5000));  // creates the row
      make.commit();
    }
    n.count(first, 0);  // a read waits until the node applied the row (wsrep_sync_wait)
    auto t1 = dblock::lock_resource(first, name, milliseconds(5000));
    n.insert(t1, round * 10 + 1, node1_first ? 1 : 3);
    auto t2 = dblock::lock_resource(second, name, milliseconds(5000));
    n.insert(t2, round * 10 + 2, node1_first ? 3 : 1);
    REQUIRE(commit_outcome(t2) == 0);
    const int late = commit_outcome(t1);
    INFO("round " << round << (node1_first ? ": node 1" : ": node 3") << " locked first");
    CHECK(late == static_cast<int>(dblock::errc::deadlock));
    CHECK(n.count(n.db1, round * 10 + 1) == 0);  // nothing of the rolled-back one landed
    CHECK(n.count(n.db3, round * 10 + 2) == 1);
  }
  report("galera-row-lock", "galera", round, round, 0, "");
}

DBLOCK_TEST_ONLY("mysql",
                 "galera negative control: two locking reads of one row on two nodes both "
                 "commit (a lock alone is not certified)",
                 "[faults][topology][galera][row_lock][control]") {
  two_nodes n(ctx);
  const std::string name = "cert-read-" + random_suffix();
  {
    auto make = dblock::lock_resource(n.db1, name, milliseconds(5000));
    make.commit();
  }
  n.count(n.db3, 0);  // node 3 has applied the row
  const std::string lock = "SELECT 1 FROM " + ctx.prefix + "resource_lock WHERE resource_name = '" +
                           name + "' FOR UPDATE";
  int both = 0;
  for (int i = 0; i < 3; ++i) {
    dblock::transaction t1(n.db1);
    int one = 0;
    t1.session() << lock, soci::into(one);
    n.insert(t1, 100 + 2 * i, 1);
    dblock::transaction t3(n.db3);
    t3.session() << lock, soci::into(one);
    n.insert(t3, 101 + 2 * i, 3);
    const int a = commit_outcome(t3), b = commit_outcome(t1);
    if (a == 0 && b == 0) ++both;
  }
  CHECK(both == 3);  // what the write of the lock row prevents, shown every time
}

DBLOCK_TEST_ONLY("mysql",
                 "galera: a fenced write whose lease another node takes over before its COMMIT "
                 "never lands",
                 "[faults][topology][galera][fence]") {
  two_nodes n(ctx);
  const int trials = count(20, 60);
  int rolled_back = 0, stale = 0;
  for (int i = 0; i < trials; ++i) {
    const std::string name = "cert-fenced-" + std::to_string(i) + "-" + random_suffix();
    dblock::lease_lock l1(n.db1, name), l3(n.db3, name);
    auto g = l1.acquire(milliseconds(5000));
    const int id = 1000 + i;
    bool taken = false;
    try {
      g.fenced([&](soci::session& s) {
        s << "INSERT INTO " + n.rows + " (id, node) VALUES (" + std::to_string(id) + ", 1)";
        if (taken) return;
        // Node 3 takes the lease over while this transaction is open on node 1.
        dblock::force_release(n.db3, name, "galera certification test", "test");
        auto g3 = l3.try_acquire();
        REQUIRE(g3);
        CHECK(g3->fence() > g.fence());
        taken = true;
      });
    } catch (const dblock::error& e) {
      INFO(e.what());
      CHECK((e.kind() == dblock::errc::deadlock || e.kind() == dblock::errc::lease_lost));
      ++rolled_back;
    }
    REQUIRE(taken);
    if (n.count(n.db3, id) != 0) ++stale;
  }
  CHECK(stale == 0);
  CHECK(rolled_back == trials);
  report("galera-fenced-takeover", "galera", trials, trials, stale,
         "rolled_back=" + std::to_string(rolled_back));
}
