// The names ddprun's components agree on: every environment variable and
// file name that one component (or the user, or torch) writes and another
// reads. Each is spelled here once; the C++ code uses these constants, and
// docs/CONTRACTS.md describes each one. tests/base/contract_test.cc fails
// when a name here is missing from CONTRACTS.md (or the reverse), when C++
// outside this file spells one as a string literal, or when the Python
// helpers (watchdog/python/ddprun_heartbeat.py,
// introspect/python/sitecustomize.py), which cannot include this file, read
// a name that is not here.
//
// Header only, constants only: anything may include it (base/ has no
// dependencies). Lines here are parsed by that test: one
// `inline constexpr const char* kName = "value";` a line.
#pragma once

namespace ddprun::base {

// --- torchrun's worker environment (torch/distributed/elastic, 1.13 and
// 2.x): the agent sets these; workers (train, torch, user scripts) read them.
inline constexpr const char* kEnvRank = "RANK";
inline constexpr const char* kEnvLocalRank = "LOCAL_RANK";
inline constexpr const char* kEnvWorldSize = "WORLD_SIZE";
inline constexpr const char* kEnvLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvGroupRank = "GROUP_RANK";
inline constexpr const char* kEnvGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kEnvRoleRank = "ROLE_RANK";
inline constexpr const char* kEnvRoleName = "ROLE_NAME";
inline constexpr const char* kEnvRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kEnvMasterAddr = "MASTER_ADDR";
inline constexpr const char* kEnvMasterPort = "MASTER_PORT";
inline constexpr const char* kEnvRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kEnvMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kEnvRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kEnvUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
// Where a worker's torch `@record` writes its error (agent/error_file.h).
inline constexpr const char* kEnvErrorFile = "TORCHELASTIC_ERROR_FILE";
// torch 2.x: the launcher's --signals-to-handle, as given.
inline constexpr const char* kEnvSignalsToHandle = "TORCHELASTIC_SIGNALS_TO_HANDLE";
// Set to 1 unless inherited, as torchrun does.
inline constexpr const char* kEnvTorchNcclAsync = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr const char* kEnvNcclAsync = "NCCL_ASYNC_ERROR_HANDLING";
// 1 for each of several workers unless inherited.
inline constexpr const char* kEnvOmpNumThreads = "OMP_NUM_THREADS";
// Python workers: the heartbeat client's and sitecustomize's folders first.
inline constexpr const char* kEnvPythonPath = "PYTHONPATH";
// --virtual-local-rank: the rank's one GPU (also read by the launcher).
inline constexpr const char* kEnvCudaVisibleDevices = "CUDA_VISIBLE_DEVICES";
// torch's FileTimerClient: "1" in the agent's environment turns the
// watchdog's FIFO server on; the FIFO's path then goes to the workers.
inline constexpr const char* kEnvEnableFileTimer = "TORCHELASTIC_ENABLE_FILE_TIMER";
inline constexpr const char* kEnvTimerFile = "TORCHELASTIC_TIMER_FILE";
// Python workers while a hang detector is on, unless the user set it.
inline constexpr const char* kEnvPythonFaultHandler = "PYTHONFAULTHANDLER";

// --- ddprun's own worker environment.
// host:port of the job's store (rendezvous/wire.h); read by the trainer.
inline constexpr const char* kEnvStoreAddr = "DDPRUN_STORE_ADDR";
// The store's shared secret: set by the user for ddprun and ddprun-store,
// and by the agent for its workers.
inline constexpr const char* kEnvRdzvToken = "DDPRUN_RDZV_TOKEN";
// The old name of kEnvRdzvToken, still read with a warning.
inline constexpr const char* kEnvOldStoreToken = "DDPRUN_STORE_TOKEN";
inline constexpr const char* kEnvStorePrefix = "DDPRUN_STORE_PREFIX";
// The agent's heartbeat socket (watchdog/heartbeat_wire.h).
inline constexpr const char* kEnvHeartbeatSocket = "DDPRUN_HEARTBEAT_SOCKET";
inline constexpr const char* kEnvLogDir = "DDPRUN_LOG_DIR";
// Only where the agent has no job cgroup: the guardian finds the job's
// processes by it in /proc/<pid>/environ after ddprun was SIGKILLed.
inline constexpr const char* kEnvContainmentToken = "DDPRUN_CONTAINMENT_TOKEN";
// Python workers: sitecustomize's faulthandler signal and output folder.
inline constexpr const char* kEnvPyStackSignal = "DDPRUN_PYSTACK_SIGNAL";
inline constexpr const char* kEnvPyStackDir = "DDPRUN_PYSTACK_DIR";

// --- What the user gives ddprun (besides flags and PET_* fallbacks).
// "off": no job cgroup.
inline constexpr const char* kEnvCgroup = "DDPRUN_CGROUP";
// The Python interpreter of .py programs: torchrun's name first, then ours.
inline constexpr const char* kEnvPythonExec = "PYTHON_EXEC";
inline constexpr const char* kEnvDdprunPython = "DDPRUN_PYTHON";
// The --stdin-rank fallback.
inline constexpr const char* kEnvStdinRank = "DDPRUN_STDIN_RANK";
// --- --restart-scope=rank (docs/RECOVERY.md): the recovery channel.
inline constexpr const char* kEnvRestartScope = "DDPRUN_RESTART_SCOPE";
// An inherited AF_UNIX SOCK_SEQPACKET socket: the agent's failed/ready/
// fallback messages in, the worker's joined messages out.
inline constexpr const char* kEnvRecoveryFd = "DDPRUN_RECOVERY_FD";
// The generation a worker starts in: 0, or G for generation G's replacement.
inline constexpr const char* kEnvGeneration = "DDPRUN_GENERATION";
// Set in a pre-started standby worker (--standby-workers), to its number in
// the attempt (1, 2, ...): it has no RANK/LOCAL_RANK yet and waits on its
// recovery channel for event=assign.
inline constexpr const char* kEnvStandby = "DDPRUN_STANDBY";
// "0": ignore the Slurm step ddprun runs in.
inline constexpr const char* kEnvSlurm = "DDPRUN_SLURM";
// Where agents register for `ddprun status` (default: $XDG_RUNTIME_DIR/
// ddprun/agents, else /tmp/ddprun-<uid>/agents).
inline constexpr const char* kEnvRegistryDir = "DDPRUN_REGISTRY_DIR";
// A file the agent appends its formation phases to (base/phase_trace.h;
// bench/agents_scale.py).
inline constexpr const char* kEnvPhaseTrace = "DDPRUN_PHASE_TRACE";
// `ddprun doctor`: read /proc and /sys below this folder instead.
inline constexpr const char* kEnvDoctorRoot = "DDPRUN_DOCTOR_ROOT";
inline constexpr const char* kEnvXdgRuntimeDir = "XDG_RUNTIME_DIR";
inline constexpr const char* kEnvTmpDir = "TMPDIR";

// --- What `ddprun attach --on-hang=CMD` gives CMD.
inline constexpr const char* kEnvHangRank = "DDPRUN_HANG_RANK";
inline constexpr const char* kEnvHangPid = "DDPRUN_HANG_PID";
inline constexpr const char* kEnvHangReport = "DDPRUN_HANG_REPORT";

// --- Files in the agent's private folder (agent/runtime_dir.h).
// The folder: <base>/ddprun-agent.XXXXXX (mkdtemp).
inline constexpr const char* kFileAgentDirPrefix = "ddprun-agent.";
// flock()ed while the agent lives; a free lock marks a stale folder.
inline constexpr const char* kFileLock = "lock";
// Beside those folders, one per user: .ddprun-sweep.<uid>, whose mtime is
// when that user's last sweep of stale folders began.
inline constexpr const char* kFileSweepMarkPrefix = ".ddprun-sweep.";
inline constexpr const char* kFileHeartbeatSocket = "heartbeat.sock";
inline constexpr const char* kFileTimerFifo = "watchdog_timer";
// The control socket of `ddprun status` and `ddprun stacks`.
inline constexpr const char* kFileControlSocket = "control.sock";
// kEnvPyStackDir: pystack/pystack_<pid>.txt, one per Python worker.
inline constexpr const char* kFilePyStackDir = "pystack";
inline constexpr const char* kFilePyStackPrefix = "pystack_";

// --- Files in the run folder (--log-dir/<run id>/).
inline constexpr const char* kFileEvents = "events.jsonl";
// Every line ddprun itself logged (agent/log_sink.h), shown or not.
inline constexpr const char* kFileAgentLog = "ddprun.log";
// attempt_<n>/, one per attempt, holding <local rank>/ of each worker.
inline constexpr const char* kFileAttemptDirPrefix = "attempt_";
// attempt_<n>/standby_<k>/: standby k's logs (--standby-workers); it keeps
// writing there once assigned a rank.
inline constexpr const char* kFileStandbyDirPrefix = "standby_";
inline constexpr const char* kFileStdoutLog = "stdout.log";
inline constexpr const char* kFileStderrLog = "stderr.log";
// The worker's kEnvErrorFile, in its <local rank>/ folder.
inline constexpr const char* kFileErrorJson = "error.json";
// In the attempt's folder after a hang (and `ddprun attach --report-dir`).
inline constexpr const char* kFileHangReportJson = "hang_report.json";
inline constexpr const char* kFileHangReportText = "hang_report.txt";
// stack_rank<R>.txt: a hung native worker's stacks.
inline constexpr const char* kFileStackPrefix = "stack_rank";

}  // namespace ddprun::base
