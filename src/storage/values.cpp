#include "storage/values.hpp"

#include <array>
#include <string_view>

#include "dblock/error.hpp"
#include "storage/session.hpp"

namespace dblock::detail {

void value_binder::bind(soci::statement& st, const value& v, const std::string& name) {
  indicators_.push_back(soci::i_ok);
  soci::indicator& ind = indicators_.back();
  if (std::holds_alternative<std::monostate>(v)) {
    ints_.push_back(0);
    ind = soci::i_null;
    st.exchange(soci::use(ints_.back(), ind, name));
  } else if (auto* i = std::get_if<long long>(&v)) {
    ints_.push_back(*i);
    st.exchange(soci::use(ints_.back(), ind, name));
  } else if (auto* d = std::get_if<double>(&v)) {
    doubles_.push_back(*d);
    st.exchange(soci::use(doubles_.back(), ind, name));
  } else {
    strings_.push_back(std::get<std::string>(v));
    st.exchange(soci::use(strings_.back(), ind, name));
  }
}

std::string describe(const value& v) {
  if (std::holds_alternative<std::monostate>(v)) return "NULL";
  if (auto* i = std::get_if<long long>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return std::to_string(*d);
  return "'" + std::get<std::string>(v).substr(0, 64) + "'";
}

std::optional<statement> caller_statement(const std::string& text, const named_values& params,
                                          std::vector<sql_param>& values) {
  // The text's parameters and the given names must be the same set, no name given twice.
  // Checked without allocating (this runs on every call of a cached caller statement): callers
  // pass a handful of names; past `most` the statement simply goes through SOCI.
  constexpr std::size_t most = 64;
  if (params.size() > most) return std::nullopt;
  for (std::size_t i = 0; i < params.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (params[i].first == params[j].first) return std::nullopt;
  std::array<bool, most> used{};
  bool unknown = false;
  scan_parameters(
      text, [](std::string_view) {},
      [&](const std::string& name) {
        for (std::size_t i = 0; i < params.size(); ++i)
          if (params[i].first == name) {
            used[i] = true;
            return;
          }
        unknown = true;
      });
  if (unknown) return std::nullopt;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!used[i]) return std::nullopt;
  statement st{"caller", text, {}, false, true};
  st.params.reserve(params.size());
  values.reserve(values.size() + params.size());
  for (const auto& p : params) {
    if (const auto* i = std::get_if<long long>(&p.second))
      values.emplace_back(*i);
    else if (const auto* str = std::get_if<std::string>(&p.second))
      values.emplace_back(*str);
    else
      return std::nullopt;  // NULL or a double: SOCI binds those with their types
    st.params.push_back(p.first);
  }
  return st;
}

fetched_rows fetch_rows(session_scope& s, const std::string& text, const named_values& params) {
  connection_state& cs = s.state();
  const vocabulary& voc = s.dia().sql;
  auto shape = cs.caller_shapes.find(text);
  if (shape != cs.caller_shapes.end()) {
    std::vector<sql_param> values;
    if (auto st = caller_statement(text, params, values)) {
      const sql_result r = s.run(*st, values);
      fetched_rows out{shape->second.names, {}};
      bool exact = true;
      for (std::size_t i = 0; exact && i < r.rows.size(); ++i) {
        const auto& cells = r.rows[i];
        exact = cells.size() == shape->second.types.size();
        std::vector<value> row;
        for (std::size_t j = 0; exact && j < cells.size(); ++j) {
          auto v = voc.decode_text(cells[j], shape->second.types[j]);
          if (v)
            row.push_back(std::move(*v));
          else
            exact = false;
        }
        if (exact) out.rows.push_back(std::move(row));
      }
      if (exact) return out;
    }
  }
  fetched_rows out;
  soci::row row;
  value_binder b;
  soci::statement st(s.sql());
  for (const auto& p : params)
    b.bind(st, p.second, p.first);
  st.exchange(soci::into(row));
  st.alloc();
  st.prepare(text, soci::details::st_one_time_query);
  st.define_and_bind();
  if (st.execute(true)) {
    connection_state::caller_shape seen;
    for (std::size_t i = 0; i < row.size(); ++i) {
      out.names.push_back(row.get_properties(i).get_name());
      seen.types.push_back(row.get_properties(i).get_data_type());
    }
    seen.names = out.names;
    do {
      std::vector<value> values;
      for (std::size_t i = 0; i < row.size(); ++i)
        values.push_back(voc.decode_value(row, i));
      out.rows.push_back(std::move(values));
    } while (st.fetch());
    if (cs.caller_shapes.size() < caller_statement_cache) cs.caller_shapes[text] = std::move(seen);
  }
  return out;
}

}  // namespace dblock::detail
