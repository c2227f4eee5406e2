// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <string>
#include <vector>

#include "dblock/database.hpp"

/// @file
/// @brief Schema migrations of dblock's own tables: migrate(), schema_up_to_date().

namespace dblock {

/// One migration file shipped with dblock, and whether the database has it.
/// Thread-safety: a plain value.
struct migration_info {
  int version = 0;       ///< NNNN from the file name
  std::string name;      ///< file name, e.g. "0001_resource_lock.sql"
  std::string checksum;  ///< 16 hex digits (FNV-1a 64 of the file text)
  bool applied = false;  ///< recorded in the migrations table (before or by this call)
};

/// Options of migrate().
/// Thread-safety: a plain value.
struct migrate_options {
  bool dry_run = false;  ///< report what would be applied, change nothing
};

/// What migrate() found and did.
/// Thread-safety: a plain value.
struct migrate_result {
  std::vector<migration_info> files;  ///< every shipped file, in version order
  std::vector<int> applied_now;       ///< versions applied by this call (none if dry_run)
  std::vector<int> unknown_applied;   ///< versions recorded in the database but not shipped
};

/**
 * @brief Brings dblock's tables (with the database's table prefix) up to date.
 *
 * Applies pending files of `migrations/<backend>/` in version order, each in its own
 * transaction where the backend has transactional DDL (PostgreSQL, SQLite), and records version,
 * name and checksum in `<prefix>dblock_schema_migrations`. Idempotent. Safe when several
 * processes run it at once: PostgreSQL takes an advisory lock, MySQL GET_LOCK, SQLite a
 * BEGIN IMMEDIATE write transaction per file, and every file is re-checked under that lock.
 * With dry_run it takes the same lock but creates and applies nothing. The whole call, its wait
 * for that lock included, is bounded by database_options::call_timeout.
 * Thread-safety: safe to call concurrently (also from several processes); each call uses its
 * own pooled connection.
 *
 * @throws dblock::error errc::schema_mismatch when an applied file's checksum differs from the
 *         shipped file (someone edited an applied migration: nothing is applied);
 *         errc::timeout when the call does not end within database_options::call_timeout
 *         (another migrator holding the migration lock, say; MySQL's GET_LOCK gives up after
 *         600 s in any case); errc::in_doubt
 *         when the connection broke after a file's COMMIT was sent (run migrate() again: the
 *         file is re-checked under the lock); the @ref database_errors "database errors" (a
 *         failed file is rolled back where DDL is transactional, not on MySQL).
 */
migrate_result migrate(const database& db, migrate_options options = {});

/// True when every shipped migration is applied (a cheap check for tools and tests): migrate()
/// with dry_run, so it changes nothing. Thread-safety: safe to call concurrently.
/// @throws dblock::error as migrate() does (errc::schema_mismatch for an edited applied file,
///         rather than false).
bool schema_up_to_date(const database& db);

/**
 * @brief The SQL migrate() would run, for a DBA or a schema tool (Flyway, Liquibase) to run
 *        instead.
 *
 * With the database's table prefix filled in: the bookkeeping table, then each pending file (or,
 * with `all`, every shipped file), each followed by the INSERT that records it (the two in one
 * transaction on PostgreSQL and SQLite, whose DDL is transactional), so that
 * migrate(), schema_up_to_date() and `dblock migrate --dry-run` see it applied afterwards. Every
 * statement ends with ";" at the end of a line (psql, mysql and sqlite3 read it as is). Run it
 * as the owner of the tables, in order, stopping at the first error (`psql -v ON_ERROR_STOP=1`).
 * With `all` nothing is read from the database (no connection is opened); otherwise the
 * applied files are read as migrate() with dry_run does.
 * Thread-safety: safe to call concurrently.
 *
 * @throws dblock::error as migrate() with dry_run does (without `all`).
 */
std::string migration_sql(const database& db, bool all = false);

}  // namespace dblock
