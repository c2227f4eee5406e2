// Internal: the std::error_code forms of the try_* calls (docs/errors.md, "Without exceptions").
#pragma once

#include <system_error>

namespace dblock::detail {

/// Runs `call` (a try_* call returning an optional or a bool); a std::system_error (dblock::error
/// among them) becomes `ec` and an empty result. `ec` is cleared otherwise.
template <class F>
auto no_throw(std::error_code& ec, F&& call) -> decltype(call()) {
  ec.clear();
  try {
    return call();
  } catch (const std::system_error& e) {
    ec = e.code();
    return {};
  }
}

}  // namespace dblock::detail
