#include "backend.hpp"

namespace dblock::detail {

const dialect& sqlite_dialect() {
  static const lite::connector conn;
  static const lite::classifier errors;
  static const lite::vocabulary sql;
  static const lite::executor exec;
  static const std::vector<migration_file> files = load_migrations("sqlite");
  static const migration_file boot = load_bootstrap("sqlite");
  static const dialect d{"sqlite", conn, errors, sql, exec, files, boot};
  return d;
}

}  // namespace dblock::detail
