// The environment each worker starts with: torchrun's variables plus the
// names that connect ddprun's components. The names are base/contract.h's
// (docs/CONTRACTS.md); this file decides their values.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/contract.h"

namespace ddprun::agent {

using EnvMap = std::map<std::string, std::string>;

// torchrun 2.x --virtual-local-rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES
// set to the rank's one GPU (the <local_rank>th entry of the inherited list,
// else the index itself). Throws std::invalid_argument when the list is short.
void use_virtual_local_rank(int local_rank, EnvMap& env);

// "KEY=VALUE" strings to a map; entries without '=' are dropped.
EnvMap env_from_strings(const std::vector<std::string>& entries);
std::vector<std::string> env_to_strings(const EnvMap& env);

// What one worker's torchrun variables are computed from.
struct WorkerEnvInput {
  int local_rank = 0;
  int rank = 0;
  int local_world_size = 1;
  int world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
  std::string role_name = "default";
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string error_file;
  std::string attempt_log_dir;   // DDPRUN_LOG_DIR; empty: not set
  std::string store_addr;        // DDPRUN_STORE_ADDR; empty: not set
  std::string store_prefix;      // DDPRUN_STORE_PREFIX; empty: not set
  std::string store_token;       // DDPRUN_RDZV_TOKEN; empty: not set
  std::vector<std::string> pythonpath_prepend;
  std::string signals_to_handle;  // TORCHELASTIC_SIGNALS_TO_HANDLE; empty: not set
  // --restart-scope=rank: the worker's end of its recovery channel
  // (DDPRUN_RECOVERY_FD, with DDPRUN_RESTART_SCOPE=rank and
  // DDPRUN_GENERATION); -1: group scope, none of the three is set.
  int recovery_fd = -1;
  int generation = 0;
};

// Adds the worker's variables to `env` (a copy of the agent's base env).
// Variables torchrun only sets "when unset" (NCCL_ASYNC_ERROR_HANDLING,
// TORCH_NCCL_ASYNC_ERROR_HANDLING, OMP_NUM_THREADS with >1 worker) keep the
// inherited value.
void add_worker_env(const WorkerEnvInput& in, EnvMap& env);

}  // namespace ddprun::agent
