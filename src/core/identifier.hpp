// Internal: validation of user-configured identifiers and resource names.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace dblock::detail {

/// Longest resource name in bytes; the lock table's column holds exactly this many.
constexpr std::size_t max_resource_name_bytes = 255;

/// At most the first 64 bytes of `s` for an error message, every byte outside printable ASCII
/// as \xNN (a hostile value never puts raw control bytes or invalid UTF-8 into a message).
std::string printable(std::string_view s);

/// Throws errc::invalid_argument unless `ident` matches [A-Za-z_][A-Za-z0-9_]{0,62}.
void validate_identifier(std::string_view ident, const char* what);

/// U+FFFF (a Unicode noncharacter, "for internal use"), UTF-8 encoded: it separates a
/// semaphore's name from a permit's slot in the permit's lease name, and is refused in the
/// names users give, so that no lock ever shares a row with a permit.
inline constexpr std::string_view internal_separator = "\xEF\xBF\xBF";

/// Throws errc::invalid_argument unless `name` is 1..255 bytes of valid UTF-8 without NUL and
/// without U+FFFF (internal_separator). Names are compared byte for byte: "a", "A" and "a " are
/// three different locks.
void validate_resource_name(std::string_view name);

/// validate_resource_name() for a lease row's name, where dblock's own internal names (a
/// semaphore permit's) are allowed too.
void validate_lease_name(std::string_view name);

/// The lease name of permit `slot` of semaphore `name`.
std::string permit_lease_name(std::string_view name, int slot);
/// The names of every permit of semaphore `name` in byte order: [first, second). Permit names
/// are `name` U+FFFF and the slot's digits, so the range ends before `name` U+FFFF ":" (the byte
/// after '9'); no other name falls in it.
std::pair<std::string, std::string> permit_name_range(std::string_view name);

/// Throws errc::invalid_argument unless free text (a name pattern, a force_release reason)
/// is valid UTF-8 without NUL: PostgreSQL text holds neither, and libpq and SOCI pass C strings,
/// so a NUL would silently cut the value short on every backend.
void validate_text(std::string_view text, const char* what);

}  // namespace dblock::detail
