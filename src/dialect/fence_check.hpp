// Internal: the SQL API's fence check run on a caller's own connection
// (include/dblock/sql_api*.hpp, docs/sql-api.md). The C-client calls, the statement texts and the
// reading of their errors are the dialects'; src/ops/sql_api.cpp validates the arguments and turns
// a refusal into errc::lease_lost.
#pragma once

#include <cstdint>
#include <string>

#include "dialect/dialect.hpp"

struct pg_conn;   // libpq's PGconn
struct st_mysql;  // the MariaDB/MySQL C client's MYSQL

namespace dblock::detail {

/// What a fence check found, when it ran.
enum class fence_verdict {
  current,  ///< the fence is the current, unexpired grant; its row stays locked until COMMIT
  refused,  ///< the routine refused it (SQLSTATE DL001, or no row where the check is a SELECT)
};

/// Whether the text of a failed statement is the SQL API routine's refusal (SQLSTATE DL001, or
/// its message): the SOCI path, where only the error's text is at hand on every backend.
bool is_fence_refusal(const std::string& error_text);

/// Runs `<prefix>dblock_check_fence(name, fence)` on `conn`, a libpq connection of the caller's
/// in a transaction. Throws dblock::error prefixed with `what` for any other outcome:
/// errc::invalid_argument for the routine's SQLSTATE 22023, else as the PostgreSQL classifier
/// reads the SQLSTATE (a broken connection: errc::connection_lost).
fence_verdict check_fence_libpq(pg_conn* conn, const table_names& t, const std::string& name,
                                std::int64_t fence, const std::string& what);

/// The same on a MariaDB/MySQL C client connection (autocommit off): `CALL
/// <prefix>dblock_check_fence(...)` with the name escaped for the connection's character set,
/// every result of the CALL read. Errors as check_fence_libpq(), by errno as the MySQL classifier
/// reads it.
fence_verdict check_fence_mysql_client(st_mysql* conn, const table_names& t,
                                       const std::string& name, std::int64_t fence,
                                       const std::string& what);

}  // namespace dblock::detail
