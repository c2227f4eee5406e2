// Internal: the storage layer's connection side. database_impl is the shared state behind
// dblock::database (URL, dialect, table names, pool); a session_scope is one pooled connection
// borrowed for a while, owning that connection's state (prepared statements, server session).
#pragma once

#include <soci/soci.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dialect/dialect.hpp"
#include "storage/connection_slots.hpp"
#include "storage/deadline.hpp"
#include "storage/statements.hpp"

namespace dblock::detail {

class session_scope;
class wake_hub;
class lease_renewer;

struct database_impl {
  std::string backend;
  std::string redacted_url;
  std::vector<std::string> connect_strings;  // hold the password: never printed
  std::shared_ptr<void> keeper;  // keeps an in-memory database alive (connector::keep_open)
  std::atomic<std::size_t> preferred{0};  // the connect string that worked last
  /// Lease tries the database refused (the lease was held): every try, where
  /// listener::contended() counts calls. Read by tests (tests/support/internals.hpp).
  std::atomic<std::uint64_t> refused_tries{0};
  database_options options;
  const dialect* dia = nullptr;
  table_names tables;
  lock_statements statements;  // dblock's statements for these tables, built once
  connection_slots pool;
  /// Wake-ups of waiters (see wake/hub.hpp); its channel opens when the first waiter enlists.
  /// Owned here but made by the layers above (core/database.cpp, renewer_of()): a shared_ptr
  /// carries its deleter, so storage never needs the complete types (storage includes neither
  /// wake/ nor lease/). Never copied out: the handle's destruction ends both.
  std::shared_ptr<wake_hub> hub;
  /// The watchdog of this handle's leases (see lease/renewer.hpp and renewer_of()).
  std::mutex renewer_mu;
  std::shared_ptr<lease_renewer> renewer;
  /// The largest failure-detection window a connection's server reported (connection_state::
  /// failure_detection), its source, and the (ttl, margin) pairs already reported short.
  mutable std::mutex failover_mu;
  /// Set once a window is known (an option or a report): until then a grant checks nothing.
  std::atomic<bool> window_known{false};
  std::chrono::milliseconds reported_window{0};
  std::string reported_source;
  std::set<std::pair<long long, long long>> short_ttls_reported;

  /// Per pool slot; only the slot's lessee touches it.
  struct slot {
    bool opened = false;
    std::unique_ptr<connection_state> state;
  };
  std::vector<slot> slots;

  explicit database_impl(std::size_t size);
  /// Drops the connection states before the pool closes its sessions.
  ~database_impl();

  /// Borrows a connected session. `armed`: dblock's own use, bounded by the thread's call
  /// deadline (storage/deadline.hpp), else by options.call_timeout; false for a connection
  /// handed to the caller (database::connect(), transactions), whose statements are theirs.
  /// `for_session_lease`: keeps an idle timeout an earlier session grant left on the connection
  /// (session_lease_state), which is reset for any other use.
  std::unique_ptr<session_scope> lease(const std::shared_ptr<database_impl>& self,
                                       bool armed = true, bool for_session_lease = false);
  /// Gives `s` the server's default idle timeout back (session_lease_state).
  void reset_idle(session_scope& s);
  /// Opens a slot's connection (see session.cpp), connecting for at most `left`.
  void open(soci::session& sql, slot& sl, std::optional<std::chrono::milliseconds> left);
  /// Opens slot `sl` for `s` on a thread of its own, waiting until `until` at most.
  std::unique_ptr<session_scope> open_bounded(std::unique_ptr<session_scope> s, slot& sl,
                                              deadline_clock::time_point until,
                                              const std::string& what);
  /// The deadline of a call borrowing a connection now: the thread's, else call_timeout.
  deadline_clock::time_point call_deadline_now(std::string& what) const;

  /// What this handle knows of its cluster's failure detection (no round trip).
  failover_info failover() const;
  /// Reports a lease of `ttl` / `margin` just granted on `name` through listener::short_ttl()
  /// when it cannot survive the loss of its holder's node (once per ttl and margin).
  void check_ttl(const std::string& name, std::chrono::milliseconds ttl,
                 std::chrono::milliseconds margin);

  /// Calls `f(listener&)` when a listener is attached; never throws.
  template <class F>
  void notify(F&& f) const noexcept {
    if (!options.events) return;
    try {
      f(*options.events);
    } catch (...) {
    }
  }

  /// Adds the `dblock migrate` hint to a schema_missing error.
  error with_hints(error e) const;
};

/**
 * One pooled connection, borrowed until destruction. On return it is rolled back if a
 * transaction is still open, and closed (to be reopened on the next lease) if it broke.
 */
class session_scope final : public exec_session {
 public:
  session_scope(std::shared_ptr<database_impl> db, std::size_t pos)
      : db_(std::move(db)), pos_(pos) {}
  session_scope(const session_scope&) = delete;
  session_scope& operator=(const session_scope&) = delete;
  ~session_scope();

  soci::session& sql() override { return db_->pool.at(pos_); }
  /// The connection's state, as made by the dialect's connector.
  connection_state& state() override { return *db_->slots[pos_].state; }
  /// The server session behind the connection (no round trip).
  const session_ref& server() { return state().server; }
  database_impl& db() { return *db_; }
  const std::shared_ptr<database_impl>& db_ptr() const { return db_; }
  const dialect& dia() const { return *db_->dia; }
  const table_names& tables() const { return db_->tables; }
  const lock_statements& statements() const { return db_->statements; }

  /// Marks the connection broken: it is closed when given back.
  void mark_broken() noexcept override { broken_ = true; }
  bool broken() const noexcept { return broken_; }

  /// Bounds the use of this connection by `until` (see storage/deadline.hpp).
  void arm(deadline_clock::time_point until, std::string what);
  /// Ends the bound set by arm() (deadline_fired() stays).
  void disarm() noexcept {
    armed_.disarm();
    state().call_deadline.reset();
  }
  /// True once the deadline fired on this connection: whatever it was running may have been
  /// cancelled or cut off, and a write that seemed to succeed is in doubt (PostgreSQL answers a
  /// COMMIT cancelled while it waited for a synchronous standby with success and a warning:
  /// committed locally, maybe not replicated).
  bool deadline_fired() const noexcept { return armed_.fired(); }
  /// Why the deadline fired ("the server did not answer within 5000 ms (...)").
  std::string deadline_cause() const { return armed_.cause(); }

  /// Classifies the exception being handled (call from a catch block), marks the connection
  /// broken when it was lost, and returns the error (with hints).
  error failure(const std::string& what);
  /// Marks this use as a call that only reads (with_read()): a connection its deadline cut off
  /// is then errc::timeout, as a read the server cancelled is, not connection_lost.
  void reads_only() noexcept { reads_only_ = true; }

  /// Runs one of dblock's statements (see executor::run).
  sql_result run(const statement& st, const std::vector<sql_param>& values) {
    return db_->dia->exec.run(*this, st, values);
  }

 private:
  std::shared_ptr<database_impl> db_;
  std::size_t pos_;
  bool broken_ = false;
  bool reads_only_ = false;
  armed_connection armed_;
};

/// Runs f(session_scope&) on a pooled connection, translating database failures (SOCI's
/// exceptions) into dblock::error. dblock::error and the exceptions of callers' callbacks pass
/// unchanged.
template <class F>
auto with_session(const std::shared_ptr<database_impl>& db, const std::string& what, F&& f) {
  auto s = db->lease(db);
  try {
    return f(*s);
  } catch (const soci::soci_error&) {
    throw s->failure(what);
  }
}

/// Runs f(session_scope&), a call that only reads (nothing it sends writes), as with_session()
/// does; when the call's deadline cuts the connection off (a frozen server, a black hole: the
/// cancel request never got an answer), the call ends with errc::timeout, as one whose statement
/// the server cancelled does (docs/safety.md, "What each outcome means"). connection_lost stays
/// for a connection that broke before the deadline.
template <class F>
auto with_read(const std::shared_ptr<database_impl>& db, const std::string& what, F&& f) {
  auto s = db->lease(db);
  s->reads_only();
  try {
    return f(*s);
  } catch (const soci::soci_error&) {
    throw s->failure(what);
  }
}

/// Runs the read f(session_scope&) as with_session() does, and sends it again when its own
/// connection breaks (up to three times in all), then passes that error on: for reading back the
/// outcome of a write whose reply was lost, where only the read may ever be repeated.
template <class F>
auto read_retried(const std::shared_ptr<database_impl>& db, const std::string& what, F&& f) {
  const resolution_time grace;  // after the call's deadline: a little time to read back
  for (int round = 0;; ++round) {
    try {
      return with_session(db, what, f);
    } catch (const error& e) {
      if (e.code() != errc::connection_lost || round >= 2) throw;
    }
  }
}

/// Ends the server session behind a broken connection (connector::end_session) from another
/// pooled connection, and waits until it is gone: then nothing it was still executing (a
/// statement or a COMMIT whose reply was lost) can take effect any more, and reading the data
/// back tells the final outcome. False when that could not be confirmed.
bool end_broken_session(const std::shared_ptr<database_impl>& db, const session_ref& s);

/// For an in_doubt message: ends the broken session (end_broken_session) and says whether the
/// outcome is final now.
std::string in_doubt_finality(const std::shared_ptr<database_impl>& db, const session_ref& s);
/// Why end_broken_session() returned false, for an in_doubt message ("the server session could
/// not be confirmed ended", or that a transaction-mode pooler hides it).
std::string session_not_ended(const database_impl& db);

/// The gate through which dblock's components reach the internals of the public handles.
struct access {
  static const std::shared_ptr<database_impl>& impl(const database& db) noexcept {
    return db.impl_;
  }
  static session_scope& scope(database::connection& c) noexcept { return *c.s_; }
  static database::connection make_connection(std::unique_ptr<session_scope> s) {
    return database::connection(std::move(s));
  }
};

}  // namespace dblock::detail
