// Flash sale: N worker processes race to buy from a stock of S, once per strategy:
//   none        read the stock, then write stock - 1 (what goes wrong without a lock)
//   lease       a dblock lease lock around the purchase, written with guard.fenced()
//   for_update  SELECT ... FOR UPDATE on the item row inside a retried transaction
//   optimistic  a versioned update (UPDATE ... WHERE version = ?) retried on conflict
//   cas         one conditional UPDATE ... SET stock = stock - 1 WHERE stock > 0
//   segmented   dblock::segmented_stock: the stock split into up to 16 rows, each purchase one
//               conditional update of a random segment (the hot row no longer queues everyone)
// Every purchase also inserts an order row in the same transaction, so "sold" is counted from
// the orders and the invariant is: sold == stock sold off == min(S, demand), stock never < 0.
//
// Usage: flash_sale [--url URL] [--workers 8] [--stock 100] [--attempts 25] [--strategy all]
// Default URL: sqlite://flash_sale.db (created in the current directory).
#include <soci/soci.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct settings {
  std::string url = "sqlite://flash_sale.db";
  std::string prefix = "fs_";
  int workers = 8;
  long long stock = 100;
  int attempts = 25;
  std::string strategy = "all";
};

struct sold_out : std::runtime_error {
  sold_out() : std::runtime_error("sold out") {}
};

constexpr const char* segmented_name = "flash-sale/item-1";

std::string item_table(const settings& s) {
  return s.prefix + "item";
}
std::string order_table(const settings& s) {
  return s.prefix + "order";
}

void reset_tables(const settings& s) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  dblock::database db(s.url, o);
  dblock::migrate(db);  // the lease strategy needs dblock's own table
  auto c = db.connect();
  auto& sql = c.session();
  sql << "DROP TABLE IF EXISTS " << order_table(s);
  sql << "DROP TABLE IF EXISTS " << item_table(s);
  sql << "CREATE TABLE " << item_table(s)
      << " (item_id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, version INTEGER NOT NULL)";
  sql << "CREATE TABLE " << order_table(s)
      << " (order_id BIGINT PRIMARY KEY, item_id INTEGER NOT NULL, worker INTEGER NOT NULL)";
  sql << "INSERT INTO " << item_table(s) << " (item_id, stock, version) VALUES (1, " << s.stock
      << ", 0)";
  // The same stock for the segmented strategy.
  dblock::segmented_stock stock(db, segmented_name);
  stock.drop();
  stock.create(s.stock, static_cast<int>(std::min<long long>(16, s.stock)));
}

void insert_order(soci::session& sql, const settings& s, int worker, int attempt) {
  long long id = static_cast<long long>(worker) * 1000000 + attempt;
  sql << "INSERT INTO " << order_table(s) << " (order_id, item_id, worker) VALUES (:id, 1, :w)",
      soci::use(id), soci::use(worker);
}

// One buyer's attempt; returns true when it bought one unit.
bool buy(const std::string& strategy, const settings& s, const dblock::database& db,
         dblock::lease_lock& lock, int worker, int attempt) {
  const auto forever = dblock::retry_policy::until_success();
  if (strategy == "none") {
    auto c = db.connect();
    auto& sql = c.session();
    long long stock = 0;
    sql << "SELECT stock FROM " << item_table(s) << " WHERE item_id = 1", soci::into(stock);
    if (stock <= 0) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // "check the cart"
    long long left = stock - 1;
    sql << "UPDATE " << item_table(s) << " SET stock = :left WHERE item_id = 1", soci::use(left);
    insert_order(sql, s, worker, attempt);
    return true;
  }
  if (strategy == "lease") {
    auto guard = lock.acquire(std::chrono::seconds(60));
    bool bought = false;
    guard.fenced([&](soci::session& sql) {  // commits only while the lease is still ours
      long long stock = 0;
      sql << "SELECT stock FROM " << item_table(s) << " WHERE item_id = 1", soci::into(stock);
      if (stock <= 0) return;
      sql << "UPDATE " << item_table(s) << " SET stock = stock - 1 WHERE item_id = 1";
      insert_order(sql, s, worker, attempt);
      bought = true;
    });
    return bought;
  }
  if (strategy == "for_update") {
    return dblock::run_transaction(
        db,
        [&](dblock::transaction& t) {
          auto rows = t.lock_rows({item_table(s), "item_id", 1LL, {"stock"}});
          if (rows.empty() || std::get<long long>(rows[0]["stock"]) <= 0) return false;
          t.session() << "UPDATE " << item_table(s) << " SET stock = stock - 1 WHERE item_id = 1";
          insert_order(t.session(), s, worker, attempt);
          return true;
        },
        forever);
  }
  if (strategy == "optimistic") {
    const dblock::versioned_table spec{item_table(s), "item_id", "version", {"stock"}};
    try {
      dblock::run_transaction(
          db,
          [&](dblock::transaction& t) {
            dblock::versioned_update(t.connection(), spec, 1LL, [](dblock::record& r) {
              auto& stock = std::get<long long>(r["stock"]);
              if (stock <= 0) throw sold_out();
              stock -= 1;
            });
            insert_order(t.session(), s, worker, attempt);
          },
          forever);
      return true;
    } catch (const sold_out&) {
      return false;
    }
  }
  if (strategy == "segmented") {
    const dblock::segmented_stock stock(db, segmented_name);
    return dblock::run_transaction(
        db,
        [&](dblock::transaction& t) {
          if (!stock.take(t.connection(), 1)) return false;  // sold out
          insert_order(t.session(), s, worker, attempt);     // commits with the decrement
          return true;
        },
        forever);
  }
  // cas
  const dblock::cas_update cas{
      item_table(s), "stock = stock - 1", "item_id = :id AND stock > 0", {{"id", 1LL}}};
  return dblock::run_transaction(
      db,
      [&](dblock::transaction& t) {
        if (dblock::compare_and_set(t.connection(), cas) != 1) return false;
        insert_order(t.session(), s, worker, attempt);
        return true;
      },
      forever);
}

struct worker_report {
  int bought = 0, failed = 0, errors = 0;
};

// Runs in a forked child: its own database handle, its own connections, made before the start
// signal (the end of `go`), so that the workers' attempts really meet however slowly the
// processes start.
worker_report run_worker(const std::string& strategy, const settings& s, int worker, int go) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  o.pool_size = 2;
  dblock::database db(s.url, o);
  db.ping();
  char c;
  while (read(go, &c, 1) > 0) {
  }  // end of file: every worker starts now
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);
  lo.poll_initial = std::chrono::milliseconds(1);
  lo.poll_max = std::chrono::milliseconds(20);
  dblock::lease_lock lock(db, s.prefix + "flash-sale/item/1", lo);
  worker_report r;
  for (int a = 0; a < s.attempts; ++a) {
    try {
      if (buy(strategy, s, db, lock, worker, a))
        ++r.bought;
      else
        ++r.failed;
    } catch (const std::exception& e) {
      ++r.errors;
      ++r.failed;
      if (r.errors <= 3)
        std::cerr << "worker " << worker << " (" << strategy << "): " << e.what() << "\n";
    }
  }
  return r;
}

struct outcome {
  std::string strategy;
  long long sold = 0, left = 0, oversold = 0;
  int failed = 0, errors = 0;
  double seconds = 0;
  bool held = false;
};

outcome run_strategy(const std::string& strategy, const settings& s) {
  reset_tables(s);  // its database handle (and connections) are gone before we fork
  std::vector<std::pair<pid_t, int>> children;  // pid, read end of its pipe
  auto start = std::chrono::steady_clock::now();
  int go[2];
  if (pipe(go) != 0) throw std::runtime_error("pipe failed");
  std::cout.flush();
  for (int w = 0; w < s.workers; ++w) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(fds[0]);
      close(go[1]);
      worker_report r = run_worker(strategy, s, w, go[0]);
      if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
      _exit(0);
    }
    close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  close(go[0]);
  close(go[1]);  // the start signal
  outcome out;
  out.strategy = strategy;
  for (auto& [pid, fd] : children) {
    worker_report r;
    bool got = read(fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++out.errors;
    if (got) {
      out.failed += r.failed;
      out.errors += r.errors;
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  dblock::database_options o;
  o.table_prefix = s.prefix;
  dblock::database db(s.url, o);
  auto c = db.connect();
  c.session() << "SELECT count(*) FROM " << order_table(s), soci::into(out.sold);
  if (strategy == "segmented")
    out.left = dblock::segmented_stock(db, segmented_name).total();
  else
    c.session() << "SELECT stock FROM " << item_table(s) << " WHERE item_id = 1",
        soci::into(out.left);
  const long long demand = static_cast<long long>(s.workers) * s.attempts;
  out.oversold = std::max(0LL, out.sold - s.stock);  // sold more than there ever was
  out.held = out.errors == 0 && out.left >= 0 && out.sold == s.stock - out.left &&
             out.sold == std::min(s.stock, demand);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Flash sale: N processes buy from a limited stock, once per locking strategy"};
  app.add_option("--url", s.url, "database URL (sqlite://..., postgresql://..., mysql://...)")
      ->capture_default_str();
  app.add_option("--table-prefix", s.prefix, "prefix of every table this demo uses")
      ->capture_default_str();
  app.add_option("--workers", s.workers, "buyer processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--stock", s.stock, "units in stock")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--attempts", s.attempts, "purchase attempts per worker")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--strategy", s.strategy,
                 "all, or one of none, lease, for_update, optimistic, cas, segmented")
      ->check(
          CLI::IsMember({"all", "none", "lease", "for_update", "optimistic", "cas", "segmented"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> strategies = {"none",       "lease", "for_update",
                                         "optimistic", "cas",   "segmented"};
  if (s.strategy != "all") strategies = {s.strategy};

  std::vector<outcome> results;
  try {
    std::cout << "flash sale on " << dblock::database(s.url).redacted_url() << ": " << s.workers
              << " processes x " << s.attempts << " attempts for " << s.stock << " units\n\n";
    std::printf("%-11s %6s %6s %9s %7s %7s %9s %10s\n", "strategy", "sold", "left", "oversold",
                "failed", "errors", "time (s)", "sales/s");
    for (const auto& st : strategies) {
      auto r = run_strategy(st, s);
      results.push_back(r);
      std::printf("%-11s %6lld %6lld %9lld %7d %7d %9.2f %10.0f\n", r.strategy.c_str(), r.sold,
                  r.left, r.oversold, r.failed, r.errors, r.seconds, r.sold / r.seconds);
      std::fflush(stdout);
    }
  } catch (const dblock::error& e) {
    std::cerr << "flash_sale: " << e.what() << "\n";
    return 2;
  }

  std::cout << "\n";
  bool all_safe_held = true;
  for (const auto& r : results) {
    const bool safe = r.strategy != "none";
    std::string verdict = r.held ? "invariant held: sold == stock sold off, nothing oversold"
                                 : "invariant BROKEN: sold " + std::to_string(r.sold) +
                                       ", stock left " + std::to_string(r.left) + ", oversold " +
                                       std::to_string(r.oversold);
    if (!safe) verdict += r.held ? " (lucky this time)" : " (expected without a lock)";
    std::printf("%-11s %s\n", r.strategy.c_str(), verdict.c_str());
    if (safe && !r.held) all_safe_held = false;
  }
  return all_safe_held ? 0 : 1;
}
