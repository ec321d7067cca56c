#include "base/fd_limit.h"

namespace ddprun::base {

FdLimit raise_fd_limit() {
  FdLimit result;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return result;
  result.soft = rl.rlim_cur;
  if (rl.rlim_cur >= rl.rlim_max) return result;
  rlimit raised{rl.rlim_max, rl.rlim_max};
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) return result;
  result.before = rl;
  result.soft = raised.rlim_cur;
  return result;
}

}  // namespace ddprun::base
