#include "trainer/ddp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "trainer/error.h"

namespace ddprun::trainer {

DistributedDataParallel::DistributedDataParallel(std::vector<at::Tensor> params,
                                                 Communicator& comm, DdpOptions options)
    : params_(std::move(params)), comm_(comm), options_(options) {
  if (options_.bucket_bytes <= 0) throw TrainerError("--bucket-mb must be positive");
  const size_t n = params_.size();
  bucket_of_.assign(n, 0);
  grad_views_.resize(n);
  ready_.assign(n, 0);

  // Reverse order: backward produces the last layer's gradients first.
  std::vector<std::vector<size_t>> groups;
  int64_t group_bytes = 0;
  for (size_t k = n; k-- > 0;) {
    const at::Tensor& p = params_[k];
    if (p.scalar_type() != params_[0].scalar_type() || p.device() != params_[0].device()) {
      throw TrainerError("DDP: every parameter must share one dtype and device");
    }
    const int64_t bytes = p.numel() * int64_t(p.element_size());
    if (groups.empty() || (group_bytes > 0 && group_bytes + bytes > options_.bucket_bytes)) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(k);
    group_bytes += bytes;
  }
  buckets_.resize(groups.size());
  for (size_t b = 0; b < groups.size(); ++b) {
    int64_t numel = 0;
    for (size_t k : groups[b]) numel += params_[k].numel();
    buckets_[b].flat = at::zeros({numel}, params_[0].options().requires_grad(false));
    buckets_[b].params = groups[b];
    int64_t offset = 0;
    for (size_t k : groups[b]) {
      const int64_t m = params_[k].numel();
      grad_views_[k] = buckets_[b].flat.narrow(0, offset, m).view(params_[k].sizes());
      bucket_of_[k] = b;
      offset += m;
    }
  }
  if (options_.overlap) {
    for (size_t k = 0; k < n; ++k) {
      hooks_.push_back(
          params_[k].register_hook([this, k](const at::Tensor& grad) { on_grad(k, grad); }));
    }
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  // A collective still in flight writes into our buffers: finish it first.
  if (abandoned_) return;  // nothing left to wait for (abandon())
  for (Bucket& b : buckets_) {
    if (b.handle) {
      try {
        b.handle->wait();
      } catch (...) {
        // Already failing (peer gone); nothing more to do with the result.
      }
    }
  }
}

void DistributedDataParallel::broadcast_parameters(int root) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : params_) {
    at::Tensor data = p.detach();
    comm_.broadcast(data, root);
  }
}

void DistributedDataParallel::begin_backward() {
  for (Bucket& b : buckets_) {
    b.pending = int(b.params.size());
    b.launched = false;
    b.handle.reset();
  }
  std::fill(ready_.begin(), ready_.end(), 0);
}

void DistributedDataParallel::abandon() {
  abandoned_ = true;
  for (size_t k = 0; k < hooks_.size(); ++k) params_[k].remove_hook(hooks_[k]);
  hooks_.clear();
  // The backend holds its own references to the work and its tensors.
  for (Bucket& b : buckets_) b.handle.reset();
}

void DistributedDataParallel::on_grad(size_t k, const at::Tensor& grad) {
  if (abandoned_) return;
  if (ready_[k]) {
    throw TrainerError("DDP: parameter " + std::to_string(k) +
                       " got two gradients in one backward (reused parameter)");
  }
  grad_views_[k].copy_(grad);
  ready_[k] = 1;
  Bucket& b = buckets_[bucket_of_[k]];
  if (--b.pending == 0) launch(b);
}

void DistributedDataParallel::launch(Bucket& bucket) {
  bucket.launched = true;
  // One rank: the local gradient is the average, nothing to exchange.
  if (comm_.world_size() > 1) bucket.handle = comm_.allreduce_mean_async(bucket.flat);
  if (launch_observer_) launch_observer_(size_t(&bucket - buckets_.data()));
}

void DistributedDataParallel::finish_backward() {
  at::NoGradGuard no_grad;
  if (!options_.overlap) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const at::Tensor& g = params_[k].grad();
      if (g.defined()) {
        grad_views_[k].copy_(g);
        ready_[k] = 1;
      }
    }
  }
  // Buckets not yet launched (a parameter without gradient, or no hooks):
  // zero the holes and launch them now, in bucket order on every rank.
  for (Bucket& b : buckets_) {
    if (b.launched) continue;
    for (size_t k : b.params) {
      if (!ready_[k]) grad_views_[k].zero_();
    }
    launch(b);
  }
  for (Bucket& b : buckets_) {
    if (b.handle) b.handle->wait();  // averaged (the backend may scale as it sums)
    b.handle.reset();
  }
}

bool DistributedDataParallel::parameters_identical() {
  at::NoGradGuard no_grad;
  // Per-rank checksum in float64: sum and sum of squares of every parameter,
  // plus a position-weighted sum so swapped values are caught too.
  at::Tensor local = at::zeros({3}, at::kDouble);
  double* l = local.data_ptr<double>();
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor d = params_[k].detach().to(at::kDouble).flatten();
    l[0] += d.sum().item<double>();
    l[1] += (d * d).sum().item<double>();
    l[2] += (d * at::arange(1, d.numel() + 1, d.options())).sum().item<double>() * (k + 1);
  }
  at::Tensor root = local.clone();
  comm_.broadcast(root, 0);
  // Agree on the verdict so every rank reports the same.
  at::Tensor mismatches = at::zeros({1}, at::kDouble);
  const double* r = root.data_ptr<double>();
  bool same = true;
  for (int i = 0; i < 3; ++i) same = same && r[i] == l[i];
  mismatches.data_ptr<double>()[0] = same ? 0.0 : 1.0;
  comm_.allreduce(mismatches);
  return mismatches.data_ptr<double>()[0] == 0.0;
}

}  // namespace ddprun::trainer
