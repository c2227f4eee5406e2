// The rows of the suite and their registration. Each family file registers its rows in one table,
// a function that returns them for a backend; run() (suite.cpp) lists those functions in its
// registration table, plans the rows --only selects and runs them in that order.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "harness.hpp"
#include "suite.hpp"

namespace dblock::bench {

/// How the driver runs a row.
enum class schedule {
  rounds,     ///< measure() with `setup` at every client count, --rounds times; the median counts
  contended,  ///< `run` once per client count above one (the handoff rows)
  once,       ///< `run` once per backend (the watchdog rows)
  per_count,  ///< `run` once per client count, on no backend (redis.lock, harness.noop)
  external,   ///< `run` once per client count on a backend: an outside client measures (pgbench)
};

/// One row of the suite: an operation, as its family registers it.
struct row {
  std::string name;   ///< e.g. "dblock.lease"
  std::string kind;   ///< floor, dblock, feature, alternative, handoff, scale
  std::string floor;  ///< the row a figure is divided by (the ratio column); empty: none
  std::string note;   ///< the note of the result, before what the measurement adds to it
  /// schedule::rounds: builds one measuring thread's operation (and its connection)
  std::function<cycle_fn(backend_ctx&, int thread)> setup{};
  bool named_only = false;  ///< runs only when --only names it (it costs a long set-up)
  schedule when = schedule::rounds;
  /// The other schedules: the whole measurement at `clients` (no backend for per_count); the
  /// note it returns is appended to `note`. Its exceptions end the run.
  std::function<result(backend_ctx*, int clients, std::ostream& progress)> run{};
  /// Runs once per backend before the measurements when the row is planned (fills its tables).
  std::function<void(backend_ctx&, std::ostream& progress)> prepare{};
  /// schedule::rounds: why a round succeeded not once, appended to its note (empty: nothing).
  std::function<std::string(const backend_ctx&)> why_none{};
  std::string selected_as{};  ///< --only selects the row by this name (empty: by its own)
  std::string skipped{};      ///< why it cannot run: said once in its place instead of running
};

/// A row that runs by `when` (not schedule::rounds): `run` makes its whole measurement.
inline row make_row(std::string name, std::string kind, std::string floor, std::string note,
                    schedule when, decltype(row::run) run) {
  row r{std::move(name), std::move(kind), std::move(floor), std::move(note)};
  r.when = when;
  r.run = std::move(run);
  return r;
}

/// A family's registration table: its rows on backend `b` (those that run there).
using family_rows = std::vector<row> (*)(backend_ctx& b, const options& o);

std::vector<row> lease_rows(backend_ctx& b, const options& o);        // lease_rows.cpp
std::vector<row> kind_rows(backend_ctx& b, const options& o);         // kind_rows.cpp
std::vector<row> data_rows(backend_ctx& b, const options& o);         // data_rows.cpp
std::vector<row> alternative_rows(backend_ctx& b, const options& o);  // alternative_rows.cpp
std::vector<row> handoff_rows(backend_ctx& b, const options& o);      // handoff_rows.cpp
std::vector<row> watchdog_rows(backend_ctx& b, const options& o);     // watchdog_rows.cpp
/// The rows on no database (schedule::per_count): redis.lock and harness.noop
/// (alternative_rows.cpp).
std::vector<row> backendless_rows(const options& o);

/// --only: comma-separated parts; an operation runs when its name contains one of them, or is
/// one preceded by '=' (all run when it is empty).
bool selected(const std::string& only, const std::string& name);
/// Whether --only `only` selects row `r` (selected(), named_only and selected_as).
bool wanted(const row& r, const std::string& only);

}  // namespace dblock::bench
