// dblock: distributed locks and safe concurrent updates on the database you already run.
// A cancellation flag for waits (lease acquire, and any future waiting primitive).
#pragma once

#include <chrono>
#include <memory>

/// @file
/// @brief dblock::cancellation, the flag that ends waits such as lease_lock::acquire().

namespace dblock {

namespace detail {
struct cancel_state;
struct cancel_access;
}  // namespace detail

/**
 * @brief A cancellation flag shared by copies; cancel() wakes every wait that watches it.
 *
 * Copies share one flag; a moved-from object has none and must not be used again. Once
 * cancelled, a flag stays cancelled.
 *
 * Thread-safety: all members may be called concurrently, on one object or its copies, e.g.
 * cancel() from a signal-watching thread while another thread waits.
 */
class cancellation {
 public:
  /// A new flag, not cancelled. Throws only std::bad_alloc.
  cancellation();
  /// Requests cancellation; waits watching this flag end with errc::cancelled.
  void cancel() noexcept;
  /// True once cancel() was called.
  bool cancelled() const noexcept;
  /// Sleeps up to `d`; returns true early (or at once) when cancelled, false when `d` passed.
  /// Throws no dblock::error; only std::system_error, should the standard mutex or condition
  /// variable fail.
  bool sleep_for(std::chrono::nanoseconds d) const;

 private:
  friend struct detail::cancel_access;
  std::shared_ptr<detail::cancel_state> state_;
};

}  // namespace dblock
