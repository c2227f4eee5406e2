// Identifier, table prefix and resource name validation.
#include <catch2/catch.hpp>

#include "core/identifier.hpp"
#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dblock/lease_lock.hpp"
#include "dialect/dialect.hpp"

using dblock::errc;

namespace {
template <class F>
errc code_of(F&& f) {
  try {
    f();
  } catch (const dblock::error& e) {
    return e.kind();
  }
  return errc::backend_error;
}
}  // namespace

TEST_CASE("identifiers follow [A-Za-z_][A-Za-z0-9_]{0,62}", "[unit][identifier]") {
  using dblock::detail::validate_identifier;
  CHECK_NOTHROW(validate_identifier("t_items", "table"));
  CHECK_NOTHROW(validate_identifier(std::string(63, 'a'), "table"));
  for (std::string bad : {std::string(), std::string(64, 'a'), std::string("1abc"),
                          std::string("a-b"), std::string("a b"), std::string("a;drop"),
                          std::string("\"x\""), std::string("a\0b", 3), std::string("é")}) {
    INFO(bad);
    CHECK(code_of([&] { validate_identifier(bad, "table"); }) == errc::invalid_argument);
  }
}

TEST_CASE("table prefixes are lower-case identifier parts", "[unit][identifier]") {
  using dblock::detail::make_table_names;
  CHECK(make_table_names("").lock == "resource_lock");
  CHECK(make_table_names("app1_").lock == "app1_resource_lock");
  for (std::string bad :
       std::vector<std::string>{"App_", "x;", "1a", "a b", std::string(33, 'a')}) {
    INFO(bad);
    CHECK(code_of([&] { make_table_names(bad); }) == errc::invalid_argument);
    dblock::database_options o;
    o.table_prefix = bad;
    CHECK(code_of([&] { dblock::database db("sqlite:///tmp/never-created.db", o); }) ==
          errc::invalid_argument);
  }
}

TEST_CASE("resource names: 1..255 bytes of UTF-8, never truncated", "[unit][identifier]") {
  using dblock::detail::validate_resource_name;
  CHECK_NOTHROW(validate_resource_name(std::string(255, 'x')));
  CHECK_NOTHROW(validate_resource_name("ключ/日本/🔒"));
  CHECK_NOTHROW(validate_resource_name("'; DROP TABLE resource_lock; --"));
  CHECK(code_of([] { validate_resource_name(std::string(256, 'x')); }) == errc::invalid_argument);
  CHECK(code_of([] { validate_resource_name(""); }) == errc::invalid_argument);
  CHECK(code_of([] { validate_resource_name(std::string("a\0b", 3)); }) == errc::invalid_argument);
  for (std::string bad : std::vector<std::string>{"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82",
                                                  "\xf4\x90\x80\x80"}) {
    CHECK(code_of([&] { validate_resource_name(bad); }) == errc::invalid_argument);
  }
  // Multi-byte characters count in bytes: 128 two-byte characters are 256 bytes.
  std::string two_byte;
  for (int i = 0; i < 128; ++i)
    two_byte += "é";
  CHECK(code_of([&] { validate_resource_name(two_byte); }) == errc::invalid_argument);
  // U+FFFF is reserved for dblock's internal names (semaphore permits); its neighbours are not.
  CHECK(code_of([] {
          validate_resource_name(
              "sem\xEF\xBF\xBF"
              "0");
        }) == errc::invalid_argument);
  CHECK_NOTHROW(validate_resource_name("\xEF\xBF\xBE"));  // U+FFFE
  CHECK_NOTHROW(validate_resource_name("\xEF\xBF\xBD"));  // U+FFFD
  CHECK_NOTHROW(
      dblock::detail::validate_lease_name("sem\xEF\xBF\xBF"
                                          "0"));
}

TEST_CASE("errc composes with std::error_code and says how to retry", "[unit][error]") {
  std::error_code ec = errc::deadlock;
  CHECK(ec.category().name() == std::string("dblock"));
  CHECK(ec.message() == "deadlock");
  CHECK(dblock::advice_for(errc::deadlock) == dblock::retry_advice::retry_transaction);
  CHECK(dblock::advice_for(errc::lock_not_available) == dblock::retry_advice::retry_call);
  CHECK(dblock::advice_for(errc::in_doubt) == dblock::retry_advice::do_not_retry);
  dblock::error e(errc::lease_lost, "x");
  CHECK(e.error_code() == errc::lease_lost);
}

TEST_CASE("dblock::error is a std::system_error in the dblock category", "[unit][error]") {
  const dblock::error e(errc::timeout, "acquire lease 'a': not acquired within 5 ms");
  const std::system_error& se = e;
  CHECK(se.code() == errc::timeout);
  CHECK(se.code().category() == dblock::error_category());
  CHECK(e.kind() == errc::timeout);
  // what() is the message alone, not "message: timeout".
  CHECK(std::string(se.what()) == "acquire lease 'a': not acquired within 5 ms");
  // The standard equivalents compare equal, and only they.
  const std::pair<errc, std::errc> same[] = {
      {errc::timeout, std::errc::timed_out},
      {errc::cancelled, std::errc::operation_canceled},
      {errc::lock_not_available, std::errc::device_or_resource_busy},
      {errc::deadlock, std::errc::resource_deadlock_would_occur},
      {errc::connection_lost, std::errc::connection_aborted},
      {errc::invalid_argument, std::errc::invalid_argument},
      {errc::not_owner, std::errc::operation_not_permitted},
      {errc::pool_exhausted, std::errc::resource_unavailable_try_again},
  };
  for (const auto& [ours, standard] : same) {
    INFO(dblock::to_string(ours));
    CHECK(std::error_code(ours) == standard);
    for (const auto& other : same)
      if (other.first != ours) CHECK(std::error_code(ours) != other.second);
  }
  // Negative controls: no equivalent, and not to a generic code of the same number.
  CHECK(std::error_code(errc::in_doubt) != std::errc::timed_out);
  CHECK(std::error_code(errc::lease_lost) != std::errc::operation_not_permitted);
  CHECK(std::error_code(errc::timeout) !=
        std::error_code(static_cast<int>(errc::timeout), std::generic_category()));
  CHECK(std::error_code(errc::pool_exhausted) != errc::timeout);
  CHECK(dblock::to_string(errc::pool_exhausted) == std::string("pool_exhausted"));
  CHECK(dblock::advice_for(errc::pool_exhausted) == dblock::retry_advice::retry_call);
  // A handler written for std::system_error sees dblock's errors.
  bool caught = false;
  try {
    throw dblock::error(errc::not_owner, "x");
  } catch (const std::system_error& s) {
    caught = s.code() == std::errc::operation_not_permitted;
  }
  CHECK(caught);
}

TEST_CASE("migration files split into statements", "[unit][migrate]") {
  auto s = dblock::detail::split_statements(
      "-- c\nCREATE TABLE a (x INT);\n\nINSERT INTO a\n VALUES (1);\n");
  REQUIRE(s.size() == 2);
  CHECK(s[0].find("CREATE TABLE a") != std::string::npos);
  CHECK(s[1].find("VALUES (1)") != std::string::npos);
  CHECK(dblock::detail::apply_prefix("{{prefix}}t {{prefix}}u", "p_") == "p_t p_u");
  // A routine's body: a PostgreSQL one is dollar-quoted; a MySQL one ends at a line in column 0.
  s = dblock::detail::split_statements(
      "CREATE FUNCTION f() RETURNS INT LANGUAGE plpgsql AS $$\nBEGIN\n  RETURN 1;\nEND $$;\n"
      "DROP PROCEDURE IF EXISTS p;\nCREATE PROCEDURE p()\n  BEGIN\n    SELECT 1;\n"
      "    SELECT 2;\nEND;\nSELECT 3;\n");
  REQUIRE(s.size() == 4);
  CHECK(s[0].find("RETURN 1;\nEND $$") != std::string::npos);
  CHECK(s[1] == "DROP PROCEDURE IF EXISTS p");
  CHECK(s[2].find("SELECT 1;\n    SELECT 2;\nEND") != std::string::npos);
  CHECK(s[3] == "SELECT 3");
}
