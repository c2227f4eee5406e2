#include "core/identifier.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail::semaphore_table {

std::optional<std::int64_t> declare(session_scope& s, const std::string& name, int permits) {
  write_statement(s, write_kind::statement, s.statements().semaphore_declare,
                  {name, static_cast<long long>(permits)}, "declare semaphore");
  const sql_result r = s.run(s.statements().semaphore_permits, {name});
  if (r.empty()) return std::nullopt;
  return r.integer(0, 0);
}

std::vector<held_permit> held(session_scope& s, const std::string& semaphore_name) {
  // Permit names are the semaphore's name, U+FFFF and the slot's digits: in byte order, the
  // names from `NAME` U+FFFF up to (not including) `NAME` U+FFFF ":" (the byte after '9').
  const std::string lo = semaphore_name + std::string(internal_separator);
  const sql_result r = s.run(s.statements().permits_held, {lo, lo + ":"});
  std::vector<held_permit> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out.push_back({r.text(i, 0), r.integer(i, 1) - r.integer(i, 2)});
  return out;
}

}  // namespace dblock::detail::semaphore_table
