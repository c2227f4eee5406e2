// Test-only access to dblock's internals (the dialect, table names, dblock's statements, reading
// a lease row), through the library's own gate (detail::access).
#pragma once

#include <soci/soci.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "dblock/database.hpp"
#include "harness.hpp"
#include "storage/lock_table.hpp"
#include "storage/session.hpp"

namespace dblock::test {

/// What the library records as a holder's host and thread (lease rows, session reports).
inline std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}
inline std::string this_thread_label() {
  return std::to_string(static_cast<long long>(::syscall(SYS_gettid)));
}

inline const detail::dialect& dialect_of(const database& db) {
  return *detail::access::impl(db)->dia;
}
/// Lease tries of `db` that the database refused (every try; listener::contended() counts
/// calls).
inline std::uint64_t refused_tries_of(const database& db) {
  return detail::access::impl(db)->refused_tries.load();
}
inline const detail::table_names& tables_of(const database& db) {
  return detail::access::impl(db)->tables;
}
inline const detail::lock_statements& statements_of(const database& db) {
  return detail::access::impl(db)->statements;
}
/// Reads a lease row on the given connection (nothing when the row does not exist).
inline std::optional<detail::lease_row> read_lease(database::connection& c,
                                                   const std::string& name) {
  return detail::lock_table::read(detail::access::scope(c), name);
}
inline std::optional<detail::lease_row> read_lease(database::connection&& c,
                                                   const std::string& name) {
  return read_lease(c, name);
}

/// Makes the lease row of `name` look expired on the database clock (as if its holder paused past
/// the TTL).
inline void expire_row(const context& ctx, const std::string& name) {
  const auto& d = dialect_of(ctx.db);
  auto c = ctx.db.connect();
  long long minus = -3600LL * 1000000;
  c.session() << "UPDATE " << ctx.db.lock_table()
              << " SET expires_at = " << d.sql.plus_us(d.sql.now(), "ttl")
              << " WHERE resource_name = :name",
      soci::use(minus, "ttl"), soci::use(name, "name");
}

}  // namespace dblock::test
