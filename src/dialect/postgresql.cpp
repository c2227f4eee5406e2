// PostgreSQL: clock_timestamp() as the clock, INSERT ... ON CONFLICT ... RETURNING for acquire,
// SQLSTATE-based error classification, advisory locks around migrations.
#include <soci/postgresql/soci-postgresql.h>
#include <soci/soci.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "common.hpp"
#include "dialect.hpp"

namespace dblock::detail {
namespace {

class postgresql_dialect final : public dialect {
 public:
  const char* name() const noexcept override { return "postgresql"; }
  const soci::backend_factory& factory() const override { return *soci::factory_postgresql(); }

  std::string connect_string(const parsed_url& u, const database_options& o) const override {
    check_query_keys(
        u, {"host", "hostaddr", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl",
            "application_name", "connect_timeout", "options", "target_session_attrs", "keepalives",
            "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
            "gssencmode", "channel_binding", "passfile"});
    std::string s;
    auto add = [&s](const std::string& k, const std::string& v) {
      s += (s.empty() ? "" : " ") + k + "=" + conn_quote(v);
    };
    if (!u.host.empty()) add("host", u.host);
    if (u.port) add("port", std::to_string(*u.port));
    add("dbname", u.path);
    if (!u.user.empty()) add("user", u.user);
    if (u.password) add("password", *u.password);
    if (!u.query.count("connect_timeout"))
      add("connect_timeout", std::to_string(ceil_seconds(o.connect_timeout, 2)));
    if (!u.query.count("application_name")) add("application_name", "dblock");
    for (const auto& kv : u.query)
      add(kv.first, kv.second);
    return s;
  }

  void on_connect(soci::session& sql, const database_options&) const override {
    // The library never prints: libpq's default notice processor writes NOTICEs to stderr.
    auto* backend = static_cast<soci::postgresql_session_backend*>(sql.get_backend());
    PQsetNoticeProcessor(
        backend->conn_, [](void*, const char*) {}, nullptr);
  }

  std::string isolation_sql(isolation_level level) const override {
    std::string s = dialect::isolation_sql(level);
    // PostgreSQL spells the session default differently from MySQL.
    const std::string mysql_form = "SET SESSION TRANSACTION";
    if (s.compare(0, mysql_form.size(), mysql_form) == 0)
      s = "SET SESSION CHARACTERISTICS AS TRANSACTION" + s.substr(mysql_form.size());
    return s;
  }

  std::string now_sql() const override { return "clock_timestamp()"; }
  std::string plus_us_sql(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + CAST(:" + param + " AS DOUBLE PRECISION) * INTERVAL '1 microsecond')";
  }
  std::string epoch_us_sql(const std::string& ts) const override {
    return "CAST(floor(extract(epoch FROM " + ts + ") * 1000000) AS BIGINT)";
  }

  void set_lock_timeout(soci::session& sql, std::chrono::milliseconds ms) const override {
    std::string value = std::to_string(std::max<long long>(ms.count(), 1)) + "ms", out;
    sql << "SELECT set_config('lock_timeout', :v, false)", soci::use(value), soci::into(out);
  }

  void begin_transaction(soci::session& sql, std::chrono::milliseconds ms) const override {
    // lock_timeout 0 would mean "no limit" on PostgreSQL; 1 ms is "do not wait".
    sql << "BEGIN";
    std::string value = std::to_string(std::max<long long>(ms.count(), 1)) + "ms", out;
    sql << "SELECT set_config('lock_timeout', :v, true)", soci::use(value), soci::into(out);
  }

  bool in_transaction(soci::session& sql) const override {
    auto* backend = static_cast<soci::postgresql_session_backend*>(sql.get_backend());
    auto st = PQtransactionStatus(backend->conn_);
    return st == PQTRANS_INTRANS || st == PQTRANS_INERROR || st == PQTRANS_ACTIVE;
  }

  bool transaction_failed(soci::session& sql) const override {
    auto* backend = static_cast<soci::postgresql_session_backend*>(sql.get_backend());
    return PQtransactionStatus(backend->conn_) == PQTRANS_INERROR;
  }

  void ensure_lock_row(soci::session& sql, const table_names& t, const std::string& name,
                       std::chrono::milliseconds) const override {
    // ON CONFLICT DO NOTHING never waits for a holder of the existing row, so no timeout is
    // needed (and a session-level lock_timeout would outlive the call).
    if (!lock_row_exists(sql, t, name)) insert_lock_row(sql, t, name);
  }

  bool has_unique_index(soci::session& sql, const std::string& table,
                        const std::string& column) const override {
    int n = 0;
    sql << "SELECT count(*) FROM pg_catalog.pg_index i"
           " JOIN pg_catalog.pg_class c ON c.oid = i.indrelid"
           " JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace"
           " JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]"
           " WHERE ns.nspname = current_schema() AND c.relname = :t AND a.attname = :c"
           " AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL",
        soci::use(table, "t"), soci::use(column, "c"), soci::into(n);
    return n > 0;
  }

  error classify_current(const std::string& what) const override {
    rethrow_if_dblock_error();
    try {
      throw;
    } catch (const soci::postgresql_soci_error& e) {
      std::string state = e.sqlstate();
      std::string msg = what + ": " + one_line(e.get_error_message());
      errc code = errc::backend_error;
      if (state == "23505")
        code = errc::unique_violation;
      else if (state == "40001")
        code = errc::serialization_failure;
      else if (state == "40P01")
        code = errc::deadlock;
      else if (state == "55P03")
        code = errc::lock_not_available;
      else if (state == "57014")
        code = errc::timeout;
      else if (state.compare(0, 2, "08") == 0 || state == "57P01" || state == "57P02" ||
               state == "57P03")
        code = errc::connection_lost;
      else if (state == "28P01" || state == "28000" || state == "3D000")
        code = errc::connection_failed;
      else if (state == "42P01")
        code = errc::schema_missing;
      else if (state == "22001")
        code = errc::invalid_argument;
      return error(code, msg, name(), state, 0);
    } catch (const soci::soci_error& e) {
      errc code = e.get_error_category() == soci::soci_error::connection_error
                      ? errc::connection_lost
                      : errc::backend_error;
      if (contains_nocase(e.get_error_message(), "connection") &&
          (contains_nocase(e.get_error_message(), "closed") ||
           contains_nocase(e.get_error_message(), "no connection") ||
           contains_nocase(e.get_error_message(), "terminat")))
        code = errc::connection_lost;
      return error(code, what + ": " + one_line(e.get_error_message()), name(), "", 0);
    } catch (const std::exception& e) {
      return error(errc::backend_error, what + ": " + one_line(e.what()), name(), "", 0);
    }
  }

  void lock_migrations(soci::session& sql, const std::string& key) const override {
    int one = 0;
    sql << "SELECT 1 FROM (SELECT pg_advisory_lock(hashtext(:k))) AS l", soci::use(key),
        soci::into(one);
  }
  void unlock_migrations(soci::session& sql, const std::string& key) const override {
    int one = 0;
    sql << "SELECT 1 FROM (SELECT pg_advisory_unlock(hashtext(:k))) AS l", soci::use(key),
        soci::into(one);
  }
  bool table_exists(soci::session& sql, const std::string& table) const override {
    int n = 0;
    sql << "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
           " AND tablename = :t",
        soci::use(table), soci::into(n);
    return n > 0;
  }
  const std::vector<migration_file>& migrations() const override {
    static const auto files = load_migrations("postgresql");
    return files;
  }
  const migration_file& bootstrap() const override {
    static const auto file = load_bootstrap("postgresql");
    return file;
  }

  lease_statements lease_sql(const table_names& t) const override {
    lease_statements s = common_lease_sql(t);
    // One statement. EXCLUDED.acquired_at is this statement's clock reading, so every
    // comparison below uses the same instant. Reentry (our token, unexpired) keeps the fence.
    // A released row (hold_count 0) is free whatever the clock says (also after it stepped back).
    const std::string reentry =
        "(l.owner_token = EXCLUDED.owner_token AND l.expires_at > EXCLUDED.acquired_at AND "
        "l.hold_count > 0)";
    s.acquire =
        "INSERT INTO " + t.lock +
        " AS l (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
        " holder_host, holder_pid, holder_thread) VALUES (:name, :token, COALESCE((SELECT"
        " max_fence FROM " +
        t.floor + " WHERE id = 1), 0) + 1, 1, " + now_sql() + ", " + plus_us_sql(now_sql(), "ttl") +
        ", :host, :pid, :thread)"
        " ON CONFLICT (resource_name) DO UPDATE SET"
        " fence = CASE WHEN " +
        reentry + " THEN l.fence ELSE l.fence + 1 END, hold_count = CASE WHEN " + reentry +
        " THEN l.hold_count + 1 ELSE 1 END, acquired_at = CASE WHEN " + reentry +
        " THEN l.acquired_at ELSE EXCLUDED.acquired_at END,"
        " owner_token = EXCLUDED.owner_token, expires_at = EXCLUDED.expires_at,"
        " holder_host = EXCLUDED.holder_host, holder_pid = EXCLUDED.holder_pid,"
        " holder_thread = EXCLUDED.holder_thread"
        " WHERE l.owner_token = EXCLUDED.owner_token OR l.expires_at <= EXCLUDED.acquired_at"
        " OR l.hold_count = 0"
        " RETURNING fence";
    return s;
  }

  // The lease statements are prepared once per connection and run with PQexecPrepared: one
  // round trip each, no re-parse or re-plan (SOCI runs one-time queries unprepared, and its
  // prepared statements cost a PREPARE and a DEALLOCATE round trip each time).
  std::unique_ptr<connection_state> make_connection_state(soci::session&) const override {
    return std::make_unique<pg_state>();
  }

  void identify_session(soci::session& sql, connection_state& st) const override {
    long long pid = 0, start = 0;
    sql << "SELECT pid, " << backend_start_us
        << " FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        soci::into(pid), soci::into(start);
    st.session_id = pid;
    st.session_tag = std::to_string(start);
  }

  bool end_session(soci::session& sql, const session_ref& s,
                   std::chrono::milliseconds timeout) const override {
    if (s.id == 0 || s.tag.empty()) return false;
    long long pid = s.id, start = std::stoll(s.tag);
    const std::string match = std::string(" FROM pg_stat_activity WHERE pid = :pid AND ") +
                              backend_start_us + " = :start";
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int n = 0;
    sql << "SELECT count(pg_terminate_backend(pid))" << match, soci::use(pid, "pid"),
        soci::use(start, "start"), soci::into(n);
    for (auto pause = std::chrono::milliseconds(1);;
         pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      sql << "SELECT count(*)" << match, soci::use(pid, "pid"), soci::use(start, "start"),
          soci::into(n);
      if (n == 0) return true;  // gone: whatever it ran has committed or rolled back
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
    }
  }

  std::optional<std::int64_t> lease_acquire(soci::session& sql, const table_names& t,
                                            const acquire_params& p) const override {
    const std::string ttl = std::to_string(p.ttl_us), pid = std::to_string(p.holder_pid);
    auto r = run_prepared(sql, t, "acquire",
                          {p.name.c_str(), p.owner_token.c_str(), ttl.c_str(),
                           p.holder_host.c_str(), pid.c_str(), p.holder_thread.c_str()});
    if (PQntuples(r.get()) != 1 || PQgetisnull(r.get(), 0, 0)) return std::nullopt;
    return std::stoll(PQgetvalue(r.get(), 0, 0));
  }
  bool lease_renew(soci::session& sql, const table_names& t, const std::string& name,
                   const std::string& token, std::int64_t fence,
                   std::int64_t ttl_us) const override {
    const std::string ttl = std::to_string(ttl_us), f = std::to_string(fence);
    auto r = run_prepared(sql, t, "renew", {ttl.c_str(), name.c_str(), token.c_str(), f.c_str()});
    return std::string(PQcmdTuples(r.get())) == "1";
  }
  bool lease_release(soci::session& sql, const table_names& t, const std::string& name,
                     const std::string& token, std::int64_t fence) const override {
    const std::string f = std::to_string(fence);
    auto r = run_prepared(sql, t, "release", {name.c_str(), token.c_str(), f.c_str()});
    return std::string(PQcmdTuples(r.get())) == "1";
  }

 private:
  static constexpr const char* backend_start_us =
      "(extract(epoch FROM backend_start) * 1000000)::bigint";

  struct pg_state final : connection_state {
    std::set<std::string> prepared;  // statement names prepared on this connection
  };
  using result_ptr = std::unique_ptr<PGresult, void (*)(PGresult*)>;

  static PGconn* conn(soci::session& sql) {
    return static_cast<soci::postgresql_session_backend*>(sql.get_backend())->conn_;
  }

  // Throws what SOCI would throw, so classify_current() treats both paths alike.
  [[noreturn]] static void fail(PGconn* c, PGresult* r) {
    std::string msg = r ? PQresultErrorMessage(r) : "";
    if (msg.empty()) msg = PQerrorMessage(c);
    const char* field = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    char state[6] = "XX000";
    if (field && std::strlen(field) == 5)
      std::memcpy(state, field, 5);
    else if (PQstatus(c) == CONNECTION_BAD)
      std::memcpy(state, "08006", 5);  // connection failure: the reply never came
    if (r) PQclear(r);
    throw soci::postgresql_soci_error(msg.empty() ? "no reply from the server" : msg, state);
  }

  // Runs one of the lease statements (params in the order of kParams), preparing it on first
  // use on this connection. A connection without dblock's state falls back to SOCI's path.
  result_ptr run_prepared(soci::session& sql, const table_names& t, const std::string& which,
                          std::vector<const char*> values) const {
    static const std::map<std::string, std::vector<std::string>> kParams = {
        {"acquire", {"name", "token", "ttl", "host", "pid", "thread"}},
        {"renew", {"ttl", "name", "token", "fence"}},
        {"release", {"name", "token", "fence"}}};
    auto* st = dynamic_cast<pg_state*>(state_of(sql));
    PGconn* c = conn(sql);
    const std::string stmt = "dblock_lease_" + which;
    const auto& params = kParams.at(which);
    const int n = static_cast<int>(values.size());
    for (int attempt = 0;; ++attempt) {
      if (!st || !st->prepared.count(stmt)) {
        const lease_statements all = lease_sql(t);
        const std::string& text = which == "acquire" ? all.acquire
                                  : which == "renew" ? all.renew
                                                     : all.release;
        const std::string positional = to_positional(text, params);
        if (!st) {  // not a pooled session of ours: run it unprepared
          PGresult* r =
              PQexecParams(c, positional.c_str(), n, nullptr, values.data(), nullptr, nullptr, 0);
          const auto status = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
          if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) fail(c, r);
          return result_ptr(r, PQclear);
        }
        PGresult* r = PQprepare(c, stmt.c_str(), positional.c_str(), n, nullptr);
        if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) fail(c, r);
        PQclear(r);
        st->prepared.insert(stmt);
      }
      PGresult* r = PQexecPrepared(c, stmt.c_str(), n, values.data(), nullptr, nullptr, 0);
      const auto status = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
      if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) return result_ptr(r, PQclear);
      const char* field = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
      if (attempt == 0 && field && std::string(field) == "26000") {
        // The server forgot the statement (DISCARD ALL by a pooler): it did not run; prepare
        // it again.
        PQclear(r);
        st->prepared.erase(stmt);
        continue;
      }
      fail(c, r);
    }
  }
};

}  // namespace

const dialect& postgresql_dialect_instance() {
  static const postgresql_dialect d;
  return d;
}

}  // namespace dblock::detail
