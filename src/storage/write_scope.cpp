#include "storage/write_scope.hpp"

namespace dblock::detail {

write_scope::write_scope(session_scope& s, write_kind kind, std::string what,
                         std::optional<std::chrono::milliseconds> lock_timeout)
    : s_(s), kind_(kind), what_(std::move(what)) {
  try {
    if (kind_ == write_kind::statement)
      s_.dia().exec.begin_statement(s_);
    else
      s_.dia().conn.begin(s_.sql(), lock_timeout);
  } catch (...) {
    // BEGIN may have gone through before a later set-up statement failed: never hand the
    // connection back inside an open transaction.
    error e = s_.failure(what_ + " (begin)");
    try {
      if (s_.dia().conn.in_transaction(s_.sql())) s_.mark_broken();
    } catch (...) {
      s_.mark_broken();
    }
    throw e;
  }
  open_ = true;
}

write_scope::~write_scope() {
  rollback();
}

void write_scope::end() noexcept {
  open_ = false;
  if (kind_ != write_kind::transaction) return;
  try {
    s_.dia().conn.end_transaction(s_.sql(), s_.db().options);
  } catch (...) {
    s_.mark_broken();
  }
}

void write_scope::rollback() noexcept {
  if (!open_) return;
  if (kind_ == write_kind::statement) {
    s_.dia().exec.rollback_statement(s_);
  } else {
    try {
      s_.sql() << "ROLLBACK";
    } catch (...) {
      s_.mark_broken();  // a broken connection rolls back by itself; do not reuse it
    }
  }
  end();
}

void write_scope::commit() {
  if (!open_) throw error(errc::not_owner, what_ + ": the write has already ended");
  const bool aborted =
      kind_ == write_kind::transaction && (failure_ || s_.dia().conn.transaction_failed(s_.sql()));
  if (aborted) {
    // MySQL would commit the statements before the failure (its lock wait timeout rolls back
    // only the statement): never commit half a transaction.
    std::optional<error> cause = failure_;
    rollback();
    throw error(cause ? cause->code() : errc::backend_error,
                what_ + ": the transaction had failed and was rolled back, nothing was written" +
                    (cause ? std::string(": ") + cause->what() : std::string()));
  }
  const session_ref server = s_.server();
  try {
    if (kind_ == write_kind::statement)
      s_.dia().exec.commit_statement(s_);
    else
      s_.sql() << "COMMIT";
  } catch (...) {
    error e = s_.failure(what_ + " (COMMIT)");
    if (e.code() == errc::connection_lost) {
      open_ = false;
      throw error(errc::in_doubt,
                  what_ +
                      ": the connection broke after COMMIT was sent; the write may or may not "
                      "have been applied (read back to find out; do not retry blindly)" +
                      in_doubt_finality(s_.db_ptr(), server),
                  e.backend(), e.sqlstate(), e.native_code());
    }
    rollback();
    throw e;
  }
  end();
}

}  // namespace dblock::detail
