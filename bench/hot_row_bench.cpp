// Updates per second on ONE hot row with 1, 4 and 16 workers (threads, one connection each),
// for three ways to update it safely: optimistic version with retry, SELECT ... FOR UPDATE in a
// retried transaction, and a conditional (CAS) update.
// Usage: dblock_hot_row_bench URL [SECONDS_PER_CELL=3]
#include <soci/soci.h>
#include <dblock/dblock.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

double run(const dblock::database& db, int workers, double seconds,
           const std::function<void()>& one_update) {
  std::atomic<long long> done{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < workers; ++i)
    ts.emplace_back([&] {
      while (!stop) {
        one_update();
        ++done;
      }
    });
  auto t0 = clk::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : ts)
    t.join();
  (void)db;
  return done / std::chrono::duration<double>(clk::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [SECONDS]\n", argv[0]);
    return 2;
  }
  const double seconds = argc > 2 ? std::stod(argv[2]) : 3;
  dblock::database_options o;
  o.table_prefix = "benchhot_";
  o.pool_size = 20;
  dblock::database db(argv[1], o);
  dblock::migrate(db);
  {
    auto c = db.connect();
    c.session() << "DROP TABLE IF EXISTS benchhot_item";
    c.session() << "CREATE TABLE benchhot_item (id INTEGER PRIMARY KEY, stock BIGINT NOT NULL,"
                   " version BIGINT NOT NULL)";
    c.session() << "INSERT INTO benchhot_item (id, stock, version) VALUES (1, 1000000000, 0)";
  }
  const dblock::versioned_table spec{"benchhot_item", "id", "version", {"stock"}};
  const auto forever = dblock::retry_policy::until_success();
  auto optimistic = [&] {
    dblock::versioned_update(
        db, spec, 1LL, [](dblock::record& r) { std::get<long long>(r["stock"]) -= 1; }, forever);
  };
  auto for_update = [&] {
    dblock::run_transaction(
        db,
        [&](dblock::transaction& t) {
          auto rows = t.lock_rows({"benchhot_item", "id", 1LL, {"stock"}});
          t.session() << "UPDATE benchhot_item SET stock = stock - 1 WHERE id = 1";
        },
        forever);
  };
  const dblock::cas_update cas{
      "benchhot_item", "stock = stock - 1", "id = :id AND stock > 0", {{"id", 1LL}}};
  auto conditional = [&] { dblock::compare_and_set(db, cas, forever); };

  std::printf("%-10s %-24s %10s %10s %10s\n", "backend", "successful updates/s", "1", "4", "16");
  for (auto& [label, fn] : std::vector<std::pair<const char*, std::function<void()>>>{
           {"optimistic + retry", optimistic},
           {"FOR UPDATE txn", for_update},
           {"CAS", conditional}}) {
    double r1 = run(db, 1, seconds, fn), r4 = run(db, 4, seconds, fn),
           r16 = run(db, 16, seconds, fn);
    std::printf("%-10s %-24s %10.0f %10.0f %10.0f\n", db.backend().c_str(), label, r1, r4, r16);
    std::fflush(stdout);
  }
  db.connect().session() << "DROP TABLE benchhot_item";
  return 0;
}
