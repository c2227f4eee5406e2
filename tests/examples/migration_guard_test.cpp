// The migration-guard shell example on every backend: five "deploy hosts" run
// `dblock exec --lock migrations/<app> --wait 30s -- migrate-once.sh` at once; exactly one
// applies the migrations, the others skip, and every migration is in the log once. On SQLite
// also the negative control (--no-lock), which applies them more than once.
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "harness.hpp"
#include "run_program.hpp"
#include "test_paths.hpp"

namespace {

struct host_row {
  int status = -1;
  std::string fence;
  int applied = -1, skipped = -1;
};

// Parses the host table of migration_guard.sh's output.
std::vector<host_row> parse_hosts(const std::string& out) {
  std::vector<host_row> rows;
  std::regex line(R"(^host\d+\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s*$)");
  dblock::test::for_each_match(out, line, [&](const std::smatch& m) {
    rows.push_back({std::stoi(m[1]), m[2], std::stoi(m[3]), std::stoi(m[4])});
  });
  return rows;
}

std::string script() {
  return std::string(DBLOCK_EXAMPLES_SRC) + "/migration_guard/migration_guard.sh";
}

}  // namespace

DBLOCK_TEST("example migration_guard: one deploy host applies, the others skip", "[examples]") {
  const std::string prefix = ctx.prefix + "mg_";
  ctx.prefixes.push_back(prefix);  // the script migrates it; the harness drops its tables
  const std::string cmd = "DBLOCK_BIN=" + dblock::test::shell_quote(DBLOCK_CLI_PATH) + " bash " +
                          dblock::test::shell_quote(script()) + " --url " +
                          dblock::test::shell_quote(ctx.url) + " --table-prefix " + prefix +
                          " --hosts 5";
  dblock::test::check_run(cmd, 0, [](const auto& r) {
    CHECK(r.output.find("invariant held: every migration applied exactly once (3 migrations, 3 "
                        "log entries, 5 hosts)") != std::string::npos);
    auto hosts = parse_hosts(r.output);
    REQUIRE(hosts.size() == 5);
    int appliers = 0;
    std::set<std::string> fences;
    for (const auto& h : hosts) {
      CHECK(h.status == 0);
      CHECK(h.applied + h.skipped == 3);
      if (h.applied > 0) {
        ++appliers;
        CHECK(h.applied == 3);
      }
      CHECK(h.fence != "none");
      fences.insert(h.fence);
    }
    CHECK(appliers == 1);
    CHECK(fences.size() == 5);  // five acquisitions of the lock, each with its own fence
  });

  if (ctx.backend == "sqlite") {
    // Without the lock the same hosts apply the migrations more than once.
    // (Slower migrations make the race certain even on a loaded machine.)
    dblock::test::check_run("MIGRATION_SECONDS=0.5 bash " + dblock::test::shell_quote(script()) +
                                " --no-lock --hosts 5",
                            1, [](const auto& neg) {
                              CHECK(neg.output.find("invariant BROKEN") != std::string::npos);
                            });
  }
}
