// Each dialect's typed answers (vocabulary::can(), dialect/capabilities.hpp) agree with the
// statement texts it gives: a text a capability needs is non-empty exactly when the capability
// says so, so that no layer above src/dialect/ ever needs to ask a text whether it is empty.
// Negative control: an answer that disagrees with its texts is caught.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "dialect/dialect.hpp"

using namespace dblock::detail;

namespace {

struct mismatch_list {
  std::vector<std::string> found;
  void expect(bool capable, const std::string& text, const std::string& what) {
    if (capable != !text.empty())
      found.push_back(what + (capable ? ": capable but the text is empty"
                                      : ": not capable but the text is \"" + text + "\""));
  }
};

std::vector<std::string> mismatches(const vocabulary& v, const capabilities& c) {
  const table_names t = make_table_names("dblock_");
  mismatch_list m;
  const bool notify = c.ring == release_ring::notify;
  const bool interrupt = c.ring == release_ring::interrupt;
  m.expect(notify, v.release_returning(t, false), "release_returning");
  m.expect(notify, v.release_returning(t, true), "release_returning (forced)");
  m.expect(notify, v.head_notify(t), "head_notify");
  m.expect(interrupt, v.release_head(t), "release_head");
  m.expect(interrupt, v.bell_ring(), "bell_ring");
  m.expect(interrupt, v.head_sleeper(t), "head_sleeper");
  m.expect(c.hand_over == handover::in_release, v.lease_release_granting(t),
           "lease_release_granting");
  m.expect(c.hand_over == handover::two_statements, v.lease_grant_take(t), "lease_grant_take");
  m.expect(c.hand_over == handover::two_statements, v.lease_grant_give(t), "lease_grant_give");
  m.expect(c.exit == queue_exit::in_acquire, v.lease_acquire_dequeue(t, false),
           "lease_acquire_dequeue");
  m.expect(c.exit == queue_exit::in_acquire, v.lease_acquire_dequeue(t, true),
           "lease_acquire_dequeue (in order)");
  m.expect(c.skip_locked, v.for_update_skip_locked(), "for_update_skip_locked");
  m.expect(c.durability_per_table, v.lock_table_durable(), "lock_table_durable");
  m.expect(c.durability_per_table, v.set_lock_table_durability(t, true),
           "set_lock_table_durability");
  m.expect(!c.durability_per_table, v.no_fast_leases(), "no_fast_leases");
  m.expect(c.durable_commit, v.durable_commit(), "durable_commit");
  return m.found;
}

}  // namespace

TEST_CASE("dialect: each backend's typed capabilities agree with its statement texts",
          "[unit][dialect]") {
  for (const dialect* d : {&postgresql_dialect(), &mysql_dialect(), &sqlite_dialect()}) {
    INFO(d->name);
    const capabilities c = d->sql.can();
    const std::vector<std::string> found = mismatches(d->sql, c);
    for (const auto& m : found)
      UNSCOPED_INFO(m);
    CHECK(found.empty());
    // A queue exit in the acquire's own write transaction needs statements that run in one.
    CHECK((c.exit == queue_exit::same_transaction) == d->exec.statement_in_transaction());
    // Negative control: every answer flipped is caught.
    capabilities wrong = c;
    wrong.skip_locked = !c.skip_locked;
    wrong.durability_per_table = !c.durability_per_table;
    wrong.durable_commit = !c.durable_commit;
    wrong.ring = c.ring == release_ring::notify ? release_ring::interrupt : release_ring::notify;
    wrong.hand_over = c.hand_over == handover::none ? handover::in_release : handover::none;
    wrong.exit = c.exit == queue_exit::in_acquire ? queue_exit::deferred : queue_exit::in_acquire;
    CHECK(mismatches(d->sql, wrong).size() >= 8);
  }
}

// The answers that have no statement text of their own, as each backend gives them: PostgreSQL
// alone runs behind a transaction-mode pooler, never waits in ON CONFLICT DO NOTHING, and has no
// expiry index (migration 0010) so its reaper goes in key order.
TEST_CASE("dialect: the answers without a statement text, per backend", "[unit][dialect]") {
  struct expected {
    const dialect* d;
    bool pooler, insert_waits, reap_by_key;
  };
  for (const expected& e : {expected{&postgresql_dialect(), true, false, true},
                            expected{&mysql_dialect(), false, true, false},
                            expected{&sqlite_dialect(), false, true, false}}) {
    INFO(e.d->name);
    const capabilities c = e.d->sql.can();
    CHECK(c.pooler == e.pooler);
    CHECK(c.insert_if_absent_waits == e.insert_waits);
    CHECK(c.reap_in_key_order == e.reap_by_key);
  }
}
