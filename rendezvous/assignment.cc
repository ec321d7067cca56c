// A formed round's records (rendezvous.h): the node record, the stable rank
// rule, the per-node assignment and the member list. Pure functions but
// read_members, which reads one key.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "rendezvous/rendezvous.h"

namespace ddprun::rendezvous {

namespace {

// The assignment line naming the store's successor.
constexpr const char* kSuccessorTag = "successor";

// Splits `text` at tabs into exactly `n` fields; false otherwise.
bool split_fields(const std::string& text, size_t n, std::vector<std::string>& out) {
  out.clear();
  size_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t tab = text.find('\t', pos);
    if ((tab == std::string::npos) != (i + 1 == n)) return false;
    out.push_back(text.substr(pos, tab == std::string::npos ? std::string::npos : tab - pos));
    pos = tab + 1;
  }
  return true;
}

// A whole decimal integer that fits `v` (no sign: sizes, ranks and ports
// are >= 0).
bool parse_int(const std::string& s, int& v) {
  if (s.empty() || s.size() > 10) return false;
  int64_t x = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + (c - '0');
  }
  if (x > std::numeric_limits<int>::max()) return false;
  v = static_cast<int>(x);
  return true;
}

// Calls `line` on each line of `text` (the last may lack its newline).
template <class F>
void each_line(const std::string& text, F line) {
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    line(text.substr(pos, end - pos));
    pos = end + 1;
  }
}

}  // namespace

std::string encode_node(const NodeInfo& n) {
  return n.node_id + "\t" + n.addr + "\t" + std::to_string(n.master_port) + "\t" +
         std::to_string(n.local_world_size) + "\t" + std::to_string(n.seq);
}

std::optional<NodeInfo> decode_node(const std::string& text) {
  std::vector<std::string> f;
  if (!split_fields(text, 5, f)) return std::nullopt;  // exactly five fields
  try {
    size_t a = 0, b = 0, c = 0;
    NodeInfo n{f[0], f[1], std::stoi(f[2], &a), std::stoi(f[3], &b), std::stoll(f[4], &c)};
    if (a != f[2].size() || b != f[3].size() || c != f[4].size()) return std::nullopt;
    return n;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string encode_nodes(const std::vector<NodeInfo>& nodes) {
  std::string s;
  for (const auto& n : nodes) s += encode_node(n) + "\n";
  return s;
}

std::vector<NodeInfo> decode_nodes(const std::string& text) {
  std::vector<NodeInfo> nodes;
  nodes.reserve(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')));
  each_line(text, [&](const std::string& line) {
    if (auto n = decode_node(line)) nodes.push_back(std::move(*n));
  });
  return nodes;
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

std::string encode_assignment(const Assignment& a) {
  std::string s = std::to_string(a.group_rank) + "\t" + std::to_string(a.group_world_size) + "\t" +
                  std::to_string(a.rank_base) + "\t" + std::to_string(a.world_size) + "\t" +
                  a.master_addr + "\t" + std::to_string(a.master_port) + "\n";
  for (const auto& p : a.watched) s += std::to_string(p.group_rank) + "\t" + encode_node(p.node) + "\n";
  if (a.successor) s += std::string(kSuccessorTag) + "\t" + encode_node(*a.successor) + "\n";
  return s;
}

std::optional<Assignment> decode_assignment(const std::string& text) {
  Assignment a;
  bool ok = true, header = true;
  std::vector<std::string> f;
  each_line(text, [&](const std::string& line) {
    if (!ok) return;
    if (header) {
      header = false;
      ok = split_fields(line, 6, f) && parse_int(f[0], a.group_rank) &&
           parse_int(f[1], a.group_world_size) && parse_int(f[2], a.rank_base) &&
           parse_int(f[3], a.world_size) && parse_int(f[5], a.master_port) &&
           a.group_rank < a.group_world_size;
      a.master_addr = ok ? f[4] : "";
      return;
    }
    const size_t tab = line.find('\t');
    if (line.compare(0, tab, kSuccessorTag) == 0) {
      a.successor = tab == std::string::npos ? std::nullopt : decode_node(line.substr(tab + 1));
      ok = a.successor.has_value();
      return;
    }
    Peer p;
    auto node = tab == std::string::npos ? std::nullopt : decode_node(line.substr(tab + 1));
    ok = node && parse_int(line.substr(0, tab), p.group_rank) && p.group_rank < a.group_world_size &&
         a.watched.size() < kWatchedPeers;
    if (ok) {
      p.node = std::move(*node);
      a.watched.push_back(std::move(p));
    }
  });
  if (!ok || header) return std::nullopt;
  return a;
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
  auto nodes = decode_nodes(to_string(store.get(key, Duration(0))));
  if (nodes.empty()) throw RendezvousError("rendezvous: no node record in " + key);
  return nodes;
}

}  // namespace ddprun::rendezvous
