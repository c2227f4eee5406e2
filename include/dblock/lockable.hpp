// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "dblock/deadline.hpp"
#include "dblock/error.hpp"

/// @file
/// @brief The standard lock concepts over dblock's locks: dblock::lockable (Lockable,
///        TimedLockable) and dblock::shared_lockable (SharedTimedLockable).

namespace dblock {

namespace detail {

/// Per-thread lock objects and holds of lockable and shared_lockable.
template <class Lock, class Hold>
class per_thread_holds {
 public:
  template <class... Args>
  explicit per_thread_holds(Args&&... args)
      : make_([args...] { return Lock(args...); }), first_(make_()) {}

  /// This thread's lock object and hold, made on its first use (only this thread touches them).
  std::pair<Lock*, Hold*> mine() {
    std::lock_guard<std::mutex> lk(mu_);
    auto& e = entries_[std::this_thread::get_id()];
    if (!e) e = std::make_unique<entry>(entry{first_ ? std::move(*first_) : make_(), Hold()});
    first_.reset();
    return {&e->lock, &e->hold};
  }
  /// This thread's hold, or nullptr when this thread never locked.
  Hold* held() {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(std::this_thread::get_id());
    return it == entries_.end() ? nullptr : &it->second->hold;
  }

 private:
  struct entry {
    Lock lock;
    Hold hold;
  };
  std::function<Lock()> make_;
  std::optional<Lock> first_;  // made at construction, so that bad arguments throw there
  std::mutex mu_;
  std::map<std::thread::id, std::unique_ptr<entry>> entries_;
};

[[noreturn]] inline void refuse(errc code, const std::string& what) {
  throw error(code, what);
}

}  // namespace detail

/**
 * @brief A dblock lock as a standard TimedLockable: `std::lock_guard`, `std::unique_lock` and
 *        `std::scoped_lock` work with it.
 *
 * `Lock` is lease_lock, semaphore (each holder has one permit) or lock_set; the constructor takes
 * that type's constructor arguments. One lockable is meant to be shared by the threads of a
 * process, like a std::timed_mutex: each thread that locks gets a lock object of its own (made
 * from the same arguments on its first lock() and kept for the next), so threads exclude each
 * other through the database exactly as processes do (a semaphore admits up to its N holders
 * across threads and processes alike).
 *
 * Like std::timed_mutex it is not recursive: a thread that locks again without unlocking is
 * refused with errc::invalid_argument, and unlock() by a thread that holds nothing throws
 * errc::not_owner (inside a std::lock_guard's destructor that terminates: a loud failure of a
 * broken program). The lease behind the hold has the lock's TTL: to hold it longer than the TTL,
 * give the options `watchdog = true`, and check guard().valid() or write through
 * guard().fenced() (the fence is what protects your writes). Only a timeout of the wait becomes
 * `false` in try_lock_for()/try_lock_until(); every other failure (a connection lost, the pool
 * exhausted, ...) throws dblock::error as the lock's own calls do.
 *
 * Thread-safety: every member may be called from any thread; guard() refers to the calling
 * thread's hold.
 */
template <class Lock>
class lockable {
 public:
  /// The guard type of `Lock` (lease_guard, or lock_set_guard).
  using guard_type = decltype(std::declval<Lock&>().acquire_until(steady_clock::time_point()));

  /// A lockable over `Lock(args...)`; the arguments are copied for every thread's lock object.
  /// @throws dblock::error what `Lock`'s constructor throws (errc::invalid_argument).
  template <class... Args>
  explicit lockable(Args&&... args) : holds_(std::forward<Args>(args)...) {}
  lockable(const lockable&) = delete;
  lockable& operator=(const lockable&) = delete;

  /// Waits for ever (lease_lock::acquire_until(time_point::max())).
  /// @throws dblock::error the lock's errors; errc::invalid_argument when this thread holds it.
  void lock() {
    auto [lock, hold] = mine();
    hold->emplace(lock->acquire_until(steady_clock::time_point::max()));
  }

  /// One attempt: true when this thread now holds it.
  /// @throws dblock::error the lock's try_acquire() errors; errc::invalid_argument when this
  ///         thread holds it already.
  bool try_lock() {
    return take_once([](Lock& l) { return l.try_acquire(); });
  }

  /// Waits up to `wait`: true when this thread now holds it, false when the wait ran out.
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& wait) {
    return try_lock_until(deadline_after(wait));
  }

  /// Waits until `deadline` (any clock; in the past: one attempt): true when this thread now
  /// holds it, false when the deadline passed.
  template <class Clock, class Duration>
  bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline) {
    return take_until([&](Lock& l) { return l.acquire_until(deadline_from(deadline)); });
  }

  /// Releases this thread's hold (a failure goes to the lock's error handler, as a guard's
  /// destructor does). @throws dblock::error errc::not_owner when this thread holds nothing.
  void unlock() { held("unlock").reset(); }

  /// This thread's current hold: its fence(), valid(), fenced(), renew().
  /// @throws dblock::error errc::not_owner when this thread holds nothing.
  guard_type& guard() { return *held("guard()"); }

 protected:
  /// This thread's lock object and (empty) hold; refused when this thread holds it already.
  std::pair<Lock*, std::optional<guard_type>*> mine() {
    auto m = holds_.mine();
    if (*m.second)
      detail::refuse(errc::invalid_argument,
                     "lock: this thread holds the lock already (dblock's lockables are not "
                     "recursive, like the standard mutexes)");
    return m;
  }
  /// One attempt through `attempt` (returning an optional guard): true when it took the lock.
  template <class F>
  bool take_once(F&& attempt) {
    auto [lock, hold] = mine();
    auto g = attempt(*lock);
    if (!g) return false;
    hold->emplace(std::move(*g));
    return true;
  }
  /// A wait through `wait` (returning a guard): false when it ended with errc::timeout.
  template <class F>
  bool take_until(F&& wait) {
    auto [lock, hold] = mine();
    try {
      hold->emplace(wait(*lock));
      return true;
    } catch (const error& e) {
      if (e.kind() == errc::timeout) return false;
      throw;
    }
  }
  /// This thread's hold; errc::not_owner (naming `what`) when it holds nothing.
  std::optional<guard_type>& held(const char* what) {
    auto* hold = holds_.held();
    if (!hold || !*hold)
      detail::refuse(errc::not_owner, std::string(what) + ": this thread does not hold the lock");
    return *hold;
  }
  /// Each thread's lock object and hold.
  detail::per_thread_holds<Lock, std::optional<guard_type>> holds_;
};

/**
 * @brief A read-write lock as a standard SharedTimedLockable: `std::unique_lock` and
 *        `std::shared_lock` work with it.
 *
 * `Lock` is rwlock; the constructor takes its constructor arguments. The exclusive side is
 * lockable's (lock(), try_lock(), try_lock_for(), try_lock_until(), unlock(), guard()); the
 * shared side adds lock_shared() and the rest. Shared by the threads of a process like a
 * std::shared_timed_mutex, with an rwlock object per thread, under lockable's rules (not
 * recursive, TTL and watchdog, only a timeout is `false`). A thread holds either the exclusive
 * or a shared hold, never both; guard() is whichever it holds.
 *
 * Thread-safety: every member may be called from any thread; guard() refers to the calling
 * thread's hold.
 */
template <class Lock>
class shared_lockable : public lockable<Lock> {
 public:
  using typename lockable<Lock>::guard_type;
  using lockable<Lock>::lockable;

  /// Waits for ever to read. @throws dblock::error as lockable::lock().
  void lock_shared() {
    auto [lock, hold] = this->mine();
    hold->emplace(lock->acquire_shared_until(steady_clock::time_point::max()));
  }
  /// One attempt to read. @throws dblock::error as lockable::try_lock().
  bool try_lock_shared() {
    return this->take_once([](Lock& l) { return l.try_acquire_shared(); });
  }
  /// Waits up to `wait` to read; false when it ran out.
  template <class Rep, class Period>
  bool try_lock_shared_for(const std::chrono::duration<Rep, Period>& wait) {
    return try_lock_shared_until(deadline_after(wait));
  }
  /// Waits until `deadline` (any clock; in the past: one attempt) to read; false when it passed.
  template <class Clock, class Duration>
  bool try_lock_shared_until(const std::chrono::time_point<Clock, Duration>& deadline) {
    return this->take_until(
        [&](Lock& l) { return l.acquire_shared_until(deadline_from(deadline)); });
  }
  /// Releases this thread's shared hold, as unlock() does. @throws dblock::error
  /// errc::not_owner when this thread holds nothing.
  void unlock_shared() { this->unlock(); }
};

}  // namespace dblock
