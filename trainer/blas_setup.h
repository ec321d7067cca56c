// OpenBLAS settings for the trainer's small GEMMs (batch 32, 784x256).
//
// OpenBLAS 0.3.21 (Debian bookworm) does not know recent Xeons (e.g. model
// 0xCF, Emerald Rapids) and falls back to its Prescott (SSE3) kernels: the
// MLP's GEMMs then run at ~20 GFLOP/s instead of ~75-100 with its AVX-512
// (SkylakeX) kernels. The kernel table is chosen when the library loads, so
// the only fix from inside the program is to re-execute it with
// OPENBLAS_CORETYPE set. An OPENBLAS_CORETYPE the user set is left alone.
#pragma once

namespace ddprun::trainer {

// When OpenBLAS chose Prescott kernels on a CPU (and OS) with AVX-512 or
// AVX2+FMA and OPENBLAS_CORETYPE is unset: sets it (SkylakeX or Haswell) and
// execv()s this program (its path from /proc/self/exe) with the same argv. Returns otherwise (also when
// the BLAS is not OpenBLAS or the exec fails).
void reexec_if_openblas_misdetects(char** argv);

// OpenBLAS keeps its own thread pool (it ignores at::set_num_threads): sets
// its thread count when the library is OpenBLAS; no-op otherwise.
void set_openblas_threads(int threads);

}  // namespace ddprun::trainer
