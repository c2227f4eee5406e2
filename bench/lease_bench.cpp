// One-client lease cycle benchmark: try_acquire + release, repeated for a fixed time.
// Usage: dblock_lease_bench URL [SECONDS=5] [KEYS=10000]
// Prints cycles per second and p50/p99 latency of a cycle, for random keys and for one hot key.
#include <dblock/dblock.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

struct result {
  double per_second;
  double p50_us;
  double p99_us;
};

template <class F>
result run_for(double seconds, F&& cycle) {
  std::vector<double> lat;
  auto start = clk::now();
  auto end = start + std::chrono::duration<double>(seconds);
  while (clk::now() < end) {
    auto t0 = clk::now();
    cycle();
    lat.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
  }
  double elapsed = std::chrono::duration<double>(clk::now() - start).count();
  std::sort(lat.begin(), lat.end());
  return {lat.size() / elapsed, lat[lat.size() / 2], lat[lat.size() * 99 / 100]};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [SECONDS] [KEYS]\n", argv[0]);
    return 2;
  }
  double seconds = argc > 2 ? std::stod(argv[2]) : 5;
  int keys = argc > 3 ? std::stoi(argv[3]) : 10000;
  dblock::database_options o;
  o.table_prefix = "bench_";
  dblock::database db(argv[1], o);
  dblock::migrate(db);

  std::vector<dblock::lease_lock> locks;
  locks.reserve(keys);
  for (int i = 0; i < keys; ++i)
    locks.emplace_back(db, "bench/" + std::to_string(i));
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> pick(0, keys - 1);

  // Warm up: create the rows and the pooled connection.
  for (int i = 0; i < std::min(keys, 2000); ++i)
    locks[i].try_acquire()->release();

  auto rnd = run_for(seconds, [&] {
    auto g = locks[pick(rng)].try_acquire();
    if (!g) std::abort();
    g->release();
  });
  auto hot = run_for(seconds, [&] {
    auto g = locks[0].try_acquire();
    if (!g) std::abort();
    g->release();
  });
  std::printf("%-10s  %-28s %10s %10s %10s\n", "backend", "operation", "cycles/s", "p50 us",
              "p99 us");
  std::printf("%-10s  %-28s %10.0f %10.1f %10.1f\n", db.backend().c_str(),
              "acquire+release, random key", rnd.per_second, rnd.p50_us, rnd.p99_us);
  std::printf("%-10s  %-28s %10.0f %10.1f %10.1f\n", db.backend().c_str(),
              "acquire+release, one key", hot.per_second, hot.p50_us, hot.p99_us);
  return 0;
}
