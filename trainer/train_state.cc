#include "trainer/train_state.h"

#include <cstring>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

Blob to_blob(const std::string& name, const at::Tensor& t) {
  at::Tensor c = t.detach().contiguous();
  Blob b;
  b.name = name;
  b.dtype = std::string(c10::toString(c.scalar_type()));
  b.shape = c.sizes().vec();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  b.bytes.assign(p, p + c.numel() * c.element_size());
  return b;
}

void from_blob(const Checkpoint& ckpt, const std::string& source, const std::string& name,
               at::Tensor& t) {
  const Blob* b = ckpt.find(name);
  if (b == nullptr) throw TrainerError(source + ": checkpoint has no " + name);
  const size_t want = size_t(t.numel()) * t.element_size();
  if (b->shape != t.sizes().vec() || b->bytes.size() != want ||
      b->dtype != c10::toString(t.scalar_type())) {
    throw TrainerError(source + ": " + name + " has shape/type unlike this model (" +
                       std::to_string(b->bytes.size()) + " bytes, model wants " +
                       std::to_string(want) + "); same --hidden as the saved run?");
  }
  at::NoGradGuard no_grad;
  at::Tensor src = at::from_blob(const_cast<uint8_t*>(b->bytes.data()), t.sizes(),
                                 t.options().requires_grad(false));
  t.detach().copy_(src);
}

}  // namespace

void save_state(const TrainState& state, Checkpoint* ckpt) {
  for (size_t i = 0; i < state.params.size(); ++i) {
    ckpt->blobs.push_back(to_blob("param." + std::to_string(i), state.params[i]));
  }
  for (size_t i = 0; i < state.momentum.size(); ++i) {
    ckpt->blobs.push_back(to_blob("momentum." + std::to_string(i), state.momentum[i]));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  ckpt->blobs.push_back(to_blob("rng.cpu", rng));
}

void load_state(const Checkpoint& ckpt, const std::string& source, TrainState* state) {
  for (size_t i = 0; i < state->params.size(); ++i) {
    from_blob(ckpt, source, "param." + std::to_string(i), state->params[i]);
  }
  for (size_t i = 0; i < state->momentum.size(); ++i) {
    from_blob(ckpt, source, "momentum." + std::to_string(i), state->momentum[i]);
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor rng = gen.get_state();
  from_blob(ckpt, source, "rng.cpu", rng);
  gen.set_state(rng);
}

std::vector<uint8_t> tensor_bytes(const std::vector<at::Tensor>& tensors) {
  std::vector<uint8_t> out;
  for (const at::Tensor& t : tensors) {
    at::Tensor c = t.detach().to(at::kFloat).contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    out.insert(out.end(), p, p + c.numel() * sizeof(float));
  }
  return out;
}

}  // namespace ddprun::trainer
