#include "storage/counter_tables.hpp"

namespace dblock::detail {

namespace stock_table {

bool take(session_scope& s, const std::string& name, int seg, std::int64_t k) {
  return s.run(s.statements().stock_take,
               {static_cast<long long>(k), name, static_cast<long long>(seg)})
             .affected == 1;
}

bool skips_locked(session_scope& s) {
  return s.statements().can.skip_locked;
}

bool take_unlocked(session_scope& s, const std::string& name, int seg, std::int64_t k) {
  const sql_result r = s.run(s.statements().stock_probe,
                             {name, static_cast<long long>(seg), static_cast<long long>(k)});
  // The row is ours now and held at least k (the probe read its newest version under the lock),
  // so the conditional update matches; it stays conditional all the same.
  return !r.empty() && take(s, name, seg, k);
}

bool put(session_scope& s, const std::string& name, int seg, std::int64_t k) {
  return s.run(s.statements().stock_put,
               {static_cast<long long>(k), name, static_cast<long long>(seg)})
             .affected == 1;
}

std::vector<segment> read(session_scope& s, const std::string& name, bool lock) {
  const auto& st = s.statements();
  const sql_result r = s.run(lock ? st.stock_lock : st.stock_read, {name});
  std::vector<segment> out;
  out.reserve(r.rows.size());
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    out.push_back({static_cast<int>(r.integer(i, 0)), r.integer(i, 1)});
  return out;
}

void set(session_scope& s, const std::string& name, int seg, std::int64_t amount) {
  s.run(s.statements().stock_set,
        {static_cast<long long>(amount), name, static_cast<long long>(seg)});
}

void insert(session_scope& s, const std::string& name, int seg, std::int64_t amount) {
  s.run(s.statements().stock_insert,
        {name, static_cast<long long>(seg), static_cast<long long>(amount)});
}

totals total(session_scope& s, const std::string& name) {
  const sql_result r = s.run(s.statements().stock_total, {name});
  return {r.integer(0, 0), static_cast<int>(r.integer(0, 1))};
}

std::int64_t remove(session_scope& s, const std::string& name) {
  return s.run(s.statements().stock_delete, {name}).affected;
}

}  // namespace stock_table

namespace id_table {

void ensure(session_scope& s, const std::string& name) {
  s.run(s.statements().id_insert, {name});
}

std::optional<std::int64_t> reserve(session_scope& s, const std::string& name,
                                    std::int64_t epoch_ms, std::int64_t per_ms, std::int64_t n) {
  const sql_result r = s.run(s.statements().id_reserve,
                             {static_cast<long long>(epoch_ms), static_cast<long long>(per_ms),
                              static_cast<long long>(n), name});
  if (!r.empty()) return r.integer(0, 0);
  if (r.affected == 1 && r.insert_id > 0) return r.insert_id;  // MySQL: LAST_INSERT_ID(expr)
  return std::nullopt;
}

}  // namespace id_table

}  // namespace dblock::detail
