#include "base/phase_trace.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "base/scoped_fd.h"

namespace ddprun::base {

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void mark_phase(const std::string& path, std::string_view phase, std::string_view detail,
                int64_t at_ns) {
  if (path.empty()) return;
  std::string line = std::to_string(getpid()) + " " + std::to_string(at_ns) + " ";
  line += phase;
  if (!detail.empty()) {
    line += ' ';
    line += detail;
  }
  line += '\n';
  const ScopedFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return;
  // A short or failed write loses this mark only (see the header).
  const ssize_t written = ::write(fd.get(), line.data(), line.size());
  (void)written;
}

}  // namespace ddprun::base
