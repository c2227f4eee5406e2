// Internal: validation of user-configured identifiers and resource names.
#pragma once

#include <string>
#include <string_view>

namespace dblock::detail {

/// Longest resource name in bytes; the lock table's column holds exactly this many.
constexpr std::size_t max_resource_name_bytes = 255;

/// Throws errc::invalid_argument unless `ident` matches [A-Za-z_][A-Za-z0-9_]{0,62}.
void validate_identifier(std::string_view ident, const char* what);

/// Throws errc::invalid_argument unless `name` is 1..255 bytes of valid UTF-8 without NUL.
/// Names are compared byte for byte: "a", "A" and "a " are three different locks.
void validate_resource_name(std::string_view name);

}  // namespace dblock::detail
