// Shared helpers of the dblock command-line tool (see common.hpp).
#include "common.hpp"

#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>

namespace dblock::cli {

namespace {

// dblock's events go to stderr with --verbose (the library itself never prints); a lease whose
// TTL will not survive the loss of its holder's node is reported always.
class stderr_listener : public dblock::listener {
 public:
  explicit stderr_listener(bool verbose) : verbose_(verbose) {}
  void short_ttl(std::string_view, std::chrono::milliseconds, std::chrono::milliseconds,
                 std::string_view message) override {
    say("warning: " + std::string(message));
  }
  void acquired(std::string_view name, std::int64_t fence,
                std::chrono::microseconds latency) override {
    if (verbose_)
      say("acquired '" + std::string(name) + "' fence " + std::to_string(fence) + " in " +
          std::to_string(latency.count()) + " us");
  }
  void contended(std::string_view name) override {
    if (verbose_) say("'" + std::string(name) + "' is held by another owner");
  }
  void retried(std::string_view op, const dblock::error& e) override {
    if (verbose_) say("retrying " + std::string(op) + ": " + e.what());
  }
  void released(std::string_view name, std::chrono::microseconds held) override {
    if (verbose_)
      say("released '" + std::string(name) + "' after " + std::to_string(held.count() / 1000) +
          " ms");
  }
  void renew_failed(std::string_view name, const dblock::error& e) override {
    if (verbose_) say("renewing '" + std::string(name) + "' failed: " + e.what());
  }
  void lost(std::string_view name, dblock::loss_reason why, const dblock::error& e) override {
    if (verbose_)
      say("lease '" + std::string(name) + "' lost (" + std::string(dblock::to_string(why)) +
          "): " + e.what());
  }
  void rows_reaped(std::uint64_t rows, std::uint64_t) override {
    if (verbose_) say("reaped " + std::to_string(rows) + " rows");
  }
  void log(dblock::log_level, std::string_view m) override {
    if (verbose_) say(std::string(m));
  }

 private:
  const bool verbose_;
  std::mutex mu_;
  void say(const std::string& m) {
    std::lock_guard<std::mutex> lk(mu_);
    std::cerr << "dblock: " << shown(m) << "\n";
  }
};

}  // namespace

int exit_status_for(const dblock::error& e) {
  switch (e.kind()) {
    case dblock::errc::invalid_argument:
      return exit_usage;
    case dblock::errc::connection_failed:
    case dblock::errc::connection_lost:
      return exit_unavailable;
    case dblock::errc::schema_missing:
    case dblock::errc::schema_mismatch:
      return exit_schema;
    case dblock::errc::timeout:
    case dblock::errc::lock_not_available:
    case dblock::errc::pool_exhausted:
      return exit_not_acquired;
    case dblock::errc::lease_lost:
      return exit_lease_lost;
    default:
      return exit_software;
  }
}

void add_common(CLI::App* sub, common_options& common) {
  sub->add_option("--url", common.url,
                  "database URL (default $DBLOCK_URL): postgresql://..., mysql://..., "
                  "sqlite:///path.db");
  sub->add_option("--table-prefix", common.prefix, "prefix of dblock's table names");
  sub->add_flag("-v,--verbose", common.verbose, "say more on stderr");
  sub->add_option("--timeout", common.timeout,
                  "deadline of each call to the database that has none of its own (reads, "
                  "status, reap, migrate, force release; a lease's calls are bounded by its TTL, "
                  "an acquire by --wait): at it the statement is cancelled and the connection "
                  "cut (default 30s)");
}

std::chrono::milliseconds parse_duration(const std::string& text, const char* option) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  double factor = 0;
  if (pos == 0 || value < 0)
    factor = 0;
  else if (unit.empty() || unit == "s")
    factor = 1000;
  else if (unit == "ms")
    factor = 1;
  else if (unit == "m")
    factor = 60000;
  else if (unit == "h")
    factor = 3600000;
  if (factor == 0 || value * factor > 1e12)
    throw dblock::error(dblock::errc::invalid_argument, std::string("invalid duration '") + text +
                                                            "' for " + option +
                                                            " (examples: 30s, 500ms, 2m, 1h)");
  return std::chrono::milliseconds(static_cast<long long>(value * factor + 0.5));
}

std::string shown(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  auto esc = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    auto next = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
    if (c < 0x20 || c == 0x7f) {
      esc(c);
    } else if (c == 0xc2 && next >= 0x80 && next <= 0x9f) {
      esc(c);
      esc(next);
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string url_or_env(const std::string& url) {
  if (!url.empty()) return url;
  const char* env = std::getenv("DBLOCK_URL");
  if (env && *env) return env;
  throw dblock::error(dblock::errc::invalid_argument,
                      "no database URL: pass --url or set DBLOCK_URL");
}

dblock::database open_db(const common_options& c) {
  dblock::database_options o;
  o.table_prefix = c.prefix;
  o.call_timeout = parse_duration(c.timeout, "--timeout");
  if (o.call_timeout.count() <= 0)
    throw dblock::error(dblock::errc::invalid_argument, "--timeout must be above zero");
  o.events = std::make_shared<stderr_listener>(c.verbose);
  return dblock::database(url_or_env(c.url), o);
}

std::string iso_time(std::chrono::system_clock::time_point t) {
  auto secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  std::ostringstream out;
  out << std::put_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  return out.str();
}

std::string human(std::chrono::microseconds d) {
  long long us = d.count();
  std::string sign = us < 0 ? "-" : "";
  long long a = us < 0 ? -us : us;
  std::ostringstream out;
  if (a < 60LL * 1000000)
    out << sign << std::fixed << std::setprecision(1) << a / 1e6 << "s";
  else if (a < 3600LL * 1000000)
    out << sign << a / 60000000 << "m" << std::setw(2) << std::setfill('0') << (a / 1000000) % 60
        << "s";
  else
    out << sign << a / 3600000000LL << "h" << std::setw(2) << std::setfill('0')
        << (a / 60000000) % 60 << "m";
  return out.str();
}

}  // namespace dblock::cli
