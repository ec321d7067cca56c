#include "trainer/resume.h"

#include <unistd.h>

#include <cstring>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "trainer/error.h"
#include "trainer/log.h"

namespace ddprun::trainer {
namespace {

// Broadcast a host tensor through a communicator that may want device memory.
void broadcast_host(Communicator& comm, at::Tensor& host, const at::Device& device, int root = 0) {
  if (device.is_cpu()) {
    comm.broadcast(host, root);
    return;
  }
  at::Tensor d = host.to(device);
  comm.broadcast(d, root);
  host.copy_(d.cpu());
}

void allreduce_host(Communicator& comm, at::Tensor& host, const at::Device& device) {
  if (device.is_cpu()) {
    comm.allreduce(host);
    return;
  }
  at::Tensor d = host.to(device);
  comm.allreduce(d);
  host.copy_(d.cpu());
}

void broadcast_generator(Communicator& comm, const at::Device& device, int root) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  broadcast_host(comm, rng, device, root);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

int64_t double_bits(double x) {
  int64_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

double bits_double(int64_t bits) {
  double x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace

Resume resume_from_checkpoint(const TrainOptions& o, const WorkerInfo& w, Communicator& comm,
                              CheckpointDir& dir, TrainState& state, const at::Device& device) {
  // meta: status (0 none, 1 resumed, 2 failed), step, position, loss bits.
  at::Tensor meta = at::zeros({4}, at::kLong);
  std::string error;
  if (w.rank == 0) {
    // One run per folder: a second one would adopt this one's state and
    // tear its checkpoints. Refused on every rank, naming the holder.
    try {
      lock_checkpoint_dir(dir);
    } catch (const std::exception& e) {
      error = e.what();
      meta[0] = 2;
    }
  }
  if (w.rank == 0 && o.resume && meta[0].item<int64_t>() == 0) {
    try {
      if (std::optional<Checkpoint> ckpt = dir.load_newest()) {
        load_state(*ckpt, dir.manifest_path(ckpt->step), &state);
        meta[0] = 1;
        meta[1] = ckpt->step;
        meta[2] = ckpt->samples_consumed;
        int64_t bits = 0;
        std::memcpy(&bits, &ckpt->loss, sizeof bits);
        meta[3] = bits;
        log_info("resuming from %s (step %lld, %lld samples consumed, written by %d ranks)",
                 dir.manifest_path(ckpt->step).c_str(), (long long)ckpt->step,
                 (long long)ckpt->samples_consumed, ckpt->world_size);
      }
    } catch (const std::exception& e) {
      error = e.what();
      meta[0] = 2;
    }
  }
  broadcast_host(comm, meta, device);
  const int64_t status = meta[0].item<int64_t>();
  if (status == 2) {
    throw TrainerError(w.rank == 0 ? error : "rank 0 could not load its checkpoint");
  }
  if (status == 0) return {};
  // Rank 0's generator state reaches everyone (parameters follow below).
  broadcast_generator(comm, device, 0);
  for (at::Tensor& m : state.momentum) comm.broadcast(m, 0);
  Resume r{meta[1].item<int64_t>(), meta[2].item<int64_t>()};
  r.loss = bits_double(meta[3].item<int64_t>());
  return r;
}

void lock_checkpoint_dir(CheckpointDir& dir) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  dir.lock(std::string(host) + " pid " + std::to_string(::getpid()));
  for (const std::string& path : dir.remove_leftovers()) {
    log_warn("removed %s, left by a checkpoint write that did not finish", path.c_str());
  }
}

PeerResume resume_from_peer(Communicator& comm, TrainState& state, const at::Device& device,
                            int64_t committed, const Resume& mine) {
  // The all-reduce (max) of the committed steps, as a sum of one-hot
  // vectors: every rank learns every rank's count, so all pick the same
  // source, the lowest rank holding the most. Slot r holds rank r's steps
  // plus one (0: nothing, a replacement).
  const int world = comm.world_size();
  at::Tensor held = at::zeros({world}, at::kLong);
  held.data_ptr<int64_t>()[comm.rank()] = committed + 1;
  allreduce_host(comm, held, device);
  PeerResume out;
  int64_t best = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t v = held.data_ptr<int64_t>()[r];
    if (v > best) {
      best = v;
      out.source = r;
    }
  }
  if (out.source < 0) {
    throw TrainerError("rank-scoped recovery: no rank of the new generation holds the training "
                       "state (every rank is a replacement)");
  }
  at::Tensor meta = at::zeros({3}, at::kLong);  // step, position, loss bits
  if (comm.rank() == out.source) {
    int64_t* m = meta.data_ptr<int64_t>();
    m[0] = committed;
    m[1] = mine.position;
    m[2] = double_bits(mine.loss);
  }
  broadcast_host(comm, meta, device, out.source);
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : state.params) {
      at::Tensor data = p.detach();
      comm.broadcast(data, out.source);
    }
    for (at::Tensor& m : state.momentum) comm.broadcast(m, out.source);
  }
  broadcast_generator(comm, device, out.source);
  out.resume.step = meta[0].item<int64_t>();
  out.resume.position = meta[1].item<int64_t>();
  out.resume.loss = bits_double(meta[2].item<int64_t>());
  return out;
}

void write_checkpoint(CheckpointDir& dir, const TrainOptions& o, const WorkerInfo& w,
                      const TrainState& state, int64_t step, int64_t position, double loss) {
  Checkpoint ckpt;
  ckpt.step = step;
  ckpt.samples_consumed = position;
  ckpt.world_size = w.world_size;
  ckpt.seed = o.seed;
  ckpt.loss = loss;
  save_state(state, &ckpt);
  try {
    const std::string path = dir.write(ckpt);
    log_info("checkpoint %s (step %lld)", path.c_str(), (long long)step);
  } catch (const CheckpointNoSpace& e) {
    log_error("checkpoint of step %lld not written, training goes on from the older ones: %s",
              (long long)step, e.what());
  }
}

}  // namespace ddprun::trainer
