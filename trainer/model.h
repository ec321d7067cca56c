// The models and data of the `train` program, as plain ATen tensors.
//
// Mlp is 784-hidden-hidden-10 with ReLU. Cnn takes the 784 pixels as a
// 1x28x28 image: conv 1->16 5x5 pad 2, ReLU, max-pool 2, conv 16->32 5x5
// pad 2, ReLU, max-pool 2, linear 1568-hidden, ReLU, linear hidden-10 (the
// reference script's --model cnn), so GPU runs do real compute. Both are
// initialised as torch.nn.Linear/Conv2d are (uniform in +-1/sqrt(fan_in) for
// weight and bias, from the default generator) and built on ATen ops with
// autograd rather than torch::nn so that the trainer compiles fast;
// DistributedDataParallel takes any parameter list.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace ddprun::trainer {

class Model {
 public:
  virtual ~Model() = default;

  // Logits, [batch, classes], of rows of 784 pixels.
  virtual at::Tensor forward(const at::Tensor& x) const = 0;
  // Mean cross-entropy of forward(x) against labels y (int64).
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const;
  // Fraction of rows whose argmax equals y, without autograd.
  double accuracy(const at::Tensor& x, const at::Tensor& y) const;

  // Moves the parameters to `device` (as new leaf tensors).
  void to(const at::Device& device);

  // Weight, bias of each layer in order (as nn.Sequential lists them).
  const std::vector<at::Tensor>& parameters() const { return params_; }

 protected:
  std::vector<at::Tensor> params_;
};

class Mlp : public Model {
 public:
  Mlp(int64_t inputs, int64_t hidden, int64_t classes);
  at::Tensor forward(const at::Tensor& x) const override;
};

class Cnn : public Model {
 public:
  Cnn(int64_t hidden, int64_t classes);  // inputs: 784 = 1x28x28
  at::Tensor forward(const at::Tensor& x) const override;
};

// "mlp" or "cnn"; throws TrainerError naming anything else.
std::unique_ptr<Model> make_model(const std::string& name, int64_t hidden, int64_t classes);

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
