#include "round_trips.hpp"

#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/types.h>

namespace {

thread_local std::uint64_t sends = 0;

using send_fn = ssize_t (*)(int, const void*, size_t, int);

send_fn real_send() {
  static const send_fn real = reinterpret_cast<send_fn>(dlsym(RTLD_NEXT, "send"));
  return real;
}

}  // namespace

namespace dblock::bench {

std::uint64_t sends_on_this_thread() noexcept {
  return sends;
}

}  // namespace dblock::bench

// Shared libraries that call send() (libpq, libmariadb) bind to this definition, which the
// executable exports because they reference it; it counts and calls the C library's send().
extern "C" ssize_t send(int fd, const void* buf, size_t n, int flags) {
  ++sends;
  return real_send()(fd, buf, n, flags);
}
