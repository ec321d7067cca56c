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
    MutexLock lock(mu_);
    change();
  }
  wake_.notify_all();
}

bool ServiceThread::wait_until(TimePoint deadline, const std::function<bool()>& ready,
                               const std::function<void()>& take) {
  MutexLock lock(mu_);
  while (!stopping_ && !ready()) {
    if (!wake_.wait_until(mu_, deadline)) break;  // the poll's deadline: take() runs all the same
  }
  if (stopping_) return false;
  take();
  return true;
}

void ServiceThread::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (!thread_.joinable()) return;
  if (interrupt_) interrupt_();
  thread_.join();
}

}  // namespace ddprun::base
