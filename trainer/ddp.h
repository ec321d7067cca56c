// Data parallelism as PyTorch's DDP does it, for any list of parameters.
//
// - broadcast_parameters(): rank 0's values overwrite every rank's.
// - Gradients are grouped in buckets of about `bucket_bytes`, filled in
//   reverse parameter order (the order backward produces them). An autograd
//   hook on each parameter copies its gradient into the bucket's flat buffer;
//   when a bucket's last gradient arrives its all-reduce starts at once, so
//   communication overlaps the rest of backward.
// - finish_backward() waits for every bucket's averaging all-reduce
//   (Communicator::allreduce_mean_async: the sum over ranks divided by the
//   world size) and leaves the averaged gradient of parameter i in averaged_grad(i) (a view
//   into the bucket). The optimizer steps only after that.
//
// A parameter that received no gradient in a step contributes zeros (its
// bucket is launched by finish_backward), so ranks never wait on each other
// forever. Not thread-safe: one DDP object per training loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "trainer/communicator.h"

namespace ddprun::trainer {

struct DdpOptions {
  // Target bucket size in bytes (--bucket-mb * 2^20); a parameter larger
  // than this gets a bucket of its own.
  int64_t bucket_bytes = 25LL << 20;
  // Register autograd hooks. Off = gradients are read from param.grad() in
  // finish_backward and reduced there, bucket by bucket (used by tests to
  // compare with the overlapped path).
  bool overlap = true;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::vector<at::Tensor> params, Communicator& comm,
                          DdpOptions options);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  void broadcast_parameters(int root = 0);

  // Call before each backward: resets bucket bookkeeping.
  void begin_backward();
  // Call after backward: all buckets reduced and averaged.
  void finish_backward();

  const at::Tensor& averaged_grad(size_t i) const { return grad_views_[i]; }
  size_t num_buckets() const { return buckets_.size(); }
  const std::vector<at::Tensor>& parameters() const { return params_; }

  // Debug check (--check-params): true when every rank holds bit-identical
  // parameters (compares an all-reduced sum and max of a per-rank checksum).
  bool parameters_identical();

  // Rank scope, after a collective was abandoned: removes the autograd
  // hooks (a successor DDP registers its own on the same parameters) and
  // drops the handles without waiting for them. The buckets may still be
  // written by the abandoned communicator's threads, so the caller keeps
  // this object alive instead of destroying it (trainer.cc leaks it).
  void abandon();

  // Fault injection (--kill-at-step): called right after a bucket's
  // all-reduce was launched, with the bucket's index.
  void set_launch_observer(std::function<void(size_t bucket)> observer) {
    launch_observer_ = std::move(observer);
  }

 private:
  struct Bucket {
    at::Tensor flat;                 // concatenated gradients
    std::vector<size_t> params;      // parameter indices in this bucket
    int pending = 0;                 // gradients still missing this step
    bool launched = false;           // all-reduce started this step (none for 1 rank)
    std::unique_ptr<CollectiveHandle> handle;
  };

  void on_grad(size_t param, const at::Tensor& grad);
  void launch(Bucket& bucket);

  std::vector<at::Tensor> params_;
  Communicator& comm_;
  DdpOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;     // param index -> bucket index
  std::vector<at::Tensor> grad_views_;
  std::vector<char> ready_;           // param got its gradient this step
  std::vector<unsigned> hooks_;       // register_hook's handles, for abandon()
  bool abandoned_ = false;
  std::function<void(size_t)> launch_observer_;
};

}  // namespace ddprun::trainer
