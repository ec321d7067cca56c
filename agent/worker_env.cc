#include "agent/worker_env.h"

#include <stdexcept>

namespace ddprun::agent {

EnvMap env_from_strings(const std::vector<std::string>& entries) {
  EnvMap env;
  for (const auto& e : entries) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace(e.substr(0, eq), e.substr(eq + 1));
  }
  return env;
}

std::vector<std::string> env_to_strings(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

void use_virtual_local_rank(int local_rank, EnvMap& env) {
  env[base::kEnvLocalRank] = "0";
  std::string gpu = std::to_string(local_rank);
  if (auto it = env.find(base::kEnvCudaVisibleDevices); it != env.end()) {
    std::vector<std::string> list;
    size_t pos = 0;
    while (pos <= it->second.size()) {
      size_t comma = it->second.find(',', pos);
      if (comma == std::string::npos) comma = it->second.size();
      list.push_back(it->second.substr(pos, comma - pos));
      pos = comma + 1;
    }
    if (local_rank >= static_cast<int>(list.size()))
      throw std::invalid_argument("--virtual-local-rank: local rank " + std::to_string(local_rank) +
                                  " has no GPU in CUDA_VISIBLE_DEVICES=" + it->second);
    gpu = list[local_rank];
  }
  env[base::kEnvCudaVisibleDevices] = gpu;
}

void add_worker_env(const WorkerEnvInput& in, EnvMap& env) {
  env[base::kEnvRank] = std::to_string(in.rank);
  env[base::kEnvLocalRank] = std::to_string(in.local_rank);
  env[base::kEnvWorldSize] = std::to_string(in.world_size);
  env[base::kEnvLocalWorldSize] = std::to_string(in.local_world_size);
  env[base::kEnvGroupRank] = std::to_string(in.group_rank);
  env[base::kEnvGroupWorldSize] = std::to_string(in.group_world_size);
  env[base::kEnvRoleRank] = std::to_string(in.role_rank);
  env[base::kEnvRoleName] = in.role_name;
  env[base::kEnvRoleWorldSize] = std::to_string(in.role_world_size);
  env[base::kEnvMasterAddr] = in.master_addr;
  env[base::kEnvMasterPort] = std::to_string(in.master_port);
  env[base::kEnvRestartCount] = std::to_string(in.restart_count);
  env[base::kEnvMaxRestarts] = std::to_string(in.max_restarts);
  env[base::kEnvRunId] = in.run_id;
  // As torchrun 2.x: the agent hosts c10d's TCPStore at MASTER_PORT
  // (store_host.h), so every rank's env:// joins it as a client.
  env[base::kEnvUseAgentStore] = "True";
  env[base::kEnvErrorFile] = in.error_file;
  if (!in.signals_to_handle.empty()) env[base::kEnvSignalsToHandle] = in.signals_to_handle;
  env.emplace(base::kEnvTorchNcclAsync, "1");
  env.emplace(base::kEnvNcclAsync, "1");
  if (in.local_world_size > 1) env.emplace(base::kEnvOmpNumThreads, "1");
  if (!in.attempt_log_dir.empty()) env[base::kEnvLogDir] = in.attempt_log_dir;
  if (!in.store_addr.empty()) env[base::kEnvStoreAddr] = in.store_addr;
  if (!in.store_prefix.empty()) env[base::kEnvStorePrefix] = in.store_prefix;
  if (!in.store_token.empty()) env[base::kEnvRdzvToken] = in.store_token;
  if (in.recovery_fd >= 0) {
    env[base::kEnvRestartScope] = "rank";
    env[base::kEnvRecoveryFd] = std::to_string(in.recovery_fd);
    env[base::kEnvGeneration] = std::to_string(in.generation);
  }
  if (!in.pythonpath_prepend.empty()) {
    std::string path;
    for (const auto& p : in.pythonpath_prepend) path += (path.empty() ? "" : ":") + p;
    auto it = env.find(base::kEnvPythonPath);
    if (it != env.end() && !it->second.empty()) path += ":" + it->second;
    env[base::kEnvPythonPath] = path;
  }
}

}  // namespace ddprun::agent
