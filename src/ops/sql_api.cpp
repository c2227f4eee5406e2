// Fence checks in the caller's own transaction (sql_api.hpp, sql_api_libpq.hpp,
// sql_api_mysql.hpp, docs/sql-api.md): the statement of the dialect's vocabulary
// (check_fence_native()), run on the caller's connection; the C clients' calls are the
// dialects' (dialect/fence_check.hpp).
#include "dblock/sql_api.hpp"

#include <soci/soci.h>

#include "core/identifier.hpp"
#include "dblock/sql_api_libpq.hpp"
#include "dblock/sql_api_mysql.hpp"
#include "dialect/fence_check.hpp"
#include "storage/session.hpp"

namespace dblock {
namespace {

std::string what_of(const std::string& name, std::int64_t fence) {
  return "check fence " + std::to_string(fence) + " of lease '" + detail::printable(name) + "'";
}

void validate(const std::string& name, std::int64_t fence) {
  detail::validate_resource_name(name);
  if (fence < 1) throw error(errc::invalid_argument, "check_fence: a fence is positive");
}

error lost(const std::string& name, std::int64_t fence, const std::string& backend) {
  return error(
      errc::lease_lost,
      what_of(name, fence) + ": not the current grant (expired, released or taken over); roll back",
      backend, "DL001", 0);
}

// The table prefix as the SQL API names its routines: an identifier (or empty).
void validate_prefix(const std::string& prefix) {
  if (!prefix.empty()) detail::validate_identifier(prefix, "table prefix");
}

}  // namespace

sql_statement check_fence_statement(const database& db, const std::string& name,
                                    std::int64_t fence) {
  validate(name, fence);
  const auto& d = *detail::access::impl(db);
  return {d.dia->sql.check_fence_native(d.tables).text, {name, std::to_string(fence)}};
}

void check_fence(soci::session& session, const database& db, const std::string& name,
                 std::int64_t fence) {
  validate(name, fence);
  const auto& d = *detail::access::impl(db);
  const auto st = d.dia->sql.check_fence_native(d.tables);
  // SOCI binds by name: $n and ? become :p1, :p2.
  std::string text;
  int n = 0;
  for (std::size_t i = 0; i < st.text.size(); ++i) {
    const char c = st.text[i];
    if (c == '?' ||
        (c == '$' && i + 1 < st.text.size() && st.text[i + 1] >= '1' && st.text[i + 1] <= '9')) {
      text += ":p" + std::to_string(++n);
      if (c == '$') ++i;
    } else {
      text += c;
    }
  }
  long long got = 0;
  soci::indicator ind = soci::i_null;
  // soci::use binds a reference that the statement reads at the end of the full expression,
  // after a temporary (a cast) is gone: a named value.
  const long long bound_fence = fence;
  try {
    if (st.returns_row)  // the check is a SELECT: its row, or none
      session << text, soci::use(name), soci::use(bound_fence), soci::into(got, ind);
    else  // the routine raises DL001, and returns nothing to read
      session << text, soci::use(name), soci::use(bound_fence);
  } catch (const soci::soci_error& e) {
    if (detail::is_fence_refusal(e.what())) throw lost(name, fence, d.backend);
    try {
      throw;
    } catch (...) {
      throw d.dia->errors.classify_current(what_of(name, fence));
    }
  }
  // A check that returns the row refuses with none (got stays NULL); a routine raised it.
  if (st.returns_row && (ind == soci::i_null || got != fence)) throw lost(name, fence, d.backend);
}

void check_fence(pg_conn* conn, const std::string& table_prefix, const std::string& name,
                 std::int64_t fence) {
  validate(name, fence);
  validate_prefix(table_prefix);
  if (!conn) throw error(errc::invalid_argument, "check_fence: no connection");
  if (detail::check_fence_libpq(conn, detail::make_table_names(table_prefix), name, fence,
                                what_of(name, fence)) == detail::fence_verdict::refused)
    throw lost(name, fence, "postgresql");
}

void check_fence(st_mysql* conn, const std::string& table_prefix, const std::string& name,
                 std::int64_t fence) {
  validate(name, fence);
  validate_prefix(table_prefix);
  if (!conn) throw error(errc::invalid_argument, "check_fence: no connection");
  if (detail::check_fence_mysql_client(conn, detail::make_table_names(table_prefix), name, fence,
                                       what_of(name, fence)) == detail::fence_verdict::refused)
    throw lost(name, fence, "mysql");
}

}  // namespace dblock
