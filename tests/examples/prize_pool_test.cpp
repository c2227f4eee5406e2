// The prize-pool example on every backend: no prize is over-awarded, every win has its row and
// every draw is accounted for.
#include <map>
#include <regex>
#include <sstream>

#include "harness.hpp"
#include "run_program.hpp"

namespace {

struct prize_row {
  long long initial = -1, won = -1, remaining = -1, given = -1;
  std::string check;
};

// Parses the aligned prize table of prize_pool's output.
std::map<std::string, prize_row> parse(const std::string& out) {
  std::map<std::string, prize_row> rows;
  std::regex line(
      R"(^(grand|gold|silver|bronze|sticker|total)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(-?\d+)\s+(ok|BROKEN)\s*$)");
  dblock::test::for_each_match(out, line, [&](const std::smatch& m) {
    rows[m[1]] = {std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5]), m[6]};
  });
  return rows;
}

}  // namespace

DBLOCK_TEST("example prize_pool: wins == initial - remaining for every prize", "[examples]") {
  const dblock::test::example_run ex(ctx, "prize_pool", "pp_", {"wins", "prize_pool"},
                                     "--workers 6 --draws 40");
  dblock::test::check_run(ex.cmd, 0, [](const auto& r) {
    auto rows = parse(r.output);
    REQUIRE(rows.size() == 6);
    const std::map<std::string, long long> initial = {
        {"grand", 1}, {"gold", 5}, {"silver", 20}, {"bronze", 50}, {"sticker", 100}};
    long long won = 0;
    for (const auto& [name, qty] : initial) {
      INFO(name);
      const auto& p = rows[name];
      CHECK(p.initial == qty);
      CHECK(p.remaining >= 0);
      CHECK(p.won == p.initial - p.remaining);
      CHECK(p.given == p.won);
      CHECK(p.check == "ok");
      won += p.won;
    }
    CHECK(rows["total"].initial == 176);
    CHECK(rows["total"].won == won);
    CHECK(won <= 176);
    CHECK(rows["total"].check == "ok");

    // Every draw is accounted for: won + no prize + gave up + errors.
    std::smatch m;
    REQUIRE(std::regex_search(
        r.output, m,
        std::regex(
            R"(draws (\d+) = (\d+) won \+ (\d+) no prize \+ (\d+) gave up \+ (\d+) errors)")));
    CHECK(std::stoll(m[1]) == 6 * 40);
    CHECK(std::stoll(m[2]) == won);
    CHECK(std::stoll(m[2]) + std::stoll(m[3]) + std::stoll(m[4]) + std::stoll(m[5]) == 6 * 40);
    CHECK(std::stoll(m[5]) == 0);
    CHECK(r.output.find("verdict: invariant held") != std::string::npos);
  });
}
