#include "report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

namespace dblock::bench {
namespace {

// Handoff rows: handoffs/s against 1 / (hold + the one-client lease cycle), the rate a lock
// reaches when each handoff costs no more than one uncontended acquire and release. The hold is
// the one measured (sleep_for() oversleeps); the cycle is dblock.lease at one client of the
// same run (no figure without it).
void rate_against_lease_cycle(std::vector<result>& results) {
  for (auto& r : results) {
    const auto hold = r.figures.find("hold_mean_us");
    if (r.kind != "handoff" || hold == r.figures.end() || r.per_second <= 0) continue;
    for (const auto& l : results)
      if (l.label == r.label && l.operation == "dblock.lease" && l.clients == 1 &&
          l.per_second > 0) {
        const double bound = 1e6 / (hold->second + 1e6 / l.per_second);
        r.figures["rate_over_hold_plus_lease_cycle"] = r.per_second / bound;
        char extra[96];
        std::snprintf(extra, sizeof extra, "; %.2f x 1/(hold %.0f us + lease cycle %.0f us)",
                      r.per_second / bound, hold->second, 1e6 / l.per_second);
        r.note += extra;
      }
  }
}

constexpr int label_width = 20;

nlohmann::json to_json(const result& r) {
  nlohmann::json j = {{"backend", r.backend},
                      {"label", r.label},
                      {"operation", r.operation},
                      {"kind", r.kind},
                      {"clients", r.clients},
                      {"per_second", r.per_second},
                      {"p50_us", r.p50_us},
                      {"p99_us", r.p99_us},
                      {"operations", r.operations},
                      {"successes", r.successes},
                      {"errors", r.errors},
                      {"rounds", r.rounds},
                      {"note", r.note}};
  if (!r.floor.empty()) j["floor"] = r.floor;
  if (r.ratio) j["ratio"] = *r.ratio;
  if (r.round_trips) j["round_trips_per_op"] = *r.round_trips;
  if (r.woken_per_release) j["woken_per_release"] = *r.woken_per_release;
  if (r.fairness) {
    j["fairness_max_over_mean_wait"] = *r.fairness;
    j["wait_mean_us"] = r.wait_mean_us;
    j["wait_max_us"] = r.wait_max_us;
  }
  for (const auto& [k, v] : r.figures)
    j[k] = v;
  if (r.errors) j["first_error"] = r.first_error;
  return j;
}

// Many watched leases: what holding them cost.
void print_watchdog(std::ostream& out, const std::vector<result>& results) {
  for (const auto& r : results)
    if (r.operation == "dblock.watchdog")
      out << "\nwatchdog, " << r.label << ": " << r.note
          << (r.errors && !r.first_error.empty() ? " (" + r.first_error + ")" : "") << "\n";
}

// Handoffs: wake-ups per release, fairness, and the rate against 1/(hold + lease cycle).
void print_handoffs(std::ostream& out, const std::vector<result>& results) {
  bool handoff_header = false;
  for (const auto& r : results) {
    if (r.kind != "handoff" || !r.woken_per_release) continue;
    if (!handoff_header)
      out << "\nhandoffs (waiters woken per release; longest / mean acquire wait, in time and "
             "in turns, the grants to others during a wait; handoffs/s over 1 / (measured hold + "
             "one-client dblock.lease cycle)):\n";
    handoff_header = true;
    const auto rate = r.figures.find("rate_over_hold_plus_lease_cycle");
    out << "  " << std::left << std::setw(label_width) << r.label << std::setw(22) << r.operation
        << std::right << std::setw(4) << r.clients << " clients  woken " << std::fixed
        << std::setprecision(2) << *r.woken_per_release << "  max/mean " << r.fairness.value_or(0);
    const auto turns = r.figures.find("fairness_max_over_mean_turns");
    if (turns != r.figures.end()) out << "  in turns " << turns->second;
    out << "  rate ";
    if (rate != r.figures.end())
      out << rate->second << "x\n";
    else
      out << "- (no one-client dblock.lease row)\n";
  }
}

// Contention collapse: hot-key successful cycles at the most clients over one client.
nlohmann::json print_collapse(std::ostream& out, const std::vector<result>& results,
                              const std::vector<std::unique_ptr<backend_ctx>>& ctxs,
                              int max_clients) {
  nlohmann::json collapse = nlohmann::json::object();
  out << "\ncontention collapse (one hot key, successful cycles/s at " << max_clients
      << " clients / at 1 client):\n";
  for (auto& b : ctxs)
    for (const char* op : {"raw.lease_hot", "dblock.lease_hot"}) {
      double one = 0, many = 0;
      for (const auto& r : results)
        if (r.label == b->label && r.operation == op) {
          if (r.clients == 1) one = r.per_second;
          if (r.clients == max_clients) many = r.per_second;
        }
      if (one <= 0 || max_clients == 1) continue;
      out << "  " << std::left << std::setw(label_width) << b->label << std::setw(18) << op
          << std::right << std::fixed << std::setprecision(2) << many / one << "x\n";
      collapse[b->label][op] = many / one;
    }
  return collapse;
}

// The hot item as 16 segments against the same item as one row (successful decrements/s).
void print_hot_item(std::ostream& out, const std::vector<result>& results) {
  bool stock_header = false;
  for (const auto& r : results) {
    const std::string one_row = r.operation == "dblock.stock_take"    ? "dblock.cas"
                                : r.operation == "dblock.stock_order" ? "dblock.cas_order"
                                                                      : "";
    if (one_row.empty()) continue;
    for (const auto& c : results)
      if (c.label == r.label && c.operation == one_row && c.clients == r.clients &&
          c.per_second > 0) {
        if (!stock_header)
          out << "\nhot item: segmented stock (16 segments) / one row with compare_and_set:\n";
        stock_header = true;
        out << "  " << std::left << std::setw(label_width) << r.label << std::setw(20)
            << (r.operation == "dblock.stock_take" ? "decrement alone" : "with an order row")
            << std::right << std::setw(4) << r.clients << " clients " << std::fixed
            << std::setprecision(2) << r.per_second / c.per_second << "x\n";
      }
  }
}

// Through a transaction-mode pooler against the same backend measured directly (the first
// direct URL of that backend): dblock's lease cycle and its raw floor.
void print_pooler(std::ostream& out, const std::vector<result>& results,
                  const std::vector<std::unique_ptr<backend_ctx>>& ctxs) {
  for (auto& b : ctxs) {
    if (b->db.options().pooler != dblock::pooler_mode::transaction) continue;
    const auto direct = std::find_if(ctxs.begin(), ctxs.end(), [&](const auto& d) {
      return d->backend == b->backend && d->db.options().pooler != dblock::pooler_mode::transaction;
    });
    if (direct == ctxs.end()) continue;
    bool header = false;
    for (const auto& r : results) {
      if (r.label != b->label || r.kind == "handoff") continue;
      for (const auto& d : results)
        if (d.label == (*direct)->label && d.operation == r.operation && d.clients == r.clients &&
            d.per_second > 0) {
          if (!header)
            out << "\nthrough the pooler / direct (" << b->label << " / " << (*direct)->label
                << "):\n";
          header = true;
          out << "  " << std::left << std::setw(26) << r.operation << std::right << std::setw(4)
              << r.clients << " clients " << std::fixed << std::setprecision(2)
              << r.per_second / d.per_second << "x\n";
        }
    }
  }
}

}  // namespace

std::string fmt_rate(double v) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(v < 100 ? 1 : 0) << v;
  std::string out = s.str();
  auto dot = out.find('.');
  int pos = static_cast<int>(dot == std::string::npos ? out.size() : dot) - 3;
  for (; pos > 0; pos -= 3)
    out.insert(static_cast<std::size_t>(pos), ",");
  return out;
}

void finish_results(std::vector<result>& results) {
  // Ratios: a dblock figure divided by its floor at the same backend and client count.
  for (auto& r : results) {
    if (r.floor.empty()) continue;
    for (const auto& f : results)
      if (f.label == r.label && f.operation == r.floor && f.clients == r.clients &&
          f.per_second > 0) {
        r.ratio = r.per_second / f.per_second;
        // A handoff row against another (a semaphore's against the lease's): latency too.
        if (r.kind == "handoff" && f.p50_us > 0) {
          r.figures["p50_over_floor"] = r.p50_us / f.p50_us;
          char extra[64];
          std::snprintf(extra, sizeof extra, "; p50 %.2f x %s's", r.p50_us / f.p50_us,
                        f.operation.c_str());
          r.note += extra;
        }
      }
  }
  std::stable_sort(results.begin(), results.end(), [](const result& a, const result& b) {
    return std::tie(a.label, a.operation, a.clients) < std::tie(b.label, b.operation, b.clients);
  });
  rate_against_lease_cycle(results);
}

void print_table(std::ostream& out, const std::vector<result>& rs) {
  out << std::left << std::setw(label_width) << "backend" << std::setw(26) << "operation"
      << std::right << std::setw(8) << "clients" << std::setw(12) << "ops/s" << std::setw(10)
      << "p50 us" << std::setw(10) << "p99 us" << std::setw(7) << "rt/op" << std::setw(8) << "ratio"
      << "  vs\n";
  std::string last;
  for (const auto& r : rs) {
    if (!last.empty() && last != r.label + "|" + r.operation) {
      if (last.substr(0, r.label.size() + 1) != r.label + "|") out << '\n';
    }
    last = r.label + "|" + r.operation;
    out << std::left << std::setw(label_width) << r.label << std::setw(26) << r.operation
        << std::right << std::setw(8) << r.clients << std::setw(12) << fmt_rate(r.per_second)
        << std::setw(10) << std::fixed << std::setprecision(0) << r.p50_us << std::setw(10)
        << r.p99_us << std::setw(7) << std::setprecision(1);
    if (r.round_trips)
      out << *r.round_trips;
    else
      out << "";
    if (r.ratio) {
      out << std::setw(8) << std::setprecision(2) << *r.ratio << "  " << r.floor;
    } else {
      out << std::setw(8) << "";
    }
    if (r.errors) out << "  (" << r.errors << " errors: " << r.first_error.substr(0, 80) << ")";
    out << '\n';
  }
}

nlohmann::json print_sections(std::ostream& out, const std::vector<result>& rs,
                              const std::vector<std::unique_ptr<backend_ctx>>& ctxs,
                              int max_clients) {
  print_watchdog(out, rs);
  print_handoffs(out, rs);
  nlohmann::json collapse = print_collapse(out, rs, ctxs, max_clients);
  print_hot_item(out, rs);
  print_pooler(out, rs, ctxs);
  return collapse;
}

int write_json(const options& o, std::chrono::system_clock::time_point t_start,
               const nlohmann::json& backends, const std::vector<result>& results,
               const nlohmann::json& collapse, std::ostream& progress) {
  nlohmann::json j;
  j["format"] = "dblock-bench/1";
  const std::time_t t = std::chrono::system_clock::to_time_t(t_start);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  j["started"] = when;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  j["host"] = host;
  j["cpus"] = std::thread::hardware_concurrency();
  j["seconds_per_measurement"] = o.seconds;
  j["rounds"] = o.repeat;
  j["clients"] = o.clients;
  j["backends"] = backends;
  j["results"] = nlohmann::json::array();
  for (const auto& r : results)
    j["results"].push_back(to_json(r));
  j["contention_collapse"] = collapse;
  std::ofstream f(o.json_path);
  f << j.dump(2) << '\n';
  if (!f) {
    progress << "bench: cannot write " << o.json_path << "\n";
    return 73;
  }
  progress << "bench: results written to " << o.json_path << "\n";
  return 0;
}

bool plot(const std::string& path, const std::vector<result>& rs, std::ostream& progress) {
  std::map<std::string, std::map<std::string, std::vector<std::pair<int, double>>>> series;
  for (const auto& r : rs)
    if (r.kind != "handoff" && r.kind != "scale")
      series[r.label][r.operation].push_back({r.clients, r.per_second});
  char dir[] = "/tmp/dblock-plot-XXXXXX";
  if (!mkdtemp(dir)) return false;
  std::ofstream gp(std::string(dir) + "/plot.gp");
  gp << "set terminal svg size 1400," << 420 * ((series.size() + 1) / 2)
     << " dynamic font 'sans,10'\nset output '" << path << "'\n";
  gp << "set multiplot layout " << (series.size() + 1) / 2 << ",2\n";
  gp << "set logscale xy\nset xtics (1,4,16)\nset grid\nset key outside right\n"
        "set xlabel 'clients'\nset ylabel 'successful ops/s'\n";
  int file = 0;
  for (const auto& [backend, ops] : series) {
    gp << "set title '" << backend << "'\nplot ";
    bool first = true;
    for (const auto& [op, pts] : ops) {
      const std::string data = std::string(dir) + "/" + std::to_string(file++) + ".dat";
      std::ofstream d(data);
      for (const auto& p : pts)
        d << p.first << ' ' << std::max(p.second, 0.1) << '\n';
      gp << (first ? "" : ", ") << "'" << data << "' using 1:2 with linespoints title '" << op
         << "'" << (op.rfind("raw.", 0) == 0 ? " dashtype 2" : "");
      first = false;
    }
    gp << '\n';
  }
  gp << "unset multiplot\n";
  gp.close();
  const std::string cmd = "gnuplot '" + std::string(dir) + "/plot.gp' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    progress << "bench: gnuplot failed or is not installed (apt-get install gnuplot-nox); no plot "
                "written\n";
    return false;
  }
  progress << "bench: plot written to " << path << '\n';
  return true;
}

}  // namespace dblock::bench
