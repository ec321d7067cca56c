#include "trainer/trainer.h"

#include <signal.h>
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
#include "trainer/generation.h"
#include "trainer/log.h"
#include "trainer/model.h"
#include "trainer/recovery_channel.h"
#include "trainer/resume.h"
#include "trainer/sampler.h"
#include "trainer/train_state.h"
#include "watchdog/heartbeat.h"

namespace ddprun::trainer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kFeatures = 784;
constexpr int64_t kClasses = 10;
constexpr int64_t kWarmupSteps = 10;  // left out of samples/s, as the reference does

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw TrainerError(path + ": cannot write --save-params file");
}

// What a run trains with, built before the ranks first meet.
struct Setup {
  at::Device device{at::kCPU};
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<DistributedDataParallel> ddp;  // over comm; made after the model
  std::unique_ptr<Model> model;
  Dataset train;
  Dataset test;
  TrainState state;  // params are handles shared with the model
};

std::unique_ptr<DistributedDataParallel> make_ddp(const TrainOptions& o, Setup& s) {
  DdpOptions ddp_options;
  ddp_options.bucket_bytes = std::max<int64_t>(1, int64_t(o.bucket_mb * (1 << 20)));
  return std::make_unique<DistributedDataParallel>(s.state.params, *s.comm, ddp_options);
}

// The parameters (handles shared with the model) and their momentum buffers.
void make_state(const TrainOptions& o, Setup& s) {
  s.state.params = s.model->parameters();
  s.state.momentum.clear();
  if (o.momentum != 0) {
    for (const at::Tensor& p : s.state.params)
      s.state.momentum.push_back(at::zeros_like(p.detach()));
  }
}

// Everything a rank trains with that does not depend on its rank: what a
// standby builds before it is assigned one. On the CPU; connect() moves it.
Setup build(const TrainOptions& o, const WorkerInfo& w) {
  // One BLAS thread a rank in a multi-rank job: ranks sharing a host own its
  // cores, and a fixed count keeps the bits independent of how ranks spread
  // over hosts (OpenBLAS's threaded GEMM sums in another order), so a 2-node
  // job ends bit-identical to a 1-node one. OpenBLAS has its own pool that
  // at::set_num_threads does not reach.
  if (w.world_size > 1) {
    at::set_num_threads(1);
    set_openblas_threads(1);
  }
  Setup s;
  at::manual_seed(o.seed);
  s.model = make_model(o.model, o.hidden, kClasses);
  s.train = o.synthetic ? synthetic_dataset(4096, kFeatures, kClasses, o.seed)
                        : load_idx_dataset(o.data_dir, "train");
  s.test = o.synthetic ? synthetic_dataset(512, kFeatures, kClasses, o.seed + 1)
                       : load_idx_dataset(o.data_dir, "t10k");
  if (s.train.x.size(1) != kFeatures) {
    throw TrainerError(o.data_dir + ": images have " + std::to_string(s.train.x.size(1)) +
                       " pixels, the model wants 784 (28x28)");
  }
  make_state(o, s);
  return s;
}

// The rank's communicator for `scope` (the device follows from it), the
// model and data moved there, the DDP over both.
void connect(const TrainOptions& o, const WorkerInfo& w,
             const c10::intrusive_ptr<c10d::Store>& store, const GenerationScope& scope,
             Setup& s) {
  s.comm = make_communicator(o, w, store, scope, &s.device);
  if (!s.device.is_cpu()) {
    s.model->to(s.device);
    s.train = Dataset{s.train.x.to(s.device), s.train.y.to(s.device)};
    s.test = Dataset{s.test.x.to(s.device), s.test.y.to(s.device)};
    make_state(o, s);  // the moved parameters, momentum beside them
  }
  s.ddp = make_ddp(o, s);
}

// A standby's wait for its rank (--standby-workers): the agent's event=assign
// makes it the failed rank's replacement in the assigned generation. What
// reads RANK/LOCAL_RANK later (the heartbeat client, a child process) finds
// the assigned values: set here, while no thread of ours reads the
// environment (LibTorch's pools are idle, no communicator exists yet).
// False when the agent stopped it first.
bool take_assignment(RecoveryChannel& channel, WorkerInfo& w,
                     const volatile std::sig_atomic_t* stop_requested) {
  const int number = channel.standby();
  log_info("standby %d (pid %d): model and optimizer built; waiting for a rank", number,
           int(::getpid()));
  const std::optional<Assignment> a = channel.wait_assigned(stop_requested);
  if (!a) return false;
  w.rank = a->rank;
  w.local_rank = a->local_rank;
  if (w.rank >= w.world_size) {
    throw TrainerError("event=assign rank=" + std::to_string(w.rank) + " is not below WORLD_SIZE=" +
                       std::to_string(w.world_size));
  }
  ::setenv(base::kEnvRank, std::to_string(w.rank).c_str(), 1);
  ::setenv(base::kEnvLocalRank, std::to_string(w.local_rank).c_str(), 1);
  ::setenv(base::kEnvRoleRank, std::to_string(w.rank).c_str(), 1);
  ::setenv(base::kEnvGeneration, std::to_string(a->generation).c_str(), 1);
  ::unsetenv(base::kEnvStandby);
  set_log_rank(w.rank);
  log_info("standby %d is rank %d (local rank %d), joining generation %lld", number, w.rank,
           w.local_rank, (long long)a->generation);
  return true;
}

// The line every rank of a re-formed generation logs once it holds the state.
void log_formed(int rank, int64_t generation, const PeerResume& r) {
  log_info("rank %d: generation %lld formed; state from rank %d at step %lld; no checkpoint read",
           rank, (long long)generation, r.source, (long long)r.resume.step);
}

// One rank's steps from the resumed position to --steps or a stop request:
// the batch, forward and backward through DDP, the SGD update, the
// heartbeat, progress lines, checkpoints and the injected faults.
class TrainingLoop {
 public:
  TrainingLoop(const TrainOptions& o, const WorkerInfo& w, Setup& s,
               const c10::intrusive_ptr<c10d::Store>& store, RecoveryChannel* channel,
               CheckpointDir& dir, const Resume& resume,
               const volatile std::sig_atomic_t* stop_requested)
      : o_(o),
        w_(w),
        s_(s),
        store_(store),
        channel_(channel),
        dir_(dir),
        resume_(resume),
        stop_requested_(stop_requested),
        sampler_(s.train.size(), o.seed),
        step_(resume.step),
        position_(resume.position),
        last_checkpoint_(resume.step),
        per_step_(o.batch * w.world_size),
        // --lr-scale linear: the learning rate grows with the global batch
        // (Goyal et al., the rule the Horovod guide gives).
        lr_(o.lr_scale_linear ? o.lr * w.world_size : o.lr),
        // Nothing is timed when this run starts at or past its last step.
        timed_from_(step_ >= o.steps ? step_ : std::min(o.steps, step_ + kWarmupSteps)),
        last_log_step_(step_) {
    idx_host_ = at::empty({o.batch}, at::kLong);
    idx_ = s.device.is_cpu() ? idx_host_
                             : at::empty({o.batch}, idx_host_.options().device(s.device));
    xb_ = at::empty({o.batch, kFeatures}, s.train.x.options());
    yb_ = at::empty({o.batch}, s.train.y.options());
    for (const at::Tensor& p : s.state.params) weights_.push_back(p.detach());
    t0_ = last_log_ = Clock::now();
  }

  void run() {
    try {
      while (step_ < o_.steps && !stop_now()) {
        if (step_ == timed_from_) t0_ = Clock::now();
        // Rank scope: a step whose collectives fail (or are abandoned on
        // the agent's event=failed) is not committed: the parameters and
        // momentum change only after every bucket's all-reduce finished.
        // The group re-forms and the step is done again.
        bool committed = false, identical = true;
        try {
          if (channel_ != nullptr && channel_->requested()) {
            throw CollectiveAborted("a peer failed before step " + std::to_string(step_ + 1));
          }
          train_step();
          ++step_;
          position_ += per_step_;
          committed = true;
          if (o_.check_params) identical = s_.ddp->parameters_identical();
        } catch (const CollectiveError& e) {
          // Only a broken group is recovered: a local error (an OOM, a bug)
          // propagates and ends this rank with its message, as waiting for
          // an event=failed that no peer's death will send would not help.
          if (channel_ == nullptr || stop_now()) throw;
          recover(e.what());
          if (!committed) continue;
        }
        hang_if_injected();  // before the beat: see there
        heartbeat_.beat(step_);
        if (!identical) {
          throw TrainerError("--check-params: parameters differ between ranks after step " +
                             std::to_string(step_));
        }
        log_progress();
        if (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0) checkpoint_if_new();
        inject_faults();
      }
    } catch (const std::exception& e) {
      // A peer that stopped for SIGTERM breaks the collective we were in;
      // the parameters still hold the last completed step, which is what we
      // save.
      if (!stop_now()) throw;
      log_warn("rank %d: collective interrupted during shutdown: %s", w_.rank, e.what());
    }
  }

  // The figures once run() returned; rank 0 also checkpoints and writes
  // the final parameters.
  TrainResult finish() {
    TrainResult result;
    result.rank = w_.rank;
    result.steps_done = step_;
    if (stop_now() && step_ < o_.steps) {
      checkpoint_if_new();
      result.stopped_by_signal = true;
      return result;
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0_).count();
    const int64_t timed_steps = step_ - timed_from_;
    result.samples_per_s = dt > 0 && timed_steps > 0 ? double(timed_steps * per_step_) / dt : 0;
    if (loss_.defined()) {
      result.final_loss = loss_.item<double>();
    } else {
      // Resumed at or past the last step: the figures are the checkpoint's.
      result.final_loss = resume_.loss;
      if (w_.rank == 0) {
        log_warn("resumed at step %lld of %lld: nothing left to train; reporting the "
                 "checkpoint's step and loss%s",
                 (long long)step_, (long long)o_.steps,
                 std::isnan(resume_.loss) ? " (not recorded in it: nan)" : "");
      }
    }
    result.steps = step_;
    result.test_acc = s_.model->accuracy(s_.test.x, s_.test.y);
    if (w_.rank == 0) {
      if (o_.checkpoint_every > 0) checkpoint_if_new();
      const std::vector<uint8_t> bytes = tensor_bytes(s_.state.params);
      log_info("final parameters sha256 %s", sha256_hex(bytes.data(), bytes.size()).c_str());
      if (!o_.save_params.empty()) write_file(o_.save_params, bytes);
    }
    return result;
  }

 private:
  bool stop_now() const { return stop_requested_ != nullptr && *stop_requested_ != 0; }
  int64_t generation() const { return channel_ != nullptr ? channel_->generation() : 0; }
  // Injected faults fire in the attempt's first group only.
  bool faults_armed() const { return w_.restart_count == 0 && generation() == 0; }

  // Rank scope, after this generation's collectives failed: wait for the
  // agent to name the next generation, re-form with the replacement, take
  // the state from the peer that holds the most steps.
  void recover(const std::string& why) {
    const Clock::time_point failed_at = Clock::now();
    log_warn("rank %d: step %lld abandoned in generation %lld: %s", w_.rank,
             (long long)step_ + 1, (long long)generation(), why.c_str());
    // Leaked on purpose: the abandoned collective may never finish, its
    // backend threads (gloo's) may still write the DDP's bucket buffers until
    // their own timeout, and destroying the communicator would block on them
    // (ProcessGroupGloo's destructor drains its queue). One per failure.
    s_.ddp->abandon();
    (void)s_.ddp.release();
    (void)s_.comm.release();
    const auto deadline =
        failed_at + std::chrono::milliseconds(int64_t(o_.recovery_timeout_s * 1000));
    const int64_t g = channel_->wait_failed(
        deadline, "--recovery-timeout " + std::to_string(o_.recovery_timeout_s) + " s");
    at::Device device = s_.device;
    s_.comm = make_communicator(o_, w_, store_, GenerationScope{g, channel_}, &device);
    s_.ddp = make_ddp(o_, s_);
    Resume mine;
    mine.position = position_;
    mine.loss = loss_.defined() ? loss_.item<double>() : resume_.loss;
    const PeerResume r = resume_from_peer(*s_.comm, s_.state, s_.device, step_, mine);
    step_ = r.resume.step;
    position_ = r.resume.position;
    if (r.source != w_.rank && !std::isnan(r.resume.loss)) {
      loss_ = at::scalar_tensor(r.resume.loss, at::kFloat);
    }
    log_formed(w_.rank, g, r);
    log_info("rank %d: recovered in %.0f ms", w_.rank,
             std::chrono::duration<double, std::milli>(Clock::now() - failed_at).count());
    channel_->joined(w_.rank);
  }

  void train_step() {
    sampler_.rank_batch(position_, w_.rank, o_.batch, idx_host_.data_ptr<int64_t>());
    if (!s_.device.is_cpu()) idx_.copy_(idx_host_);
    at::index_select_out(xb_, s_.train.x, 0, idx_);
    at::index_select_out(yb_, s_.train.y, 0, idx_);
    for (at::Tensor& p : s_.state.params) p.mutable_grad().reset();
    arm_kill();
    throw_if_injected();
    s_.ddp->begin_backward();
    at::Tensor loss = s_.model->loss(xb_, yb_);
    loss.backward();
    s_.ddp->finish_backward();
    loss_ = loss;  // only a committed step's
    sgd_update();
  }

  // --kill-at-step: the step is in flight once a bucket's all-reduce left.
  void arm_kill() {
    const int victim = o_.kill_rank >= 0 ? o_.kill_rank : w_.world_size - 1;
    if (step_ + 1 != o_.kill_at_step || w_.rank != victim || !faults_armed()) return;
    s_.ddp->set_launch_observer([this](size_t bucket) {
      log_warn("--kill-at-step %lld: rank %d SIGKILLs itself, bucket %zu's all-reduce launched",
               (long long)o_.kill_at_step, w_.rank, bucket);
      std::fflush(nullptr);
      ::kill(::getpid(), SIGKILL);
    });
  }

  // SGD, in place: p -= lr * g (g averaged over ranks), with momentum
  // buffers as torch.optim.SGD keeps them.
  void sgd_update() {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor>& momentum = s_.state.momentum;
    for (size_t k = 0; k < weights_.size(); ++k) {
      const at::Tensor& g = s_.ddp->averaged_grad(k);
      if (momentum.empty()) {
        weights_[k].add_(g, -lr_);
        continue;
      }
      if (step_ == 0) {
        momentum[k].copy_(g);
      } else {
        momentum[k].mul_(o_.momentum).add_(g);
      }
      weights_[k].add_(momentum[k], -lr_);
    }
  }

  void log_progress() {
    if (w_.rank != 0 || o_.log_every <= 0 || step_ % o_.log_every != 0) return;
    const Clock::time_point now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last_log_).count();
    const double rate = dt > 0 ? double(step_ - last_log_step_) / dt : 0;
    log_info("step %lld/%lld loss %.4f samples/s %.0f eta %.1fs", (long long)step_,
             (long long)o_.steps, double(loss_.item<float>()), rate * double(per_step_),
             rate > 0 ? double(o_.steps - step_) / rate : 0.0);
    last_log_ = now;
    last_log_step_ = step_;
  }

  void checkpoint_if_new() {
    if (w_.rank == 0 && step_ > last_checkpoint_) {
      write_checkpoint(dir_, o_, w_, s_.state, step_, position_,
                       loss_.defined() ? loss_.item<double>() : resume_.loss);
      last_checkpoint_ = step_;
    }
  }

  // --throw-at-step: an error of this rank's own in the middle of a step,
  // before its all-reduces, as an out-of-memory error would be.
  void throw_if_injected() const {
    const int victim = o_.kill_rank >= 0 ? o_.kill_rank : w_.world_size - 1;
    if (step_ + 1 != o_.throw_at_step || w_.rank != victim || !faults_armed()) return;
    throw TrainerError("--throw-at-step " + std::to_string(o_.throw_at_step) + ": rank " +
                       std::to_string(w_.rank) + " fails on its own (injected)");
  }

  // --fail-at-step, in the first group only.
  void inject_faults() const {
    if (!faults_armed()) return;
    if (step_ == o_.fail_at_step) {
      log_warn("--fail-at-step %lld: injected failure (exit %d)", (long long)step_,
               kFaultExitCode);
      std::fflush(nullptr);
      std::_Exit(kFaultExitCode);
    }
  }

  // --hang-at-step: after the step's collectives, before its heartbeat, so
  // the hung rank is the one behind in steps (its peers beat step N, then
  // wait in N+1): the watchdog's culprit, also without stacks, as
  // rank-scoped recovery needs (it replaces only the culprit). Beating
  // first made the two last beats a race the watchdog could lose.
  void hang_if_injected() const {
    if (!faults_armed() || step_ != o_.hang_at_step || w_.rank != w_.world_size - 1) return;
    log_warn("--hang-at-step %lld: rank %d hangs here (injected)", (long long)step_, w_.rank);
    std::fflush(nullptr);
    for (;;) ::pause();  // SIGTERM only sets a flag: the agent must SIGKILL us
  }

  const TrainOptions& o_;
  const WorkerInfo& w_;
  Setup& s_;
  const c10::intrusive_ptr<c10d::Store>& store_;
  RecoveryChannel* channel_;  // nullptr: group scope
  CheckpointDir& dir_;
  const Resume& resume_;
  const volatile std::sig_atomic_t* stop_requested_;
  DistributedSampler sampler_;
  watchdog::HeartbeatClient heartbeat_;
  at::Tensor idx_host_, idx_, xb_, yb_;
  std::vector<at::Tensor> weights_;  // detached views for the optimizer
  at::Tensor loss_;
  int64_t step_;
  int64_t position_;
  int64_t last_checkpoint_;
  const int64_t per_step_;
  const double lr_;
  const int64_t timed_from_;
  Clock::time_point t0_;
  Clock::time_point last_log_;
  int64_t last_log_step_;
};

}  // namespace

std::string final_line(const TrainResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "rank %d steps %lld samples_per_s %.1f final_loss %.4f test_acc %.4f",
                r.rank, static_cast<long long>(r.steps), r.samples_per_s, r.final_loss,
                r.test_acc);
  return buf;
}

TrainResult run_training(const TrainOptions& o, const WorkerInfo& worker,
                         const c10::intrusive_ptr<c10d::Store>& store,
                         const volatile std::sig_atomic_t* stop_requested,
                         RecoveryChannel* channel) {
  if (o.batch <= 0 || o.steps < 0 || o.hidden <= 0) {
    throw TrainerError("--batch and --hidden must be positive, --steps not negative");
  }
  WorkerInfo w = worker;  // a standby's rank comes later
  Setup s = build(o, w);
  if (channel != nullptr && channel->standby() != 0 &&
      !take_assignment(*channel, w, stop_requested)) {
    TrainResult stopped;
    stopped.rank = -1;
    stopped.stopped_by_signal = true;
    return stopped;
  }
  const int64_t generation = channel != nullptr ? channel->generation() : 0;
  connect(o, w, store, GenerationScope{generation, channel}, s);
  if (w.rank == 0) log_info("backend %s, %d ranks", s.comm->backend().c_str(), w.world_size);
  CheckpointDir dir(CheckpointOptions{o.checkpoint_dir, o.keep});
  Resume resume;
  if (generation == 0) {
    resume = resume_from_checkpoint(o, w, *s.comm, dir, s.state, s.device);
    s.ddp->broadcast_parameters(0);
    if (o.check_params && !s.ddp->parameters_identical()) {
      throw TrainerError("--check-params: parameters differ between ranks after the broadcast");
    }
  } else {
    // A replacement: the survivors hold the state in memory, no checkpoint
    // is read. Rank 0 still takes the folder, for the checkpoints it writes.
    if (w.rank == 0) lock_checkpoint_dir(dir);
    const PeerResume r = resume_from_peer(*s.comm, s.state, s.device, -1, Resume{});
    resume = r.resume;
    log_formed(w.rank, generation, r);
    channel->joined(w.rank);
  }
  TrainingLoop loop(o, w, s, store, channel, dir, resume, stop_requested);
  loop.run();
  return loop.finish();
}

}  // namespace ddprun::trainer
