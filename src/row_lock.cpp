#include "dblock/row_lock.hpp"

#include <soci/soci.h>

#include <mutex>
#include <optional>
#include <set>

#include "database_impl.hpp"
#include "identifier.hpp"
#include "values.hpp"

namespace dblock {

struct transaction::impl {
  database db;
  database::connection conn;
  transaction_options options;
  bool begun = false;
  bool finished = false;
  std::optional<error> last_failure;  // the latest error raised inside this transaction

  impl(const database& d, transaction_options o) : db(d), conn(d.connect()), options(o) {}

  detail::database_impl& dbi() { return *db.impl(); }
  const detail::dialect& dia() { return *db.impl()->dia; }
  soci::session& sql() { return conn.session(); }

  [[noreturn]] void fail(const std::string& what) {
    error e = dbi().failure(what, &conn.internal());
    last_failure = e;
    throw e;
  }

  void check_open(const char* what) {
    if (finished)
      throw error(errc::not_owner, std::string(what) + ": the transaction has already ended");
  }

  void begin() {
    if (begun) return;
    try {
      dia().begin_transaction(sql(), options.lock_timeout);
    } catch (...) {
      // BEGIN may have gone through before a later set-up statement failed: never hand the
      // connection back inside an open transaction.
      conn.discard();
      finished = true;
      fail("begin transaction");
    }
    begun = true;
  }

  void end() {
    finished = true;
    try {
      dia().end_transaction(sql(), dbi().options);
    } catch (...) {
      conn.discard();
    }
  }

  std::string suffix(lock_wait mode) {
    switch (mode) {
      case lock_wait::nowait:
        return dia().for_update_nowait_sql();
      case lock_wait::skip_locked:
        return dia().for_update_skip_locked_sql();
      case lock_wait::wait:
        break;
    }
    return dia().for_update_sql();
  }

  std::string select_list(const std::string& key_column, const std::vector<std::string>& cols) {
    std::string out = dia().select_value_sql(key_column);
    for (const auto& c : cols) {
      detail::validate_identifier(c, "column name");
      if (c != key_column) out += ", " + dia().select_value_sql(c);
    }
    return out;
  }

  // Runs a row-returning query with bound params and returns the rows as records.
  std::vector<record> fetch(const std::string& query,
                            const std::vector<std::pair<std::string, value>>& params) {
    std::vector<record> out;
    detail::value_binder b;
    soci::row row;
    soci::statement st(sql());
    for (const auto& p : params)
      b.bind(st, p.second, p.first);
    st.exchange(soci::into(row));
    st.alloc();
    st.prepare(query, soci::details::st_one_time_query);
    st.define_and_bind();
    if (st.execute(true)) {
      do {
        record r;
        for (std::size_t i = 0; i < row.size(); ++i)
          r[row.get_properties(i).get_name()] = dia().decode_value(row, i);
        out.push_back(std::move(r));
      } while (st.fetch());
    }
    return out;
  }

  bool select_lock_row(const std::string& name, lock_wait mode) {
    int one = 0;
    soci::indicator ind = soci::i_null;
    sql() << "SELECT 1 FROM " << dbi().tables.lock << " WHERE resource_name = :name"
          << suffix(mode),
        soci::use(name, "name"), soci::into(one, ind);
    return sql().got_data() && ind == soci::i_ok;
  }

  void require_unique_key(const std::string& table, const std::string& column) {
    static std::mutex mu;
    static std::set<std::string> verified;  // "<url>|table|column" known to be unique
    const std::string key = dbi().redacted_url + "|" + table + "|" + column;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (verified.count(key)) return;
    }
    if (!dia().has_unique_index(sql(), table, column))
      throw error(errc::invalid_argument,
                  "refusing to lock rows of " + table + " by " + column + ": " + column +
                      " has no single-column unique index, so FOR UPDATE could lock (on MySQL) "
                      "every row the lookup scans, up to the whole table. Add a unique index, "
                      "or set row_selector.allow_unindexed to accept that.");
    std::lock_guard<std::mutex> lk(mu);
    verified.insert(key);
  }
};

transaction::transaction(const database& db, transaction_options options)
    : impl_(std::make_unique<impl>(db, options)) {
  if (options.lock_timeout < std::chrono::milliseconds(0))
    throw error(errc::invalid_argument, "transaction lock_timeout must not be negative");
}

transaction::~transaction() {
  rollback();
}
transaction::transaction(transaction&&) noexcept = default;
transaction& transaction::operator=(transaction&& other) noexcept {
  if (this != &other) {
    rollback();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

soci::session& transaction::session() {
  if (!impl_) throw error(errc::not_owner, "session: moved-from transaction");
  impl_->check_open("session");
  impl_->begin();
  return impl_->sql();
}

database::connection& transaction::connection() {
  if (!impl_) throw error(errc::not_owner, "connection: moved-from transaction");
  impl_->check_open("connection");
  impl_->begin();
  return impl_->conn;
}

bool transaction::active() const noexcept {
  return impl_ && !impl_->finished;
}

void transaction::commit() {
  if (!impl_) throw error(errc::not_owner, "commit: moved-from transaction");
  impl_->check_open("commit");
  if (!impl_->begun) {
    impl_->end();
    return;
  }
  if (impl_->last_failure || impl_->dia().transaction_failed(impl_->sql())) {
    // A statement of this transaction failed (dblock saw it, or PostgreSQL has aborted the
    // transaction and would answer COMMIT with a silent ROLLBACK). MySQL would commit the
    // statements before the failure (its lock wait timeout rolls back only the statement):
    // never commit half a transaction; roll back and report.
    std::optional<error> cause = impl_->last_failure;
    rollback();
    std::string why = cause ? std::string(": ") + cause->what() : std::string();
    throw error(
        cause ? cause->code() : errc::backend_error,
        "commit: the transaction had failed and was rolled back, nothing was written" + why);
  }
  const detail::session_ref sess = detail::session_of(impl_->sql());
  try {
    impl_->sql() << "COMMIT";
  } catch (...) {
    error e = impl_->dbi().failure("commit", &impl_->conn.internal());
    impl_->finished = true;
    if (e.code() == errc::connection_lost)
      throw error(errc::in_doubt,
                  "commit: the connection broke after COMMIT was sent; the transaction may or "
                  "may not have been applied (read back to find out; do not retry blindly)" +
                      detail::in_doubt_finality(impl_->conn.internal().db, sess),
                  e.backend(), e.sqlstate(), e.native_code());
    try {
      impl_->sql() << "ROLLBACK";
    } catch (...) {
      impl_->conn.discard();
    }
    impl_->end();
    throw e;
  }
  impl_->end();
}

void transaction::rollback() noexcept {
  if (!impl_ || impl_->finished) return;
  if (impl_->begun) {
    try {
      impl_->sql() << "ROLLBACK";
    } catch (...) {
      // A broken connection rolls back by itself; do not reuse it.
      impl_->conn.discard();
    }
  }
  impl_->end();
}

bool transaction::lock_resource(const std::string& name, lock_wait mode) {
  if (!impl_) throw error(errc::not_owner, "lock_resource: moved-from transaction");
  detail::validate_resource_name(name);
  auto& m = *impl_;
  m.check_open("lock_resource");
  const std::string what = "lock resource '" + name + "'";
  const auto& tables = m.dbi().tables;
  if (!m.begun) {
    // Create the row before the transaction starts: the insert's locks (MySQL gap and
    // insert-intention locks, SQLite's write lock) are then not held for the life of the
    // transaction. An existing row is only read, so its holder is never waited for here.
    try {
      m.dia().ensure_lock_row(m.sql(), tables, name, m.options.lock_timeout);
    } catch (...) {
      error e = m.dbi().failure(what, &m.conn.internal());
      if (e.code() == errc::lock_not_available && mode != lock_wait::wait) return false;
      throw e;
    }
  }
  m.begin();
  // NOWAIT is done as SKIP LOCKED plus an existence check: the answer is the same, and no
  // error is raised, which on PostgreSQL would abort the whole transaction.
  const lock_wait how = mode == lock_wait::wait ? lock_wait::wait : lock_wait::skip_locked;
  try {
    for (int round = 0; round < 2; ++round) {
      if (m.select_lock_row(name, how)) return true;
      if (how != lock_wait::wait && m.dia().lock_row_exists(m.sql(), tables, name)) return false;
      // Removed (by a reaper) since it was created: create it inside the transaction.
      m.dia().insert_lock_row(m.sql(), tables, name);
    }
  } catch (...) {
    m.fail(what);
  }
  throw error(errc::backend_error, what + ": the lock row keeps disappearing");
}

std::vector<record> transaction::lock_rows(const row_selector& rows, lock_wait mode) {
  if (!impl_) throw error(errc::not_owner, "lock_rows: moved-from transaction");
  detail::validate_identifier(rows.table, "table name");
  detail::validate_identifier(rows.key_column, "key column");
  auto& m = *impl_;
  m.check_open("lock_rows");
  const std::string what = "lock rows of " + rows.table;
  m.begin();
  try {
    if (!rows.allow_unindexed) m.require_unique_key(rows.table, rows.key_column);
    std::string q = "SELECT " + m.select_list(rows.key_column, rows.columns) + " FROM " +
                    m.dia().quote(rows.table) + " WHERE " + m.dia().quote(rows.key_column) +
                    " = :key" + m.suffix(mode);
    return m.fetch(q, {{"key", rows.key}});
  } catch (const error&) {
    throw;
  } catch (...) {
    m.fail(what);
  }
}

std::vector<record> transaction::claim(const claim_spec& spec, std::size_t limit) {
  if (!impl_) throw error(errc::not_owner, "claim: moved-from transaction");
  detail::validate_identifier(spec.table, "table name");
  detail::validate_identifier(spec.key_column, "key column");
  if (limit == 0 || limit > 100000)
    throw error(errc::invalid_argument, "claim: limit must be 1..100000");
  if (spec.where.empty()) throw error(errc::invalid_argument, "claim: empty where");
  for (const auto& p : spec.params)
    detail::validate_identifier(p.first, "parameter name");
  auto& m = *impl_;
  m.check_open("claim");
  m.begin();
  try {
    std::string q = "SELECT " + m.select_list(spec.key_column, spec.columns) + " FROM " +
                    m.dia().quote(spec.table) + " WHERE " + spec.where + " ORDER BY " +
                    m.dia().quote(spec.key_column) + " LIMIT " + std::to_string(limit) +
                    m.suffix(lock_wait::skip_locked);
    return m.fetch(q, spec.params);
  } catch (const error&) {
    throw;
  } catch (...) {
    m.fail("claim rows of " + spec.table);
  }
}

std::optional<transaction> try_lock_resource(const database& db, const std::string& name) {
  transaction_options o;
  o.lock_timeout = std::chrono::milliseconds(0);
  transaction t(db, o);
  try {
    if (t.lock_resource(name, lock_wait::nowait)) return std::optional<transaction>(std::move(t));
  } catch (const error& e) {
    // SQLite: the write lock itself is taken at BEGIN IMMEDIATE, without waiting.
    if (e.code() == errc::lock_not_available) return std::nullopt;
    throw;
  }
  return std::nullopt;
}

transaction lock_resource(const database& db, const std::string& name,
                          std::chrono::milliseconds timeout) {
  transaction_options o;
  o.lock_timeout = timeout;
  transaction t(db, o);
  t.lock_resource(name, lock_wait::wait);
  return t;
}

retry_policy transaction_retry_policy() {
  retry_policy p;
  p.max_attempts = 5;
  p.time_budget = std::chrono::seconds(10);
  p.initial_backoff = std::chrono::milliseconds(10);
  p.max_backoff = std::chrono::milliseconds(200);
  return p;
}

void run_transaction_void(const database& db, const std::function<void(transaction&)>& body,
                          const retry_policy& policy, transaction_options options,
                          retry_stats* stats) {
  run_with_retry(
      policy,
      [&] {
        transaction t(db, options);  // a failed attempt is rolled back whole by ~transaction
        try {
          body(t);
        } catch (const soci::soci_error&) {
          // The caller's own statements on t.session(): classify them like dblock's, so that a
          // deadlock or lock wait timeout there is retried too.
          throw db.impl()->failure("transaction",
                                   t.active() ? &t.connection().internal() : nullptr);
        }
        if (t.active()) t.commit();
      },
      stats);
}

}  // namespace dblock
