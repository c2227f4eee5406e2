#include "backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "rows.hpp"
#include "storage/session.hpp"

namespace dblock::bench {

std::unique_ptr<backend_ctx> open_backend(const std::string& url, const options& o) {
  dblock::database_options dbo;
  dbo.share_listener = !o.listener_per_handle;
  dblock::detail::set_handover_enabled(!o.no_handover);
  dbo.table_prefix = o.prefix;
  dbo.pool_size =
      static_cast<std::size_t>(*std::max_element(o.clients.begin(), o.clients.end())) + 2;
  dblock::database db(url, dbo);
  dblock::migrate(db);
  auto b = std::unique_ptr<backend_ctx>(
      new backend_ctx{url, db.backend(), "", "", "", {}, db, {}, "", "", "", {}, nullptr});
  const auto& impl = detail::access::impl(db);
  b->sql = {impl->statements.acquire.text, impl->statements.release.text,
            impl->statements.renew.text, impl->dia->exec.statement_in_transaction()};
  b->item = o.prefix + "item";
  b->prefix = o.prefix;
  b->for_update = impl->dia->sql.for_update();
  b->begin_write = impl->dia->sql.begin_write();
  b->version = connect_raw(url)->server_version();
  b->session_leases = impl->statements.can.session_leases &&
                      db.options().pooler != dblock::pooler_mode::transaction &&
                      detail::with_session(impl, "bench", [](detail::session_scope& s) {
                        return s.dia().conn.session_lease_refusal(s.state()) == nullptr;
                      });
  if (o.poll_max_ms > 0) b->wait_options.poll_max = std::chrono::milliseconds(o.poll_max_ms);
  if (b->backend == "postgresql" && db.options().pooler != dblock::pooler_mode::transaction &&
      (selected(o.only, "raw.lease_fast") || selected(o.only, "dblock.lease_fast") ||
       selected(o.only, "dblock.handoff_fast")) &&
      o.prefix.find("fast_") == std::string::npos) {
    options fo = o;
    fo.prefix = o.prefix + "fast_";
    b->fast = open_backend(url, fo);
    dblock::set_lease_durability(b->fast->db, dblock::lease_durability::fast);
  }
  drop_business_tables(*b);
  auto c = db.connect();
  c.session() << "CREATE TABLE " << b->prefix << "order_row (id BIGINT NOT NULL PRIMARY KEY)";
  c.session() << "CREATE TABLE " << b->item
              << " (id BIGINT NOT NULL PRIMARY KEY, stock BIGINT NOT NULL, version BIGINT NOT "
                 "NULL)";
  for (int first = 1; first <= kItems; first += 500) {
    std::string q = "INSERT INTO " + b->item + " (id, stock, version) VALUES ";
    for (int id = first; id < first + 500 && id <= kItems; ++id)
      q += (id == first ? "" : ",") + ("(" + std::to_string(id) + ", 1000000000, 0)");
    c.session() << q;
  }
  // Lease rows of the hot and handoff keys start free.
  c.session() << "DELETE FROM " << db.lock_table() << " WHERE resource_name LIKE 'bench/%'";
  // The hot item of the segmented-stock rows: more stock than any run can sell.
  dblock::segmented_stock stock(db, kStockName);
  stock.drop();
  stock.create(1000000000000000LL, kStockSegments);
  return b;
}

void drop_business_tables(backend_ctx& b) {
  auto c = b.db.connect();
  c.session() << "DROP TABLE IF EXISTS " << b.item;
  c.session() << "DROP TABLE IF EXISTS " << b.prefix << "order_row";
}

void name_row(result& r, const backend_ctx& b, std::string operation, std::string kind) {
  r.backend = b.backend;
  r.label = b.label;
  r.operation = std::move(operation);
  r.kind = std::move(kind);
}

std::optional<long long> raw_acquire(raw_client& c, const backend_ctx& b, const std::string& name,
                                     const std::string& tok, long long floor) {
  if (b.sql.write_transaction) c.run("begin", "BEGIN IMMEDIATE", {});
  outcome o;
  try {
    o = c.run("acquire", b.sql.acquire,
              {{"name", name},
               {"token", tok},
               {"ttl", kTtlUs},
               {"host", std::string("bench")},
               {"pid", static_cast<long long>(::getpid())},
               {"thread", std::string("1")},
               {"floor", floor}});
  } catch (...) {
    if (b.sql.write_transaction) c.exec("ROLLBACK");
    throw;
  }
  if (b.sql.write_transaction) c.run("commit", "COMMIT", {});
  if (b.backend == "mysql")
    return o.insert_id > 0 ? std::optional<long long>(o.insert_id) : std::nullopt;
  return o.value;
}

bool raw_simple_write(raw_client& c, const backend_ctx& b, const std::string& key,
                      const std::string& sql, const params& p) {
  if (b.sql.write_transaction) c.run("begin", "BEGIN IMMEDIATE", {});
  outcome o;
  try {
    o = c.run(key, sql, p);
  } catch (...) {
    if (b.sql.write_transaction) c.exec("ROLLBACK");
    throw;
  }
  if (b.sql.write_transaction) c.run("commit", "COMMIT", {});
  return o.affected == 1;
}

bool raw_release(raw_client& c, const backend_ctx& b, const std::string& name,
                 const std::string& tok, long long fence) {
  // As dblock does on SQLite: the release's commit does not sync the WAL, unless the URL set
  // NORMAL already (PostgreSQL's statement text says so itself).
  if (c.synchronous < 0)
    c.synchronous =
        b.backend == "sqlite" ? c.run("level", "PRAGMA synchronous", {}).value.value_or(0) : 0;
  const long long level = c.synchronous;
  if (level > 1) c.run("relax", "PRAGMA synchronous = NORMAL", {});
  params p{{"name", name}, {"token", tok}, {"fence", fence}};
  if (b.sql.release.find(":bell") != std::string::npos) p.push_back({"bell", std::string()});
  // The queue the release rings: the lease's own (a semaphore's permit names its semaphore's).
  if (b.sql.release.find(":queue") != std::string::npos) p.push_back({"queue", name});
  const bool ok = raw_simple_write(c, b, "release", b.sql.release, p);
  if (level > 1) c.exec("PRAGMA synchronous = " + std::to_string(level));
  return ok;
}

std::string key_name(int thread, int keys) {
  return "bench/" + std::to_string(thread) + "/" + std::to_string(rand_below(keys));
}

cycle_fn lease_cycle(const dblock::database& db, const std::string& base, int keys) {
  auto locks = std::make_shared<std::vector<dblock::lease_lock>>();
  for (int k = 0; k < keys; ++k)
    locks->emplace_back(db, base + std::to_string(k));
  return cycle_fn([locks, keys] {
    auto g = (*locks)[rand_below(keys)].try_acquire();
    if (!g) return false;
    g->release();
    return true;
  });
}

}  // namespace dblock::bench
