// The operations store_bench needs, for both stores, and the TCPStore side
// behind plain functions.
//
// Why a separate translation unit for TCPStore: the PyPI torch wheel ships
// fmt 12 headers that shadow Debian's fmt 9, which Debian's spdlog (used by
// the ddprun side) is built against, so one file cannot include both
// (trainer/log.h has the same reason).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddprun::bench {

struct BenchClient {
  virtual ~BenchClient() = default;
  virtual void set(const std::string& k, const std::vector<uint8_t>& v) = 0;
  virtual std::vector<uint8_t> get(const std::string& k) = 0;
  virtual int64_t add(const std::string& k, int64_t d) = 0;
};

// False when store_bench was built without LibTorch; the rest are then unused.
bool have_tcpstore();
// "c10d::TCPStore 2.15.0 (libuv server)" and the like, for the report.
std::string tcpstore_description();
std::unique_ptr<BenchClient> connect_tcpstore(const std::string& host, uint16_t port);
// Runs a TCPStore server on 127.0.0.1, an ephemeral port: prints "PORT <n>"
// on stdout, then serves until stdin reaches end of file.
int serve_tcpstore();

}  // namespace ddprun::bench
