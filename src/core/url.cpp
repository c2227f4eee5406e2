#include "core/url.hpp"

#include <uriparser/Uri.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <vector>

#include "core/identifier.hpp"
#include "dblock/error.hpp"

namespace dblock::detail {
namespace {

std::string range(const UriTextRangeA& r) {
  if (r.first == nullptr || r.afterLast == nullptr) return {};
  return std::string(r.first, r.afterLast);
}

std::string decode(std::string s) {
  if (s.empty()) return s;
  std::vector<char> buf(s.begin(), s.end());
  buf.push_back('\0');
  const char* end = uriUnescapeInPlaceExA(buf.data(), URI_FALSE, URI_BR_DONT_TOUCH);
  return std::string(static_cast<const char*>(buf.data()), end);
}

// Control bytes and non-ASCII bytes of a rejected URL are shown as \xNN, never raw.
std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

[[noreturn]] void bad(const std::string& redacted, const std::string& why) {
  throw error(errc::invalid_argument, "invalid database URL '" + escaped(redacted) + "': " + why);
}

// The URL with the password part of userinfo masked, computed without a full parse so that it
// can be used in the parser's own error messages. The password is taken to run to the last '@'
// of the whole URL, not of the authority: a password given raw (RFC 3986 wants it
// percent-encoded) may contain '/', '?' or '#', which would end the authority early and leave
// the rest of it in view. An '@' in the path or query then masks more than needed, the safe side.
std::string redact(const std::string& url) {
  auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    // Not a URL shape we know; it may still hold a secret, so show only the scheme-ish head.
    auto colon = url.find(':');
    return colon == std::string::npos ? std::string("<unparsable>") : url.substr(0, colon) + ":...";
  }
  auto auth_begin = scheme_end + 3;
  auto at = url.rfind('@');
  if (at == std::string::npos || at < auth_begin) return url;
  auto colon = url.find(':', auth_begin);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon) + ":***" + url.substr(at);
}

// Checks made on the raw text before parsing.
void check_raw(const std::string& url, const std::string& redacted) {
  if (url.empty()) bad("<empty>", "the URL is empty");
  if (url.size() > 4096) bad(redacted.substr(0, 64) + "...", "longer than 4096 characters");
  for (unsigned char c : url) {
    if (c < 0x20 || c == 0x7f) bad(redacted, "contains a control character");
  }
  // A decoded NUL would cut the value short in the C strings of libpq, libmysqlclient and
  // uriparser's query list, so that another database, user or option than written is used.
  if (url.find("%00") != std::string::npos)
    bad(redacted, "contains a percent-encoded NUL byte (%00)");
  if (url.rfind("sqlite", 0) == 0 && url.find(":memory:") != std::string::npos &&
      url.rfind("sqlite::memory:", 0) != 0 && url.rfind("sqlite3::memory:", 0) != 0)
    bad(redacted,
        "an in-memory database is written sqlite::memory: (one database shared by the "
        "connections of one dblock::database; SQLite's own :memory: would give each connection "
        "a database of its own)");
}

std::string canonical_scheme(const UriUriA& uri, const std::string& redacted) {
  std::string scheme = range(uri.scheme);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (scheme.empty())
    bad(redacted, "missing scheme (expected postgresql://, mysql:// or sqlite://)");
  if (scheme == "postgres" || scheme == "postgresql") return "postgresql";
  if (scheme == "mysql" || scheme == "mariadb") return "mysql";
  if (scheme == "sqlite" || scheme == "sqlite3") return "sqlite";
  bad(redacted, "unknown scheme '" + scheme + "' (expected postgresql, mysql or sqlite)");
}

// User, password, host, port and path.
void read_authority_and_path(const UriUriA& uri, parsed_url& out) {
  std::string userinfo = range(uri.userInfo);
  if (!userinfo.empty()) {
    auto colon = userinfo.find(':');
    out.user = decode(userinfo.substr(0, colon));
    if (colon != std::string::npos) out.password = decode(userinfo.substr(colon + 1));
  }
  out.host = decode(range(uri.hostText));
  std::string port = range(uri.portText);
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit))
      bad(out.redacted, "port '" + port + "' is not a number");
    int p = std::stoi(port);
    if (p < 1 || p > 65535) bad(out.redacted, "port " + port + " is out of range 1-65535");
    out.port = p;
  }
  std::string path;
  for (auto* seg = uri.pathHead; seg != nullptr; seg = seg->next) {
    if (seg != uri.pathHead || uri.absolutePath || uri.hostText.first != nullptr) path += '/';
    path += decode(range(seg->text));
  }
  out.path = path;
}

void read_query(const UriUriA& uri, parsed_url& out) {
  if (uri.query.first == nullptr) return;
  UriQueryListA* list = nullptr;
  int count = 0;
  if (uriDissectQueryMallocA(&list, &count, uri.query.first, uri.query.afterLast) != URI_SUCCESS)
    bad(out.redacted, "malformed query string");
  std::unique_ptr<UriQueryListA, void (*)(UriQueryListA*)> qguard(
      list, [](UriQueryListA* l) { uriFreeQueryListA(l); });
  for (auto* q = list; q != nullptr; q = q->next) {
    std::string key = q->key ? q->key : "";
    if (key.empty()) bad(out.redacted, "empty query parameter name");
    if (out.query.count(key)) bad(out.redacted, "query parameter '" + key + "' given twice");
    out.query[key] = q->value ? q->value : "";
  }
}

void finish_sqlite(parsed_url& out) {
  // sqlite:///abs/path.db has an empty host; sqlite://relative.db puts the first segment in the
  // host position, so glue it back.
  if (!out.user.empty() || out.password || out.port)
    bad(out.redacted, "a sqlite URL takes no user, password or port");
  std::string file = out.host.empty() ? out.path : out.host + out.path;
  if (file.empty() || file == "/") bad(out.redacted, "missing database file path");
  out.memory = out.host.empty() && file == ":memory:";
  if (!out.memory && (file.find(":memory:") != std::string::npos || file.rfind("file:", 0) == 0))
    bad(out.redacted,
        "SQLite URI file names are not supported; an in-memory database is written "
        "sqlite::memory:");
  out.host.clear();
  out.path = file;
}

void finish_server(parsed_url& out) {
  if (!out.path.empty() && out.path[0] == '/') out.path.erase(0, 1);
  if (out.path.empty()) bad(out.redacted, "missing database name (the path after the host)");
  if (out.path.find('/') != std::string::npos)
    // The name is not shown: with a raw '/' in the password, it holds the rest of the password.
    bad(out.redacted, "the database name (the path after the host) contains '/'");
  if (out.host.empty() && !out.query.count("host") && !out.query.count("unix_socket"))
    bad(out.redacted, "missing host");
  // A decoded ',' would split one host into several in libpq's host list.
  if (out.host.find(',') != std::string::npos) bad(out.redacted, "a host name contains ','");
}

// Where the host list of a server URL is: after "://" and the userinfo (up to the last '@',
// like redact()), up to the next '/', '?' or '#'.
std::pair<std::size_t, std::size_t> host_section(const std::string& url) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return {std::string::npos, 0};
  std::size_t begin = scheme_end + 3;
  const auto at = url.rfind('@');
  if (at != std::string::npos && at >= begin) begin = at + 1;
  auto end = url.find_first_of("/?#", begin);
  if (end == std::string::npos) end = url.size();
  return {begin, end};
}

url_host parse_host_item(const std::string& item, const std::string& redacted) {
  url_host h;
  std::string port;
  if (!item.empty() && item[0] == '[') {  // an IPv6 literal
    const auto close = item.find(']');
    if (close == std::string::npos) bad(redacted, "unclosed '[' in host list");
    h.host = item.substr(1, close - 1);
    if (close + 1 < item.size()) {
      if (item[close + 1] != ':') bad(redacted, "unexpected text after ']' in host list");
      port = item.substr(close + 2);
    }
  } else {
    const auto colon = item.find(':');
    h.host = decode(item.substr(0, colon));
    if (colon != std::string::npos) port = item.substr(colon + 1);
  }
  if (h.host.empty()) bad(redacted, "an empty host in the host list");
  if (h.host.find(',') != std::string::npos) bad(redacted, "a host name contains ','");
  if (!port.empty() || item.find(':') != std::string::npos) {
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit))
      bad(redacted, "port '" + port + "' is not a number");
    const int p = std::stoi(port);
    if (p < 1 || p > 65535) bad(redacted, "port " + port + " is out of range 1-65535");
    h.port = p;
  }
  return h;
}

// A multi-host URL: the hosts are split off here and the URL is parsed with its first host.
std::vector<url_host> split_hosts(std::string& url, const std::string& redacted) {
  const auto [begin, end] = host_section(url);
  if (begin == std::string::npos) return {};
  const std::string section = url.substr(begin, end - begin);
  if (section.find(',') == std::string::npos) return {};
  if (url.rfind("sqlite", 0) == 0) bad(redacted, "a sqlite URL names one file, not a host list");
  // "pg://h1,mysql://h2/db": the host section ends at the second scheme's "//".
  if (url.compare(end, 2, "//") == 0)
    bad(redacted,
        "a second scheme in the host list: one URL has one scheme and lists its hosts as "
        "host:port,host:port");
  std::vector<url_host> hosts;
  std::size_t pos = 0;
  for (;;) {
    const auto comma = section.find(',', pos);
    hosts.push_back(parse_host_item(section.substr(pos, comma - pos), redacted));
    if (hosts.size() > max_url_hosts)
      bad(redacted, "more than " + std::to_string(max_url_hosts) + " hosts");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  for (std::size_t i = 0; i < hosts.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (hosts[i].host == hosts[j].host && hosts[i].port == hosts[j].port)
        bad(redacted, "host '" + hosts[i].host + "' is given twice");
  const auto first_end = section.find(',');
  url.replace(begin, end - begin, section.substr(0, first_end));
  return hosts;
}

}  // namespace

parsed_url parse_url(const std::string& url_text) {
  std::string url = url_text;
  parsed_url out;
  out.redacted = redact(url);
  check_raw(url, out.redacted);
  std::vector<url_host> hosts = split_hosts(url, out.redacted);
  UriUriA uri;
  const char* error_pos = nullptr;
  if (uriParseSingleUriA(&uri, url.c_str(), &error_pos) != URI_SUCCESS) {
    auto offset = error_pos ? static_cast<std::size_t>(error_pos - url.c_str()) : 0;
    bad(out.redacted, "syntax error near character " + std::to_string(offset + 1));
  }
  std::unique_ptr<UriUriA, void (*)(UriUriA*)> guard(&uri,
                                                     [](UriUriA* u) { uriFreeUriMembersA(u); });
  out.scheme = canonical_scheme(uri, out.redacted);
  read_authority_and_path(uri, out);
  read_query(uri, out);
  if (uri.fragment.first != nullptr) bad(out.redacted, "a fragment ('#...') is not allowed");
  if (out.scheme == "sqlite")
    finish_sqlite(out);
  else
    finish_server(out);
  out.hosts = hosts.empty() ? std::vector<url_host>{{out.host, out.port}} : std::move(hosts);
  return out;
}

std::chrono::milliseconds url_duration(const parsed_url& url, const std::string& key,
                                       const std::string& value) {
  std::size_t digits = 0;
  while (digits < value.size() && digits < 12 && value[digits] >= '0' && value[digits] <= '9')
    ++digits;
  const std::string unit = value.substr(digits);
  long long factor = unit == "ms"  ? 1
                     : unit == "s" ? 1000
                     : unit == "m" ? 60000
                     : unit == "h" ? 3600000
                                   : 0;
  if (digits == 0 || factor == 0 || digits == 12)
    throw error(errc::invalid_argument, "invalid database URL '" + url.redacted + "': " + key +
                                            "='" + printable(value) +
                                            "' (expected a duration such as 30s or 1500ms)");
  return std::chrono::milliseconds(std::stoll(value.substr(0, digits)) * factor);
}

}  // namespace dblock::detail
