// MySQL / MariaDB: UTC_TIMESTAMP(6) as the clock (constant within a statement), INSERT ... ON
// DUPLICATE KEY UPDATE for acquire with the fence returned through LAST_INSERT_ID(expr) in the
// OK packet (no second round trip), errno-based classification, GET_LOCK around migrations.
#include <soci/mysql/soci-mysql.h>
#include <soci/soci.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common.hpp"
#include "dialect.hpp"

namespace dblock::detail {
namespace {

class mysql_dialect final : public dialect {
 public:
  const char* name() const noexcept override { return "mysql"; }
  const soci::backend_factory& factory() const override { return *soci::factory_mysql(); }

  std::string connect_string(const parsed_url& u, const database_options& o) const override {
    check_query_keys(u, {"unix_socket", "charset", "connect_timeout", "read_timeout",
                         "write_timeout", "sslca", "sslcert", "sslkey"});
    std::string s;
    auto add = [&s](const std::string& k, const std::string& v) {
      s += (s.empty() ? "" : " ") + k + "=" + conn_quote(v);
    };
    add("host", u.host.empty() ? std::string("localhost") : u.host);
    if (u.port) add("port", std::to_string(*u.port));
    add("db", u.path);
    if (!u.user.empty()) add("user", u.user);
    if (u.password) add("password", *u.password);
    if (!u.query.count("charset")) add("charset", "utf8mb4");
    if (!u.query.count("connect_timeout"))
      add("connect_timeout", std::to_string(ceil_seconds(o.connect_timeout, 1)));
    for (const auto& kv : u.query)
      add(kv.first, kv.second);
    return s;
  }

  void identify_session(soci::session& sql, connection_state& st) const override {
    long long id = 0;
    std::string host;
    sql << "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()",
        soci::into(id), soci::into(host);
    st.session_id = id;
    st.session_tag = host;  // "address:port" of this client as the server sees it
  }

  bool end_session(soci::session& sql, const session_ref& s,
                   std::chrono::milliseconds timeout) const override {
    if (s.id == 0 || s.tag.empty()) return false;
    std::string host = s.tag;
    const std::string id = std::to_string(s.id);  // an integer: safe to splice (KILL takes no
                                                  // parameters)
    const std::string match =
        " FROM information_schema.PROCESSLIST WHERE ID = " + id + " AND HOST = :host";
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int n = 0;
    sql << "SELECT COUNT(*)" << match, soci::use(host, "host"), soci::into(n);
    if (n > 0) {
      try {
        sql << "KILL CONNECTION " << id;
      } catch (const soci::soci_error&) {
        // 1094: it ended meanwhile. Anything else (no permission): the wait below decides.
      }
    }
    for (auto pause = std::chrono::milliseconds(1);;
         pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      sql << "SELECT COUNT(*)" << match, soci::use(host, "host"), soci::into(n);
      if (n == 0) return true;  // gone: its statement has committed or rolled back
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
    }
  }

  void on_connect(soci::session& sql, const database_options&) const override {
    // Strict mode: an over-long value is an error, never silently truncated.
    sql << "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''),"
           " 'STRICT_ALL_TABLES')";
  }

  std::string quote(std::string_view ident) const override {
    return "`" + std::string(ident) + "`";
  }

  // Names are VARBINARY, where LIKE's '_' matches one byte; compare as UTF-8 text, exactly,
  // so that '?' matches one character like on the other backends.
  std::string name_pattern_sql(const std::string& column, const std::string& param) const override {
    return "CONVERT(" + column + " USING utf8mb4) COLLATE utf8mb4_bin LIKE :" + param +
           " ESCAPE '!'";
  }

  std::string now_sql() const override { return "UTC_TIMESTAMP(6)"; }
  std::string plus_us_sql(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + INTERVAL :" + param + " MICROSECOND)";
  }
  std::string epoch_us_sql(const std::string& ts) const override {
    return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + ts + ")";
  }

  void set_lock_timeout(soci::session& sql, std::chrono::milliseconds ms) const override {
    // InnoDB counts whole seconds. 0 would mean "do not wait", but MariaDB 10.11 then fails
    // statements with "Got error 1 'Operation not permitted' during COMMIT", so the shortest
    // wait is one second (NOWAIT and SKIP LOCKED, which dblock uses for "do not wait", are
    // unaffected).
    sql << "SET SESSION innodb_lock_wait_timeout = " << ceil_seconds(ms, 1);
  }

  // Not INSERT IGNORE: it would turn real errors (a too-long value) into warnings.
  std::string insert_if_absent_suffix() const override {
    return " ON DUPLICATE KEY UPDATE resource_name = resource_name";
  }

  void ensure_lock_row(soci::session& sql, const table_names& t, const std::string& name,
                       std::chrono::milliseconds lock_timeout) const override {
    if (lock_row_exists(sql, t, name)) return;
    // Only a concurrent creator of the same absent row can make this insert wait, briefly.
    set_lock_timeout(sql, lock_timeout);
    insert_lock_row(sql, t, name);
  }

  bool in_transaction(soci::session& sql) const override {
    auto* backend = static_cast<soci::mysql_session_backend*>(sql.get_backend());
    return (backend->conn_->server_status & SERVER_STATUS_IN_TRANS) != 0;
  }

  void end_transaction(soci::session& sql, const database_options&) const override {
    // begin_transaction() set the session's lock wait; give the pooled connection its default
    // back so that later users (lease statements, plain queries) do not inherit it.
    sql << "SET SESSION innodb_lock_wait_timeout = DEFAULT";
  }

  bool has_unique_index(soci::session& sql, const std::string& table,
                        const std::string& column) const override {
    int n = 0;
    sql << "SELECT count(*) FROM information_schema.statistics s"
           " WHERE s.table_schema = DATABASE() AND s.table_name = :t AND s.column_name = :c"
           " AND s.non_unique = 0 AND s.seq_in_index = 1 AND NOT EXISTS (SELECT 1 FROM"
           " information_schema.statistics s2 WHERE s2.table_schema = s.table_schema"
           " AND s2.table_name = s.table_name AND s2.index_name = s.index_name"
           " AND s2.seq_in_index = 2)",
        soci::use(table, "t"), soci::use(column, "c"), soci::into(n);
    return n > 0;
  }

  error classify_current(const std::string& what) const override {
    rethrow_if_dblock_error();
    try {
      throw;
    } catch (const soci::mysql_soci_error& e) {
      unsigned n = e.err_num_;
      errc code = errc::backend_error;
      switch (n) {
        case 1062:
          code = errc::unique_violation;
          break;
        case 1213:
          code = errc::deadlock;
          break;
        case 1020:  // MariaDB: record changed since last read (innodb_snapshot_isolation)
          code = errc::serialization_failure;
          break;
        case 1205:  // lock wait timeout (also MariaDB's NOWAIT)
        case 3572:  // MySQL 8 NOWAIT
          code = errc::lock_not_available;
          break;
        case 2006:  // server has gone away
        case 2013:  // lost connection during query
        case 2055:  // lost connection (system error)
        case 1927:  // MariaDB: connection was killed
        case 1053:  // server shutdown in progress
        case 4031:  // MySQL 8: disconnected by the server
          code = errc::connection_lost;
          break;
        case 1045:
        case 1044:
        case 1049:
        case 2002:
        case 2003:
        case 2005:
          code = errc::connection_failed;
          break;
        case 1146:
          code = errc::schema_missing;
          break;
        case 1406:
          code = errc::invalid_argument;
          break;
        case 1969:  // MariaDB max_statement_time
        case 3024:  // MySQL max_execution_time
          code = errc::timeout;
          break;
        default:
          break;
      }
      return error(code, what + ": " + one_line(e.get_error_message()), name(), "",
                   static_cast<long long>(n));
    } catch (const soci::soci_error& e) {
      errc code = e.get_error_category() == soci::soci_error::connection_error
                      ? errc::connection_lost
                      : errc::backend_error;
      return error(code, what + ": " + one_line(e.get_error_message()), name(), "", 0);
    } catch (const std::exception& e) {
      return error(errc::backend_error, what + ": " + one_line(e.what()), name(), "", 0);
    }
  }

  void lock_migrations(soci::session& sql, const std::string& key) const override {
    // GET_LOCK names are at most 64 characters; the key is ours and short.
    soci::indicator ind = soci::i_ok;
    int got = 0;
    sql << "SELECT GET_LOCK(:k, 600)", soci::use(key), soci::into(got, ind);
    if (ind == soci::i_null || got != 1)
      throw error(errc::timeout, "migrate: could not take the migration lock '" + key +
                                     "' within 600 s (another migrator is stuck?)");
  }
  void unlock_migrations(soci::session& sql, const std::string& key) const override {
    soci::indicator ind = soci::i_ok;
    int released = 0;
    sql << "SELECT RELEASE_LOCK(:k)", soci::use(key), soci::into(released, ind);
  }
  bool table_exists(soci::session& sql, const std::string& table) const override {
    int n = 0;
    sql << "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
           " AND table_name = :t",
        soci::use(table), soci::into(n);
    return n > 0;
  }
  const std::vector<migration_file>& migrations() const override {
    static const auto files = load_migrations("mysql");
    return files;
  }
  const migration_file& bootstrap() const override {
    static const auto file = load_bootstrap("mysql");
    return file;
  }

  lease_statements lease_sql(const table_names& t) const override {
    lease_statements s = common_lease_sql(t);
    // ON DUPLICATE KEY UPDATE has no WHERE, and MySQL assigns left to right, so every column
    // is an IF() on conditions over owner_token, hold_count and expires_at, and those three are
    // assigned last in an order that keeps the conditions true for the columns after them:
    // owner_token first (once the owner is ours, "ours" stays true), then hold_count (its
    // reentry test still sees the old expires_at), then expires_at. A released row
    // (hold_count 0) is free whatever the clock says, also after the clock stepped back.
    // The fence comes back via LAST_INSERT_ID(expr), which mysql_insert_id() reads from the OK
    // packet: the new fence when acquired, 0 when held by another owner. SOCI connects with
    // CLIENT_FOUND_ROWS, so affected rows cannot tell "held" from "inserted"; the id can.
    const std::string now = now_sql();
    const std::string ours = "owner_token = VALUES(owner_token)";
    const std::string reentry = "(" + ours + " AND expires_at > " + now + " AND hold_count > 0)";
    const std::string take = "(" + ours + " OR expires_at <= " + now + " OR hold_count = 0)";
    s.acquire =
        "INSERT INTO " + t.lock +
        " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
        " holder_host, holder_pid, holder_thread) VALUES (:name, :token,"
        " LAST_INSERT_ID(COALESCE((SELECT max_fence FROM " +
        t.floor + " WHERE id = 1), 0) + 1), 1, " + now + ", " + plus_us_sql(now, "ttl") +
        ", :host, :pid, :thread) ON DUPLICATE KEY UPDATE" + " fence = IF(" + take +
        ", LAST_INSERT_ID(IF(" + reentry + ", fence, fence + 1)), fence + LAST_INSERT_ID(0))," +
        " acquired_at = IF(" + reentry + ", acquired_at, IF(" + take + ", " + now +
        ", acquired_at))," + " holder_host = IF(" + take + ", VALUES(holder_host), holder_host)," +
        " holder_pid = IF(" + take + ", VALUES(holder_pid), holder_pid)," + " holder_thread = IF(" +
        take + ", VALUES(holder_thread), holder_thread)," + " owner_token = IF(" + take +
        ", VALUES(owner_token), owner_token)," + " hold_count = IF(" + reentry +
        ", hold_count + 1, IF(" + take + ", 1, hold_count))," + " expires_at = IF(" + take +
        ", VALUES(expires_at), expires_at)";
    return s;
  }

  // SOCI's MySQL backend sends one text query per statement (it substitutes the escaped values
  // itself), which is one round trip: the same cost as the raw client.
  std::optional<std::int64_t> lease_acquire(soci::session& sql, const table_names& t,
                                            const acquire_params& p) const override {
    long long ttl = p.ttl_us, pid = p.holder_pid;
    sql << lease_sql(t).acquire, soci::use(p.name, "name"), soci::use(p.owner_token, "token"),
        soci::use(ttl, "ttl"), soci::use(p.holder_host, "host"), soci::use(pid, "pid"),
        soci::use(p.holder_thread, "thread");
    long long id = 0;
    if (!sql.get_last_insert_id(t.lock, id) || id <= 0) return std::nullopt;
    return id;
  }
};

}  // namespace

const dialect& mysql_dialect_instance() {
  static const mysql_dialect d;
  return d;
}

}  // namespace dblock::detail
