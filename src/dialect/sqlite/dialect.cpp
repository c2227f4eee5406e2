#include "backend.hpp"

namespace dblock::detail {

const dialect& sqlite_dialect() {
  return make_dialect<lite::connector, lite::classifier, lite::vocabulary, lite::executor,
                      lite::doorbell>("sqlite");
}

}  // namespace dblock::detail
