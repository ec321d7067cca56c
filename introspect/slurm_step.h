// Finding a Slurm step's processes on this node for `ddprun attach
// --slurm-step JOBID[.STEPID]`: Slurm puts SLURM_JOB_ID and, in the steps
// srun starts, SLURM_STEP_ID in every task's environment, so /proc/PID/environ
// tells which processes belong to a step, without asking slurmd (`scontrol
// listpids` needs the node's slurmd and the same user or root; /proc needs
// only the same user). The step's roots are its topmost processes: the
// tasks themselves (a ddprun agent, torchrun, the training program), whose
// children are then watched as trees.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddprun::introspect {

struct SlurmStep {
  std::string job;   // SLURM_JOB_ID
  // SLURM_STEP_ID to match; empty: every process of the job; "batch": the
  // batch script's step (processes without SLURM_STEP_ID).
  std::string step;
};

// Parses "JOBID", "JOBID.STEPID" or "JOBID.batch" (digits for the ids);
// nullopt when malformed.
std::optional<SlurmStep> parse_slurm_step(const std::string& text);

// The topmost processes of `step` on this node (their parents are not in
// the step), leaving out this process and its ancestors (attach itself may
// run inside the job, e.g. under srun --overlap).
std::vector<pid_t> slurm_step_roots(const SlurmStep& step);

}  // namespace ddprun::introspect
