#include "backend.hpp"

namespace dblock::detail {

const dialect& mysql_dialect() {
  static const my::connector conn;
  static const my::classifier errors;
  static const my::vocabulary sql;
  static const my::executor exec;
  static const std::vector<migration_file> files = load_migrations("mysql");
  static const migration_file boot = load_bootstrap("mysql");
  static const dialect d{"mysql", conn, errors, sql, exec, files, boot};
  return d;
}

}  // namespace dblock::detail
