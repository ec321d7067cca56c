// The command line: torchrun's flags in both spellings, defaults, PET_*
// fallbacks, program detection, pass-through, and one-line errors.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>

#include "launcher/cli.h"
#include "launcher/nproc.h"
#include "tests/agent/ddprun_process.h"
#include "tests/common/skip.h"

using ddprun::launcher::parse_command_line;
using ddprun::launcher::UsageError;

namespace {

ddprun::agent::Options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  auto r = parse_command_line(static_cast<int>(argv.size()), argv.data());
  REQUIRE_FALSE(r.help);
  return r.options;
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("torchrun's defaults") {
  unsetenv("DDPRUN_PYTHON");
  auto o = parse({"train"});
  CHECK(o.nproc_per_node == 1);
  CHECK(o.min_nodes == 1);
  CHECK(o.max_nodes == 1);
  CHECK(o.max_restarts == 0);
  CHECK(o.role == "default");
  // torchrun's "none" would make every single-node job share one id (log
  // folder, checkpoints): without --rdzv-id each job gets a fresh one.
  CHECK(o.run_id != "none");
  CHECK(o.run_id.size() >= 8);
  CHECK(parse({"train"}).run_id != o.run_id);
  CHECK(o.rdzv_backend == "static");
  CHECK(o.master_addr == "127.0.0.1");
  CHECK_FALSE(o.master_port.has_value());
  CHECK(o.term_timeout == std::chrono::seconds(30));
  CHECK(o.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(o.command == std::vector<std::string>{"train"});
  CHECK_FALSE(o.is_python);
  CHECK_FALSE(o.base_env.empty());
}

TEST_CASE("both spellings, = and space forms") {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--nproc-per-node=3", "--max-restarts", "2", "--rdzv-id=j", "--master-port=1234",
            "x"},
           {"--nproc_per_node", "3", "--max_restarts=2", "--rdzv_id", "j", "--master_port",
            "1234", "x"}}) {
    auto o = parse(args);
    CHECK(o.nproc_per_node == 3);
    CHECK(o.max_restarts == 2);
    CHECK(o.run_id == "j");
    CHECK(o.master_port == 1234);
  }
}

TEST_CASE("everything after the program is passed through untouched") {
  auto o = parse({"--nproc-per-node=2", "train", "--steps", "5", "--nproc-per-node=9", "-m"});
  CHECK(o.nproc_per_node == 2);
  CHECK(o.command == std::vector<std::string>{"train", "--steps", "5", "--nproc-per-node=9", "-m"});
  o = parse({"--", "train", "--x"});
  CHECK(o.command == std::vector<std::string>{"train", "--x"});
}

TEST_CASE("python scripts and modules run with $DDPRUN_PYTHON -u; flags override") {
  setenv("DDPRUN_PYTHON", "/usr/bin/python3", 1);
  auto o = parse({"train.py", "--lr", "1"});
  CHECK(o.command == std::vector<std::string>{"/usr/bin/python3", "-u", "train.py", "--lr", "1"});
  CHECK(o.is_python);
  o = parse({"-m", "pkg.train", "a"});
  CHECK(o.command == std::vector<std::string>{"/usr/bin/python3", "-u", "-m", "pkg.train", "a"});
  o = parse({"--no-python", "train.py"});
  CHECK(o.command == std::vector<std::string>{"train.py"});
  CHECK_FALSE(o.is_python);
  unsetenv("DDPRUN_PYTHON");
  CHECK(parse({"t.py"}).command[0] == "python3");
}

TEST_CASE("a program named like a Python interpreter runs as given and is a Python worker") {
  for (const std::string py : {"python", "python3", "/usr/bin/python3", "python3.11",
                               "./.venv/bin/python"}) {
    auto o = parse({py, "-u", "train.py"});
    CHECK(o.command == std::vector<std::string>{py, "-u", "train.py"});
    CHECK(o.is_python);
    CHECK(o.python_source == "the command line");
  }
  CHECK(parse({"--no-python", "python3", "x.py"}).is_python);  // still the interpreter
  CHECK_FALSE(parse({"pythonista", "x"}).is_python);
  CHECK_FALSE(parse({"python3-config"}).is_python);
  CHECK_FALSE(parse({"/opt/python3/bin/train"}).is_python);
}

TEST_CASE("PET_ environment variables stand in for flags; flags win") {
  setenv("PET_NPROC_PER_NODE", "4", 1);
  setenv("PET_MAX_RESTARTS", "3", 1);
  CHECK(parse({"x"}).nproc_per_node == 4);
  CHECK(parse({"x"}).max_restarts == 3);
  CHECK(parse({"--nproc-per-node=2", "x"}).nproc_per_node == 2);
  unsetenv("PET_NPROC_PER_NODE");
  unsetenv("PET_MAX_RESTARTS");
}

TEST_CASE("--nproc-per-node accepts auto, cpu and gpu") {
  CHECK(parse({"--nproc-per-node=cpu", "x"}).nproc_per_node ==
        static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  setenv("CUDA_VISIBLE_DEVICES", "0,3,5", 1);
  CHECK(parse({"--nproc-per-node=gpu", "x"}).nproc_per_node == 3);
  CHECK(parse({"--nproc-per-node=auto", "x"}).nproc_per_node == 3);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  CHECK(parse({"--nproc-per-node=auto", "x"}).nproc_per_node ==
        static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  CHECK(error_of({"--nproc-per-node=gpu", "x"}).find("--nproc-per-node=gpu: no GPU found") == 0);
  unsetenv("CUDA_VISIBLE_DEVICES");
  CHECK(ddprun::launcher::count_gpus("-1") == 0);
}

TEST_CASE("redirects, tee, filters, rdzv-conf and signals are interpreted") {
  auto o = parse({"-r", "0:1,2:3", "-t", "3", "--local-ranks-filter=0,2", "--rdzv-conf",
                  "timeout=10,join_timeout=5", "--signals-to-handle=SIGTERM,USR1", "x"});
  CHECK(o.redirects.for_rank(0) == 1);
  CHECK(o.redirects.for_rank(1) == 0);
  CHECK(o.redirects.for_rank(2) == 3);
  CHECK(o.tee.for_rank(7) == 3);
  CHECK(o.local_ranks_filter == std::set<int>{0, 2});
  CHECK(o.rdzv_conf.at("join_timeout") == "5");
  CHECK(o.signals_to_handle == std::vector<int>{SIGTERM, SIGUSR1});
  auto s = parse({"--standalone", "--rdzv-id=ignored", "x"});
  CHECK(s.standalone);
  CHECK(s.run_id != "ignored");
  CHECK(s.run_id.size() == 36);
}

TEST_CASE("wrong or conflicting flags name the flag") {
  CHECK(error_of({"--nproc-per-node=0", "x"}).find("--nproc-per-node=0") == 0);
  CHECK(error_of({"--nnodes=3:1", "x"}).find("--nnodes=3:1") == 0);
  CHECK(error_of({"--max-restarts=-1", "x"}).find("--max-restarts") == 0);
  CHECK(error_of({"--redirects=5", "x"}).find("--redirects=5") == 0);
  CHECK(error_of({"--signals-to-handle=SIGKILL", "x"}).find("--signals-to-handle") == 0);
  CHECK(error_of({"--rdzv-conf=novalue", "x"}).find("--rdzv-conf") == 0);
  CHECK(error_of({"--module", "--no-python", "x"}).find("--module and --no-python") == 0);
  CHECK(error_of({"--start-method=thread", "x"}).find("--start-method") != std::string::npos);
  CHECK(error_of({"--bogus", "x"}) == "unknown flag --bogus");
  // A standby only takes a failed rank's slot, which group scope never keeps.
  CHECK(error_of({"--standby-workers=1", "x"}) == "--standby-workers=1: needs --restart-scope=rank");
  CHECK(error_of({"--restart-scope=rank", "--standby-workers=-1", "x"}) ==
        "--standby-workers=-1: expected 0 to 64");
  CHECK(parse({"--restart-scope=rank", "--standby-workers=2", "x"}).standby_workers == 2);
  CHECK(parse({"x"}).standby_workers == 0);
  // Python scripts too: ddprun_recovery.wait_assigned() is their standby mode.
  CHECK(parse({"--restart-scope=rank", "--standby-workers=1", "train.py"}).standby_workers == 1);
  CHECK(error_of({}).find("missing the training program") == 0);
}

TEST_CASE("a bad flag exits 2 with one clear line; --help is grouped and exits 0") {
  using namespace ddprun::testing;
  auto r = run_ddprun({"--nproc_per_node=two", "train"});
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  CHECK(r.err ==
        "ddprun: --nproc-per-node=two: expected a positive integer, auto, cpu or gpu "
        "(see ddprun --help)\n");
  r = run_ddprun({"--max-restarts", "lots", "train"});
  CHECK(r.status == 2);
  CHECK(count_of(r.err, "\n") == 1);
  CHECK(r.err.find("--max-restarts") != std::string::npos);
  r = run_ddprun({"--standby-workers=1", "train"});
  CHECK(r.status == 2);
  CHECK(r.err == "ddprun: --standby-workers=1: needs --restart-scope=rank (see ddprun --help)\n");
  r = run_ddprun({"--help"});
  CHECK(r.status == 0);
  for (const char* group : {"Workers:", "Rendezvous:", "Program:", "Restarts and teardown:",
                            "Output:", "Exit status:", "--nproc-per-node,--nproc_per_node",
                            "--standby-workers,--standby_workers"})
    CHECK(r.out.find(group) != std::string::npos);
}

TEST_CASE("multi-node flags: backend, endpoint, token") {
  unsetenv("DDPRUN_RDZV_TOKEN");
  auto o = parse({"--nnodes=2:4", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400",
                  "--rdzv-conf=join_timeout=5,token=s3cret", "--local-addr=10.0.0.2", "x"});
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 4);
  CHECK(o.rdzv_token == "s3cret");
  CHECK(o.rdzv_conf.count("token") == 0);  // the secret travels apart from the conf
  CHECK(o.rdzv_conf.at("join_timeout") == "5");
  CHECK(o.local_addr == "10.0.0.2");
  setenv("DDPRUN_RDZV_TOKEN", "from-env", 1);
  CHECK(parse({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "x"}).rdzv_token ==
        "from-env");
  setenv("DDPRUN_RDZV_TOKEN", "", 1);  // empty would silently turn authentication off
  CHECK(error_of({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "x"})
            .find("DDPRUN_RDZV_TOKEN is set but empty") != std::string::npos);
  unsetenv("DDPRUN_RDZV_TOKEN");
  // static: the store goes where torchrun's would, at --master-addr:--master-port.
  auto s = parse({"--nnodes=2", "--master-addr=10.0.0.9", "--master-port=1234", "x"});
  CHECK(s.rdzv_endpoint == "10.0.0.9:1234");
  CHECK_FALSE(s.master_port.has_value());
  CHECK(error_of({"--nnodes=1:2", "x"}).find("--rdzv-backend=static needs a fixed --nnodes") == 0);
  // etcd (torchrun's etcd-v2 too) takes etcd's endpoint list; others are refused.
  auto e = parse({"--nnodes=2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=h:1,g:2",
                  "--rdzv-conf=cacert=/ca.pem,user=u", "x"});
  CHECK(e.rdzv_backend == "etcd-v2");
  CHECK(e.rdzv_endpoint == "h:1,g:2");
  CHECK(e.rdzv_conf.at("cacert") == "/ca.pem");
  CHECK(error_of({"--nnodes=2", "--rdzv-backend=etcd", "x"}).find("[,HOST:PORT...]") != std::string::npos);
  CHECK(error_of({"--nnodes=2", "--rdzv-backend=zookeeper", "--rdzv-endpoint=h:1", "x"})
            .find("--rdzv-backend=zookeeper: not supported") == 0);
  CHECK(error_of({"--nnodes=1:2", "--rdzv-backend=c10d", "x"}).find("needs --rdzv-endpoint") !=
        std::string::npos);
  CHECK(error_of({"--rdzv-conf=token=", "x"}).find("token= is empty") != std::string::npos);
}

TEST_CASE("--flag= with an empty value means the default and never takes the next argument") {
  unsetenv("PYTHON_EXEC");
  setenv("DDPRUN_PYTHON", "/usr/bin/python3", 1);
  auto o = parse({"--log-dir=", "train.py", "x"});
  CHECK(o.log_dir.empty());
  CHECK(o.command == std::vector<std::string>{"/usr/bin/python3", "-u", "train.py", "x"});
  o = parse({"--log-dir=", "--nproc-per-node=2", "p.py"});
  CHECK(o.log_dir.empty());
  CHECK(o.nproc_per_node == 2);
  CHECK(o.command == std::vector<std::string>{"/usr/bin/python3", "-u", "p.py"});
  o = parse({"--log-dir=", "train.py", "--epochs", "3"});
  CHECK(o.command == std::vector<std::string>{"/usr/bin/python3", "-u", "train.py", "--epochs", "3"});
  o = parse({"--rdzv-conf=", "--log-line-prefix-template=", "--log_dir=", "x", "y"});
  CHECK(o.rdzv_conf.empty());
  CHECK(o.log_line_prefix_template.empty());
  CHECK(o.command == std::vector<std::string>{"x", "y"});
  // Numbers and on/off flags too: the default, not 0 or the next argument.
  o = parse({"--term-timeout=", "--master-port=", "--stuck-timeout=", "--standalone=", "x"});
  CHECK(o.term_timeout == std::chrono::seconds(30));
  CHECK_FALSE(o.master_port.has_value());
  CHECK_FALSE(o.stuck_timeout.has_value());
  CHECK_FALSE(o.standalone);
  CHECK(o.command == std::vector<std::string>{"x"});
  // The space form with an empty argument is the same.
  o = parse({"--log-dir", "", "--nnodes", "", "x"});
  CHECK(o.log_dir.empty());
  CHECK(o.max_nodes == 1);
  CHECK(o.command == std::vector<std::string>{"x"});
  // A value that is itself "--flag=" stays a value after a flag that takes one.
  o = parse({"--role", "--x=", "prog"});
  CHECK(o.role == "--x=");
  // After the program nothing is touched.
  o = parse({"x", "--log-dir=", "y"});
  CHECK(o.command == std::vector<std::string>{"x", "--log-dir=", "y"});
  unsetenv("DDPRUN_PYTHON");
}

TEST_CASE("python: PYTHON_EXEC (torchrun's), then DDPRUN_PYTHON, then python3 from PATH") {
  setenv("PYTHON_EXEC", "/opt/py/bin/python", 1);
  setenv("DDPRUN_PYTHON", "/usr/bin/python3", 1);
  CHECK(parse({"t.py"}).command[0] == "/opt/py/bin/python");
  CHECK(parse({"-m", "pkg"}).command[0] == "/opt/py/bin/python");
  unsetenv("PYTHON_EXEC");
  CHECK(parse({"t.py"}).command[0] == "/usr/bin/python3");
  setenv("PYTHON_EXEC", "", 1);  // empty counts as unset
  CHECK(parse({"t.py"}).command[0] == "/usr/bin/python3");
  unsetenv("PYTHON_EXEC");
  unsetenv("DDPRUN_PYTHON");
  CHECK(parse({"t.py"}).command[0] == "python3");
}

TEST_CASE("a bad --rdzv-conf is a wrong flag: exit 2 naming the key") {
  CHECK(error_of({"--rdzv-conf=joint_timeout=5", "x"}).find("--rdzv-conf: unknown key 'joint_timeout'") == 0);
  CHECK(error_of({"--rdzv-conf=join_timeout=soon", "x"}).find("--rdzv-conf join_timeout=soon") == 0);
  using namespace ddprun::testing;
  for (auto conf : {"--rdzv-conf=join_timeout=soon", "--rdzv-conf=bogus=1", "--rdzv-conf=novalue"}) {
    auto r = run_ddprun({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1", conf,
                         "true"});
    INFO(conf, r.err);
    CHECK(r.status == 2);
    CHECK(count_of(r.err, "\n") == 1);
    CHECK(r.err.find("--rdzv-conf") != std::string::npos);
  }
}

TEST_CASE("ddprun runs the program after an empty --log-dir= (real process)") {
  using namespace ddprun::testing;
  auto r = run_ddprun({"--log-dir=", "--no-python", "/bin/echo", "x"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == "[default0]:x\n");
}

// doctest's main, failing a run whose filters match no test case (skip.h).
int main(int argc, char** argv) { return ddprun::testing::main_with_skips(argc, argv); }

TEST_CASE("every duration flag and --rdzv-conf duration is finite, in range, and refused naming it") {
  // Issue 19: inf SIGKILLed at once; 0 or 1e308 ended the job with a
  // deadline of 0 ms or -9223372036854775808 ms.
  CHECK(error_of({"--term-timeout=inf", "x"}) ==
        "--term-timeout=inf: expected seconds, a number >= 0 and <= 1000000");
  for (const char* bad : {"--term-timeout=nan", "--term-timeout=1e7", "--term-timeout=-1",
                          "--monitor-interval=inf", "--heartbeat-timeout=1e308",
                          "--silence-timeout=inf", "--heartbeat-grace=-inf",
                          "--stuck-timeout=1e10", "--restart-backoff=nan",
                          "--straggler-window=1", "--straggler-window=inf"}) {
    std::string flag(bad, std::string(bad).find('='));
    CAPTURE(bad);
    CHECK(error_of({bad, "x"}).find(flag + "=") == 0);
    CHECK(error_of({bad, "x"}).find("<= 1000000") != std::string::npos);
  }
  CHECK_NOTHROW(parse({"--term-timeout=1000000", "--stuck-timeout=0", "x"}));
  auto conf = [](const std::string& kv) {
    return error_of({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1",
                     "--rdzv-conf=" + kv, "x"});
  };
  CHECK(conf("keep_alive_interval=0") ==
        "--rdzv-conf keep_alive_interval=0: expected seconds, a number > 0 and <= 1000000");
  CHECK(conf("keep_alive_interval=1e308").find("--rdzv-conf keep_alive_interval=1e308: expected") == 0);
  CHECK(conf("join_timeout=1e10") ==
        "--rdzv-conf join_timeout=1e10: expected seconds, a number > 0 and <= 1000000");
  CHECK(conf("join_timeout=inf").find("--rdzv-conf join_timeout=inf") == 0);
  CHECK(conf("join_timeout=nan").find("--rdzv-conf join_timeout=nan") == 0);
  CHECK(conf("last_call_timeout=-1").find("a number >= 0 and <= 1000000") != std::string::npos);
  CHECK(conf("close_timeout=1e300").find("--rdzv-conf close_timeout=1e300") == 0);
  CHECK(conf("keep_alive_max_attempt=9999999999").find("--rdzv-conf keep_alive_max_attempt=") == 0);
  CHECK(conf("join_timeout=600,keep_alive_interval=0.5,last_call_timeout=0").empty());
}

TEST_CASE("a bad duration exits 2 with one line naming it (real process)") {
  using namespace ddprun::testing;
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--term-timeout=inf", "--no-python", "true"},
        {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1",
         "--rdzv-conf=keep_alive_interval=0", "true"},
        {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1",
         "--rdzv-conf=join_timeout=1e10", "true"}}) {
    auto r = run_ddprun(args);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(count_of(r.err, "\n") == 1);
    CHECK(r.err.find("<= 1000000") != std::string::npos);
  }
}

TEST_CASE("--metrics-port takes -1 to 65535 (off by default), --progress-interval 0 or >= 0.1 s") {
  CHECK(parse({"x"}).metrics_port == -1);
  CHECK(parse({"x"}).metrics_addr == "127.0.0.1");
  CHECK(parse({"--metrics-port=0", "--metrics-addr=::1", "x"}).metrics_port == 0);
  CHECK(error_of({"--metrics-port=65536", "x"}) == "--metrics-port=65536: not a TCP port");
  CHECK(error_of({"--metrics-port=-2", "x"}) == "--metrics-port=-2: not a TCP port");
  CHECK(parse({"--progress-interval=0", "x"}).progress_interval.count() == 0);
  CHECK(error_of({"--progress-interval=0.05", "x"}) ==
        "--progress-interval must be 0 (off) or >= 0.1 (seconds)");
  CHECK(error_of({"--progress-interval=inf", "x"}).find("--progress-interval=inf") == 0);
}
