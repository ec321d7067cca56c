// train: data-parallel MLP or CNN training on the digits (or MNIST, or random data).
//
// Thin main: flags -> TrainOptions, environment -> WorkerInfo/StoreChoice,
// SIGTERM or SIGUSR1 (Slurm's --signal=USR1@90 early warning) -> a flag the
// training loop polls at step boundaries. Exit codes:
// 0 done (or stopped by the signal after checkpointing), 1 training failed,
// 2 bad flags or environment, 17 injected fault (--fail-at-step).
// --restart-scope=rank (DDPRUN_RESTART_SCOPE, DDPRUN_RECOVERY_FD,
// DDPRUN_GENERATION): the recovery channel, handed to run_training. A
// standby (DDPRUN_STANDBY, --standby-workers) has no RANK/LOCAL_RANK yet:
// run_training takes them from the agent's event=assign.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include "base/contract.h"
#include "base/procfs.h"
#include "trainer/blas_setup.h"
#include "trainer/error.h"
#include "trainer/log.h"
#include "trainer/nccl_communicator.h"
#include "trainer/recovery_channel.h"
#include "trainer/store_select.h"
#include "trainer/trainer.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;

extern "C" void on_sigterm(int sig) { g_stop = sig; }  // nonzero: which signal stopped us

// Integer environment variable; `fallback` when unset; exits 2 when malformed.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1000000) {
    std::fprintf(stderr, "train: environment %s=%s is not a non-negative integer\n", name, v);
    std::exit(2);
  }
  return int(x);
}

// The embedded digits: installed ones (<prefix>/share/ddprun/data/digits, the
// .deb's and `cmake --install`'s) beside the program, as ddprun finds its
// Python helpers; else the source tree's, for the build tree's program.
std::string default_data_dir() {
  return ddprun::base::installed_or(std::string(DDPRUN_DATA_INSTALL_DIR) + "/digits",
                                    "train-images-idx3-ubyte",
                                    std::string(DDPRUN_SOURCE_DIR) + "/data/digits");
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? std::string(v) : fallback;
}

// The flags of `train`: the training, the checkpoints, and the fault
// injection the tests use.
void define_flags(CLI::App& app, ddprun::trainer::TrainOptions& o, std::string& backend,
                  std::string& lr_scale) {
  app.add_option("--backend", backend,
                 "auto (nccl with a GPU build and GPU; else shm when all ranks share this host; "
                 "else gloo), gloo, nccl or shm")
      ->check(CLI::IsMember({"auto", "gloo", "nccl", "shm"}));
  app.add_option("--data", o.data_dir, "idx folder (train-*/t10k-* files)")->capture_default_str();
  app.add_flag("--synthetic", o.synthetic, "random data instead of --data (speed tests)");
  app.add_option("--model", o.model, "mlp (784-H-H-10) or cnn (two conv, two linear layers)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "hidden linear width")->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--lr-scale", lr_scale, "linear: multiply --lr by WORLD_SIZE")
      ->check(CLI::IsMember({"none", "linear"}))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--batch", o.batch, "samples per rank per step")->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps of the whole job")->capture_default_str();
  app.add_option("--seed", o.seed, "model init and shuffle seed")->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "gradient bucket size in MiB")->capture_default_str();
  app.add_option("--collective-timeout", o.collective_timeout_s,
                 "seconds a collective may take before the rank fails (NCCL: ncclCommAbort)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--check-params", o.check_params, "debug: verify parameters identical on every rank each step");
  app.add_option("--log-every", o.log_every, "rank 0 progress every N steps (0 = never)")->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "checkpoint folder [checkpoints/$TORCHELASTIC_RUN_ID]");
  app.add_option("--checkpoint-every", o.checkpoint_every, "checkpoint every N steps (0 = only on SIGTERM and at the end)")->capture_default_str();
  app.add_option("--keep", o.keep, "checkpoints kept")->capture_default_str();
  app.add_flag("!--no-resume", o.resume, "ignore existing checkpoints");
  app.add_option("--save-params", o.save_params, "rank 0 writes the final parameters (raw float32) here");
  app.add_option("--fail-at-step", o.fail_at_step,
                 "fault injection for tests: exit 17 after step N on the first attempt only")
      ->capture_default_str();
  app.add_option("--hang-at-step", o.hang_at_step,
                 "fault injection for tests: the last rank hangs after step N on the first attempt only")
      ->capture_default_str();
  app.add_option("--kill-at-step", o.kill_at_step,
                 "fault injection for tests: --kill-rank SIGKILLs itself in the middle of step N "
                 "(its first gradient all-reduce launched), on the first attempt only")
      ->capture_default_str();
  app.add_option("--throw-at-step", o.throw_at_step,
                 "fault injection for tests: --kill-rank fails with an error of its own (not a "
                 "collective's) in the middle of step N, on the first attempt only")
      ->capture_default_str();
  app.add_option("--kill-rank", o.kill_rank,
                 "the rank --kill-at-step and --throw-at-step pick (-1: the last rank)")
      ->capture_default_str();
  app.add_option("--recovery-timeout", o.recovery_timeout_s,
                 "--restart-scope=rank: seconds a rank whose collective failed waits for the "
                 "agent's event=failed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

// This worker's place in the job, from the torchrun environment.
ddprun::trainer::WorkerInfo worker_from_env() {
  ddprun::trainer::WorkerInfo w;
  w.rank = env_int(ddprun::base::kEnvRank, 0);
  w.world_size = env_int(ddprun::base::kEnvWorldSize, 1);
  w.local_rank = env_int(ddprun::base::kEnvLocalRank, 0);
  w.local_world_size = env_int(ddprun::base::kEnvLocalWorldSize, w.world_size);
  w.restart_count = env_int(ddprun::base::kEnvRestartCount, 0);
  w.under_ddprun = std::getenv(ddprun::base::kEnvStoreAddr) != nullptr;
  w.master_addr = env_str(ddprun::base::kEnvMasterAddr, "127.0.0.1");
  return w;
}

// Which store the worker's process group uses, and where it is.
ddprun::trainer::StoreChoice store_choice(const ddprun::trainer::WorkerInfo& w) {
  ddprun::trainer::StoreChoice sc;
  sc.ddprun_store = w.under_ddprun;
  sc.master_addr = w.master_addr;
  sc.master_port = env_int(ddprun::base::kEnvMasterPort, 29500);
  sc.agent_hosts_store = env_str(ddprun::base::kEnvUseAgentStore, "") == "True";
  sc.rank = w.rank;
  sc.world_size = w.world_size;
  sc.restart_count = w.restart_count;
  return sc;
}

int run(const ddprun::trainer::TrainOptions& o, const ddprun::trainer::WorkerInfo& w,
        const ddprun::trainer::StoreChoice& sc, ddprun::trainer::RecoveryChannel* channel);

}  // namespace

int main(int argc, char** argv) {
  using namespace ddprun::trainer;
  reexec_if_openblas_misdetects(argv);  // first: it may restart the program
  TrainOptions o;
  o.data_dir = default_data_dir();
  std::string backend = "auto";
  std::string lr_scale = "none";
  CLI::App app{"train: LibTorch data-parallel trainer (run it under ddprun or torchrun)"};
  define_flags(app, o, backend, lr_scale);
  CLI11_PARSE(app, argc, argv);
  o.lr_scale_linear = lr_scale == "linear";
  // One folder per job: a restart of this job resumes from it, a new job
  // (standalone run ids are fresh) starts clean; --rdzv-id resumes across jobs.
  if (o.checkpoint_dir.empty())
    o.checkpoint_dir = "checkpoints/" + env_str(ddprun::base::kEnvRunId, "default");
  o.backend = backend == "gloo" ? Backend::kGloo : backend == "nccl" ? Backend::kNccl
                                                   : backend == "shm"  ? Backend::kShm
                                                                       : Backend::kAuto;

  if (o.backend == Backend::kNccl) {
    // Before anything else prints: no GPU (or no NCCL build) is one line.
    std::string why;
    if (!nccl_available(&why)) {
      std::fprintf(stderr, "train: --backend nccl: %s\n", why.c_str());
      return 1;
    }
  }

  const WorkerInfo w = worker_from_env();
  if (w.world_size < 1 || w.rank >= w.world_size) {
    std::fprintf(stderr, "train: RANK=%d is not below WORLD_SIZE=%d\n", w.rank, w.world_size);
    return 2;
  }
  set_log_rank(w.rank);

  std::optional<RecoveryChannel> channel;
  try {
    const RecoveryEnv re = parse_recovery_env(
        std::getenv(ddprun::base::kEnvRestartScope), std::getenv(ddprun::base::kEnvRecoveryFd),
        std::getenv(ddprun::base::kEnvGeneration), std::getenv(ddprun::base::kEnvStandby));
    if (re.rank_scope) channel.emplace(re.fd, re.generation, re.standby);
    // Its store is ddprun's, which no rank hosts: the rank it will get does
    // not change how it connects.
    if (re.standby && !w.under_ddprun) {
      throw TrainerError(std::string(ddprun::base::kEnvStandby) + " is set without " +
                         ddprun::base::kEnvStoreAddr + ": a standby runs under ddprun only");
    }
    if (re.standby) set_log_standby(re.standby);
  } catch (const TrainerError& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 2;
  }

  const StoreChoice sc = store_choice(w);

  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);

  const int code = run(o, w, sc, channel ? &*channel : nullptr);
  if (channel) {
    // Rank scope: a communicator abandoned in a recovery may still have
    // gloo threads running; static destructors must not run under them.
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

namespace {

int run(const ddprun::trainer::TrainOptions& o, const ddprun::trainer::WorkerInfo& w,
        const ddprun::trainer::StoreChoice& sc, ddprun::trainer::RecoveryChannel* channel) {
  using namespace ddprun::trainer;
  try {
    if (w.rank == 0 && (channel == nullptr || channel->standby() == 0)) {
      const std::string where = sc.ddprun_store ? "the ddprun store (DDPRUN_STORE_ADDR)"
                                                : "c10d::TCPStore at " + sc.master_addr + ":" +
                                                      std::to_string(sc.master_port);
      log_info("%d ranks meet through %s", w.world_size, where.c_str());
    }
    const TrainResult r = run_training(o, w, make_store(sc), &g_stop, channel);
    if (r.stopped_by_signal) {
      log_warn("stopped by %s after step %lld", g_stop == SIGUSR1 ? "SIGUSR1" : "SIGTERM",
               (long long)r.steps_done);
      return 0;
    }
    std::printf("%s\n", final_line(r).c_str());
    std::fflush(stdout);
    return 0;
  } catch (const TrainerError& e) {
    log_error("%s", e.what());
  } catch (const c10::Error& e) {
    log_error("LibTorch: %s", e.what_without_backtrace());
  } catch (const std::exception& e) {
    log_error("%s", e.what());
  }
  return 1;
}

}  // namespace
