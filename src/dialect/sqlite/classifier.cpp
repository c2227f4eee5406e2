#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::lite {

error classifier::classify_current(const std::string& what) const {
  rethrow_if_dblock_error();
  try {
    throw;
  } catch (const soci::sqlite3_soci_error& e) {
    int rc = e.result();
    std::string msg = one_line(e.get_error_message());
    errc code = errc::backend_error;
    switch (rc) {
      case SQLITE_BUSY_SNAPSHOT:
        code = errc::serialization_failure;
        break;
      case SQLITE_CONSTRAINT_UNIQUE:
      case SQLITE_CONSTRAINT_PRIMARYKEY:
        code = errc::unique_violation;
        break;
      case SQLITE_CONSTRAINT_CHECK:
        code = errc::invalid_argument;
        break;
      case SQLITE_INTERRUPT:
        code = errc::cancelled;
        break;
      case SQLITE_CANTOPEN:
        code = errc::connection_failed;
        break;
      default:
        if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
          code = errc::lock_not_available;
        else if (contains_nocase(msg, "no such table"))
          code = errc::schema_missing;
        else if (contains_nocase(msg, "database is locked"))
          code = errc::lock_not_available;
        break;
    }
    return error(code, what + ": " + msg, "sqlite", "", rc);
  } catch (const soci::soci_error& e) {
    std::string msg = one_line(e.get_error_message());
    errc code = contains_nocase(msg, "no such table")        ? errc::schema_missing
                : contains_nocase(msg, "database is locked") ? errc::lock_not_available
                                                             : errc::backend_error;
    return error(code, what + ": " + msg, "sqlite", "", 0);
  } catch (const std::exception& e) {
    return error(errc::backend_error, what + ": " + one_line(e.what()), "sqlite", "", 0);
  }
}

}  // namespace dblock::detail::lite
