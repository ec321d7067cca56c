// What both rank-scope recovery tests share (recovery_test.cc plays the
// agent, recovery_ddprun_test.cc runs the real one): the final parameters'
// digest and the trial knobs. DDPRUN_RECOVERY_SEED repeats a run's random
// kill steps and ranks; DDPRUN_RECOVERY_TRIALS sets the trials (default 5).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "trainer/checkpoint.h"

namespace ddprun::trainer::testing {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// sha256 of the --save-params file; a text naming the file when it is
// missing or empty, so a comparison fails with the reason.
inline std::string sha_of(const std::string& path) {
  const std::string bytes = slurp(path);
  if (bytes.empty()) return "(no file " + path + ")";
  return sha256_hex(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

inline uint64_t seed_from_env() {
  if (const char* s = std::getenv("DDPRUN_RECOVERY_SEED"); s != nullptr && *s != '\0')
    return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

inline int trials_from_env() {
  const char* s = std::getenv("DDPRUN_RECOVERY_TRIALS");
  return s != nullptr && std::atoi(s) > 0 ? std::atoi(s) : 5;
}

}  // namespace ddprun::trainer::testing
