// Statements on dblock's tables through libpq: prepared once per connection and run with
// PQexecPrepared (one round trip, no re-parse or re-plan); SOCI's one-time queries are
// unprepared, and its prepared statements cost a PREPARE and a DEALLOCATE round trip each time.
// Statements without a cache key run with PQexecParams.
#include <cstring>
#include <memory>

#include "../../storage/session.hpp"
#include "backend.hpp"

namespace dblock::detail::pg {
namespace {

using result_ptr = std::unique_ptr<PGresult, void (*)(PGresult*)>;

// Throws what SOCI would throw, so the classifier treats both paths alike.
[[noreturn]] void fail(PGconn* c, PGresult* r) {
  std::string msg = r ? PQresultErrorMessage(r) : "";
  if (msg.empty()) msg = PQerrorMessage(c);
  const char* field = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  char code[6] = "XX000";
  if (field && std::strlen(field) == 5)
    std::memcpy(code, field, 5);
  else if (PQstatus(c) == CONNECTION_BAD)
    std::memcpy(code, "08006", 5);  // connection failure: the reply never came
  if (r) PQclear(r);
  throw soci::postgresql_soci_error(msg.empty() ? "no reply from the server" : msg, code);
}

bool ok(PGresult* r) {
  const auto status = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  return status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK;
}

sql_result collect(PGresult* r) {
  sql_result out;
  const int rows = PQntuples(r), cols = PQnfields(r);
  out.rows.resize(static_cast<std::size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    auto& row = out.rows[static_cast<std::size_t>(i)];
    row.reserve(static_cast<std::size_t>(cols));
    for (int j = 0; j < cols; ++j) {
      if (PQgetisnull(r, i, j))
        row.emplace_back();
      else
        row.emplace_back(std::string(PQgetvalue(r, i, j), PQgetlength(r, i, j)));
    }
  }
  const char* affected = PQcmdTuples(r);
  out.affected = affected && *affected ? std::atoll(affected) : 0;
  return out;
}

bool is_sqlstate(PGresult* r, const char* code) {
  const char* field = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  return field && std::strcmp(field, code) == 0;
}

}  // namespace

sql_result executor::run(session_scope& s, const statement& st,
                         const std::vector<sql_param>& values) const {
  PGconn* c = raw(s.sql());
  std::vector<std::string> text;
  text.reserve(values.size());
  for (const auto& v : values)
    text.push_back(std::holds_alternative<long long>(v) ? std::to_string(std::get<long long>(v))
                                                        : std::get<std::string>(v));
  std::vector<const char*> ptrs;
  for (const auto& t : text)
    ptrs.push_back(t.c_str());
  const int n = static_cast<int>(ptrs.size());
  // Behind a transaction-mode pooler a named statement prepared in one transaction may be
  // missing in the next, or exist already on another client's server session: unnamed only.
  if (st.key.empty() || s.state().transaction_pooler) {
    const std::string positional = to_positional(st.text, st.params);
    PGresult* r = PQexecParams(c, positional.c_str(), n, nullptr, ptrs.data(), nullptr, nullptr, 0);
    if (!ok(r)) fail(c, r);
    return collect(result_ptr(r, PQclear).get());
  }
  auto& prepared = static_cast<state&>(s.state()).prepared;
  const std::string name = "dblock_" + st.key;
  for (int attempt = 0;; ++attempt) {
    if (!prepared.count(name)) {
      PGresult* r =
          PQprepare(c, name.c_str(), to_positional(st.text, st.params).c_str(), n, nullptr);
      if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) fail(c, r);
      PQclear(r);
      prepared.insert(name);
    }
    PGresult* r = PQexecPrepared(c, name.c_str(), n, ptrs.data(), nullptr, nullptr, 0);
    if (ok(r)) return collect(result_ptr(r, PQclear).get());
    if (attempt == 0 && is_sqlstate(r, "26000")) {
      // The server forgot the statement (DISCARD ALL by a pooler): it did not run; prepare it
      // again.
      PQclear(r);
      prepared.erase(name);
      continue;
    }
    fail(c, r);
  }
}

}  // namespace dblock::detail::pg
