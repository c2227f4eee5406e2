#include "values.hpp"

#include "dblock/error.hpp"

namespace dblock::detail {

void value_binder::bind(soci::statement& st, const value& v, const std::string& name) {
  indicators_.push_back(soci::i_ok);
  soci::indicator& ind = indicators_.back();
  if (std::holds_alternative<std::monostate>(v)) {
    ints_.push_back(0);
    ind = soci::i_null;
    st.exchange(soci::use(ints_.back(), ind, name));
  } else if (auto* i = std::get_if<long long>(&v)) {
    ints_.push_back(*i);
    st.exchange(soci::use(ints_.back(), ind, name));
  } else if (auto* d = std::get_if<double>(&v)) {
    doubles_.push_back(*d);
    st.exchange(soci::use(doubles_.back(), ind, name));
  } else {
    strings_.push_back(std::get<std::string>(v));
    st.exchange(soci::use(strings_.back(), ind, name));
  }
}

value value_from_row(const soci::row& r, std::size_t i) {
  if (r.get_indicator(i) == soci::i_null) return std::monostate{};
  const auto& props = r.get_properties(i);
  switch (props.get_data_type()) {
    case soci::dt_string:
      return r.get<std::string>(i);
    case soci::dt_double:
      return r.get<double>(i);
    case soci::dt_integer:
      return static_cast<long long>(r.get<int>(i));
    case soci::dt_long_long:
      return r.get<long long>(i);
    case soci::dt_unsigned_long_long:
      return static_cast<long long>(r.get<unsigned long long>(i));
    default:
      throw error(errc::invalid_argument,
                  "column '" + props.get_name() +
                      "' has a type dblock cannot carry (use integer, floating-point or text)");
  }
}

std::string describe(const value& v) {
  if (std::holds_alternative<std::monostate>(v)) return "NULL";
  if (auto* i = std::get_if<long long>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return std::to_string(*d);
  return "'" + std::get<std::string>(v).substr(0, 64) + "'";
}

}  // namespace dblock::detail
