// The model and data of the `train` program, as plain ATen tensors.
//
// Mlp is 784-hidden-hidden-10 with ReLU, initialised as torch.nn.Linear is
// (uniform in +-1/sqrt(fan_in) for weight and bias, from the default
// generator), built on ATen ops with autograd rather than torch::nn so that
// the trainer compiles fast; DistributedDataParallel takes any parameter
// list, so a torch::nn::Module's parameters() work the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace ddprun::trainer {

class Mlp {
 public:
  Mlp(int64_t inputs, int64_t hidden, int64_t classes);

  // Logits, [batch, classes].
  at::Tensor forward(const at::Tensor& x) const;
  // Mean cross-entropy of forward(x) against labels y (int64).
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const;
  // Fraction of rows whose argmax equals y, without autograd.
  double accuracy(const at::Tensor& x, const at::Tensor& y) const;

  // Moves the parameters to `device` (as new leaf tensors).
  void to(const at::Device& device);

  // Order: w1, b1, w2, b2, w3, b3 (as nn.Sequential lists them).
  const std::vector<at::Tensor>& parameters() const { return params_; }
  static std::vector<std::string> parameter_names();

 private:
  std::vector<at::Tensor> params_;
};

// A data set in memory: x float32 [n, features] scaled to [0, 1], y int64 [n].
struct Dataset {
  at::Tensor x;
  at::Tensor y;
  int64_t size() const { return x.size(0); }
};

// "<dir>/<prefix>-images-idx3-ubyte" + labels (prefix "train" or "t10k").
Dataset load_idx_dataset(const std::string& dir, const std::string& prefix);
// Random inputs and labels (like the reference's --synthetic), from `seed`.
Dataset synthetic_dataset(int64_t n, int64_t features, int64_t classes, uint64_t seed);

}  // namespace ddprun::trainer
