// Test runner: Catch2 plus worker-process dispatch and a per-backend summary.
#define CATCH_CONFIG_RUNNER
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"

namespace {

struct counts {
  int passed = 0, failed = 0, skipped = 0;
};
std::map<std::string, counts>& totals() {
  static std::map<std::string, counts> t;
  return t;
}
// "backend<TAB>test name" of each failed test case, for the closing banner of scripts/test.sh
// (a long CI log is cut in the middle, where Catch2 printed the failure).
std::vector<std::string>& failures() {
  static std::vector<std::string> f;
  return f;
}

// Counts test cases per backend tag and writes them where scripts/test.sh sums them.
struct summary_listener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    dblock::test::skipped_test() = false;
    first_failure_.clear();
    TestEventListenerBase::testCaseStarting(info);
  }

  // The first failed assertion of the running test case, for failures().
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    const auto& r = stats.assertionResult;
    if (!r.succeeded() && first_failure_.empty()) {
      std::string what = r.hasExpression() ? r.getExpressionInMacro() : std::string();
      if (r.hasExpandedExpression()) what += " with " + r.getExpandedExpression();
      if (r.hasMessage()) what += (what.empty() ? "" : ": ") + r.getMessage();
      for (char& ch : what)
        if (ch == '\n' || ch == '\t') ch = ' ';
      if (what.size() > 300) what = what.substr(0, 300) + "...";
      first_failure_ = r.getSourceInfo().file + std::string(":") +
                       std::to_string(r.getSourceInfo().line) + ": " + what;
    }
    return TestEventListenerBase::assertionEnded(stats);
  }

  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    std::string backend = "none";
    for (const auto& tag : stats.testInfo.tags)
      if (tag == "postgresql" || tag == "mysql" || tag == "sqlite") backend = tag;
    // The topology entries (PgBouncer, Galera, ...) report under their own name, so that
    // scripts/test.sh can require each of them to have run.
    const char* label = std::getenv("DBLOCK_TEST_SUMMARY_LABEL");
    if (label && *label && backend != "none") backend = std::string(label) + ":" + backend;
    auto& c = totals()[backend];
    if (stats.totals.assertions.failed > 0 || stats.totals.testCases.failed > 0) {
      ++c.failed;
      failures().push_back(backend + "\t" + stats.testInfo.name + "\t" + first_failure_);
    } else if (dblock::test::skipped_test())
      ++c.skipped;
    else
      ++c.passed;
    TestEventListenerBase::testCaseEnded(stats);
  }

  void testRunEnded(const Catch::TestRunStats& stats) override {
    TestEventListenerBase::testRunEnded(stats);
    const char* dir = std::getenv("DBLOCK_TEST_SUMMARY_DIR");
    if (!dir || !*dir) return;
    std::ofstream out(std::string(dir) + "/catch-" + std::to_string(::getpid()) + ".txt");
    // The ctest entry that ran this process (tests/CMakeLists.txt), for its least count.
    const char* entry = std::getenv("DBLOCK_TEST_ENTRY");
    for (const auto& kv : totals())
      out << (entry && *entry ? "entry=" + std::string(entry) + " " : std::string())
          << "backend=" << kv.first << " passed=" << kv.second.passed
          << " failed=" << kv.second.failed << " skipped=" << kv.second.skipped << "\n";
    if (failures().empty()) return;
    std::ofstream failed(std::string(dir) + "/failed-" + std::to_string(::getpid()) + ".txt");
    for (const auto& f : failures())
      failed << f << "\n";
  }

 private:
  std::string first_failure_;
};
CATCH_REGISTER_LISTENER(summary_listener)

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--worker") {
    std::vector<std::string> args(argv + 3, argv + argc);
    return dblock::test::run_worker(argv[2], args);
  }
  return Catch::Session().run(argc, argv);
}
