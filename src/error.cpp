#include "dblock/error.hpp"

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
  }
  return "unknown";
}

retry_advice advice_for(errc code) noexcept {
  switch (code) {
    case errc::timeout:
    case errc::lock_not_available:
    case errc::connection_lost:
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
};
}  // namespace

const std::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

error::error(errc code, const std::string& message) : std::runtime_error(message), code_(code) {}

error::error(errc code, const std::string& message, std::string backend, std::string sqlstate,
             long long native_code)
    : std::runtime_error(message),
      code_(code),
      backend_(std::move(backend)),
      sqlstate_(std::move(sqlstate)),
      native_code_(native_code) {}

}  // namespace dblock
