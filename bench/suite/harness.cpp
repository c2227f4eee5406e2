#include "harness.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "round_trips.hpp"

namespace dblock::bench {

double percentile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

thread_local clk::time_point measurement_end = clk::time_point::max();
thread_local clk::time_point measurement_start = clk::time_point::min();

result measure(int clients, double seconds, const setup_fn& setup) {
  std::vector<std::vector<float>> lat(clients);
  std::vector<long long> ok(clients, 0), ops(clients, 0), errs(clients, 0);
  std::vector<std::uint64_t> sent(clients, 0);
  std::vector<std::string> first_err(clients);
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  bool go = false;
  clk::time_point start, end;
  const auto warm = std::chrono::duration<double>(std::max(std::min(0.1, seconds), seconds / 10));
  std::vector<std::thread> ts;
  std::atomic<bool> setup_failed{false};
  std::string setup_error;
  for (int i = 0; i < clients; ++i)
    ts.emplace_back([&, i] {
      cycle_fn f;
      try {
        f = setup(i);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu);
        setup_failed = true;
        setup_error = e.what();
      }
      {
        std::unique_lock<std::mutex> l(mu);
        ++ready;
        cv.notify_all();
        cv.wait(l, [&] { return go; });
      }
      if (setup_failed) return;
      measurement_start = start;
      measurement_end = end;
      auto run_one = [&](bool record) {
        auto t0 = clk::now();
        bool s = false;
        try {
          s = f();
        } catch (const std::exception& e) {
          if (record && errs[i]++ == 0) first_err[i] = e.what();
        }
        if (!record) return;
        ++ops[i];
        if (s) ++ok[i];
        lat[i].push_back(std::chrono::duration<float, std::micro>(clk::now() - t0).count());
      };
      while (clk::now() < start)
        run_one(false);
      const std::uint64_t sent_before = sends_on_this_thread();
      while (clk::now() < end)
        run_one(true);
      sent[i] = sends_on_this_thread() - sent_before;
    });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return ready == clients; });
    start = clk::now() + std::chrono::duration_cast<clk::duration>(warm);
    end = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(seconds));
    go = true;
  }
  cv.notify_all();
  for (auto& t : ts)
    t.join();
  if (setup_failed) throw std::runtime_error(setup_error);
  result r;
  r.clients = clients;
  std::vector<float> all;
  std::uint64_t sent_all = 0;
  for (int i = 0; i < clients; ++i) {
    sent_all += sent[i];
    all.insert(all.end(), lat[i].begin(), lat[i].end());
    r.operations += ops[i];
    r.successes += ok[i];
    r.errors += errs[i];
    if (r.first_error.empty()) r.first_error = first_err[i];
  }
  r.per_second = r.successes / seconds;
  r.p50_us = percentile(all, 0.50);
  r.p99_us = percentile(all, 0.99);
  if (r.operations > 0) r.round_trips = static_cast<double>(sent_all) / r.operations;
  return r;
}

std::string token() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

std::string fresh_name(const std::string& what) {
  static std::atomic<long long> n{0};
  return "bench/" + what + "/" + std::to_string(++n);
}

int rand_below(int n) {
  static thread_local std::mt19937 rng(std::random_device{}());
  return std::uniform_int_distribution<int>(0, n - 1)(rng);
}

}  // namespace dblock::bench
