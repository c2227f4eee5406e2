#include "dblock/transaction.hpp"

#include <soci/soci.h>

#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include "core/identifier.hpp"
#include "storage/lock_table.hpp"
#include "storage/values.hpp"
#include "storage/write_scope.hpp"

namespace dblock {

struct transaction::impl {
  database db;
  database::connection conn;
  transaction_options options;
  std::optional<detail::write_scope> write;  // from the first statement until the end
  bool finished = false;

  // Not database::connect(): the transaction sets its own lock timeout at BEGIN, so the session
  // needs no reset to its defaults first (dialect connector::to_session_defaults()). Not armed
  // with a call deadline, as connect()'s: the statements are the caller's, however long they
  // run (an armed connection was cut at call_timeout, and a full pool was errc::timeout).
  impl(const database& d, transaction_options o)
      : db(d),
        conn(detail::access::make_connection(
            detail::access::impl(d)->lease(detail::access::impl(d), false))),
        options(o) {}

  detail::session_scope& scope() { return detail::access::scope(conn); }
  const detail::dialect& dia() { return scope().dia(); }
  soci::session& sql() { return conn.session(); }

  // Classifies the exception being handled; a statement failure dooms the transaction.
  [[noreturn]] void fail(const std::string& what) {
    error e = scope().failure(what);
    if (write) write->failed(e);
    throw e;
  }

  void check_open(const char* what) {
    if (finished)
      throw error(errc::not_owner, std::string(what) + ": the transaction has already ended");
  }

  void begin() {
    if (write) return;
    try {
      write.emplace(scope(), detail::write_kind::transaction, "transaction", options.lock_timeout);
    } catch (...) {
      finished = true;
      throw;
    }
  }

  std::string suffix(lock_wait mode) {
    switch (mode) {
      case lock_wait::nowait:
        return dia().sql.for_update_nowait();
      case lock_wait::skip_locked:
        return dia().sql.for_update_skip_locked();
      case lock_wait::wait:
        break;
    }
    return dia().sql.for_update();
  }

  std::string select_list(const std::string& key_column, const std::vector<std::string>& cols) {
    std::string out = dia().sql.select_value(key_column);
    for (const auto& c : cols) {
      detail::validate_identifier(c, "column name");
      if (c != key_column) out += ", " + dia().sql.select_value(c);
    }
    return out;
  }

  // Runs a row-returning query with bound params and returns the rows as records (prepared once
  // per connection after its first run: detail::fetch_rows()).
  std::vector<record> fetch(const std::string& query, const detail::named_values& params) {
    const detail::fetched_rows f = detail::fetch_rows(scope(), query, params);
    std::vector<record> out;
    out.reserve(f.rows.size());
    for (const auto& row : f.rows) {
      record r;
      for (std::size_t i = 0; i < row.size(); ++i)
        r[f.names[i]] = row[i];
      out.push_back(std::move(r));
    }
    return out;
  }

  void require_unique_key(const std::string& table, const std::string& column) {
    static std::mutex mu;
    // (url, table, column) known to be unique; looked up without building a key
    static std::set<std::tuple<std::string, std::string, std::string>, std::less<>> verified;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (verified.find(std::make_tuple(std::string_view(db.redacted_url()),
                                        std::string_view(table), std::string_view(column))) !=
          verified.end())
        return;
    }
    if (!dia().conn.has_unique_index(sql(), table, column))
      throw error(errc::invalid_argument,
                  "refusing to lock rows of " + table + " by " + column + ": " + column +
                      " has no single-column unique index, so FOR UPDATE could lock (on MySQL) "
                      "every row the lookup scans, up to the whole table. Add a unique index, "
                      "or set row_selector.allow_unindexed to accept that.");
    std::lock_guard<std::mutex> lk(mu);
    verified.emplace(db.redacted_url(), table, column);
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
  impl_->finished = true;
  if (!impl_->write) return;
  impl_->write->commit();  // refuses a failed transaction; in_doubt for a lost COMMIT reply
}

void transaction::rollback() noexcept {
  if (!impl_ || impl_->finished) return;
  impl_->finished = true;
  if (impl_->write) impl_->write->rollback();
}

bool transaction::lock_resource(const std::string& name, lock_wait mode) {
  if (!impl_) throw error(errc::not_owner, "lock_resource: moved-from transaction");
  detail::validate_resource_name(name);
  auto& m = *impl_;
  m.check_open("lock_resource");
  const std::string what = "lock resource '" + name + "'";
  if (!m.write) {
    // Create the row before the transaction starts: the insert's locks (MySQL gap and
    // insert-intention locks, SQLite's write lock) are then not held for the life of the
    // transaction. An existing row is only read, so its holder is never waited for here.
    try {
      detail::lock_table::ensure_row(m.scope(), name, m.options.lock_timeout);
    } catch (...) {
      error e = m.scope().failure(what);
      if (e.code() == errc::lock_not_available && mode != lock_wait::wait) return false;
      throw e;
    }
  }
  m.begin();
  try {
    return detail::lock_table::lock_row(m.scope(), name, mode);
  } catch (const error&) {
    throw;
  } catch (...) {
    m.fail(what);
  }
}

std::vector<record> transaction::lock_rows(const row_selector& rows, lock_wait mode) {
  if (!impl_) throw error(errc::not_owner, "lock_rows: moved-from transaction");
  detail::validate_identifier(rows.table, "table name");
  detail::validate_identifier(rows.key_column, "key column");
  auto& m = *impl_;
  m.check_open("lock_rows");
  m.begin();
  try {
    if (!rows.allow_unindexed) m.require_unique_key(rows.table, rows.key_column);
    std::string q = "SELECT " + m.select_list(rows.key_column, rows.columns) + " FROM " +
                    m.dia().sql.quote(rows.table) + " WHERE " + m.dia().sql.quote(rows.key_column) +
                    " = :key" + m.suffix(mode);
    return m.fetch(q, {{"key", rows.key}});
  } catch (const error&) {
    throw;
  } catch (...) {
    m.fail("lock rows of " + rows.table);
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
                    m.dia().sql.quote(spec.table) + " WHERE " + spec.where + " ORDER BY " +
                    m.dia().sql.quote(spec.key_column) + " LIMIT " + std::to_string(limit) +
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
          if (!t.active()) throw;
          throw detail::access::scope(t.connection()).failure("transaction");
        }
        if (t.active()) t.commit();
      },
      stats);
}

}  // namespace dblock
