// Shared helpers of the libFuzzer targets: a failed invariant aborts with a message, so that
// libFuzzer records the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, what)                                                                 \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "invariant failed at %s:%d: %s\n  %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                 \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace dblock::fuzz {

/// True when every byte is printable ASCII.
inline bool printable_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f || c >= 0x80) return false;
  return true;
}

/// [A-Za-z_][A-Za-z0-9_]{0,62}, written out without <cctype> (locale-independent).
inline bool is_identifier(const std::string& s) {
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (s.empty() || s.size() > 63 || !alpha(s[0])) return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

}  // namespace dblock::fuzz
