// URL parsing: accepted forms, and clear errors that never echo a password.
#include <catch2/catch.hpp>

#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "url.hpp"

using dblock::detail::parse_url;

namespace {
dblock::errc code_of(const std::string& url) {
  try {
    parse_url(url);
  } catch (const dblock::error& e) {
    return e.code();
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
