#include "trainer/model.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "trainer/error.h"
#include "trainer/idx_reader.h"

namespace ddprun::trainer {
namespace {

// nn.Linear's and nn.Conv2d's default: kaiming_uniform(a=sqrt(5)) for the
// weight is uniform in +-1/sqrt(fan_in), as is the bias.
std::pair<at::Tensor, at::Tensor> layer_params(at::IntArrayRef weight_shape) {
  int64_t fan_in = 1;
  for (size_t i = 1; i < weight_shape.size(); ++i) fan_in *= weight_shape[i];
  const double bound = 1.0 / std::sqrt(double(fan_in));
  at::Tensor w = at::empty(weight_shape, at::kFloat).uniform_(-bound, bound);
  at::Tensor b = at::empty({weight_shape[0]}, at::kFloat).uniform_(-bound, bound);
  w.requires_grad_(true);
  b.requires_grad_(true);
  return {w, b};
}

}  // namespace

Mlp::Mlp(int64_t inputs, int64_t hidden, int64_t classes) {
  at::NoGradGuard no_grad;
  for (auto [in, out] : {std::pair{inputs, hidden}, std::pair{hidden, hidden},
                         std::pair{hidden, classes}}) {
    auto [w, b] = layer_params({out, in});
    params_.push_back(w);
    params_.push_back(b);
  }
}

Cnn::Cnn(int64_t hidden, int64_t classes) {
  at::NoGradGuard no_grad;
  for (std::vector<int64_t> shape : {std::vector<int64_t>{16, 1, 5, 5}, {32, 16, 5, 5},
                                     {hidden, 32 * 7 * 7}, {classes, hidden}}) {
    auto [w, b] = layer_params(shape);
    params_.push_back(w);
    params_.push_back(b);
  }
}

at::Tensor Cnn::forward(const at::Tensor& x) const {
  at::Tensor h = x.view({x.size(0), 1, 28, 28});
  h = at::max_pool2d(at::relu(at::conv2d(h, params_[0], params_[1], 1, 2)), 2);
  h = at::max_pool2d(at::relu(at::conv2d(h, params_[2], params_[3], 1, 2)), 2);
  h = at::relu(at::linear(h.flatten(1), params_[4], params_[5]));
  return at::linear(h, params_[6], params_[7]);
}

std::unique_ptr<Model> make_model(const std::string& name, int64_t hidden, int64_t classes) {
  if (name == "mlp") return std::make_unique<Mlp>(784, hidden, classes);
  if (name == "cnn") return std::make_unique<Cnn>(hidden, classes);
  throw TrainerError("--model " + name + ": expected mlp or cnn");
}

void Model::to(const at::Device& device) {
  for (at::Tensor& p : params_) p = p.detach().to(device).requires_grad_(true);
}

at::Tensor Mlp::forward(const at::Tensor& x) const {
  at::Tensor h = at::relu(at::linear(x, params_[0], params_[1]));
  h = at::relu(at::linear(h, params_[2], params_[3]));
  return at::linear(h, params_[4], params_[5]);
}

at::Tensor Model::loss(const at::Tensor& x, const at::Tensor& y) const {
  return at::nll_loss(at::log_softmax(forward(x), 1), y);
}

double Model::accuracy(const at::Tensor& x, const at::Tensor& y) const {
  at::NoGradGuard no_grad;
  // In chunks: the CNN's activations of all of MNIST's test set would be GBs.
  constexpr int64_t kChunk = 1024;
  int64_t correct = 0;
  for (int64_t i = 0; i < x.size(0); i += kChunk) {
    const int64_t n = std::min(kChunk, x.size(0) - i);
    correct += forward(x.narrow(0, i, n)).argmax(1).eq(y.narrow(0, i, n)).sum().item<int64_t>();
  }
  return x.size(0) > 0 ? double(correct) / double(x.size(0)) : 0.0;
}

Dataset load_idx_dataset(const std::string& dir, const std::string& prefix) {
  IdxSplit split = load_idx_split(dir, prefix);
  const int64_t n = split.images.count;
  const int64_t features = split.images.rows * split.images.cols;
  at::Tensor raw = at::from_blob(split.images.pixels.data(), {n, features}, at::kByte);
  at::Tensor labels = at::from_blob(split.labels.labels.data(), {n}, at::kByte);
  // Same arithmetic as the reference (x / 255.0 in float64, then float32).
  return Dataset{raw.to(at::kDouble).div_(255.0).to(at::kFloat), labels.to(at::kLong)};
}

Dataset synthetic_dataset(int64_t n, int64_t features, int64_t classes, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return Dataset{at::randn({n, features}, gen, at::kFloat),
                 at::randint(0, classes, {n}, gen, at::kLong)};
}

}  // namespace ddprun::trainer
