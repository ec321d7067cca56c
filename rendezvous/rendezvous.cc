// The elastic rendezvous (rendezvous.h); its store keys are listed in
// job_protocol.h (JobKeys).
#include "rendezvous/rendezvous.h"

#include "rendezvous/job_protocol.h"

#include "rendezvous/client.h"
#include "rendezvous/wire.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>
#include <sstream>

namespace ddprun::rendezvous {

namespace {
using Clock = std::chrono::steady_clock;

Duration left(Clock::time_point deadline) {
  auto d = std::chrono::duration_cast<Duration>(deadline - Clock::now());
  return d.count() < 0 ? Duration(0) : d;
}

// How long past close_timeout the other nodes wait for the node that claimed
// a round's close before closing it themselves (that node died or stalled).
constexpr Duration kCloserGrace{5000};

int64_t to_i64(const Bytes& b) {
  try {
    return std::stoll(to_string(b));
  } catch (const std::exception&) {
    throw RendezvousError("rendezvous: store value '" + to_string(b) + "' is not an integer");
  }
}

// multi_set in requests the ddprun store takes (wire.h: at most 8,192 keys
// and 4 MiB a frame), with room to spare: a closer of 4,096 nodes writes
// 8,193 keys, about 1 MB.
void multi_set_bounded(Store& store, const std::vector<std::string>& keys,
                       const std::vector<Bytes>& values) {
  constexpr size_t kKeys = wire::kMaxKeysPerRequest / 2, kBytes = wire::kMaxFrameSize / 2;
  for (size_t begin = 0; begin < keys.size();) {
    size_t end = begin, bytes = 0;
    while (end < keys.size() && end - begin < kKeys &&
           (end == begin || bytes + keys[end].size() + values[end].size() + 8 <= kBytes)) {
      bytes += keys[end].size() + values[end].size() + 8;
      ++end;
    }
    const auto b = static_cast<std::ptrdiff_t>(begin), e = static_cast<std::ptrdiff_t>(end);
    store.multi_set({keys.begin() + b, keys.begin() + e}, {values.begin() + b, values.begin() + e});
    begin = end;
  }
}

std::string default_node_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  std::ostringstream s;
  s << host << ":" << getpid() << ":" << std::hex << rd();
  return s.str();
}

void forget_dead(Store& store, const JobKeys& keys, const RendezvousOptions& options, int64_t r,
                 int64_t last, std::set<std::string>& expected) {
  // Who has joined round r so far (the slots that exist), and of the
  // expected nodes missing, those marked dead in round `last`: a check
  // each, few of them (not O(round) requests a slice).
  store.settle_closed(keys.round(last));
  int64_t joined = store.add(keys.joined(r), 0);
  if (joined > kFormedMark) joined -= kFormedMark;
  joined = std::min<int64_t>(joined, options.max_nodes);
  std::vector<std::string> slots;
  for (int64_t i = 1; i <= joined; ++i) slots.push_back(keys.node_slot(r, i));
  std::set<std::string> present;
  try {
    if (!slots.empty())
      for (const auto& b : store.multi_get(slots, Duration(0)))
        if (auto n = decode_node(b)) present.insert(n->node_id);
  } catch (const TimeoutError&) {
    return;  // a slot taken and not yet recorded: look again next slice
  }
  for (auto it = expected.begin(); it != expected.end();) {
    if (!present.count(*it) && store.check({keys.dead(last, *it)})) {
      spdlog::info("rendezvous '{}': node {} was found dead; round {} does not wait for it",
                   options.run_id, *it, r);
      it = expected.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

Rendezvous::Rendezvous(StoreFactory factory, RendezvousOptions options,
                       StoreFactory keep_alive_factory)
    : factory_(std::move(factory)),
      keep_alive_factory_(keep_alive_factory ? std::move(keep_alive_factory) : factory_),
      options_(std::move(options)),
      keys_(options_.run_id) {
  if (options_.min_nodes < 1 || options_.max_nodes < options_.min_nodes) {
    throw RendezvousError("rendezvous: --nnodes " + std::to_string(options_.min_nodes) + ":" +
                          std::to_string(options_.max_nodes) + " needs 1 <= MIN <= MAX");
  }
  if (options_.node_id.empty()) options_.node_id = default_node_id();
  for (const std::string* s : {&options_.node_id, &options_.local_addr, &options_.run_id}) {
    if (s->find_first_of("\t\n") != std::string::npos) {
      throw RendezvousError("rendezvous: '" + *s + "' must not contain tabs or newlines");
    }
  }
  try {
    store_ = factory_();
    // Before this node joins any round, so every round's closer knows
    // whose death needs a successor.
    if (options_.hosts_store) store_->set(keys_.store_host(), to_bytes(options_.node_id));
  } catch (const StoreError& e) {
    throw RendezvousError(std::string("rendezvous: ") + e.what());
  }
  if (options_.local_addr.empty()) {
    // The address this host's store connection leaves from is one the
    // other nodes can reach, even on multi-NIC hosts where the FQDN is not.
    Store* s = store_.get();
    if (auto* p = dynamic_cast<PrefixStore*>(s)) s = &p->inner();
    if (auto* c = dynamic_cast<Client*>(s)) options_.local_addr = c->local_address();
    if (options_.local_addr.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      options_.local_addr = host;
    }
  }
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::join_error(int64_t round, const std::string& what) {
  std::string who;
  int64_t joined = 0;
  try {
    joined = store_->add(keys_.joined(round), 0);
    if (joined > kFormedMark) joined -= kFormedMark;
    for (int64_t i = 1; i <= joined && i <= 64; ++i) {
      std::string k = keys_.node_slot(round, i);
      if (!store_->check({k})) continue;
      auto n = decode_node(store_->get(k, Duration(0)));
      if (n) who += (who.empty() ? "" : ", ") + n->node_id + " at " + n->addr;
    }
  } catch (const std::exception&) {
  }
  return "rendezvous '" + options_.run_id + "' round " + std::to_string(round) + ": " +
         std::to_string(joined) + " of " + std::to_string(options_.min_nodes) +
         " required nodes joined " + what + (who.empty() ? "" : " (" + who + ")");
}

std::vector<NodeInfo> Rendezvous::previous_members() {
  int64_t last = 0;
  try {
    last = to_i64(store_->get(keys_.last_closed(), Duration(0)));
  } catch (const TimeoutError&) {
    return {};  // no round formed yet
  }
  const Formed f = decode_formed(store_->get(keys_.closed(last), Duration(0)), keys_.closed(last));
  if (f.size == 0) return {};
  return members_of(last, f.closer);
}

const std::vector<NodeInfo>& Rendezvous::members_of(int64_t round, int64_t closer) {
  // The claimer reads its last round's members for who is expected back,
  // then for the stable ranks: once (O(N) bytes on the close's path).
  if (!members_ || members_->round != round || members_->closer != closer)
    members_ = MemberList{round, closer, read_members(*store_, keys_, round, closer)};
  return members_->nodes;
}

void Rendezvous::close_round(int64_t round, int64_t n) {
  std::vector<std::string> keys;
  for (int64_t i = 1; i <= n; ++i) keys.push_back(keys_.node_slot(round, i));
  std::vector<NodeInfo> nodes;
  try {
    // One request for the n records, not 2n (requests per node stay flat
    // with the job's size: bench/rendezvous_scale).
    for (const auto& b : store_->multi_get(keys, options_.close_timeout))
      if (auto node = decode_node(b)) nodes.push_back(*node);
  } catch (const TimeoutError&) {
    // A node took a slot and vanished before recording itself: leave it out.
    for (const auto& k : keys) {
      if (!store_->check({k})) continue;
      if (auto node = decode_node(store_->get(k, Duration(0)))) nodes.push_back(*node);
    }
  }
  const auto assigned = assign_ranks(nodes, previous_members());
  std::string store_host;  // none: a store no member hosts (ddprun-store)
  try {
    store_host = to_string(store_->get(keys_.store_host(), Duration(0)));
  } catch (const TimeoutError&) {
  }
  const auto each = assignments(assigned, store_host);
  // Every member's own assignment, its heartbeat counter and the member
  // list, under this closer's seq and before it tries to publish: whoever
  // reads r<N>/closed finds the winner's records complete, and a closer
  // that loses the race overwrites nothing of the winner's.
  keys.clear();
  std::vector<Bytes> values;
  for (size_t i = 0; i < assigned.size(); ++i) {
    keys.push_back(keys_.assignment(round, seq_, assigned[i].node_id));
    values.push_back(encode_assignment(each[i]));
    keys.push_back(keys_.heartbeat(round, assigned[i].node_id));
    values.push_back(to_bytes("0"));
  }
  keys.push_back(keys_.members(round, seq_));
  values.push_back(encode_nodes(assigned));
  multi_set_bounded(*store_, keys, values);
  const Bytes value = encode_formed({static_cast<int64_t>(assigned.size()), seq_});
  if (store_->compare_set(keys_.closed(round), {}, value) == value) {
    store_->add(keys_.joined(round), kFormedMark);
    store_->set(keys_.last_closed(), to_bytes(std::to_string(round)));
    spdlog::info("rendezvous '{}': round {} formed with {} nodes", options_.run_id, round,
                 assigned.size());
  }
}

Bytes Rendezvous::wait_last_call(int64_t round, const std::string& closed,
                                 std::chrono::steady_clock::time_point until) {
  // A job that may grow (--nnodes=MIN:MAX) gives late nodes the last call
  // before its round forms; alone on a machine, a user trying the elastic
  // flags saw nothing for its 30 s and took it for a hang. Said once the
  // wait has lasted a while (a third of the last call, at most 5 s): a
  // round that closes at once (every node came) costs no line and no
  // request more.
  const Duration quiet = std::min(Duration(5000), options_.last_call_timeout / 3);
  if (options_.min_nodes >= options_.max_nodes || until - Clock::now() <= quiet)
    return store_->get(closed, left(until));
  try {
    return store_->get(closed, quiet);
  } catch (const TimeoutError&) {
  }
  const auto more = std::chrono::duration_cast<std::chrono::seconds>(until - Clock::now()).count();
  spdlog::info("rendezvous '{}': round {} has its minimum of {} node(s); it forms in {} s "
               "(last_call_timeout) or as soon as {} have joined",
               options_.run_id, round, options_.min_nodes, more, options_.max_nodes);
  return store_->get(closed, left(until));
}

bool Rendezvous::claims_close(int64_t round) {
  const Bytes me = to_bytes(options_.node_id);
  return store_->compare_set(keys_.closer(round), {}, me) == me;  // ours, now or before
}

void Rendezvous::close_once(int64_t round, int64_t n, Duration left_to_join) {
  // Every node may close a round, so a dying one cannot stall the others,
  // but one does the work: at 4,096 nodes closing by all was 4,096 x n
  // requests. The others wait for its result, and close the round
  // themselves only when it has not come within close_timeout and a grace.
  if (claims_close(round)) return close_round(round, n);
  try {
    store_->wait({keys_.closed(round)},
                 std::min(options_.close_timeout + kCloserGrace, left_to_join));
  } catch (const TimeoutError&) {
    close_round(round, n);
  }
}

RoundResult Rendezvous::result_from(int64_t round, int64_t closer, Assignment a) {
  RoundResult r;
  static_cast<Assignment&>(r) = std::move(a);
  r.round = round;
  r.store_prefix = options_.run_id + "/round_" + std::to_string(round) + "/";
  r.closer = closer;
  return r;
}

int64_t Rendezvous::move_past(int64_t r, const NodeInfo& me, bool member) {
  // Round r is running (or over): move on to r + 1 (compare_set returns
  // the round current names after it, ours or a newer one). A node that is
  // not one of its members asks the members to re-form (scale-up) when the
  // group has room for it.
  const int64_t next = to_i64(store_->compare_set(keys_.current(), to_bytes(std::to_string(r)),
                                                  to_bytes(std::to_string(r + 1))));
  if (member) return next;
  const std::string closed = keys_.closed(r);
  const Formed f = decode_formed(store_->get(closed, Duration(0)), closed);
  if (f.size < options_.max_nodes) {
    RoundEnd up;
    up.kind = RoundEnd::kScaleUp;
    up.exit_status = 0;
    up.node = me.node_id;
    up.reason = "scale-up: node " + me.node_id + " at " + me.addr + " waits to join";
    publish_end(*store_, keys_, r, up);
    awaited_ = std::make_pair(r, f.closer);  // they come to the next round for us
  }
  return next;
}

Bytes Rendezvous::await_close(int64_t r, int64_t slot, Clock::time_point deadline) {
  const int64_t max = options_.max_nodes;
  const std::string closed = keys_.closed(r);
  Bytes formed;  // r<N>/closed's value, once read
  try {
    if (slot == max) {
      close_once(r, slot, left(deadline));
    } else {
      // The nodes expected back are all the round needs: close as soon
      // as every one of them has joined (by name, not by count: a late
      // node's slot is no member's), and give a slow one more than the
      // last call before leaving it out, so that none of them comes
      // back as a late node with another group rank. One node (the
      // close's claimer) reads who is expected and looks who came
      // back (O(nodes) bytes, once); the others wait below for the
      // round it closes. All of them reading was O(nodes^2) bytes.
      // The claim is tried on joining, not once MIN have joined: after
      // a death MIN are there only when the last survivor is, and the
      // claims and the claimer's reads then came all at once, between
      // that join and the close.
      std::set<std::string> expected;
      const bool claimer = may_expect() && claims_close(r);
      if (claimer) expected = expected_members();
      // Every node can close the round (the first to publish wins), so
      // a node that dies during the last call cannot stall the others:
      // wait for MIN nodes, then give the last call its window.
      const std::string min_key = keys_.node_slot(r, options_.min_nodes);
      store_->wait({min_key}, left(deadline));
      const auto now = Clock::now();
      const auto last_call_end = now + options_.last_call_timeout;
      bool closed_early = false;
      if (claimer) {
        // Nobody left to expect (every other member of the last round is
        // known dead: its connection closed or its heartbeats stopped)
        // closes at once with whoever joined: the last call is for nodes
        // that may still come, and the dead will not.
        const auto patience = std::max(options_.last_call_timeout, options_.close_timeout);
        if (expected.empty() ||
            wait_for_expected(r, expected, std::min(now + patience, deadline))) {
          close_round(r, std::min(store_->add(keys_.joined(r), 0), max));
          closed_early = true;
        }
        // else the last call decides; close_once finds the claim ours
      }
      if (!closed_early) {
        try {
          formed = wait_last_call(r, closed, std::min(last_call_end, deadline));
        } catch (const TimeoutError&) {
          close_once(r, std::min(store_->add(keys_.joined(r), 0), max), left(deadline));
        }
      }
    }
    if (formed.empty()) formed = store_->get(closed, left(deadline));
  } catch (const TimeoutError&) {
    throw RendezvousError(join_error(r, "within join_timeout " +
                                            std::to_string(options_.join_timeout.count()) +
                                            " ms"));
  }
  return formed;
}

RoundResult Rendezvous::next_round() {
  const auto deadline = Clock::now() + options_.join_timeout;
  const int64_t max = options_.max_nodes;
  try {
    if (!keep_alive_store_) keep_alive_store_ = keep_alive_factory_();
    NodeInfo me{options_.node_id, options_.local_addr, options_.master_port,
                options_.local_world_size, seq_};
    // Where current names the round being formed. A member of a round
    // moves past it at once (compare_set returns the round current names
    // after it: the one it makes, or a newer one). No node looks whether
    // the round it joins is formed already: the join says so (the closer
    // marks the counter, kFormedMark), or, where the closer died before
    // marking it, the round turns out to hold no assignment of ours.
    int64_t r = 0;
    if (current_) {
      r = to_i64(store_->compare_set(keys_.current(), to_bytes(std::to_string(current_->round)),
                                     to_bytes(std::to_string(current_->round + 1))));
    } else {
      r = store_->add(keys_.current(), 0);
    }
    bool formed_already = false;  // round r is formed without us
    for (;;) {
      const bool member = current_ && current_->round == r;
      if (formed_already || member) {
        formed_already = false;
        r = move_past(r, me, member);
        continue;
      }
      const int64_t slot = store_->add(keys_.joined(r), 1);
      if (slot > kFormedMark) {
        formed_already = true;
        continue;
      }
      // First-join order without a request of its own: the round and the
      // slot of this node's first join, unique and ordered job-wide (a
      // counter in the store cost every node one more round trip).
      if (seq_ < 0) seq_ = me.seq = (r << 32) | slot;
      if (slot <= max) {
        store_->set(keys_.node_slot(r, slot), encode_node(me));
      }
      const Bytes formed = await_close(r, slot, deadline);
      // This node's own record of the winner's assignment: constant bytes
      // whatever the round's size (bench/rendezvous_scale).
      const Formed f = decode_formed(formed, keys_.closed(r));
      const std::string mine = keys_.assignment(r, f.closer, me.node_id);
      Bytes record;
      try {
        record = store_->get(mine, Duration(0));
      } catch (const TimeoutError&) {
        formed_already = true;
        continue;  // the round filled up without us: wait for the next
      }
      auto a = decode_assignment(record);
      if (!a) {
        throw RendezvousError("rendezvous '" + options_.run_id + "': the assignment at " + mine +
                              " is not one this ddprun reads (every node must run the same ddprun)");
      }
      awaited_.reset();
      current_ = result_from(r, f.closer, std::move(*a));
      return *current_;
    }
  } catch (const StoreError& e) {
    throw RendezvousError("rendezvous '" + options_.run_id + "': " + e.what());
  }
}

std::set<std::string> Rendezvous::dead_members() {
  // Two requests whatever the size of the round (a check per member was
  // O(nodes) per node): the node whose closed connection ended it, and the
  // nodes watchers saw missing heartbeats.
  std::set<std::string> dead;
  const int64_t r = current_->round;
  for (const std::string& k : {keys_.dead_closed(r), keys_.dead_seen(r)}) {
    try {
      std::istringstream in(to_string(store_->get(k, Duration(0))));
      for (std::string id; std::getline(in, id);)
        if (!id.empty()) dead.insert(id);
    } catch (const TimeoutError&) {
      // nobody died that way
    }
  }
  return dead;
}

bool Rendezvous::may_expect() {
  // One check (dead/<node> is set by the store's death notice and by the
  // watchers alike): evicted, its view of who is live is stale.
  if (current_) return !store_->check({keys_.dead(current_->round, options_.node_id)});
  return awaited_.has_value();
}

std::set<std::string> Rendezvous::expected_members() {
  std::set<std::string> out;
  try {
    if (current_) {
      const auto dead = dead_members();
      for (const auto& n : members_of(current_->round, current_->closer))
        if (!dead.count(n.node_id)) out.insert(n.node_id);
      // A late node ended the round to be taken in: wait for it too, or the
      // members, back first, close the next round without it, it asks again,
      // and on a loaded machine that repeats until its join_timeout.
      try {
        auto end = read_end(*store_, keys_, current_->round);
        if (end && end->kind == RoundEnd::kScaleUp && !end->node.empty()) out.insert(end->node);
      } catch (const RecordError& e) {
        spdlog::debug("rendezvous '{}': {}", options_.run_id, e.what());
      }
    }
    if (awaited_) {
      for (const auto& n : members_of(awaited_->first, awaited_->second))
        out.insert(n.node_id);
    }
  } catch (const TimeoutError& e) {
    // A member list gone (a store that lost keys): expect whom we know of.
    spdlog::debug("rendezvous '{}': {}", options_.run_id, e.what());
  } catch (const RendezvousError& e) {
    spdlog::debug("rendezvous '{}': {}", options_.run_id, e.what());
  }
  out.erase(options_.node_id);
  return out;
}

bool Rendezvous::wait_for_expected(int64_t r, const std::set<std::string>& expected_at_first,
                                   Clock::time_point until) {
  // Slots fill in join order, so wait for as many as could hold them all,
  // then look who took them (one multi_get); in slices, to notice a round
  // closed meanwhile, and a member found dead meanwhile: one whose death
  // came after its round had ended (the notice then only marks it dead;
  // on etcd, when its lease ran out, which the settle below applies) is not
  // waited for.
  std::set<std::string> expected = expected_at_first;
  const int64_t last = current_ ? current_->round : awaited_ ? awaited_->first : -1;
  const std::string closed = keys_.closed(r);
  int64_t extra = 0;  // slots taken by nodes nobody expects (late ones)
  while (static_cast<int64_t>(expected.size()) + 1 + extra <= options_.max_nodes) {
    if (expected.empty()) return true;
    if (store_->check({closed})) return false;
    const int64_t slots = static_cast<int64_t>(expected.size()) + 1 + extra;
    std::vector<std::string> keys;
    for (int64_t i = 1; i <= slots; ++i) keys.push_back(keys_.node_slot(r, i));
    std::vector<Bytes> records;
    try {
      records = store_->multi_get(keys, std::clamp(left(until), Duration(1), Duration(500)));
    } catch (const TimeoutError&) {
      if (Clock::now() >= until) return false;
      if (last >= 0) forget_dead(*store_, keys_, options_, r, last, expected);
      continue;
    }
    size_t found = 0;
    for (const auto& b : records)
      if (auto n = decode_node(b)) found += expected.count(n->node_id);
    if (found >= expected.size()) return true;
    extra += static_cast<int64_t>(expected.size() - found);
  }
  return false;
}

void Rendezvous::reconnect() {
  keep_alive_store_.reset();  // it may have died with the other one
  try {
    store_ = factory_();
  } catch (const StoreError& e) {
    throw RendezvousError("rendezvous '" + options_.run_id + "': " + e.what());
  }
}

void Rendezvous::signal_failure(const RoundEnd& end) {
  if (!current_) return;
  try {
    publish_end(*store_, keys_, current_->round, end);
  } catch (const StoreError& e) {
    throw RendezvousError("rendezvous '" + options_.run_id + "': " + e.what());
  }
}

int64_t Rendezvous::restart_count() {
  try {
    return store_->add(keys_.restarts(), 0);
  } catch (const StoreError& e) {
    throw RendezvousError("rendezvous '" + options_.run_id + "': " + e.what());
  }
}

std::unique_ptr<KeepAlive> Rendezvous::watch(std::function<void(const RoundEnd&)> on_end) {
  if (!current_) throw RendezvousError("rendezvous: watch() before a round was formed");
  try {
    auto store = keep_alive_store_ ? std::move(keep_alive_store_) : keep_alive_factory_();
    return std::make_unique<KeepAlive>(std::move(store), *this, *current_, std::move(on_end));
  } catch (const StoreError& e) {
    throw RendezvousError("rendezvous '" + options_.run_id + "': " + e.what());
  }
}

}  // namespace ddprun::rendezvous
