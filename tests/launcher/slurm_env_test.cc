// Slurm: hostlist expansion, the step's settings, and the command line
// taking them under srun unless a flag or PET_* variable says otherwise.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>

#include <map>

#include "launcher/cli.h"
#include "launcher/slurm_env.h"

using ddprun::launcher::expand_hostlist;
using ddprun::launcher::slurm_step;
using ddprun::launcher::SlurmError;
using Hosts = std::vector<std::string>;

namespace {

std::string error_of(const std::string& list) {
  try {
    expand_hostlist(list);
  } catch (const SlurmError& e) {
    return e.what();
  }
  return "";
}

ddprun::launcher::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

const std::map<std::string, std::string> kStep = {
    {"SLURM_JOB_ID", "4242"},         {"SLURM_STEP_ID", "0"},
    {"SLURM_STEP_NUM_NODES", "3"},    {"SLURM_STEP_NUM_TASKS", "3"},
    {"SLURM_NODEID", "2"},            {"SLURM_STEP_NODELIST", "gpu[07-08],login1"},
    {"SLURM_JOB_NODELIST", "gpu[01-09],login1"}};

struct ScopedEnv {
  explicit ScopedEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {
    for (const auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : vars_) unsetenv(k.c_str());
  }
  std::map<std::string, std::string> vars_;
};

ddprun::launcher::ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return ddprun::launcher::parse_command_line(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("hostlists expand as scontrol show hostnames does") {
  CHECK(expand_hostlist("node1") == Hosts{"node1"});
  CHECK(expand_hostlist("gpu[01-04,07],login1") ==
        Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"});
  CHECK(expand_hostlist("n[8-11]") == Hosts{"n8", "n9", "n10", "n11"});
  CHECK(expand_hostlist("n[098-101]") == Hosts{"n098", "n099", "n100", "n101"});
  CHECK(expand_hostlist("rack[1-2]-gpu[1,3]") ==
        Hosts{"rack1-gpu1", "rack1-gpu3", "rack2-gpu1", "rack2-gpu3"});
  CHECK(expand_hostlist("a[1],b.example.org,c[2-3].x") ==
        Hosts{"a1", "b.example.org", "c2.x", "c3.x"});
}

TEST_CASE("malformed hostlists are refused naming the part") {
  CHECK(error_of("gpu[01-04") == "Slurm host list 'gpu[01-04': unclosed '['");
  CHECK(error_of("gpu01-04]") == "Slurm host list 'gpu01-04]': unmatched ']'");
  CHECK(error_of("gpu[4-1]") == "Slurm host list 'gpu[4-1]': range '4-1' runs backwards");
  CHECK(error_of("gpu[a-b]") == "Slurm host list 'gpu[a-b]': 'a-b' is not N or N-M");
  CHECK(error_of("a,,b") == "Slurm host list 'a,,b': empty host name");
  CHECK(error_of("") == "Slurm host list '': empty host name");
  CHECK(error_of("n[1-99999999]") == "Slurm host list 'n[1-99999999]': range '1-99999999' is too large");
}

TEST_CASE("an srun step gives nodes, rank, first host, port and run id") {
  auto s = slurm_step(env_of(kStep));
  REQUIRE(s);
  CHECK(s->nnodes == 3);
  CHECK(s->node_rank == 2);
  CHECK(s->first_host == "gpu07");  // the step's list, not the job's
  CHECK(s->port == 29400 + 242);
  CHECK(s->run_id == "slurm-4242.0");

  auto job_only = kStep;
  job_only.erase("SLURM_STEP_NODELIST");
  job_only.erase("SLURM_STEP_NUM_NODES");
  job_only.erase("SLURM_STEP_NUM_TASKS");
  job_only["SLURM_JOB_NUM_NODES"] = "10";
  s = slurm_step(env_of(job_only));
  REQUIRE(s);
  CHECK(s->first_host == "gpu01");
  CHECK(s->nnodes == 10);
}

TEST_CASE("outside srun, or with DDPRUN_SLURM=0, Slurm is not consulted") {
  CHECK_FALSE(slurm_step(env_of({})));
  auto batch = kStep;  // the batch script itself has a job but no step
  batch.erase("SLURM_STEP_ID");
  CHECK_FALSE(slurm_step(env_of(batch)));
  auto off = kStep;
  off["DDPRUN_SLURM"] = "0";
  CHECK_FALSE(slurm_step(env_of(off)));
}

TEST_CASE("a step with several tasks a node, or a broken variable, is one clear error") {
  auto many = kStep;
  many["SLURM_STEP_NUM_TASKS"] = "12";
  CHECK_THROWS_WITH_AS(slurm_step(env_of(many)),
                       "this srun step runs 12 tasks on 3 nodes; ddprun starts the workers itself: "
                       "use one task per node (srun --ntasks-per-node=1), or set DDPRUN_SLURM=0",
                       SlurmError);
  auto bad = kStep;
  bad["SLURM_NODEID"] = "x";
  CHECK_THROWS_WITH_AS(slurm_step(env_of(bad)),
                       "Slurm's SLURM_NODEID=x: expected an integer >= 0", SlurmError);
}

TEST_CASE("under srun the command line takes Slurm's settings; flags and PET_* win") {
  unsetenv("PET_NNODES");
  unsetenv("PET_RDZV_ENDPOINT");
  ScopedEnv env(kStep);
  auto r = parse({"train"});
  CHECK(r.options.min_nodes == 3);
  CHECK(r.options.max_nodes == 3);
  CHECK(r.options.node_rank == 2);
  CHECK(r.options.rdzv_backend == "c10d");
  CHECK(r.options.rdzv_endpoint == "gpu07:29642");
  CHECK(r.options.run_id == "slurm-4242.0");
  REQUIRE(r.notes.size() == 1);
  CHECK(r.notes[0] ==
        "from Slurm: --nnodes=3 --node-rank=2 --rdzv-backend=c10d --rdzv-endpoint=gpu07:29642 "
        "--rdzv-id=slurm-4242.0 --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 "
        "(flags and PET_* variables override)");
  CHECK(r.options.signals_to_handle ==
        std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});

  r = parse({"--nnodes=2:3", "--rdzv-endpoint=head:1234", "--rdzv-id=mine",
             "--signals-to-handle=SIGTERM,SIGUSR1", "train"});
  CHECK(r.options.min_nodes == 2);
  CHECK(r.options.rdzv_endpoint == "head:1234");
  CHECK(r.options.run_id == "mine");
  REQUIRE(r.notes.size() == 1);
  CHECK(r.notes[0] == "from Slurm: --node-rank=2 --rdzv-backend=c10d "
                      "(flags and PET_* variables override)");

  {
    ScopedEnv pet({{"PET_NNODES", "1:3"}, {"PET_RDZV_ENDPOINT", "svc:29400"}});
    r = parse({"train"});
    CHECK(r.options.min_nodes == 1);
    CHECK(r.options.rdzv_endpoint == "svc:29400");
  }

  r = parse({"--standalone", "train"});  // single-node on purpose: Slurm not consulted
  CHECK(r.options.max_nodes == 1);
  CHECK(r.notes.empty());

  ScopedEnv many(std::map<std::string, std::string>{{"SLURM_STEP_NUM_TASKS", "6"}});
  CHECK_THROWS_AS(parse({"train"}), ddprun::launcher::UsageError);
}
