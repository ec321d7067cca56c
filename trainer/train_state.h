// Training state <-> checkpoint blobs.
//
// The state a bit-exact resume needs: parameters, SGD momentum buffers, the
// default CPU generator's state, the step and the sampler position. Tensors
// are stored raw (contiguous, native byte order) so a restored run computes
// with exactly the bits the interrupted one had.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "trainer/checkpoint.h"

namespace ddprun::trainer {

struct TrainState {
  std::vector<at::Tensor> params;    // model parameters, in order
  std::vector<at::Tensor> momentum;  // one per parameter, or empty
};

// Appends "param.<i>", "momentum.<i>" and "rng.cpu" blobs to ckpt.
void save_state(const TrainState& state, Checkpoint* ckpt);

// Copies the blobs back into the (already shaped) tensors and restores the
// generator. Throws TrainerError naming the blob on any shape/size mismatch.
void load_state(const Checkpoint& ckpt, const std::string& source, TrainState* state);

// Raw float32 bytes of every tensor back to back (for --save-params).
std::vector<uint8_t> tensor_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace ddprun::trainer
