#include "trainer/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>

#include "trainer/blas_setup.h"
#include "trainer/checkpoint.h"
#include "trainer/ddp.h"
#include "trainer/error.h"
#include "trainer/gloo_communicator.h"
#include "trainer/log.h"
#include "trainer/model.h"
#include "trainer/nccl_communicator.h"
#include "trainer/sampler.h"
#include "trainer/shm_communicator.h"
#include "trainer/train_state.h"
#include "watchdog/heartbeat.h"

namespace ddprun::trainer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kFeatures = 784;
constexpr int64_t kClasses = 10;
constexpr int64_t kWarmupSteps = 10;  // left out of samples/s, as the reference does

std::unique_ptr<Communicator> make_communicator(const TrainOptions& o, const WorkerInfo& w,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                at::Device* device) {
  Backend backend = o.backend;
  const auto timeout = std::chrono::milliseconds(int64_t(o.collective_timeout_s * 1000));
  std::string why;
  const bool one_host = w.local_world_size == w.world_size;
  if (backend == Backend::kAuto) {
    backend = nccl_available(&why) ? Backend::kNccl
              : one_host && w.world_size > 1 ? Backend::kShm
                                             : Backend::kGloo;
  }
  if (backend == Backend::kNccl) {
    if (!nccl_available(&why)) throw TrainerError("--backend nccl: " + why);
    *device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(w.local_rank));
    NcclOptions no;
    no.rank = w.rank;
    no.world_size = w.world_size;
    no.device = w.local_rank;
    no.timeout = timeout;
    return make_nccl_communicator(*store, no);
  }
  *device = at::Device(at::kCPU);
  if (backend == Backend::kShm) {
    if (!one_host) {
      throw TrainerError("--backend shm: ranks span hosts (LOCAL_WORLD_SIZE " +
                         std::to_string(w.local_world_size) + " < WORLD_SIZE " +
                         std::to_string(w.world_size) + "); use gloo");
    }
    ShmOptions so;
    so.rank = w.rank;
    so.world_size = w.world_size;
    so.timeout = timeout;
    return make_shm_communicator(*store, so);
  }
  GlooOptions go;
  go.rank = w.rank;
  go.world_size = w.world_size;
  go.timeout = timeout;
  go.single_host = w.local_world_size == w.world_size;
  go.peer_addr = w.master_addr;
  return std::make_unique<GlooCommunicator>(store, go);
}

// Broadcast a host tensor through a communicator that may want device memory.
void broadcast_host(Communicator& comm, at::Tensor& host, const at::Device& device) {
  if (device.is_cpu()) {
    comm.broadcast(host, 0);
    return;
  }
  at::Tensor d = host.to(device);
  comm.broadcast(d, 0);
  host.copy_(d.cpu());
}

struct Resume {
  int64_t step = 0;
  int64_t position = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();  // the checkpoint's
};

// Rank 0 picks the newest checkpoint that verifies and loads it; the step,
// position and state then reach every rank by broadcast, so all ranks
// resume from the same checkpoint even without a shared folder.
Resume resume_from_checkpoint(const TrainOptions& o, const WorkerInfo& w, Communicator& comm,
                              CheckpointDir& dir, TrainState& state, const at::Device& device) {
  // meta: status (0 none, 1 resumed, 2 failed), step, position, loss bits.
  at::Tensor meta = at::zeros({4}, at::kLong);
  std::string error;
  if (w.rank == 0) {
    for (const std::string& path : dir.remove_leftovers()) {
      log_warn("removed %s, left by a checkpoint write that did not finish", path.c_str());
    }
  }
  if (w.rank == 0 && o.resume) {
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
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  broadcast_host(comm, rng, device);
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  for (at::Tensor& m : state.momentum) comm.broadcast(m, 0);
  Resume r{meta[1].item<int64_t>(), meta[2].item<int64_t>()};
  const int64_t bits = meta[3].item<int64_t>();
  std::memcpy(&r.loss, &bits, sizeof bits);
  return r;
}

// A full disk does not end the run: the newest checkpoint that verifies is
// still there, and failing would only spend the agent's restarts on writes
// that fail again. Every other I/O error fails the worker.
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

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw TrainerError(path + ": cannot write --save-params file");
}

}  // namespace

std::string final_line(const TrainResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "rank %d steps %lld samples_per_s %.1f final_loss %.4f test_acc %.4f",
                r.rank, static_cast<long long>(r.steps), r.samples_per_s, r.final_loss,
                r.test_acc);
  return buf;
}

TrainResult run_training(const TrainOptions& o, const WorkerInfo& w,
                         const c10::intrusive_ptr<c10d::Store>& store,
                         const volatile std::sig_atomic_t* stop_requested) {
  if (o.batch <= 0 || o.steps < 0 || o.hidden <= 0) {
    throw TrainerError("--batch and --hidden must be positive, --steps not negative");
  }
  // One BLAS thread a rank in a multi-rank job: ranks sharing a host own its
  // cores, and a fixed count keeps the bits independent of how ranks spread
  // over hosts (OpenBLAS's threaded GEMM sums in another order), so a 2-node
  // job ends bit-identical to a 1-node one. OpenBLAS has its own pool that
  // at::set_num_threads does not reach.
  if (w.world_size > 1) {
    at::set_num_threads(1);
    set_openblas_threads(1);
  }

  at::Device device(at::kCPU);
  std::unique_ptr<Communicator> comm = make_communicator(o, w, store, &device);

  at::manual_seed(o.seed);
  std::unique_ptr<Model> model = make_model(o.model, o.hidden, kClasses);
  Dataset train = o.synthetic ? synthetic_dataset(4096, kFeatures, kClasses, o.seed)
                              : load_idx_dataset(o.data_dir, "train");
  Dataset test = o.synthetic ? synthetic_dataset(512, kFeatures, kClasses, o.seed + 1)
                             : load_idx_dataset(o.data_dir, "t10k");
  if (train.x.size(1) != kFeatures) {
    throw TrainerError(o.data_dir + ": images have " + std::to_string(train.x.size(1)) +
                       " pixels, the model wants 784 (28x28)");
  }
  if (!device.is_cpu()) {
    model->to(device);
    train = Dataset{train.x.to(device), train.y.to(device)};
    test = Dataset{test.x.to(device), test.y.to(device)};
  }
  std::vector<at::Tensor> params = model->parameters();  // handles, shared with model
  TrainState state{params, {}};
  if (o.momentum != 0) {
    for (const at::Tensor& p : params) state.momentum.push_back(at::zeros_like(p.detach()));
  }

  if (w.rank == 0) log_info("backend %s, %d ranks", comm->backend().c_str(), w.world_size);
  CheckpointDir dir(CheckpointOptions{o.checkpoint_dir, o.keep});
  const Resume resume = resume_from_checkpoint(o, w, *comm, dir, state, device);

  DdpOptions ddp_options;
  ddp_options.bucket_bytes = std::max<int64_t>(1, int64_t(o.bucket_mb * (1 << 20)));
  DistributedDataParallel ddp(params, *comm, ddp_options);
  ddp.broadcast_parameters(0);
  if (o.check_params && !ddp.parameters_identical()) {
    throw TrainerError("--check-params: parameters differ between ranks after the broadcast");
  }

  DistributedSampler sampler(train.size(), o.seed);
  at::Tensor idx_host = at::empty({o.batch}, at::kLong);
  at::Tensor idx = device.is_cpu() ? idx_host : at::empty({o.batch}, idx_host.options().device(device));
  at::Tensor xb = at::empty({o.batch, kFeatures}, train.x.options());
  at::Tensor yb = at::empty({o.batch}, train.y.options());
  std::vector<at::Tensor> weights;  // detached views for the optimizer
  for (const at::Tensor& p : params) weights.push_back(p.detach());

  watchdog::HeartbeatClient heartbeat;

  TrainResult result;
  result.rank = w.rank;
  int64_t step = resume.step;
  int64_t position = resume.position;
  int64_t last_checkpoint = resume.step;
  const int64_t per_step = o.batch * w.world_size;
  // --lr-scale linear: the learning rate grows with the global batch (Goyal
  // et al., the rule the Horovod guide gives).
  const double lr = o.lr_scale_linear ? o.lr * w.world_size : o.lr;
  // Nothing is timed when this run starts at or past its last step.
  const int64_t timed_from = step >= o.steps ? step : std::min(o.steps, step + kWarmupSteps);
  Clock::time_point t0 = Clock::now();
  Clock::time_point last_log = t0;
  int64_t last_log_step = step;
  at::Tensor loss;

  auto stop_now = [&] { return stop_requested != nullptr && *stop_requested != 0; };
  auto checkpoint_if_new = [&] {
    if (w.rank == 0 && step > last_checkpoint) {
      write_checkpoint(dir, o, w, state, step, position,
                       loss.defined() ? loss.item<double>() : resume.loss);
      last_checkpoint = step;
    }
  };
  try {
    while (step < o.steps && !stop_now()) {
      if (step == timed_from) t0 = Clock::now();
      sampler.rank_batch(position, w.rank, o.batch, idx_host.data_ptr<int64_t>());
      if (!device.is_cpu()) idx.copy_(idx_host);
      at::index_select_out(xb, train.x, 0, idx);
      at::index_select_out(yb, train.y, 0, idx);

      for (at::Tensor& p : params) p.mutable_grad().reset();
      ddp.begin_backward();
      loss = model->loss(xb, yb);
      loss.backward();
      ddp.finish_backward();
      {
        // SGD, in place: p -= lr * g (g averaged over ranks), with momentum
        // buffers as torch.optim.SGD keeps them.
        at::NoGradGuard no_grad;
        for (size_t k = 0; k < weights.size(); ++k) {
          const at::Tensor& g = ddp.averaged_grad(k);
          if (state.momentum.empty()) {
            weights[k].add_(g, -lr);
          } else {
            at::Tensor& buf = state.momentum[k];
            if (step == 0) {
              buf.copy_(g);
            } else {
              buf.mul_(o.momentum).add_(g);
            }
            weights[k].add_(buf, -lr);
          }
        }
      }
      ++step;
      position += per_step;
      heartbeat.beat(step);
      if (o.check_params && !ddp.parameters_identical()) {
        throw TrainerError("--check-params: parameters differ between ranks after step " +
                           std::to_string(step));
      }
      if (w.rank == 0 && o.log_every > 0 && step % o.log_every == 0) {
        const Clock::time_point now = Clock::now();
        const double dt = std::chrono::duration<double>(now - last_log).count();
        const double rate = dt > 0 ? double(step - last_log_step) / dt : 0;
        log_info("step %lld/%lld loss %.4f samples/s %.0f eta %.1fs", (long long)step,
                 (long long)o.steps, double(loss.item<float>()), rate * double(per_step),
                 rate > 0 ? double(o.steps - step) / rate : 0.0);
        last_log = now;
        last_log_step = step;
      }
      if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) checkpoint_if_new();
      if (step == o.fail_at_step && w.restart_count == 0) {
        log_warn("--fail-at-step %lld: injected failure (exit %d)", (long long)step, kFaultExitCode);
        std::fflush(nullptr);
        std::_Exit(kFaultExitCode);
      }
      if (step == o.hang_at_step && w.restart_count == 0 && w.rank == w.world_size - 1) {
        log_warn("--hang-at-step %lld: rank %d hangs here (injected)", (long long)step, w.rank);
        std::fflush(nullptr);
        for (;;) ::pause();  // SIGTERM only sets a flag: the agent must SIGKILL us
      }
    }
  } catch (const std::exception& e) {
    // A peer that stopped for SIGTERM breaks the collective we were in; the
    // parameters still hold the last completed step, which is what we save.
    if (!stop_now()) throw;
    log_warn("rank %d: collective interrupted during shutdown: %s", w.rank, e.what());
  }
  result.steps_done = step;
  if (stop_now() && step < o.steps) {
    checkpoint_if_new();
    result.stopped_by_signal = true;
    return result;
  }

  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t timed_steps = step - timed_from;
  result.samples_per_s = dt > 0 && timed_steps > 0 ? double(timed_steps * per_step) / dt : 0;
  if (loss.defined()) {
    result.final_loss = loss.item<double>();
  } else {
    // Resumed at or past the last step: the figures are the checkpoint's.
    result.final_loss = resume.loss;
    if (w.rank == 0) {
      log_warn("resumed at step %lld of %lld: nothing left to train; reporting the "
               "checkpoint's step and loss%s",
               (long long)step, (long long)o.steps,
               std::isnan(resume.loss) ? " (not recorded in it: nan)" : "");
    }
  }
  result.steps = step;
  result.test_acc = model->accuracy(test.x, test.y);
  if (w.rank == 0) {
    if (o.checkpoint_every > 0) checkpoint_if_new();
    const std::vector<uint8_t> bytes = tensor_bytes(params);
    log_info("final parameters sha256 %s", sha256_hex(bytes.data(), bytes.size()).c_str());
    if (!o.save_params.empty()) write_file(o.save_params, bytes);
  }
  return result;
}

}  // namespace ddprun::trainer
