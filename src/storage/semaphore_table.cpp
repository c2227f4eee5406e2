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
  const auto [lo, hi] = permit_name_range(semaphore_name);
  const sql_result r = s.run(s.statements().permits_held, {lo, hi});
  std::vector<held_permit> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out.push_back({r.text(i, 0), r.integer(i, 1) - r.integer(i, 2)});
  return out;
}

}  // namespace dblock::detail::semaphore_table
