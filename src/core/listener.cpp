// The names of listener.hpp's reasons (the Prometheus `reason` labels).
#include "dblock/listener.hpp"

namespace dblock {

std::string_view to_string(loss_reason r) noexcept {
  switch (r) {
    case loss_reason::expired:
      return "expired";
    case loss_reason::taken_over:
      return "taken_over";
    case loss_reason::forced:
      return "forced";
    case loss_reason::connection:
      return "connection";
  }
  return "unknown";
}

std::string_view to_string(acquire_failure f) noexcept {
  switch (f) {
    case acquire_failure::timeout:
      return "timeout";
    case acquire_failure::cancelled:
      return "cancelled";
    case acquire_failure::error:
      return "error";
  }
  return "unknown";
}

}  // namespace dblock
