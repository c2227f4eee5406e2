// Internal: database URL parsing (uriparser does the RFC 3986 work).
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dblock::detail {

/// A database URL split into parts, percent-decoded. Never printed whole: see redacted.
struct parsed_url {
  std::string scheme;  // lower-case, aliases folded: postgresql, mysql, sqlite
  std::string user;
  std::optional<std::string> password;
  std::string host;
  std::optional<int> port;
  std::string path;  // database name (postgresql, mysql) or file path (sqlite)
  std::map<std::string, std::string> query;
  std::string redacted;  // the URL with the password replaced by ***
};

/// Parses a URL; throws dblock::error(errc::invalid_argument) naming the problem, never the
/// password.
parsed_url parse_url(const std::string& url);

}  // namespace dblock::detail
