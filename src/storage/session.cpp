// The storage layer's two scopes: a borrowed pooled connection (session_scope) and a write on it
// (write_scope).
#include "storage/session.hpp"
#include "lease/renewer.hpp"
#include "storage/write_scope.hpp"
#include "wake/hub.hpp"

namespace dblock::detail {

// Opens the connection of slot `sl` on `sql`, trying the connect strings from the preferred one
// on (a multi-host URL whose client library takes one host): the first that connects becomes
// the preferred one.
void database_impl::open(soci::session& sql, slot& sl) {
  const std::size_t n = connect_strings.size();
  const std::size_t first = preferred.load() % n;
  std::string reasons;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (first + k) % n;
    try {
      sl.state.reset();
      if (sql.get_backend() != nullptr) sql.close();
      sql.open(dia->conn.factory(), connect_strings[i]);
      sl.state = dia->conn.on_connect(sql, options);
      sl.state->transaction_pooler = options.pooler == pooler_mode::transaction;
      // Behind a transaction-mode pooler a session setting would land on whichever server
      // connection runs it: the isolation level goes into each BEGIN instead.
      auto iso = dia->conn.isolation_sql(options.isolation);
      if (!iso.empty() && !sl.state->transaction_pooler) sql << iso;
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

std::unique_ptr<session_scope> database_impl::lease(const std::shared_ptr<database_impl>& self) {
  std::size_t pos = 0;
  auto wait_ms = static_cast<int>(std::min<long long>(options.pool_wait.count(), 1LL << 30));
  if (!pool.try_lease(pos, wait_ms))
    throw error(errc::timeout, "no pooled connection to " + redacted_url + " became free within " +
                                   std::to_string(options.pool_wait.count()) + " ms (pool_size " +
                                   std::to_string(options.pool_size) + ")");
  auto s = std::make_unique<session_scope>(self, pos);
  slot& sl = slots[pos];
  if (sl.opened) return s;
  open(s->sql(), sl);  // a failure gives the slot back (~session_scope) unopened
  sl.opened = true;
  return s;
}

database_impl::database_impl(std::size_t size) : pool(size), slots(size) {}

database_impl::~database_impl() {
  renewer.reset();  // stops the watchdog's threads (no lease is watched any more)
  hub.reset();      // stops the doorbell channel's thread first
  for (auto& sl : slots)
    sl.state.reset();
}

error database_impl::with_hints(error e) const {
  if (e.code() != errc::schema_missing) return e;
  return error(e.code(),
               std::string(e.what()) + " (dblock's tables are missing in " + redacted_url +
                   ": run `dblock migrate --url URL`" +
                   (tables.prefix.empty() ? "" : " --table-prefix " + tables.prefix) + ")",
               e.backend(), e.sqlstate(), e.native_code());
}

error session_scope::failure(const std::string& what) {
  error e = db_->dia->errors.classify_current(what);
  if (e.code() == errc::connection_lost) broken_ = true;
  return db_->with_hints(e);
}

session_scope::~session_scope() {
  auto& sl = db_->slots[pos_];
  if (!broken_ && sl.opened) {
    // Never hand the next user a connection inside someone else's transaction (a caller's own
    // database::connection returned mid-transaction): roll it back, or drop the connection.
    try {
      if (db_->dia->conn.in_transaction(sql())) sql() << "ROLLBACK";
    } catch (...) {
      broken_ = true;
    }
  }
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

// ---- write_scope ------------------------------------------------------------------------------
write_scope::write_scope(session_scope& s, write_kind kind, std::string what,
                         std::optional<std::chrono::milliseconds> lock_timeout)
    : s_(s), kind_(kind), what_(std::move(what)) {
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
    s_.dia().conn.end_transaction(s_.sql(), s_.db().options);
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
    throw error(cause ? cause->code() : errc::backend_error,
                what_ + ": the transaction had failed and was rolled back, nothing was written" +
                    (cause ? std::string(": ") + cause->what() : std::string()));
  }
  const session_ref server = s_.server();
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
}

sql_result write_statement(session_scope& s, write_kind kind, const statement& st,
                           const std::vector<sql_param>& v, const std::string& what) {
  write_scope w(s, kind, what);
  sql_result r = s.run(st, v);
  w.commit();
  return r;
}

retry_policy transient_conflict_policy(int max_attempts, std::chrono::milliseconds max_backoff) {
  retry_policy p;
  p.max_attempts = max_attempts;
  p.time_budget = std::chrono::milliseconds(0);
  p.initial_backoff = std::chrono::milliseconds(1);
  p.max_backoff = max_backoff;
  p.retryable = {errc::deadlock, errc::serialization_failure, errc::lock_not_available};
  return p;
}

}  // namespace dblock::detail
