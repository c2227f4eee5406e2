#include "dblock/retry.hpp"

#include "core/backoff.hpp"

#include <algorithm>
#include <thread>

namespace dblock {

bool retry_policy::is_retryable(errc code) const noexcept {
  return std::find(retryable.begin(), retryable.end(), code) != retryable.end();
}

void run_with_retry(const retry_policy& policy, const std::function<void()>& attempt,
                    retry_stats* stats) {
  using clock = std::chrono::steady_clock;
  using std::chrono::microseconds;
  if (policy.max_attempts < 1)
    throw error(errc::invalid_argument, "retry_policy.max_attempts must be at least 1");
  retry_stats local;
  retry_stats& st = stats ? *stats : local;
  st = retry_stats{};
  const auto start = clock::now();
  auto elapsed = [&] { return std::chrono::duration_cast<microseconds>(clock::now() - start); };
  for (;;) {
    ++st.attempts;
    try {
      attempt();
      st.elapsed = elapsed();
      return;
    } catch (const error& e) {
      st.elapsed = elapsed();
      if (!policy.is_retryable(e.kind())) throw;
      ++st.conflicts;
      // Full jitter: uniform in [0, min(cap, initial * 2^(n-1))].
      microseconds cap = std::chrono::duration_cast<microseconds>(policy.initial_backoff) *
                         (1LL << std::min(st.attempts - 1, 30));
      cap = std::min<microseconds>(cap, policy.max_backoff);
      const microseconds backoff =
          std::chrono::duration_cast<microseconds>(detail::full_jitter(cap));
      bool out_of_attempts = st.attempts >= policy.max_attempts;
      bool out_of_time =
          policy.time_budget.count() > 0 &&
          st.elapsed + backoff >= std::chrono::duration_cast<microseconds>(policy.time_budget);
      if (out_of_attempts || out_of_time) {
        error gave_up(e.kind(),
                      "gave up after " + std::to_string(st.attempts) + " attempt(s) in " +
                          std::to_string(st.elapsed.count() / 1000) + " ms (" +
                          (out_of_attempts ? "max_attempts" : "time_budget") +
                          " reached); last error: " + e.what(),
                      e.backend(), e.sqlstate(), e.native_code());
        gave_up.with_retry_info(st.attempts, st.elapsed);
        throw gave_up;
      }
      if (policy.on_retry) policy.on_retry(retry_event{st.attempts, e, backoff, st.elapsed});
      if (backoff.count() > 0) std::this_thread::sleep_for(backoff);
    }
  }
}

}  // namespace dblock
