#include "agent/peer_recovery.h"

#include <chrono>
#include <exception>
#include <optional>
#include <utility>

namespace ddprun::agent {

namespace rdzv = rendezvous;
using Token = base::OffLoopTask::Token;

struct PeerRecovery::Outcome {
  std::optional<rdzv::RankFailure> failure;  // watch
  bool opened = false;                       // open_generation
  bool formed = false;                       // joined
  std::string error;                         // any: the store call's failure
};

PeerRecovery::PeerRecovery(Place place, base::OffLoopTask::Post post, Handlers handlers)
    : place_(std::move(place)),
      keys_(place_.run_id),
      post_(std::move(post)),
      handlers_(std::move(handlers)) {}

PeerRecovery::~PeerRecovery() { stop(); }

void PeerRecovery::stop() {
  stopped_ = true;
  // First the sockets, so that the tasks' joins below find them returned.
  canceller_->cancel();
  for (auto* t : {&watch_task_, &publish_task_, &join_task_}) t->cancel();
}

void PeerRecovery::run(base::OffLoopTask& task,
                       std::function<void(rdzv::Store&, Outcome&, const Token&)> work,
                       std::function<void(Outcome&)> done) {
  if (stopped_) return;
  if (task.active()) {
    // Only a watch is ever replaced while it waits; it captured nothing of
    // ours and ends at its next slice.
    task.cancel();
    if (!task.join_until(std::chrono::steady_clock::now())) task.abandon();
  }
  auto out = std::make_shared<Outcome>();
  task.start(
      [open = place_.open, canceller = canceller_, out, work = std::move(work)](const Token& t) {
        try {
          auto store = open(kCallDeadline, canceller);
          work(*store, *out, t);
        } catch (const std::exception& e) {
          out->error = e.what();
        }
      },
      post_,
      [this, out, done = std::move(done)] {
        if (stopped_) return;
        if (!out->error.empty())
          handlers_.lost(out->error);
        else
          done(*out);
      });
}

void PeerRecovery::watch(int64_t g) {
  run(
      watch_task_,
      [keys = keys_, r = place_.round, g](rdzv::Store& store, Outcome& out, const Token& t) {
        out.failure = rdzv::watch_rank_failure(store, keys, r, g, [&t] { return t.cancelled(); },
                                               kSlice);
      },
      [this](Outcome& out) {
        if (out.failure) handlers_.failed(*out.failure);
      });
}

void PeerRecovery::open_generation(const rdzv::RankFailure& failure) {
  run(
      publish_task_,
      [keys = keys_, r = place_.round, failure](rdzv::Store& store, Outcome& out, const Token&) {
        out.opened = rdzv::publish_rank_failure(store, keys, r, failure);
      },
      [this, g = failure.generation](Outcome& out) { handlers_.published(g, out.opened); });
}

void PeerRecovery::joined(int64_t g) {
  run(
      join_task_,
      [keys = keys_, r = place_.round, g, nodes = place_.nodes](rdzv::Store& store, Outcome& out,
                                                                const Token& t) {
        rdzv::publish_generation_joined(store, keys, r, g, nodes);
        while (!t.cancelled())
          if (rdzv::generation_formed_within(store, keys, r, g, kSlice)) {
            out.formed = true;
            return;
          }
      },
      [this, g](Outcome& out) {
        if (out.formed) handlers_.formed(g);
      });
}

}  // namespace ddprun::agent
