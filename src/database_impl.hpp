// Internal: the shared state behind dblock::database, and the pooled-session helper that every
// component uses to run SQL with one error model.
#pragma once

#include <soci/soci.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dialect/dialect.hpp"

namespace dblock::detail {

struct database_impl {
  std::string backend;
  std::string redacted_url;
  std::string connect_string;  // holds the password: never printed
  database_options options;
  const dialect* dia = nullptr;
  table_names tables;
  soci::connection_pool pool;
  std::vector<char> opened;  // per slot; only the slot's lessee touches its entry

  database_impl(std::size_t size) : pool(size), opened(size, 0) {}
  /// Drops the per-connection states before the pool closes its sessions.
  ~database_impl();

  /// Borrows a connected session (see database::connect()).
  std::unique_ptr<pooled_session> lease(const std::shared_ptr<database_impl>& self);

  /// Calls `f(listener&)` when a listener is attached; never throws.
  template <class F>
  void notify(F&& f) const noexcept {
    if (!options.events) return;
    try {
      f(*options.events);
    } catch (...) {
    }
  }

  /// Classifies the exception being handled; marks `s` broken on a lost connection and adds
  /// the `dblock migrate` hint when the schema is missing.
  error failure(const std::string& what, pooled_session* s) const;
};

struct pooled_session {
  std::shared_ptr<database_impl> db;
  std::size_t pos = 0;
  bool broken = false;

  pooled_session(std::shared_ptr<database_impl> d, std::size_t p) : db(std::move(d)), pos(p) {}
  pooled_session(const pooled_session&) = delete;
  pooled_session& operator=(const pooled_session&) = delete;
  ~pooled_session();
  soci::session& sql() { return db->pool.at(pos); }
};

/// Ends the server session behind a broken connection (dialect::end_session) from another pooled
/// connection, and waits until it is gone: then nothing it was still executing (a statement or
/// a COMMIT whose reply was lost) can take effect any more, and reading the data back tells the
/// final outcome. False when that could not be confirmed.
bool end_broken_session(const std::shared_ptr<database_impl>& db, const session_ref& s);

/// For an in_doubt message: ends the broken session (end_broken_session) and says whether the
/// outcome is final now.
std::string in_doubt_finality(const std::shared_ptr<database_impl>& db, const session_ref& s);

/// Runs f() and reports a lost connection as errc::in_doubt: for a write sent in autocommit
/// mode, a broken connection leaves the outcome unknown, and retrying could apply it twice.
template <class F>
auto unknown_outcome_is_in_doubt(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const error& e) {
    if (e.code() != errc::connection_lost) throw;
    throw error(errc::in_doubt,
                what +
                    ": the connection broke; the write may or may not have been applied "
                    "(read the row to find out, do not retry blindly): " +
                    e.what(),
                e.backend(), e.sqlstate(), e.native_code());
  }
}

/// Runs f(session) on a pooled connection, translating database failures (SOCI's exceptions)
/// into dblock::error. dblock::error and the exceptions of callers' callbacks pass unchanged.
template <class F>
auto with_session(const std::shared_ptr<database_impl>& db, const std::string& what, F&& f) {
  auto s = db->lease(db);
  try {
    return f(s->sql());
  } catch (const soci::soci_error&) {
    throw db->failure(what, s.get());
  }
}

}  // namespace dblock::detail
