// The connection-limited API client example on every backend: with the semaphore the API never
// sees more than K calls at once and every call is recorded once (and K at once really happen);
// without it (the negative control) the peak exceeds K.
#include <regex>
#include <string>

#include "harness.hpp"
#include "run_program.hpp"

namespace {

// "peak concurrent calls P (allowed K)" from the example's summary line; -1 when absent.
int peak_of(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(peak concurrent calls (\d+) \(allowed (\d+)\))")))
    return -1;
  return std::stoi(m[1]);
}

}  // namespace

DBLOCK_TEST("example api_client_limit: at most K calls at once, every call recorded",
            "[examples][semaphore]") {
  const dblock::test::example_run ex(ctx, "api_client_limit", "acl_", {"api_gauge", "api_calls"},
                                     "--permits 3 --workers 8");
  dblock::test::check_run(ex.cmd + " --calls 8 --call-ms 20", 0, [](const auto& r) {
    CHECK(r.output.find("calls 64 of 64, recorded 64") != std::string::npos);
    const int peak = peak_of(r.output);
    CHECK(peak <= 3);
    CHECK(peak >= 2);  // permits really overlap
    CHECK(r.output.find("verdict: invariant held") != std::string::npos);
  });
  dblock::test::check_run(ex.cmd + " --calls 4 --call-ms 60 --no-semaphore", 1, [](const auto& r) {
    CHECK(peak_of(r.output) > 3);
    CHECK(r.output.find("invariant BROKEN") != std::string::npos);
  });
}
