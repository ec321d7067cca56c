// This process's threads, from /proc/self/task: what tests of lazily
// started threads (a writer's, a console's) count before and after.
#pragma once

#include <cstddef>

#include "base/procfs.h"

namespace ddprun::testing {

inline size_t thread_count() {
  size_t n = 0;
  for (const auto& e : ddprun::base::list_dir_or_empty("/proc/self/task"))
    if (e.name[0] != '.') ++n;
  return n;
}

}  // namespace ddprun::testing
