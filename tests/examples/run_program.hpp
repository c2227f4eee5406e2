// Test helper: runs an example program and captures its output and exit status.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness.hpp"
#include "test_paths.hpp"

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

/// Runs `command` (run_program()) and, with its output as the message of every check, checks that
/// it exits with `status` and then calls `checks(result)`.
template <class F>
void check_run(const std::string& command, int status, F&& checks) {
  auto r = run_program(command);
  INFO(r.output);
  CHECK(r.status == status);
  checks(r);
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

/// An example program's run on the test's database: a table prefix of its own (the test's prefix
/// and `stem`, whose dblock tables the harness drops like the test's own), the example's own
/// `tables` of that prefix dropped after the test, and the command line that runs `name` with
/// `args`.
struct example_run {
  std::string prefix;
  table_cleanup drop;
  std::string cmd;
  example_run(context& ctx, const std::string& name, const std::string& stem,
              const std::vector<std::string>& tables, const std::string& args)
      : prefix(ctx.prefix + stem),
        drop{ctx, {}},
        cmd(example_command(name, ctx.url, prefix, args)) {
    ctx.prefixes.push_back(prefix);
    for (const auto& t : tables)
      drop.add(prefix + t);
  }
};
#endif

}  // namespace dblock::test
