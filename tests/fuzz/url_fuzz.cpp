// libFuzzer target: the database URL parser and the connection strings built from it.
// Invariants: only dblock::error(invalid_argument) escapes; errors are short and never contain
// the password; an accepted URL has a known scheme and a redacted form without the password; and
// each connection string is read back by the client code that will read it, giving exactly the
// URL's parts (no injected keys, nothing cut at a NUL byte), also after its connect timeout is
// lowered for a deadline:
//  - PostgreSQL: libpq's own parser (PQconninfoParse);
//  - MySQL and SQLite: SOCI parses these strings with private code, so this target defines the
//    client-library functions SOCI hands the parsed values to (mysql_real_connect,
//    mysql_options, mysql_ssl_set; sqlite3_open_v2, sqlite3_exec). The executable's definitions
//    come first in the dynamic linker's lookup, so SOCI's own parser is the oracle: the MySQL
//    connection fails without any network, the SQLite one opens an in-memory database instead
//    of the file.
#include <dlfcn.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <soci/mysql/soci-mysql.h>
#include <soci/soci.h>
#include <soci/sqlite3/soci-sqlite3.h>  // declares SQLite's API in namespace sqlite_api

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/url.hpp"
#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dialect/dialect.hpp"
#include "fuzz_common.hpp"

namespace {

std::optional<std::string> text(const char* s) {
  return s ? std::optional<std::string>(s) : std::nullopt;
}

// What SOCI's MySQL backend handed to the client library.
struct mysql_seen {
  bool connect = false;
  std::optional<std::string> host, user, password, db, unix_socket;
  unsigned port = 0;
  std::map<std::string, std::string> options;  // charset, timeouts, TLS files
};
mysql_seen seen_mysql;

// What SOCI's SQLite backend opened and ran.
struct sqlite_seen {
  std::optional<std::string> file;
  std::vector<std::string> statements;
};
sqlite_seen seen_sqlite;

}  // namespace

extern "C" {

MYSQL* STDCALL mysql_real_connect(MYSQL*, const char* host, const char* user, const char* passwd,
                                  const char* db, unsigned int port, const char* unix_socket,
                                  unsigned long) {
  seen_mysql.connect = true;
  seen_mysql.host = text(host);
  seen_mysql.user = text(user);
  seen_mysql.password = text(passwd);
  seen_mysql.db = text(db);
  seen_mysql.port = port;
  seen_mysql.unix_socket = text(unix_socket);
  return nullptr;  // no connection: SOCI throws
}

int STDCALL mysql_options(MYSQL*, enum mysql_option option, const void* arg) {
  auto number = [arg] { return std::to_string(*static_cast<const unsigned*>(arg)); };
  auto str = [arg] { return std::string(static_cast<const char*>(arg)); };
  switch (option) {
    case MYSQL_SET_CHARSET_NAME:
      seen_mysql.options["charset"] = str();
      break;
    case MYSQL_OPT_CONNECT_TIMEOUT:
      seen_mysql.options["connect_timeout"] = number();
      break;
    case MYSQL_OPT_READ_TIMEOUT:
      seen_mysql.options["read_timeout"] = number();
      break;
    case MYSQL_OPT_WRITE_TIMEOUT:
      seen_mysql.options["write_timeout"] = number();
      break;
    case MYSQL_OPT_SSL_CA:
      seen_mysql.options["sslca"] = str();
      break;
    case MYSQL_OPT_SSL_CERT:
      seen_mysql.options["sslcert"] = str();
      break;
    case MYSQL_OPT_SSL_KEY:
      seen_mysql.options["sslkey"] = str();
      break;
    default:
      seen_mysql.options["option " + std::to_string(option)] = "?";
      break;
  }
  return 0;
}

int STDCALL mysql_ssl_set(MYSQL*, const char* key, const char* cert, const char* ca,
                          const char* capath, const char* cipher) {
  if (key) seen_mysql.options["sslkey"] = key;
  if (cert) seen_mysql.options["sslcert"] = cert;
  if (ca) seen_mysql.options["sslca"] = ca;
  if (capath) seen_mysql.options["sslcapath"] = capath;
  if (cipher) seen_mysql.options["sslcipher"] = cipher;
  return 0;
}

int sqlite3_open_v2(const char* filename, sqlite_api::sqlite3** db, int, const char*) {
  using open_fn = int (*)(const char*, sqlite_api::sqlite3**, int, const char*);
  static const auto real = reinterpret_cast<open_fn>(dlsym(RTLD_NEXT, "sqlite3_open_v2"));
  seen_sqlite.file = text(filename);
  return real(":memory:", db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
}

int sqlite3_exec(sqlite_api::sqlite3* db, const char* sql,
                 int (*callback)(void*, int, char**, char**), void* arg, char** errmsg) {
  using exec_fn = int (*)(sqlite_api::sqlite3*, const char*, int (*)(void*, int, char**, char**),
                          void*, char**);
  static const auto real = reinterpret_cast<exec_fn>(dlsym(RTLD_NEXT, "sqlite3_exec"));
  seen_sqlite.statements.push_back(sql ? sql : "");
  return real(db, sql, callback, arg, errmsg);
}

}  // extern "C"

namespace {

using dblock::detail::parse_url;

// libpq's reading of a connection string (nothing when it does not parse).
bool libpq_parse(const std::string& conninfo, std::map<std::string, std::string>& out) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (!opts) {
    PQfreemem(err);
    return false;
  }
  for (auto* o = opts; o->keyword; ++o)
    if (o->val) out[o->keyword] = o->val;
  PQconninfoFree(opts);
  return true;
}

// Non-overlapping occurrences of `needle` in `s`.
std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size()))
    ++n;
  return n;
}

using dblock::detail::parsed_url;

// A seconds value as SOCI's MySQL backend reads it (an unsigned int), or nothing when it is not
// a number dblock should have let through.
std::optional<std::string> as_seconds(const std::string& v) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::to_string(std::stoul(v));
}

// libpq reads one PostgreSQL connection string; `timeout`: the connect_timeout it must hold.
void check_postgresql(const std::string& url, const parsed_url& u, const std::string& conn,
                      const std::string& timeout) {
  std::map<std::string, std::string> kv;
  FUZZ_CHECK(libpq_parse(conn, kv), "libpq cannot parse the connection string of " + url);
  FUZZ_CHECK(kv["dbname"] == u.path, "dbname differs for " + url);
  // A host= query parameter (a socket directory) overrides the URL's host, as in libpq's URIs.
  if (u.hosts.size() > 1) {
    // A host list goes to libpq whole, in order; an empty port item is the default port.
    std::string hosts, ports;
    for (std::size_t i = 0; i < u.hosts.size(); ++i) {
      hosts += (i ? "," : "") + u.hosts[i].host;
      ports += (i ? "," : "") + (u.hosts[i].port ? std::to_string(*u.hosts[i].port) : "");
    }
    FUZZ_CHECK(kv["host"] == hosts, "host list differs for " + url);
    FUZZ_CHECK(kv["port"] == ports, "port list differs for " + url);
  } else if (!u.host.empty() && !u.query.count("host")) {
    FUZZ_CHECK(kv["host"] == u.host, "host differs for " + url);
  }
  // A host never carries a separator of libpq's host list: one URL host is one server.
  for (const auto& h : u.hosts)
    FUZZ_CHECK(h.host.find(',') == std::string::npos, "a host with ',' in " + url);
  if (!u.user.empty()) FUZZ_CHECK(kv["user"] == u.user, "user differs for " + url);
  if (u.password) FUZZ_CHECK(kv["password"] == *u.password, "password differs for " + url);
  for (const auto& q : u.query)
    if (q.first != "connect_timeout" && q.first != "pooler")  // pooler: dblock's own key
      FUZZ_CHECK(kv[q.first] == q.second, "query parameter " + q.first + " differs for " + url);
  FUZZ_CHECK(kv["connect_timeout"] == timeout, "connect_timeout differs for " + url);
}

// SOCI reads one MySQL connection string (for host `h` of the URL) and hands the values to the
// client library.
void check_mysql(const std::string& url, const parsed_url& u, const dblock::detail::url_host& h,
                 const std::string& conn, const std::string& timeout) {
  seen_mysql = {};
  std::string refused;
  try {
    soci::session s(soci::mysql, conn);
    FUZZ_CHECK(false, "a MySQL session opened without a server for " + url);
  } catch (const soci::soci_error& e) {
    refused = e.what();
  }
  FUZZ_CHECK(seen_mysql.connect,
             "SOCI refused the MySQL connection string of " + url + ": " + refused);
  const auto& m = seen_mysql;
  FUZZ_CHECK(m.host == (h.host.empty() ? std::string("localhost") : h.host),
             "host differs for " + url);
  FUZZ_CHECK(m.port == static_cast<unsigned>(h.port ? *h.port : 0), "port differs for " + url);
  FUZZ_CHECK(m.db == u.path, "database differs for " + url);
  FUZZ_CHECK(m.user == (u.user.empty() ? std::nullopt : std::optional<std::string>(u.user)),
             "user differs for " + url);
  FUZZ_CHECK(m.password == u.password, "password differs for " + url);
  const auto q = [&u](const char* key) {
    auto it = u.query.find(key);
    return it == u.query.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  FUZZ_CHECK(m.unix_socket == q("unix_socket"), "unix_socket differs for " + url);
  // Each option the client library was given, and nothing else.
  std::map<std::string, std::string> want;
  want["charset"] = q("charset").value_or("utf8mb4");
  for (const char* key : {"read_timeout", "write_timeout"}) {
    if (!q(key)) continue;
    auto secs = as_seconds(*q(key));
    FUZZ_CHECK(secs, std::string(key) + " accepted but not a number of seconds in " + url);
    want[key] = *secs;
  }
  want["connect_timeout"] = timeout;
  for (const char* key : {"sslca", "sslcert", "sslkey"})
    if (q(key)) want[key] = *q(key);
  std::string got_text, want_text;
  for (const auto& kv : m.options)
    got_text += " " + kv.first + "=" + kv.second;
  for (const auto& kv : want)
    want_text += " " + kv.first + "=" + kv.second;
  FUZZ_CHECK(m.options == want,
             "client options differ for " + url + ":" + got_text + " instead of" + want_text);
}

// SOCI reads one SQLite connection string and opens the file.
void check_sqlite(const std::string& url, const parsed_url& u, const std::string& conn) {
  seen_sqlite = {};
  std::string refused;
  try {
    soci::session s(soci::sqlite3, conn);
  } catch (const soci::soci_error& e) {
    refused = e.what();
  }
  FUZZ_CHECK(seen_sqlite.file,
             "SOCI refused the SQLite connection string of " + url + ": " + refused);
  // The same file: the path itself, or ./path for a relative one; sqlite::memory: a memdb
  // name of its own (never a file).
  const std::string& f = *seen_sqlite.file;
  if (u.memory)
    FUZZ_CHECK(f.rfind("file:/dblock-memory-", 0) == 0 && f.size() > 10 &&
                   f.compare(f.size() - 10, 10, "?vfs=memdb") == 0,
               "sqlite::memory: opened " + f + " for " + url);
  else
    FUZZ_CHECK(f == u.path || (!u.path.empty() && u.path[0] != '/' && f == "./" + u.path),
               "SOCI opened another file than the path of " + url);
  std::string ran;
  for (const auto& st : seen_sqlite.statements)
    ran += st + ";";
  auto sync = u.query.find("synchronous");
  if (sync == u.query.end())
    FUZZ_CHECK(ran.find("synchronous") == std::string::npos, "a synchronous setting for " + url);
  else
    FUZZ_CHECK(ran.find("synchronous=" + sync->second) != std::string::npos,
               "synchronous not set for " + url);
  FUZZ_CHECK(refused.empty(), "SOCI failed after opening the file of " + url + ": " + refused);
}

void check_parsed(const std::string& url, const parsed_url& u, const std::string& secret) {
  FUZZ_CHECK(u.scheme == "postgresql" || u.scheme == "mysql" || u.scheme == "sqlite", url);
  FUZZ_CHECK(!u.hosts.empty(), "no host entry for " + url);
  // A password is masked in the redacted form. The password bytes may also occur in the host,
  // path or query (or be "*", or percent-encoded), so only the mask is checked here; the
  // secret's own check follows.
  if (u.password && !u.password->empty())
    FUZZ_CHECK(u.redacted.find(":***@") != std::string::npos, u.redacted);
  if (!secret.empty() && count(url, secret) == 1)
    FUZZ_CHECK(u.redacted.find(secret) == std::string::npos, u.redacted);
  // The secret as parsed (percent-decoded) when it was taken as the password: not shown either.
  if (!secret.empty() && u.password && u.password->size() >= 6 &&
      u.password->compare(0, 3, "Pw7") == 0 &&
      u.password->compare(u.password->size() - 3, 3, "Q9z") == 0 && count(url, *u.password) <= 1)
    FUZZ_CHECK(u.redacted.find(*u.password) == std::string::npos, u.redacted);
  const auto& dia = dblock::detail::dialect_for_scheme(u.scheme);
  std::vector<std::string> conns;
  dblock::database_options o;
  try {
    dia.conn.adjust_options(u, o);  // as dblock::database does
    conns = dia.conn.connect_strings(u, o);
  } catch (const dblock::error& e) {
    FUZZ_CHECK(e.code() == dblock::errc::invalid_argument, e.what());
    if (!secret.empty() && count(url, secret) == 1)
      FUZZ_CHECK(std::string(e.what()).find(secret) == std::string::npos, e.what());
    return;
  }
  FUZZ_CHECK(!conns.empty(), "no connection string for " + url);
  // The connect timeout in seconds: the URL's whole seconds, else a positive number (a duration
  // such as 1500ms, rounded up), else the default (10 s); libpq's least is 2 s.
  auto ct = u.query.find("connect_timeout");
  std::string secs = ct == u.query.end() ? "10" : as_seconds(ct->second).value_or("");
  if (secs.empty()) {
    FUZZ_CHECK(o.connect_timeout.count() > 0, "connect_timeout " + ct->second + " for " + url);
    secs = std::to_string((o.connect_timeout.count() + 999) / 1000);
  }
  FUZZ_CHECK(secs != "0", "a connect_timeout of 0 (no timeout) accepted for " + url);
  const std::string pg_secs = std::stoul(secs) < 2 ? "2" : secs;
  // As written, then with the connect timeout a deadline 1.5 s away gives.
  const auto left = std::chrono::milliseconds(1500);
  if (u.scheme == "postgresql") {
    FUZZ_CHECK(conns.size() == 1, "libpq takes the host list in one string: " + url);
    check_postgresql(url, u, conns[0], pg_secs);
    check_postgresql(url, u, dia.conn.bounded_connect(conns[0], left), "2");
  } else if (u.scheme == "mysql") {
    FUZZ_CHECK(conns.size() == u.hosts.size(), "one MySQL connection string per host: " + url);
    for (std::size_t i = 0; i < conns.size(); ++i) {
      check_mysql(url, u, u.hosts[i], conns[i], secs);
      check_mysql(url, u, u.hosts[i], dia.conn.bounded_connect(conns[i], left), "2");
    }
  } else {
    FUZZ_CHECK(conns.size() == 1, "one SQLite connection string: " + url);
    check_sqlite(url, u, conns[0]);
  }
}

void run(const std::string& url, const std::string& secret) {
  try {
    auto u = parse_url(url);
    check_parsed(url, u, secret);
  } catch (const dblock::error& e) {
    std::string m = e.what();
    FUZZ_CHECK(e.code() == dblock::errc::invalid_argument, m);
    FUZZ_CHECK(m.size() < 5000, "an error message of " + std::to_string(m.size()) + " bytes");
    if (!secret.empty() && count(url, secret) == 1)
      FUZZ_CHECK(m.find(secret) == std::string::npos, m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  // 1. The input as a whole URL.
  run(in, "");
  // 2. The input as the raw text around a password that must never be shown: the password is
  //    "Pw7" + (bytes before the first '|') + "Q9z", the rest follows the '@'.
  auto bar = in.find('|');
  std::string pw_mid = bar == std::string::npos ? in : in.substr(0, bar);
  std::string rest = bar == std::string::npos ? "h/db" : in.substr(bar + 1);
  const std::string secret = "Pw7" + pw_mid + "Q9z";
  for (const char* scheme : {"postgresql://", "mysql://"})
    run(std::string(scheme) + "user:" + secret + "@" + rest, secret);
  return 0;
}
