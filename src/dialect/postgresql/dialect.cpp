#include "backend.hpp"

namespace dblock::detail {

const dialect& postgresql_dialect() {
  return make_dialect<pg::connector, pg::classifier, pg::vocabulary, pg::executor, pg::doorbell>(
      "postgresql");
}

}  // namespace dblock::detail
