// The leader-election example on every backend: the leader is SIGKILLed twice, a new leader
// takes over each time within the bound and never before the old lease could have expired, and
// the log never shows two leaders at once.
#include <regex>
#include <sstream>
#include <vector>

#include "harness.hpp"
#include "run_program.hpp"
#include "test_paths.hpp"

namespace {

struct kill_row {
  int victim = -1;
  long long fence = -1, lease_left = -1, takeover = -1, new_leader = -1, new_fence = -1;
};

// Parses the kill table of leader_election's output.
std::vector<kill_row> parse_kills(const std::string& out) {
  std::vector<kill_row> rows;
  std::regex line(R"(^\d+\s+(\d+)\s+(\d+)\s+\d+\s+(-?\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$)");
  dblock::test::for_each_match(out, line, [&](const std::smatch& m) {
    rows.push_back({std::stoi(m[1]), std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]),
                    std::stoll(m[5]), std::stoll(m[6])});
  });
  return rows;
}

}  // namespace

DBLOCK_TEST("example leader_election: one leader at a time, prompt and safe takeovers",
            "[examples]") {
  // The promptness bound's slack scales with the machine's measured pace (liveness, not speed).
  const long long slack_ms =
      dblock::test::liveness_bound_ms(0, dblock::test::median_round_trip_us(ctx.db));
  const dblock::test::example_run ex(
      ctx, "leader_election", "le_", {"leader_log"},
      "--candidates 4 --ttl-ms 1000 --kills 2 --slack-ms " + std::to_string(slack_ms));
  dblock::test::check_run(ex.cmd, 0, [slack_ms](const auto& r) {
    CHECK(dblock::test::count_of(r.output, "invariant held:") == 3);
    CHECK(dblock::test::count_of(r.output, "invariant BROKEN") == 0);
    CHECK(r.output.find("problem:") == std::string::npos);
    CHECK(r.output.find("0 stopped uncleanly; 0 errors") != std::string::npos);

    auto kills = parse_kills(r.output);
    REQUIRE(kills.size() == 2);
    for (const auto& k : kills) {
      CHECK(k.victim != k.new_leader);
      CHECK(k.new_fence > k.fence);
      // The killed leader's watchdog renewed at ttl/3, so at least ~2/3 of the lease was left.
      CHECK(k.lease_left > 0);
      CHECK(k.lease_left <= 1000);
      // Not before the lease could have expired, and within 1.5 x ttl + the slack.
      CHECK(k.takeover >= k.lease_left);
      CHECK(k.takeover <= 1500 + slack_ms);
    }
    CHECK(kills[1].fence == kills[0].new_fence);
  });

  // Bad arguments are usage errors, not crashes.
  auto bad = dblock::test::run_program(std::string(DBLOCK_EXAMPLES_BIN) +
                                       "/leader_election/leader_election --candidates 2 --kills 2");
  CHECK(bad.status == 2);
}
