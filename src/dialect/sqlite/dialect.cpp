#include "backend.hpp"

namespace dblock::detail {

const dialect& sqlite_dialect() {
  return make_dialect<lite::connector, lite::classifier, lite::vocabulary, lite::executor>(
      "sqlite");
}

}  // namespace dblock::detail
