// The client side of the control socket (control_wire.h), and the views
// `ddprun status` and `ddprun stacks` print.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddprun::introspect {

// Sends `request` to the agent at `socket` and returns its reply; throws
// std::runtime_error naming the socket and what failed (connect, timeout
// after `timeout`, a malformed reply).
nlohmann::json ask_agent(const std::string& socket, const nlohmann::json& request,
                         std::chrono::milliseconds timeout);

// Every agent of the job once: each reply, then the other nodes' entries it
// carried ("peers", from the job's store), marked "via": "socket" or
// "store"; an agent that answered directly is not repeated from the store.
std::vector<nlohmann::json> job_agents(const std::vector<nlohmann::json>& replies);

// One table over every agent's status reply: RANK HOST PID STATE STEP
// BEAT_AGE STEPS/S CPU% RSS RESTARTS ATTEMPT, ranks in order.
std::string status_table(const std::vector<nlohmann::json>& replies);

}  // namespace ddprun::introspect
