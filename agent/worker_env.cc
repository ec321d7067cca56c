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
  env[kEnvLocalRank] = "0";
  std::string gpu = std::to_string(local_rank);
  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) {
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
  env["CUDA_VISIBLE_DEVICES"] = gpu;
}

void add_worker_env(const WorkerEnvInput& in, EnvMap& env) {
  env[kEnvRank] = std::to_string(in.rank);
  env[kEnvLocalRank] = std::to_string(in.local_rank);
  env[kEnvWorldSize] = std::to_string(in.world_size);
  env[kEnvLocalWorldSize] = std::to_string(in.local_world_size);
  env[kEnvGroupRank] = std::to_string(in.group_rank);
  env[kEnvGroupWorldSize] = std::to_string(in.group_world_size);
  env[kEnvRoleRank] = std::to_string(in.role_rank);
  env[kEnvRoleName] = in.role_name;
  env[kEnvRoleWorldSize] = std::to_string(in.role_world_size);
  env[kEnvMasterAddr] = in.master_addr;
  env[kEnvMasterPort] = std::to_string(in.master_port);
  env[kEnvRestartCount] = std::to_string(in.restart_count);
  env[kEnvMaxRestarts] = std::to_string(in.max_restarts);
  env[kEnvRunId] = in.run_id;
  // Our store does not speak PyTorch's TCPStore protocol, so rank 0's env://
  // init must host its own TCPStore at MASTER_PORT.
  env[kEnvUseAgentStore] = "False";
  env[kEnvErrorFile] = in.error_file;
  if (!in.signals_to_handle.empty()) env[kEnvSignalsToHandle] = in.signals_to_handle;
  env.emplace(kEnvTorchNcclAsync, "1");
  env.emplace(kEnvNcclAsync, "1");
  if (in.local_world_size > 1) env.emplace(kEnvOmpNumThreads, "1");
  if (!in.attempt_log_dir.empty()) env[kEnvLogDir] = in.attempt_log_dir;
  if (!in.store_addr.empty()) env[kEnvStoreAddr] = in.store_addr;
  if (!in.store_prefix.empty()) env[kEnvStorePrefix] = in.store_prefix;
  if (!in.store_token.empty()) env[kEnvStoreToken] = in.store_token;
  if (!in.pythonpath_prepend.empty()) {
    std::string path;
    for (const auto& p : in.pythonpath_prepend) path += (path.empty() ? "" : ":") + p;
    auto it = env.find(kEnvPythonPath);
    if (it != env.end() && !it->second.empty()) path += ":" + it->second;
    env[kEnvPythonPath] = path;
  }
}

}  // namespace ddprun::agent
