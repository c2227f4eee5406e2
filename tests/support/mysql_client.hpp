// A MariaDB/MySQL connection of a test's own, as a client outside dblock opens and uses it (the
// C client): for the SQL API's procedures, whose CALL returns a row and then a status.
#pragma once

#include <mysql.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "core/url.hpp"

namespace dblock::test {

/// A server error of mysql_run(): the message, and the server's error number in `number`.
struct mysql_failure : std::runtime_error {
  mysql_failure(unsigned n, const std::string& what) : std::runtime_error(what), number(n) {}
  unsigned number;
};

/// Connects to the first host of a mysql:// URL with client `flags` (e.g. CLIENT_MULTI_RESULTS).
inline MYSQL* connect_mysql(const std::string& url, unsigned long flags) {
  const auto u = detail::parse_url(url);
  MYSQL* m = mysql_init(nullptr);
  if (!mysql_real_connect(m, u.host.c_str(), u.user.c_str(),
                          u.password ? u.password->c_str() : nullptr, u.path.c_str(),
                          static_cast<unsigned>(u.port.value_or(0)), nullptr, flags)) {
    const std::string msg = mysql_error(m);
    mysql_close(m);
    throw std::runtime_error("cannot connect to " + u.host + ": " + msg);
  }
  return m;
}

/// Runs `sql` (a statement or a CALL), reading every result set and the status after them: the
/// first value of the first row, if any. Throws mysql_failure.
inline std::optional<long long> mysql_run(MYSQL* m, const std::string& sql) {
  if (mysql_real_query(m, sql.c_str(), sql.size()) != 0)
    throw mysql_failure(mysql_errno(m), mysql_error(m));
  std::optional<long long> out;
  do {
    if (MYSQL_RES* res = mysql_store_result(m)) {
      if (MYSQL_ROW row = mysql_fetch_row(res))
        if (row[0] && !out) out = std::stoll(row[0]);
      mysql_free_result(res);
    }
  } while (mysql_next_result(m) == 0);
  if (mysql_errno(m)) throw mysql_failure(mysql_errno(m), mysql_error(m));
  return out;
}

}  // namespace dblock::test
