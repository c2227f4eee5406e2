// Prize pool: a lottery drawn by N worker processes, M draws each, from one shared pool.
//
// Every draw reads the remaining quantities (a plain read, possibly stale by the time it is
// used), picks a prize weighted by what is left (a fixed weight stands for "no prize"), then in
// one transaction runs the conditional update
//     UPDATE prize_pool SET quantity = quantity - 1 WHERE prize_id = ? AND quantity > 0
// (dblock::compare_and_set) and inserts a `wins` row. When the update matched no row, another
// worker took the last unit since the read: the draw is repeated (at most --max-redraws times).
// No lock is held while drawing; the condition in the UPDATE is what keeps the pool honest.
//
// Invariant: for every prize, wins == initial - remaining and remaining >= 0; the total won is
// at most the pool size; every draw is accounted for (won, no prize, gave up).
//
// Usage: prize_pool [--url URL] [--workers 8] [--draws 40] [--blank-weight 20]
// Default URL: sqlite://prize_pool.db (created in the current directory).
#include <soci/soci.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct prize_kind {
  long long id;
  const char* name;
  long long quantity;
};

// The pool: 176 prizes in five kinds. "No prize" is not a row: it is the --blank-weight.
constexpr std::array<prize_kind, 5> kinds{
    {{1, "grand", 1}, {2, "gold", 5}, {3, "silver", 20}, {4, "bronze", 50}, {5, "sticker", 100}}};

struct settings {
  std::string url = "sqlite://prize_pool.db";
  std::string prefix = "pp_";
  int workers = 8;
  int draws = 40;
  long long blank_weight = 20;
  int max_redraws = 5;
  int spin_ms = 5;  // "the wheel spins": time between reading the pool and taking the prize
  unsigned seed = 1;
};

std::string pool_table(const settings& s) {
  return s.prefix + "prize_pool";
}
std::string wins_table(const settings& s) {
  return s.prefix + "wins";
}

dblock::database open(const settings& s, std::size_t pool_size) {
  dblock::database_options o;
  o.table_prefix = s.prefix;
  o.pool_size = pool_size;
  return dblock::database(s.url, o);
}

void reset_tables(const settings& s) {
  auto db = open(s, 1);
  auto c = db.connect();
  auto& sql = c.session();
  sql << "DROP TABLE IF EXISTS " << wins_table(s);
  sql << "DROP TABLE IF EXISTS " << pool_table(s);
  sql << "CREATE TABLE " << pool_table(s)
      << " (prize_id INTEGER PRIMARY KEY, name VARCHAR(32) NOT NULL,"
         " initial_qty INTEGER NOT NULL, quantity INTEGER NOT NULL)";
  sql << "CREATE TABLE " << wins_table(s)
      << " (win_id BIGINT PRIMARY KEY, prize_id INTEGER NOT NULL, worker INTEGER NOT NULL,"
         " draw INTEGER NOT NULL)";
  for (const auto& k : kinds) {
    std::string name = k.name;
    sql << "INSERT INTO " << pool_table(s)
        << " (prize_id, name, initial_qty, quantity) VALUES (:id, :name, :qty, :qty2)",
        soci::use(k.id), soci::use(name), soci::use(k.quantity), soci::use(k.quantity);
  }
}

// What one worker saw; sent to the parent through a pipe (plain data only).
struct worker_report {
  std::array<int, kinds.size()> won{};  // draws that won each kind
  int blanks = 0;                       // draws that picked "no prize"
  int redraws = 0;                      // conditional updates that matched no row
  int gave_up = 0;                      // draws that lost the race --max-redraws + 1 times
  int errors = 0;                       // draws that failed with an exception
};

// The remaining quantities, read without any lock: the snapshot may be stale when it is used.
std::vector<std::pair<long long, long long>> remaining(const dblock::database& db,
                                                       const settings& s) {
  auto c = db.connect();
  std::vector<long long> ids(kinds.size() + 1), qty(kinds.size() + 1);
  c.session() << "SELECT prize_id, quantity FROM " << pool_table(s)
              << " WHERE quantity > 0 ORDER BY prize_id",
      soci::into(ids), soci::into(qty);
  std::vector<std::pair<long long, long long>> out;
  for (std::size_t i = 0; i < ids.size(); ++i)
    out.emplace_back(ids[i], qty[i]);
  return out;
}

// One draw. Returns the index of the kind won, -1 for "no prize", -2 when it gave up.
int draw(const dblock::database& db, const settings& s, std::mt19937_64& rng, int worker,
         int draw_no, worker_report& r) {
  const auto forever = dblock::retry_policy::until_success();  // deadlock/busy: retry the tx
  for (int round = 0; round <= s.max_redraws; ++round) {
    auto left = remaining(db, s);
    long long total = s.blank_weight;
    for (const auto& [id, q] : left)
      total += q;
    if (total == 0) return -1;  // empty pool and no blank weight
    long long ticket = std::uniform_int_distribution<long long>(0, total - 1)(rng);
    if (ticket < s.blank_weight) return -1;
    ticket -= s.blank_weight;
    long long chosen = 0;
    for (const auto& [id, q] : left) {
      if (ticket < q) {
        chosen = id;
        break;
      }
      ticket -= q;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(s.spin_ms));
    // Take one unit only if one is still there, and record the win in the same transaction.
    const dblock::cas_update take{pool_table(s),
                                  "quantity = quantity - 1",
                                  "prize_id = :id AND quantity > 0",
                                  {{"id", chosen}}};
    const bool won = dblock::run_transaction(
        db,
        [&](dblock::transaction& t) {
          if (dblock::compare_and_set(t.connection(), take) != 1) return false;
          long long win_id = static_cast<long long>(worker + 1) * 1000000 + draw_no;
          t.session() << "INSERT INTO " << wins_table(s)
                      << " (win_id, prize_id, worker, draw) VALUES (:w, :p, :k, :d)",
              soci::use(win_id), soci::use(chosen), soci::use(worker), soci::use(draw_no);
          return true;
        },
        forever);
    if (won) return static_cast<int>(chosen - 1);
    ++r.redraws;  // someone took the last unit since our read: draw again from what is left
  }
  return -2;
}

// Runs in a forked child: its own database handle and connections.
worker_report run_worker(const settings& s, int worker) {
  auto db = open(s, 2);
  std::mt19937_64 rng(static_cast<std::uint64_t>(s.seed) * 1000003u + worker);
  worker_report r;
  for (int d = 0; d < s.draws; ++d) {
    try {
      int k = draw(db, s, rng, worker, d, r);
      if (k >= 0)
        ++r.won[static_cast<std::size_t>(k)];
      else if (k == -1)
        ++r.blanks;
      else
        ++r.gave_up;
    } catch (const std::exception& e) {
      if (++r.errors <= 3) std::cerr << "worker " << worker << ": " << e.what() << "\n";
    }
  }
  return r;
}

// Forks the workers, lets them start together and collects their reports.
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
    for (std::size_t k = 0; k < kinds.size(); ++k)
      total.won[k] += r.won[k];
    total.blanks += r.blanks;
    total.redraws += r.redraws;
    total.gave_up += r.gave_up;
    total.errors += r.errors;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Prize pool: N processes draw prizes weighted by what is left, never over-awarding"};
  app.add_option("--url", s.url, "database URL (sqlite://..., postgresql://..., mysql://...)")
      ->capture_default_str();
  app.add_option("--table-prefix", s.prefix, "prefix of every table this demo uses")
      ->capture_default_str();
  app.add_option("--workers", s.workers, "drawing processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--draws", s.draws, "draws per worker")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--blank-weight", s.blank_weight, "weight of \"no prize\" in every draw")
      ->check(CLI::Range(0LL, 1000000LL))
      ->capture_default_str();
  app.add_option("--max-redraws", s.max_redraws, "redraws after losing the race for a prize")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--spin-ms", s.spin_ms, "pause between reading the pool and taking the prize")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app.add_option("--seed", s.seed, "random seed (worker w uses a seed derived from it and w)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  long long pool_size = 0;
  for (const auto& k : kinds)
    pool_size += k.quantity;
  const long long draws = static_cast<long long>(s.workers) * s.draws;

  std::array<long long, kinds.size()> wins_rows{}, left{};
  worker_report seen;
  int failed_processes = 0;
  double seconds = 0;
  try {
    std::cout << "prize pool on " << dblock::database(s.url).redacted_url() << ": " << s.workers
              << " processes x " << s.draws << " draws from " << pool_size
              << " prizes (\"no prize\" weight " << s.blank_weight << ")\n"
              << "each draw: read what is left, pick weighted, then one transaction of\n"
              << "  UPDATE ... SET quantity = quantity - 1 WHERE prize_id = ? AND quantity > 0\n"
              << "  + INSERT INTO wins; 0 rows matched = someone was faster: draw again\n\n";
    reset_tables(s);  // its database handle (and connections) are gone before we fork
    auto start = std::chrono::steady_clock::now();
    seen = run_workers(s, failed_processes);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    auto db = open(s, 1);
    auto c = db.connect();
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      c.session() << "SELECT count(*) FROM " << wins_table(s) << " WHERE prize_id = :id",
          soci::use(kinds[k].id), soci::into(wins_rows[k]);
      c.session() << "SELECT quantity FROM " << pool_table(s) << " WHERE prize_id = :id",
          soci::use(kinds[k].id), soci::into(left[k]);
    }
  } catch (const std::exception& e) {
    std::cerr << "prize_pool: " << e.what() << "\n";
    return 2;
  }

  bool held = true;
  long long total_won = 0, total_left = 0, total_reported = 0;
  std::printf("%-9s %8s %6s %10s %18s  %s\n", "prize", "initial", "won", "remaining",
              "initial-remaining", "check");
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    const long long given = kinds[k].quantity - left[k];
    const bool ok = left[k] >= 0 && wins_rows[k] == given && seen.won[k] == wins_rows[k];
    held = held && ok;
    total_won += wins_rows[k];
    total_left += left[k];
    total_reported += seen.won[k];
    std::printf("%-9s %8lld %6lld %10lld %18lld  %s\n", kinds[k].name, kinds[k].quantity,
                wins_rows[k], left[k], given, ok ? "ok" : "BROKEN");
  }
  std::printf("%-9s %8lld %6lld %10lld %18lld  %s\n", "total", pool_size, total_won, total_left,
              pool_size - total_left, total_won <= pool_size ? "ok" : "BROKEN");
  const long long accounted = total_reported + seen.blanks + seen.gave_up + seen.errors;
  std::printf(
      "\ndraws %lld = %lld won + %d no prize + %d gave up + %d errors; %d redraws after a lost "
      "race; %.2f s\n",
      draws, total_reported, seen.blanks, seen.gave_up, seen.errors, seen.redraws, seconds);

  held = held && total_won <= pool_size && accounted == draws && seen.errors == 0 &&
         failed_processes == 0;
  if (held)
    std::cout << "verdict: invariant held: wins == initial - remaining for every prize, none "
                 "below zero, "
              << total_won << " of " << pool_size << " prizes won\n";
  else
    std::cout << "verdict: invariant BROKEN (see the rows marked BROKEN; " << seen.errors
              << " errors, " << failed_processes << " failed processes)\n";
  return held ? 0 : 1;
}
