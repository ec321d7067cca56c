// IntrospectHook's `ddprun stacks`: this node's capture on a thread of its
// own, and (multi-node) the other nodes' through the job's store.
#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <optional>

#include "introspect/agent_hook.h"
#include "introspect/stacks.h"

namespace ddprun::introspect {

void IntrospectHook::stacks_all_nodes(int rank, ControlServer::Reply reply) {
  // This node's capture and the other nodes' answers, merged once both are in.
  struct Join {
    std::optional<nlohmann::json> local;
    std::optional<std::vector<nlohmann::json>> peers;
    std::vector<std::string> errors;
  };
  auto join = std::make_shared<Join>();
  auto finish = [this, join, rank, reply] {
    if (!join->local || !join->peers) return;
    nlohmann::json stacks = nlohmann::json::array();
    std::vector<std::string> errors = join->errors;
    auto take = [&](const nlohmann::json& r, const std::string& where) {
      if (r.contains("error")) {
        errors.push_back(where + ": " + r["error"].get<std::string>());
        return;
      }
      for (auto s : r.value("stacks", nlohmann::json::array())) {
        s["host"] = r.value("host", "");
        stacks.push_back(std::move(s));
      }
    };
    take(*join->local, "this node");
    for (const auto& p : *join->peers) take(p, "node " + std::to_string(p.value("node", -1)));
    nlohmann::json result = {{"run_id", options_.run_id}, {"host", host_}, {"stacks", stacks}};
    // One rank lives on one node: the others' "not running here" is no error.
    if (rank < 0 || stacks.empty()) result["errors"] = errors;
    if (stacks.empty()) {
      std::string why;
      for (const auto& e : errors) why += (why.empty() ? "" : "; ") + e;
      result = {{"error", why.empty() ? "no rank answered" : why}};
    }
    reply(result);
  };
  stacks(rank, [join, finish](const nlohmann::json& r) {
    join->local = r;
    finish();
  });
  board_->ask_stacks(rank, [this, alive = alive_.token(), join, finish](std::vector<nlohmann::json> replies,
                                                                 std::vector<std::string> errors) {
    boost::asio::post(io_, [alive, join, finish, replies = std::move(replies),
                            errors = std::move(errors)] {
      if (!alive) return;
      join->peers = replies;
      join->errors = errors;
      finish();
    });
  });
}

void IntrospectHook::stacks(int rank, ControlServer::Reply reply) {
  if (capturing_) {
    reply({{"error", "a stacks request is already running on this agent; try again"}});
    return;
  }
  std::vector<StackTarget> targets;
  std::string local;
  for (const auto& w : workers_) {
    local += (local.empty() ? "" : ",") + std::to_string(w.info.rank);
    if (w.exited || (rank >= 0 && w.info.rank != rank)) continue;
    targets.push_back({w.info.rank, w.info.pid});
  }
  if (targets.empty()) {
    reply({{"error", rank >= 0 ? fmt::format("rank {} is not running on this agent (ranks: {})",
                                             rank, local.empty() ? "none" : local)
                               : std::string("no worker is running")}});
    return;
  }
  CollectOptions o;
  o.dir = runtime_dir_ + "/stacks";
  o.native = options_.stacks;
  o.cancel = cancel_.get();
  // capturing_ is false: the last capture returned, so this wait is short.
  (void)capture_.join_until(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  capture_.abandon();  // a no-op once joined
  capturing_ = true;
  // The work holds only copies (base/off_loop_task.h), the cancel flag it
  // was given (o.cancel) through `keep`: it may be left behind safely.
  auto result = std::make_shared<nlohmann::json>();
  capture_.start(
      [targets, o, run_id = options_.run_id, host = host_, keep = cancel_,
       result](const base::OffLoopTask::Token&) {
        nlohmann::json list = nlohmann::json::array();
        for (const auto& s : collect_stacks(targets, o)) list.push_back(to_json(s));
        *result = {{"run_id", run_id}, {"host", host}, {"stacks", list}};
      },
      [this](std::function<void()> done) { boost::asio::post(io_, std::move(done)); },
      [this, alive = alive_.token(), reply, result] {
        if (!alive) return;
        capturing_ = false;
        reply(*result);
      });
}

}  // namespace ddprun::introspect
