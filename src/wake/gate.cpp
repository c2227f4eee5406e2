#include "wake/gate.hpp"

#include <algorithm>

#include "core/cancel_access.hpp"

namespace dblock::detail {

void gate_pass::bind(std::function<std::chrono::steady_clock::time_point()> valid_until) {
  gates_.bind(name_, gen_, std::move(valid_until));
}

void gate_pass::leave() {
  gates_.leave(name_, gen_);
}

std::shared_ptr<gate_pass> local_gates::enter(const std::string& name, const cancellation& cancel,
                                              steady::time_point deadline,
                                              const std::function<void()>& queued) {
  std::unique_lock<std::mutex> l(mu_);
  // The gate stays in the map while it is held or w waits in its queue: `g` stays valid.
  gate& g = gates_[name];
  if (g.gen == 0 && g.queue.empty()) {
    g.gen = next_gen_++;
    return std::make_shared<gate_pass>(*this, name, g.gen);
  }
  auto w = std::make_shared<waiter>();
  w->cancel = cancel;
  g.queue.push_back(w);
  if (queued) {  // `g` stays: w is in its queue
    l.unlock();
    queued();
    l.lock();
  }
  for (;;) {
    if (w->gen != 0) return std::make_shared<gate_pass>(*this, name, w->gen);
    const auto now = steady::now();
    if (now >= deadline || cancel.cancelled()) {
      g.queue.erase(std::find(g.queue.begin(), g.queue.end(), w));
      return nullptr;
    }
    auto until = deadline;
    if (g.holder_until) {
      const auto end = g.holder_until();
      if (end > now) {
        until = std::min(until, end + std::chrono::milliseconds(1));
      } else if (g.queue.front() == w) {
        // The holder's lease ran out without a release: its pass no longer counts.
        g.queue.pop_front();
        g.gen = next_gen_++;
        g.holder_until = nullptr;
        return std::make_shared<gate_pass>(*this, name, g.gen);
      }  // else the first in line takes it over and passes it on in turn
    }
    w->poked.store(false);
    w->until = until;
    l.unlock();
    cancel_access::wait(cancel, until - now, w->poked, w->slot);
    l.lock();
  }
}

void local_gates::bind(const std::string& name, std::uint64_t gen,
                       std::function<steady::time_point()> valid_until) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = gates_.find(name);
  if (it == gates_.end() || it->second.gen != gen) return;  // taken over meanwhile
  gate& g = it->second;
  g.holder_until = std::move(valid_until);
  // The first in line may sleep past the holder's validity: let it time the holder's instead.
  if (!g.queue.empty() && g.queue.front()->until > g.holder_until()) {
    auto& first = *g.queue.front();
    first.poked.store(true);
    cancel_access::poke(first.slot);
  }
}

void local_gates::leave(const std::string& name, std::uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = gates_.find(name);
  if (it == gates_.end() || it->second.gen != gen) return;  // taken over meanwhile
  pass_on(it);
}

void local_gates::pass_on(std::unordered_map<std::string, gate>::iterator it) {
  gate& g = it->second;
  g.holder_until = nullptr;
  if (g.queue.empty()) {
    gates_.erase(it);
    return;
  }
  auto w = g.queue.front();
  g.queue.pop_front();
  w->gen = next_gen_++;
  g.gen = w->gen;
  w->poked.store(true);
  cancel_access::poke(w->slot);
}

}  // namespace dblock::detail
