// The storage layer's two scopes: a borrowed pooled connection (session_scope) and a write on it
// (write_scope).
#include "storage/session.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <thread>

#include "storage/write_scope.hpp"

namespace dblock::detail {

// Opens the connection of slot `sl` on `sql`, trying the connect strings from the preferred one
// on (a multi-host URL whose client library takes one host): the first that connects becomes
// the preferred one.
void database_impl::open(soci::session& sql, slot& sl,
                         std::optional<std::chrono::milliseconds> left) {
  const std::size_t n = connect_strings.size();
  const std::size_t first = preferred.load() % n;
  std::string reasons;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (first + k) % n;
    try {
      sl.state.reset();
      if (sql.get_backend() != nullptr) sql.close();
      // Inside a call with less time left than the connect timeout: lowered to what is left.
      const bool lower = left && *left < options.connect_timeout;
      sql.open(dia->conn.factory(),
               lower ? dia->conn.bounded_connect(connect_strings[i], *left) : connect_strings[i]);
      sl.state = dia->conn.on_connect(sql, options);
      sl.state->transaction_pooler = options.pooler == pooler_mode::transaction;
      // Behind a transaction-mode pooler a session setting would land on whichever server
      // connection runs it: the isolation level goes into each BEGIN instead.
      auto iso = dia->conn.isolation_sql(options.isolation);
      if (!iso.empty() && !sl.state->transaction_pooler) sql << iso;
      if (sl.state->failure_detection.count() > 0) {
        std::lock_guard<std::mutex> lk(failover_mu);
        if (sl.state->failure_detection > reported_window) {
          reported_window = sl.state->failure_detection;
          reported_source = sl.state->failure_detection_source;
        }
        window_known.store(true);
      }
      preferred.store(i);
      return;
    } catch (...) {
      error e = dia->errors.classify_current("connect");
      sl.state.reset();
      try {
        sql.close();
      } catch (...) {
      }
      std::string why = std::string(e.what()).substr(std::string("connect: ").size());
      if (n > 1) why = "host " + std::to_string(i + 1) + " of " + std::to_string(n) + ": " + why;
      reasons += (reasons.empty() ? "" : "; ") + why;
      if (k + 1 == n)
        throw error(errc::connection_failed, "cannot connect to " + redacted_url + ": " + reasons,
                    backend, e.sqlstate(), e.native_code());
    }
  }
}

deadline_clock::time_point database_impl::call_deadline_now(std::string& what) const {
  if (const auto d = call_deadline::current()) {
    what = call_deadline::current_what();
    return *d;
  }
  what = std::to_string(options.call_timeout.count()) + " ms (database_options::call_timeout)";
  return deadline_clock::now() + options.call_timeout;
}

std::unique_ptr<session_scope> database_impl::lease(const std::shared_ptr<database_impl>& self,
                                                    bool armed, bool for_session_lease) {
  std::size_t pos = 0;
  std::string what;
  const auto until = armed ? call_deadline_now(what) : deadline_clock::time_point::max();
  auto wait = options.pool_wait;
  if (armed) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - deadline_clock::now());
    wait = std::max(std::chrono::milliseconds(0), std::min(wait, left));
  }
  auto wait_ms = static_cast<int>(std::min<long long>(wait.count(), 1LL << 30));
  // The pool's own limit is pool_exhausted; the call's deadline coming first is its timeout.
  if (!pool.try_lease(pos, wait_ms))
    throw error(
        wait < options.pool_wait ? errc::timeout : errc::pool_exhausted,
        "no pooled connection to " + redacted_url + " became free within " +
            std::to_string(wait.count()) + " ms (pool_size " + std::to_string(options.pool_size) +
            (wait < options.pool_wait ? "; the call's deadline: " + what : std::string()) + ")");
  auto s = std::make_unique<session_scope>(self, pos);
  slot& sl = slots[pos];
  // An idle timeout a session grant left (session_lease_state): a connection that idled nearly
  // that long (within 250 ms, or half a shorter timeout) may have been ended by the server, and
  // is opened again.
  const bool idle_limit = sl.opened && sl.state && sl.state->session.idle_ms > 0;
  const std::int64_t idle_ms = idle_limit ? sl.state->session.idle_ms : 0;
  if (idle_limit &&
      std::chrono::steady_clock::now() - sl.state->session.idle_since >=
          std::chrono::milliseconds(idle_ms - std::min<std::int64_t>(250, idle_ms / 2))) {
    sl.opened = false;
    sl.state.reset();
    try {
      s->sql().close();
    } catch (...) {
    }
  }
  if (!sl.opened) {
    if (!armed) {
      open(s->sql(), sl, std::nullopt);  // a failure gives the slot back (~session_scope)
      sl.opened = true;
    } else {
      s = open_bounded(std::move(s), sl, until, what);
    }
  }
  if (armed) s->arm(until, what);
  if (!for_session_lease && sl.state && sl.state->session.idle_ms > 0) reset_idle(*s);
  return s;
}

void database_impl::reset_idle(session_scope& s) {
  try {
    s.run(s.statements().session_idle_reset, {});
    s.state().session.idle_ms = 0;
  } catch (const soci::soci_error&) {
    s.mark_broken();
    throw s.failure("reset the connection's idle timeout");
  } catch (...) {
    s.mark_broken();
    throw;
  }
}

namespace {
// A connect running on a thread of its own, which the caller may stop waiting for.
struct connect_job {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  std::exception_ptr failure;
  std::unique_ptr<session_scope> scope;
};
}  // namespace

// The client libraries take their connect timeout in whole seconds and cannot be interrupted
// while they connect (a frozen server accepts the TCP connection and never answers): the connect
// runs on a thread of its own, and the caller stops waiting at its deadline. The thread then
// finishes by itself and gives the slot back to the pool (opened, when it connected after all).
std::unique_ptr<session_scope> database_impl::open_bounded(std::unique_ptr<session_scope> s,
                                                           slot& sl,
                                                           deadline_clock::time_point until,
                                                           const std::string& what) {
  const auto left = std::max(
      std::chrono::milliseconds(1),
      std::chrono::duration_cast<std::chrono::milliseconds>(until - deadline_clock::now()));
  auto job = std::make_shared<connect_job>();
  job->scope = std::move(s);
  std::thread([this, job, &sl, left] {
    std::exception_ptr failure;
    try {
      open(job->scope->sql(), sl, left);
      sl.opened = true;
    } catch (...) {
      failure = std::current_exception();
    }
    std::unique_ptr<session_scope> give_back;
    {
      std::lock_guard<std::mutex> lk(job->mu);
      job->done = true;
      job->failure = failure;
      if (job->abandoned || failure) give_back = std::move(job->scope);
      job->cv.notify_one();
    }
  }).detach();
  std::unique_lock<std::mutex> lk(job->mu);
  if (!job->cv.wait_until(lk, until, [&] { return job->done; })) {
    job->abandoned = true;
    // The call's own deadline ran out (not a refusal): a timeout, which nothing retries.
    throw error(errc::timeout,
                "could not connect to " + redacted_url + " within the call's deadline, " + what,
                backend, "", 0);
  }
  if (job->failure) std::rethrow_exception(job->failure);
  return std::move(job->scope);
}

void session_scope::arm(deadline_clock::time_point until, std::string what) {
  state().call_deadline = until;
  armed_.arm(until, db_->dia->conn.interrupter_for(sql(), state()), std::move(what));
}

database_impl::database_impl(std::size_t size) : pool(size), slots(size) {}

database_impl::~database_impl() {
  renewer.reset();  // stops the watchdog's threads (no lease is watched any more)
  hub.reset();      // stops the doorbell channel's thread first
  for (auto& sl : slots)
    sl.state.reset();
}

failover_info database_impl::failover() const {
  failover_info f;
  std::lock_guard<std::mutex> lk(failover_mu);
  if (options.failover_window >= reported_window) {
    f.window = options.failover_window;
    if (f.window.count() > 0)
      f.source = "database_options::failover_window (URL key failover_window)";
  } else {
    f.window = reported_window;
    f.source = reported_source;
  }
  f.min_ttl = min_surviving_ttl(f.window);
  return f;
}

void database_impl::check_ttl(const std::string& name, std::chrono::milliseconds ttl,
                              std::chrono::milliseconds margin) {
  using std::chrono::milliseconds;
  // The hot path: a grant on a handle that knows no window (most) takes no lock here.
  if (!options.events || (!window_known.load() && options.failover_window.count() == 0)) return;
  const failover_info f = failover();
  if (f.window.count() == 0) return;
  // The margin as lease_options gives it: its default (ttl/10) scales with the TTL.
  const bool default_margin = margin == std::max(ttl / 10, milliseconds(1));
  const milliseconds least = min_surviving_ttl(f.window, default_margin ? milliseconds(0) : margin);
  if (ttl >= least) return;
  {
    std::lock_guard<std::mutex> lk(failover_mu);
    if (short_ttls_reported.size() >= 1024 ||
        !short_ttls_reported.emplace(ttl.count(), margin.count()).second)
      return;
  }
  const std::string message =
      "lease '" + name + "' has a TTL of " + std::to_string(ttl.count()) +
      " ms: if its holder's node is lost, it expires before it can be renewed through another "
      "node (the cluster takes " +
      std::to_string(f.window.count()) + " ms to go on: " + f.source + "); a TTL of at least " +
      std::to_string(least.count()) + " ms survives that";
  notify([&](listener& l) { l.short_ttl(name, ttl, least, message); });
}

error database_impl::with_hints(error e) const {
  if (e.code() != errc::schema_missing) return e;
  return error(e.kind(),
               std::string(e.what()) + " (dblock's tables are missing in " + redacted_url +
                   ": run `dblock migrate --url URL`" +
                   (tables.prefix.empty() ? "" : " --table-prefix " + tables.prefix) + ")",
               e.backend(), e.sqlstate(), e.native_code());
}

error session_scope::failure(const std::string& what) {
  error e = db_->dia->errors.classify_current(what);
  if (armed_.fired()) {
    // Stopped at the deadline: the connection is closed when given back. A read (reads_only()),
    // or a statement the server cancelled (it did not run), is a timeout; a connection cut off
    // under a call that may have written stays connection_lost, which the paths that wrote
    // resolve (or report in_doubt).
    broken_ = true;
    const errc code =
        e.code() == errc::connection_lost && !reads_only_ ? errc::connection_lost : errc::timeout;
    return error(code, what + ": " + armed_.cause() + " (" + e.what() + ")", e.backend(),
                 e.sqlstate(), e.native_code());
  }
  // A node that is read-only (a standby, a demoted primary) or has left its cluster: reconnect,
  // which reaches the primary of a multi-host URL (connection_failed: nothing was written).
  if (e.code() == errc::connection_lost || e.code() == errc::connection_failed) broken_ = true;
  return db_->with_hints(e);
}

session_scope::~session_scope() {
  auto& sl = db_->slots[pos_];
  // A cancel sent at the deadline may still arrive: never hand this connection on.
  if (armed_.fired()) broken_ = true;
  // The caller closed the connection it borrowed (database::connection): reopen it next time.
  if (sl.opened && sql().get_backend() == nullptr) broken_ = true;
  if (!broken_ && sl.opened) {
    // Never hand the next user a connection inside someone else's transaction (a caller's own
    // database::connection returned mid-transaction): roll it back, or drop the connection.
    try {
      if (db_->dia->conn.in_transaction(sql())) sql() << "ROLLBACK";
    } catch (...) {
      broken_ = true;
    }
  }
  armed_.disarm();  // before the connection closes: the sentinel never touches a closed one
  if (sl.state) sl.state->call_deadline.reset();
  if (sl.state && sl.state->session.idle_ms > 0)
    sl.state->session.idle_since = std::chrono::steady_clock::now();
  if (broken_) {
    // Reconnect on the next lease instead of handing out a dead connection.
    sl.opened = false;
    sl.state.reset();
    try {
      sql().close();
    } catch (...) {
    }
  }
  db_->pool.give_back(pos_);
}

bool end_broken_session(const std::shared_ptr<database_impl>& db, const session_ref& s) {
  const resolution_time grace;  // after the call's deadline: a little time to resolve
  // The helper connection may be broken too (the same network fault, a pooled connection whose
  // loss nobody has noticed yet): a lost helper is replaced by a fresh one, a few times within
  // the time the server gets to end the session.
  if (db->options.pooler == pooler_mode::transaction) return false;  // see session_not_ended()
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(5000);
  for (int attempt = 0; attempt < 4; ++attempt) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    try {
      return with_session(db, "end a broken session", [&](session_scope& other) {
        return db->dia->conn.end_session(other.sql(), s, left);
      });
    } catch (const error& e) {
      if (e.code() != errc::connection_lost) return false;
    }
  }
  return false;
}

std::string session_not_ended(const database_impl& db) {
  if (db.options.pooler == pooler_mode::transaction)
    return "the server session that ran it cannot be identified or ended from behind a "
           "transaction-mode pooler";
  return "the server session could not be confirmed ended";
}

std::string in_doubt_finality(const std::shared_ptr<database_impl>& db, const session_ref& s) {
  if (db->options.pooler == pooler_mode::transaction)
    return "; behind a transaction-mode pooler the server session that ran it cannot be "
           "identified or ended from here, so its COMMIT may still land later (read the data "
           "back after the pooler's query_timeout, or through a direct connection)";
  if (end_broken_session(db, s))
    return "; the server session has been ended, so reading the data back now gives the final "
           "outcome";
  return "; the server session could not be confirmed ended, so its COMMIT may still land "
         "later";
}

error undecided_write(session_scope& s, const session_ref& server, const std::string& what,
                      const error& cause) {
  return error(errc::in_doubt,
               what +
                   ": the connection broke after the write was sent; it may or may not have been "
                   "applied, and the data cannot tell this call's change from another writer's "
                   "(read back to find out; do not retry blindly)" +
                   in_doubt_finality(s.db_ptr(), server) + ": " + cause.what(),
               cause.backend(), cause.sqlstate(), cause.native_code());
}

// ---- write_scope ------------------------------------------------------------------------------
write_scope::write_scope(session_scope& s, write_kind kind, std::string what,
                         std::optional<std::chrono::milliseconds> lock_timeout)
    : s_(s), kind_(kind), what_(std::move(what)) {
  (void)s_.dia().conn.commit_unreplicated(s_.state());  // warnings of earlier statements
  try {
    if (kind_ != write_kind::transaction)
      s_.dia().exec.begin_statement(s_, kind_ == write_kind::unflushed);
    else
      s_.dia().conn.begin(s_.sql(), s_.state(), s_.db().options, lock_timeout);
  } catch (...) {
    // BEGIN may have gone through before a later set-up statement failed: never hand the
    // connection back inside an open transaction.
    error e = s_.failure(what_ + " (begin)");
    try {
      if (s_.dia().conn.in_transaction(s_.sql())) s_.mark_broken();
    } catch (...) {
      s_.mark_broken();
    }
    throw e;
  }
  open_ = true;
}

write_scope::~write_scope() {
  rollback();
}

void write_scope::end() noexcept {
  open_ = false;
  if (kind_ != write_kind::transaction) return;
  try {
    s_.dia().conn.end_transaction(s_.sql(), s_.state(), s_.db().options);
  } catch (...) {
    s_.mark_broken();
  }
}

void write_scope::rollback() noexcept {
  if (!open_) return;
  if (kind_ != write_kind::transaction) {
    s_.dia().exec.rollback_statement(s_);
  } else {
    try {
      s_.sql() << "ROLLBACK";
    } catch (...) {
      s_.mark_broken();  // a broken connection rolls back by itself; do not reuse it
    }
  }
  end();
}

void write_scope::commit() {
  if (!open_) throw error(errc::not_owner, what_ + ": the write has already ended");
  const bool aborted =
      kind_ == write_kind::transaction && (failure_ || s_.dia().conn.transaction_failed(s_.sql()));
  if (aborted) {
    // MySQL would commit the statements before the failure (its lock wait timeout rolls back
    // only the statement): never commit half a transaction.
    std::optional<error> cause = failure_;
    rollback();
    throw error(cause ? cause->kind() : errc::backend_error,
                what_ + ": the transaction had failed and was rolled back, nothing was written" +
                    (cause ? std::string(": ") + cause->what() : std::string()));
  }
  const session_ref server = s_.server();
  // Only the COMMIT's own warnings count (a single statement's: since the write began).
  if (kind_ == write_kind::transaction) (void)s_.dia().conn.commit_unreplicated(s_.state());
  try {
    if (kind_ != write_kind::transaction)
      s_.dia().exec.commit_statement(s_);
    else
      s_.dia().conn.commit(s_.sql(), s_.state());
  } catch (...) {
    error e = s_.failure(what_ + " (COMMIT)");
    if (e.code() == errc::connection_lost) {
      open_ = false;
      throw error(errc::in_doubt,
                  what_ +
                      ": the connection broke after COMMIT was sent; the write may or may not "
                      "have been applied (read back to find out; do not retry blindly)" +
                      in_doubt_finality(s_.db_ptr(), server),
                  e.backend(), e.sqlstate(), e.native_code());
    }
    rollback();
    throw e;
  }
  end();
  if (s_.dia().conn.commit_unreplicated(s_.state())) {
    // Answered with a warning: a COMMIT whose wait for a synchronous standby was cancelled (by
    // the deadline's cancel, or by the server's statement_timeout, which carries the same
    // deadline) is answered so: committed locally, maybe not replicated. Neither success nor
    // failure can be claimed. (Any other warning of the COMMIT is taken the same way.)
    throw error(errc::in_doubt,
                what_ + ": " +
                    (s_.deadline_fired() ? s_.deadline_cause()
                                         : std::string("the server's statement_timeout")) +
                    "; the COMMIT was answered only after it was cancelled: it committed on the "
                    "server it reached but may not have been replicated (a synchronous standby "
                    "that is gone?); read back to find out, do not retry blindly",
                s_.db().backend, "", 0);
  }
}

sql_result write_statement(session_scope& s, write_kind kind, const statement& st,
                           const std::vector<sql_param>& v, const std::string& what) {
  write_scope w(s, kind, what);
  sql_result r = s.run(st, v);
  w.commit();
  return r;
}

namespace {
retry_policy transient_conflict_policy(int max_attempts, std::chrono::milliseconds max_backoff) {
  retry_policy p;
  p.max_attempts = max_attempts;
  p.time_budget = std::chrono::milliseconds(0);
  p.initial_backoff = std::chrono::milliseconds(1);
  p.max_backoff = max_backoff;
  p.retryable = {errc::deadlock, errc::serialization_failure, errc::lock_not_available};
  return p;
}
}  // namespace

const retry_policy& grant_conflict_policy() {
  static const retry_policy p = transient_conflict_policy(9, std::chrono::milliseconds(256));
  return p;
}

const retry_policy& bookkeeping_conflict_policy() {
  static const retry_policy p = transient_conflict_policy(3, std::chrono::milliseconds(8));
  return p;
}

}  // namespace dblock::detail
