#include "launcher/nproc.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/procfs.h"
#include "launcher/cli.h"

namespace ddprun::launcher {

int count_gpus(const char* cuda_visible) {
  if (cuda_visible) {
    std::string v = cuda_visible;
    if (v.empty() || v == "-1" || v == "NoDevFiles") return 0;
    int n = 0;
    std::stringstream in(v);
    std::string item;
    while (std::getline(in, item, ','))
      if (!item.empty()) ++n;
    return n;
  }
  int n = 0;
  for (const auto& e : base::list_dir_or_empty("/dev")) {
    const char* name = e.name.c_str();
    if (std::strncmp(name, "nvidia", 6) != 0 || name[6] == '\0') continue;
    bool digits = true;
    for (const char* p = name + 6; *p; ++p)
      if (*p < '0' || *p > '9') digits = false;
    if (digits) ++n;
  }
  return n;
}

int resolve_nproc(const std::string& value, const char* cuda_visible, int cpu_count) {
  if (value == "cpu") return cpu_count;
  if (value == "gpu" || value == "auto") {
    int gpus = count_gpus(cuda_visible);
    if (gpus > 0) return gpus;
    if (value == "auto") return cpu_count;
    throw UsageError("--nproc-per-node=gpu: no GPU found (no /dev/nvidia* device, or "
                     "CUDA_VISIBLE_DEVICES is empty)");
  }
  char* end = nullptr;
  long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < 1 || n > 4096)
    throw UsageError("--nproc-per-node=" + value +
                     ": expected a positive integer, auto, cpu or gpu");
  return static_cast<int>(n);
}

}  // namespace ddprun::launcher
