// Leader elections' announcements (election.hpp), on the `leader` table.
#include "storage/lock_table.hpp"

namespace dblock::detail::leader_table {

void announce(session_scope& s, const std::string& name, const std::string& identity,
              std::int64_t fence) {
  s.run(s.statements().leader_clear, {name});
  s.run(s.statements().leader_announce, {name, identity, static_cast<long long>(fence)});
}

std::optional<announcement> read(session_scope& s, const std::string& name) {
  const sql_result r = s.run(s.statements().leader_read, {name});
  if (r.empty()) return std::nullopt;
  return announcement{r.text(0, 0), r.integer(0, 1), r.integer(0, 2)};
}

}  // namespace dblock::detail::leader_table
