// dblock: distributed locks and safe concurrent updates on the database you already run.
// Column values and records, shared by optimistic updates, CAS and row-locking transactions.
#pragma once

#include <map>
#include <string>
#include <variant>

/// @file
/// @brief Column values (dblock::value) and records (dblock::record).

namespace dblock {

/// A column value: NULL (std::monostate), an integer, a floating-point number or text.
using value = std::variant<std::monostate, long long, double, std::string>;

/// Column name to value.
using record = std::map<std::string, value>;

}  // namespace dblock
