// Runs of jobs that run once ever or once per slot (runs.hpp), on the `job_run` table.
#include "storage/lock_table.hpp"

namespace dblock::detail::run_table {
namespace {

std::int64_t us_or_zero(const sql_result& r, std::size_t row, std::size_t col) {
  return r.is_null(row, col) ? 0 : r.integer(row, col);
}

}  // namespace

std::int64_t now_us(session_scope& s) {
  const sql_result r = s.run(s.statements().run_now, {});
  return r.integer(0, 0);
}

std::optional<run_row> done(session_scope& s, const std::string& key, std::int64_t slot,
                            std::int64_t period_ms) {
  const sql_result r = s.run(s.statements().run_done, {key, static_cast<long long>(slot),
                                                       static_cast<long long>(period_ms)});
  if (r.empty()) return std::nullopt;
  run_row row;
  row.key = key;
  row.slot = slot;
  row.period_ms = period_ms;
  row.host = r.text(0, 0);
  row.pid = r.integer(0, 1);
  row.fence = r.integer(0, 2);
  row.started_us = r.integer(0, 3);
  row.ended_us = us_or_zero(r, 0, 4);
  row.exit_status = 0;
  row.succeeded = true;
  return row;
}

void start(session_scope& s, const std::string& key, std::int64_t slot, std::int64_t fence,
           std::int64_t period_ms, const std::string& host, std::int64_t pid) {
  s.run(s.statements().run_start,
        {key, static_cast<long long>(slot), static_cast<long long>(fence),
         static_cast<long long>(period_ms), host, static_cast<long long>(pid)});
}

void finish(session_scope& s, const std::string& key, std::int64_t slot, std::int64_t fence,
            int status) {
  s.run(s.statements().run_finish, {static_cast<long long>(status), status == 0 ? 1LL : 0LL, key,
                                    static_cast<long long>(slot), static_cast<long long>(fence)});
}

std::vector<run_row> list(session_scope& s, const std::string& key, std::size_t limit) {
  const lock_statements& t = s.statements();
  std::vector<sql_param> params;
  std::string sql = t.run_list;
  std::vector<std::string> names;
  if (!key.empty()) {
    sql += " WHERE run_key = :key";
    names.push_back("key");
    params.emplace_back(key);
  }
  sql += " ORDER BY started_at DESC, fence DESC LIMIT :limit";
  names.push_back("limit");
  params.emplace_back(static_cast<long long>(limit));
  const sql_result r =
      s.run(statement{key.empty() ? "run_list_all" : "run_list_key", sql, names}, params);
  std::vector<run_row> out;
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    run_row row;
    row.key = r.text(i, 0);
    row.slot = r.integer(i, 1);
    row.fence = r.integer(i, 2);
    row.period_ms = r.integer(i, 3);
    row.host = r.text(i, 4);
    row.pid = r.integer(i, 5);
    row.started_us = r.integer(i, 6);
    row.ended_us = us_or_zero(r, i, 7);
    if (!r.is_null(i, 8)) row.exit_status = static_cast<int>(r.integer(i, 8));
    row.succeeded = r.integer(i, 9) != 0;
    row.forgotten_us = us_or_zero(r, i, 10);
    if (!r.is_null(i, 11)) row.forgotten_by = r.text(i, 11);
    if (!r.is_null(i, 12)) row.forget_reason = r.text(i, 12);
    out.push_back(std::move(row));
  }
  return out;
}

long long forget(session_scope& s, const std::string& key, const std::string& forgotten_by,
                 const std::string& reason) {
  return s.run(s.statements().run_forget, {forgotten_by, reason, key}).affected;
}

long long reap(session_scope& s, std::chrono::milliseconds retention) {
  const long long neg = -std::chrono::duration_cast<std::chrono::microseconds>(retention).count();
  return s.run(s.statements().run_reap, {neg}).affected;
}

}  // namespace dblock::detail::run_table
