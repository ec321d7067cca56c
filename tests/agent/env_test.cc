// Workers get torchrun's exact environment.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "tests/agent/ddprun_process.h"
#include "tests/common/env_file.h"
#include "tests/common/run_folder.h"
#include "tests/common/temp_dir.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

TEST_CASE("every worker gets torchrun's variables with the right values") {
  TempDir dir;
  std::string logs = dir.path() + "/logs";
  auto r = run_ddprun({"--nproc-per-node=3", "--max_restarts=2", "--rdzv-id=job7", "--log-dir",
                       logs, TEST_WORKER, "env", dir.path() + "/env"},
                      {"OMP_NUM_THREADS=", "NCCL_ASYNC_ERROR_HANDLING=0"});
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.status == 0);
  const std::string run = run_folder(logs, "job7");
  REQUIRE(!run.empty());
  CHECK(r.err.find("logs go to " + run) != std::string::npos);
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = read_env(dir.path() + "/env." + std::to_string(rank));
    CAPTURE(rank);
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["LOCAL_RANK"] == std::to_string(rank));
    CHECK(env["WORLD_SIZE"] == "3");
    CHECK(env["LOCAL_WORLD_SIZE"] == "3");
    CHECK(env["GROUP_RANK"] == "0");
    CHECK(env["GROUP_WORLD_SIZE"] == "1");
    CHECK(env["ROLE_RANK"] == std::to_string(rank));
    CHECK(env["ROLE_NAME"] == "default");
    CHECK(env["ROLE_WORLD_SIZE"] == "3");
    CHECK(env["MASTER_ADDR"] == "127.0.0.1");
    CHECK(std::stoi(env["MASTER_PORT"]) > 0);
    if (rank == 0) port = env["MASTER_PORT"];
    CHECK(env["MASTER_PORT"] == port);
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "2");
    CHECK(env["TORCHELASTIC_RUN_ID"] == "job7");
    CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");  // torchrun 2.x's
    CHECK(env["TORCHELASTIC_ERROR_FILE"] ==
          run + "/attempt_0/" + std::to_string(rank) + "/error.json");
    CHECK(env["DDPRUN_LOG_DIR"] == run + "/attempt_0");
    // The heartbeat socket is in the agent's private folder, not the logs.
    CHECK(env["DDPRUN_HEARTBEAT_SOCKET"].find("/ddprun-agent.") != std::string::npos);
    CHECK(env["DDPRUN_HEARTBEAT_SOCKET"].rfind(logs, 0) != 0);
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    // Set by the user: kept, as torchrun does.
    CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "0");
    // Set but empty counts as set.
    CHECK(env["OMP_NUM_THREADS"] == "");
  }
}

TEST_CASE("OMP_NUM_THREADS is 1 with several workers and untouched with one") {
  TempDir dir;
  std::vector<std::string> no_omp;
  if (getenv("OMP_NUM_THREADS")) unsetenv("OMP_NUM_THREADS");
  auto r = run_ddprun({"--nproc-per-node=2", TEST_WORKER, "env", dir.path() + "/two"});
  REQUIRE(r.status == 0);
  CHECK(read_env(dir.path() + "/two.0")["OMP_NUM_THREADS"] == "1");
  CHECK(count_of(r.err, "OMP_NUM_THREADS=1") == 1);  // one short notice
  r = run_ddprun({"--nproc-per-node=1", TEST_WORKER, "env", dir.path() + "/one"});
  REQUIRE(r.status == 0);
  CHECK(read_env(dir.path() + "/one.0").count("OMP_NUM_THREADS") == 0);
  // Without --log-dir the error file lives in the agent's private folder,
  // which is removed at exit.
  std::string error_file = read_env(dir.path() + "/one.0")["TORCHELASTIC_ERROR_FILE"];
  CHECK(error_file.find("/ddprun-agent.") != std::string::npos);
  CHECK_FALSE(fs::exists(fs::path(error_file).parent_path()));
}

TEST_CASE("PET_ variables stand in for flags and the program's arguments pass untouched") {
  TempDir dir;
  auto r = run_ddprun({TEST_WORKER, "env", dir.path() + "/pet"},
                      {"PET_NPROC_PER_NODE=2", "PET_ROLE=trainer", "PET_MASTER_PORT=29877"});
  REQUIRE(r.status == 0);
  auto env = read_env(dir.path() + "/pet.1");
  CHECK(env["WORLD_SIZE"] == "2");
  CHECK(env["ROLE_NAME"] == "trainer");
  CHECK(env["MASTER_PORT"] == "29877");
}
