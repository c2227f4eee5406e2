// Internal: every call's deadline (promise D1 of the safety contract, docs/safety.md).
//
// A public call states its deadline once, for the thread that runs it (call_deadline: the
// caller's wait, a lease's TTL, or the database's call_timeout). Every pooled connection that
// dblock borrows inside the call is armed with that deadline (armed_connection): when it passes
// while the connection is still in use, one sentinel thread per process asks the server to stop
// (the dialect's interrupter: PQcancel, KILL QUERY, sqlite3_interrupt) and, when the statement
// still has not returned shortly after, cuts the socket (shutdown(2)), which ends any blocking
// read in the client library. So no call outlives its deadline by more than that grace, whatever
// the server does: frozen (SIGSTOP), waiting for a synchronous standby that is gone, or behind a
// network black hole. A connection whose deadline fired is closed when given back (a cancel
// arriving late must never hit the next user's statement).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "dialect/interrupter.hpp"

namespace dblock::detail {

using deadline_clock = std::chrono::steady_clock;

/// The deadline of the public call running on this thread (RAII; nests: an inner deadline never
/// extends an outer one).
class call_deadline {
 public:
  /// The call ends by `until`; `what` names the bound in messages ("the lease's TTL of 5000 ms").
  call_deadline(deadline_clock::time_point until, std::string what);
  /// A bound of `d` from now (std::chrono::milliseconds::max() and the like: none).
  call_deadline(std::chrono::milliseconds d, std::string what);
  call_deadline(const call_deadline&) = delete;
  call_deadline& operator=(const call_deadline&) = delete;
  ~call_deadline();

  /// The deadline of this thread's call, if any.
  static std::optional<deadline_clock::time_point> current() noexcept;
  /// What bounds it, for messages.
  static std::string current_what();
  /// Time left before this thread's deadline (zero when passed; nothing without one).
  static std::optional<std::chrono::milliseconds> left() noexcept;

 private:
  struct saved {
    bool set;
    deadline_clock::time_point until;
    std::string what;
    bool extended;
  } prev_;
  friend class resolution_time;
};

/**
 * Time to resolve an outcome after the deadline passed (a lost reply read back by owner token,
 * the broken server session ended): the thread's deadline moves to now + resolve_grace when it
 * has passed, once per call (never again inside). Without a deadline, nothing changes.
 */
class resolution_time {
 public:
  resolution_time();
  resolution_time(const resolution_time&) = delete;
  resolution_time& operator=(const resolution_time&) = delete;
  ~resolution_time();

 private:
  std::optional<call_deadline> inner_;
};

/// A public wait from `start` to `deadline` for messages: "250 ms" (at least 0), or "no end".
std::string wait_text(deadline_clock::time_point start, deadline_clock::time_point deadline);

/// How long after its deadline a statement that has not returned is cut off.
constexpr std::chrono::milliseconds cut_grace{250};
/// How long after a passed deadline an outcome may still be resolved (resolution_time).
constexpr std::chrono::milliseconds resolve_grace{600};

/// A pooled connection armed with a deadline while it is in use (RAII; see the top of the file).
class armed_connection {
 public:
  armed_connection() = default;
  armed_connection(const armed_connection&) = delete;
  armed_connection& operator=(const armed_connection&) = delete;
  ~armed_connection() { disarm(); }

  /// Arms with `until`: at it, `target` is interrupted. Replaces an earlier arming.
  void arm(deadline_clock::time_point until, std::unique_ptr<interrupter> target, std::string what);
  /// Disarms (waits while the sentinel is interrupting this connection); fired() stays.
  void disarm() noexcept;
  /// True once the deadline fired on this connection (it must then be closed).
  bool fired() const noexcept;
  /// The message of a failure the deadline caused ("the server did not answer within ...").
  std::string cause() const;
  /// When armed: the deadline.
  std::optional<deadline_clock::time_point> until() const noexcept;

  struct entry;

 private:
  std::shared_ptr<entry> e_;
};

/// For tests (the negative control): false stops the sentinel from interrupting anything, as
/// dblock behaved before deadlines.
void set_deadlines_enforced(bool on) noexcept;
/// The number of connections the sentinel interrupted in this process.
long long deadlines_fired() noexcept;

}  // namespace dblock::detail
