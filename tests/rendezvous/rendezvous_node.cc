// One rendezvous participant as a process, for tests on separate network
// stacks (netns.sh): joins a round, prints it, then optionally watches it.
//
//   rendezvous_node --store H:P --id ID --addr A --min N --max M
//                   [--nproc K] [--token T] [--watch-ms MS] [--keep-alive-ms MS]
//                   [--rounds N]
//
// Prints "round=R group_rank=G group_world_size=W world_size=S rank_base=B
// master=ADDR:PORT", then with --watch-ms one line "end=KIND reason=..."
// when the round ends (or "end=none" when MS pass). With --rounds N it
// rejoins after each end (as an agent would) up to N rounds, stopping at a
// lost store. Exit 0 on success, 1 with the error on stderr.
#include <algorithm>
#include <cstdio>
#include <future>
#include <string>

#include "rendezvous/client.h"
#include "rendezvous/rendezvous.h"

using namespace ddprun::rendezvous;

int main(int argc, char** argv) {
  std::string store, token;
  RendezvousOptions o;
  o.run_id = "netns";
  o.local_world_size = 2;
  o.master_port = 29600;
  o.join_timeout = Duration(20000);
  o.last_call_timeout = Duration(1000);
  o.close_timeout = Duration(3000);
  o.keep_alive_interval = Duration(500);
  o.keep_alive_max_attempt = 3;
  long watch_ms = 0;
  int rounds = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--store") store = v;
    else if (a == "--id") o.node_id = v;
    else if (a == "--addr") o.local_addr = v;
    else if (a == "--min") o.min_nodes = std::stoi(v);
    else if (a == "--max") o.max_nodes = std::stoi(v);
    else if (a == "--nproc") o.local_world_size = std::stoi(v);
    else if (a == "--token") token = v;
    else if (a == "--watch-ms") watch_ms = std::stol(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--keep-alive-ms") o.keep_alive_interval = Duration(std::stol(v));
    else {
      std::fprintf(stderr, "rendezvous_node: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  try {
    auto [host, port] = parse_host_port(store, "--store");
    ClientOptions c;
    c.host = host;
    c.port = port;
    c.token = token;
    // Bounded so a cut link or a dead store host is reported promptly.
    c.connect_timeout = Duration(3000);
    c.op_timeout = Duration(3000);
    c.reply_grace = Duration(1000);
    Rendezvous rdzv([c] { return std::make_unique<Client>(c); }, o);
    for (int n = 0; n < rounds; ++n) {
      RoundResult r = rdzv.next_round();
      std::printf("round=%lld group_rank=%d group_world_size=%d world_size=%d rank_base=%d master=%s:%d\n",
                  static_cast<long long>(r.round), r.group_rank, r.group_world_size, r.world_size,
                  r.rank_base, r.master_addr.c_str(), r.master_port);
      std::fflush(stdout);
      if (watch_ms <= 0) break;
      std::promise<RoundEnd> ended;
      auto f = ended.get_future();
      auto keep = rdzv.watch([&](const RoundEnd& e) { ended.set_value(e); });
      if (f.wait_for(std::chrono::milliseconds(watch_ms)) != std::future_status::ready) {
        std::printf("end=none\n");
        std::fflush(stdout);
        break;
      }
      RoundEnd e = f.get();
      std::string kind = kind_name(e.kind);  // "peer-dead": netns.sh reads "peer_dead"
      std::replace(kind.begin(), kind.end(), '-', '_');
      std::printf("end=%s reason=%s\n", kind.c_str(), e.reason.c_str());
      std::fflush(stdout);
      if (e.kind == RoundEnd::kStoreLost) break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_node: %s\n", e.what());
    return 1;
  }
  return 0;
}
