// Internal: lets a wake-up interrupt a wait on a cancellation's condition variable, so that one
// sleep ends on either a ring or a cancel.
#pragma once

#include <atomic>
#include <chrono>

#include "dblock/cancellation.hpp"

namespace dblock::detail {

struct cancel_access {
  /// Sleeps up to `d` on `c`; true when `flag` was set (by a poke()), false when `d` passed or
  /// `c` was cancelled.
  static bool wait(const cancellation& c, std::chrono::nanoseconds d,
                   const std::atomic<bool>& flag);
  /// Wakes the waits on `c` (call after setting their flag).
  static void poke(const cancellation& c);
};

}  // namespace dblock::detail
