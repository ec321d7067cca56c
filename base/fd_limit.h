// The one place ddprun raises its descriptor limit.
//
// Pipes, log files and store connections scale with the workers (the agent)
// or the peers (ddprun-store): both take the hard RLIMIT_NOFILE limit as
// their soft limit at start-up. Not thread-safe in the sense that the limit
// is process-wide: call it from main() before threads open descriptors.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <optional>

namespace ddprun::base {

struct FdLimit {
  // The soft limit in force now (after raising; the old one if it could
  // not be raised; 0 when getrlimit failed).
  uint64_t soft = 0;
  // The limit before raising, when it was raised: what children that
  // select() on descriptors (FD_SETSIZE 1024) should get back.
  std::optional<rlimit> before;
};

// Raises the RLIMIT_NOFILE soft limit to the hard limit.
FdLimit raise_fd_limit();

}  // namespace ddprun::base
