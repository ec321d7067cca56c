// The trainer's log lines (spdlog underneath), through a header that pulls in
// neither spdlog nor fmt.
//
// Why: the PyPI torch wheel ships fmt 12 headers in its include folder, and
// they shadow Debian's fmt 9 that Debian's spdlog is built against, so a
// translation unit that includes LibTorch cannot include spdlog (the CUDA
// build, scripts/build-cuda.sh, failed exactly there). Translation units that
// include LibTorch log through these functions; log.cc, which includes spdlog
// and no LibTorch header, lives in the torch-free ddprun_trainer_core.
// printf-style, so -Wformat checks every call at compile time.
#pragma once

namespace ddprun::trainer {

// Every later line reads "[time] [train rank <rank>] [level] message".
void set_log_rank(int rank);
// "[train standby <n>]" instead, for a standby without a rank yet.
void set_log_standby(int number);

void log_info(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char* format, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ddprun::trainer
