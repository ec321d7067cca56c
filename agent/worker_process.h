// One started worker as the attempt holds it: its process, its output
// pumps and its recovery channel. Move-only: the pumps and the channel own
// descriptors. Used on the agent's thread only.
#pragma once

#include <memory>
#include <string>

#include "agent/attempt_types.h"
#include "agent/output_pump.h"
#include "agent/recovery_channel.h"

namespace ddprun::agent {

struct WorkerProcess {
  WorkerInfo info;
  bool alive = false;
  // Its exec failed (reaped by ProcessLauncher::finish): no group to signal.
  bool never_ran = false;
  std::unique_ptr<OutputPump> out;
  std::unique_ptr<OutputPump> err;
  std::unique_ptr<RecoveryChannel> channel;  // rank scope only
  // --standby-workers: its DDPRUN_STANDBY number while (or since) it was a
  // standby; 0 for a worker started as a rank. A standby's info.rank and
  // info.local_rank are -1 until it is assigned a slot.
  int standby = 0;
  // The local rank its output and packets are reported under (the hooks,
  // the recovery's packets): -1 while a standby, set when it is assigned a
  // slot.
  std::shared_ptr<int> slot;
  // Its prefix for console lines.
  std::string prefix;
};

}  // namespace ddprun::agent
