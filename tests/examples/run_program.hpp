// Test helper: runs an example program and captures its output and exit status.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

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

}  // namespace dblock::test
