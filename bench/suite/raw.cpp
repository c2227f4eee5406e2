#include "raw.hpp"

#include <libpq-fe.h>
#include <mysql.h>
#include <sqlite3.h>

#include <chrono>
#include <map>
#include <set>
#include <stdexcept>

#include "core/url.hpp"
#include "dblock/database.hpp"
#include "dialect/dialect.hpp"
#include "dialect/postgresql/backend.hpp"

namespace dblock::bench {
namespace {

std::string to_text(const param& p) {
  if (auto* i = std::get_if<long long>(&p)) return std::to_string(*i);
  return std::get<std::string>(p);
}

// ---- PostgreSQL: libpq, each statement prepared once per connection (behind a transaction-mode
// pooler, as dblock runs them there: the lease statements through routines, others unnamed) -----

}  // namespace

std::string libpq_conninfo(const std::string& url) {
  auto u = detail::parse_url(url);
  const auto& dia = detail::dialect_for_scheme(u.scheme);
  database_options o;
  dia.conn.adjust_options(u, o);
  return dia.conn.connect_string(u, o);
}

namespace {

class pg_client final : public raw_client {
 public:
  explicit pg_client(const std::string& url) {
    auto u = detail::parse_url(url);
    database_options o;
    detail::dialect_for_scheme(u.scheme).conn.adjust_options(u, o);
    unnamed_ = o.pooler == pooler_mode::transaction;
    conn_ = PQconnectdb(libpq_conninfo(url).c_str());
    if (PQstatus(conn_) != CONNECTION_OK) {
      std::string msg = PQerrorMessage(conn_);
      PQfinish(conn_);
      throw std::runtime_error("libpq: cannot connect to " + u.redacted + ": " + msg);
    }
  }
  ~pg_client() override { PQfinish(conn_); }

  outcome run(const std::string& key, const std::string& sql, const params& p) override {
    std::vector<std::string> names, values;
    for (const auto& kv : p) {
      names.push_back(kv.first);
      values.push_back(to_text(kv.second));
    }
    std::vector<const char*> v;
    for (const auto& s : values)
      v.push_back(s.c_str());
    if (unnamed_ && (key == "acquire" || key == "release" || key == "renew")) {
      std::vector<detail::sql_param> typed;
      for (const auto& kv : p)
        typed.push_back(kv.second);
      const auto rt =
          detail::pg::make_routine(conn_, key, detail::to_positional(sql, names), typed);
      PGresult* r = PQexec(conn_, rt.call.c_str());
      if (detail::pg::routine_missing(r)) {
        PQclear(r);
        r = PQexec(conn_, (rt.create + ";\n" + rt.call).c_str());
      }
      check(r);
      outcome o = result(r);
      if (!rt.returns_rows) o.affected = o.value.value_or(0);
      return o;
    }
    if (unnamed_) {
      PGresult* r =
          PQexecParams(conn_, detail::to_positional(sql, names).c_str(), static_cast<int>(v.size()),
                       nullptr, v.data(), nullptr, nullptr, 0);
      check(r);
      return result(r);
    }
    if (!prepared_.count(key)) {
      PGresult* r = PQprepare(conn_, key.c_str(), detail::to_positional(sql, names).c_str(),
                              static_cast<int>(v.size()), nullptr);
      check(r);
      PQclear(r);
      prepared_.insert(key);
    }
    PGresult* r = PQexecPrepared(conn_, key.c_str(), static_cast<int>(v.size()), v.data(), nullptr,
                                 nullptr, 0);
    check(r);
    return result(r);
  }
  void exec(const std::string& sql) override {
    PGresult* r = PQexec(conn_, sql.c_str());
    check(r);
    PQclear(r);
  }
  const char* backend() const override { return "postgresql"; }
  std::string server_version() override {
    const char* v = PQparameterStatus(conn_, "server_version");
    return v ? v : "";
  }
  void* handle() override { return conn_; }

 private:
  static outcome result(PGresult* r) {
    outcome o;
    const char* n = PQcmdTuples(r);
    o.affected = (n && *n) ? std::stoll(n) : 0;
    if (PQntuples(r) > 0 && PQnfields(r) > 0 && !PQgetisnull(r, 0, 0))
      o.value = std::stoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return o;
  }
  void check(PGresult* r) {
    auto st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return;
    std::string msg = r ? PQresultErrorMessage(r) : PQerrorMessage(conn_);
    if (r) PQclear(r);
    throw std::runtime_error("libpq: " + msg);
  }
  PGconn* conn_ = nullptr;
  bool unnamed_ = false;
  std::set<std::string> prepared_;
};

// ---- MySQL/MariaDB: one text query per statement, values escaped into it ----------------------

class mysql_client final : public raw_client {
 public:
  explicit mysql_client(const std::string& url) {
    auto u = detail::parse_url(url);
    conn_ = mysql_init(nullptr);
    const std::string charset = u.query.count("charset") ? u.query.at("charset") : "utf8mb4";
    mysql_options(conn_, MYSQL_SET_CHARSET_NAME, charset.c_str());
    const char* sock = u.query.count("unix_socket") ? u.query.at("unix_socket").c_str() : nullptr;
    // CLIENT_FOUND_ROWS: affected rows are matched rows, as on dblock's (SOCI's) connections.
    // CLIENT_MULTI_RESULTS: a CALL of the SQL API's procedures returns a row and a status.
    if (!mysql_real_connect(conn_, u.host.empty() ? nullptr : u.host.c_str(), u.user.c_str(),
                            u.password ? u.password->c_str() : nullptr, u.path.c_str(),
                            static_cast<unsigned>(u.port.value_or(0)), sock,
                            CLIENT_FOUND_ROWS | CLIENT_MULTI_RESULTS)) {
      std::string msg = mysql_error(conn_);
      mysql_close(conn_);
      throw std::runtime_error("mysql: cannot connect to " + u.redacted + ": " + msg);
    }
    exec(
        "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''),"
        " 'STRICT_ALL_TABLES')");
  }
  ~mysql_client() override { mysql_close(conn_); }

  outcome run(const std::string&, const std::string& sql, const params& p) override {
    std::map<std::string, std::string> lit;
    for (const auto& kv : p) {
      if (auto* i = std::get_if<long long>(&kv.second)) {
        lit[kv.first] = std::to_string(*i);
      } else {
        const auto& s = std::get<std::string>(kv.second);
        std::string buf(s.size() * 2 + 1, '\0');
        auto n = mysql_real_escape_string(conn_, &buf[0], s.data(), s.size());
        lit[kv.first] = "'" + buf.substr(0, n) + "'";
      }
    }
    std::string text;
    for (std::size_t i = 0; i < sql.size(); ++i) {
      if (sql[i] == ':' && i + 1 < sql.size() &&
          (std::isalpha(static_cast<unsigned char>(sql[i + 1])) || sql[i + 1] == '_')) {
        std::size_t j = i + 1;
        while (j < sql.size() &&
               (std::isalnum(static_cast<unsigned char>(sql[j])) || sql[j] == '_'))
          ++j;
        text += lit.at(sql.substr(i + 1, j - i - 1));
        i = j - 1;
      } else {
        text += sql[i];
      }
    }
    if (mysql_real_query(conn_, text.data(), text.size()) != 0) fail();
    outcome o;
    MYSQL_RES* res = mysql_store_result(conn_);
    if (res) {
      MYSQL_ROW row = mysql_fetch_row(res);
      if (row && mysql_num_fields(res) > 0 && row[0]) o.value = std::stoll(row[0]);
      mysql_free_result(res);
    } else if (mysql_field_count(conn_) != 0) {
      fail();
    }
    o.affected = static_cast<long long>(mysql_affected_rows(conn_));
    o.insert_id = static_cast<long long>(mysql_insert_id(conn_));
    for (int more; (more = mysql_next_result(conn_)) != -1;) {  // a CALL's status
      if (more > 0) fail();
      if (MYSQL_RES* r = mysql_store_result(conn_)) mysql_free_result(r);
    }
    return o;
  }
  void exec(const std::string& sql) override {
    if (mysql_real_query(conn_, sql.data(), sql.size()) != 0) fail();
    if (MYSQL_RES* res = mysql_store_result(conn_)) mysql_free_result(res);
  }
  const char* backend() const override { return "mysql"; }
  std::string server_version() override { return mysql_get_server_info(conn_); }
  void* handle() override { return conn_; }

 private:
  [[noreturn]] void fail() {
    throw std::runtime_error("mysql: " + std::string(mysql_error(conn_)) + " (" +
                             std::to_string(mysql_errno(conn_)) + ")");
  }
  MYSQL* conn_ = nullptr;
};

// ---- SQLite: the C API, statements prepared once and reused ------------------------------------

void now_us_fn(sqlite3_context* ctx, int, sqlite3_value**) {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  sqlite3_result_int64(ctx, std::chrono::duration_cast<std::chrono::microseconds>(now).count());
}

class sqlite_client final : public raw_client {
 public:
  explicit sqlite_client(const std::string& url) {
    auto u = detail::parse_url(url);
    if (sqlite3_open_v2(u.path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                        nullptr) != SQLITE_OK) {
      std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw std::runtime_error("sqlite3: cannot open " + u.path + ": " + msg);
    }
    // The same connection settings as dblock's: busy timeout, WAL, the clock function.
    database_options o;
    sqlite3_busy_timeout(db_, static_cast<int>(o.sqlite_busy_timeout.count()));
    sqlite3_create_function(db_, "dblock_now_us", 0, SQLITE_UTF8, nullptr, now_us_fn, nullptr,
                            nullptr);
    exec("PRAGMA journal_mode=WAL");
    if (u.query.count("synchronous")) exec("PRAGMA synchronous=" + u.query.at("synchronous"));
  }
  ~sqlite_client() override {
    for (auto& kv : stmts_)
      sqlite3_finalize(kv.second);
    sqlite3_close(db_);
  }

  outcome run(const std::string& key, const std::string& sql, const params& p) override {
    sqlite3_stmt*& s = stmts_[key];
    if (!s && sqlite3_prepare_v3(db_, sql.c_str(), static_cast<int>(sql.size()),
                                 SQLITE_PREPARE_PERSISTENT, &s, nullptr) != SQLITE_OK)
      fail();
    std::vector<std::string> keep;  // text values live until the step
    keep.reserve(p.size());
    for (const auto& kv : p) {
      int i = sqlite3_bind_parameter_index(s, (":" + kv.first).c_str());
      if (i == 0) continue;
      if (auto* v = std::get_if<long long>(&kv.second)) {
        sqlite3_bind_int64(s, i, *v);
      } else {
        keep.push_back(std::get<std::string>(kv.second));
        sqlite3_bind_text(s, i, keep.back().data(), static_cast<int>(keep.back().size()),
                          SQLITE_STATIC);
      }
    }
    outcome o;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
      o.value = sqlite3_column_int64(s, 0);
    while (rc == SQLITE_ROW)
      rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE) fail();
    o.affected = sqlite3_changes(db_);
    return o;
  }
  void exec(const std::string& sql) override {
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) fail();
  }
  const char* backend() const override { return "sqlite"; }
  std::string server_version() override { return sqlite3_libversion(); }
  void* handle() override { return db_; }

 private:
  [[noreturn]] void fail() {
    throw std::runtime_error("sqlite3: " + std::string(sqlite3_errmsg(db_)));
  }
  sqlite3* db_ = nullptr;
  std::map<std::string, sqlite3_stmt*> stmts_;
};

}  // namespace

std::unique_ptr<raw_client> connect_raw(const std::string& url) {
  const auto scheme = detail::parse_url(url).scheme;
  if (scheme == "postgresql") return std::make_unique<pg_client>(url);
  if (scheme == "mysql") return std::make_unique<mysql_client>(url);
  return std::make_unique<sqlite_client>(url);
}

}  // namespace dblock::bench
