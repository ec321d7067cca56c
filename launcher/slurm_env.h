// What ddprun takes from Slurm when srun starts it (one task per node).
//
// Under `srun`, Slurm already knows the job's shape: how many nodes, which
// one this is, who is first, and ids unique to the job step. ddprun uses
// them for every rendezvous setting the user did not give (flags and PET_*
// variables win), so an sbatch script needs no rendezvous flags at all.
// Pure functions over an environment lookup, no process state: the CLI
// layer passes getenv.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddprun::launcher {

// Slurm's environment does not describe a usable step; what() is one line
// naming the variable and its value.
class SlurmError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Expands Slurm's hostlist syntax, as `scontrol show hostnames` does:
// "gpu[01-04,07],login1" -> gpu01 gpu02 gpu03 gpu04 gpu07 login1 (zero
// padding kept; several bracket groups in one name multiply out).
// Throws SlurmError naming the malformed part.
std::vector<std::string> expand_hostlist(const std::string& list);

// The rendezvous settings of one srun step.
struct SlurmStep {
  int nnodes = 1;             // SLURM_STEP_NUM_NODES (else SLURM_JOB_NUM_NODES)
  int node_rank = 0;          // SLURM_NODEID
  std::string first_host;     // first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST)
  int port = 29400;           // rendezvous port: 29400 + job id % 1000, so jobs sharing a
                              // first node rarely collide
  std::string run_id;         // "slurm-<job id>.<step id>"
};

using EnvLookup = std::function<const char*(const char*)>;

// nullopt when this is not an srun step (no SLURM_JOB_ID or SLURM_STEP_ID),
// or when DDPRUN_SLURM=0. Throws SlurmError for a step ddprun cannot serve
// (several tasks per node, malformed variables).
std::optional<SlurmStep> slurm_step(const EnvLookup& env);

}  // namespace ddprun::launcher
