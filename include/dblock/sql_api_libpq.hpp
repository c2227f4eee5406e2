#pragma once
/// @file
/// @brief The SQL API's fence check on a libpq connection of the caller's own (docs/sql-api.md).
///
/// In a header of its own, as sql_api_mysql.hpp, so that `dblock/dblock.hpp` and
/// `dblock/sql_api.hpp` name neither C client. It needs no libpq header: `PGconn` is libpq's
/// `struct pg_conn`, declared here.

#include <cstdint>
#include <string>

struct pg_conn;  // libpq's PGconn

namespace dblock {

/**
 * @brief Checks `fence` of lease `name` inside the transaction open on `conn`, a libpq
 *        connection of the caller's own, against dblock's tables with `table_prefix`
 *        (its function `<table_prefix>dblock_check_fence`).
 *
 * A fence that is the current, unexpired grant passes, and the lease row stays locked until the
 * transaction ends, so that no other owner takes the lease before its COMMIT.
 * @throws dblock::error errc::lease_lost when the fence is not the current, unexpired grant
 *         (roll the transaction back); errc::invalid_argument for a bad name, fence or prefix,
 *         or a null `conn`; errc::connection_lost for a broken connection; the other
 *         @ref database_errors "database errors" as the SQLSTATE says.
 */
void check_fence(pg_conn* conn, const std::string& table_prefix, const std::string& name,
                 std::int64_t fence);

}  // namespace dblock
