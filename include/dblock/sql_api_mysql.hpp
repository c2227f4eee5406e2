#pragma once
/// @file
/// @brief The SQL API's fence check on a MariaDB/MySQL C client connection of the caller's own
///        (docs/sql-api.md).
///
/// In a header of its own, as sql_api_libpq.hpp, so that `dblock/dblock.hpp` and
/// `dblock/sql_api.hpp` name neither C client. It needs no client header: `MYSQL` is the C
/// client's `struct st_mysql`, declared here.

#include <cstdint>
#include <string>

struct st_mysql;  // the MariaDB/MySQL C client's MYSQL

namespace dblock {

/**
 * @brief Checks `fence` of lease `name` inside the transaction open on `conn` (autocommit off),
 *        a MariaDB/MySQL C client connection of the caller's own, against dblock's tables with
 *        `table_prefix` (its procedure `<table_prefix>dblock_check_fence`).
 *
 * A fence that is the current, unexpired grant passes, and the lease row stays locked until the
 * transaction ends. The connection needs CLIENT_MULTI_RESULTS (a CALL returns more than one
 * result; the C client sets it by default); every result of the CALL is read.
 * @throws dblock::error errc::lease_lost when the fence is not the current, unexpired grant
 *         (roll the transaction back); errc::invalid_argument for a bad name, fence or prefix,
 *         or a null `conn`; errc::connection_lost for a broken connection; the other
 *         @ref database_errors "database errors" as the error number says.
 */
void check_fence(st_mysql* conn, const std::string& table_prefix, const std::string& name,
                 std::int64_t fence);

}  // namespace dblock
