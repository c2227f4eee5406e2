#include "core/identifier.hpp"

#include <cctype>

#include "dblock/error.hpp"

namespace dblock::detail {

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

namespace {

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    char32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (std::size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF (PostgreSQL rejects them too).
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

void validate_identifier(std::string_view ident, const char* what) {
  bool ok = !ident.empty() && ident.size() <= 63 &&
            (std::isalpha(static_cast<unsigned char>(ident[0])) || ident[0] == '_');
  for (unsigned char c : ident)
    ok = ok && (std::isalnum(c) || c == '_') && c < 0x80;
  if (!ok)
    throw error(errc::invalid_argument, std::string("invalid ") + what + " '" + printable(ident) +
                                            "': expected [A-Za-z_][A-Za-z0-9_]{0,62}");
}

void validate_resource_name(std::string_view name) {
  validate_lease_name(name);
  if (name.find(internal_separator) != std::string_view::npos)
    throw error(errc::invalid_argument,
                "invalid resource name '" + printable(name) +
                    "': contains U+FFFF, which dblock reserves for its internal names");
}

std::string permit_lease_name(std::string_view name, int slot) {
  std::string out(name);
  out += internal_separator;
  out += std::to_string(slot);
  return out;
}

std::pair<std::string, std::string> permit_name_range(std::string_view name) {
  std::string lo(name);
  lo += internal_separator;
  return {lo, lo + ":"};
}

void validate_lease_name(std::string_view name) {
  if (name.empty()) throw error(errc::invalid_argument, "invalid resource name: it is empty");
  if (name.size() > max_resource_name_bytes)
    throw error(errc::invalid_argument,
                "invalid resource name '" + printable(name) + "': " + std::to_string(name.size()) +
                    " bytes, the limit is " + std::to_string(max_resource_name_bytes) +
                    " (names are never truncated)");
  if (name.find('\0') != std::string_view::npos)
    throw error(errc::invalid_argument,
                "invalid resource name '" + printable(name) + "': contains a NUL byte");
  if (!valid_utf8(name))
    throw error(errc::invalid_argument,
                "invalid resource name '" + printable(name) + "': not valid UTF-8");
}

void validate_text(std::string_view text, const char* what) {
  if (text.find('\0') != std::string_view::npos)
    throw error(errc::invalid_argument,
                std::string("invalid ") + what + " '" + printable(text) + "': contains a NUL byte");
  if (!valid_utf8(text))
    throw error(errc::invalid_argument,
                std::string("invalid ") + what + " '" + printable(text) + "': not valid UTF-8");
}

}  // namespace dblock::detail
