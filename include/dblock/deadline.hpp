// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <type_traits>

/// @file
/// @brief Waits of any std::chrono duration, and deadlines: dblock::deadline_after(),
///        dblock::deadline_from().

namespace dblock {

/// The clock of every deadline dblock takes (a wait's end never moves with the wall clock).
using steady_clock = std::chrono::steady_clock;

/**
 * @brief The deadline `wait` from now, saturating: every wait of dblock goes through it.
 *
 * Any duration type is taken (`std::chrono::seconds`, `microseconds`, `duration<double>`, ...).
 * A wait too long for the clock (`std::chrono::milliseconds::max()`, `hours::max()`, an
 * infinite double) gives `steady_clock::time_point::max()`: wait for ever. Zero,
 * a negative wait or NaN gives now: the call tries once. A fraction of the clock's tick rounds
 * up. Thread-safety: safe from any thread. Never throws.
 */
template <class Rep, class Period>
steady_clock::time_point deadline_after(const std::chrono::duration<Rep, Period>& wait) noexcept {
  using tick = steady_clock::duration;
  const auto now = steady_clock::now();
  // Compared as long double, which holds every count of every standard duration without
  // overflow (a plain cast of hours::max() to nanoseconds would wrap).
  const std::chrono::duration<long double, std::nano> w = wait;
  if (!(w.count() > 0)) return now;  // zero, negative or NaN: try once
  const std::chrono::duration<long double, std::nano> room = steady_clock::time_point::max() - now;
  if (w >= room) return steady_clock::time_point::max();
  if constexpr (std::is_floating_point_v<Rep>) {
    return now + std::chrono::ceil<tick>(w);
  } else {
    return now + std::chrono::ceil<tick>(wait);
  }
}

/**
 * @brief A deadline on any clock as a steady_clock deadline.
 *
 * A steady_clock time point is taken as it is (saturating when its duration type is coarser or
 * finer than the clock's); another clock's (`system_clock`, ...) is measured from that clock's
 * now, so a later change of the wall clock does not move it. A point in the past makes the call
 * try once (another clock's gives now, a steady_clock one stays as it is); the clock's
 * `time_point::max()` gives steady_clock's: for ever. Thread-safety: safe from any thread. Never
 * throws.
 */
template <class Clock, class Duration>
steady_clock::time_point deadline_from(
    const std::chrono::time_point<Clock, Duration>& until) noexcept {
  if constexpr (std::is_same_v<Clock, steady_clock>) {
    using tick = steady_clock::duration;
    const std::chrono::duration<long double, std::nano> at = until.time_since_epoch();
    const std::chrono::duration<long double, std::nano> top =
        steady_clock::time_point::max().time_since_epoch();
    const std::chrono::duration<long double, std::nano> bottom =
        steady_clock::time_point::min().time_since_epoch();
    if (!(at < top)) return steady_clock::time_point::max();
    if (!(at > bottom)) return steady_clock::time_point::min();
    return steady_clock::time_point(std::chrono::ceil<tick>(at));
  } else {
    if (until == std::chrono::time_point<Clock, Duration>::max())
      return steady_clock::time_point::max();
    // The distance in long double: `until - now` in a common integer type could wrap (a
    // time_point of hours::max() in nanoseconds).
    using ld = std::chrono::duration<long double, std::nano>;
    return deadline_after(ld(until.time_since_epoch()) - ld(Clock::now().time_since_epoch()));
  }
}

}  // namespace dblock
