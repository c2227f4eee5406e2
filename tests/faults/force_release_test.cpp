// force_release() runs its takeover (fence + 1, new owner token, lease ended) and its audit row in
// one write transaction. When the reply to its COMMIT is lost, the call must report
// errc::in_doubt (never connection_lost, which would invite a blind retry that bumps the fence and
// audits twice), say whether the outcome is final (the broken server session has been ended), and
// the data read back must be all or nothing: fence + 1 with exactly one audit row, or no change.
//
// The loss is made by the loopback proxy, on the connection that sends "COMMIT", in three ways:
//   reply:   COMMIT is forwarded, the server's reply dropped, the connection reset (the server
//            committed: the outcome must be "applied");
//   request: the bytes carrying COMMIT are dropped and the connection reset (the server never got
//            COMMIT and rolls back when the session ends: the outcome must be "nothing");
//   race:    COMMIT is forwarded and the connection reset at once, without waiting for the reply
//            (the server may or may not commit before it sees the reset: either outcome; on
//            loopback the server has, so far, always read COMMIT and committed first).
//
// SQLite has no cut variant: it runs in-process on a local file, with no connection whose reply
// could be lost, so its COMMIT either returns or fails with a definite outcome. Its test checks
// that force_release commits the takeover and the audit row together and that a failing call
// leaves no audit row.
#include <soci/soci.h>

#include <map>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "proxy.hpp"

using namespace dblock::test::faults;

namespace {

const char* const final_text = "the server session has been ended";
const char* const not_final_text = "could not be confirmed ended";

// The audit rows of `name` (the test's own prefix holds only this test's rows).
std::vector<forced_release> audit_of(const database& db, const std::string& name) {
  std::vector<forced_release> out;
  for (auto& f : recent_forced_releases(db, 10000))
    if (f.name == name) out.push_back(std::move(f));
  return out;
}

// What the database holds for `name` after a force_release of a lease held with `token` at
// `fence`, read on a direct (never proxied) connection.
enum class outcome { applied, nothing, half };

struct readback {
  outcome what = outcome::half;
  std::string detail;
};

readback read_back(const context& ctx, const std::string& name, std::int64_t fence,
                   const std::string& token) {
  auto row = dblock::test::read_lease(ctx.db.connect(), name);
  const auto audit = audit_of(ctx.db, name);
  readback r;
  r.detail =
      "row " +
      (row ? "fence " + std::to_string(row->fence) + " hold_count " +
                 std::to_string(row->hold_count) + " ours " +
                 std::to_string(row->owner_token == token)
           : std::string("missing")) +
      ", audit rows " + std::to_string(audit.size()) +
      (audit.empty() ? std::string() : " (new_fence " + std::to_string(audit[0].new_fence) + ")");
  if (!row) return r;
  if (row->fence == fence + 1 && row->owner_token != token && row->hold_count == 0 &&
      audit.size() == 1 && audit[0].previous_fence == fence && audit[0].new_fence == fence + 1 &&
      audit[0].previous_owner == token && audit[0].was_held)
    r.what = outcome::applied;
  else if (row->fence == fence && row->owner_token == token && row->hold_count == 1 &&
           audit.empty())
    r.what = outcome::nothing;
  return r;
}

const char* name_of(outcome o) {
  return o == outcome::applied ? "applied" : o == outcome::nothing ? "nothing" : "HALF";
}

}  // namespace

DBLOCK_TEST_SERVERS("force_release: a lost COMMIT reply is in_doubt, never connection_lost",
                    "[faults][force-release]") {
  const int trials = count(21, 150);
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  const std::string via_url = url_via(ctx.url, proxy.port());
  lease_options lo;
  lo.ttl = std::chrono::seconds(60);

  // Control: through the same proxy with nothing armed, force_release succeeds: fence + 1 and
  // exactly one audit row.
  {
    const std::string name = "fr-control-" + random_suffix();
    lease_lock holder(ctx.db, name, lo);
    auto g = holder.try_acquire();
    REQUIRE(g);
    auto via = open_db(via_url, ctx.prefix, 2);
    auto f = force_release(via, name, "control", "force_release_test");
    CHECK(f.previous_fence == g->fence());
    CHECK(f.new_fence == g->fence() + 1);
    auto r = read_back(ctx, name, g->fence(), g->owner_token());
    INFO(r.detail);
    CHECK(r.what == outcome::applied);
    CHECK(proxy.cuts() == 0);
  }

  // mode 0: reply dropped, 1: request dropped, 2: forwarded then reset at once.
  const char* const modes[] = {"reply", "request", "race"};
  long long hits = 0, in_doubt = 0, final_msgs = 0, not_final_msgs = 0, half = 0, wrong = 0;
  std::map<std::string, long long> seen;  // "<mode>:<outcome>" -> trials
  std::vector<std::string> problems;
  const long long t0 = monotonic_ns();
  for (int i = 0; i < trials; ++i) {
    const int mode = i % 3;
    const std::string name = "fr-" + std::to_string(i) + "-" + random_suffix();
    lease_lock holder(ctx.db, name, lo);
    auto g = holder.try_acquire();
    REQUIRE(g);
    const std::int64_t fence = g->fence();
    const std::string token = g->owner_token();
    // A fresh handle per trial: its connections are new, so "COMMIT" can only match the
    // force_release's own COMMIT.
    auto via = open_db(via_url, ctx.prefix, 2);
    via.ping();
    const long long cuts_before = proxy.cuts();
    if (mode == 0)
      proxy.cut_reply_to("COMMIT");
    else
      proxy.cut_request_to("COMMIT", mode == 2);
    std::optional<errc> code;
    std::string message;
    try {
      (void)force_release(via, name, "trial " + std::to_string(i), "force_release_test");
    } catch (const error& e) {
      code = e.kind();
      message = e.what();
    }
    const bool hit = proxy.cuts() > cuts_before;
    proxy.cut_reply_to("");  // disarm whatever did not fire
    proxy.cut_request_to("", false);
    hits += hit;
    const bool is_final = message.find(final_text) != std::string::npos;
    const bool is_not_final = message.find(not_final_text) != std::string::npos;
    if (code == errc::in_doubt) {
      ++in_doubt;
      final_msgs += is_final;
      not_final_msgs += is_not_final;
    }
    // An outcome that is not final may still land: give it time before reading back.
    if (is_not_final) std::this_thread::sleep_for(std::chrono::seconds(6));
    const readback r = read_back(ctx, name, fence, token);
    ++seen[std::string(modes[mode]) + ":" + name_of(r.what)];
    std::string bad;
    if (!hit) {
      if (code)
        bad = "no cut, but error " + std::string(to_string(*code)) + ": " + message;
      else if (r.what != outcome::applied)
        bad = "no cut, success, but not applied";
    } else if (code != errc::in_doubt) {
      bad = "COMMIT cut, but " + (code ? "error " + std::string(to_string(*code)) + ": " + message
                                       : std::string("no error"));
    } else if (is_final == is_not_final) {
      bad = "in_doubt message does not say whether the outcome is final: " + message;
    }
    if (r.what == outcome::half) ++half;
    // What the server got decides the outcome of the deterministic modes.
    if (hit && mode == 0 && r.what != outcome::applied)
      bad += " reply cut (server committed) but outcome " + std::string(name_of(r.what));
    if (hit && mode == 1 && r.what != outcome::nothing)
      bad += " request cut (server never got COMMIT) but outcome " + std::string(name_of(r.what));
    if (!bad.empty() || r.what == outcome::half) {
      ++wrong;
      problems.push_back("trial " + std::to_string(i) + " (" + modes[mode] + "): " + bad + "; " +
                         r.detail);
    }
    // The old holder agrees with the row: lease_lost after a takeover, still renewable if not.
    if (r.what == outcome::applied)
      CHECK(code_of([&] { g->renew(); }) == errc::lease_lost);
    else if (r.what == outcome::nothing)
      CHECK_NOTHROW(g->release());
  }
  const double ms = static_cast<double>(monotonic_ns() - t0) / 1e6;
  std::string seen_text;
  for (const auto& kv : seen)
    seen_text += " " + kv.first + "=" + std::to_string(kv.second);
  INFO(ctx.backend << ": " << trials << " trials in " << ms << " ms, COMMIT cuts " << hits
                   << ", in_doubt " << in_doubt << " (final " << final_msgs << ", not final "
                   << not_final_msgs << "), outcomes:" << seen_text);
  for (const auto& p : problems)
    UNSCOPED_INFO(p);
  CHECK(wrong == 0);
  CHECK(half == 0);
  REQUIRE(hits > 0);  // a run that injected nothing proves nothing
  CHECK(in_doubt == hits);
  CHECK(not_final_msgs == 0);  // the proxied server is reachable: the session can be ended
  // Both outcomes were seen (the reply and request modes force one each).
  CHECK(seen["reply:applied"] > 0);
  CHECK(seen["request:nothing"] > 0);
  report(
      "force-release-lost-commit", ctx.backend, trials, hits, wrong + half,
      "in_doubt=" + std::to_string(in_doubt) + " final=" + std::to_string(final_msgs) + seen_text);
}

DBLOCK_TEST_ONLY("sqlite",
                 "force_release commits the takeover and its audit row together; a failing call "
                 "audits nothing",
                 "[faults][force-release]") {
  lease_options lo;
  lo.ttl = std::chrono::seconds(60);
  const std::string name = "fr-sqlite-" + random_suffix();
  lease_lock holder(ctx.db, name, lo);
  auto g = holder.try_acquire();
  REQUIRE(g);
  // Success: fence + 1, the row taken over and ended, exactly one audit row for it.
  auto f = force_release(ctx.db, name, "stuck", "force_release_test");
  CHECK(f.previous_fence == g->fence());
  CHECK(f.new_fence == g->fence() + 1);
  CHECK(f.was_held);
  {
    auto r = read_back(ctx, name, g->fence(), g->owner_token());
    INFO(r.detail);
    CHECK(r.what == outcome::applied);
  }
  CHECK(code_of([&] { g->renew(); }) == errc::lease_lost);

  // Failures write nothing: an unknown name is not_found, a bad reason invalid_argument.
  CHECK(code_of([&] { (void)force_release(ctx.db, "fr-no-such-" + random_suffix(), "r", "me"); }) ==
        errc::not_found);
  CHECK(code_of([&] { (void)force_release(ctx.db, name, std::string(1001, 'r'), "me"); }) ==
        errc::invalid_argument);
  CHECK(recent_forced_releases(ctx.db, 100).size() == 1);

  // A force_release whose audit insert fails after the takeover UPDATE has run (the audit table
  // is renamed away) rolls back whole: no fence bump without its audit row.
  const std::string other = "fr-sqlite-half-" + random_suffix();
  lease_lock holder2(ctx.db, other, lo);
  auto g2 = holder2.try_acquire();
  REQUIRE(g2);
  const std::string audit_table = dblock::test::tables_of(ctx.db).audit;
  ctx.exec("ALTER TABLE " + audit_table + " RENAME TO " + audit_table + "_away");
  std::optional<errc> code;
  std::string message;
  try {
    (void)force_release(ctx.db, other, "audit table gone", "me");
  } catch (const error& e) {
    code = e.kind();
    message = e.what();
  }
  ctx.exec("ALTER TABLE " + audit_table + "_away RENAME TO " + audit_table);
  INFO("force_release without its audit table: " << message);
  CHECK(code.has_value());
  CHECK(code != errc::in_doubt);
  auto r2 = read_back(ctx, other, g2->fence(), g2->owner_token());
  INFO(r2.detail);
  CHECK(r2.what == outcome::nothing);
  CHECK(recent_forced_releases(ctx.db, 100).size() == 1);
  CHECK_NOTHROW(g2->renew());
  // With the table back it goes through, atomically again.
  (void)force_release(ctx.db, other, "table back", "me");
  r2 = read_back(ctx, other, g2->fence(), g2->owner_token());
  CHECK(r2.what == outcome::applied);
  CHECK(recent_forced_releases(ctx.db, 100).size() == 2);
}
