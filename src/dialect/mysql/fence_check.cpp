// The SQL API's fence check on a caller's own MariaDB/MySQL C client connection
// (dialect/fence_check.hpp).
#include "dialect/fence_check.hpp"

#include <mysql.h>

#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail {

fence_verdict check_fence_mysql_client(st_mysql* conn, const table_names& t,
                                       const std::string& name, std::int64_t fence,
                                       const std::string& what) {
  // The dialect's statement, its two placeholders filled in: the C client's text protocol has no
  // parameters for a CALL, so the name goes in quoted and escaped for the connection's charset.
  std::string escaped(name.size() * 2 + 1, '\0');
  escaped.resize(mysql_real_escape_string(conn, &escaped[0], name.data(), name.size()));
  const std::string values[2] = {"'" + escaped + "'", std::to_string(fence)};
  const std::string text = mysql_dialect().sql.check_fence_native(t).text;
  std::string sql;
  int n = 0;
  for (const char c : text) {
    if (c == '?' && n < 2)
      sql += values[n++];
    else
      sql += c;
  }
  bool failed = mysql_real_query(conn, sql.c_str(), sql.size()) != 0;
  // A CALL returns its row and then a status: read them all, or the connection is out of sync.
  while (!failed) {
    if (MYSQL_RES* res = mysql_store_result(conn)) mysql_free_result(res);
    const int next = mysql_next_result(conn);
    if (next == -1) return fence_verdict::current;
    failed = next > 0;
  }
  const std::string state = mysql_sqlstate(conn);
  if (state == "DL001") return fence_verdict::refused;
  const unsigned no = mysql_errno(conn);
  const errc code = state == "22023" ? errc::invalid_argument : my::errc_of(no);
  throw error(code, what + ": " + one_line(mysql_error(conn)), "mysql", state,
              static_cast<long long>(no));
}

}  // namespace dblock::detail
