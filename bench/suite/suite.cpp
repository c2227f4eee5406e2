// The driver of the suite: opens every backend, plans the rows --only selects from the families'
// registration tables (rows.hpp), runs them and reports (report.hpp).
#include "suite.hpp"

#include <dblock/dblock.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "core/url.hpp"
#include "harness.hpp"
#include "report.hpp"
#include "rows.hpp"

namespace dblock::bench {

bool selected(const std::string& only, const std::string& name) {
  if (only.empty()) return true;
  for (std::size_t start = 0;;) {
    const std::size_t end = only.find(',', start);
    const std::string part = only.substr(start, end == std::string::npos ? end : end - start);
    if (part.size() > 1 && part[0] == '=') {
      if (name == part.substr(1)) return true;
    } else if (!part.empty() && name.find(part) != std::string::npos) {
      return true;
    }
    if (end == std::string::npos) return false;
    start = end + 1;
  }
}

bool wanted(const row& r, const std::string& only) {
  if (r.named_only && only.empty()) return false;
  return selected(only, r.selected_as.empty() ? r.name : r.selected_as);
}

namespace {

// The registration table: the families whose rows run on every backend, in the order they run
// (each family's rows in the order of its own table). The rows on no database follow them
// (backendless_rows()).
constexpr family_rows families[] = {lease_rows,       kind_rows,    data_rows,
                                    alternative_rows, handoff_rows, watchdog_rows};

// A measurement to make: a row on a backend (none for schedule::per_count) at a client count.
struct planned {
  backend_ctx* b;
  row op;
  int clients;
};

// What a run has so far: the backends, the plan, the results.
struct run_state {
  const options& o;
  std::ostream& progress;
  std::vector<std::unique_ptr<backend_ctx>> ctxs;
  std::vector<std::vector<row>> rows;  ///< the families' rows on ctxs[i]
  nlohmann::json backends = nlohmann::json::array();
  std::vector<planned> plan;
  std::size_t total = 0;  ///< the measurements planned (a skipped row is none)
  std::size_t n = 0;      ///< those made so far
  std::vector<result> results;
};

// Plans the rows of `rows` that run by `when` and that --only selects: rounds interleaved (every
// row once per client count, repeated; the figures are medians over the rounds, so a drift of the
// machine hits the floor and dblock alike). A row that cannot run is planned once, to say why.
void plan_rows(run_state& s, backend_ctx* b, const std::vector<row>& rows, schedule when) {
  const std::vector<int> one{1};
  const std::vector<int>& counts = when == schedule::once ? one : s.o.clients;
  const int repeat = when == schedule::rounds ? s.o.repeat : 1;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (when == schedule::contended && counts[i] < 2) continue;
    for (int round = 0; round < repeat; ++round)
      for (const row& r : rows) {
        if (r.when != when || !wanted(r, s.o.only) || (!r.skipped.empty() && i > 0)) continue;
        s.plan.push_back({b, r, counts[i]});
        if (r.skipped.empty()) ++s.total;
      }
  }
}

// Opens the backend of `url`, names it for the table, and plans its rounds; prepares what the
// planned rows need.
void open(run_state& s, const std::string& url) {
  s.progress << "bench: preparing " << detail::parse_url(url).redacted << "\n";
  s.ctxs.push_back(open_backend(url, s.o));
  auto& b = *s.ctxs.back();
  const std::string base =
      b.backend + (b.db.options().pooler == dblock::pooler_mode::transaction ? "/pooler" : "");
  b.label = base;
  for (int k = 2; std::any_of(s.ctxs.begin(), s.ctxs.end() - 1,
                              [&](const auto& other) { return other->label == b.label; });
       ++k)
    b.label = base + "#" + std::to_string(k);
  s.backends.push_back({{"backend", b.backend},
                        {"label", b.label},
                        {"url", b.db.redacted_url()},
                        {"server_version", b.version}});
  auto& rows = s.rows.emplace_back();
  for (family_rows family : families)
    for (row& r : family(b, s.o))
      rows.push_back(std::move(r));
  const std::size_t first = s.plan.size();
  plan_rows(s, &b, rows, schedule::rounds);
  for (const row& r : rows)
    if (r.prepare && std::any_of(s.plan.begin() + static_cast<long>(first), s.plan.end(),
                                 [&](const planned& p) { return p.op.name == r.name; }))
      r.prepare(b, s.progress);
}

// Plans everything; progress can then say "n of N".
void plan_all(run_state& s) {
  for (const auto& url : s.o.urls)
    open(s, url);
  for (schedule when : {schedule::contended, schedule::once, schedule::external})
    for (std::size_t i = 0; i < s.ctxs.size(); ++i)
      plan_rows(s, s.ctxs[i].get(), s.rows[i], when);
  plan_rows(s, nullptr, backendless_rows(s.o), schedule::per_count);
  s.progress << "bench: " << s.total << " measurements of " << s.o.seconds << " s each ("
             << s.o.repeat << " rounds of each; about "
             << static_cast<int>(s.total * s.o.seconds * 1.15 + 0.5) << " s)\n";
}

void report(run_state& s, result r) {
  ++s.n;
  s.progress << "bench: [" << s.n << "/" << s.total << "] " << r.label << " " << r.operation
             << " clients=" << r.clients << ": " << fmt_rate(r.per_second) << " ops/s, p50 "
             << static_cast<long long>(r.p50_us) << " us"
             << (r.errors ? " (" + std::to_string(r.errors) + " errors)" : "") << "\n";
  s.results.push_back(std::move(r));
}

using round_results = std::map<std::tuple<std::string, std::string, int>, std::vector<result>>;

// One round of a schedule::rounds row; its last round reports the median over the rounds (with
// the latencies of the median round).
void run_round(run_state& s, const planned& p, round_results& rounds) {
  result r;
  try {
    r = measure(p.clients, s.o.seconds, [&](int i) { return p.op.setup(*p.b, i); });
  } catch (const std::exception& e) {
    r.clients = p.clients;
    r.errors = 1;
    r.first_error = e.what();
  }
  name_row(r, *p.b, p.op.name, p.op.kind);
  r.floor = p.op.floor;
  r.note = p.op.note;
  if (r.operations > 0 && r.successes == 0 && p.op.why_none) r.note += "; " + p.op.why_none(*p.b);
  auto& v = rounds[{r.label, r.operation, r.clients}];
  v.push_back(r);
  if (static_cast<int>(v.size()) < s.o.repeat) {
    ++s.n;
    s.progress << "bench: [" << s.n << "/" << s.total << "] " << r.label << " " << r.operation
               << " clients=" << r.clients << ": " << fmt_rate(r.per_second) << " ops/s\n";
    return;
  }
  std::sort(v.begin(), v.end(),
            [](const result& a, const result& b) { return a.per_second < b.per_second; });
  result med = v[v.size() / 2];
  long long errors = 0;
  for (const auto& x : v) {
    errors += x.errors;
    if (med.first_error.empty()) med.first_error = x.first_error;
    // A round that succeeded not once says why in its note (row::why_none).
    if (x.operations > 0 && x.successes == 0 && med.successes > 0) med.note = x.note;
  }
  med.errors = errors;
  med.rounds = static_cast<int>(v.size());
  report(s, std::move(med));
}

// Makes the planned measurements in order.
void run_plan(run_state& s) {
  round_results rounds;
  for (const planned& p : s.plan) {
    if (!p.op.skipped.empty()) {
      s.progress << "bench: " << p.op.name << " skipped: " << p.op.skipped << "\n";
    } else if (p.op.when == schedule::rounds) {
      run_round(s, p, rounds);
    } else {
      result r = p.op.run(p.b, p.clients, s.progress);
      if (p.b) {
        name_row(r, *p.b, p.op.name, p.op.kind);
      } else {
        r.operation = p.op.name;
        r.kind = p.op.kind;
      }
      r.floor = p.op.floor;
      r.note = p.op.note + r.note;
      report(s, std::move(r));
    }
  }
}

}  // namespace

int run(const options& o, std::ostream& out, std::ostream& progress) {
  if (o.urls.empty()) {
    progress << "bench: no database URL given (--url, repeatable)\n";
    return 2;
  }
  const auto t_start = std::chrono::system_clock::now();
  const int max_clients = *std::max_element(o.clients.begin(), o.clients.end());
  run_state s{o, progress, {}, {}, nlohmann::json::array(), {}, 0, 0, {}};
  plan_all(s);
  run_plan(s);

  finish_results(s.results);
  out << "\n";
  print_table(out, s.results);
  const nlohmann::json collapse = print_sections(out, s.results, s.ctxs, max_clients);
  if (!o.json_path.empty()) {
    const int rc = write_json(o, t_start, s.backends, s.results, collapse, progress);
    if (rc != 0) return rc;
  }
  for (auto& b : s.ctxs)
    drop_business_tables(*b);
  if (!o.plot_path.empty() && !plot(o.plot_path, s.results, progress)) return 1;
  return 0;
}

}  // namespace dblock::bench
