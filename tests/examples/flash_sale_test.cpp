// The flash-sale example on every backend: every lock-based strategy sells exactly the stock,
// and the no-lock strategy is caught overselling (the negative control).
#include <map>
#include <regex>
#include <sstream>

#include "harness.hpp"
#include "run_program.hpp"
#include "test_paths.hpp"

namespace {

struct row {
  long long sold = -1, left = -1, oversold = -1;
  int failed = -1, errors = -1;
};

// Parses the aligned result table of flash_sale's output.
std::map<std::string, row> parse(const std::string& out) {
  std::map<std::string, row> rows;
  std::regex line(
      R"(^(none|lease|for_update|optimistic|cas|segmented)\s+(\d+)\s+(-?\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s)");
  dblock::test::for_each_match(out, line, [&](const std::smatch& m) {
    rows[m[1]] = {std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoi(m[5]),
                  std::stoi(m[6])};
  });
  return rows;
}

}  // namespace

DBLOCK_TEST("example flash_sale: every strategy with a lock sells exactly the stock",
            "[examples]") {
  const std::string cmd = dblock::test::example_command("flash_sale", ctx.url, ctx.prefix + "fs_",
                                                        "--workers 8 --stock 60 --attempts 15");
  dblock::test::check_run(cmd, 0, [](const auto& r) {
    auto rows = parse(r.output);
    REQUIRE(rows.size() == 6);
    for (const char* s : {"lease", "for_update", "optimistic", "cas", "segmented"}) {
      INFO(s);
      CHECK(rows[s].sold == 60);
      CHECK(rows[s].left == 0);
      CHECK(rows[s].oversold == 0);
      CHECK(rows[s].errors == 0);
      CHECK(rows[s].failed == 8 * 15 - 60);
    }
    // Without a lock, 120 read-then-write attempts on 60 units lose updates and oversell.
    CHECK(rows["none"].sold > 60);
    CHECK(rows["none"].oversold > 0);
    CHECK(r.output.find("invariant BROKEN") != std::string::npos);
  });
  // A bad URL is a clear error, not a crash.
  auto bad = dblock::test::run_program(std::string(DBLOCK_EXAMPLES_BIN) +
                                       "/flash_sale/flash_sale --url nonsense://x");
  CHECK(bad.status == 2);
  CHECK(bad.output.find("unknown scheme") != std::string::npos);
}
