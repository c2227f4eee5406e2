// Statements on dblock's tables through libmariadb: the values are escaped into the text
// (mysql_real_escape_string, as SOCI's MySQL backend does) and sent as one query.
#include <memory>

#include "backend.hpp"

namespace dblock::detail::my {
namespace {

// Throws what SOCI would throw, so the classifier treats both paths alike.
[[noreturn]] void fail(MYSQL* c) {
  throw soci::mysql_soci_error(mysql_error(c), static_cast<int>(mysql_errno(c)));
}

void append_value(MYSQL* c, std::string& out, const sql_param& v) {
  if (std::holds_alternative<long long>(v)) {
    out += std::to_string(std::get<long long>(v));
    return;
  }
  const std::string& s = std::get<std::string>(v);
  std::string buf(s.size() * 2 + 1, '\0');
  const unsigned long n =
      mysql_real_escape_string(c, buf.data(), s.data(), static_cast<unsigned long>(s.size()));
  out += '\'';
  out.append(buf.data(), n);
  out += '\'';
}

std::string substitute(MYSQL* c, const statement& st, const std::vector<sql_param>& values) {
  std::string out;
  out.reserve(st.text.size() + 64);
  scan_parameters(
      st.text, [&](std::string_view text) { out += text; },
      [&](const std::string& name) {
        std::size_t i = 0;
        while (i < st.params.size() && st.params[i] != name)
          ++i;
        if (i >= values.size())
          throw error(errc::backend_error, "internal: statement parameter :" + name + " not bound");
        append_value(c, out, values[i]);
      });
  return out;
}

}  // namespace

void executor::begin_statement(exec_session& s, bool) const {
  if (!(raw(s.sql())->server_status & SERVER_STATUS_IN_TRANS))
    set_lock_wait(s.sql(), s.state(), -1);
}

sql_result executor::run(exec_session& s, const statement& st,
                         const std::vector<sql_param>& values) const {
  MYSQL* c = raw(s.sql());
  // A statement of its own: with the server's lock wait, not a past transaction's.
  if (!(c->server_status & SERVER_STATUS_IN_TRANS)) set_lock_wait(s.sql(), s.state(), -1);
  const std::string q = substitute(c, st, values);
  if (mysql_real_query(c, q.data(), static_cast<unsigned long>(q.size())) != 0) fail(c);
  sql_result out;
  std::unique_ptr<MYSQL_RES, void (*)(MYSQL_RES*)> res(mysql_store_result(c), mysql_free_result);
  if (!res) {
    if (mysql_field_count(c) != 0) fail(c);
    out.affected = static_cast<long long>(mysql_affected_rows(c));
    out.insert_id = static_cast<long long>(mysql_insert_id(c));
    return out;
  }
  const unsigned cols = mysql_num_fields(res.get());
  while (MYSQL_ROW row = mysql_fetch_row(res.get())) {
    const unsigned long* len = mysql_fetch_lengths(res.get());
    std::vector<std::optional<std::string>> r;
    r.reserve(cols);
    for (unsigned j = 0; j < cols; ++j) {
      if (row[j])
        r.emplace_back(std::string(row[j], len[j]));
      else
        r.emplace_back();
    }
    out.rows.push_back(std::move(r));
  }
  if (mysql_errno(c) != 0) fail(c);
  out.affected = static_cast<long long>(out.rows.size());
  return out;
}

}  // namespace dblock::detail::my
