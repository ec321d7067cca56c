// ddprun doctor, run as the real program on fixture machine trees.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/agent/ddprun_process.h"
#include "tests/common/temp_dir.h"

namespace {

using ddprun::testing::run_ddprun;
using nlohmann::json;

struct Doctor {
  int status = -1;
  json findings;
  std::string err;
  // The finding of `check` (the first, for checks that report twice).
  json get(const std::string& check) const {
    for (const auto& f : findings)
      if (f["check"] == check) return f;
    return json();
  }
  std::string level(const std::string& check) const {
    const json f = get(check);
    return f.is_null() ? "missing" : f["level"].get<std::string>();
  }
};

Doctor doctor(const std::string& fixture, std::vector<std::string> extra = {},
              std::vector<std::string> env = {}) {
  std::vector<std::string> args = {"doctor", "--json", "--root",
                                   std::string(FIXTURES) + "/" + fixture, "--port", "0",
                                   "--nvidia-smi", std::string(FIXTURES) + "/healthy/nvidia-smi"};
  args.insert(args.end(), extra.begin(), extra.end());
  // Interface variables come from the environment: unset unless a test names them.
  env.insert(env.begin(), {"NCCL_SOCKET_IFNAME=", "GLOO_SOCKET_IFNAME="});
  const auto r = run_ddprun(args, env, std::chrono::seconds(30));
  Doctor d;
  d.status = r.status;
  d.err = r.err;
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(!r.timed_out);
  d.findings = json::parse(r.out)["findings"];
  return d;
}

}  // namespace

TEST_CASE("doctor: a healthy machine passes every check") {
  const Doctor d = doctor("healthy", {}, {"NCCL_SOCKET_IFNAME=eth", "GLOO_SOCKET_IFNAME=eth0"});
  CHECK(d.level("iommu") == "ok");
  CHECK(d.level("acs") == "ok");
  CHECK(d.level("gpus") == "ok");
  CHECK(d.get("gpus")["finding"].get<std::string>().find("2 GPUs") != std::string::npos);
  CHECK(d.get("gpus")["detail"].get<std::string>().find("GPU0") != std::string::npos);
  CHECK(d.level("shm") == "ok");
  CHECK(d.level("memlock") == "ok");
  CHECK(d.level("nofile") == "ok");
  CHECK(d.level("ifname") == "ok");
  CHECK(d.status == 0);
}

TEST_CASE("doctor: IOMMU translating GPU DMA and ACS redirect on the bridges fail with fixes") {
  const Doctor d = doctor("iommu_acs");
  CHECK(d.level("iommu") == "fail");
  const std::string iommu_fix = d.get("iommu")["fix"];
  CHECK(iommu_fix.find("iommu=pt") != std::string::npos);
  CHECK(iommu_fix.find("NCCL_P2P_DISABLE=1") != std::string::npos);
  CHECK(d.level("acs") == "fail");
  const std::string acs = d.get("acs")["finding"];
  CHECK(acs.find("0000:02:08.0") != std::string::npos);  // a bridge above GPU 0
  CHECK(acs.find("0x001d") != std::string::npos);
  CHECK(d.get("acs")["fix"].get<std::string>().find("NCCL_P2P_DISABLE=1") != std::string::npos);
  CHECK(d.status == 1);
}

TEST_CASE("doctor: NCCL_P2P_DISABLE=1 turns the P2P failures into warnings") {
  const Doctor d = doctor("iommu_acs", {}, {"NCCL_P2P_DISABLE=1"});
  CHECK(d.level("iommu") == "warn");
  CHECK(d.level("acs") == "warn");
  CHECK(d.status == 0);
}

TEST_CASE("doctor: a 64 MiB /dev/shm fails and says how to grow it") {
  const Doctor d = doctor("small_shm");
  CHECK(d.level("shm") == "fail");
  CHECK(d.get("shm")["finding"].get<std::string>().find("64 MiB") != std::string::npos);
  CHECK(d.get("shm")["fix"].get<std::string>().find("--shm-size") != std::string::npos);
  CHECK(d.level("iommu") == "ok");
  CHECK(d.status == 1);
}

TEST_CASE("doctor: no GPU is reported, not failed; low limits are named") {
  const Doctor d = doctor("no_gpu");
  CHECK(d.level("gpus") == "info");
  CHECK(d.get("gpus")["finding"].get<std::string>().find("no GPU") != std::string::npos);
  CHECK(d.level("iommu") == "info");
  CHECK(d.level("acs") == "info");
  CHECK(d.level("nofile") == "warn");
  CHECK(d.level("memlock") == "info");  // limited, but no RDMA device
  CHECK(d.status == 0);
}

TEST_CASE("doctor: interface variables naming no interface fail") {
  const Doctor d = doctor("healthy", {}, {"NCCL_SOCKET_IFNAME=ib9", "GLOO_SOCKET_IFNAME=eth"});
  int failed = 0;
  for (const auto& f : d.findings) {
    if (f["check"] != "ifname") continue;
    CHECK(f["level"] == "fail");
    CHECK(f["fix"].get<std::string>().find("eth0") != std::string::npos);
    ++failed;
  }
  CHECK(failed == 2);  // NCCL's "ib9" prefix and Gloo's exact "eth" both miss
}

TEST_CASE("doctor: a port held by another process is named") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const Doctor d = doctor("healthy", {"--port", std::to_string(port)});
  CHECK(d.level("port") == "fail");
  CHECK(d.get("port")["finding"].get<std::string>().find(std::to_string(port)) !=
        std::string::npos);
  ::close(fd);
}

TEST_CASE("doctor: clock skew with the rendezvous host is measured over SNTP") {
  // A one-shot SNTP server whose clock runs 10 s ahead.
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ddprun::testing::DdprunProcess p({"doctor", "--json", "--root",
                                    std::string(FIXTURES) + "/healthy", "--port", "0",
                                    "--rdzv-endpoint", "127.0.0.1:29500", "--ntp-port",
                                    std::to_string(port)});
  unsigned char q[48];
  sockaddr_in from{};
  socklen_t flen = sizeof from;
  timeval tv{10, 0};  // the request's deadline
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  REQUIRE(::recvfrom(fd, q, sizeof q, 0, reinterpret_cast<sockaddr*>(&from), &flen) == 48);
  timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  const uint64_t secs = static_cast<uint64_t>(now.tv_sec) + 2208988800ULL + 10;
  unsigned char r[48] = {};
  r[0] = 0x24;  // version 4, mode 4 (server)
  for (int off : {32, 40}) {
    for (int i = 0; i < 4; ++i) r[off + i] = static_cast<unsigned char>(secs >> (24 - 8 * i));
  }
  REQUIRE(::sendto(fd, r, sizeof r, 0, reinterpret_cast<sockaddr*>(&from), flen) == 48);
  const auto f = p.finish(std::chrono::seconds(30));
  ::close(fd);
  REQUIRE(!f.timed_out);
  json skew;
  const json all = json::parse(f.out);
  for (const auto& x : all["findings"])
    if (x["check"] == "clock" && x["finding"].get<std::string>().find("127.0.0.1") != std::string::npos)
      skew = x;
  INFO("stdout: " << f.out << " stderr: " << f.err);
  REQUIRE(!skew.is_null());
  CHECK(skew["level"] == "fail");
  CHECK(skew["finding"].get<std::string>().find("+") != std::string::npos);
}

// A copy of the healthy fixture tree with `hosts` as /etc/hosts, host name
// "node7", and a down interface beside eth0 (up) and lo (unknown).
struct HostsFixture {
  ddprun::testing::TempDir dir;
  explicit HostsFixture(const std::string& hosts) {
    namespace fs = std::filesystem;
    fs::copy(std::string(FIXTURES) + "/healthy", dir.path(), fs::copy_options::recursive);
    fs::create_directories(dir.file("etc"));
    fs::create_directories(dir.file("proc/sys/kernel"));
    fs::create_directories(dir.file("sys/class/net/docker0"));
    std::ofstream(dir.file("etc/hosts")) << hosts;
    std::ofstream(dir.file("proc/sys/kernel/hostname")) << "node7\n";
    std::ofstream(dir.file("sys/class/net/docker0/operstate")) << "down\n";
  }
};

Doctor doctor_at(const std::string& root, std::vector<std::string> env = {},
                 std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"doctor", "--json", "--root", root, "--nvidia-smi", ""};
  args.insert(args.end(), extra.begin(), extra.end());
  env.insert(env.begin(), {"NCCL_SOCKET_IFNAME=", "GLOO_SOCKET_IFNAME="});
  const auto r = run_ddprun(args, env, std::chrono::seconds(30));
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(!r.timed_out);
  Doctor d;
  d.status = r.status;
  d.findings = json::parse(r.out)["findings"];
  return d;
}

TEST_CASE("doctor: a host name on a loopback address is flagged with the fix; states shown") {
  HostsFixture tree("127.0.0.1 localhost\n127.0.1.1 node7.cluster node7  # Debian's default\n");
  Doctor d = doctor_at(tree.dir.path());
  CHECK(d.level("hostname") == "warn");
  CHECK(d.get("hostname")["finding"].get<std::string>().find("node7 maps to 127.0.1.1") !=
        std::string::npos);
  CHECK(d.get("hostname")["fix"].get<std::string>().find("GLOO_SOCKET_IFNAME") !=
        std::string::npos);
  // Every interface with its state, the down one saying so.
  const std::string ifname = d.get("ifname")["finding"].get<std::string>();
  CHECK(ifname.find("docker0 (down), eth0 (up), lo (unknown)") != std::string::npos);
  CHECK(d.status == 0);  // a warning: single-node jobs are fine
  // GLOO_SOCKET_IFNAME decides instead: only a note.
  d = doctor_at(tree.dir.path(), {"GLOO_SOCKET_IFNAME=eth0"});
  CHECK(d.level("hostname") == "info");
  CHECK(d.get("ifname")["finding"].get<std::string>().find("eth0 (up)") != std::string::npos);
}

TEST_CASE("doctor: a host name on its network address passes; no port is checked unless given") {
  HostsFixture tree("127.0.0.1 localhost\n10.1.2.7 node7\n");
  // 29500 taken (by us) is no failure: ddprun does not use it unless told to.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(29500);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool held = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
  const Doctor d = doctor_at(tree.dir.path());
  ::close(fd);
  CHECK(d.level("hostname") == "ok");
  CHECK(d.get("hostname")["finding"] == "host name node7 maps to 10.1.2.7 in /etc/hosts");
  CHECK(d.level("port") == "info");
  CHECK(d.get("port")["finding"].get<std::string>().find("no port checked") == 0);
  MESSAGE("29500 held during the run: " << held);
  CHECK(d.status == 0);
}
