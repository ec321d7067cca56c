// Checkpoints across ranks: resuming every rank from the one checkpoint
// rank 0 picked, and rank 0 writing one; and, with --restart-scope=rank,
// resuming a re-formed generation from a peer, without a checkpoint.
//
// Rank 0 picks the newest checkpoint that verifies and loads it; the step,
// position, generator and optimizer state then reach every rank by
// broadcast, so all ranks resume from the same checkpoint even without a
// shared folder.
#pragma once

#include <cstdint>
#include <limits>

#include "trainer/checkpoint.h"
#include "trainer/communicator.h"
#include "trainer/train_state.h"
#include "trainer/trainer.h"

namespace ddprun::trainer {

struct Resume {
  int64_t step = 0;
  int64_t position = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();  // the checkpoint's
};

// Collective: every rank calls it. Throws TrainerError when rank 0 cannot
// load the checkpoint it chose; a run with nothing to resume gets {}.
Resume resume_from_checkpoint(const TrainOptions& o, const WorkerInfo& w, Communicator& comm,
                              CheckpointDir& dir, TrainState& state, const at::Device& device);

// Rank 0 only: takes the folder for this run (CheckpointDir::lock) and
// removes what an interrupted write left. Throws TrainerError naming the
// holder when another run has it.
void lock_checkpoint_dir(CheckpointDir& dir);

// Rank scope (docs/RECOVERY.md): the state from a peer instead of from a
// checkpoint. Collective over a generation's fresh communicator: every
// rank gives the steps it has committed (-1: a replacement, nothing); the
// source is the lowest rank holding the most (a committed step is exact on
// every rank that committed it), and it broadcasts parameters, momentum,
// the generator, step, position and loss, which every other rank takes.
// Throws TrainerError when no rank holds any state.
struct PeerResume {
  Resume resume;
  int source = -1;  // the rank the state came from
};
PeerResume resume_from_peer(Communicator& comm, TrainState& state, const at::Device& device,
                            int64_t committed, const Resume& mine);

// Rank 0 only. A full disk does not end the run (the newest checkpoint that
// verifies is still there, and failing would only spend the agent's
// restarts on writes that fail again); every other I/O error throws.
void write_checkpoint(CheckpointDir& dir, const TrainOptions& o, const WorkerInfo& w,
                      const TrainState& state, int64_t step, int64_t position, double loss);

}  // namespace ddprun::trainer
