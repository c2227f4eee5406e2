// What the suite reports once its measurements are done: the ratios, the table and the sections
// after it on stdout, the JSON file (--output) and the plot (--plot).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "harness.hpp"
#include "suite.hpp"

namespace dblock::bench {

/// A rate with thousands separators (one decimal below 100).
std::string fmt_rate(double v);

/// Divides every figure that has a floor by the floor's at the same backend and client count,
/// sorts the rows as the table lists them, and rates the handoff rows against the lease cycle.
void finish_results(std::vector<result>& results);

/// The table: one line per row.
void print_table(std::ostream& out, const std::vector<result>& rs);

/// The sections after the table (watchdog, handoffs, contention collapse, the hot item, through
/// the pooler). Returns the contention collapse by label, for the JSON file.
nlohmann::json print_sections(std::ostream& out, const std::vector<result>& rs,
                              const std::vector<std::unique_ptr<backend_ctx>>& ctxs,
                              int max_clients);

/// Writes the results to o.json_path (format dblock-bench/1). Returns 0, or 73 when it cannot.
int write_json(const options& o, std::chrono::system_clock::time_point t_start,
               const nlohmann::json& backends, const std::vector<result>& results,
               const nlohmann::json& collapse, std::ostream& progress);

/// Draws ops/s against clients into `path` (SVG, gnuplot): one panel per backend, one line per
/// operation. False when it could not.
bool plot(const std::string& path, const std::vector<result>& rs, std::ostream& progress);

}  // namespace dblock::bench
