// The environment each worker starts with: torchrun's variables plus the
// names that connect ddprun's components (docs/CONTRACTS.md). Every name is
// defined here once; nothing else spells them.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

// torchrun's variables (torch/distributed/elastic/agent/server/
// local_elastic_agent.py in 1.13, plus the error file of its multiprocessing).
inline constexpr const char* kEnvRank = "RANK";
inline constexpr const char* kEnvLocalRank = "LOCAL_RANK";
inline constexpr const char* kEnvWorldSize = "WORLD_SIZE";
inline constexpr const char* kEnvLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvGroupRank = "GROUP_RANK";
inline constexpr const char* kEnvGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kEnvRoleRank = "ROLE_RANK";
inline constexpr const char* kEnvRoleName = "ROLE_NAME";
inline constexpr const char* kEnvRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kEnvMasterAddr = "MASTER_ADDR";
inline constexpr const char* kEnvMasterPort = "MASTER_PORT";
inline constexpr const char* kEnvRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kEnvMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kEnvRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kEnvUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kEnvErrorFile = "TORCHELASTIC_ERROR_FILE";
// torch 2.x: the launcher's --signals-to-handle, as given.
inline constexpr const char* kEnvSignalsToHandle = "TORCHELASTIC_SIGNALS_TO_HANDLE";
inline constexpr const char* kEnvTorchNcclAsync = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kEnvNcclAsync = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kEnvOmpNumThreads = "OMP_NUM_THREADS";
inline constexpr const char* kEnvPythonPath = "PYTHONPATH";

// ddprun's own contract (docs/CONTRACTS.md).
inline constexpr const char* kEnvStoreAddr = "DDPRUN_STORE_ADDR";
inline constexpr const char* kEnvStoreToken = "DDPRUN_RDZV_TOKEN";
inline constexpr const char* kEnvStorePrefix = "DDPRUN_STORE_PREFIX";
inline constexpr const char* kEnvHeartbeatSocket = "DDPRUN_HEARTBEAT_SOCKET";
inline constexpr const char* kEnvLogDir = "DDPRUN_LOG_DIR";
// Set only where the agent has no job cgroup: a random token the guardian
// looks for in /proc/<pid>/environ to find the job's processes after the
// agent was SIGKILLed (guardian.h).
inline constexpr const char* kEnvContainmentToken = "DDPRUN_CONTAINMENT_TOKEN";
// Read from ddprun's own environment: "off" runs without a job cgroup.
inline constexpr const char* kEnvCgroup = "DDPRUN_CGROUP";

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
};

// Adds the worker's variables to `env` (a copy of the agent's base env).
// Variables torchrun only sets "when unset" (NCCL_ASYNC_ERROR_HANDLING,
// TORCH_NCCL_ASYNC_ERROR_HANDLING, OMP_NUM_THREADS with >1 worker) keep the
// inherited value.
void add_worker_env(const WorkerEnvInput& in, EnvMap& env);

}  // namespace ddprun::agent
