// URL parsing: accepted forms, and clear errors that never echo a password.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/url.hpp"
#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dialect/dialect.hpp"
#include "harness.hpp"
#include "test_paths.hpp"

using dblock::detail::parse_url;
using dblock::test::count_of;

namespace {
dblock::errc code_of(const std::string& url) {
  try {
    parse_url(url);
  } catch (const dblock::error& e) {
    return e.kind();
  }
  return dblock::errc::backend_error;  // "did not throw"
}
std::string message_of(const std::string& url) {
  try {
    dblock::database db(url);
  } catch (const dblock::error& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("postgresql URLs are split and percent-decoded", "[unit][url]") {
  auto u = parse_url("postgresql://us%40er:p%3Ass@db.example:6543/app?sslmode=require");
  CHECK(u.scheme == "postgresql");
  CHECK(u.user == "us@er");
  REQUIRE(u.password);
  CHECK(*u.password == "p:ss");
  CHECK(u.host == "db.example");
  CHECK(u.port == 6543);
  CHECK(u.path == "app");
  CHECK(u.query.at("sslmode") == "require");
  CHECK(u.redacted == "postgresql://us%40er:***@db.example:6543/app?sslmode=require");
  CHECK(parse_url("postgres://h/db").scheme == "postgresql");
  CHECK(parse_url("postgresql:///db?host=/run/postgresql").query.at("host") == "/run/postgresql");
}

TEST_CASE("mysql and sqlite URLs", "[unit][url]") {
  auto m = parse_url("mysql://root@localhost/app?unix_socket=/tmp/m.sock");
  CHECK(m.scheme == "mysql");
  CHECK(!m.password);
  CHECK(m.path == "app");
  CHECK(parse_url("mariadb://u:p@h:3306/x").scheme == "mysql");
  CHECK(parse_url("sqlite:///var/lib/app/locks.db").path == "/var/lib/app/locks.db");
  CHECK(parse_url("sqlite://relative.db").path == "relative.db");
  CHECK(parse_url("sqlite://dir/sub/x.db").path == "dir/sub/x.db");
}

TEST_CASE("malformed URLs are rejected with invalid_argument", "[unit][url]") {
  using dblock::errc;
  for (const char* bad : {"", "nonsense", "redis://h/0", "postgresql://h",
                          "postgresql://h:99999/db", "postgresql://h:12x/db", "mysql://u:p@h/a/b",
                          "sqlite://", "sqlite:///", "sqlite://u:p@x.db", "postgresql://h/db#frag",
                          "postgresql://h/db?a=1&a=2", "postgresql://h/d b"}) {
    INFO(bad);
    CHECK(code_of(bad) == errc::invalid_argument);
  }
  CHECK(code_of(std::string("postgresql://h/db\n")) == errc::invalid_argument);
  CHECK(code_of("postgresql://h/" + std::string(5000, 'x')) == errc::invalid_argument);
}

TEST_CASE("errors name the problem and never echo the password", "[unit][url]") {
  std::string m = message_of("redis://user:hunter2@h/0");
  CHECK(m.find("unknown scheme 'redis'") != std::string::npos);
  CHECK(m.find("hunter2") == std::string::npos);
  m = message_of("postgresql://user:hunter2@h:0/db");
  CHECK(m.find("out of range") != std::string::npos);
  CHECK(m.find("hunter2") == std::string::npos);
  m = message_of("postgresql://user:hunter2@h/db?bogus=1");
  CHECK(m.find("unknown parameter 'bogus'") != std::string::npos);
  CHECK(m.find("hunter2") == std::string::npos);
  m = message_of("mysql://user:hunter2@h/db#x");
  CHECK(m.find("hunter2") == std::string::npos);
  m = message_of("sqlite:///tmp/x.db?synchronous=off");
  CHECK(m.find("synchronous") != std::string::npos);
  m = message_of("sqlite://:memory:");
  CHECK(m.find("in-memory") != std::string::npos);
}

TEST_CASE("multi-host URLs: every host in order, the first as host", "[unit][url]") {
  auto u =
      parse_url("postgresql://u:p%2Cw@h1:5433,h2,[::1]:6000/app?target_session_attrs=read-write");
  REQUIRE(u.hosts.size() == 3);
  CHECK(u.hosts[0].host == "h1");
  CHECK(u.hosts[0].port == 5433);
  CHECK(u.hosts[1].host == "h2");
  CHECK_FALSE(u.hosts[1].port);
  CHECK(u.hosts[2].host == "::1");
  CHECK(u.hosts[2].port == 6000);
  CHECK(u.host == "h1");
  CHECK(u.port == 5433);
  CHECK(u.path == "app");
  CHECK(*u.password == "p,w");  // a comma in the (encoded) password is not a host separator
  CHECK(u.redacted.find("p%2Cw") == std::string::npos);
  auto m = parse_url("mysql://u@a:3306,b:3307/db");
  REQUIRE(m.hosts.size() == 2);
  CHECK(m.hosts[1].host == "b");
  CHECK(m.hosts[1].port == 3307);
  // A plain URL has one host.
  auto one = parse_url("mysql://u@a:3306/db");
  REQUIRE(one.hosts.size() == 1);
  CHECK(one.hosts[0].host == "a");
  CHECK(one.hosts[0].port == 3306);
}

TEST_CASE("multi-host URLs: bad forms are rejected clearly", "[unit][url]") {
  using dblock::errc;
  struct bad_case {
    std::string url;
    std::string says;
  };
  std::string hundred = "postgresql://u:secret@";
  for (int i = 0; i < 100; ++i)
    hundred += (i ? "," : "") + std::string("h") + std::to_string(i);
  hundred += "/db";
  const bad_case cases[] = {
      {"postgresql://u:secret@h1,,h2/db", "empty host"},
      {"postgresql://u:secret@h1,/db", "empty host"},
      {"postgresql://u:secret@,h2/db", "empty host"},
      {"postgresql://u:secret@h1:5432,h1:5432/db", "given twice"},
      {"mysql://u:secret@h1,h1/db", "given twice"},
      {"postgresql://u:secret@h1,mysql://h2/db", "a second scheme"},
      {"postgresql://u:secret@h1:5432,h2:99999/db", "out of range"},
      {"postgresql://u:secret@h1,h2:x/db", "not a number"},
      {"postgresql://u:secret@h1,[::1/db", "unclosed"},
      {hundred, "more than 16 hosts"},
      {"sqlite://a.db,b.db", "one file"},
      {"postgresql://u:secret@h1,h2/db?host=/run/postgresql", "cannot be combined"},
      {"postgresql://u:secret@h%2Cx/db", "contains ','"},
      {"postgresql://u:secret@h1,h%2Cx/db", "contains ','"},
  };
  for (const auto& c : cases) {
    INFO(c.url);
    const std::string m = message_of(c.url);
    CHECK(m.find(c.says) != std::string::npos);
    CHECK(m.find("secret") == std::string::npos);
    if (c.says != "cannot be combined") CHECK(code_of(c.url) == errc::invalid_argument);
  }
  // Distinct ports on one host are distinct servers.
  CHECK(parse_url("postgresql://u@h:1,h:2/db").hosts.size() == 2);
}

namespace {
struct connection {
  dblock::database_options options;
  std::vector<std::string> strings;
};
connection connection_of(const std::string& url) {
  auto u = parse_url(url);
  const auto& dia = dblock::detail::dialect_for_scheme(u.scheme);
  connection c;
  dia.conn.adjust_options(u, c.options);
  c.strings = dia.conn.connect_strings(u, c.options);
  return c;
}
}  // namespace

TEST_CASE("URL timeouts: one value that deadlines also read, bad ones refused clearly",
          "[unit][url]") {
  using namespace std::chrono_literals;
  // A value the client library would refuse only when connecting (or that stopped the
  // constructor with std::invalid_argument) is a dblock::error naming the key.
  for (const auto& [url, key] : std::vector<std::pair<std::string, std::string>>{
           {"sqlite:///tmp/x.db?busy_timeout=abc", "busy_timeout"},
           {"mysql://u:hunter2@h/db?connect_timeout=abc", "connect_timeout"},
           {"mysql://u:hunter2@h/db?connect_timeout=0", "connect_timeout"},
           {"mysql://u:hunter2@h/db?read_timeout=x", "read_timeout"},
           {"mysql://u:hunter2@h/db?write_timeout=-1", "write_timeout"},
           {"mysql://u:hunter2@h/db?write_timeout=0", "write_timeout"},
           {"mysql://u:hunter2@h/db?sslcert=/c.pem&sslkey=/k.pem", "sslca"},
           {"postgresql://u:hunter2@h/db?connect_timeout=0", "connect_timeout"},
           {"postgresql://u:hunter2@h/db?connect_timeout=5x", "connect_timeout"},
           {"postgresql://u:hunter2@h/db?connect_timeout=25h", "connect_timeout"},
           {"mysql://u:hunter2@h/db?connect_timeout=86401", "connect_timeout"}}) {
    INFO(url);
    const std::string m = message_of(url);
    CHECK(m.find(key) != std::string::npos);
    CHECK(m.find("hunter2") == std::string::npos);
  }
  // The URL's connect_timeout is the database's (what a deadline lowers), written once.
  auto pg = connection_of("postgresql://h/db?connect_timeout=1500ms");
  CHECK(pg.options.connect_timeout == 1500ms);
  REQUIRE(pg.strings.size() == 1);
  CHECK(count_of(pg.strings[0], "connect_timeout=") == 1);
  CHECK(pg.strings[0].find("connect_timeout='2'") != std::string::npos);
  auto my = connection_of("mysql://h1,h2/db?connect_timeout=7");
  CHECK(my.options.connect_timeout == 7s);
  REQUIRE(my.strings.size() == 2);
  for (const auto& s : my.strings)
    CHECK(count_of(s, "connect_timeout=") == 1);
  CHECK(my.strings[0].find("connect_timeout='7'") != std::string::npos);
  CHECK(connection_of("mysql://h/db").options.connect_timeout ==
        dblock::database_options{}.connect_timeout);
}

TEST_CASE("a deadline's connect timeout never rewrites a quoted value", "[unit][url]") {
  // A password holding " connect_timeout=" stays whole when a deadline lowers the timeout.
  for (const char* scheme : {"postgresql", "mysql"}) {
    INFO(scheme);
    auto u = parse_url(std::string(scheme) + "://u:a%20connect_timeout=9%20b@h/db");
    const auto& dia = dblock::detail::dialect_for_scheme(u.scheme);
    const std::string s = dia.conn.connect_strings(u, {})[0];
    const std::string lowered = dia.conn.bounded_connect(s, std::chrono::milliseconds(1500));
    CHECK(lowered.find("password='a connect_timeout=9 b'") != std::string::npos);
    CHECK(count_of(lowered, " connect_timeout='") + count_of(lowered, " connect_timeout=2") == 1);
    CHECK(lowered.find(" connect_timeout=2") != std::string::npos);
  }
}

namespace {
// The words of a list as an error message writes it: "a, b, c" or "a, b or c".
std::set<std::string> listed(std::string text) {
  std::set<std::string> out;
  for (const std::string sep : {", ", " or "})
    for (std::size_t at; (at = text.find(sep)) != std::string::npos;)
      text.replace(at, sep.size(), "|");
  std::stringstream in(text);
  for (std::string word; std::getline(in, word, '|');)
    out.insert(word);
  return out;
}
// The text of message `m` between `from` and the next `to`.
std::string between(const std::string& m, const std::string& from, const std::string& to) {
  const auto b = m.find(from);
  if (b == std::string::npos) return {};
  return m.substr(b + from.size(), m.find(to, b + from.size()) - b - from.size());
}
}  // namespace

// database.hpp's list of URLs once lacked sqlite::memory: and synchronous=extra: the parser's own
// lists (what its errors say it accepts) must each be in the header.
TEST_CASE("database.hpp names every URL key and value that the parser accepts", "[unit][url]") {
  std::ifstream in(std::string(DBLOCK_INCLUDE_SRC) + "/dblock/database.hpp");
  std::stringstream text;
  text << in.rdbuf();
  const std::string header = text.str();
  REQUIRE(header.find("Accepted URLs") != std::string::npos);
  auto documented = [&](const std::string& s) { return header.find(s) != std::string::npos; };
  for (const char* url : {"postgresql://h/db?zz_unknown=1", "mysql://h/db?zz_unknown=1",
                          "sqlite:///tmp/x.db?zz_unknown=1"}) {
    const std::string m = message_of(url);
    const auto keys = listed(between(m, "(accepted: ", ")"));
    INFO(url << ": " << m);
    CHECK(keys.size() > 1);
    for (const auto& k : keys) {
      INFO("the key " << k);
      CHECK(documented("`" + k));
    }
  }
  // Read by the database handle before the backend's keys, on every scheme.
  CHECK(documented("`failover_window="));
  const std::string m = message_of("sqlite:///tmp/x.db?synchronous=zz");
  const auto modes = listed(m.substr(m.find("synchronous must be ") + 20));
  INFO(m);
  CHECK(modes.size() == 3);
  std::set<std::string> in_header;
  std::stringstream sync(between(header, "`synchronous=", "`"));
  for (std::string v; std::getline(sync, v, '|');)
    in_header.insert(v);
  CHECK(in_header == modes);
  // The in-memory form, and every scheme alias.
  CHECK(documented("`sqlite::memory:`"));
  CHECK_NOTHROW(dblock::database("sqlite::memory:"));
  for (const char* scheme :
       {"postgresql://", "postgres://", "mysql://", "mariadb://", "sqlite://", "sqlite3://"})
    CHECK(documented(scheme));
}
