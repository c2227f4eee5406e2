// The run-once-job example on every backend: with lock-at-least-for above the clock skew each
// period runs exactly once; without it (the negative control) late instances run a period
// again, each time with a higher fence.
#include <map>
#include <regex>
#include <sstream>
#include <vector>

#include "harness.hpp"
#include "run_program.hpp"

namespace {

struct run_row {
  int period = -1, instance = -1;
  long long fence = -1;
};

struct instance_row {
  int ran = -1, skipped = -1, lost = -1, errors = -1;
};

struct result {
  std::vector<run_row> runs;
  std::vector<instance_row> instances;
};

// Parses the runs table and the instances table of run_once_job's output.
result parse(const std::string& out) {
  result r;
  std::regex six(R"(^\s*(\d+)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(-?\d+)\s+(\d+)\s*$)");
  std::istringstream in(out);
  std::string l;
  enum { none, runs, instances } section = none;
  while (std::getline(in, l)) {
    if (l.find("runs in period") != std::string::npos) {
      section = runs;
      continue;
    }
    if (l.find("skew (ms)") != std::string::npos) {
      section = instances;
      continue;
    }
    std::smatch m;
    if (!std::regex_search(l, m, six)) {
      if (l.empty()) section = none;
      continue;
    }
    if (section == runs)
      r.runs.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoll(m[3])});
    else if (section == instances)
      r.instances.push_back({std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]), std::stoi(m[6])});
  }
  return r;
}

}  // namespace

DBLOCK_TEST("example run_once_job: exactly one run per period, fences increasing", "[examples]") {
  const dblock::test::example_run ex(ctx, "run_once_job", "rj_", {"job_runs"},
                                     "--instances 4 --max-skew 200 --at-most-for 1400 --job-ms 20");
  // At least for 1000 ms against 200 ms of skew: 800 ms for a late instance's try to reach the
  // database while the winner still holds, which a loaded machine keeps (100 ms did not).
  dblock::test::check_run(
      ex.cmd + " --periods 3 --period-ms 1500 --at-least-for 1000", 0, [](const auto& r) {
        auto res = parse(r.output);
        REQUIRE(res.runs.size() == 3);
        for (int k = 1; k <= 3; ++k) {
          INFO("period " << k);
          CHECK(res.runs[static_cast<std::size_t>(k - 1)].period == k);
          CHECK(res.runs[static_cast<std::size_t>(k - 1)].fence >= 1);
        }
        REQUIRE(res.instances.size() == 4);
        int ran = 0, skipped = 0;
        for (const auto& i : res.instances) {
          ran += i.ran;
          skipped += i.skipped;
          CHECK(i.lost == 0);
          CHECK(i.errors == 0);
        }
        CHECK(ran == 3);
        CHECK(skipped == 4 * 3 - 3);
        CHECK(r.output.find("verdict: invariant held: exactly one run per period (3 periods), "
                            "fences increasing") != std::string::npos);
      });
  // Negative control: released at once, the lock is free again when the late instances'
  // clocks reach the period start, and they run it again (with higher fences).
  const std::string released_at_once = ex.cmd + " --periods 2 --period-ms 500 --at-least-for 0";
  dblock::test::check_run(released_at_once, 1, [](const auto& r) {
    auto res = parse(r.output);
    std::map<int, std::vector<long long>> fences;
    for (const auto& run : res.runs)
      fences[run.period].push_back(run.fence);
    std::size_t most = 0;
    for (const auto& [period, f] : fences) {
      INFO("period " << period);
      most = std::max(most, f.size());
      for (std::size_t i = 1; i < f.size(); ++i)
        CHECK(f[i] > f[i - 1]);
    }
    CHECK(most > 1);
    CHECK(r.output.find("invariant BROKEN") != std::string::npos);
  });
}
