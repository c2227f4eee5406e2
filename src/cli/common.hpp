// What the commands of the dblock command-line tool share: exit statuses, the common options
// (--url, --table-prefix, -v), and helpers for parsing arguments and printing results.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <string>
#include <string_view>

#include "dblock/dblock.hpp"

namespace dblock::cli {

// Documented exit statuses (docs/cli.md, "Exit statuses"), from sysexits.h where one fits.
constexpr int exit_ok = 0;
constexpr int exit_not_found = 1;      // release: no lock of that name; leader: no leader
constexpr int exit_pending = 1;        // migrate --dry-run: migrations are pending
constexpr int exit_usage = 64;         // EX_USAGE: bad arguments or invalid input
constexpr int exit_software = 70;      // internal or unexpected backend error
constexpr int exit_unavailable = 69;   // cannot connect / connection lost
constexpr int exit_not_acquired = 75;  // EX_TEMPFAIL: lock busy, wait ran out
// The lease was lost while the command ran: outside sysexits.h's 64..78 (76 there is
// EX_PROTOCOL, what dblock used before) and below the shell's 126..165 (not runnable, signals).
constexpr int exit_lease_lost = 79;
constexpr int exit_schema = 78;  // EX_CONFIG: schema missing or mismatched

// The exit status for an error that reached main().
int exit_status_for(const dblock::error& e);

struct common_options {
  std::string url;
  std::string prefix;
  bool verbose = false;
  /// --timeout: the deadline of each call to the database (database_options::call_timeout).
  std::string timeout = "30s";
};

// --url, --table-prefix and -v on a subcommand.
void add_common(CLI::App* sub, common_options& common);

// "30s", "500ms", "2m", "1h", "1.5s"; a bare number means seconds. Throws invalid_argument
// naming `option`.
std::chrono::milliseconds parse_duration(const std::string& text, const char* option);

// A name or free text for a terminal: control characters (C0, DEL and the UTF-8 encoded C1
// range U+0080..U+009F) become \xNN, so that a hostile lock name or reason cannot move the
// cursor, clear the screen or forge output lines. JSON output escapes by itself.
std::string shown(std::string_view s);

// `url`, else $DBLOCK_URL, else invalid_argument.
std::string url_or_env(const std::string& url);

// The database of the common options; with --verbose, dblock's events go to stderr.
dblock::database open_db(const common_options& c);

// "2024-01-31T12:00:00Z" (UTC).
std::string iso_time(std::chrono::system_clock::time_point t);

// "12.3s", "-4.0s", "2h05m": short human durations for tables.
std::string human(std::chrono::microseconds d);

}  // namespace dblock::cli
