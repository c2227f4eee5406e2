#include "backend.hpp"

namespace dblock::detail {

const dialect& mysql_dialect() {
  return make_dialect<my::connector, my::classifier, my::vocabulary, my::executor, my::doorbell>(
      "mysql");
}

}  // namespace dblock::detail
