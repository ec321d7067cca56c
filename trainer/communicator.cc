#include "trainer/communicator.h"

#include <ATen/ATen.h>

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

}  // namespace

std::unique_ptr<CollectiveHandle> Communicator::allreduce_mean_async(at::Tensor& tensor) {
  return std::make_unique<ScaleAfterHandle>(allreduce_async(tensor), tensor,
                                            1.0 / world_size());
}

}  // namespace ddprun::trainer
