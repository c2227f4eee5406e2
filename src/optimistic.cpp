#include "dblock/optimistic.hpp"

#include <soci/soci.h>

#include <algorithm>

#include "database_impl.hpp"
#include "identifier.hpp"
#include "values.hpp"

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

// One read-modify-conditional-write attempt on `sql`.
versioned_result attempt(const detail::database_impl& db, soci::session& sql,
                         const versioned_table& spec, const value& key,
                         const std::function<void(record&)>& mutate) {
  const auto& d = *db.dia;
  const std::string table = d.quote(spec.table);
  const std::string key_col = d.quote(spec.key_column);
  const std::string ver_col = d.quote(spec.version_column);

  std::string select = "SELECT ";
  for (const auto& c : spec.columns)
    select += d.select_value_sql(c) + ", ";
  select +=
      d.select_value_sql(spec.version_column) + " FROM " + table + " WHERE " + key_col + " = :k";
  soci::row row;
  {
    detail::value_binder b;
    soci::statement st(sql);
    b.bind(st, key, "k");
    st.exchange(soci::into(row));
    st.alloc();
    st.prepare(select, soci::details::st_one_time_query);
    st.define_and_bind();
    if (!st.execute(true))
      throw error(errc::not_found, "versioned update of " + spec.table + ": no row with " +
                                       spec.key_column + " = " + detail::describe(key));
  }
  record values;
  for (std::size_t i = 0; i < spec.columns.size(); ++i)
    values[spec.columns[i]] = d.decode_value(row, i);
  value version = d.decode_value(row, spec.columns.size());
  if (!std::holds_alternative<long long>(version))
    throw error(errc::invalid_argument, "versioned update of " + spec.table + ": column " +
                                            spec.version_column + " must be a non-NULL integer");
  const long long old_version = std::get<long long>(version);

  mutate(values);
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

  std::string update = "UPDATE " + table + " SET ";
  detail::value_binder b;
  soci::statement st(sql);
  for (std::size_t i = 0; i < spec.columns.size(); ++i) {
    const std::string param = "v" + std::to_string(i);
    update += d.quote(spec.columns[i]) + " = :" + param + ", ";
    b.bind(st, values[spec.columns[i]], param);
  }
  update += ver_col + " = " + ver_col + " + 1 WHERE " + key_col + " = :k AND " + ver_col +
            " = :old_version";
  b.bind(st, key, "k");
  b.bind(st, old_version, "old_version");
  st.alloc();
  st.prepare(update, soci::details::st_one_time_query);
  st.define_and_bind();
  st.execute(true);
  if (st.get_affected_rows() != 1)
    throw error(errc::version_conflict, "versioned update of " + spec.table + " " +
                                            spec.key_column + " = " + detail::describe(key) +
                                            ": version " + std::to_string(old_version) +
                                            " was changed by someone else");
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

std::uint64_t run_cas(const detail::database_impl& db, soci::session& sql, const cas_update& u) {
  detail::value_binder b;
  soci::statement st(sql);
  for (const auto& p : u.params)
    b.bind(st, p.second, p.first);
  st.alloc();
  st.prepare("UPDATE " + db.dia->quote(u.table) + " SET " + u.set + " WHERE " + u.where,
             soci::details::st_one_time_query);
  st.define_and_bind();
  st.execute(true);
  return static_cast<std::uint64_t>(st.get_affected_rows());
}

}  // namespace

versioned_result versioned_update(const database& db, const versioned_table& spec, const value& key,
                                  const std::function<void(record&)>& mutate,
                                  const retry_policy& policy) {
  validate(spec);
  const auto& impl = db.impl();
  retry_stats stats;
  auto r = detail::unknown_outcome_is_in_doubt("versioned update of " + spec.table, [&] {
    return retry(
        policy,
        [&] {
          return detail::with_session(
              impl, "versioned update of " + spec.table, [&](soci::session& sql) {
                versioned_result out;
                // The conditional UPDATE is the only write; on SQLite
                // run the attempt as one IMMEDIATE transaction so it
                // waits for other writers instead of failing on a stale
                // snapshot.
                impl->dia->atomic_write(sql, [&] { out = attempt(*impl, sql, spec, key, mutate); });
                return out;
              });
        },
        &stats);
  });
  r.stats = stats;
  return r;
}

versioned_result versioned_update(database::connection& conn, const versioned_table& spec,
                                  const value& key, const std::function<void(record&)>& mutate) {
  validate(spec);
  auto& ps = conn.internal();
  try {
    return attempt(*ps.db, ps.sql(), spec, key, mutate);
  } catch (const soci::soci_error&) {
    throw ps.db->failure("versioned update of " + spec.table, &ps);
  }
}

std::uint64_t compare_and_set(const database& db, const cas_update& update,
                              const retry_policy& policy) {
  validate(update);
  const auto& impl = db.impl();
  return detail::unknown_outcome_is_in_doubt("compare_and_set on " + update.table, [&] {
    return retry(policy, [&] {
      return detail::with_session(
          impl, "compare_and_set on " + update.table, [&](soci::session& sql) {
            std::uint64_t rows = 0;
            impl->dia->atomic_write(sql, [&] { rows = run_cas(*impl, sql, update); });
            return rows;
          });
    });
  });
}

std::uint64_t compare_and_set(database::connection& conn, const cas_update& update) {
  validate(update);
  auto& ps = conn.internal();
  try {
    return run_cas(*ps.db, ps.sql(), update);
  } catch (const soci::soci_error&) {
    throw ps.db->failure("compare_and_set on " + update.table, &ps);
  }
}

}  // namespace dblock
