// Test helper: reading integer columns of a soci::row whatever integer type the backend reports.
#pragma once

#include <soci/soci.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace dblock::test {

/// Column `i` of a row as a 64-bit integer (int, long long, unsigned long long, double or a
/// numeric string, as the backend reports it); throws std::runtime_error for any other type.
inline long long row_int(const soci::row& r, std::size_t i) {
  switch (r.get_properties(i).get_data_type()) {
    case soci::dt_integer:
      return r.get<int>(i);
    case soci::dt_long_long:
      return r.get<long long>(i);
    case soci::dt_unsigned_long_long:
      return static_cast<long long>(r.get<unsigned long long>(i));
    case soci::dt_double:
      return static_cast<long long>(r.get<double>(i));
    case soci::dt_string:
      return std::stoll(r.get<std::string>(i));
    default:
      throw std::runtime_error("unexpected column type");
  }
}

}  // namespace dblock::test
