#include "base/service_thread.h"

#include <stdexcept>

namespace ddprun::base {

ServiceThread::~ServiceThread() { stop(); }

void ServiceThread::start(std::function<void()> body, std::function<void()> interrupt) {
  if (thread_.joinable()) throw std::logic_error("ServiceThread::start: already started");
  interrupt_ = std::move(interrupt);
  thread_ = std::thread(std::move(body));
}

void ServiceThread::hand_over(const std::function<void()>& change) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    change();
  }
  wake_.notify_all();
}

bool ServiceThread::wait_until(TimePoint deadline, const std::function<bool()>& ready,
                               const std::function<void()>& take) {
  std::unique_lock<std::mutex> lock(mu_);
  wake_.wait_until(lock, deadline, [&] { return stopping_ || ready(); });
  if (stopping_) return false;
  take();
  return true;
}

void ServiceThread::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (!thread_.joinable()) return;
  if (interrupt_) interrupt_();
  thread_.join();
}

}  // namespace ddprun::base
