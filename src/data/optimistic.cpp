#include "dblock/optimistic.hpp"

#include <soci/soci.h>

#include <algorithm>
#include <optional>

#include "core/identifier.hpp"
#include "storage/session.hpp"
#include "storage/values.hpp"
#include "storage/write_scope.hpp"

namespace dblock {
namespace {

void validate(const versioned_table& spec) {
  detail::validate_identifier(spec.table, "table name");
  detail::validate_identifier(spec.key_column, "key column");
  detail::validate_identifier(spec.version_column, "version column");
  if (spec.columns.empty())
    throw error(errc::invalid_argument, "versioned_table.columns is empty: nothing to update");
  for (const auto& c : spec.columns) {
    detail::validate_identifier(c, "column name");
    if (c == spec.key_column || c == spec.version_column)
      throw error(errc::invalid_argument, "column '" + c +
                                              "' is the key or version column; dblock writes "
                                              "those itself");
  }
}

// Runs an UPDATE of the caller's (detail::caller_statement() when it can); the rows affected.
std::uint64_t run_update(detail::session_scope& s, const std::string& text,
                         const std::vector<std::pair<std::string, value>>& params) {
  std::vector<detail::sql_param> values;
  if (auto st = detail::caller_statement(text, params, values))
    return static_cast<std::uint64_t>(s.run(*st, values).affected);
  detail::value_binder b;
  soci::statement st(s.sql());
  for (const auto& p : params)
    b.bind(st, p.second, p.first);
  st.alloc();
  st.prepare(text, soci::details::st_one_time_query);
  st.define_and_bind();
  st.execute(true);
  return static_cast<std::uint64_t>(st.get_affected_rows());
}

// Reads the columns and the version of the row with `key`; returns the version.
long long read_row(detail::session_scope& s, const versioned_table& spec, const value& key,
                   record& values) {
  const auto& d = s.dia().sql;
  std::string select = "SELECT ";
  for (const auto& c : spec.columns)
    select += d.select_value(c) + ", ";
  select += d.select_value(spec.version_column) + " FROM " + d.quote(spec.table) + " WHERE " +
            d.quote(spec.key_column) + " = :k";
  const detail::fetched_rows f = detail::fetch_rows(s, select, {{"k", key}});
  if (f.rows.empty())
    throw error(errc::not_found, "versioned update of " + spec.table + ": no row with " +
                                     spec.key_column + " = " + detail::describe(key));
  const std::vector<value>& row = f.rows.front();
  for (std::size_t i = 0; i < spec.columns.size(); ++i)
    values[spec.columns[i]] = row[i];
  const value& version = row.at(spec.columns.size());
  if (!std::holds_alternative<long long>(version))
    throw error(errc::invalid_argument, "versioned update of " + spec.table + ": column " +
                                            spec.version_column + " must be a non-NULL integer");
  return std::get<long long>(version);
}

// The mutation may change values only, never the set of columns.
void check_mutation(const versioned_table& spec, const record& values) {
  if (values.size() != spec.columns.size() ||
      !std::all_of(spec.columns.begin(), spec.columns.end(),
                   [&](const std::string& c) { return values.count(c) == 1; }))
    throw error(errc::invalid_argument, "versioned update of " + spec.table +
                                            ": the mutation removed or added columns; set a "
                                            "column to std::monostate{} to write NULL");
  for (const auto& kv : values) {
    if (std::find(spec.columns.begin(), spec.columns.end(), kv.first) == spec.columns.end())
      throw error(errc::invalid_argument, "versioned update of " + spec.table +
                                              ": the mutation set column '" + kv.first +
                                              "', which is not in versioned_table.columns");
  }
}

// The conditional UPDATE; throws version_conflict when the version moved on.
void write_row(detail::session_scope& s, const versioned_table& spec, const value& key,
               const record& values, long long old_version) {
  const auto& d = s.dia().sql;
  const std::string ver_col = d.quote(spec.version_column);
  std::string update = "UPDATE " + d.quote(spec.table) + " SET ";
  std::vector<std::pair<std::string, value>> params;
  for (std::size_t i = 0; i < spec.columns.size(); ++i) {
    const std::string param = "v" + std::to_string(i);
    update += d.quote(spec.columns[i]) + " = :" + param + ", ";
    params.emplace_back(param, values.at(spec.columns[i]));
  }
  update += ver_col + " = " + ver_col + " + 1 WHERE " + d.quote(spec.key_column) + " = :k AND " +
            ver_col + " = :old_version";
  params.emplace_back("k", key);
  params.emplace_back("old_version", old_version);
  if (run_update(s, update, params) != 1)
    throw error(errc::version_conflict, "versioned update of " + spec.table + " " +
                                            spec.key_column + " = " + detail::describe(key) +
                                            ": version " + std::to_string(old_version) +
                                            " was changed by someone else");
}

// The version of the row with `key`, read on another pooled connection (nothing: no row, or no
// integer version); the read is sent again when its own connection breaks.
std::optional<long long> read_version(detail::session_scope& s, const versioned_table& spec,
                                      const value& key, const std::string& what) {
  return detail::read_retried(
      s.db_ptr(), what + " (reading the version back after a lost reply)",
      [&](detail::session_scope& other) -> std::optional<long long> {
        const auto& d = other.dia().sql;
        const detail::fetched_rows f = detail::fetch_rows(
            other,
            "SELECT " + d.select_value(spec.version_column) + " FROM " + d.quote(spec.table) +
                " WHERE " + d.quote(spec.key_column) + " = :k",
            {{"k", key}});
        if (f.rows.empty() || !std::holds_alternative<long long>(f.rows.front().at(0)))
          return std::nullopt;
        return std::get<long long>(f.rows.front().at(0));
      });
}

// The conditional UPDATE's reply was lost. The server session that ran it is ended first
// (nothing it ran can land later); then the row's version decides: still `old_version`, the
// UPDATE did not take effect (every versioned write moves the version on, never back), and
// this returns. Any other version may be this call's write or another writer's, which nothing
// in the row tells apart: in_doubt.
void decide_lost_update(detail::session_scope& s, const detail::session_ref& server,
                        const versioned_table& spec, const value& key, long long old_version,
                        const std::string& what, const error& cause) {
  if (!detail::end_broken_session(s.db_ptr(), server))
    throw error(errc::in_doubt,
                what + ": the connection broke after the UPDATE was sent and " +
                    detail::session_not_ended(s.db()) +
                    ", so it may still take effect (read the row back later; do not retry "
                    "blindly): " +
                    cause.what(),
                cause.backend(), cause.sqlstate(), cause.native_code());
  std::optional<long long> now;
  try {
    now = read_version(s, spec, key, what);
  } catch (const error& e) {
    throw error(errc::in_doubt,
                what +
                    ": the connection broke after the UPDATE was sent, and its row could not "
                    "be read back (" +
                    e.what() +
                    "); the server session has been ended, so a read later gives the "
                    "final outcome (do not retry blindly): " +
                    cause.what(),
                cause.backend(), cause.sqlstate(), cause.native_code());
  }
  if (now && *now == old_version) return;  // not applied: connection_lost, nothing written
  throw error(errc::in_doubt,
              what + ": the connection broke after the UPDATE was sent; the row now " +
                  (now ? "holds version " + std::to_string(*now) : std::string("is gone")) +
                  " (this update would have made it " + std::to_string(old_version + 1) +
                  "), which this call's write and another writer's cannot be told apart by; the "
                  "server session has been ended, so reading the row now gives the final "
                  "outcome (do not retry blindly): " +
                  cause.what(),
              cause.backend(), cause.sqlstate(), cause.native_code());
}

// The conditional UPDATE `update` as one autocommit write, a lost reply decided by the version
// read back (decide_lost_update).
template <class U>
void write_decided(detail::session_scope& s, const versioned_table& spec, const value& key,
                   long long old_version, const std::string& what, U&& update) {
  detail::statement_write(
      s, what,
      [&] {
        update();
        return true;
      },
      [&](const detail::session_ref& server, const error& e) {
        decide_lost_update(s, server, spec, key, old_version, what, e);
      });
}

// One read-modify-conditional-write attempt. `write(update, old_version)` runs the conditional
// UPDATE (in a write scope of its own, or as it is inside the caller's transaction); the read
// and `mutate` come before it, outside any write, so that no lock is held while the caller's
// code runs.
template <class W>
versioned_result attempt(detail::session_scope& s, const versioned_table& spec, const value& key,
                         const std::function<void(record&)>& mutate, W&& write) {
  record values;
  const long long old_version = read_row(s, spec, key, values);
  mutate(values);
  check_mutation(spec, values);
  write([&] { write_row(s, spec, key, values, old_version); }, old_version);
  versioned_result r;
  r.version = old_version + 1;
  r.values = std::move(values);
  return r;
}

void validate(const cas_update& u) {
  detail::validate_identifier(u.table, "table name");
  if (u.set.empty() || u.where.empty())
    throw error(errc::invalid_argument, "compare_and_set: set and where must not be empty");
  for (const auto& p : u.params)
    detail::validate_identifier(p.first, "parameter name");
}

std::uint64_t run_cas(detail::session_scope& s, const cas_update& u) {
  return run_update(
      s, "UPDATE " + s.dia().sql.quote(u.table) + " SET " + u.set + " WHERE " + u.where, u.params);
}

}  // namespace

versioned_result versioned_update(const database& db, const versioned_table& spec, const value& key,
                                  const std::function<void(record&)>& mutate,
                                  const retry_policy& policy) {
  validate(spec);
  const auto& impl = detail::access::impl(db);
  const std::string what = "versioned update of " + spec.table;
  // The read is a plain autocommit read, ended before `mutate` runs; only the conditional UPDATE
  // is a write. So no lock is held while the caller's code runs (docs/safety.md D3): on SQLite the
  // database-wide write lock is the UPDATE's own BEGIN IMMEDIATE, whose fresh snapshot makes a
  // row changed since the read a version conflict (never a stale-snapshot BUSY), as the affected
  // rows do on the servers.
  // A lost reply of the UPDATE is decided by the version read back (decide_lost_update): not
  // applied, it is connection_lost, and like a broken read (nothing written) it is sent again.
  auto one_attempt = [&](detail::session_scope& s) {
    return attempt(s, spec, key, mutate, [&](auto&& update, long long old_version) {
      write_decided(s, spec, key, old_version, what, update);
    });
  };
  retry_stats stats;
  auto r = detail::resend_unwritten([&] {
    return retry(
        policy, [&] { return detail::with_session(impl, what, one_attempt); }, &stats);
  });
  r.stats = stats;
  return r;
}

versioned_result versioned_update(database::connection& conn, const versioned_table& spec,
                                  const value& key, const std::function<void(record&)>& mutate) {
  validate(spec);
  auto& s = detail::access::scope(conn);
  const std::string what = "versioned update of " + spec.table;
  // Inside the caller's transaction a lost connection rolls it back: nothing was written
  // (connection_lost). Outside one the UPDATE commits by itself, and a lost reply is decided by
  // the version read back, as in the form above (but not sent again on the caller's connection).
  const bool autocommit = !s.dia().conn.in_transaction(s.sql());
  try {
    return attempt(s, spec, key, mutate, [&](auto&& update, long long old_version) {
      if (!autocommit) return update();
      write_decided(s, spec, key, old_version, what, update);
    });
  } catch (const soci::soci_error&) {
    throw s.failure(what);
  }
}

std::uint64_t compare_and_set(const database& db, const cas_update& update,
                              const retry_policy& policy) {
  validate(update);
  const auto& impl = detail::access::impl(db);
  const std::string what = "compare_and_set on " + update.table;
  // The caller's SET and WHERE are all there is: a lost reply cannot be decided by reading the
  // row, and is in_doubt (detail::undecided_write).
  return retry(policy, [&] {
    return detail::with_session(impl, what, [&](detail::session_scope& s) {
      return detail::statement_write(s, what, [&] { return run_cas(s, update); });
    });
  });
}

std::uint64_t compare_and_set(database::connection& conn, const cas_update& update) {
  validate(update);
  auto& s = detail::access::scope(conn);
  const std::string what = "compare_and_set on " + update.table;
  // Outside a transaction the statement commits by itself: a lost reply is then in_doubt.
  // Inside one, a lost connection rolls it back, so nothing was written (connection_lost).
  try {
    if (s.dia().conn.in_transaction(s.sql())) return run_cas(s, update);
    return detail::statement_write(s, what, [&] { return run_cas(s, update); });
  } catch (const soci::soci_error&) {
    throw s.failure(what);
  }
}

}  // namespace dblock
