#include "trainer/communicator.h"

#include <ATen/ATen.h>

#include <exception>

#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

// Sum first, then scale in place once the sum is there.
class ScaleAfterHandle : public CollectiveHandle {
 public:
  ScaleAfterHandle(std::unique_ptr<CollectiveHandle> sum, at::Tensor tensor, double scale)
      : sum_(std::move(sum)), tensor_(std::move(tensor)), scale_(scale) {}
  void wait() override {
    if (sum_ == nullptr) return;  // already waited
    sum_->wait();
    sum_.reset();
    if (scale_ != 1.0) tensor_.mul_(scale_);
  }

 private:
  std::unique_ptr<CollectiveHandle> sum_;
  at::Tensor tensor_;
  double scale_;
};

// Runs f; anything it throws leaves as a CollectiveError (one already
// classified, CollectiveAborted included, as it was).
template <typename F>
auto classified(const char* what, const std::string& backend, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(backend + " " + what + " failed: " + e.what());
  }
}

class ClassifiedHandle : public CollectiveHandle {
 public:
  ClassifiedHandle(std::unique_ptr<CollectiveHandle> inner, std::string backend)
      : inner_(std::move(inner)), backend_(std::move(backend)) {}
  void wait() override { classified("all-reduce", backend_, [&] { inner_->wait(); }); }

 private:
  std::unique_ptr<CollectiveHandle> inner_;
  std::string backend_;
};

class ClassifyingCommunicator : public Communicator {
 public:
  explicit ClassifyingCommunicator(std::unique_ptr<Communicator> inner)
      : inner_(std::move(inner)), backend_(inner_->backend()) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return backend_; }

  std::unique_ptr<CollectiveHandle> allreduce_async(at::Tensor& tensor) override {
    return wrap(classified("all-reduce", backend_, [&] { return inner_->allreduce_async(tensor); }));
  }
  std::unique_ptr<CollectiveHandle> allreduce_mean_async(at::Tensor& tensor) override {
    return wrap(
        classified("all-reduce", backend_, [&] { return inner_->allreduce_mean_async(tensor); }));
  }
  void broadcast(at::Tensor& tensor, int root) override {
    classified("broadcast", backend_, [&] { inner_->broadcast(tensor, root); });
  }
  void barrier() override {
    classified("barrier", backend_, [&] { inner_->barrier(); });
  }

 private:
  std::unique_ptr<CollectiveHandle> wrap(std::unique_ptr<CollectiveHandle> h) const {
    return std::make_unique<ClassifiedHandle>(std::move(h), backend_);
  }

  std::unique_ptr<Communicator> inner_;
  std::string backend_;
};

}  // namespace

std::unique_ptr<Communicator> classify_failures(std::unique_ptr<Communicator> inner) {
  return std::make_unique<ClassifyingCommunicator>(std::move(inner));
}

std::unique_ptr<CollectiveHandle> Communicator::allreduce_mean_async(at::Tensor& tensor) {
  return std::make_unique<ScaleAfterHandle>(allreduce_async(tensor), tensor,
                                            1.0 / world_size());
}

}  // namespace ddprun::trainer
