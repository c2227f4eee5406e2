// Internal: binding dblock::value to SOCI statements and reading it back from rows.
#pragma once

#include <soci/soci.h>

#include <deque>
#include <string>

#include "dblock/value.hpp"

namespace dblock::detail {

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

/// Column `i` of a row as a value; throws errc::invalid_argument for unsupported types.
value value_from_row(const soci::row& r, std::size_t i);

/// Renders a value for messages (text quoted, NULL as NULL).
std::string describe(const value& v);

}  // namespace dblock::detail
