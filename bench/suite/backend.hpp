// One database the suite measures (a --url): its dblock handle, the statements of the raw floor,
// the business tables of the data rows; and the raw lease statements every family runs on it.
#pragma once

#include <dblock/dblock.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "harness.hpp"
#include "raw.hpp"
#include "suite.hpp"

namespace dblock::bench {

constexpr int kItems = 10000;           // rows of the business table
constexpr long long kTtlUs = 30000000;  // 30 s: no lease expires during a measurement
constexpr const char* kStockName = "bench/stock";
constexpr int kStockSegments = 16;

struct backend_ctx {
  std::string url, backend, version;
  std::string prefix;  ///< the benchmark's table prefix
  /// How results name this URL: the backend, "/pooler" behind a transaction-mode pooler, and
  /// "#N" for a further URL that would otherwise read the same.
  std::string label;
  dblock::lease_options wait_options;  // for acquire(wait): the polling being measured
  dblock::database db;
  struct {
    std::string acquire, release, renew;
    bool write_transaction = false;  // SQLite: each statement inside BEGIN IMMEDIATE ... COMMIT
  } sql;
  std::string item;  // business table
  std::string for_update;
  std::string begin_write;
  /// The dblock.tablesize_* operations' databases: N -> tables holding N released lease rows.
  std::map<long long, dblock::database> sized;
  /// PostgreSQL's fast lease mode: the same set-up on tables of their own (prefix + "fast_")
  /// whose lease table is UNLOGGED (set_lease_durability); made when an operation needs it.
  std::unique_ptr<backend_ctx> fast;
  /// The server takes session leases (docs/session-leases.md): not behind a transaction-mode
  /// pooler, nor on SQLite, nor in the MySQL 8 flavor.
  bool session_leases = false;
};

/// Migrates `url` and creates the business tables (dropped again by drop_business_tables()).
std::unique_ptr<backend_ctx> open_backend(const std::string& url, const options& o);
/// Drops what open_backend() created besides dblock's own tables.
void drop_business_tables(backend_ctx& b);

/// Names a result row: the backend it ran on (as the table labels it), its operation and kind.
void name_row(result& r, const backend_ctx& b, std::string operation, std::string kind);

/// A raw lease acquire: the very statements dblock runs, through the C client. The fence, or
/// nothing when the lease is held.
std::optional<long long> raw_acquire(raw_client& c, const backend_ctx& b, const std::string& name,
                                     const std::string& tok, long long floor = 0);
/// A raw release of a lease raw_acquire() took; true when it released it.
bool raw_release(raw_client& c, const backend_ctx& b, const std::string& name,
                 const std::string& tok, long long fence);
/// Runs one write statement (SQLite: in its own write transaction); true when it hit one row.
bool raw_simple_write(raw_client& c, const backend_ctx& b, const std::string& key,
                      const std::string& sql, const params& p);

/// One of the `keys` lease names of client `thread`, at random: bench/<thread>/<k>.
std::string key_name(int thread, int keys);

/// try_acquire()+release() of one of the lease names <base>0 ... <base><keys-1> on `db`, at
/// random.
cycle_fn lease_cycle(const dblock::database& db, const std::string& base, int keys);

}  // namespace dblock::bench
