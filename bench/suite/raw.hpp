// The benchmark's floor: SQL issued straight through the C client libraries (libpq, the MySQL
// client API, the sqlite3 C API), with no SOCI and no dblock logic, each the fastest way that
// library offers to repeat a statement (PostgreSQL: prepared once per connection; MySQL: one
// text query, as SOCI sends it; SQLite: a reused sqlite3_stmt).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dblock::bench {

/// A statement parameter.
using param = std::variant<long long, std::string>;
/// Named parameters (`:name` in the SQL text).
using params = std::vector<std::pair<std::string, param>>;

/// What one statement returned.
struct outcome {
  long long affected = 0;          ///< rows affected (MySQL: matched rows, as dblock counts)
  std::optional<long long> value;  ///< first column of the first row, when there is one
  long long insert_id = 0;         ///< MySQL's LAST_INSERT_ID() from the OK packet
};

/// One connection of a C client library. Not thread-safe: one per benchmark thread.
class raw_client {
 public:
  virtual ~raw_client() = default;
  /// Runs `sql` (named parameters) as statement `key`; PostgreSQL and SQLite prepare it on first
  /// use and reuse it. Throws std::runtime_error with the server's message on failure.
  virtual outcome run(const std::string& key, const std::string& sql, const params& p) = 0;
  /// Runs a statement without parameters (BEGIN, COMMIT, ...).
  virtual void exec(const std::string& sql) = 0;
  /// The backend: "postgresql", "mysql" or "sqlite".
  virtual const char* backend() const = 0;
  /// The server's version string.
  virtual std::string server_version() = 0;
  /// The underlying handle (PGconn*, MYSQL*, sqlite3*), for backend-specific measurements.
  virtual void* handle() = 0;
  /// SQLite: the connection's own PRAGMA synchronous, read once at its first release, as dblock
  /// reads it once at connect (-1: not read yet).
  long long synchronous = -1;
};

/// Opens a raw connection for a dblock URL (same syntax as dblock::database).
std::unique_ptr<raw_client> connect_raw(const std::string& url);
/// libpq's connection string for a PostgreSQL dblock URL, as dblock's dialect builds it.
std::string libpq_conninfo(const std::string& url);

}  // namespace dblock::bench
