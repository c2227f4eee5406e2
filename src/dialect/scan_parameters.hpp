// The definition of scan_parameters() (declared in dialect.hpp), kept apart so that the role
// declarations stay within one file's size.
#pragma once

#include <string>
#include <string_view>

namespace dblock::detail {

inline bool sql_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

template <class Text, class Param>
void scan_parameters(const std::string& sql, Text&& on_text, Param&& on_param) {
  std::size_t chunk = 0;
  for (std::size_t i = 0; i < sql.size(); ++i) {
    if (sql[i] == '\'') {  // a literal: skip to its closing quote ('' is an escaped quote)
      i = sql.find('\'', i + 1);
      if (i == std::string::npos) break;
      continue;
    }
    const bool param = sql[i] == ':' && i + 1 < sql.size() && sql_ident_char(sql[i + 1]) &&
                       (i == 0 || sql[i - 1] != ':');
    if (!param) continue;
    std::size_t j = i + 1;
    while (j < sql.size() && sql_ident_char(sql[j]))
      ++j;
    on_text(std::string_view(sql).substr(chunk, i - chunk));
    on_param(sql.substr(i + 1, j - i - 1));
    chunk = j;
    i = j - 1;
  }
  if (chunk < sql.size()) on_text(std::string_view(sql).substr(chunk));
}

}  // namespace dblock::detail
