#include "dblock/error.hpp"

#include <optional>
#include <utility>

namespace dblock {

const char* to_string(errc code) noexcept {
  switch (code) {
    case errc::timeout:
      return "timeout";
    case errc::cancelled:
      return "cancelled";
    case errc::lock_not_available:
      return "lock_not_available";
    case errc::deadlock:
      return "deadlock";
    case errc::serialization_failure:
      return "serialization_failure";
    case errc::unique_violation:
      return "unique_violation";
    case errc::version_conflict:
      return "version_conflict";
    case errc::lease_lost:
      return "lease_lost";
    case errc::not_owner:
      return "not_owner";
    case errc::connection_lost:
      return "connection_lost";
    case errc::connection_failed:
      return "connection_failed";
    case errc::in_doubt:
      return "in_doubt";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::not_found:
      return "not_found";
    case errc::schema_missing:
      return "schema_missing";
    case errc::schema_mismatch:
      return "schema_mismatch";
    case errc::backend_error:
      return "backend_error";
    case errc::pool_exhausted:
      return "pool_exhausted";
  }
  return "unknown";
}

retry_advice advice_for(errc code) noexcept {
  switch (code) {
    case errc::timeout:
    case errc::lock_not_available:
    case errc::connection_lost:
    case errc::pool_exhausted:
      return retry_advice::retry_call;
    case errc::deadlock:
    case errc::serialization_failure:
    case errc::version_conflict:
      return retry_advice::retry_transaction;
    default:
      return retry_advice::do_not_retry;
  }
}

namespace {
class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dblock"; }
  std::string message(int ev) const override { return to_string(static_cast<errc>(ev)); }
  // The standard condition a code is equivalent to, if any (documented on error_category()).
  bool equivalent(int ev, const std::error_condition& cond) const noexcept override {
    if (cond.category() == *this) return cond.value() == ev;
    const auto standard = [](errc e) -> std::optional<std::errc> {
      switch (e) {
        case errc::timeout:
          return std::errc::timed_out;
        case errc::cancelled:
          return std::errc::operation_canceled;
        case errc::lock_not_available:
          return std::errc::device_or_resource_busy;
        case errc::deadlock:
          return std::errc::resource_deadlock_would_occur;
        case errc::connection_lost:
          return std::errc::connection_aborted;
        case errc::invalid_argument:
          return std::errc::invalid_argument;
        case errc::not_owner:
          return std::errc::operation_not_permitted;
        case errc::pool_exhausted:
          return std::errc::resource_unavailable_try_again;
        default:
          return std::nullopt;
      }
    }(static_cast<errc>(ev));
    return standard && cond == std::make_error_condition(*standard);
  }
};
}  // namespace

const std::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

error::error(errc code, const std::string& message)
    : std::system_error(make_error_code(code), message), kind_(code), message_(message) {}

error::error(errc code, const std::string& message, std::string backend, std::string sqlstate,
             long long native_code)
    : std::system_error(make_error_code(code), message),
      kind_(code),
      message_(message),
      backend_(std::move(backend)),
      sqlstate_(std::move(sqlstate)),
      native_code_(native_code) {}

}  // namespace dblock
