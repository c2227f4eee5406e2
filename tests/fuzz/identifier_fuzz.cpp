// libFuzzer target: identifier, table-prefix and resource-name validation.
// Invariants: validate_identifier accepts exactly [A-Za-z_][A-Za-z0-9_]{0,62};
// make_table_names accepts exactly "" or [a-z_][a-z0-9_]{0,31} and then yields valid
// identifiers that every dialect quotes without a stray quote; validate_resource_name accepts
// exactly 1..255 bytes of well-formed UTF-8 without NUL or U+FFFF (checked against an independent
// decoder);
// every error is invalid_argument with a short, printable message.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/identifier.hpp"
#include "dblock/error.hpp"
#include "dialect/dialect.hpp"
#include "fuzz_common.hpp"

namespace {

using dblock::fuzz::is_identifier;
using dblock::fuzz::printable_ascii;

// Well-formed UTF-8 after the Unicode standard's table 3-7 (byte ranges per lead byte).
bool well_formed_utf8(const std::string& s) {
  std::size_t i = 0;
  auto in = [&](std::size_t k, unsigned lo, unsigned hi) {
    if (k >= s.size()) return false;
    unsigned c = static_cast<unsigned char>(s[k]);
    return c >= lo && c <= hi;
  };
  while (i < s.size()) {
    unsigned c = static_cast<unsigned char>(s[i]);
    if (c <= 0x7f) {
      i += 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
      if (!in(i + 1, 0x80, 0xbf)) return false;
      i += 2;
    } else if (c == 0xe0) {
      if (!in(i + 1, 0xa0, 0xbf) || !in(i + 2, 0x80, 0xbf)) return false;
      i += 3;
    } else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) {
      if (!in(i + 1, 0x80, 0xbf) || !in(i + 2, 0x80, 0xbf)) return false;
      i += 3;
    } else if (c == 0xed) {
      if (!in(i + 1, 0x80, 0x9f) || !in(i + 2, 0x80, 0xbf)) return false;
      i += 3;
    } else if (c == 0xf0) {
      if (!in(i + 1, 0x90, 0xbf) || !in(i + 2, 0x80, 0xbf) || !in(i + 3, 0x80, 0xbf)) return false;
      i += 4;
    } else if (c >= 0xf1 && c <= 0xf3) {
      if (!in(i + 1, 0x80, 0xbf) || !in(i + 2, 0x80, 0xbf) || !in(i + 3, 0x80, 0xbf)) return false;
      i += 4;
    } else if (c == 0xf4) {
      if (!in(i + 1, 0x80, 0x8f) || !in(i + 2, 0x80, 0xbf) || !in(i + 3, 0x80, 0xbf)) return false;
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

bool is_prefix(const std::string& s) {
  if (s.empty()) return true;
  if (s.size() > 32 || !((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_')) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

template <class F>
bool accepted(F&& f, const std::string& input) {
  try {
    f();
    return true;
  } catch (const dblock::error& e) {
    std::string m = e.what();
    FUZZ_CHECK(e.code() == dblock::errc::invalid_argument, m);
    FUZZ_CHECK(m.size() < 400, "a " + std::to_string(m.size()) + "-byte message");
    FUZZ_CHECK(printable_ascii(m), "unprintable bytes in: " + m);
    (void)input;
    return false;
  }
}

const dblock::detail::vocabulary* const dialects[] = {&dblock::detail::postgresql_dialect().sql,
                                                      &dblock::detail::mysql_dialect().sql,
                                                      &dblock::detail::sqlite_dialect().sql};

void check_quoted(const std::string& ident) {
  for (const auto* d : dialects) {
    std::string q = d->quote(ident);
    FUZZ_CHECK(q.size() == ident.size() + 2, q);
    const char mark = q[0];
    FUZZ_CHECK(mark == '"' || mark == '`', q);
    FUZZ_CHECK(q.back() == mark && q.substr(1, q.size() - 2) == ident, q);
    FUZZ_CHECK(ident.find(mark) == std::string::npos, q);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);

  bool ok = accepted([&] { dblock::detail::validate_identifier(in, "table name"); }, in);
  FUZZ_CHECK(ok == is_identifier(in), "validate_identifier disagrees on '" + in + "'");
  if (ok) check_quoted(in);

  dblock::detail::table_names t;
  ok = accepted([&] { t = dblock::detail::make_table_names(in); }, in);
  FUZZ_CHECK(ok == is_prefix(in), "make_table_names disagrees on '" + in + "'");
  if (ok) {
    for (const auto& name : {t.lock, t.floor, t.migrations, t.audit}) {
      FUZZ_CHECK(is_identifier(name), name);
      check_quoted(name);
    }
  }

  ok = accepted([&] { dblock::detail::validate_resource_name(in); }, in);
  const bool expect = !in.empty() && in.size() <= dblock::detail::max_resource_name_bytes &&
                      in.find('\0') == std::string::npos && well_formed_utf8(in) &&
                      in.find("\xEF\xBF\xBF") == std::string::npos;  // U+FFFF: internal names
  FUZZ_CHECK(ok == expect, "validate_resource_name disagrees (" + std::to_string(in.size()) +
                               " bytes, expected " + (expect ? "accept" : "reject") + ")");
  return 0;
}
