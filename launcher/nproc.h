// Resolving --nproc-per-node: an integer, or auto, cpu or gpu.
#pragma once

#include <string>

namespace ddprun::launcher {

// GPUs visible to this process: the entries of CUDA_VISIBLE_DEVICES when it
// is set (`cuda_visible` non-null), else the /dev/nvidia<N> devices.
int count_gpus(const char* cuda_visible);

// Returns the worker count; throws UsageError naming the flag and value
// ("gpu" without a GPU, "0", "abc").
int resolve_nproc(const std::string& value, const char* cuda_visible, int cpu_count);

}  // namespace ddprun::launcher
