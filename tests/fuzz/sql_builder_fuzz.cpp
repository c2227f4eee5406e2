// libFuzzer target: the pure functions that assemble SQL text and connection strings.
// Invariants:
//  - name_pattern_value(): the bound LIKE (PostgreSQL, MySQL: ESCAPE '!') or GLOB (SQLite)
//    pattern means exactly the shell pattern: `*` any run, `?` one character, every other byte
//    literal (no unescaped '%', '_', '!', '[' can widen a match);
//  - apply_prefix(): replaces every "{{prefix}}" (the identity for prefix "{{prefix}}");
//  - split_statements(): no comment line inside a statement, no byte lost but the statement
//    separators;
//  - conn_quote(): one quoted token that unquotes to the input (no key=value injection);
//  - quote() of a valid identifier is the identifier between two quotes of its dialect's kind;
//    select_value() of one holds it only quoted, and is the same text for every identifier but
//    for the identifier (it is never spliced in unquoted, nor its quotes unbalanced);
//  - name_pattern() binds its parameter.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dialect/common.hpp"
#include "dialect/dialect.hpp"
#include "fuzz_common.hpp"

namespace {

using namespace dblock::detail;

enum kind : int { any_run = -1, any_one = -2 };

// A shell pattern as tokens: a byte value (literal) or a wildcard.
std::vector<int> glob_tokens(const std::string& glob) {
  std::vector<int> out;
  for (unsigned char c : glob)
    out.push_back(c == '*' ? any_run : c == '?' ? any_one : c);
  return out;
}

// A LIKE pattern with ESCAPE '!' as tokens; false when malformed (a dangling escape).
bool like_tokens(const std::string& p, std::vector<int>& out) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    unsigned char c = p[i];
    if (c == '!') {
      if (i + 1 == p.size()) return false;
      out.push_back(static_cast<unsigned char>(p[++i]));
    } else {
      out.push_back(c == '%' ? any_run : c == '_' ? any_one : c);
    }
  }
  return true;
}

// A GLOB pattern as tokens; false for a character class other than "[[]" (dblock never
// produces one) or an unterminated one.
bool sqlite_glob_tokens(const std::string& p, std::vector<int>& out) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    unsigned char c = p[i];
    if (c == '[') {
      if (p.compare(i, 3, "[[]") != 0) return false;
      out.push_back('[');
      i += 2;
    } else {
      out.push_back(c == '*' ? any_run : c == '?' ? any_one : c);
    }
  }
  return true;
}

std::string non_space_text(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') out.push_back(c);
  return out;
}

void check_split(const std::string& sql) {
  auto stmts = split_statements(sql);
  // What survives: the lines that are neither blank nor comments, in order.
  std::string kept;
  std::size_t pos = 0;
  while (pos < sql.size()) {
    auto nl = sql.find('\n', pos);
    std::string line = sql.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? sql.size() : nl + 1;
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line.compare(first, 2, "--") == 0) continue;
    kept += non_space_text(line);
  }
  std::string got;
  for (std::size_t i = 0; i < stmts.size(); ++i) {
    const auto& s = stmts[i];
    if (i > 0) got += ';';
    got += non_space_text(s);
    std::size_t p = 0;
    while (p < s.size()) {
      auto nl = s.find('\n', p);
      std::string line = s.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
      p = nl == std::string::npos ? s.size() : nl + 1;
      auto first = line.find_first_not_of(" \t\r");
      if (first != std::string::npos)
        FUZZ_CHECK(line.compare(first, 2, "--") != 0, "a comment line inside a statement");
    }
  }
  // The statements, joined by the ';' that ended each of them, give back every kept byte in
  // order: each statement-ending ';' is dropped (the last statement may lack one), nothing else.
  FUZZ_CHECK(kept == got || kept == got + ";", "split_statements lost, moved or invented bytes");
  // And each ended where a statement may end: never inside a dollar-quoted body (an even number
  // of "$$" in it), and a MySQL routine (CREATE PROCEDURE/FUNCTION without "$$") only at a line
  // starting in column 0 (the text before the dropped ';' does not start with white space).
  const std::size_t ended = kept == got + ";" ? stmts.size() : stmts.size() - 1;
  for (std::size_t i = 0; i < ended && i < stmts.size(); ++i) {
    const std::string& st = stmts[i];
    std::size_t dollars = 0;
    for (auto p = st.find("$$"); p != std::string::npos; p = st.find("$$", p + 2))
      ++dollars;
    FUZZ_CHECK(dollars % 2 == 0, "a statement ended inside a dollar-quoted body");
    const bool routine =
        (st.rfind("CREATE PROCEDURE", 0) == 0 || st.rfind("CREATE FUNCTION", 0) == 0) &&
        dollars == 0;
    const auto nl = st.rfind('\n');
    const std::string tail = nl == std::string::npos ? st : st.substr(nl + 1);
    FUZZ_CHECK(!routine || tail.empty() || (tail[0] != ' ' && tail[0] != '\t' && tail[0] != '\r'),
               "a routine ended at an indented line");
  }
}

// `sql` split at the quotes `mark`: the quoted parts in `quoted`, the rest with each quoted part
// as mark + "@" + mark returned; false when a quote is not closed.
bool split_quoted(const std::string& sql, char mark, std::vector<std::string>& quoted,
                  std::string& skeleton) {
  std::size_t pos = 0;
  for (;;) {
    const auto open = sql.find(mark, pos);
    if (open == std::string::npos) break;
    const auto close = sql.find(mark, open + 1);
    if (close == std::string::npos) return false;
    skeleton += sql.substr(pos, open - pos) + mark + "@" + mark;
    quoted.push_back(sql.substr(open + 1, close - open - 1));
    pos = close + 1;
  }
  skeleton += sql.substr(pos);
  return true;
}

// The identifier `ident` in SQL text `sql` that `vocabulary` built for it (`reference` is the same
// built for another identifier, `ref`): quoted wherever it occurs, and nothing else differs.
void check_quoted(const std::string& what, const std::string& sql, const std::string& ident,
                  const std::string& reference, const std::string& ref, char mark) {
  std::vector<std::string> quoted, ref_quoted;
  std::string skeleton, ref_skeleton;
  FUZZ_CHECK(split_quoted(sql, mark, quoted, skeleton), what + ": unbalanced quotes: " + sql);
  FUZZ_CHECK(split_quoted(reference, mark, ref_quoted, ref_skeleton), what + ": " + reference);
  FUZZ_CHECK(!quoted.empty(), what + ": the identifier is not quoted: " + sql);
  for (const auto& q : quoted)
    FUZZ_CHECK(q == ident, what + ": quotes around something else than the identifier: " + sql);
  for (const auto& q : ref_quoted)
    FUZZ_CHECK(q == ref, what + ": " + reference);
  FUZZ_CHECK(skeleton == ref_skeleton,
             what + ": differs from the text for another identifier outside its quotes: " + sql +
                 " vs " + reference);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const vocabulary& pg = postgresql_dialect().sql;
  const vocabulary& my = mysql_dialect().sql;
  const vocabulary& lite = sqlite_dialect().sql;

  // Name patterns.
  const auto want = glob_tokens(in);
  for (const vocabulary* d : {&pg, &my}) {
    std::vector<int> got;
    FUZZ_CHECK(like_tokens(d->name_pattern_value(in), got), "dangling escape");
    FUZZ_CHECK(got == want, std::string(d == &pg ? "postgresql" : "mysql") +
                                ": LIKE pattern means something else");
  }
  {
    std::vector<int> got;
    FUZZ_CHECK(sqlite_glob_tokens(lite.name_pattern_value(in), got), "stray GLOB class");
    FUZZ_CHECK(got == want, "sqlite: GLOB pattern means something else");
  }

  // Prefix substitution.
  FUZZ_CHECK(apply_prefix(in, "{{prefix}}") == in, "apply_prefix is not the identity");
  {
    std::size_t n = 0;
    for (auto p = in.find("{{prefix}}"); p != std::string::npos; p = in.find("{{prefix}}", p + 10))
      ++n;
    std::string out = apply_prefix(in, "p_");
    FUZZ_CHECK(out.size() + 8 * n == in.size(), "apply_prefix length");
  }

  // Migration splitting.
  check_split(in);

  // Connection-string quoting: '...' with \ and ' escaped.
  {
    std::string q = conn_quote(in);
    FUZZ_CHECK(q.size() >= 2 && q.front() == '\'' && q.back() == '\'', q);
    std::string back;
    bool closed = false;
    for (std::size_t i = 1; i < q.size(); ++i) {
      if (q[i] == '\\') {
        FUZZ_CHECK(i + 2 < q.size(), "dangling backslash");
        back += q[++i];
      } else if (q[i] == '\'') {
        FUZZ_CHECK(i + 1 == q.size(), "quote closed early: key=value injection");
        closed = true;
      } else {
        back += q[i];
      }
    }
    FUZZ_CHECK(closed && back == in, "conn_quote does not round-trip");
  }

  // Identifier quoting in generated SQL fragments (identifiers are validated first).
  if (dblock::fuzz::is_identifier(in)) {
    for (const vocabulary* d : {&pg, &my, &lite}) {
      const std::string name = d == &pg ? "postgresql" : d == &my ? "mysql" : "sqlite";
      const char mark = d == &my ? '`' : '"';
      FUZZ_CHECK(d->quote(in) == mark + in + mark, name + ": quote() of " + in);
      // Another identifier as the reference, of another length than `in`.
      const std::string ref = in.size() == 3 ? "ref_col" : "ref";
      check_quoted(name + " select_value()", d->select_value(in), in, d->select_value(ref), ref,
                   mark);
      std::string cond = d->name_pattern(in, "pattern");
      FUZZ_CHECK(cond.find(":pattern") != std::string::npos, cond);
    }
  }
  return 0;
}
