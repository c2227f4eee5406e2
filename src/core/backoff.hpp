// Internal: the one source of randomised pauses (full jitter) and the pause of a wait after a
// failed round, for every layer above (waits, retries). Constants of the retry loops live beside
// the loops that use them; the shapes of their pauses live here.
#pragma once

#include <chrono>

namespace dblock::detail {

/// Uniform in [0, cap]: "full jitter". 0 for a cap of 0 or less. One generator per thread.
std::chrono::nanoseconds full_jitter(std::chrono::nanoseconds cap);

/// The pause of a wait after a failed round (a dropped connection, a failover) before it tries
/// again: at least 50 ms, full jitter under 100 ms doubled per failure up to 1.6 s.
std::chrono::nanoseconds failure_backoff(int failures);

}  // namespace dblock::detail
