// Exhausted retry loops keep the cause: when every attempt fails, versioned_update,
// compare_and_set and run_transaction throw the last attempt's own code (lock_not_available for a
// lock wait timeout or SQLite BUSY, version_conflict only for a real conflict), with attempts()
// equal to the attempts made and elapsed() set. Each scenario has its control: the same call
// without the contention succeeds.
#include <soci/soci.h>

#include <optional>
#include <string>
#include <vector>

#include "harness.hpp"

using dblock::retry_policy;
using namespace dblock::test;

namespace {

// <prefix><stem> (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)
// with the rows (1, 0, 0) and (2, 0, 0).
std::string create_acct(const dblock::test::context& ctx, table_cleanup& cleanup) {
  std::string t = cleanup.add(ctx.table("rc_acct"));
  ctx.exec("CREATE TABLE " + t +
           " (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, balance, version) VALUES (1, 0, 0)");
  ctx.exec("INSERT INTO " + t + " (id, balance, version) VALUES (2, 0, 0)");
  return t;
}

dblock::versioned_table acct_spec(const std::string& table) {
  dblock::versioned_table s;
  s.table = table;
  s.key_column = "id";
  s.columns = {"balance"};
  return s;
}

void increment(dblock::record& r) {
  r["balance"] = std::get<long long>(r.at("balance")) + 1;
}

struct acct_state {
  long long balance = -1;
  long long version = -1;
};

acct_state read_acct(const dblock::database& db, const std::string& table, long long id = 1) {
  auto c = db.connect();
  acct_state s;
  c.session() << "SELECT balance, version FROM " << table << " WHERE id = " << id,
      soci::into(s.balance), soci::into(s.version);
  return s;
}

// The error of a retry loop that ran out of attempts, each on `cause`: `cause` itself after
// `max_attempts` attempts that took time, and every retry (`causes`) caused by it.
void check_gave_up(const dblock::error& e, errc cause, int max_attempts,
                   const std::vector<errc>& causes) {
  CHECK(e.code() == cause);
  CHECK(e.attempts() == max_attempts);
  CHECK(e.elapsed().count() > 0);
  CHECK(causes == std::vector<errc>(max_attempts - 1, cause));
}

// `attempts` attempts, no time budget (so only the attempt count ends the loop), tiny backoff.
retry_policy policy(int attempts, std::vector<errc>* causes = nullptr) {
  retry_policy p = retry_of(attempts, milliseconds(0), milliseconds(1), milliseconds(2));
  if (causes)
    p.on_retry = [causes](const dblock::retry_event& e) { causes->push_back(e.cause.kind()); };
  return p;
}

// The dblock::error `f` throws (nothing when it returns).
template <class F>
std::optional<dblock::error> error_of(F&& f) {
  try {
    f();
  } catch (const dblock::error& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace

// (a) SQLite: every attempt meets another connection's BEGIN IMMEDIATE with a zero busy timeout.
DBLOCK_TEST_ONLY("sqlite", "exhausted retries keep the cause: SQLite BUSY is lock_not_available",
                 "[optimistic][retry-cause]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup);
  auto o = ctx.options();
  o.sqlite_busy_timeout = milliseconds(0);
  auto db = ctx.open(o);
  const auto spec = acct_spec(table);
  const dblock::cas_update cas{table, "balance = balance + 1", "id = :id", {{"id", 2LL}}};

  // Control: no other writer, both succeed at the first attempt.
  auto r = dblock::versioned_update(db, spec, 1LL, increment, policy(2));
  CHECK(r.version == 1);
  CHECK(r.stats.attempts == 1);
  CHECK(dblock::compare_and_set(db, cas, policy(2)) == 1);

  int mutate_calls = 0;
  std::vector<errc> vu_causes, cas_causes;
  std::optional<dblock::error> vu, cs;
  {
    auto blocker = ctx.db.connect();
    blocker.session() << "BEGIN IMMEDIATE";
    vu = error_of([&] {
      (void)dblock::versioned_update(
          db, spec, 1LL,
          [&](dblock::record& v) {
            ++mutate_calls;
            increment(v);
          },
          policy(2, &vu_causes));
    });
    cs = error_of([&] { (void)dblock::compare_and_set(db, cas, policy(2, &cas_causes)); });
    blocker.session() << "ROLLBACK";
  }
  REQUIRE(vu);
  INFO("versioned_update: " << vu->what());
  check_gave_up(*vu, errc::lock_not_available, 2, vu_causes);
  // The read and `mutate` run outside the write lock (docs/safety.md D3); each attempt's UPDATE
  // then met BUSY at its BEGIN IMMEDIATE.
  CHECK(mutate_calls == 2);
  REQUIRE(cs);
  INFO("compare_and_set: " << cs->what());
  check_gave_up(*cs, errc::lock_not_available, 2, cas_causes);

  // Nothing of the failed calls was written; without the blocker both succeed again.
  CHECK(read_acct(ctx.db, table).version == 1);
  CHECK(read_acct(ctx.db, table, 2).balance == 1);
  CHECK(dblock::versioned_update(db, spec, 1LL, increment, policy(2)).version == 2);
  CHECK(dblock::compare_and_set(db, cas, policy(2)) == 1);
  CHECK(read_acct(ctx.db, table, 2).balance == 2);
}

// (b) run_transaction whose body always runs into a lock wait timeout: another transaction holds
// row 1 FOR UPDATE (on SQLite: holds BEGIN IMMEDIATE, so the wait is at BEGIN).
DBLOCK_TEST("exhausted run_transaction keeps the cause: lock wait timeout is lock_not_available",
            "[optimistic][retry-cause]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup);
  dblock::transaction_options opts;
  // MySQL's innodb_lock_wait_timeout has whole seconds only.
  opts.lock_timeout = milliseconds(ctx.backend == "mysql" ? 1000 : 50);
  const dblock::row_selector row1{table, "id", 1LL, {"balance"}};
  int bodies = 0;
  // Writes row 2 first, then waits for row 1: a failed attempt must leave no trace of row 2.
  auto body = [&](dblock::transaction& t) {
    ++bodies;
    t.session() << "UPDATE " << table << " SET balance = balance + 1 WHERE id = 2";
    auto rows = t.lock_rows(row1);
    REQUIRE(rows.size() == 1);
  };

  std::vector<errc> causes;
  std::optional<dblock::error> e;
  {
    dblock::transaction holder(ctx.db);
    REQUIRE(holder.lock_rows(row1).size() == 1);
    e = error_of([&] { dblock::run_transaction(ctx.db, body, policy(2, &causes), opts); });
    holder.rollback();
  }
  REQUIRE(e);
  INFO(ctx.backend << ": " << e->what());
  CHECK(e->code() == errc::lock_not_available);
  CHECK(e->attempts() == 2);
  CHECK(e->elapsed() >= opts.lock_timeout);
  CHECK(causes == std::vector<errc>{errc::lock_not_available});
  CHECK(bodies == 2);  // (SQLite's attempts fail at BEGIN IMMEDIATE, on the body's first use)
  CHECK(read_acct(ctx.db, table, 2).balance == 0);

  // Control: nobody holds the row, the same call commits at the first attempt.
  bodies = 0;
  dblock::retry_stats stats;
  dblock::run_transaction(ctx.db, body, policy(2), opts, &stats);
  CHECK(bodies == 1);
  CHECK(stats.attempts == 1);
  CHECK(read_acct(ctx.db, table, 2).balance == 1);
}

// (c) A real version conflict at every attempt: another connection bumps the row's version
// between the attempt's read and its conditional write (from inside mutate). Only on servers:
// SQLite runs each attempt in one BEGIN IMMEDIATE transaction, so no other connection can write
// between the read and the write (its write would wait, and here deadlock, on the attempt's lock).
DBLOCK_TEST_SERVERS("exhausted versioned_update on real conflicts is still version_conflict",
                    "[optimistic][retry-cause]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup);
  const auto spec = acct_spec(table);
  const int max_attempts = 3;
  auto other = ctx.db.connect();
  int mutate_calls = 0;
  std::vector<errc> causes;
  auto e = error_of([&] {
    (void)dblock::versioned_update(
        ctx.db, spec, 1LL,
        [&](dblock::record& v) {
          ++mutate_calls;
          other.session() << "UPDATE " << table << " SET version = version + 1 WHERE id = 1";
          increment(v);
        },
        policy(max_attempts, &causes));
  });
  REQUIRE(e);
  INFO(ctx.backend << ": " << e->what());
  check_gave_up(*e, errc::version_conflict, max_attempts, causes);
  CHECK(mutate_calls == max_attempts);
  auto s = read_acct(ctx.db, table);
  CHECK(s.balance == 0);             // none of our writes landed
  CHECK(s.version == max_attempts);  // only the other connection's bumps

  // Control: no interference, the first attempt writes.
  auto r = dblock::versioned_update(ctx.db, spec, 1LL, increment, policy(max_attempts));
  CHECK(r.version == max_attempts + 1);
  CHECK(r.stats.attempts == 1);
  CHECK(read_acct(ctx.db, table).balance == 1);
}

// (c) on every backend, SQLite included: the conflict happens inside run_transaction, whose body
// runs versioned_update on the transaction's connection while mutate bumps the version through
// that same transaction (the only writer SQLite lets in between). run_transaction retries the
// whole transaction and gives up with version_conflict; every attempt, bump included, is rolled
// back.
DBLOCK_TEST("exhausted run_transaction on real conflicts is still version_conflict",
            "[optimistic][retry-cause]") {
  table_cleanup cleanup{ctx, {}};
  const std::string table = create_acct(ctx, cleanup);
  const auto spec = acct_spec(table);
  const int max_attempts = 3;
  bool interfere = true;
  int bodies = 0;
  auto body = [&](dblock::transaction& t) {
    ++bodies;
    return dblock::versioned_update(t.connection(), spec, 1LL, [&](dblock::record& v) {
      if (interfere) t.session() << "UPDATE " << table << " SET version = version + 1 WHERE id = 1";
      increment(v);
    });
  };
  std::vector<errc> causes;
  auto e =
      error_of([&] { (void)dblock::run_transaction(ctx.db, body, policy(max_attempts, &causes)); });
  REQUIRE(e);
  INFO(ctx.backend << ": " << e->what());
  check_gave_up(*e, errc::version_conflict, max_attempts, causes);
  CHECK(bodies == max_attempts);
  auto s = read_acct(ctx.db, table);
  CHECK(s.balance == 0);
  CHECK(s.version == 0);  // the bumps were rolled back with their attempts

  // Control: without the interference the first attempt commits.
  interfere = false;
  bodies = 0;
  auto r = dblock::run_transaction(ctx.db, body, policy(max_attempts));
  CHECK(r.version == 1);
  CHECK(bodies == 1);
  s = read_acct(ctx.db, table);
  CHECK(s.balance == 1);
  CHECK(s.version == 1);
}
