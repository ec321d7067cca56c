// Running a helper program (nvidia-smi, a --on-hang command) with a
// deadline: its stdout and stderr are captured up to a limit; when the
// deadline passes the program's process group is killed and reaped.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ddprun::introspect {

struct ToolResult {
  bool started = false;    // false: could not be executed (error says why)
  bool timed_out = false;  // killed at the deadline
  int exit_code = -1;      // exit status, or 128+N for signal N
  std::string output;      // stdout and stderr together, at most max_bytes
  std::string error;
};

ToolResult run_tool(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                    std::size_t max_bytes = 64 * 1024,
                    const std::vector<std::string>& extra_env = {});

}  // namespace ddprun::introspect
