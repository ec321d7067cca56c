// A real etcd (Debian's etcd-server) for tests: one member on 127.0.0.1 with
// its data in a temporary folder, optionally with TLS (a CA, a server
// certificate for 127.0.0.1 and a client certificate, made with openssl)
// and authentication (user root, enabled with etcdctl). stop() and start()
// keep the data, as a restarted member does. The destructor kills it.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/etcd_store.h"
#include "tests/common/loopback_port.h"
#include "tests/common/temp_dir.h"

extern char** environ;

namespace ddprun::testing {

inline bool etcd_available() { return ::access("/usr/bin/etcd", X_OK) == 0; }


// Runs a program (argv, no shell) to completion; its exit status, or -1.
inline int etcd_run(const std::vector<std::string>& args) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class EtcdServer {
 public:
  struct Config {
    bool tls = false;           // https, server certificate signed by ca.pem
    bool client_certs = false;  // with tls: clients must show a certificate
  };

  EtcdServer() : EtcdServer(Config{}) {}
  explicit EtcdServer(Config config)
      : config_(config), client_port_(free_loopback_port()), peer_port_(free_loopback_port()) {
    if (config_.tls) make_certificates();
    start();
  }
  ~EtcdServer() { stop(); }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  void start() {
    const std::string client = url(), peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {"etcd", "--name", "t", "--data-dir", dir_.file("data"),
                                     "--listen-client-urls", client, "--advertise-client-urls", client,
                                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                     "--initial-cluster", "t=" + peer, "--logger", "zap",
                                     "--log-level", "error"};
    if (config_.tls) {
      args.insert(args.end(), {"--cert-file", file("server.pem"), "--key-file", file("server.key")});
      if (config_.client_certs) {
        args.insert(args.end(), {"--client-cert-auth", "--trusted-ca-file", file("ca.pem")});
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "etcd", nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start etcd");
    // Ready when it answers (deadline 30 s): etcd has no readiness event.
    rendezvous::EtcdStore probe(options());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      try {
        probe.ping();
        return;
      } catch (const rendezvous::StoreError& e) {
        if (std::chrono::steady_clock::now() > deadline) {
          stop();  // the destructor does not run for a throwing constructor
          throw std::runtime_error("etcd did not come up: " + std::string(e.what()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Adds user root (password `password`) and turns authentication on.
  void enable_auth(const std::string& password) {
    const std::string ep = "--endpoints=" + url();
    std::vector<std::string> tls;
    if (config_.tls)
      tls = {"--cacert=" + file("ca.pem"), "--cert=" + file("client.pem"), "--key=" + file("client.key")};
    auto ctl = [&](std::vector<std::string> args) {
      std::vector<std::string> all = {"etcdctl", ep};
      all.insert(all.end(), tls.begin(), tls.end());
      all.insert(all.end(), args.begin(), args.end());
      if (etcd_run(all) != 0) throw std::runtime_error("etcdctl " + args[0] + " " + args[1] + " failed");
    };
    ctl({"user", "add", "root:" + password});
    etcd_run({"etcdctl", ep, "user", "grant-role", "root", "root"});  // 3.4 may have done it
    ctl({"auth", "enable"});
    auth_password_ = password;
  }

  uint16_t port() const { return client_port_; }
  // "127.0.0.1:PORT", or "https://127.0.0.1:PORT" with TLS.
  std::string endpoint() const {
    return (config_.tls ? "https://" : "") + std::string("127.0.0.1:") + std::to_string(client_port_);
  }
  std::string url() const {
    return (config_.tls ? "https://" : "http://") + std::string("127.0.0.1:") + std::to_string(client_port_);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }
  // Store options that reach this member (with its CA, certificate and user).
  rendezvous::EtcdOptions options() const {
    rendezvous::EtcdOptions o;
    o.endpoints = endpoint();
    o.request_timeout = std::chrono::seconds(2);
    if (config_.tls) {
      o.cacert = file("ca.pem");
      o.cert = file("client.pem");
      o.key = file("client.key");
    }
    if (!auth_password_.empty()) {
      o.user = "root";
      o.password = auth_password_;
    }
    return o;
  }

 private:
  void openssl(std::vector<std::string> args) {
    args.insert(args.begin(), "openssl");
    if (etcd_run(args) != 0) throw std::runtime_error("openssl " + args[1] + " failed");
  }
  void make_certificates() {
    openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ddprun test CA",
             "-keyout", file("ca.key"), "-out", file("ca.pem")});
    for (std::string who : {"server", "client"}) {
      openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + who, "-keyout", file(who + ".key"),
               "-out", file(who + ".csr")});
      FILE* ext = std::fopen(file(who + ".ext").c_str(), "w");
      // The server's certificate is a client one too: etcd's HTTP gateway
      // dials etcd's gRPC with it, and --client-cert-auth checks it.
      std::fputs(who == "server" ? "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
                                 : "extendedKeyUsage=clientAuth\n",
                 ext);
      std::fclose(ext);
      openssl({"x509", "-req", "-in", file(who + ".csr"), "-CA", file("ca.pem"), "-CAkey", file("ca.key"),
               "-CAcreateserial", "-days", "2", "-extfile", file(who + ".ext"), "-out", file(who + ".pem")});
    }
  }

  Config config_;
  TempDir dir_;
  uint16_t client_port_, peer_port_;
  pid_t pid_ = -1;
  std::string auth_password_;
};

}  // namespace ddprun::testing
