// Fence checks in the caller's own transaction (sql_api.hpp, docs/sql-api.md): the statement of
// the dialect's vocabulary (check_fence_native()), run on the caller's connection.
#include "dblock/sql_api.hpp"

#include <libpq-fe.h>
#include <mysql.h>

#include <soci/soci.h>
#include <memory>

#include "core/identifier.hpp"
#include "storage/session.hpp"

namespace dblock {
namespace {

constexpr const char* sql_lost_state = "DL001";

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
      backend, sql_lost_state, 0);
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
  try {
    if (st.returns_row)  // the check is a SELECT: its row, or none
      session << text, soci::use(name), soci::use(static_cast<long long>(fence)),
          soci::into(got, ind);
    else  // the routine raises DL001, and returns nothing to read
      session << text, soci::use(name), soci::use(static_cast<long long>(fence));
  } catch (const soci::soci_error& e) {
    if (std::string(e.what()).find(sql_lost_state) != std::string::npos ||
        std::string(e.what()).find("is not the current grant") != std::string::npos)
      throw lost(name, fence, d.backend);
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
  const std::string sql = detail::postgresql_dialect()
                              .sql.check_fence_native(detail::make_table_names(table_prefix))
                              .text;
  const std::string f = std::to_string(fence);
  const char* values[2] = {name.c_str(), f.c_str()};
  std::unique_ptr<PGresult, void (*)(PGresult*)> r(
      PQexecParams(conn, sql.c_str(), 2, nullptr, values, nullptr, nullptr, 0), PQclear);
  const auto status = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
  if (status == PGRES_TUPLES_OK) return;
  const char* state = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
  const std::string code = state ? state : "";
  if (code == sql_lost_state) throw lost(name, fence, "postgresql");
  const std::string msg = r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn);
  const bool broken = PQstatus(conn) == CONNECTION_BAD;
  throw error(broken ? errc::connection_lost
                     : (code == "22023" ? errc::invalid_argument : errc::backend_error),
              what_of(name, fence) + ": " + msg, "postgresql", code, 0);
}

void check_fence(st_mysql* conn, const std::string& table_prefix, const std::string& name,
                 std::int64_t fence) {
  validate(name, fence);
  validate_prefix(table_prefix);
  if (!conn) throw error(errc::invalid_argument, "check_fence: no connection");
  std::string escaped(name.size() * 2 + 1, '\0');
  escaped.resize(mysql_real_escape_string(conn, &escaped[0], name.data(), name.size()));
  const std::string sql = "CALL " + table_prefix + "dblock_check_fence('" + escaped + "', " +
                          std::to_string(fence) + ")";
  bool failed = mysql_real_query(conn, sql.c_str(), sql.size()) != 0;
  // A CALL returns its row and then a status: read them all, or the connection is out of sync.
  while (!failed) {
    if (MYSQL_RES* res = mysql_store_result(conn)) mysql_free_result(res);
    const int next = mysql_next_result(conn);
    if (next == -1) return;
    failed = next > 0;
  }
  const std::string code = mysql_sqlstate(conn);
  if (code == sql_lost_state) throw lost(name, fence, "mysql");
  const unsigned no = mysql_errno(conn);
  const bool broken = no == 2006 || no == 2013;  // server gone, lost during the query
  throw error(broken ? errc::connection_lost
                     : (code == "22023" ? errc::invalid_argument : errc::backend_error),
              what_of(name, fence) + ": " + mysql_error(conn), "mysql", code, no);
}

}  // namespace dblock
