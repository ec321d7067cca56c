// A formed round's records (rendezvous.h): the node record, the stable rank
// rule, the per-node assignment and the member list, on record.h's codec.
// Pure functions but read_members, which reads one key.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "rendezvous/record.h"
#include "rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

namespace {

constexpr RecordKind kNodeRecord{"node record", {'D', 'R', 'N'}, 1};
constexpr RecordKind kMembersRecord{"members record", {'D', 'R', 'M'}, 1};
constexpr RecordKind kAssignmentRecord{"assignment record", {'D', 'R', 'A'}, 1};
// An id or an address is never cut (it names the node): longer ones are
// refused when written.
constexpr size_t kMaxNodeText = 4096;
// id length, addr length, port, local world size, seq
constexpr size_t kMinNodeBytes = 2 + 2 + 2 + 4 + 8;
constexpr size_t kMaxMembers = 1 << 24;

void put_node(RecordWriter& w, const NodeInfo& n) {
  if (n.master_port < 0 || n.master_port > 0xffff || n.local_world_size < 0)
    throw RecordError("node record: port " + std::to_string(n.master_port) +
                      " or local world size " + std::to_string(n.local_world_size) +
                      " out of range");
  w.whole_text(n.node_id, kMaxNodeText, "node id")
      .whole_text(n.addr, kMaxNodeText, "address")
      .u16(static_cast<uint16_t>(n.master_port))
      .u32(static_cast<uint32_t>(n.local_world_size))
      .i64(n.seq);
}

// A u32 that is an int's (>= 0), else the record is refused.
int take_int(RecordReader& r, const char* field) {
  const uint32_t v = r.u32(field);
  if (v > static_cast<uint32_t>(std::numeric_limits<int>::max()))
    r.fail(std::string(field) + " " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

NodeInfo take_node(RecordReader& r) {
  NodeInfo n;
  n.node_id = r.text(kMaxNodeText, "node id");
  n.addr = r.text(kMaxNodeText, "address");
  n.master_port = r.u16("port");
  n.local_world_size = take_int(r, "local world size");
  n.seq = r.i64("seq");
  return n;
}

}  // namespace

Bytes encode_node(const NodeInfo& n) {
  RecordWriter w(kNodeRecord);
  put_node(w, n);
  return w.take();
}

std::optional<NodeInfo> decode_node(const Bytes& bytes) {
  try {
    RecordReader r(bytes, kNodeRecord, 4 + kMinNodeBytes);
    NodeInfo n = take_node(r);
    r.finish();
    return n;
  } catch (const RecordError&) {
    return std::nullopt;
  }
}

Bytes encode_nodes(const std::vector<NodeInfo>& nodes) {
  RecordWriter w(kMembersRecord);
  w.wide_count(nodes.size(), kMaxMembers, "nodes");
  for (const auto& n : nodes) put_node(w, n);
  return w.take();
}

std::vector<NodeInfo> decode_nodes(const Bytes& bytes) {
  try {
    RecordReader r(bytes, kMembersRecord, 4 + 4);
    std::vector<NodeInfo> nodes(r.wide_count(kMaxMembers, kMinNodeBytes, "nodes"));
    for (auto& n : nodes) n = take_node(r);
    r.finish();
    return nodes;
  } catch (const RecordError&) {
    return {};
  }
}

std::vector<NodeInfo> assign_ranks(std::vector<NodeInfo> nodes,
                                   const std::vector<NodeInfo>& previous) {
  const size_t n = nodes.size();
  std::vector<std::optional<NodeInfo>> slots(n);
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.seq < b.seq; });
  // By id, the first occurrence: a scan of `previous` per node was O(N^2)
  // (16 M comparisons for the closer of a 4,096-node round).
  std::unordered_map<std::string, size_t> previous_rank;
  previous_rank.reserve(previous.size());
  for (size_t i = 0; i < previous.size(); ++i) previous_rank.emplace(previous[i].node_id, i);
  std::vector<NodeInfo> rest;
  for (const auto& node : nodes) {
    auto it = previous_rank.find(node.node_id);
    size_t prev = it == previous_rank.end() ? n : it->second;
    if (prev < n && !slots[prev]) {
      slots[prev] = node;
    } else {
      rest.push_back(node);
    }
  }
  size_t next = 0;
  for (const auto& node : rest) {
    while (slots[next]) ++next;
    slots[next] = node;
  }
  std::vector<NodeInfo> out;
  out.reserve(n);
  for (auto& s : slots) out.push_back(std::move(*s));
  return out;
}

Bytes encode_assignment(const Assignment& a) {
  RecordWriter w(kAssignmentRecord);
  for (int v : {a.group_rank, a.group_world_size, a.rank_base, a.world_size}) {
    if (v < 0) throw RecordError("assignment record: a negative rank or size " + std::to_string(v));
    w.u32(static_cast<uint32_t>(v));
  }
  if (a.master_port < 0 || a.master_port > 0xffff)
    throw RecordError("assignment record: master port " + std::to_string(a.master_port));
  w.whole_text(a.master_addr, kMaxNodeText, "master address")
      .u16(static_cast<uint16_t>(a.master_port));
  w.count(a.watched.size(), kWatchedPeers, "watched peers");
  for (const auto& p : a.watched) {
    w.u32(static_cast<uint32_t>(p.group_rank));
    put_node(w, p.node);
  }
  w.u8(a.successor ? 1 : 0);
  if (a.successor) put_node(w, *a.successor);
  return w.take();
}

std::optional<Assignment> decode_assignment(const Bytes& bytes) {
  try {
    // magic, version, four u32, the master's address length
    RecordReader r(bytes, kAssignmentRecord, 4 + 16 + 2);
    Assignment a;
    a.group_rank = take_int(r, "group rank");
    a.group_world_size = take_int(r, "group world size");
    a.rank_base = take_int(r, "rank base");
    a.world_size = take_int(r, "world size");
    if (a.group_rank >= a.group_world_size)
      r.fail("group rank " + std::to_string(a.group_rank) + " of " +
             std::to_string(a.group_world_size));
    a.master_addr = r.text(kMaxNodeText, "master address");
    a.master_port = r.u16("master port");
    a.watched.resize(r.count(kWatchedPeers, 4 + kMinNodeBytes, "watched peers"));
    for (auto& p : a.watched) {
      p.group_rank = take_int(r, "peer's group rank");
      if (p.group_rank >= a.group_world_size)
        r.fail("peer's group rank " + std::to_string(p.group_rank));
      p.node = take_node(r);
    }
    const uint8_t has_successor = r.u8("successor flag");
    if (has_successor > 1) r.fail("successor flag " + std::to_string(has_successor));
    if (has_successor) a.successor = take_node(r);
    r.finish();
    return a;
  } catch (const RecordError&) {
    return std::nullopt;
  }
}

std::vector<Assignment> assignments(const std::vector<NodeInfo>& members,
                                    const std::string& store_host) {
  const size_t n = members.size();
  std::vector<Assignment> out(n);
  if (n == 0) return out;
  // The store's successor: only when its host is a member (an agent that
  // dies with it), the first member in group-rank order that is not.
  std::optional<NodeInfo> successor;
  const auto hosted = [&](const NodeInfo& m) { return m.node_id == store_host; };
  if (!store_host.empty() && std::any_of(members.begin(), members.end(), hosted)) {
    auto it = std::find_if_not(members.begin(), members.end(), hosted);
    if (it != members.end()) successor = *it;
  }
  int world = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i].group_rank = static_cast<int>(i);
    out[i].group_world_size = static_cast<int>(n);
    out[i].rank_base = world;
    out[i].master_addr = members[0].addr;
    out[i].master_port = members[0].master_port;
    world += members[i].local_world_size;
    for (size_t step = 1; step < n && step <= kWatchedPeers; ++step) {
      const size_t j = (i + step) % n;
      out[i].watched.push_back({static_cast<int>(j), members[j]});
    }
  }
  for (auto& a : out) {
    a.world_size = world;
    a.successor = successor;
  }
  return out;
}

std::vector<NodeInfo> read_members(Store& store, const JobKeys& keys, int64_t round,
                                   int64_t closer) {
  const std::string key = keys.members(round, closer);
  auto nodes = decode_nodes(store.get(key, Duration(0)));
  if (nodes.empty()) throw RendezvousError("rendezvous: no node record in " + key);
  return nodes;
}

}  // namespace ddprun::rendezvous
