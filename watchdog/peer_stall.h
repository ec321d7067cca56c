// Cross-node blame for a hang under --restart-scope=rank on several nodes.
//
// A rank that stops (hung) stops its peers on every node at their next
// collective, a moment later, so each node's watchdog finds its own ranks
// past their deadline and the node with the shortest timeout acts first.
// When that is a survivor's node, it would replace a rank that was only
// waiting, and the real culprit's hang then ends the recovery: a group
// restart. So before it acts a node publishes its stall (the rank it would
// blame, that rank's last step, how long it has been silent) and waits
// kAskPeers; a node with a rank behind that step, silent about as long,
// acts on its rank at once and says so ("blamed"), and the first node then
// waits for the generation that node opens instead of acting. No clocks are
// compared: only steps, and durations each node measured itself. When the
// steps are equal (a script that beats after its collective) nothing tells
// the nodes apart: each acts after kAskPeers, as before (first one wins).
#pragma once

#include <chrono>
#include <vector>

#include "watchdog/guard_record.h"
#include "watchdog/watchdog.h"

namespace ddprun::watchdog {

// How long a node whose ranks stalled waits for another node to name a rank
// of its own behind them: a few of PeerGuards' polls and a store round trip.
inline constexpr std::chrono::milliseconds kAskPeers{3000};
// How long it then waits for that node's generation (its stack capture
// comes first, up to the capture tools' 10 s each): after that it acts.
inline constexpr std::chrono::milliseconds kAwaitPeerGeneration{60000};

// Local ranks (by local rank, lowest step first) behind a peer node's
// stall: live, judged by beats, at a step below the stall's and silent at
// least half as long as the peer's stalled rank (the culprit stopped
// first; the half absorbs the record's trip and two nodes' scheduling).
std::vector<int> local_ranks_behind(const std::vector<WorkerStatus>& workers,
                                    const PeerStall& stall, Clock::time_point now);

// How long a rank has not made progress at `now` (since its spawn when it
// never beat).
Millis silent_for(const WorkerStatus& w, Clock::time_point now);

}  // namespace ddprun::watchdog
