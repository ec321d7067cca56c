// The `train` program as a library: options in, one training run out.
//
// run_training() builds the model and data, meets the other ranks through
// the given store, resumes from the newest checkpoint that verifies,
// trains with DistributedDataParallel and SGD, checkpoints every
// `checkpoint_every` steps and when *stop_requested becomes non-zero (the
// SIGTERM flag main() owns), beats the watchdog once per step, and returns
// the figures of the final line. Throws TrainerError (and c10::Error from
// LibTorch) on failure; main() maps both to exit codes. With
// --restart-scope=rank it also survives a peer's failure (see below and
// docs/RECOVERY.md).
#pragma once

#include <csignal>
#include <cstdint>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace ddprun::trainer {

// kShm: shared memory between ranks of one host (shm_communicator.h).
enum class Backend { kAuto, kGloo, kNccl, kShm };

struct TrainOptions {
  Backend backend = Backend::kAuto;
  std::string data_dir;          // idx folder; empty = the embedded digits
  bool synthetic = false;        // random data (4096 train / 512 test), like the reference
  std::string model = "mlp";     // mlp or cnn (model.h)
  int64_t hidden = 256;          // width of the hidden linear layer(s)
  double lr = 0.1;               // SGD learning rate
  bool lr_scale_linear = false;  // --lr-scale linear: lr x WORLD_SIZE
  double momentum = 0.0;         // SGD momentum (its buffers are checkpointed)
  int64_t batch = 32;            // per rank
  int64_t steps = 300;           // total optimizer steps of the job
  uint64_t seed = 0;             // model init and sampler shuffle
  double bucket_mb = 25.0;       // gradient bucket size
  double collective_timeout_s = 300;  // a collective not done by then fails the rank
  bool check_params = false;     // verify identical parameters after every step
  int64_t log_every = 50;        // rank 0 progress cadence (0 = never)
  std::string checkpoint_dir;     // empty: the caller picks (train: checkpoints/<run id>)
  int64_t checkpoint_every = 100;  // 0 = only on SIGTERM
  int keep = 3;                  // checkpoints kept
  bool resume = true;            // resume from checkpoint_dir when one verifies
  std::string save_params;       // rank 0 writes final parameters here (raw float32)
  // Every injected fault below fires only on the first attempt
  // (restart_count == 0) and in generation 0 (not in a replacement, nor in
  // a survivor once it re-formed).
  // Fault injection for tests: exit with kFaultExitCode just after this step
  // completes. -1 = off.
  int64_t fail_at_step = -1;
  // Fault injection for tests: the last rank stops for good (alive, no more
  // heartbeats, its peers stuck in the next collective) just after this
  // step, before beating it (so it is the rank behind in steps). -1 = off.
  int64_t hang_at_step = -1;
  // Fault injection for tests: rank kill_rank SIGKILLs itself in the middle
  // of step N (counted as fail_at_step counts: the step that would make N
  // complete), right after its first gradient bucket's all-reduce was
  // launched, so that step is in flight. -1 = off.
  int64_t kill_at_step = -1;
  // Fault injection for tests: rank kill_rank throws a TrainerError of its
  // own (not a collective's) in the middle of step N, before its gradient
  // all-reduces, as an out-of-memory error would. -1 = off.
  int64_t throw_at_step = -1;
  // The rank --kill-at-step and --throw-at-step pick; -1 = the last rank
  // (as --hang-at-step).
  int kill_rank = -1;
  // Rank scope: how long a rank whose collective failed waits for the
  // agent's event=failed before it gives up and fails (--recovery-timeout).
  double recovery_timeout_s = 60;
};

inline constexpr int kFaultExitCode = 17;

// Who this process is; read from the environment by main() only.
struct WorkerInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int restart_count = 0;        // TORCHELASTIC_RESTART_COUNT
  bool under_ddprun = false;    // store is ours (DDPRUN_STORE_ADDR)
  std::string master_addr;      // MASTER_ADDR: rank 0's node, reachable by every rank
};

struct TrainResult {
  int rank = 0;
  int64_t steps = 0;               // completed steps (the checkpoint's when resumed past --steps)
  double samples_per_s = 0;
  double final_loss = 0;
  double test_acc = 0;
  bool stopped_by_signal = false;  // SIGTERM: checkpointed and left early
  int64_t steps_done = 0;          // steps completed when it returned
};

class RecoveryChannel;

// `channel`: --restart-scope=rank's recovery channel (recovery_channel.h),
// nullptr in group scope. With one, a rank whose collective fails (or is
// abandoned on the agent's event=failed) re-forms the group with the
// replacement as the next generation, takes the state from a peer and
// redoes the step in flight; a process started in generation G > 0 (a
// replacement) reads no checkpoint and takes its state the same way.
TrainResult run_training(const TrainOptions& options, const WorkerInfo& worker,
                         const c10::intrusive_ptr<c10d::Store>& store,
                         const volatile std::sig_atomic_t* stop_requested,
                         RecoveryChannel* channel = nullptr);

// The line every rank ends with, in the reference script's form.
std::string final_line(const TrainResult& r);

}  // namespace ddprun::trainer
