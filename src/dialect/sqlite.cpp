// SQLite: one writer at a time per database file. The clock is the calling process's
// (dblock_now_us(), registered on each connection, microsecond precision), timestamps are
// INTEGER microseconds since the epoch, writes run in BEGIN IMMEDIATE so that they wait on the
// busy timeout instead of failing on a stale WAL snapshot.
#include <soci/soci.h>
#include <soci/sqlite3/soci-sqlite3.h>

#include <chrono>
#include <map>
#include <memory>

#include "common.hpp"
#include "dialect.hpp"

namespace dblock::detail {
namespace {

// SOCI includes sqlite3.h inside namespace sqlite_api.
using namespace sqlite_api;

sqlite3* raw(soci::session& sql) {
  return static_cast<soci::sqlite3_session_backend*>(sql.get_backend())->conn_;
}

void now_us_fn(sqlite3_context* ctx, int, sqlite3_value**) {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  sqlite3_result_int64(ctx, std::chrono::duration_cast<std::chrono::microseconds>(now).count());
}

class sqlite_dialect final : public dialect {
 public:
  const char* name() const noexcept override { return "sqlite"; }
  const soci::backend_factory& factory() const override { return *soci::factory_sqlite3(); }

  std::string connect_string(const parsed_url& u, const database_options&) const override {
    check_query_keys(u, {"synchronous", "busy_timeout"});
    if (u.query.count("synchronous")) {
      const auto& v = u.query.at("synchronous");
      if (v != "full" && v != "normal" && v != "extra")
        throw error(errc::invalid_argument, "invalid database URL '" + u.redacted +
                                                "': synchronous must be full, normal or extra");
    }
    if (u.query.count("busy_timeout")) {
      const auto& v = u.query.at("busy_timeout");
      if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
        throw error(errc::invalid_argument,
                    "invalid database URL '" + u.redacted + "': busy_timeout must be milliseconds");
    }
    // SOCI's SQLite parser takes double quotes around values with spaces; a double quote in a
    // path cannot be expressed, so refuse it rather than open another file.
    if (u.path.find('"') != std::string::npos)
      throw error(errc::invalid_argument,
                  "invalid database URL '" + u.redacted + "': the path contains '\"'");
    return "db=\"" + u.path + "\"" +
           (u.query.count("synchronous") ? " synchronous=" + u.query.at("synchronous") : "");
  }

  void adjust_options(const parsed_url& u, database_options& o) const override {
    if (u.query.count("busy_timeout"))
      o.sqlite_busy_timeout = std::chrono::milliseconds(std::stoll(u.query.at("busy_timeout")));
  }

  void on_connect(soci::session& sql, const database_options& o) const override {
    sqlite3* db = raw(sql);
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_timeout(db, static_cast<int>(o.sqlite_busy_timeout.count()));
    sqlite3_create_function(db, "dblock_now_us", 0, SQLITE_UTF8, nullptr, now_us_fn, nullptr,
                            nullptr);
    std::string mode;
    sql << "PRAGMA journal_mode=WAL", soci::into(mode);
  }

  // One writer at a time: every transaction is serializable.
  std::string isolation_sql(isolation_level) const override { return {}; }

  // SQLite's LIKE ignores ASCII case; GLOB compares exactly and speaks `*` and `?` already.
  std::string name_pattern_sql(const std::string& column, const std::string& param) const override {
    return column + " GLOB :" + param;
  }
  std::string name_pattern_value(const std::string& glob) const override {
    // Only `*` and `?` are special in dblock's patterns: a literal '[' is "[[]" in GLOB.
    std::string out;
    for (char c : glob)
      out += c == '[' ? std::string("[[]") : std::string(1, c);
    return out;
  }

  // SOCI reads columns declared INTEGER through sqlite3_column_int: 32 bits, silently cut. So
  // user values travel as tagged text ('i' integer, 'r' real with 17 digits, 't' text) and are
  // decoded exactly; NULL stays NULL.
  std::string select_value_sql(const std::string& column) const override {
    const std::string c = quote(column);
    return "CASE typeof(" + c + ") WHEN 'integer' THEN 'i' || " + c +
           " WHEN 'real' THEN 'r' || printf('%!.17g', " + c +
           ") WHEN 'null' THEN NULL ELSE 't' || " + "CAST(" + c + " AS TEXT) END AS " + c;
  }
  value decode_value(const soci::row& r, std::size_t i) const override {
    if (r.get_indicator(i) == soci::i_null) return std::monostate{};
    const std::string s = r.get<std::string>(i);
    if (s.empty()) return std::string();
    if (s[0] == 'i') return std::stoll(s.substr(1));
    if (s[0] == 'r') return std::stod(s.substr(1));
    return s.substr(1);
  }

  std::string now_sql() const override { return "dblock_now_us()"; }
  std::string plus_us_sql(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + :" + param + ")";
  }
  std::string epoch_us_sql(const std::string& ts) const override { return ts; }
  std::string begin_write_sql() const override { return "BEGIN IMMEDIATE"; }
  bool in_transaction(soci::session& sql) const override {
    return sqlite3_get_autocommit(raw(sql)) == 0;
  }
  std::string for_update_sql() const override { return ""; }
  std::string for_update_nowait_sql() const override { return ""; }
  std::string for_update_skip_locked_sql() const override { return ""; }

  void set_lock_timeout(soci::session& sql, std::chrono::milliseconds ms) const override {
    sqlite3_busy_timeout(raw(sql), static_cast<int>(ms.count()));
  }

  void begin_transaction(soci::session& sql, std::chrono::milliseconds ms) const override {
    // The wait for SQLite's single write lock happens here, not at the row.
    set_lock_timeout(sql, ms);
    sql << "BEGIN IMMEDIATE";
  }
  void end_transaction(soci::session& sql, const database_options& o) const override {
    set_lock_timeout(sql, o.sqlite_busy_timeout);
  }
  bool has_unique_index(soci::session& sql, const std::string& table,
                        const std::string& column) const override {
    int n = 0;
    // A unique, non-partial index on exactly this column, or a one-column primary key.
    sql << "SELECT (SELECT count(*) FROM pragma_index_list(:t) il"
           " WHERE il.\"unique\" = 1 AND il.partial = 0"
           " AND (SELECT count(*) FROM pragma_index_info(il.name)) = 1"
           " AND (SELECT name FROM pragma_index_info(il.name)) = :c)"
           " + (SELECT count(*) FROM pragma_table_info(:t2) WHERE name = :c2 AND pk = 1"
           " AND (SELECT count(*) FROM pragma_table_info(:t3) WHERE pk > 0) = 1)",
        soci::use(table, "t"), soci::use(column, "c"), soci::use(table, "t2"),
        soci::use(column, "c2"), soci::use(table, "t3"), soci::into(n);
    return n > 0;
  }

  error classify_current(const std::string& what) const override {
    rethrow_if_dblock_error();
    try {
      throw;
    } catch (const soci::sqlite3_soci_error& e) {
      int rc = e.result();
      std::string msg = one_line(e.get_error_message());
      errc code = errc::backend_error;
      switch (rc) {
        case SQLITE_BUSY_SNAPSHOT:
          code = errc::serialization_failure;
          break;
        case SQLITE_CONSTRAINT_UNIQUE:
        case SQLITE_CONSTRAINT_PRIMARYKEY:
          code = errc::unique_violation;
          break;
        case SQLITE_CONSTRAINT_CHECK:
          code = errc::invalid_argument;
          break;
        case SQLITE_INTERRUPT:
          code = errc::cancelled;
          break;
        case SQLITE_CANTOPEN:
          code = errc::connection_failed;
          break;
        default:
          if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
            code = errc::lock_not_available;
          else if (contains_nocase(msg, "no such table"))
            code = errc::schema_missing;
          else if (contains_nocase(msg, "database is locked"))
            code = errc::lock_not_available;
          break;
      }
      return error(code, what + ": " + msg, name(), "", rc);
    } catch (const soci::soci_error& e) {
      std::string msg = one_line(e.get_error_message());
      errc code = contains_nocase(msg, "no such table")        ? errc::schema_missing
                  : contains_nocase(msg, "database is locked") ? errc::lock_not_available
                                                               : errc::backend_error;
      return error(code, what + ": " + msg, name(), "", 0);
    } catch (const std::exception& e) {
      return error(errc::backend_error, what + ": " + one_line(e.what()), name(), "", 0);
    }
  }

  // Every migration runs in BEGIN IMMEDIATE, which already excludes other writers.
  void lock_migrations(soci::session&, const std::string&) const override {}
  void unlock_migrations(soci::session&, const std::string&) const override {}
  bool table_exists(soci::session& sql, const std::string& table) const override {
    int n = 0;
    sql << "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = :t",
        soci::use(table), soci::into(n);
    return n > 0;
  }
  const std::vector<migration_file>& migrations() const override {
    static const auto files = load_migrations("sqlite");
    return files;
  }
  const migration_file& bootstrap() const override {
    static const auto file = load_bootstrap("sqlite");
    return file;
  }

  void atomic_write(soci::session& sql, const std::function<void()>& body) const override {
    if (auto* st = dynamic_cast<sqlite_state*>(state_of(sql))) {
      st->write(body);  // BEGIN IMMEDIATE and COMMIT prepared once per connection
      return;
    }
    sql << "BEGIN IMMEDIATE";
    try {
      body();
      sql << "COMMIT";
    } catch (...) {
      try {
        sql << "ROLLBACK";
      } catch (...) {
      }
      throw;
    }
  }

  lease_statements lease_sql(const table_names& t) const override {
    lease_statements s = common_lease_sql(t);
    s.write_transaction = true;
    const std::string reentry =
        "(owner_token = excluded.owner_token AND expires_at > excluded.acquired_at AND "
        "hold_count > 0)";
    s.acquire = "INSERT INTO " + t.lock +
                " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
                " holder_host, holder_pid, holder_thread) VALUES (:name, :token, COALESCE((SELECT"
                " max_fence FROM " +
                t.floor + " WHERE id = 1), 0) + 1, 1, " + now_sql() + ", " +
                plus_us_sql(now_sql(), "ttl") +
                ", :host, :pid, :thread) ON CONFLICT (resource_name) DO UPDATE SET"
                " fence = CASE WHEN " +
                reentry + " THEN fence ELSE fence + 1 END, hold_count = CASE WHEN " + reentry +
                " THEN hold_count + 1 ELSE 1 END, acquired_at = CASE WHEN " + reentry +
                " THEN acquired_at ELSE excluded.acquired_at END,"
                " owner_token = excluded.owner_token, expires_at = excluded.expires_at,"
                " holder_host = excluded.holder_host, holder_pid = excluded.holder_pid,"
                " holder_thread = excluded.holder_thread"
                " WHERE owner_token = excluded.owner_token OR expires_at <= excluded.acquired_at"
                " OR hold_count = 0"
                " RETURNING fence";
    return s;
  }

  // The lease statements (and BEGIN IMMEDIATE / COMMIT) are prepared once per connection and
  // reused: SOCI prepares and finalizes a one-time query on every call.
  std::unique_ptr<connection_state> make_connection_state(soci::session& sql) const override {
    return std::make_unique<sqlite_state>(raw(sql));
  }

  std::optional<std::int64_t> lease_acquire(soci::session& sql, const table_names& t,
                                            const acquire_params& p) const override {
    auto* st = dynamic_cast<sqlite_state*>(state_of(sql));
    std::optional<std::int64_t> out;
    if (!st) {
      long long ttl = p.ttl_us, pid = p.holder_pid, fence = 0;
      soci::indicator ind = soci::i_null;
      atomic_write(sql, [&] {
        sql << lease_sql(t).acquire, soci::use(p.name, "name"), soci::use(p.owner_token, "token"),
            soci::use(ttl, "ttl"), soci::use(p.holder_host, "host"), soci::use(pid, "pid"),
            soci::use(p.holder_thread, "thread"), soci::into(fence, ind);
        if (sql.got_data() && ind != soci::i_null) out = fence;
      });
      return out;
    }
    st->write([&] {
      stmt_run r(*st, st->get("acquire", [&] { return lease_sql(t).acquire; }));
      r.bind(":name", p.name);
      r.bind(":token", p.owner_token);
      r.bind(":ttl", p.ttl_us);
      r.bind(":host", p.holder_host);
      r.bind(":pid", p.holder_pid);
      r.bind(":thread", p.holder_thread);
      if (r.step() && sqlite3_column_type(r.stmt, 0) != SQLITE_NULL)
        out = sqlite3_column_int64(r.stmt, 0);
    });
    return out;
  }
  bool lease_renew(soci::session& sql, const table_names& t, const std::string& name,
                   const std::string& token, std::int64_t fence,
                   std::int64_t ttl_us) const override {
    bool ok = false;
    auto* st = dynamic_cast<sqlite_state*>(state_of(sql));
    if (!st) {
      atomic_write(sql, [&] { ok = dialect::lease_renew(sql, t, name, token, fence, ttl_us); });
      return ok;
    }
    st->write([&] {
      stmt_run r(*st, st->get("renew", [&] { return lease_sql(t).renew; }));
      r.bind(":ttl", ttl_us);
      r.bind(":name", name);
      r.bind(":token", token);
      r.bind(":fence", fence);
      r.step();
      ok = sqlite3_changes(st->db) == 1;
    });
    return ok;
  }
  bool lease_release(soci::session& sql, const table_names& t, const std::string& name,
                     const std::string& token, std::int64_t fence) const override {
    bool ok = false;
    auto* st = dynamic_cast<sqlite_state*>(state_of(sql));
    if (!st) {
      atomic_write(sql, [&] { ok = dialect::lease_release(sql, t, name, token, fence); });
      return ok;
    }
    st->write([&] {
      stmt_run r(*st, st->get("release", [&] { return lease_sql(t).release; }));
      r.bind(":name", name);
      r.bind(":token", token);
      r.bind(":fence", fence);
      r.step();
      ok = sqlite3_changes(st->db) == 1;
    });
    return ok;
  }

 private:
  // Throws what SOCI would throw, so classify_current() treats both paths alike.
  [[noreturn]] static void fail(sqlite3* db, int rc) {
    throw soci::sqlite3_soci_error(std::string("sqlite3: ") + sqlite3_errmsg(db), rc);
  }

  struct sqlite_state final : connection_state {
    sqlite3* db;
    std::map<std::string, sqlite3_stmt*> stmts;  // by purpose; the tables never change
    explicit sqlite_state(sqlite3* d) : db(d) {}
    ~sqlite_state() override {
      for (auto& kv : stmts)
        sqlite3_finalize(kv.second);  // before the connection closes, or it cannot
    }
    template <class Text>
    sqlite3_stmt* get(const std::string& key, Text&& text) {
      auto it = stmts.find(key);
      if (it != stmts.end()) return it->second;
      const std::string sql = text();
      sqlite3_stmt* s = nullptr;
      int rc = sqlite3_prepare_v3(db, sql.c_str(), static_cast<int>(sql.size()),
                                  SQLITE_PREPARE_PERSISTENT, &s, nullptr);
      if (rc != SQLITE_OK) fail(db, sqlite3_extended_errcode(db));
      stmts.emplace(key, s);
      return s;
    }
    void exec(const char* key, const char* sql) {
      sqlite3_stmt* s = get(key, [&] { return std::string(sql); });
      int rc = sqlite3_step(s);
      sqlite3_reset(s);
      if (rc != SQLITE_DONE && rc != SQLITE_ROW) fail(db, sqlite3_extended_errcode(db));
    }
    // Runs body inside BEGIN IMMEDIATE ... COMMIT (rolled back when it throws).
    template <class Body>
    void write(Body&& body) {
      exec("begin", "BEGIN IMMEDIATE");
      try {
        body();
        exec("commit", "COMMIT");
      } catch (...) {
        if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    }
  };

  // One execution of a cached statement; always reset, so no read transaction stays open.
  struct stmt_run {
    sqlite_state& st;
    sqlite3_stmt* stmt;
    stmt_run(sqlite_state& s, sqlite3_stmt* p) : st(s), stmt(p) {}
    stmt_run(const stmt_run&) = delete;
    stmt_run& operator=(const stmt_run&) = delete;
    ~stmt_run() {
      sqlite3_reset(stmt);
      sqlite3_clear_bindings(stmt);
    }
    void bind(const char* param, const std::string& v) {
      check(sqlite3_bind_text(stmt, index(param), v.data(), static_cast<int>(v.size()),
                              SQLITE_STATIC));
    }
    void bind(const char* param, std::int64_t v) {
      check(sqlite3_bind_int64(stmt, index(param), v));
    }
    bool step() {
      int rc = sqlite3_step(stmt);
      if (rc == SQLITE_ROW) return true;
      if (rc == SQLITE_DONE) return false;
      fail(st.db, sqlite3_extended_errcode(st.db));
    }

   private:
    int index(const char* param) {
      int i = sqlite3_bind_parameter_index(stmt, param);
      if (i == 0) throw error(errc::backend_error, std::string("internal: no parameter ") + param);
      return i;
    }
    void check(int rc) {
      if (rc != SQLITE_OK) fail(st.db, rc);
    }
  };
};

}  // namespace

const dialect& sqlite_dialect_instance() {
  static const sqlite_dialect d;
  return d;
}

}  // namespace dblock::detail
