// The per-user registry of running agents, so `ddprun status RUN_ID` finds
// the control sockets of a run: one file "<agent pid>.json" per agent,
// {"run_id", "host", "pid", "socket"}, in a folder only the user can read:
//   $DDPRUN_REGISTRY_DIR, else $XDG_RUNTIME_DIR/ddprun/agents, else
//   /tmp/ddprun-<uid>/agents.
// The folder is created mode 0700 and refused when another user owns it or
// others may write to it (someone else could plant entries). An entry whose
// agent died (SIGKILL) is skipped and removed by the next listing.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun::introspect {

struct AgentEntry {
  std::string run_id;
  std::string host;
  pid_t pid = 0;
  std::string socket;  // the agent's control socket
};

// The registry folder for this user (created if missing); throws
// std::runtime_error naming the folder when it is unsafe or cannot be made.
std::string registry_dir(const std::string& override_dir = "");

// Writes the entry on construction (atomically: temp file + rename) and
// removes it on destruction. Move-only.
class Registration {
 public:
  Registration(const std::string& dir, const AgentEntry& entry);
  ~Registration();
  Registration(Registration&& other) noexcept;
  Registration& operator=(Registration&&) = delete;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Live agents in `dir`, of `run_id` (every run when empty), by pid.
std::vector<AgentEntry> list_agents(const std::string& dir, const std::string& run_id = "");

}  // namespace ddprun::introspect
