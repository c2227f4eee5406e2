#include "dblock/prometheus.hpp"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace dblock {

struct prometheus_listener::impl {
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Counter* acquired;
  prometheus::Histogram* acquire_seconds;
  prometheus::Counter* contended;
  prometheus::Counter* retries;
  prometheus::Counter* released;
  prometheus::Counter* renew_failures;
  prometheus::Counter* renewed;
  prometheus::Counter* renew_round_trips;
  prometheus::Counter* lost;
  prometheus::Counter* reaped;

  impl(std::shared_ptr<prometheus::Registry> r, const std::string& backend)
      : registry(std::move(r)) {
    const std::map<std::string, std::string> labels{{"backend", backend}};
    auto counter = [&](const char* name, const char* help) -> prometheus::Counter& {
      return prometheus::BuildCounter().Name(name).Help(help).Register(*registry).Add(labels);
    };
    acquired = &counter("dblock_acquired_total", "Leases acquired (reentry included)");
    contended = &counter("dblock_contended_total", "Acquire attempts that found the lease held");
    retries = &counter("dblock_retries_total", "Operations retried after a transient error");
    released = &counter("dblock_released_total", "Lease holds released");
    renew_failures = &counter("dblock_renew_failures_total", "Renewals that failed transiently");
    renewed = &counter("dblock_renewed_total", "Leases renewed by watchdogs");
    renew_round_trips =
        &counter("dblock_renew_round_trips_total", "Statements sent by watchdogs' batch renewals");
    lost = &counter("dblock_leases_lost_total", "Leases found lost");
    reaped = &counter("dblock_rows_reaped_total", "Expired lease rows deleted by reapers");
    acquire_seconds = &prometheus::BuildHistogram()
                           .Name("dblock_acquire_seconds")
                           .Help("Latency of successful acquire calls")
                           .Register(*registry)
                           .Add(labels, prometheus::Histogram::BucketBoundaries{
                                            0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25, 0.5, 1, 2.5, 5, 10});
  }
};

prometheus_listener::prometheus_listener(std::shared_ptr<prometheus::Registry> registry,
                                         const std::string& backend_label)
    : impl_(std::make_unique<impl>(std::move(registry), backend_label)) {}
prometheus_listener::~prometheus_listener() = default;

std::string prometheus_listener::text() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

void prometheus_listener::acquired(std::string_view, std::int64_t,
                                   std::chrono::microseconds latency) {
  impl_->acquired->Increment();
  impl_->acquire_seconds->Observe(static_cast<double>(latency.count()) / 1e6);
}
void prometheus_listener::contended(std::string_view) {
  impl_->contended->Increment();
}
void prometheus_listener::retried(std::string_view, const error&) {
  impl_->retries->Increment();
}
void prometheus_listener::released(std::string_view, std::chrono::microseconds) {
  impl_->released->Increment();
}
void prometheus_listener::renew_failed(std::string_view, const error&) {
  impl_->renew_failures->Increment();
}
void prometheus_listener::renewed(std::size_t leases, std::size_t round_trips) {
  impl_->renewed->Increment(static_cast<double>(leases));
  impl_->renew_round_trips->Increment(static_cast<double>(round_trips));
}
void prometheus_listener::lease_lost(std::string_view, const error&) {
  impl_->lost->Increment();
}
void prometheus_listener::rows_reaped(std::uint64_t rows, std::uint64_t) {
  impl_->reaped->Increment(static_cast<double>(rows));
}

}  // namespace dblock
