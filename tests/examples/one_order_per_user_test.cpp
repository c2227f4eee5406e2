// The one-order-per-user example on every backend: with a lease lock per user every user gets
// exactly one order and the UNIQUE backstop never fires; without the lock (the negative
// control) the backstop rejects duplicates and still keeps one order per user.
#include <regex>
#include <sstream>

#include "harness.hpp"
#include "run_program.hpp"

namespace {

struct summary {
  std::string mode;
  long long attempts = -1;
  int placed = -1, had_one = -1, violations = -1, errors = -1;
  long long users = -1, exactly_one = -1, none = -1, more = -1, orders = -1;
};

// Parses the result row and the users line of one_order_per_user's output.
summary parse(const std::string& out) {
  summary s;
  std::regex row(R"(^(lease|no-lock)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s)");
  std::regex users(
      R"(^users (\d+): exactly one order (\d+), none (\d+), more than one (\d+) \(orders (\d+)\))");
  std::istringstream in(out);
  std::string l;
  while (std::getline(in, l)) {
    std::smatch m;
    if (std::regex_search(l, m, row)) {
      s.mode = m[1];
      s.attempts = std::stoll(m[2]);
      s.placed = std::stoi(m[3]);
      s.had_one = std::stoi(m[4]);
      s.violations = std::stoi(m[5]);
      s.errors = std::stoi(m[6]);
    } else if (std::regex_search(l, m, users)) {
      s.users = std::stoll(m[1]);
      s.exactly_one = std::stoll(m[2]);
      s.none = std::stoll(m[3]);
      s.more = std::stoll(m[4]);
      s.orders = std::stoll(m[5]);
    }
  }
  return s;
}

}  // namespace

DBLOCK_TEST("example one_order_per_user: one order per user, no unique violation with the lock",
            "[examples]") {
  const dblock::test::example_run ex(ctx, "one_order_per_user", "oo_", {"orders"},
                                     "--workers 6 --users 15 --attempts 2");
  dblock::test::check_run(ex.cmd, 0, [](const auto& r) {
    auto s = parse(r.output);
    CHECK(s.mode == "lease");
    CHECK(s.attempts == 6 * 15 * 2);
    CHECK(s.placed == 15);
    CHECK(s.had_one == 6 * 15 * 2 - 15);
    CHECK(s.violations == 0);
    CHECK(s.errors == 0);
    CHECK(s.users == 15);
    CHECK(s.exactly_one == 15);
    CHECK(s.none == 0);
    CHECK(s.more == 0);
    CHECK(s.orders == 15);
    CHECK(r.output.find("verdict: invariant held: exactly one order per user, 0 unique "
                        "violations") != std::string::npos);
  });
  // Without the lock, concurrent check-then-insert passes the check several times per user;
  // the UNIQUE constraint rejects the duplicates and still keeps one order per user.
  dblock::test::check_run(ex.cmd + " --no-lock", 0, [](const auto& r) {
    auto s = parse(r.output);
    CHECK(s.mode == "no-lock");
    CHECK(s.placed == 15);
    CHECK(s.violations > 0);
    CHECK(s.placed + s.had_one + s.violations == 6 * 15 * 2);
    CHECK(s.errors == 0);
    CHECK(s.exactly_one == 15);
    CHECK(s.more == 0);
    CHECK(s.orders == 15);
    CHECK(r.output.find("only thanks to the UNIQUE constraint") != std::string::npos);
  });
}
