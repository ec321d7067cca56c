#include "trainer/model.h"

#include <cmath>

#include <ATen/ATen.h>

#include "trainer/idx_reader.h"

namespace ddprun::trainer {
namespace {

std::pair<at::Tensor, at::Tensor> linear_params(int64_t in, int64_t out) {
  const double bound = 1.0 / std::sqrt(double(in));
  at::Tensor w = at::empty({out, in}, at::kFloat).uniform_(-bound, bound);
  at::Tensor b = at::empty({out}, at::kFloat).uniform_(-bound, bound);
  w.requires_grad_(true);
  b.requires_grad_(true);
  return {w, b};
}

}  // namespace

Mlp::Mlp(int64_t inputs, int64_t hidden, int64_t classes) {
  at::NoGradGuard no_grad;
  for (auto [in, out] : {std::pair{inputs, hidden}, std::pair{hidden, hidden},
                         std::pair{hidden, classes}}) {
    auto [w, b] = linear_params(in, out);
    params_.push_back(w);
    params_.push_back(b);
  }
}

void Mlp::to(const at::Device& device) {
  for (at::Tensor& p : params_) p = p.detach().to(device).requires_grad_(true);
}

std::vector<std::string> Mlp::parameter_names() {
  return {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
}

at::Tensor Mlp::forward(const at::Tensor& x) const {
  at::Tensor h = at::relu(at::linear(x, params_[0], params_[1]));
  h = at::relu(at::linear(h, params_[2], params_[3]));
  return at::linear(h, params_[4], params_[5]);
}

at::Tensor Mlp::loss(const at::Tensor& x, const at::Tensor& y) const {
  return at::nll_loss(at::log_softmax(forward(x), 1), y);
}

double Mlp::accuracy(const at::Tensor& x, const at::Tensor& y) const {
  at::NoGradGuard no_grad;
  return forward(x).argmax(1).eq(y).to(at::kDouble).mean().item<double>();
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
