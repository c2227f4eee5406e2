// The data rows: a FOR UPDATE transaction, optimistic updates (versioned_update), compare and
// set, the segmented stock with and without an order row, and the ID generator.
#include <soci/soci.h>
#include <dblock/dblock.hpp>

#include <memory>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "rows.hpp"

namespace dblock::bench {
namespace {

// A transaction that locks a random row of the business table and updates it.
void add_for_update_rows(std::vector<row>& ops) {
  ops.push_back(
      {"raw.for_update", "floor", "",
       "BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT on a random row", [](backend_ctx& b, int) {
         auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
         return cycle_fn([c, &b] {
           const long long id = 1 + rand_below(kItems);
           c->run("begin_w", b.begin_write, {});
           try {
             c->run("fu_select",
                    "SELECT id, stock FROM " + b.item + " WHERE id = :id" + b.for_update,
                    {{"id", id}});
             c->run("fu_update", "UPDATE " + b.item + " SET stock = stock - 1 WHERE id = :id",
                    {{"id", id}});
             c->run("commit", "COMMIT", {});
           } catch (...) {
             c->exec("ROLLBACK");
             throw;
           }
           return true;
         });
       }});
  // The UPDATE through compare_and_set() on the transaction's connection: prepared once per
  // connection like the raw floor's (an UPDATE sent through t.session() is parsed every time).
  ops.push_back({"dblock.for_update", "dblock", "raw.for_update",
                 "run_transaction + lock_rows + compare_and_set(t.connection()) UPDATE on a "
                 "random row",
                 [](backend_ctx& b, int) {
                   return cycle_fn([&b] {
                     const long long id = 1 + rand_below(kItems);
                     dblock::run_transaction(b.db, [&](dblock::transaction& t) {
                       t.lock_rows({b.item, "id", id, {"stock"}});
                       dblock::compare_and_set(
                           t.connection(), {b.item, "stock = stock - 1", "id = :id", {{"id", id}}});
                     });
                     return true;
                   });
                 }});
}

// Read, then UPDATE ... WHERE version = ?, again on conflict: on one row and on random rows.
void add_optimistic_rows(std::vector<row>& ops) {
  auto raw_opt = [](bool hot) {
    return [hot](backend_ctx& b, int) {
      auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
      return cycle_fn([c, &b, hot] {
        const long long id = hot ? 1 : 1 + rand_below(kItems);
        for (;;) {
          // One read of both columns: version * 2^32 + stock packs them into the first column.
          auto r = c->run("opt_read",
                          "SELECT version * 4294967296 + stock FROM " + b.item + " WHERE id = :id",
                          {{"id", id}});
          const long long v = r.value.value_or(0);
          auto o = c->run("opt_write",
                          "UPDATE " + b.item +
                              " SET stock = :stock, version = version + 1 WHERE id = :id AND "
                              "version = :version",
                          {{"stock", (v & 0xffffffffLL) - 1}, {"id", id}, {"version", v >> 32}});
          if (o.affected == 1) return true;
        }
      });
    };
  };
  auto dblock_opt = [](bool hot) {
    return [hot](backend_ctx& b, int) {
      auto spec = std::make_shared<dblock::versioned_table>(
          dblock::versioned_table{b.item, "id", "version", {"stock"}});
      return cycle_fn([&b, spec, hot] {
        const long long id = hot ? 1 : 1 + rand_below(kItems);
        dblock::versioned_update(
            b.db, *spec, id, [](dblock::record& r) { std::get<long long>(r["stock"]) -= 1; },
            dblock::retry_policy::until_success());
        return true;
      });
    };
  };
  ops.push_back({"raw.optimistic_hot", "floor", "",
                 "read; UPDATE ... WHERE version = ?; again on conflict; one row", raw_opt(true)});
  ops.push_back({"dblock.optimistic_hot", "dblock", "raw.optimistic_hot",
                 "versioned_update, until success; one row", dblock_opt(true)});
  ops.push_back(
      {"raw.optimistic_spread", "floor", "", "the same on random rows of 10,000", raw_opt(false)});
  ops.push_back({"dblock.optimistic_spread", "dblock", "raw.optimistic_spread",
                 "versioned_update on random rows of 10,000", dblock_opt(false)});
}

// A conditional decrement of one row.
void add_cas_rows(std::vector<row>& ops) {
  ops.push_back(
      {"raw.cas", "floor", "", "UPDATE ... SET stock = stock - 1 WHERE id = 1 AND stock > 0",
       [](backend_ctx& b, int) {
         auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
         return cycle_fn([c, &b] {
           return c->run("cas",
                         "UPDATE " + b.item + " SET stock = stock - 1 WHERE id = :id AND stock > 0",
                         {{"id", 1LL}})
                      .affected == 1;
         });
       }});
  ops.push_back(
      {"dblock.cas", "dblock", "raw.cas", "compare_and_set on one row", [](backend_ctx& b, int) {
         auto u = std::make_shared<dblock::cas_update>(dblock::cas_update{
             b.item, "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}});
         return cycle_fn([&b, u] { return dblock::compare_and_set(b.db, *u) == 1; });
       }});
}

// Segmented stock: the same hot item split into 16 rows; its floor is the same conditional
// update on a random segment.
void add_stock_rows(std::vector<row>& ops) {
  ops.push_back({"raw.stock_take", "floor", "",
                 "UPDATE ... SET amount = amount - 1 WHERE <segment> AND amount >= 1, random "
                 "segment of 16",
                 [](backend_ctx& b, int) {
                   auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                   const std::string sql = "UPDATE " + b.prefix +
                                           "stock_segment SET amount = amount - :k WHERE "
                                           "stock_name = :name AND segment = :seg AND amount >= :k";
                   return cycle_fn([c, &b, sql] {
                     if (b.sql.write_transaction) c->run("begin", "BEGIN IMMEDIATE", {});
                     const bool ok =
                         c->run("stock_take", sql,
                                {{"k", 1LL},
                                 {"name", std::string(kStockName)},
                                 {"seg", static_cast<long long>(rand_below(kStockSegments))}})
                             .affected == 1;
                     if (b.sql.write_transaction) c->run("commit", "COMMIT", {});
                     return ok;
                   });
                 }});
  ops.push_back({"dblock.stock_take", "dblock", "raw.stock_take",
                 "segmented_stock::take(1) on one hot item of 16 segments (compare dblock.cas: "
                 "the same item as one row)",
                 [](backend_ctx& b, int) {
                   auto stock = std::make_shared<dblock::segmented_stock>(b.db, kStockName);
                   return cycle_fn([stock] { return stock->take(1); });
                 }});
}

// The seeds' flash sale: the decrement and the order row in one transaction, so the hot row
// stays locked until COMMIT; the same on one row (CAS) and on 16 segments.
void add_order_rows(std::vector<row>& ops) {
  auto order_op = [](bool segmented) {
    return [segmented](backend_ctx& b, int) {
      auto stock = std::make_shared<dblock::segmented_stock>(b.db, kStockName);
      auto cas = std::make_shared<dblock::cas_update>(
          dblock::cas_update{b.item, "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}});
      const std::string insert = "INSERT INTO " + b.prefix + "order_row (id) VALUES (:id)";
      return cycle_fn([&b, stock, cas, insert, segmented] {
        static thread_local std::mt19937_64 rng(std::random_device{}());
        return dblock::run_transaction(b.db, [&](dblock::transaction& t) {
          const bool taken = segmented ? stock->take(t.connection(), 1)
                                       : dblock::compare_and_set(t.connection(), *cas) == 1;
          if (!taken) return false;
          const long long id = static_cast<long long>(rng() >> 1);
          t.session() << insert, soci::use(id, "id");
          return true;
        });
      });
    };
  };
  ops.push_back({"dblock.cas_order", "feature", "",
                 "transaction: compare_and_set on one hot row + INSERT of an order row",
                 order_op(false)});
  ops.push_back({"dblock.stock_order", "feature", "",
                 "transaction: segmented_stock::take(1) on 16 segments + INSERT of an order row",
                 order_op(true)});
}

// The ID generator: one next() per operation, blocks of 1,000 reserved in the background.
void add_id_rows(std::vector<row>& ops) {
  ops.push_back({"dblock.id_next", "feature", "",
                 "id_generator::next(), blocks of 1,000, prefetch on; one generator per client, "
                 "all on one name",
                 [](backend_ctx& b, int) {
                   auto gen = std::make_shared<dblock::id_generator>(b.db, "bench/ids");
                   return cycle_fn([gen] { return gen->next() > 0; });
                 }});
}

}  // namespace

std::vector<row> data_rows(backend_ctx&, const options&) {
  std::vector<row> ops;
  add_for_update_rows(ops);
  add_optimistic_rows(ops);
  add_cas_rows(ops);
  add_stock_rows(ops);
  add_order_rows(ops);
  add_id_rows(ops);
  return ops;
}

}  // namespace dblock::bench
