// One order per user: N worker processes all try to place "the one order" of the same users at
// the same moment (every worker tries every user, in the same order, M times).
//
// With the lock (default), an attempt takes the lease lock "order/user/<id>" and, inside
// guard.fenced() (one transaction that commits only while the lease is still ours), checks
// whether the user already has an order and inserts it if not. The orders table also has
// UNIQUE (user_id) as a backstop: a duplicate insert would fail with a unique violation, which
// is counted and reported; with the lock there must be none.
//
// With --no-lock the check is a plain read and the insert its own transaction: several workers
// pass the check at once, and only the UNIQUE constraint stops the duplicates (each one is an
// errc::unique_violation, counted).
//
// Order IDs come from a dblock::id_generator ("orders"; one per worker process): unique across
// the processes without any coordination of their own, roughly time-ordered, and not revealing
// how many orders were placed between two of them.
//
// Invariant: every user has exactly one order; with the lock, 0 unique violations. The exit
// status is 0 when that held (with --no-lock: when the constraint kept one order per user).
//
// Usage: one_order_per_user [--url URL] [--workers 8] [--users 20] [--attempts 2] [--no-lock]
// Default URL: sqlite://one_order_per_user.db (created in the current directory).
#include <soci/soci.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct settings {
  std::string url = "sqlite://one_order_per_user.db";
  std::string prefix = "oo_";
  int workers = 8;
  int users = 20;
  int attempts = 2;
  int think_ms = 2;
  int wait_ms = 10000;
  bool no_lock = false;
};

std::string orders_table(const settings& s) {
  return s.prefix + "orders";
}

dblock::database open(const settings& s, std::size_t pool_size) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  o.pool_size = pool_size;
  return dblock::database(s.url, o);
}

void reset_tables(const settings& s) {
  auto db = open(s, 1);
  dblock::migrate(db);  // the lease locks live in dblock's own table
  auto c = db.connect();
  auto& sql = c.session();
  sql << "DROP TABLE IF EXISTS " << orders_table(s);
  sql << "CREATE TABLE " << orders_table(s)
      << " (order_id BIGINT PRIMARY KEY, user_id INTEGER NOT NULL UNIQUE,"
         " worker INTEGER NOT NULL, fence BIGINT NOT NULL)";
}

enum class outcome { placed, had_one, unique_violation };

struct worker_report {
  int placed = 0;             // attempts that inserted the user's order
  int had_one = 0;            // attempts that found the order already there
  int unique_violations = 0;  // inserts rejected by UNIQUE (user_id)
  int errors = 0;             // anything else (timeouts, lost leases, connection errors)
};

bool has_order(soci::session& sql, const settings& s, int user) {
  long long n = 0;
  sql << "SELECT count(*) FROM " << orders_table(s) << " WHERE user_id = :u", soci::use(user),
      soci::into(n);
  return n > 0;
}

void insert_order(soci::session& sql, const settings& s, long long id, int worker, int user,
                  long long fence) {
  sql << "INSERT INTO " << orders_table(s)
      << " (order_id, user_id, worker, fence) VALUES (:id, :u, :w, :f)",
      soci::use(id), soci::use(user), soci::use(worker), soci::use(fence);
}

// The safe way: a lease lock per user, check and insert in one fenced transaction.
outcome place_with_lock(const dblock::database& db, const settings& s, dblock::id_generator& ids,
                        int worker, int user) {
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);  // a crashed worker blocks this user for 10 s at most
  lo.poll_initial = std::chrono::milliseconds(1);
  lo.poll_max = std::chrono::milliseconds(20);
  dblock::lease_lock lock(db, "order/user/" + std::to_string(user), lo);
  // Taken before the transaction: a reservation of IDs is a write of its own, and on SQLite it
  // would wait for the write lock that our open transaction holds. An ID taken for an attempt
  // that finds an order already there is simply never used.
  const long long id = ids.next();
  auto guard = lock.acquire(std::chrono::milliseconds(s.wait_ms));  // errc::timeout: an error
  outcome result = outcome::had_one;
  try {
    guard.fenced([&](soci::session& sql) {
      if (has_order(sql, s, user)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(s.think_ms));  // "charge the card"
      insert_order(sql, s, id, worker, user, guard.fence());
      result = outcome::placed;
    });
  } catch (const dblock::error& e) {
    // fenced() rolls back and classifies the SQL errors of our own statements: a duplicate
    // INSERT stopped by UNIQUE (user_id) arrives as errc::unique_violation.
    if (e.code() == dblock::errc::unique_violation) return outcome::unique_violation;
    throw;
  }
  return result;
}

// The naive way: check with a plain read, then insert. Only the UNIQUE constraint saves it.
outcome place_without_lock(const dblock::database& db, const settings& s, dblock::id_generator& ids,
                           int worker, int user) {
  {
    auto c = db.connect();
    if (has_order(c.session(), s, user)) return outcome::had_one;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(s.think_ms));  // "charge the card"
  const long long id = ids.next();  // before the transaction (see place_with_lock)
  try {
    dblock::run_transaction(
        db, [&](dblock::transaction& t) { insert_order(t.session(), s, id, worker, user, 0); });
  } catch (const dblock::error& e) {
    if (e.code() == dblock::errc::unique_violation) return outcome::unique_violation;
    throw;
  }
  return outcome::placed;
}

// Runs in a forked child: its own database handle and connections.
worker_report run_worker(const settings& s, int worker) {
  auto db = open(s, 2);
  dblock::id_generator_options io;
  io.block_size = 64;  // a worker places few orders: small blocks, small gaps
  dblock::id_generator ids(db, "orders", io);
  worker_report r;
  for (int a = 0; a < s.attempts; ++a) {
    for (int user = 1; user <= s.users; ++user) {
      try {
        switch (s.no_lock ? place_without_lock(db, s, ids, worker, user)
                          : place_with_lock(db, s, ids, worker, user)) {
          case outcome::placed:
            ++r.placed;
            break;
          case outcome::had_one:
            ++r.had_one;
            break;
          case outcome::unique_violation:
            ++r.unique_violations;
            break;
        }
      } catch (const std::exception& e) {
        if (++r.errors <= 3)
          std::cerr << "worker " << worker << ", user " << user << ": " << e.what() << "\n";
      }
    }
  }
  return r;
}

// Forks the workers, lets them start together and adds up their reports.
worker_report run_workers(const settings& s, int& failed_processes) {
  std::vector<std::pair<pid_t, int>> children;  // pid, read end of its report pipe
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
      char c;
      while (read(go[0], &c, 1) > 0) {
      }  // end of file: every worker starts now
      worker_report r = run_worker(s, w);
      if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
      _exit(0);
    }
    close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  close(go[0]);
  close(go[1]);  // the start signal
  worker_report total;
  failed_processes = 0;
  for (auto& [pid, fd] : children) {
    worker_report r;
    bool got = read(fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed_processes;
    if (!got) continue;
    total.placed += r.placed;
    total.had_one += r.had_one;
    total.unique_violations += r.unique_violations;
    total.errors += r.errors;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"One order per user: N processes race to place the same users' single order"};
  app.add_option("--url", s.url, "database URL (sqlite://..., postgresql://..., mysql://...)")
      ->capture_default_str();
  app.add_option("--table-prefix", s.prefix, "prefix of every table this demo uses")
      ->capture_default_str();
  app.add_option("--workers", s.workers, "worker processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--users", s.users, "users; every worker tries every user")
      ->check(CLI::Range(1, 99999))
      ->capture_default_str();
  app.add_option("--attempts", s.attempts, "attempts per worker and user")
      ->check(CLI::Range(1, 999))
      ->capture_default_str();
  app.add_option("--think-ms", s.think_ms, "pause between the check and the insert")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app.add_option("--wait-ms", s.wait_ms, "how long an attempt waits for the user's lock")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_flag("--no-lock", s.no_lock,
               "check with a plain read and insert without a lock (the UNIQUE backstop catches "
               "the duplicates)");
  CLI11_PARSE(app, argc, argv);

  const char* mode = s.no_lock ? "no-lock" : "lease";
  const long long attempts = static_cast<long long>(s.workers) * s.users * s.attempts;
  worker_report seen;
  int failed_processes = 0;
  double seconds = 0;
  long long with_one = 0, with_more = 0, orders = 0;
  try {
    std::cout << "one order per user on " << dblock::database(s.url).redacted_url() << ": "
              << s.workers << " processes x " << s.users << " users x " << s.attempts
              << " attempts, " << (s.no_lock ? "WITHOUT a lock" : "with a lease lock per user")
              << "\n";
    if (s.no_lock)
      std::cout << "each attempt: a plain read \"has the user an order?\", then INSERT\n";
    else
      std::cout << "each attempt: lease \"order/user/<id>\", then in guard.fenced(): has the "
                   "user an order? if not, INSERT\n";
    std::cout << "order IDs: dblock::id_generator \"orders\" in every worker (unique across "
                 "processes)\n";
    std::cout << "backstop: UNIQUE (user_id); a duplicate INSERT fails with a unique violation\n\n";
    reset_tables(s);  // its database handle (and connections) are gone before we fork
    auto start = std::chrono::steady_clock::now();
    seen = run_workers(s, failed_processes);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    auto db = open(s, 1);
    auto c = db.connect();
    std::vector<long long> users(static_cast<std::size_t>(s.users) + 1), counts(users.size());
    c.session() << "SELECT user_id, count(*) FROM " << orders_table(s) << " GROUP BY user_id",
        soci::into(users), soci::into(counts);
    for (long long n : counts) {
      orders += n;
      if (n == 1) ++with_one;
      if (n > 1) ++with_more;
    }
  } catch (const std::exception& e) {
    std::cerr << "one_order_per_user: " << e.what() << "\n";
    return 2;
  }

  std::printf("%-8s %9s %7s %8s %18s %7s %9s\n", "mode", "attempts", "placed", "had one",
              "unique violations", "errors", "time (s)");
  std::printf("%-8s %9lld %7d %8d %18d %7d %9.2f\n", mode, attempts, seen.placed, seen.had_one,
              seen.unique_violations, seen.errors, seconds);
  const long long with_none = s.users - with_one - with_more;
  std::printf("\nusers %d: exactly one order %lld, none %lld, more than one %lld (orders %lld)\n",
              s.users, with_one, with_none, with_more, orders);

  const bool one_each = with_one == s.users && orders == s.users && seen.placed == s.users;
  const bool clean = seen.errors == 0 && failed_processes == 0;
  bool held = false;
  if (!s.no_lock) {
    held = one_each && clean && seen.unique_violations == 0;
    if (held)
      std::cout << "verdict: invariant held: exactly one order per user, 0 unique violations\n";
    else
      std::cout << "verdict: invariant BROKEN: " << with_one << " of " << s.users
                << " users with exactly one order, " << seen.unique_violations
                << " unique violations, " << seen.errors << " errors\n";
  } else {
    held = one_each && clean;
    if (held)
      std::cout << "verdict: invariant held, but only thanks to the UNIQUE constraint: exactly "
                   "one order per user, "
                << seen.unique_violations << " duplicate inserts rejected (unique violations)\n";
    else
      std::cout << "verdict: invariant BROKEN: " << with_one << " of " << s.users
                << " users with exactly one order, " << seen.errors << " errors\n";
  }
  return held ? 0 : 1;
}
