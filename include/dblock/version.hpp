// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

/// @file
/// @brief The version of dblock: the headers' (macros) and the library's (dblock::version()).

/// Major version of these headers (incompatible API changes).
#define DBLOCK_VERSION_MAJOR 0
/// Minor version of these headers (added features).
#define DBLOCK_VERSION_MINOR 1
/// Patch version of these headers (fixes).
#define DBLOCK_VERSION_PATCH 0
/// "MAJOR.MINOR.PATCH" of these headers.
#define DBLOCK_VERSION_STRING "0.1.0"

namespace dblock {

/// The version of the library linked in, "MAJOR.MINOR.PATCH" (it may differ from
/// DBLOCK_VERSION_STRING when a shared library was upgraded under a program).
/// Thread-safety: safe to call from any thread.
const char* version() noexcept;

}  // namespace dblock
