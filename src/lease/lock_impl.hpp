// Internal: the state behind a lease_lock handle, shared by the single try (acquire.cpp) and the
// waiting acquire (wait.cpp).
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "dblock/lease_lock.hpp"
#include "dblock/retry.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"

namespace dblock {

namespace detail {

/// The outcome of one acquire statement.
struct sent_acquire {
  enum kind_t { acquired, held, resend } kind;
  std::int64_t fence = 0;
};

/// Tags lease_lock's constructor for dblock's internal lease names.
struct internal_name_t {};

/// 32 random hex digits: a new owner token.
std::string new_owner_token();
/// This host's name and the calling thread's id, as recorded in the lock row.
const std::string& host_name();
std::string thread_label();

/**
 * One acquire call as the listener sees it (listener.hpp): contended() once per call,
 * waiting() paired, acquire_failed() when it gives up, acquired() with the whole call's
 * latency. The outermost call on a thread reports; the lease tries made inside it (a
 * semaphore's tries of its slots, a waiting acquire's tries) report only their grant, timed
 * from the outer call's start.
 */
class acquire_call {
 public:
  /// `db` and `name` must outlive the call (they are the lock's own: no copy on the try's path).
  acquire_call(const std::shared_ptr<database_impl>& db, const std::string& name);
  ~acquire_call();
  acquire_call(const acquire_call&) = delete;
  acquire_call& operator=(const acquire_call&) = delete;
  /// The start of the outermost acquire call running on this thread, if any.
  static std::optional<steady::time_point> started_here();
  /// The call found the lease held (reported once, by the outermost call).
  void refused();
  /// The call waits (its first try was refused); waiting(false) follows at its end.
  void waits();
  /// Runs `f`, reporting its error (acquire_failed) before passing it on.
  template <class F>
  auto run(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const error& e) {
      failed(e.code() == errc::timeout     ? acquire_failure::timeout
             : e.code() == errc::cancelled ? acquire_failure::cancelled
                                           : acquire_failure::error);
      throw;
    } catch (...) {
      failed(acquire_failure::error);
      throw;
    }
  }

 private:
  void failed(acquire_failure why);
  const std::shared_ptr<database_impl>& db_;
  const std::string& name_;
  const bool outer_;
  const steady::time_point started_ = steady::now();
  bool refused_ = false, waiting_ = false;
};

}  // namespace detail

struct lease_lock::impl {
  impl(database d, std::string n, lease_options o)
      : db(std::move(d)), name(std::move(n)), options(std::move(o)) {}
  database db;
  std::string name;
  lease_options options;
  lease_mode mode = lease_mode::row;             // chosen by the constructor, never changed
  std::shared_ptr<detail::lease_state> current;  // the acquisition reentry extends
  std::thread::id holder;                        // the thread that made `current`
  std::atomic<std::thread::id> in_call{};        // the thread inside try_acquire/acquire
  retry_policy transient;  // deadlocks and busy errors of the upsert itself, built once

  /// One try. A waiting acquire passes its own owner token and its queue ticket (the entry is
  /// deleted in the same statement when acquired); otherwise a new token is drawn. A fair lock
  /// with a ticket takes a free lease only in queue order, checked by the acquire statement
  /// itself (wait_queue::behind_everyone: only when nobody is queued).
  std::optional<lease_guard> attempt(const std::string& token = std::string(),
                                     std::int64_t ticket = 0);
  detail::sent_acquire send(const detail::acquire_params& p, std::int64_t ticket, bool in_order,
                            int expected_holds, detail::steady::time_point& sent);
  detail::sent_acquire resolve_lost_reply(const detail::acquire_params& p, int expected_holds,
                                          const detail::session_ref& server, const error& cause);
  lease_guard granted(const detail::acquire_params& p, std::int64_t fence,
                      detail::steady::time_point sent, bool reentry);
  /// lease_mode::session (src/lease/session_mode.cpp): one try, and a wait in the server's own
  /// lock queue until `deadline`.
  std::optional<lease_guard> session_attempt();
  /// Refuses lease_mode::session where it cannot work (errc::invalid_argument, with the reason).
  void session_checks() const;
  std::optional<lease_guard> session_reentry();
  lease_guard session_granted(std::unique_ptr<detail::session_scope> s, std::int64_t fence,
                              detail::steady::time_point sent);
  lease_guard session_wait(detail::steady::time_point deadline, const cancellation& cancel,
                           detail::acquire_call& call);
  /// One session of session_wait(); its connection failures pass to the caller.
  lease_guard session_wait_once(detail::steady::time_point deadline, const cancellation& cancel,
                                const std::string& what, const std::function<error()>& timed_out);
  /// The connection a session lease's grant pins (set just before granted(), which moves it
  /// into the lease's state before its watchdog starts).
  std::unique_ptr<detail::session_scope> pinning;
};

namespace detail {

/// The one gate through which the lock kinds (src/kinds/) reach a lease's internals: a lock on
/// an internal name (U+FFFF suffixes, which users cannot name) and a guard's state. A new kind
/// needs no friend declaration in lease_lock.hpp.
struct lease_access {
  static lease_lock internal(database db, std::string name, lease_options options) {
    return lease_lock(std::move(db), std::move(name), std::move(options), internal_name_t{});
  }
  static const std::shared_ptr<lease_state>& state(const lease_guard& g) { return g.state_; }
  /// One try of `lk` with a waiter's owner token and queue ticket (lease_lock::impl::attempt();
  /// the entry is deleted with the acquire where the dialect can, wait_queue::exit_deferred()).
  static std::optional<lease_guard> attempt(lease_lock& lk, const std::string& token,
                                            std::int64_t ticket) {
    return lk.impl_->attempt(token, ticket);
  }
};

}  // namespace detail

namespace detail {

/**
 * Refuses, loudly (errc::invalid_argument), a lease_lock used by two threads at once, or
 * re-entered by a thread other than the one that holds its current acquisition: reentrancy is per
 * object, so a handle shared by threads would let a second thread "re-enter" the first one's
 * lease. Sequential use by several threads, and guards released on other threads, are fine.
 */
class thread_check {
 public:
  explicit thread_check(lease_lock::impl& lk);
  ~thread_check();
  thread_check(const thread_check&) = delete;
  thread_check& operator=(const thread_check&) = delete;

 private:
  lease_lock::impl& lk_;
};

}  // namespace detail

}  // namespace dblock
