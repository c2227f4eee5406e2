// Test helper: runs an example program and captures its output and exit status.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>

#include "harness.hpp"

namespace dblock::test {

/// Output (stdout and stderr together) and exit status of one program run.
struct program_result {
  std::string output;
  int status = -1;  // exit status, or 128 + signal
};

/// Runs `command` through /bin/sh (quote arguments yourself) and waits for it.
inline program_result run_program(const std::string& command) {
  program_result r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    r.output.append(buf.data(), n);
  int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

/// Single-quotes a shell argument.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Calls `f(m)` with the match of `line` in each line of `out` where it is found (regex_search).
template <class F>
void for_each_match(const std::string& out, const std::regex& line, F&& f) {
  std::istringstream in(out);
  std::string l;
  while (std::getline(in, l)) {
    std::smatch m;
    if (std::regex_search(l, m, line)) f(m);
  }
}

#ifdef DBLOCK_EXAMPLES_BIN
/// The command line that runs example program `name` (as built in DBLOCK_EXAMPLES_BIN) on `url`
/// with table prefix `prefix`, then `args`.
inline std::string example_command(const std::string& name, const std::string& url,
                                   const std::string& prefix, const std::string& args) {
  return std::string(DBLOCK_EXAMPLES_BIN) + "/" + name + "/" + name + " --url " + shell_quote(url) +
         " --table-prefix " + prefix + " " + args;
}
#endif

/// The table prefix of an example's run: the test's prefix and `stem`; the harness drops dblock's
/// tables of it like the test's own.
inline std::string example_prefix(context& ctx, const std::string& stem) {
  ctx.prefixes.push_back(ctx.prefix + stem);
  return ctx.prefix + stem;
}

}  // namespace dblock::test
