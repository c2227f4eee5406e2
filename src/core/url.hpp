// Internal: database URL parsing (uriparser does the RFC 3986 work).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dblock::detail {

/// One host of a URL (a multi-host URL has several).
struct url_host {
  std::string host;
  std::optional<int> port;
};

/// At most this many hosts in one URL.
constexpr std::size_t max_url_hosts = 16;

/// A database URL split into parts, percent-decoded. Never printed whole: see redacted.
struct parsed_url {
  std::string scheme;  // lower-case, aliases folded: postgresql, mysql, sqlite
  std::string user;
  std::optional<std::string> password;
  std::string host;             // the first host
  std::optional<int> port;      // the first host's port
  std::vector<url_host> hosts;  // every host in the order given (one for a plain URL)
  std::string path;             // database name (postgresql, mysql) or file path (sqlite)
  bool memory = false;          // sqlite::memory: (path ":memory:"), an in-memory database
  std::map<std::string, std::string> query;
  std::string redacted;  // the URL with the password replaced by ***
};

/// Parses a URL; throws dblock::error(errc::invalid_argument) naming the problem, never the
/// password. Server URLs may name several hosts, `scheme://user:pass@h1:p1,h2:p2/db` (libpq's
/// multi-host form): at most max_url_hosts, none empty, none twice.
parsed_url parse_url(const std::string& url);

/// A duration given as a URL query value: a number with a unit, `ms`, `s`, `m` or `h`
/// (`30s`, `1500ms`); throws dblock::error(errc::invalid_argument) naming the key.
std::chrono::milliseconds url_duration(const parsed_url& url, const std::string& key,
                                       const std::string& value);

}  // namespace dblock::detail
