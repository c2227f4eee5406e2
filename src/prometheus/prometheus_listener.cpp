// dblock's listener events as Prometheus metrics (prometheus.hpp; docs/observability.md).
#include "dblock/prometheus.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <atomic>
#include <mutex>

namespace dblock {

namespace {

using prometheus::Histogram;

double seconds(std::chrono::microseconds d) {
  return static_cast<double>(d.count()) / 1e6;
}

// Waits and holds up to 10 minutes (a cron job's lock, a long migration), then +Inf.
const Histogram::BucketBoundaries& long_buckets() {
  static const Histogram::BucketBoundaries b{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05,
                                             0.1,    0.25,  0.5,   1,     2.5,  5,     10,
                                             30,     60,    120,   300,   600};
  return b;
}
// Round trips: a renewal that takes seconds is already a problem.
const Histogram::BucketBoundaries& short_buckets() {
  static const Histogram::BucketBoundaries b{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05,
                                             0.1,    0.25,  0.5,   1,     2.5,  5,     10};
  return b;
}

constexpr std::array<loss_reason, 4> loss_reasons{loss_reason::expired, loss_reason::taken_over,
                                                  loss_reason::forced, loss_reason::connection};
constexpr std::array<acquire_failure, 3> failure_reasons{
    acquire_failure::timeout, acquire_failure::cancelled, acquire_failure::error};

// A counter family with a series per reason (`reason` label), for one backend.
template <class Reason, std::size_t N>
void by_reason(prometheus::Registry& r, const char* name, const char* help,
               const std::string& backend, const std::array<Reason, N>& reasons,
               std::array<prometheus::Counter*, N>& out) {
  auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(r);
  for (std::size_t k = 0; k < N; ++k)
    out[k] = &family.Add({{"backend", backend}, {"reason", std::string(to_string(reasons[k]))}});
}

// Every metric of one `backend` label.
struct metric_set {
  prometheus::Counter* acquired;
  Histogram* acquire_seconds;
  prometheus::Counter* contended;
  std::array<prometheus::Counter*, failure_reasons.size()> failed;
  prometheus::Counter* retries;
  prometheus::Counter* released;
  Histogram* hold_seconds;
  prometheus::Counter* renewed;
  prometheus::Counter* renew_round_trips;
  Histogram* renew_seconds;
  prometheus::Counter* renew_failures;
  std::array<prometheus::Counter*, loss_reasons.size()> lost;
  prometheus::Counter* reaped;
  prometheus::Gauge* held;
  prometheus::Gauge* waiting;
  prometheus::Family<prometheus::Gauge>* leader;
  std::string backend;

  metric_set(prometheus::Registry& r, const std::string& b) : backend(b) {
    const std::map<std::string, std::string> labels{{"backend", b}};
    auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
      return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
    };
    auto histogram = [&](const char* name, const char* help,
                         const Histogram::BucketBoundaries& buckets) -> Histogram& {
      return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(labels, buckets);
    };
    auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
      return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
    };
    acquired = &counter("dblock_acquired_total", "Leases acquired (reentry included)");
    acquire_seconds =
        &histogram("dblock_acquire_seconds", "Duration of successful acquire calls, waits included",
                   long_buckets());
    contended = &counter("dblock_contended_total", "Acquire calls that found the lease held");
    by_reason(r, "dblock_acquire_failures_total",
              "Acquire calls that gave up without the lease, by reason", b, failure_reasons,
              failed);
    retries = &counter("dblock_retries_total", "Operations retried after a transient error");
    released = &counter("dblock_released_total", "Lease holds released");
    hold_seconds = &histogram("dblock_hold_seconds", "How long released lease holds were held",
                              long_buckets());
    renewed = &counter("dblock_renewed_total", "Leases renewed by watchdogs");
    renew_round_trips =
        &counter("dblock_renew_round_trips_total", "Statements sent by watchdogs' batch renewals");
    renew_seconds =
        &histogram("dblock_renew_seconds",
                   "Duration of renewals (a watchdog batch or one renew call)", short_buckets());
    renew_failures = &counter("dblock_renew_failures_total", "Renewals that failed transiently");
    by_reason(r, "dblock_leases_lost_total", "Leases found lost, by reason", b, loss_reasons, lost);
    reaped = &counter("dblock_rows_reaped_total", "Expired lease rows deleted by reapers");
    held = &gauge("dblock_leases_held",
                  "Leases this process holds (semaphore permits and leaderships included)");
    waiting = &gauge("dblock_acquires_waiting", "Acquire calls of this process waiting now");
    leader = &prometheus::BuildGauge()
                  .Name("dblock_leader")
                  .Help("1 while this process leads the election, else 0")
                  .Register(r);
  }
};

}  // namespace

struct prometheus_listener::impl {
  std::shared_ptr<prometheus::Registry> registry;
  std::mutex mu;
  std::string label;  // given, or the first attached backend; guarded by mu
  std::unique_ptr<metric_set> set;
  std::atomic<metric_set*> ready{nullptr};

  impl(std::shared_ptr<prometheus::Registry> r, std::string b)
      : registry(std::move(r)), label(std::move(b)) {
    if (!label.empty()) make();
  }
  // With mu held, or from the constructor.
  void make() {
    set = std::make_unique<metric_set>(*registry, label);
    ready.store(set.get());
  }
  // The metrics; made with the label known so far (normally attached() came first).
  metric_set& m() {
    if (auto* s = ready.load()) return *s;
    std::lock_guard<std::mutex> l(mu);
    if (!set) make();
    return *set;
  }
};

prometheus_listener::prometheus_listener(std::shared_ptr<prometheus::Registry> registry,
                                         const std::string& backend_label)
    : impl_(std::make_unique<impl>(std::move(registry), backend_label)) {}
prometheus_listener::~prometheus_listener() = default;

std::string prometheus_listener::text() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

std::string prometheus_listener::backend_label() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->label;
}

void prometheus_listener::attached(std::string_view backend) {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->set) return;
  impl_->label = std::string(backend);
  impl_->make();
}
void prometheus_listener::acquired(std::string_view, std::int64_t,
                                   std::chrono::microseconds latency) {
  auto& m = impl_->m();
  m.acquired->Increment();
  m.acquire_seconds->Observe(seconds(latency));
}
void prometheus_listener::contended(std::string_view) {
  impl_->m().contended->Increment();
}
void prometheus_listener::acquire_failed(std::string_view, acquire_failure why,
                                         std::chrono::microseconds) {
  for (std::size_t k = 0; k < failure_reasons.size(); ++k)
    if (failure_reasons[k] == why) impl_->m().failed[k]->Increment();
}
void prometheus_listener::waiting(std::string_view, bool waiting) {
  auto& g = *impl_->m().waiting;
  waiting ? g.Increment() : g.Decrement();
}
void prometheus_listener::holding(std::string_view, bool held) {
  auto& g = *impl_->m().held;
  held ? g.Increment() : g.Decrement();
}
void prometheus_listener::leadership(std::string_view election, bool leader) {
  auto& m = impl_->m();
  // Counted, not set: two candidates of this process may overlap for a moment (one wins
  // while the other's loss is not found yet), and the calls pair up.
  auto& g = m.leader->Add({{"backend", m.backend}, {"election", std::string(election)}});
  leader ? g.Increment() : g.Decrement();
}
void prometheus_listener::retried(std::string_view, const error&) {
  impl_->m().retries->Increment();
}
void prometheus_listener::released(std::string_view, std::chrono::microseconds held) {
  auto& m = impl_->m();
  m.released->Increment();
  m.hold_seconds->Observe(seconds(held));
}
void prometheus_listener::renew_latency(std::chrono::microseconds latency) {
  impl_->m().renew_seconds->Observe(seconds(latency));
}
void prometheus_listener::renew_failed(std::string_view, const error&) {
  impl_->m().renew_failures->Increment();
}
void prometheus_listener::renewed(std::size_t leases, std::size_t round_trips) {
  auto& m = impl_->m();
  m.renewed->Increment(static_cast<double>(leases));
  m.renew_round_trips->Increment(static_cast<double>(round_trips));
}
void prometheus_listener::lost(std::string_view, loss_reason reason, const error&) {
  for (std::size_t k = 0; k < loss_reasons.size(); ++k)
    if (loss_reasons[k] == reason) impl_->m().lost[k]->Increment();
}
void prometheus_listener::rows_reaped(std::uint64_t rows, std::uint64_t) {
  impl_->m().reaped->Increment(static_cast<double>(rows));
}

}  // namespace dblock
