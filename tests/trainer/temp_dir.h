// The shared temporary folder, under the trainer tests' namespace.
#pragma once

#include "tests/common/temp_dir.h"

namespace ddprun::trainer::testing {
using ddprun::testing::TempDir;
}  // namespace ddprun::trainer::testing
