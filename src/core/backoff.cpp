#include "core/backoff.hpp"

#include <algorithm>
#include <random>

namespace dblock::detail {

std::chrono::nanoseconds full_jitter(std::chrono::nanoseconds cap) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  if (cap.count() <= 0) return std::chrono::nanoseconds(0);
  std::uniform_int_distribution<long long> d(0, cap.count());
  return std::chrono::nanoseconds(d(rng));
}

std::chrono::nanoseconds failure_backoff(int failures) {
  using std::chrono::milliseconds;
  return std::max<std::chrono::nanoseconds>(
      milliseconds(50), full_jitter(milliseconds(100) * (1 << std::clamp(failures, 0, 4))));
}

}  // namespace dblock::detail
