// Statements on dblock's tables through libpq: prepared once per connection and run with
// PQexecPrepared (one round trip, no re-parse or re-plan); SOCI's one-time queries are
// unprepared, and its prepared statements cost a PREPARE and a DEALLOCATE round trip each time.
// Statements without a cache key run with PQexecParams.
//
// Behind a transaction-mode pooler nothing can be prepared: a named statement made in one
// transaction may be missing in the next, or exist already on another client's server session.
// Statements then run unnamed, parsed and planned on every call, which costs the lease cycle a
// third of its throughput. The lease cycle's statements (statement::routine) instead call a
// PL/pgSQL routine in the server session's temporary schema, whose plans PL/pgSQL keeps for the
// life of that server session, however many clients the pooler hands it to. The routine's name
// carries a hash of its text, so two dblock versions or table prefixes never share one. Where
// it is missing (a new server session, DISCARD ALL) the call fails before anything runs, and one
// simple query creates it and runs the statement in the same implicit transaction.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "backend.hpp"

namespace dblock::detail::pg {
void fail(PGconn* c, PGresult* r) {
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

namespace {

using result_ptr = std::unique_ptr<PGresult, void (*)(PGresult*)>;

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

// A routine's rows as the statement's own: its rows (affected: their count), or the count.
sql_result routine_result(PGresult* r, bool returns_rows) {
  sql_result out = collect(r);
  if (returns_rows) {
    out.affected = static_cast<long long>(out.rows.size());
  } else {
    out.affected = out.integer(0, 0);
    out.rows.clear();
  }
  return out;
}

}  // namespace

void command(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) fail(c, r);
  PQclear(r);
}

routine make_routine(PGconn* c, const std::string& key, const std::string& positional,
                     const std::vector<sql_param>& values) {
  routine r;
  std::string types;
  r.call = "(";
  for (std::size_t i = 0; i < values.size(); ++i) {
    const bool integer = std::holds_alternative<long long>(values[i]);
    types += std::string(i ? ", " : "") + (integer ? "bigint" : "text");
    r.call += i ? ", " : "";
    if (integer) {
      r.call += std::to_string(std::get<long long>(values[i])) + "::bigint";
    } else {
      const std::string& v = std::get<std::string>(values[i]);
      std::unique_ptr<char, void (*)(void*)> quoted(PQescapeLiteral(c, v.data(), v.size()),
                                                    PQfreemem);
      if (!quoted) fail(c, nullptr);
      r.call += quoted.get();
      r.call += "::text";
    }
  }
  r.call += ")";
  r.returns_rows = positional.find(" RETURNING ") != std::string::npos;
  const std::string name = "pg_temp.dblock_" + key + "_" + hash_hex(positional + "|" + types);
  r.call = (r.returns_rows ? "SELECT * FROM " : "SELECT ") + name + r.call;
  r.create =
      "CREATE OR REPLACE FUNCTION " + name + "(" + types + ")" +
      (r.returns_rows ? " RETURNS SETOF bigint LANGUAGE plpgsql AS $dblock$BEGIN RETURN QUERY " +
                            positional + "; END$dblock$"
                      : " RETURNS bigint LANGUAGE plpgsql AS $dblock$DECLARE dblock_n bigint;"
                        " BEGIN " +
                            positional +
                            "; GET DIAGNOSTICS dblock_n = ROW_COUNT; RETURN dblock_n;"
                            " END$dblock$");
  return r;
}

bool routine_missing(PGresult* r) {
  // 42883: no such function; 3F000: the server session has no temporary schema yet.
  return is_sqlstate(r, "42883") || is_sqlstate(r, "3F000");
}

sql_result executor::run_routine(PGconn* c, state& cs, const statement& st,
                                 const std::vector<sql_param>& values,
                                 const std::vector<const char*>& ptrs) const {
  const std::string positional = to_positional(st.text, st.params);
  // A simple query with the values as escaped, typed literals: one message for the pooler to
  // pass on instead of five, measurably faster through it than the extended protocol.
  const routine rt = make_routine(c, st.key, positional, values);
  PGresult* r = PQexec(c, rt.call.c_str());
  if (ok(r)) return routine_result(result_ptr(r, PQclear).get(), rt.returns_rows);
  if (!routine_missing(r)) fail(c, r);
  PQclear(r);
  // Missing on this server session: nothing ran. Create it and run the statement in one simple
  // query (one implicit transaction, so both or neither).
  r = PQexec(c, (rt.create + ";\n" + rt.call).c_str());
  if (ok(r)) return routine_result(result_ptr(r, PQclear).get(), rt.returns_rows);
  if (!is_sqlstate(r, "42501")) fail(c, r);
  // No TEMP privilege on the database: nothing ran; unnamed statements from now on.
  PQclear(r);
  cs.routines_refused = true;
  r = PQexecParams(c, positional.c_str(), static_cast<int>(ptrs.size()), nullptr, ptrs.data(),
                   nullptr, nullptr, 0);
  if (!ok(r)) fail(c, r);
  return collect(result_ptr(r, PQclear).get());
}

namespace {

// The name `st` is prepared under on a connection of state `cs`, or empty: not prepared. A name
// carries a hash of the statement's text (table prefix included): two connections that meet one
// server session (a transaction-mode pooler the URL does not declare) can only collide on the
// same SQL, never run each other's statement on other tables. A caller statement is named so
// too, while its connection has room for more.
std::string name_on(const state& cs, const statement& st) {
  if (st.caller) {
    const auto it = cs.caller_names.find(st.text);
    if (it != cs.caller_names.end()) return it->second;
    if (cs.caller_names.size() < caller_statement_cache)
      return "dblock_caller_" + hash_hex(st.text);
    return {};
  }
  return st.key.empty() ? std::string() : prepared_name(st);
}

}  // namespace

sql_result executor::run(exec_session& s, const statement& st,
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
  auto& cs = static_cast<state&>(s.state());
  // Behind a transaction-mode pooler: routines or unnamed statements (see the top of the file).
  // A routine that may be missing is only called outside a transaction, whose failure costs
  // nothing.
  if (cs.transaction_pooler && st.routine && !cs.routines_refused &&
      PQtransactionStatus(c) == PQTRANS_IDLE)
    return run_routine(c, cs, st, values, ptrs);
  const std::string name = name_on(cs, st);
  if (name.empty() || cs.transaction_pooler) {
    const std::string positional = to_positional(st.text, st.params);
    PGresult* r = PQexecParams(c, positional.c_str(), n, nullptr, ptrs.data(), nullptr, nullptr, 0);
    if (!ok(r)) fail(c, r);
    return collect(result_ptr(r, PQclear).get());
  }
  auto& prepared = cs.prepared;
  for (int attempt = 0;; ++attempt) {
    if (!prepared.count(name)) {
      PGresult* r =
          PQprepare(c, name.c_str(), to_positional(st.text, st.params).c_str(), n, nullptr);
      if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) fail(c, r);
      PQclear(r);
      prepared.insert(name);
      if (st.caller) cs.caller_names.emplace(st.text, name);
    }
    PGresult* r = PQexecPrepared(c, name.c_str(), n, ptrs.data(), nullptr, nullptr, 0);
    if (ok(r)) return collect(result_ptr(r, PQclear).get());
    if (is_sqlstate(r, "26000")) {
      // The server forgot the statement (DISCARD ALL by a pooler, or the caller's own): it did
      // not run, and this connection prepares it again when next used.
      prepared.erase(name);
      // Outside a transaction it is prepared again at once. Not inside one, which the failure
      // has aborted: a second try would only meet "current transaction is aborted" and hide
      // this error (the classifier's pooler hint).
      if (attempt == 0 && PQtransactionStatus(c) == PQTRANS_IDLE) {
        PQclear(r);
        continue;
      }
    }
    fail(c, r);
  }
}

std::string hash_hex(const std::string& text) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016" PRIx64, h);
  return out;
}

std::string prepared_name(const statement& st) {
  return "dblock_" + st.key + "_" + hash_hex(st.text);
}

}  // namespace dblock::detail::pg
