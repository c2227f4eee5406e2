#include "backend.hpp"

namespace dblock::detail {

const dialect& postgresql_dialect() {
  static const pg::connector conn;
  static const pg::classifier errors;
  static const pg::vocabulary sql;
  static const pg::executor exec;
  static const std::vector<migration_file> files = load_migrations("postgresql");
  static const migration_file boot = load_bootstrap("postgresql");
  static const dialect d{"postgresql", conn, errors, sql, exec, files, boot};
  return d;
}

}  // namespace dblock::detail
