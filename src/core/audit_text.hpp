// Internal: the checks of an audited action's reason and author (force_release(), forget_runs()).
#pragma once

#include <string>

#include "core/identifier.hpp"
#include "dblock/error.hpp"

namespace dblock::detail {

/// Throws errc::invalid_argument, naming `fn`, for a reason over 1000 bytes, an author (`by`,
/// called `by_name`) over 255, or either with a NUL byte or not valid UTF-8.
inline void validate_audit_text(const std::string& reason, const std::string& by, const char* fn,
                                const char* by_name) {
  if (reason.size() > 1000)
    throw error(errc::invalid_argument, std::string(fn) + ": the reason is over 1000 bytes");
  if (by.size() > 255)
    throw error(errc::invalid_argument, std::string(fn) + ": " + by_name + " is over 255 bytes");
  validate_text(reason, (std::string(fn) + " reason").c_str());
  validate_text(by, (std::string(fn) + " " + by_name).c_str());
}

}  // namespace dblock::detail
