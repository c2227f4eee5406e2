// Batch renewal of leases (lock_table::renew_batch): the statements of one watchdog round.
#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail::lock_table {
namespace {

// Statements are prepared per connection and list length: lengths are rounded up to a power of
// two (the list repeats its last entry), so a connection keeps at most ten of each.
std::size_t list_length(std::size_t n) {
  std::size_t len = 1;
  while (len < n)
    len *= 2;
  return len;
}

// `prefix` + "name list) AND owner_token IN (token list)" + `suffix`, with `ttl` first when
// given; entries `pick` of `batch`, padded to list_length().
statement list_statement(const std::string& key, const std::string& prefix,
                         const std::string& suffix, bool ttl, const std::vector<renewal>& batch,
                         const std::vector<std::size_t>& pick, std::vector<sql_param>& values) {
  const std::size_t len = list_length(pick.size());
  statement st{key + "_" + std::to_string(len), prefix, {}};
  if (ttl) st.params.push_back("ttl");
  std::string tokens;
  for (std::size_t k = 0; k < len; ++k) {
    st.params.push_back("n" + std::to_string(k));
    st.text += (k ? ", :" : ":") + st.params.back();
  }
  for (std::size_t k = 0; k < len; ++k) {
    st.params.push_back("t" + std::to_string(k));
    tokens += (k ? ", :" : ":") + st.params.back();
  }
  st.text += ") AND owner_token IN (" + tokens + ")" + suffix;
  for (int part = 0; part < 2; ++part)
    for (std::size_t k = 0; k < len; ++k) {
      const renewal& r = batch[pick[std::min(k, pick.size() - 1)]];
      values.emplace_back(part == 0 ? r.name : r.token);
    }
  return st;
}

// The entries of `batch` that rows of `r` (name, token, fence) show held by them: the batch is
// indexed by name once, so a batch of 512 costs 512 lookups, not 512 x 512 comparisons.
std::vector<bool> held_by_batch(const sql_result& r, const std::vector<renewal>& batch) {
  std::unordered_multimap<std::string_view, std::size_t> by_name;
  by_name.reserve(batch.size());
  for (std::size_t k = 0; k < batch.size(); ++k)
    by_name.emplace(batch[k].name, k);
  std::vector<bool> held(batch.size(), false);
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const auto [from, to] = by_name.equal_range(r.text(i, 0));
    for (auto it = from; it != to; ++it) {
      const renewal& b = batch[it->second];
      if (b.token == r.text(i, 1) && b.fence == r.integer(i, 2)) held[it->second] = true;
    }
  }
  return held;
}

std::vector<std::size_t> all_of(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t k = 0; k < n; ++k)
    v[k] = k;
  return v;
}

}  // namespace

std::vector<renewal_outcome> renew_batch(session_scope& s, const std::vector<renewal>& batch,
                                         std::int64_t ttl_us, int& round_trips) {
  round_trips = 0;
  std::vector<renewal_outcome> out(batch.size(), renewal_outcome::lost);
  if (batch.empty()) return out;
  if (batch.size() > renew_batch_max)
    throw error(errc::invalid_argument, "renew_batch: more than renew_batch_max leases");
  const lock_statements& t = s.statements();
  std::vector<std::size_t> mine;
  {
    write_scope w(s, write_kind::transaction, "renew leases");
    std::vector<sql_param> values;
    const statement lock =
        list_statement("renew_batch_lock", t.renew_batch_select, t.renew_batch_skip_locked, false,
                       batch, all_of(batch.size()), values);
    const std::vector<bool> held = held_by_batch(s.run(lock, values), batch);
    round_trips += 2;
    for (std::size_t k = 0; k < batch.size(); ++k)
      if (held[k]) mine.push_back(k);
    if (!mine.empty()) {
      std::vector<sql_param> uv{static_cast<long long>(ttl_us)};
      const statement update =
          list_statement("renew_batch_update", t.renew_batch_update, "", true, batch, mine, uv);
      // The rows are locked by this transaction (SQLite: the whole database is), so every one
      // of them matches; anything else renews nothing.
      const long long affected = s.run(update, uv).affected;
      round_trips += 1;
      if (affected == static_cast<long long>(mine.size()))
        for (std::size_t k : mine)
          out[k] = renewal_outcome::renewed;
    }
    w.commit();
    round_trips += 1;
  }
  if (mine.size() == batch.size()) return out;
  // Not locked by this transaction: locked by another one (busy) or no longer ours (lost).
  std::vector<std::size_t> rest;
  for (std::size_t k = 0; k < batch.size(); ++k)
    if (out[k] != renewal_outcome::renewed) rest.push_back(k);
  std::vector<sql_param> values;
  const statement read =
      list_statement("renew_batch_read", t.renew_batch_select, "", false, batch, rest, values);
  const std::vector<bool> held = held_by_batch(s.run(read, values), batch);
  round_trips += 1;
  for (std::size_t k : rest)
    if (held[k]) out[k] = renewal_outcome::busy;
  return out;
}

}  // namespace dblock::detail::lock_table
