// Batch renewal under delayed replies (#19): 2,000 watched leases across 8 worker processes,
// each process's leases renewed in batches by its database handle's watchdog, held for three
// TTLs while the fault proxy delays every reply of the worker's connections.
// - Renewable delays (0-100 ms a reply: a batch of 4 round trips ends well inside the slack
//   between a renewal and the local validity's end): no lease is lost, every guard is valid.
// - Unrenewable delays (2 x TTL a reply): every lease is reported lost, and each report comes
//   while the row, read directly on the database clock, still carries our unexpired lease.
// SQLite has no connection to delay: another connection holds the whole database (BEGIN
// EXCLUSIVE) for 150 ms of every second instead, which every renewal must wait out.
// Whether renewals keep up and reports come in time depends on the machine's pace as well as on
// the batches: a run that misses only those is run again with twice the TTL (3, 6, 12 s), and
// only the last one's misses fail the test (each earlier one is printed).
#include <soci/soci.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "dblock/admin.hpp"
#include "fault_support.hpp"
#include "harness.hpp"
#include "proxy.hpp"

using namespace dblock::test::faults;

namespace {

// Checks each loss report against the rows, read directly: the reported lease must still have
// been ours and unexpired when the report came. The row is read when this thread gets to it (on a
// busy machine, later), so its expiry is judged at the report's time: the remaining time the row
// shows, plus the time that passed since the report before the read was sent.
class loss_checker {
 public:
  loss_checker(database direct, std::string pattern)
      : direct_(std::move(direct)), pattern_(std::move(pattern)), thread_([this] { run(); }) {}
  ~loss_checker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void reported(const std::string& name, const std::string& token) {
    const auto at = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lk(mu_);
    ++received_;
    pending_.push_back({name, token, at});
    cv_.notify_all();
  }
  // The reports so far, how many were checked and how many of those came late (a consistent
  // snapshot: every report received has been checked when it returns, unless the wait ran out).
  struct tally {
    long long received = 0, checked = 0, late = 0;
  };
  tally counts() {
    std::unique_lock<std::mutex> lk(mu_);
    if (failed_) throw error(errc::timeout, "loss checker: " + why_);
    // At once when every report was checked; on a busy machine the reads take longer.
    cv_.wait_for(lk, milliseconds(30000), [&] { return pending_.empty(); });
    return {received_, checked_, late_};
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) continue;
      auto batch = std::move(pending_);
      pending_.clear();
      lk.unlock();
      list_options lo;
      lo.pattern = pattern_;
      lo.limit = 100000;
      lo.include_free = true;  // an expired row too: whether it had expired at the report
      const auto read_at = std::chrono::steady_clock::now();
      std::map<std::string, lock_info> rows;
      try {
        for (auto& li : list_locks(direct_, lo))
          rows[li.name] = std::move(li);
      } catch (const std::exception& e) {  // the worker says so (counts() throws)
        lk.lock();
        failed_ = true;
        why_ = e.what();
        pending_.clear();
        cv_.notify_all();
        continue;
      }
      lk.lock();
      for (const auto& r : batch) {
        ++checked_;
        auto it = rows.find(r.name);
        const bool ours =
            it != rows.end() && it->second.owner_token == r.token && it->second.hold_count > 0;
        const auto since_report =
            std::chrono::duration_cast<std::chrono::microseconds>(read_at - r.at);
        if (!ours || it->second.expires_in + since_report <= std::chrono::microseconds(0)) ++late_;
      }
      cv_.notify_all();
    }
  }

  database direct_;
  std::string pattern_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct report {
    std::string name, token;
    std::chrono::steady_clock::time_point at;
  };
  std::vector<report> pending_;
  long long received_ = 0, checked_ = 0, late_ = 0;
  bool stop_ = false, failed_ = false;
  std::string why_;
  std::thread thread_;
};

// What the worker's watchdog saw: its renewal rounds (how many, their slowest) and the first
// causes of failed ones, printed when the worker lost leases it could renew.
class renewal_log : public listener {
 public:
  void renewed(std::size_t leases, std::size_t) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++rounds_;
    renewed_ += static_cast<long long>(leases);
  }
  void renew_latency(std::chrono::microseconds latency) override {
    std::lock_guard<std::mutex> lk(mu_);
    slowest_us_ = std::max(slowest_us_, static_cast<long long>(latency.count()));
  }
  void renew_failed(std::string_view, const error& cause) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++failed_;
    if (causes_.size() < 3) causes_.insert(cause.what());
  }
  std::string summary() {
    std::lock_guard<std::mutex> lk(mu_);
    std::ostringstream out;
    out << rounds_ << " renewal rounds renewed " << renewed_ << " leases, the slowest took "
        << slowest_us_ / 1000 << " ms; " << failed_ << " lease renewals failed";
    for (const auto& c : causes_)
      out << "; " << c;
    return out.str();
  }

 private:
  std::mutex mu_;
  long long rounds_ = 0, renewed_ = 0, slowest_us_ = 0, failed_ = 0;
  std::set<std::string> causes_;
};

}  // namespace

// args: backend url prefix leases ttl_ms delay_ms stem out_file go_file
// Takes its leases, writes "<out_file>.ready", waits for go_file, holds for three TTLs with every
// reply delayed and writes "R <acquired> <lost> <checked> <late> <valid> <take_ms>". Exits 10 when
// it could not take its leases or check its reports (set-up, not what is tested).
DBLOCK_WORKER(batch_renewal_worker) {
  const std::string backend = args.at(0), url = args.at(1), prefix = args.at(2);
  const int leases = std::stoi(args.at(3)), ttl_ms = std::stoi(args.at(4));
  const int delay_ms = std::stoi(args.at(5));
  const std::string stem = args.at(6);
  std::unique_ptr<tcp_proxy> proxy;
  std::string via = url;
  if (backend != "sqlite") {
    auto [host, port] = url_host_port(url);
    proxy = std::make_unique<tcp_proxy>(host, port);
    via = url_via(url, proxy->port());
  }
  database_options o = with_prefix(prefix);
  o.pool_size = 3;
  auto log = std::make_shared<renewal_log>();
  o.events = log;
  database db(via, o);
  loss_checker checker(open_db(url, prefix, 2), stem + "*");
  std::vector<lease_lock> locks;
  std::vector<lease_guard> guards;
  std::vector<std::string> tokens(static_cast<std::size_t>(leases));
  locks.reserve(static_cast<std::size_t>(leases));
  const auto take_from = std::chrono::steady_clock::now();
  for (int i = 0; i < leases; ++i) {
    lease_options lo;
    lo.ttl = milliseconds(ttl_ms);
    lo.watchdog = true;
    const std::string name = stem + std::to_string(i);
    lo.on_lost = [&, name, i](const error&) {
      checker.reported(name, tokens[static_cast<std::size_t>(i)]);
    };
    locks.emplace_back(db, name, lo);
    // Taking the leases is set-up, not what is tested: a wait rides out a server that stalls
    // for a moment on a loaded machine (a try_acquire ends at TTL less margin, 2.7 s here).
    try {
      auto g = locks.back().acquire(milliseconds(10 * ttl_ms));
      tokens[static_cast<std::size_t>(i)] = g.owner_token();
      guards.push_back(std::move(g));
    } catch (const error& e) {
      std::fprintf(stderr, "batch_renewal_worker: lease %d not taken: %s\n", i, e.what());
      return 10;
    }
  }
  const auto take_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - take_from)
          .count();
  // The hold starts when every worker holds its leases: a worker still taking its own must not
  // compete with the others' delayed renewals (and their reports) for a loaded machine.
  write_file_atomic(args.at(7) + ".ready", "ready\n");
  if (!wait_for_file(args.at(8), milliseconds(60000 + 10 * ttl_ms))) return 11;
  if (proxy) proxy->delay_all_replies(milliseconds(delay_ms));
  std::this_thread::sleep_for(milliseconds(3 * ttl_ms));
  long long valid = 0;
  for (const auto& g : guards)
    valid += g.valid() ? 1 : 0;
  // Reports until now: the cut below makes renewals still in flight fail, and their losses
  // (after the hold, on the way out) are not what the hold is judged by.
  loss_checker::tally t;
  try {
    t = checker.counts();
  } catch (const error& e) {
    std::fprintf(stderr, "batch_renewal_worker: %s\n", e.what());
    return 10;
  }
  if (proxy) {
    proxy->delay_all_replies(milliseconds(0));
    proxy->cut_all();  // batches still waiting for delayed replies give up
  }
  for (auto& g : guards) {
    try {
      g.release();
    } catch (const std::exception&) {
    }
  }
  if (delay_ms < ttl_ms && t.received > 0)
    std::fprintf(stderr, "batch_renewal_worker (delay %d ms, TTL %d ms): lost %lld: %s\n", delay_ms,
                 ttl_ms, t.received, log->summary().c_str());
  std::ostringstream out;
  out << "R " << guards.size() << " " << t.received << " " << t.checked << " " << t.late << " "
      << valid << " " << take_ms << "\n";
  write_file_atomic(args.at(7), out.str());
  return 0;
}

namespace {

// One run of the scenario at `ttl_ms`: per worker, what it wrote (and its exit status).
struct batch_run {
  std::vector<int> statuses;
  std::vector<std::string> reports;
  long long blocks = 0;
};

batch_run run_batches(context& ctx, int workers, int per_worker, int ttl_ms,
                      const std::vector<int>& delays) {
  const bool sqlite = ctx.backend == "sqlite";
  temp_dir dir("faults-batch-renew");
  process_set ps;
  const std::string stem = "batch/" + random_suffix() + "/";
  for (int w = 0; w < workers; ++w)
    ps.spawn(
        "batch_renewal_worker",
        {ctx.backend, ctx.url, ctx.prefix, std::to_string(per_worker), std::to_string(ttl_ms),
         std::to_string(delays[static_cast<std::size_t>(w)]), stem + "w" + std::to_string(w) + "/",
         dir.file("w" + std::to_string(w)), dir.file("go")});
  // Every worker holds its leases (or one of them has ended) before the hold starts.
  for (int w = 0; w < workers; ++w)
    if (!wait_for_file(dir.file("w" + std::to_string(w)) + ".ready",
                       milliseconds(60000 + 10 * ttl_ms)))
      break;
  write_file_atomic(dir.file("go"), "go\n");
  // SQLite: the whole database held 150 ms of every second while the workers hold (eight
  // processes' renewals then queue for the write lock; longer holds starve one now and then
  // under the sanitizers, a limit of SQLite's busy handler, not of the batches).
  std::atomic<bool> done{false};
  batch_run r;
  std::thread blocker;
  if (sqlite)
    blocker = std::thread([&] {
      auto c = ctx.db.connect();
      while (!done.load()) {
        c.session() << "BEGIN EXCLUSIVE";
        std::this_thread::sleep_for(milliseconds(150));
        c.session() << "COMMIT";
        ++r.blocks;
        std::this_thread::sleep_for(milliseconds(850));
      }
    });
  r.statuses = ps.wait_all(std::chrono::seconds(120 + 6 * ttl_ms / 1000));
  done = true;
  if (blocker.joinable()) blocker.join();
  for (int w = 0; w < workers; ++w) {
    const std::string f = dir.file("w" + std::to_string(w));
    r.reports.push_back(::access(f.c_str(), R_OK) == 0 ? read_file(f) : std::string());
  }
  return r;
}

}  // namespace

DBLOCK_TEST("watched leases in batches: renewable delays lose none, others are reported in time",
            "[faults][renewal][serial]") {
  // Serial: "every loss reported before its expiry" needs the watchdog's threads to get the CPU
  // (a CI run once starved them beside another fault entry's 8 processes, and every lease of a
  // worker was reported late).
  const int workers = 8, per_worker = 250;
  const bool sqlite = ctx.backend == "sqlite";
  at_machine_pace([&](int scale, bool last) {
    const int ttl_ms = 3000 * scale;
    // Per worker: the delay of every reply (ms); the last two cannot renew (not on SQLite).
    std::vector<int> delays = {0, 20, 40, 60, 80, 100, 2 * ttl_ms, 2 * ttl_ms};
    if (sqlite) delays = {0, 0, 0, 0, 0, 0, 0, 0};
    const batch_run r = run_batches(ctx, workers, per_worker, ttl_ms, delays);
    // What a slower pace explains (a worker that could not take its leases in 10 TTLs, renewals
    // that did not keep up, reports that came late), as opposed to a wrong count.
    std::vector<std::string> misses;
    long long renewable_lost = 0, unrenewable_unreported = 0, late = 0, held = 0;
    for (int w = 0; w < workers; ++w) {
      const int st = r.statuses[static_cast<std::size_t>(w)];
      INFO("TTL " << ttl_ms << " ms, worker " << w << " exit status " << st);
      if ((st == 10 || st == 11 || st == -1) && !last) {
        misses.push_back(
            "worker " + std::to_string(w) +
            (st == -1 ? " did not end in time" : " could not take or check its leases"));
        continue;
      }
      REQUIRE(st == 0);
      std::istringstream in(r.reports[static_cast<std::size_t>(w)]);
      std::string k;
      long long acquired = 0, lost = 0, checked = 0, late_w = 0, valid = 0, take_ms = 0;
      REQUIRE(in >> k >> acquired >> lost >> checked >> late_w >> valid >> take_ms);
      const int delay = delays[static_cast<std::size_t>(w)];
      INFO("delay " << delay << " ms: acquired " << acquired << ", lost " << lost << ", checked "
                    << checked << ", late " << late_w << ", valid " << valid << ", taken in "
                    << take_ms << " ms");
      CHECK(acquired == per_worker);
      CHECK(checked == lost);
      held += acquired;
      late += late_w;
      const bool renewable = delay < ttl_ms;
      if (renewable)
        renewable_lost += lost;
      else
        unrenewable_unreported += per_worker - lost;
      const bool kept_up =
          renewable ? lost == 0 && valid == per_worker : lost == per_worker && valid == 0;
      if (!last && (late_w != 0 || !kept_up)) {
        std::ostringstream m;
        m << "TTL " << ttl_ms << " ms, worker " << w << " (delay " << delay << " ms): lost " << lost
          << ", late " << late_w << ", valid " << valid << " (leases taken in " << take_ms
          << " ms)";
        misses.push_back(m.str());
        continue;
      }
      CHECK(late_w == 0);
      if (renewable) {
        CHECK(lost == 0);
        CHECK(valid == per_worker);
      } else {
        CHECK(lost == per_worker);
        CHECK(valid == 0);
      }
    }
    if (!misses.empty()) return misses;
    if (sqlite) CHECK(r.blocks >= 8);
    report("19-batch-renewal-delays", ctx.backend, held,
           sqlite ? r.blocks : 2LL * per_worker + 6 * per_worker,
           renewable_lost + unrenewable_unreported + late);
    return misses;
  });
}
