// Internal: binding dblock::value to SOCI statements and reading it back from rows.
#pragma once

#include <soci/soci.h>

#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dblock/value.hpp"
#include "dialect/dialect.hpp"

namespace dblock::detail {

class session_scope;

/// A caller's statement's named values, as dblock's public API takes them.
using named_values = std::vector<std::pair<std::string, value>>;

/// The form in which dblock's executor runs a statement of the caller's (statement::caller:
/// prepared once per connection, like dblock's own) when every value is an integer or a string
/// and the parameters in the text are exactly the ones given (`values` receives them); nothing
/// otherwise (SOCI binds NULLs and doubles with their types).
std::optional<statement> caller_statement(const std::string& text, const named_values& params,
                                          std::vector<sql_param>& values);

/// Rows of a row-returning statement of the caller's, decoded as decode_value() does.
struct fetched_rows {
  std::vector<std::string> names;  ///< column names (empty when no row came back)
  std::vector<std::vector<value>> rows;
};
/**
 * Runs a row-returning statement of the caller's. The first run on a connection goes through
 * SOCI, which describes the columns; the connection keeps that description, and later runs go
 * through the executor's cached statement (caller_statement()), their text cells decoded to the
 * same types (vocabulary::decode_text()). A cell that does not convert exactly, or values the
 * executor cannot bind, send the statement through SOCI again (a repeated SELECT ... FOR UPDATE
 * in the same transaction only meets its own locks).
 */
fetched_rows fetch_rows(session_scope& s, const std::string& text, const named_values& params);

/// Owns the storage that SOCI's use() binds by reference; deques keep addresses stable.
class value_binder {
 public:
  /// Binds `v` to the statement under `name` (referenced as :name in its SQL).
  void bind(soci::statement& st, const value& v, const std::string& name);

 private:
  std::deque<long long> ints_;
  std::deque<double> doubles_;
  std::deque<std::string> strings_;
  std::deque<soci::indicator> indicators_;
};

/// Renders a value for messages (text quoted, NULL as NULL).
std::string describe(const value& v);

}  // namespace dblock::detail
