// ddprun-store: the rendezvous store on a machine of its own.
//   ddprun-store --port 29400 [--host 0.0.0.0] [--token-file FILE]
// The token comes from --token-file, else DDPRUN_RDZV_TOKEN (the name every
// node uses; the old DDPRUN_STORE_TOKEN is read with a warning), and is never
// printed. An empty token from any source is refused (exit 2): it would turn
// authentication off. Runs until SIGINT/SIGTERM.
#include <malloc.h>
#include <sys/stat.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/fd_limit.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "rendezvous/store.h"

namespace rdzv = ddprun::rendezvous;

int main(int argc, char** argv) {
  CLI::App app{"ddprun-store: the ddprun rendezvous key-value store"};
  rdzv::ServerOptions options;
  std::string token_file;
  app.add_option("--host", options.host, "address to bind")->capture_default_str();
  app.add_option("--port", options.port, "TCP port (0 = pick a free one)")->required();
  app.add_option("--token-file", token_file,
                 "file holding the shared secret (default: env DDPRUN_RDZV_TOKEN)");
  app.add_option("--max-connections", options.max_connections, "connection limit")
      ->capture_default_str();
  app.add_option("--max-connections-per-peer", options.max_connections_per_peer,
                 "connections one peer address may hold")
      ->capture_default_str();
  app.add_option("--max-store-bytes", options.max_store_bytes,
                 "memory for keys and values, each entry's bookkeeping included")
      ->capture_default_str();
  app.add_option("--max-buffered-bytes", options.max_buffered_bytes,
                 "bytes all connections may buffer together (requests, blocked waits, replies)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (!token_file.empty()) {
    std::ifstream f(token_file);
    if (!f) {
      spdlog::error("ddprun-store: cannot read --token-file {}", token_file);
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    options.token = ss.str();
    while (!options.token.empty() && (options.token.back() == '\n' || options.token.back() == '\r')) {
      options.token.pop_back();
    }
    if (options.token.empty()) {
      spdlog::error("ddprun-store: --token-file {} is empty", token_file);
      return 2;
    }
    // A secret others can read is no secret: anyone on the machine could join
    // or stall the store. Warn rather than refuse (a shared cluster folder may
    // be readable by a trusted group on purpose).
    struct stat st {};
    if (::stat(token_file.c_str(), &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
      spdlog::warn("ddprun-store: --token-file {} is readable by {} (mode {:04o}): chmod 600 it",
                   token_file, (st.st_mode & S_IROTH) ? "every user" : "its group",
                   st.st_mode & 07777);
    }
  } else {
    try {
      options.token = rdzv::token_from_env();
    } catch (const rdzv::StoreError& e) {
      spdlog::error("ddprun-store: {}", e.what());
      return 2;
    }
  }

  // Buffers over 256 KiB (frames, replies) get their own mappings and go
  // back to the system when freed; glibc's default raises this threshold
  // after the first free, and memory an attack made it hold would then
  // stay resident after the attack.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  uint64_t fds = ddprun::base::raise_fd_limit().soft;
  try {
    boost::asio::io_context io;
    rdzv::Server server(io, options);
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](boost::system::error_code ec, int sig) {
      if (ec) return;
      spdlog::info("ddprun-store: signal {}, shutting down", sig);
      server.close();
      io.stop();
    });
    auto ep = server.endpoint();
    spdlog::info("ddprun-store: listening on {}:{} (auth {}, fd limit {})", ep.address().to_string(),
                 ep.port(), options.token.empty() ? "off" : "on", fds);
    io.run();
  } catch (const rdzv::StoreError& e) {
    spdlog::error("ddprun-store: {}", e.what());
    return 1;
  }
  return 0;
}
