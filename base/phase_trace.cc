#include "base/phase_trace.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "base/safe_file.h"
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
  // Through SafeDir, as every file ddprun creates: a root agent must not
  // follow a link another user planted where the trace goes.
  ScopedFd fd;
  try {
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + (slash == 0));
    fd = SafeDir::open(dir).open_append(path.substr(slash + 1));
  } catch (const FileError&) {
    return;
  }
  // A short or failed write loses this mark only (see the header).
  const ssize_t written = ::write(fd.get(), line.data(), line.size());
  (void)written;
}

}  // namespace ddprun::base
