// Internal: the one way dblock writes. A write_scope begins a write on a session (the dialect's
// BEGIN and lock timeout, or a single autocommit statement), commits it resolving a lost COMMIT
// reply (end the server session, then errc::in_doubt saying whether the outcome is final), rolls
// back on failure or destruction, and undoes per-transaction session settings.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dblock/retry.hpp"
#include "storage/session.hpp"

namespace dblock::detail {

enum class write_kind {
  transaction,  ///< BEGIN (SQLite: BEGIN IMMEDIATE) ... COMMIT
  statement,    ///< one autocommit statement (SQLite: inside its prepared write transaction)
  /// A statement (as above) whose commit need not wait for the disk, because a crash can only
  /// undo it and that is safe: a release (the lease then runs out at its TTL) and the waiter
  /// queue's own writes (an entry decides no grant). SQLite: `PRAGMA synchronous = NORMAL` for
  /// its commit alone; PostgreSQL does the same in the release's and the queue insert's SQL.
  unflushed,
};

class write_scope {
 public:
  /**
   * Begins the write. `what` names the operation in errors. For a transaction, `lock_timeout`
   * bounds every lock wait inside it (zero: do not wait; nothing: the session's default).
   * @throws dblock::error classified; a BEGIN that may have gone through marks the connection
   *         broken so that it is never handed out inside a transaction.
   */
  write_scope(session_scope& s, write_kind kind, std::string what = "write",
              std::optional<std::chrono::milliseconds> lock_timeout = std::nullopt);
  write_scope(const write_scope&) = delete;
  write_scope& operator=(const write_scope&) = delete;
  /// Rolls back when neither commit() nor rollback() ran.
  ~write_scope();

  /**
   * Commits. A transaction that had failed (PostgreSQL would answer COMMIT with a silent
   * ROLLBACK) is rolled back and reported with the cause. When the COMMIT reply is lost the
   * server session is ended first and errc::in_doubt is thrown; never connection_lost.
   */
  void commit();
  /// Rolls back; never throws (a connection that cannot roll back is discarded).
  void rollback() noexcept;
  /// True until commit() or rollback().
  bool open() const noexcept { return open_; }
  /// Records a statement failure of this write (classified): commit() then refuses to commit.
  void failed(const error& e) { failure_ = e; }

 private:
  void end() noexcept;

  session_scope& s_;
  write_kind kind_;
  std::string what_;
  bool open_ = false;
  std::optional<error> failure_;
};

/// One write statement committed by itself: `kind` is write_kind::statement (a grant, or any
/// write that must reach the disk) or write_kind::unflushed (see there). `what` names it in
/// errors.
sql_result write_statement(session_scope& s, write_kind kind, const statement& st,
                           const std::vector<sql_param>& v, const std::string& what = "write");

/// The retry policies of dblock's own writes that failed with a deadlock or a busy error of
/// their own (for example MariaDB's hot-key deadlock between an acquire and a release), which
/// says nothing about the lock; full-jitter backoff from 1 ms. The one set of constants:
/// - a grant (an acquire of a lease or a permit): up to 9 tries, backoff up to 256 ms;
const retry_policy& grant_conflict_policy();
/// - the bookkeeping of a lease already held or of a queue entry (renew, release, leaving a
///   queue): up to 3 tries, backoff up to 8 ms, well within the lease's bound.
const retry_policy& bookkeeping_conflict_policy();

/// For an autocommit write whose reply was lost (the connection broke after it was sent), when
/// the data cannot tell this call's change from another writer's (a compare-and-set, a stock
/// take or put): errc::in_doubt, saying whether the outcome is final by now (the server session
/// `server` that ran it is ended first, in_doubt_finality()).
error undecided_write(session_scope& s, const session_ref& server, const std::string& what,
                      const error& cause);

/// Runs f(), one autocommit write on `s` in a write scope of write_kind::statement, and returns
/// what f returns. When the connection breaks before the reply, `on_lost(server, cause)` decides
/// the outcome: it throws (errc::in_doubt), or returns when the write certainly did not take
/// effect, and errc::connection_lost ("nothing was written") is thrown. Any other failure passes.
template <class F, class L>
auto statement_write(session_scope& s, const std::string& what, F&& f, L&& on_lost) {
  const session_ref server = s.server();
  std::optional<error> lost;
  try {
    write_scope w(s, write_kind::statement, what);
    auto out = f();
    w.commit();
    return out;
  } catch (const error& e) {
    if (e.code() != errc::connection_lost) throw;
    lost = e;
  } catch (const soci::soci_error&) {
    error e = s.failure(what);
    if (e.code() != errc::connection_lost) throw e;
    lost = e;
  }
  on_lost(server, *lost);
  throw error(errc::connection_lost,
              what +
                  ": the connection broke, and the write was found not to have taken effect "
                  "(nothing was written): " +
                  lost->what(),
              lost->backend(), lost->sqlstate(), lost->native_code());
}

/// statement_write() for a write whose outcome the data cannot decide (undecided_write()).
template <class F>
auto statement_write(session_scope& s, const std::string& what, F&& f) {
  return statement_write(s, what, std::forward<F>(f),
                         [&](const session_ref& server, const error& e) {
                           throw undecided_write(s, server, what, e);
                         });
}

/// Runs f() and sends it again when it fails with errc::connection_lost, which the writes of
/// dblock's data features report only when nothing was written (a lost reply of a write is
/// resolved or reported in_doubt where it happens): three sends in all.
template <class F>
auto resend_unwritten(F&& f) {
  for (int send = 0;; ++send) {
    try {
      return f();
    } catch (const error& e) {
      if (e.code() != errc::connection_lost || send >= 2) throw;
    }
  }
}

/// Runs body(session_scope&) in a write transaction on a pooled connection and commits.
template <class F>
auto write_transaction(const std::shared_ptr<database_impl>& db, const std::string& what,
                       std::optional<std::chrono::milliseconds> lock_timeout, F&& body) {
  return with_session(db, what, [&](session_scope& s) {
    write_scope w(s, write_kind::transaction, what, lock_timeout);
    if constexpr (std::is_void_v<decltype(body(s))>) {
      body(s);
      w.commit();
    } else {
      auto out = body(s);
      w.commit();
      return out;
    }
  });
}

}  // namespace dblock::detail
