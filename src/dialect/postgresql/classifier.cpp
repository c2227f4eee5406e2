#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::pg {
namespace {

errc code_for(const std::string& state) {
  errc code = errc::backend_error;
  if (state == "23505")
    code = errc::unique_violation;
  else if (state == "40001")
    code = errc::serialization_failure;
  else if (state == "40P01")
    code = errc::deadlock;
  else if (state == "55P03")
    code = errc::lock_not_available;
  else if (state == "57014")
    code = errc::timeout;
  else if (state.compare(0, 2, "08") == 0 || state == "57P01" || state == "57P02" ||
           state == "57P03")
    code = errc::connection_lost;
  // 25006: a read-only node (a standby, or a primary demoted by a failover): nothing was
  // written; the connection is replaced, which reaches the new primary of a multi-host URL.
  else if (state == "28P01" || state == "28000" || state == "3D000" || state == "25006")
    code = errc::connection_failed;
  else if (state == "42P01")
    code = errc::schema_missing;
  else if (state == "22001")
    code = errc::invalid_argument;
  return code;
}

}  // namespace

error classifier::classify_current(const std::string& what) const {
  rethrow_if_dblock_error();
  try {
    throw;
  } catch (const soci::postgresql_soci_error& e) {
    std::string state = e.sqlstate();
    // A prepared statement that already exists, or does not, on a connection that prepared it
    // by name: server connections are being swapped under this one by a transaction-mode
    // pooler. The statement did not run (a transaction it was in is rolled back).
    if (state == "42P05" || state == "26000")
      return error(errc::invalid_argument,
                   what + ": the server " + (state == "42P05" ? "already has" : "does not have") +
                       " a statement this connection prepared (SQLSTATE " + state +
                       "): this connection seems to go through a transaction-mode pooler "
                       "(PgBouncer): add ?pooler=transaction to the URL "
                       "(database_options::pooler); nothing was written",
                   "postgresql", state, 0);
    std::string msg = what + ": " + one_line(e.get_error_message());
    const errc code = code_for(state);
    return error(code, msg, "postgresql", state, 0);
  } catch (const soci::soci_error& e) {
    errc code = e.get_error_category() == soci::soci_error::connection_error ? errc::connection_lost
                                                                             : errc::backend_error;
    if (contains_nocase(e.get_error_message(), "connection") &&
        (contains_nocase(e.get_error_message(), "closed") ||
         contains_nocase(e.get_error_message(), "no connection") ||
         contains_nocase(e.get_error_message(), "terminat")))
      code = errc::connection_lost;
    return error(code, what + ": " + one_line(e.get_error_message()), "postgresql", "", 0);
  } catch (const std::exception& e) {
    return error(errc::backend_error, what + ": " + one_line(e.what()), "postgresql", "", 0);
  }
}

}  // namespace dblock::detail::pg
