#pragma once
/// @file
/// @brief The lock protocol in the database itself (docs/sql-api.md): fence checks inside the
///        caller's own transaction, on the caller's own connection.
///
/// `dblock migrate` installs the SQL API with the table prefix: on PostgreSQL the functions
/// `<prefix>dblock_acquire(name, owner, ttl_ms)`, `<prefix>dblock_renew(name, owner, fence,
/// ttl_ms)`, `<prefix>dblock_release(name, owner, fence)` and `<prefix>dblock_check_fence(name,
/// fence)`; on MySQL and MariaDB the procedures of the same names (CALL). SQLite has no stored
/// routines: the statements to run instead are in docs/sql-api.md. Leases taken through them are
/// the library's own: same rows, fences, TTLs and database clock.
///
/// The functions below check a fence inside a transaction the caller runs on a connection of
/// its own (a SOCI session here; libpq in sql_api_libpq.hpp, the MariaDB/MySQL C client in
/// sql_api_mysql.hpp, each in a header of its own so that this one names neither C client), or
/// give the statement to run with any other client. A fence that is the current, unexpired grant of
/// the lease passes, and the lease row stays locked until that transaction ends, so no other owner
/// can take the lease before its COMMIT: the rule of lease_guard::fenced(). Otherwise they throw
/// errc::lease_lost, and the caller rolls its transaction back.

#include <cstdint>
#include <string>
#include <vector>

#include "dblock/database.hpp"

namespace soci {
class session;
}

namespace dblock {

/// A statement for any client: its text with the backend's own placeholders ($1, $2 on
/// PostgreSQL; ? on MySQL/MariaDB and SQLite) and the values to bind, in order.
struct sql_statement {
  std::string text;                 ///< the SQL, with the backend's own placeholders
  std::vector<std::string> values;  ///< the values to bind, in placeholder order, as text
};

/**
 * @brief The statement that checks `fence` of lease `name` in the caller's transaction, for the
 *        backend and table prefix of `db`.
 *
 * PostgreSQL: `SELECT <prefix>dblock_check_fence($1, $2)`, which raises SQLSTATE DL001 when the
 * fence is not the current grant. MySQL/MariaDB: `CALL <prefix>dblock_check_fence(?, ?)`, which
 * signals SQLSTATE DL001 likewise (run it with autocommit off: the row lock lasts until the
 * COMMIT). SQLite: a SELECT that returns the fence, or no row when it is not the current grant (run
 * it in a transaction begun with BEGIN IMMEDIATE, which holds the database's write lock).
 * @throws dblock::error errc::invalid_argument for a bad name or a fence below 1.
 */
sql_statement check_fence_statement(const database& db, const std::string& name,
                                    std::int64_t fence);

/**
 * @brief Checks `fence` of lease `name` inside the transaction open on `session`, a SOCI session
 *        of the caller's own on the database of `db` (same backend and table prefix).
 * @throws dblock::error errc::lease_lost when the fence is not the current, unexpired grant
 *         (roll the transaction back); errc::invalid_argument for a bad name or fence; the
 *         @ref database_errors "database errors" otherwise.
 */
void check_fence(soci::session& session, const database& db, const std::string& name,
                 std::int64_t fence);

}  // namespace dblock
