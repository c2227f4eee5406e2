// libFuzzer target: the database URL parser and the connection strings built from it.
// Invariants: only dblock::error(invalid_argument) escapes; errors are short and never contain
// the password; an accepted URL has a known scheme, a redacted form without the password, and a
// PostgreSQL connection string that libpq parses back to exactly the URL's parts (no injected
// keys, nothing cut at a NUL byte; a host= query parameter overrides the host on purpose).
#include <libpq-fe.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dialect/dialect.hpp"
#include "fuzz_common.hpp"
#include "url.hpp"

namespace {

using dblock::detail::parse_url;

// libpq's reading of a connection string (nothing when it does not parse).
bool libpq_parse(const std::string& conninfo, std::map<std::string, std::string>& out) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (!opts) {
    PQfreemem(err);
    return false;
  }
  for (auto* o = opts; o->keyword; ++o)
    if (o->val) out[o->keyword] = o->val;
  PQconninfoFree(opts);
  return true;
}

// Non-overlapping occurrences of `needle` in `s`.
std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size()))
    ++n;
  return n;
}

void check_parsed(const std::string& url, const dblock::detail::parsed_url& u,
                  const std::string& secret) {
  FUZZ_CHECK(u.scheme == "postgresql" || u.scheme == "mysql" || u.scheme == "sqlite", url);
  if (!secret.empty()) FUZZ_CHECK(u.redacted.find(secret) == std::string::npos, u.redacted);
  // The same bytes may also occur in the host, path or query; masking must remove at least the
  // occurrence in userinfo.
  if (u.password && !u.password->empty() && count(url, *u.password) > 0) {
    FUZZ_CHECK(u.redacted.find(":***@") != std::string::npos, u.redacted);
    FUZZ_CHECK(count(u.redacted, *u.password) < count(url, *u.password), u.redacted);
  }
  const auto& dia = dblock::detail::dialect_for_scheme(u.scheme);
  std::string conn;
  try {
    conn = dia.conn.connect_string(u, dblock::database_options{});
  } catch (const dblock::error& e) {
    FUZZ_CHECK(e.code() == dblock::errc::invalid_argument, e.what());
    if (!secret.empty())
      FUZZ_CHECK(std::string(e.what()).find(secret) == std::string::npos, e.what());
    return;
  }
  if (u.scheme != "postgresql") return;
  std::map<std::string, std::string> kv;
  FUZZ_CHECK(libpq_parse(conn, kv), "libpq cannot parse the connection string of " + url);
  FUZZ_CHECK(kv["dbname"] == u.path, "dbname differs for " + url);
  // A host= query parameter (a socket directory) overrides the URL's host, as in libpq's URIs.
  if (u.hosts.size() > 1) {
    // A host list goes to libpq whole, in order; an empty port item is the default port.
    std::string hosts, ports;
    for (std::size_t i = 0; i < u.hosts.size(); ++i) {
      hosts += (i ? "," : "") + u.hosts[i].host;
      ports += (i ? "," : "") + (u.hosts[i].port ? std::to_string(*u.hosts[i].port) : "");
    }
    FUZZ_CHECK(kv["host"] == hosts, "host list differs for " + url);
    FUZZ_CHECK(kv["port"] == ports, "port list differs for " + url);
  } else if (!u.host.empty() && !u.query.count("host")) {
    FUZZ_CHECK(kv["host"] == u.host, "host differs for " + url);
  }
  // A host never carries a separator of libpq's host list: one URL host is one server.
  for (const auto& h : u.hosts)
    FUZZ_CHECK(h.host.find(',') == std::string::npos, "a host with ',' in " + url);
  if (!u.user.empty()) FUZZ_CHECK(kv["user"] == u.user, "user differs for " + url);
  if (u.password) FUZZ_CHECK(kv["password"] == *u.password, "password differs for " + url);
  for (const auto& q : u.query)
    FUZZ_CHECK(kv[q.first] == q.second, "query parameter " + q.first + " differs for " + url);
}

void run(const std::string& url, const std::string& secret) {
  try {
    auto u = parse_url(url);
    check_parsed(url, u, secret);
  } catch (const dblock::error& e) {
    std::string m = e.what();
    FUZZ_CHECK(e.code() == dblock::errc::invalid_argument, m);
    FUZZ_CHECK(m.size() < 5000, "an error message of " + std::to_string(m.size()) + " bytes");
    if (!secret.empty()) FUZZ_CHECK(m.find(secret) == std::string::npos, m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  // 1. The input as a whole URL.
  run(in, "");
  // 2. The input as the raw text around a password that must never be shown: the password is
  //    "Pw7" + (bytes before the first '|') + "Q9z", the rest follows the '@'.
  auto bar = in.find('|');
  std::string pw_mid = bar == std::string::npos ? in : in.substr(0, bar);
  std::string rest = bar == std::string::npos ? "h/db" : in.substr(bar + 1);
  const std::string secret = "Pw7" + pw_mid + "Q9z";
  for (const char* scheme : {"postgresql://", "mysql://"})
    run(std::string(scheme) + "user:" + secret + "@" + rest, secret);
  return 0;
}
