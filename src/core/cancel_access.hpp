// Internal: lets a wake-up interrupt a wait on a cancellation, so that one sleep ends on either a
// ring or a cancel. Each sleeper has a wake_slot of its own: a poke wakes that sleeper only, while
// cancel() wakes every slot registered with the cancellation. (One cancellation is often shared by
// many waits, say a service's shutdown flag: a poke through its condition variable would wake them
// all, a herd inside the process.)
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "dblock/cancellation.hpp"

namespace dblock::detail {

/// The private wake-up of one sleeper (a gate or hub waiter). Not copyable; it must outlive the
/// waits on it.
struct wake_slot {
  std::mutex mu;
  std::condition_variable cv;
};

struct cancel_access {
  /// Sleeps up to `d` on `slot`; true when `flag` was set (by a poke()), false when `d` passed or
  /// `c` was cancelled. The slot is registered with `c` for the length of the sleep.
  static bool wait(const cancellation& c, std::chrono::nanoseconds d, const std::atomic<bool>& flag,
                   wake_slot& slot);
  /// Wakes the sleeper on `slot` (call after setting its flag); no other sleeper wakes.
  static void poke(wake_slot& slot);
  /// One cancellation that has fired: a disarmed guard's or leadership's lost().
  static const cancellation& fired();
};

}  // namespace dblock::detail
