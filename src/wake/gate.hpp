// Internal: the local gates of one database handle. Waiting acquires of one name that are not fair
// line up here, in arrival order, before they go to the database, and the one that gets the lease
// keeps the gate while it holds it. So only one thread per handle and name contends at the
// database at a time: a release by this process passes the gate to the next local waiter, whose
// single try then meets a free row, instead of every local waiter (and the releaser asking again
// at once) trying and failing on it. The database still decides every grant: the gate only orders
// this process's own contenders. A holder whose lease ran out without a release (no watchdog, a
// stalled thread) no longer keeps the gate: the next waiter takes it over at the holder's local
// validity deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/cancel_access.hpp"

namespace dblock::detail {

class local_gates;

/// The gate of one name, held (see local_gates::enter()). Leaving is idempotent and thread-safe
/// (each pass has its own generation, which only the holding pass matches); the destructor
/// leaves.
class gate_pass {
 public:
  gate_pass(local_gates& gates, std::string name, std::uint64_t gen)
      : gates_(gates), name_(std::move(name)), gen_(gen) {}
  ~gate_pass() { leave(); }
  gate_pass(const gate_pass&) = delete;
  gate_pass& operator=(const gate_pass&) = delete;

  /// The lease was acquired through this pass: `valid_until` tells, from any thread, until when
  /// the holder's lease is valid locally (time_point::min() once it is lost or gone).
  void bind(std::function<std::chrono::steady_clock::time_point()> valid_until);
  /// Opens the gate for the next waiter (once).
  void leave();

 private:
  local_gates& gates_;
  const std::string name_;
  const std::uint64_t gen_;
};

/// See the file comment. Thread-safe.
class local_gates {
 public:
  using steady = std::chrono::steady_clock;
  /// Waits until the gate of `name` is the caller's; null when `deadline` passed or `cancel`
  /// fired first. `queued`, if set, is called (without the gates' lock) when the caller has to
  /// line up behind another.
  std::shared_ptr<gate_pass> enter(const std::string& name, const cancellation& cancel,
                                   steady::time_point deadline,
                                   const std::function<void()>& queued = {});

 private:
  friend class gate_pass;
  struct waiter {
    cancellation cancel;
    wake_slot slot;                  // a poke wakes this waiter alone
    std::atomic<bool> poked{false};  // ends its sleep: granted, or a holder to time
    std::uint64_t gen = 0;           // guarded by mu_; non-zero once granted
    steady::time_point until;        // guarded by mu_; when its sleep ends
  };
  struct gate {
    std::uint64_t gen = 0;  // the generation of the pass that holds it; 0: open
    std::function<steady::time_point()> holder_until;  // set once the holder has the lease
    std::deque<std::shared_ptr<waiter>> queue;         // in arrival order
  };
  void bind(const std::string& name, std::uint64_t gen,
            std::function<steady::time_point()> valid_until);
  void leave(const std::string& name, std::uint64_t gen);
  /// With mu_ held: passes the gate to the first waiter in line, or opens (and forgets) it.
  void pass_on(std::unordered_map<std::string, gate>::iterator it);

  std::mutex mu_;
  std::unordered_map<std::string, gate> gates_;
  std::uint64_t next_gen_ = 1;
};

}  // namespace dblock::detail
