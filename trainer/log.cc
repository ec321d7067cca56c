// See log.h: the one trainer TU with spdlog, and no LibTorch header.
#include "trainer/log.h"

#include <cstdarg>
#include <cstdio>
#include <string>

#include <spdlog/spdlog.h>

namespace ddprun::trainer {
namespace {

std::string vformat(const char* format, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(size_t(n) + 1, '\0');
  std::vsnprintf(out.data(), out.size(), format, args);
  out.resize(size_t(n));
  return out;
}

}  // namespace

void set_log_rank(int rank) {
  spdlog::set_pattern("[%H:%M:%S.%e] [train rank " + std::to_string(rank) + "] [%l] %v");
}

void set_log_standby(int number) {
  spdlog::set_pattern("[%H:%M:%S.%e] [train standby " + std::to_string(number) + "] [%l] %v");
}

void log_info(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const std::string line = vformat(format, args);
  va_end(args);
  spdlog::info("{}", line);
}

void log_warn(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const std::string line = vformat(format, args);
  va_end(args);
  spdlog::warn("{}", line);
}

void log_error(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const std::string line = vformat(format, args);
  va_end(args);
  spdlog::error("{}", line);
}

}  // namespace ddprun::trainer
