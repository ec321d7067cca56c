// The collective operations data parallelism needs, behind one interface.
//
// Two backends: Gloo through LibTorch's c10d::ProcessGroupGloo (CPU
// tensors, gloo_communicator.h) and NCCL called directly (CUDA tensors,
// nccl_communicator.h, built only with a CUDA LibTorch). allreduce_async
// returns at once so gradient buckets reduce while backward goes on; a
// handle's wait() blocks until the tensor holds the sum. Calls are issued
// from one thread, in the same order on every rank (as with c10d).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace ddprun::trainer {

class CollectiveHandle {
 public:
  virtual ~CollectiveHandle() = default;
  // Blocks until the collective finished; throws when it failed or the
  // communicator's timeout passed.
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;

  // Sums `tensor` over all ranks, in place. The tensor must stay alive and
  // untouched until the handle's wait() returns.
  virtual std::unique_ptr<CollectiveHandle> allreduce_async(at::Tensor& tensor) = 0;
  // Overwrites `tensor` on every rank with root's.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;

  // Averages `tensor` over all ranks, in place: the sum times 1/world_size
  // (as float32 for float32 tensors, the bits of sum-then-mul_). By default
  // wait() multiplies after the sum; a backend may scale while it sums.
  virtual std::unique_ptr<CollectiveHandle> allreduce_mean_async(at::Tensor& tensor);

  void allreduce(at::Tensor& tensor) { allreduce_async(tensor)->wait(); }
};

// `inner` with every failure of its collectives (a launch, a wait, a
// broadcast, a barrier) thrown as CollectiveError, whatever the backend
// threw (gloo's IoException, c10::Error, a timeout): what lets the training
// loop tell a broken group from an error of its own.
std::unique_ptr<Communicator> classify_failures(std::unique_ptr<Communicator> inner);

}  // namespace ddprun::trainer
