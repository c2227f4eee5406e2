// The watchdog rows: --leases leases held with the watchdog by one database handle (what that
// costs in threads, memory and statements), and the raw acquire rate of as many names.
#include <dirent.h>
#include <dblock/dblock.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "rows.hpp"

namespace dblock::bench {
namespace {

// Counts the watchdog's batches and losses.
class renewal_counter : public dblock::listener {
 public:
  void renewed(std::size_t leases, std::size_t round_trips) override {
    renewals += static_cast<long long>(leases);
    statements += static_cast<long long>(round_trips);
    ++batches;
  }
  void lease_lost(std::string_view, const dblock::error&) override { ++lost; }
  std::atomic<long long> renewals{0}, statements{0}, batches{0}, lost{0};
};

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

double rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// The floor of acquiring `n` distinct names: the very acquire statement, through the C client,
// one after another; then the releases.
result raw_acquire_many(backend_ctx& b, int n) {
  auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
  const std::string base = fresh_name("bench/raw_many") + "/";
  std::vector<std::pair<std::string, long long>> held;
  const std::string tok = token();
  const auto t0 = clk::now();
  for (int i = 0; i < n; ++i) {
    const std::string name = base + std::to_string(i);
    if (auto f = raw_acquire(*c, b, name, tok)) held.emplace_back(name, *f);
  }
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  for (const auto& [name, fence] : held)
    raw_release(*c, b, name, tok, fence);
  result r;
  r.clients = 1;
  r.operations = n;
  r.successes = static_cast<long long>(held.size());
  r.errors = n - r.successes;
  r.per_second = static_cast<double>(held.size()) / took;
  return r;
}

// `n` leases of distinct names acquired with the watchdog on one database handle, held for
// three TTLs, then released: the acquire rate, and what holding them cost.
result watchdog_scale(backend_ctx& b, int n, int ttl_ms, std::ostream& progress) {
  const auto ttl = std::chrono::milliseconds(ttl_ms);
  auto events = std::make_shared<renewal_counter>();
  dblock::database_options o = b.db.options();
  o.events = events;
  dblock::database db(b.url, o);
  const std::string base = fresh_name("bench/watchdog") + "/";
  dblock::lease_options lo;
  lo.ttl = ttl;
  lo.watchdog = true;
  std::vector<dblock::lease_lock> locks;
  std::vector<dblock::lease_guard> guards;
  locks.reserve(static_cast<std::size_t>(n));
  const int threads0 = thread_count();
  const double rss0 = rss_mb();
  const auto t0 = clk::now();
  for (int i = 0; i < n; ++i) {
    locks.emplace_back(db, base + std::to_string(i), lo);
    if (auto g = locks.back().try_acquire()) guards.push_back(std::move(*g));
  }
  const double took = std::chrono::duration<double>(clk::now() - t0).count();
  const int threads1 = thread_count();
  const double rss1 = rss_mb();
  const long long renewals0 = events->renewals.load(), statements0 = events->statements.load(),
                  batches0 = events->batches.load();
  progress << "bench: " << b.label << " dblock.watchdog: " << guards.size()
           << " leases held; holding them for 3 TTLs (" << 3 * ttl.count() / 1000.0 << " s)\n";
  std::this_thread::sleep_for(3 * ttl);
  long long valid = 0;
  for (const auto& g : guards)
    valid += g.valid() ? 1 : 0;
  const long long renewals = events->renewals.load() - renewals0,
                  statements = events->statements.load() - statements0,
                  batches = events->batches.load() - batches0;
  for (auto& g : guards) {
    try {
      g.release();
    } catch (const std::exception&) {
    }
  }
  result r;
  r.clients = 1;
  r.operations = n;
  r.successes = static_cast<long long>(guards.size());
  r.errors = n - r.successes + (r.successes - valid);
  r.per_second = static_cast<double>(guards.size()) / took;
  r.figures = {{"leases", n},
               {"still_valid", static_cast<double>(valid)},
               {"lost", static_cast<double>(events->lost.load())},
               {"threads_added", threads1 - threads0},
               {"rss_added_mb", rss1 - rss0},
               {"renewals", static_cast<double>(renewals)},
               {"renewal_batches", static_cast<double>(batches)},
               {"renewal_statements", static_cast<double>(statements)},
               {"statements_per_100_renewals",
                renewals > 0 ? 100.0 * static_cast<double>(statements) / renewals : 0}};
  char note[320];
  std::snprintf(note, sizeof note,
                "%d leases, watchdog on, TTL %.1f s, held %.1f s: acquire/s as ops/s; %d threads "
                "added, RSS +%.1f MB; %lld renewals in %lld batches, %.2f statements per 100 "
                "renewals; %lld lost, %lld still valid",
                n, ttl_ms / 1000.0, 3 * ttl_ms / 1000.0, threads1 - threads0, rss1 - rss0, renewals,
                batches, renewals > 0 ? 100.0 * static_cast<double>(statements) / renewals : 0.0,
                events->lost.load(), valid);
  r.note = note;
  return r;
}

}  // namespace

std::vector<row> watchdog_rows(backend_ctx&, const options& o) {
  const int leases = o.watchdog_leases, ttl_ms = o.watchdog_ttl_ms;
  row floor = make_row(
      "raw.acquire_many", "floor", "",
      std::to_string(leases) +
          " distinct names acquired one after another (the acquire statement, C client)",
      schedule::once,
      [leases](backend_ctx* b, int, std::ostream&) { return raw_acquire_many(*b, leases); });
  row scale = make_row("dblock.watchdog", "scale", "raw.acquire_many", "", schedule::once,
                       [leases, ttl_ms](backend_ctx* b, int, std::ostream& progress) {
                         result r;
                         try {
                           r = watchdog_scale(*b, leases, ttl_ms, progress);
                         } catch (const std::exception& e) {
                           r.clients = 1;
                           r.errors = 1;
                           r.first_error = e.what();
                         }
                         return r;
                       });
  // Both run only when --only names dblock.watchdog: a minute for three backends at 10,000
  // leases. The floor is measured for it.
  floor.named_only = scale.named_only = true;
  floor.selected_as = "dblock.watchdog";
  return {floor, scale};
}

}  // namespace dblock::bench
