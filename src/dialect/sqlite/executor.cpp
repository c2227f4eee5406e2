// Statements on dblock's tables through the sqlite3 C API, prepared once per connection
// (SQLITE_PREPARE_PERSISTENT) and reused: SOCI prepares and finalizes a one-time query on every
// call. Statements without a cache key are prepared, run and finalized.
#include "backend.hpp"

namespace dblock::detail::lite {
namespace {

// One execution of a statement; always reset, so no read transaction stays open.
struct stmt_run {
  sqlite3* db;
  sqlite3_stmt* stmt;
  bool owned;
  stmt_run(sqlite3* d, sqlite3_stmt* s, bool o) : db(d), stmt(s), owned(o) {}
  stmt_run(const stmt_run&) = delete;
  stmt_run& operator=(const stmt_run&) = delete;
  ~stmt_run() {
    if (owned) {
      sqlite3_finalize(stmt);
      return;
    }
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
  }
  void bind(const std::string& param, const sql_param& v) {
    const std::string key = ":" + param;
    const int i = sqlite3_bind_parameter_index(stmt, key.c_str());
    if (i == 0) throw error(errc::backend_error, "internal: no parameter " + key);
    int rc = SQLITE_OK;
    if (std::holds_alternative<long long>(v)) {
      rc = sqlite3_bind_int64(stmt, i, std::get<long long>(v));
    } else {
      const std::string& s = std::get<std::string>(v);
      rc = sqlite3_bind_text(stmt, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
    }
    if (rc != SQLITE_OK) fail(db, rc);
  }
  std::optional<std::string> cell(int col) {
    switch (sqlite3_column_type(stmt, col)) {
      case SQLITE_NULL:
        return std::nullopt;
      case SQLITE_INTEGER:
        return std::to_string(sqlite3_column_int64(stmt, col));
      default:
        return std::string(reinterpret_cast<const char*>(sqlite3_column_text(stmt, col)),
                           static_cast<std::size_t>(sqlite3_column_bytes(stmt, col)));
    }
  }
};

}  // namespace

void fail(sqlite3* db, int rc) {
  throw soci::sqlite3_soci_error(std::string("sqlite3: ") + sqlite3_errmsg(db), rc);
}

state::~state() {
  for (auto& kv : stmts)
    sqlite3_finalize(kv.second);  // before the connection closes, or it cannot
}

sqlite3_stmt* state::get(const std::string& key, const std::string& text) const {
  auto it = stmts.find(key);
  if (it != stmts.end()) return it->second;
  sqlite3_stmt* s = nullptr;
  int rc = sqlite3_prepare_v3(db, text.c_str(), static_cast<int>(text.size()),
                              SQLITE_PREPARE_PERSISTENT, &s, nullptr);
  if (rc != SQLITE_OK) fail(db, sqlite3_extended_errcode(db));
  stmts.emplace(key, s);
  return s;
}

void state::exec(const std::string& key, const char* text) const {
  sqlite3_stmt* s = get(key, text);
  int rc = sqlite3_step(s);
  sqlite3_reset(s);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) fail(db, sqlite3_extended_errcode(db));
}

sql_result executor::run(exec_session& s, const statement& st,
                         const std::vector<sql_param>& values) const {
  auto& c = static_cast<state&>(s.state());
  sqlite3_stmt* prepared = nullptr;
  // A caller statement is cached under its text, once there is room.
  std::string key = st.caller ? "caller:" + st.text : st.key;
  const bool new_caller = st.caller && !c.stmts.count(key);
  if (new_caller && c.caller_stmts >= caller_statement_cache) key.clear();
  if (key.empty()) {
    int rc = sqlite3_prepare_v2(c.db, st.text.c_str(), static_cast<int>(st.text.size()), &prepared,
                                nullptr);
    if (rc != SQLITE_OK) fail(c.db, sqlite3_extended_errcode(c.db));
  } else {
    prepared = c.get(key, st.text);
    if (new_caller) ++c.caller_stmts;
  }
  stmt_run r(c.db, prepared, key.empty());
  for (std::size_t i = 0; i < st.params.size() && i < values.size(); ++i)
    r.bind(st.params[i], values[i]);
  sql_result out;
  const int cols = sqlite3_column_count(prepared);
  for (;;) {
    const int rc = sqlite3_step(prepared);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) fail(c.db, sqlite3_extended_errcode(c.db));
    std::vector<std::optional<std::string>> row;
    for (int j = 0; j < cols; ++j)
      row.push_back(r.cell(j));
    out.rows.push_back(std::move(row));
  }
  out.affected = cols > 0 ? static_cast<long long>(out.rows.size()) : sqlite3_changes(c.db);
  return out;
}

namespace {

// Back to the connection's own durability after an unflushed commit (or its failure). SQLite
// refuses to change it inside a transaction, hence before BEGIN and after COMMIT; a connection
// that could not go back is closed, never used for a grant that would not wait for the disk.
void restore_synchronous(exec_session& s, state& c) noexcept {
  if (!c.relaxed) return;
  const std::string sql = "PRAGMA synchronous = " + std::to_string(c.synchronous);
  if (sqlite3_exec(c.db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) s.mark_broken();
  c.relaxed = false;
}

}  // namespace

void executor::begin_statement(exec_session& s, bool no_flush_wait) const {
  auto& c = static_cast<state&>(s.state());
  restore_synchronous(s, c);  // never left lowered, whatever ended the last such write
  c.own_write = sqlite3_get_autocommit(c.db) != 0;  // inside a caller's transaction: join it
  if (!c.own_write) return;
  // A release's or a waiter-queue write's commit skips the sync of the WAL (WAL mode with
  // NORMAL; in a rollback journal NORMAL could cost more than the write, so nothing changes
  // there). A process crash loses nothing; an OS crash or power loss, which ends every process
  // that could hold a lease on this file or wait for one too, can undo it: a lease then runs
  // out at its TTL, a queue entry belonged to a waiter that died with the host. The next
  // grant's commit syncs the WAL, these frames with it.
  try {
    if (no_flush_wait && c.wal && c.synchronous > 1) {
      c.relaxed = true;
      c.exec("relax", "PRAGMA synchronous = NORMAL");
    }
    c.exec("begin", "BEGIN IMMEDIATE");
  } catch (...) {
    restore_synchronous(s, c);
    throw;
  }
}

void executor::commit_statement(exec_session& s) const {
  auto& c = static_cast<state&>(s.state());
  try {
    if (c.own_write) c.exec("commit", "COMMIT");
  } catch (...) {
    if (sqlite3_get_autocommit(c.db)) restore_synchronous(s, c);  // else at the rollback
    throw;
  }
  c.own_write = false;
  restore_synchronous(s, c);
}

void executor::rollback_statement(exec_session& s) const noexcept {
  auto& c = static_cast<state&>(s.state());
  if (c.own_write && !sqlite3_get_autocommit(c.db)) {
    sqlite3_exec(c.db, "ROLLBACK", nullptr, nullptr, nullptr);
    if (!sqlite3_get_autocommit(c.db)) s.mark_broken();  // still inside it: never reused
  }
  c.own_write = false;
  restore_synchronous(s, c);
}

}  // namespace dblock::detail::lite
