#include "wake/hub.hpp"

#include <limits>

#include "core/cancel_access.hpp"
#include "dialect/host_doorbell.hpp"

namespace dblock::detail {

wake_hub::wake_hub(const dialect& d, std::string target, table_names tables,
                   std::shared_ptr<listener> events)
    : dia_(d), target_(std::move(target)), tables_(std::move(tables)), events_(std::move(events)) {}

wake_hub::~wake_hub() {
  std::unique_ptr<bell_channel> ch;
  {
    std::lock_guard<std::mutex> l(channel_mu_);
    ch = std::move(channel_);
  }
  ch.reset();  // joins the channel's thread, which may still call deliver()
}

void wake_hub::ensure_channel() {
  if (channel_opened_.load() || target_.empty()) return;
  std::lock_guard<std::mutex> l(channel_mu_);
  if (channel_opened_.load()) return;
  bell_callbacks cb;
  cb.deliver = [this](const ring_event& ev) { deliver(ev); };
  cb.lost = [this] { wake_all(); };
  cb.confirmed = [this](const std::string& token, bool on) { confirmed(token, on); };
  cb.log = [ev = events_](log_level lv, const std::string& msg) {
    if (!ev) return;
    try {
      ev->log(lv, msg);
    } catch (...) {
    }
  };
  channel_ = dia_.bell.open(target_, tables_, std::move(cb));
  channel_opened_.store(true);
}

bool wake_hub::live(const wake_waiter& w) const {
  if (!channel_opened_.load()) return false;
  // channel_ is set once, before channel_opened_, and reset only by the destructor.
  if (!channel_ || !channel_->live()) return false;
  return !channel_->addressed() || w.subscribed.load();
}

std::chrono::milliseconds wake_hub::joined_recheck() const {
  return channel_opened_.load() && channel_ ? channel_->joined_recheck()
                                            : std::chrono::milliseconds(0);
}

bool wake_hub::is_own_bell(std::int64_t id) const {
  return channel_opened_.load() && channel_ && channel_->is_self(id);
}

std::string wake_hub::address() {
  ensure_channel();
  return channel_ ? channel_->address() : std::string();
}

void wake_hub::confirmed(const std::string& token, bool on) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& w : waiters_) {
    if (w->token != token) continue;
    w->subscribed.store(on);
    // Now reachable: let it look again at once and then sleep relying on rings, unless its
    // last read already knew that rings reach it.
    if (on && !w->polling.load()) continue;
    w->relook.store(true);
    w->rung.store(true);
    cancel_access::poke(w->slot);
  }
}

std::shared_ptr<wake_waiter> wake_hub::enlist(const std::string& name, const std::string& token,
                                              const cancellation& cancel) {
  ensure_channel();
  auto w = std::make_shared<wake_waiter>();
  w->name = name;
  w->name_hash = name_hash(name);
  w->token = token;
  w->cancel = cancel;
  {
    std::lock_guard<std::mutex> l(mu_);
    waiters_.push_back(w);
  }
  if (channel_ && channel_->addressed()) channel_->watch(token, true);
  return w;
}

void wake_hub::set_ticket(wake_waiter& w, std::int64_t ticket) {
  std::lock_guard<std::mutex> l(mu_);
  w.ticket = ticket;
  // Handed the lease before its enqueue's reply came back (grant_one() kept it).
  const auto p = early_grants_.find(ticket);
  if (p == early_grants_.end()) return;
  if (p->second.first == w.name_hash) {
    w.granted_fence.store(p->second.second);
    wake(w);
  }
  early_grants_.erase(p);
}

void wake_hub::leave(const std::shared_ptr<wake_waiter>& w, bool acquired) {
  if (channel_ && channel_->addressed()) channel_->watch(w->token, false);
  std::lock_guard<std::mutex> l(mu_);
  waiters_.remove(w);
  // A ring this waiter took but did not use belongs to the next waiter of the name (not a
  // lease handed to it: the waiter releases that itself, which rings the next one).
  if (!acquired && w->rung.load() && w->granted_fence.load() == 0)
    wake_one(w->name_hash, w->name, std::string());
}

bool wake_hub::wait(wake_waiter& w, std::chrono::nanoseconds d) {
  if (w.rung.exchange(false)) return true;
  if (d.count() <= 0) return false;
  w.asleep.store(true);
  const bool rung = cancel_access::wait(w.cancel, d, w.rung, w.slot);
  w.asleep.store(false);
  return rung && w.rung.exchange(false);
}

std::size_t wake_hub::asleep_on_rings() const {
  std::lock_guard<std::mutex> l(mu_);
  std::size_t n = 0;
  for (const auto& w : waiters_)
    if (w->asleep.load() && !w->rung.load() && live(*w)) ++n;
  return n;
}

bool wake_hub::wake_one(std::uint64_t hash, const std::string& name, const std::string& head) {
  std::shared_ptr<wake_waiter> pick;
  const bool any_name = hash == 0 && name.empty() && !head.empty();  // a ring for `head` only
  for (const auto& w : waiters_) {
    if (!any_name && (w->name_hash != hash || (!name.empty() && w->name != name))) continue;
    if (!head.empty()) {  // the head of the queue is known: exactly that waiter, if it is here
      if (w->token != head) continue;
      if (w->rung.load()) return false;
      pick = w;
      break;
    }
    if (w->rung.load()) continue;  // already woken, not yet back: it will look
    // Else the lowest ticket here (a waiter not yet enqueued counts as the newest).
    auto order = [](const wake_waiter& x) {
      return x.ticket > 0 ? x.ticket : std::numeric_limits<std::int64_t>::max();
    };
    if (!pick || order(*w) < order(*pick)) pick = w;
  }
  if (!pick) return false;
  wake(*pick);
  return true;
}

void wake_hub::wake(wake_waiter& w) {
  w.rung.store(true);
  cancel_access::poke(w.slot);
  woken_.fetch_add(1);
  if (events_ && !is_broadcast(w.name)) {  // (listener::woken() is for waiting acquires)
    try {
      events_->woken(w.name);
    } catch (...) {
    }
  }
}

bool wake_hub::duplicate(std::uint64_t hash, std::int64_t fence) {
  if (fence <= 0) return false;
  if (last_rung_.size() > 4096) last_rung_.clear();
  auto& seen = last_rung_[hash];
  if (seen >= fence) return true;
  seen = fence;
  return false;
}

void wake_hub::released(const std::string& name, std::int64_t fence, const std::string& head,
                        const std::string& head_bell) {
  const std::uint64_t h = name_hash(name);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!duplicate(h, fence)) wake_one(h, name, head);
  }
  if (!target_.empty()) dia_.bell.ring(target_, name, fence, head, head_bell);
}

bool wake_hub::granted(const std::string& name, std::int64_t ticket, std::int64_t fence) {
  std::lock_guard<std::mutex> l(mu_);
  return grant_one(name_hash(name), name, ticket, fence);
}

bool wake_hub::grant_one(std::uint64_t hash, const std::string& name, std::int64_t ticket,
                         std::int64_t fence) {
  for (const auto& w : waiters_) {
    if (w->name_hash != hash || (!name.empty() && w->name != name) || w->ticket != ticket) continue;
    w->granted_fence.store(fence);
    wake(*w);
    return true;
  }
  // No such waiter yet: a release can hand the lease to an entry whose waiter has not had the
  // reply of its enqueue (its ticket) yet. Kept for set_ticket(); a waiter that is gone leaves
  // its grant here until the map is cleared (it only bounds the map).
  if (early_grants_.size() >= 1024) early_grants_.clear();
  early_grants_[ticket] = {hash, fence};
  return false;
}

void wake_hub::handed_to(const std::string& name, std::int64_t fence, std::int64_t ticket,
                         std::int64_t handle, const std::string& bell) {
  if (bell.empty()) {
    if (is_own_bell(handle))
      granted(name, ticket, fence);
    else
      ring_handle(name, fence, handle, ticket);
    return;
  }
  // channel_ is set once, before channel_opened_, and reset only by the destructor.
  if (channel_opened_.load() && channel_ && channel_->address() == bell) {
    granted(name, ticket, fence);
    return;
  }
  if (!target_.empty()) dia_.bell.ring(target_, name, fence, granted_head(ticket), bell);
}

void wake_hub::deliver(const ring_event& ev) {
  const std::uint64_t h = ev.name.empty() ? ev.hash : name_hash(ev.name);
  std::lock_guard<std::mutex> l(mu_);
  if (ev.granted_ticket > 0) {  // a lease handed over: that waiter alone, whatever came before
    grant_one(h, ev.name, ev.granted_ticket, ev.fence);
    return;
  }
  // The same release rung twice (by this process at once, then by the database): once is enough,
  // unless it names the head of the queue, which the local ring could not know.
  const bool seen = duplicate(h, ev.fence);
  if (seen && ev.head.empty()) return;
  wake_one(h, ev.name, ev.head);
}

void wake_hub::wake_all() {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& w : waiters_) {
    w->relook.store(true);  // woken to look (the lease may well be held), not by a release
    w->rung.store(true);
    cancel_access::poke(w->slot);
  }
}

}  // namespace dblock::detail
