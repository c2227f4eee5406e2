// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <string>
#include <vector>

#include "dblock/database.hpp"

namespace dblock {

/// One migration file shipped with dblock, and whether the database has it.
struct migration_info {
  int version = 0;       ///< NNNN from the file name
  std::string name;      ///< file name, e.g. "0001_resource_lock.sql"
  std::string checksum;  ///< 16 hex digits (FNV-1a 64 of the file text)
  bool applied = false;  ///< recorded in the migrations table (before or by this call)
};

/// Options of migrate().
struct migrate_options {
  bool dry_run = false;  ///< report what would be applied, change nothing
};

/// What migrate() found and did.
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
 * Thread-safety: safe to call concurrently.
 *
 * @throws dblock::error errc::schema_mismatch when an applied file's checksum differs from the
 *         shipped file (someone edited an applied migration: nothing is applied);
 *         connection and backend errors as classified.
 */
migrate_result migrate(const database& db, migrate_options options = {});

/// True when every shipped migration is applied (a cheap check for tools and tests).
bool schema_up_to_date(const database& db);

}  // namespace dblock
