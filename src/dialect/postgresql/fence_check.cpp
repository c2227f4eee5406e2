// The SQL API's fence check on a caller's own libpq connection (dialect/fence_check.hpp).
#include "dialect/fence_check.hpp"

#include <libpq-fe.h>

#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail {

fence_verdict check_fence_libpq(pg_conn* conn, const table_names& t, const std::string& name,
                                std::int64_t fence, const std::string& what) {
  const auto& d = postgresql_dialect();
  const std::string sql = d.sql.check_fence_native(t).text;
  const std::string f = std::to_string(fence);
  const char* values[2] = {name.c_str(), f.c_str()};
  PGresult* r = PQexecParams(conn, sql.c_str(), 2, nullptr, values, nullptr, nullptr, 0);
  if (r && PQresultStatus(r) == PGRES_TUPLES_OK) {
    PQclear(r);
    return fence_verdict::current;
  }
  const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  if (state && std::string(state) == "DL001") {
    PQclear(r);
    return fence_verdict::refused;
  }
  try {
    pg::fail(conn, r);  // throws as SOCI would, with the SQLSTATE (08006 for a broken connection)
  } catch (const soci::postgresql_soci_error& e) {
    if (e.sqlstate() == "22023")  // the routine's "bad argument"
      throw error(errc::invalid_argument, what + ": " + one_line(e.get_error_message()),
                  "postgresql", "22023", 0);
    throw d.errors.classify_current(what);
  }
}

}  // namespace dblock::detail
