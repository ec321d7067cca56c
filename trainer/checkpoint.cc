#include "trainer/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

constexpr int kFormatVersion = 1;

// errno -> error, in one place: no room is its own type (the caller prunes
// and retries), everything else a TrainerError naming the file.
[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  const int e = errno;
  const std::string msg = path + ": " + what + ": " + std::strerror(e);
  if (e == ENOSPC || e == EDQUOT) throw CheckpointNoSpace(msg);
  throw TrainerError(msg);
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw_errno("open for fsync", path);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw_errno("fsync", path);
}

// tmp file in the same folder, write, fsync, rename, fsync the folder. On
// failure the tmp file is removed (a full disk must not keep filling up).
void write_atomically(const std::string& dir, const std::string& path,
                      const uint8_t* data, size_t size) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("create", tmp);
  auto fail = [&](const char* what, bool open) {
    const int saved = errno;
    if (open) ::close(fd);
    ::unlink(tmp.c_str());
    errno = saved;
    throw_errno(what, tmp);
  };
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", true);
    done += size_t(n);
  }
  if (::fsync(fd) != 0) fail("fsync", true);
  if (::close(fd) != 0) fail("close", false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename into place", false);
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
}

void unlink_logged(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("cannot remove {}: {}", path, std::strerror(errno));
  }
}

bool read_whole(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

void make_dirs(const std::string& dir) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw_errno("create checkpoint folder", partial);
    }
  }
}

}  // namespace

std::string sha256_hex(const uint8_t* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data, size, md, &len, EVP_sha256(), nullptr) != 1) {
    throw TrainerError("sha256: OpenSSL EVP_Digest failed");
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

const Blob* Checkpoint::find(const std::string& name) const {
  for (const Blob& b : blobs) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

CheckpointDir::CheckpointDir(CheckpointOptions options) : options_(std::move(options)) {
  if (options_.keep < 1) throw TrainerError("--keep must be at least 1");
  if (options_.dir.empty()) throw TrainerError("--checkpoint-dir must not be empty");
}

std::string CheckpointDir::manifest_path(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof(name), "/step-%010lld.json", static_cast<long long>(step));
  return options_.dir + name;
}

std::string CheckpointDir::payload_path(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof(name), "/step-%010lld.bin", static_cast<long long>(step));
  return options_.dir + name;
}

std::string CheckpointDir::write(const Checkpoint& ckpt) {
  make_dirs(options_.dir);
  std::vector<uint8_t> payload;
  nlohmann::json table = nlohmann::json::array();
  for (const Blob& b : ckpt.blobs) {
    table.push_back({{"name", b.name}, {"dtype", b.dtype}, {"shape", b.shape},
                     {"offset", payload.size()}, {"bytes", b.bytes.size()}});
    payload.insert(payload.end(), b.bytes.begin(), b.bytes.end());
  }
  nlohmann::json manifest = {
      {"format", kFormatVersion},
      {"step", ckpt.step},
      {"samples_consumed", ckpt.samples_consumed},
      {"world_size", ckpt.world_size},
      {"seed", ckpt.seed},
      {"payload", payload_path(ckpt.step).substr(options_.dir.size() + 1)},
      {"payload_bytes", payload.size()},
      {"payload_sha256", sha256_hex(payload.data(), payload.size())},
      {"blobs", table},
  };
  if (std::isfinite(ckpt.loss)) manifest["loss"] = ckpt.loss;
  const std::string text = manifest.dump(1) + "\n";
  try {
    write_files(ckpt.step, payload, text);
  } catch (const CheckpointNoSpace& e) {
    // The folder may be sized for `keep` checkpoints: make room for this one
    // from what is no longer needed, never from the newest that verifies.
    spdlog::warn("{}; pruning older checkpoints and retrying once", e.what());
    prune(std::max(1, options_.keep - 1), -1);
    write_files(ckpt.step, payload, text);
  }
  verified_.insert(ckpt.step);
  prune(size_t(options_.keep), ckpt.step);
  return manifest_path(ckpt.step);
}

void CheckpointDir::write_files(int64_t step, const std::vector<uint8_t>& payload,
                                const std::string& manifest) {
  write_atomically(options_.dir, payload_path(step), payload.data(), payload.size());
  try {
    write_atomically(options_.dir, manifest_path(step),
                     reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size());
  } catch (const TrainerError&) {
    unlink_logged(payload_path(step));  // no manifest: the payload would be an orphan
    throw;
  }
}

bool CheckpointDir::verifies(int64_t step) {
  if (verified_.count(step) != 0) return true;
  try {
    load_step(step);
    verified_.insert(step);
    return true;
  } catch (const TrainerError& e) {
    spdlog::warn("checkpoint {} does not verify, removing it: {}", manifest_path(step), e.what());
    return false;
  }
}

void CheckpointDir::prune(size_t keep_verified, int64_t keep_step) {
  const std::vector<int64_t> steps = list_steps();
  size_t kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const bool good = verifies(*it);
    if (*it == keep_step || (good && kept < keep_verified)) {
      if (good) ++kept;
      continue;
    }
    // Manifest first, so a half-pruned checkpoint is never "found".
    if (::unlink(manifest_path(*it).c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("cannot remove checkpoint {}: {}", manifest_path(*it), std::strerror(errno));
      continue;
    }
    verified_.erase(*it);
    unlink_logged(payload_path(*it));
  }
}

std::vector<std::string> CheckpointDir::remove_leftovers() {
  std::vector<std::string> removed;
  DIR* d = ::opendir(options_.dir.c_str());
  if (d == nullptr) return removed;
  const std::vector<int64_t> steps = list_steps();
  std::vector<std::string> doomed;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("step-", 0) != 0) continue;  // not ours
    long long step = -1;
    char tail[8] = {0};
    const bool tmp = name.find(".tmp.") != std::string::npos;
    const bool orphan = !tmp && std::sscanf(name.c_str(), "step-%lld.%4s", &step, tail) == 2 &&
                        std::strcmp(tail, "bin") == 0 &&
                        name == payload_path(step).substr(options_.dir.size() + 1) &&
                        !std::binary_search(steps.begin(), steps.end(), int64_t(step));
    if (tmp || orphan) doomed.push_back(options_.dir + "/" + name);
  }
  ::closedir(d);
  for (const std::string& path : doomed) {
    if (::unlink(path.c_str()) == 0) {
      removed.push_back(path);
    } else if (errno != ENOENT) {
      spdlog::warn("cannot remove leftover {}: {}", path, std::strerror(errno));
    }
  }
  return removed;
}

std::vector<int64_t> CheckpointDir::list_steps() const {
  std::vector<int64_t> steps;
  DIR* d = ::opendir(options_.dir.c_str());
  if (d == nullptr) return steps;
  while (dirent* e = ::readdir(d)) {
    long long step = -1;
    char tail[8] = {0};
    // Exactly "step-<digits>.json".
    if (std::sscanf(e->d_name, "step-%lld.%5s", &step, tail) == 2 &&
        std::strcmp(tail, "json") == 0 && step >= 0 &&
        std::string(e->d_name) == manifest_path(step).substr(options_.dir.size() + 1)) {
      steps.push_back(step);
    }
  }
  ::closedir(d);
  std::sort(steps.begin(), steps.end());
  return steps;
}

Checkpoint CheckpointDir::load_step(int64_t step) {
  const std::string mpath = manifest_path(step);
  std::vector<uint8_t> text;
  if (!read_whole(mpath, &text)) throw TrainerError(mpath + ": cannot read manifest");
  nlohmann::json m = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    throw TrainerError(mpath + ": manifest is not valid JSON (truncated?)");
  }
  Checkpoint ckpt;
  std::vector<uint8_t> payload;
  try {
    if (m.at("format").get<int>() != kFormatVersion) {
      throw TrainerError(mpath + ": unknown checkpoint format " + m.at("format").dump());
    }
    ckpt.step = m.at("step").get<int64_t>();
    ckpt.samples_consumed = m.at("samples_consumed").get<int64_t>();
    ckpt.world_size = m.at("world_size").get<int>();
    ckpt.seed = m.at("seed").get<uint64_t>();
    if (m.contains("loss") && m["loss"].is_number()) ckpt.loss = m["loss"].get<double>();
    if (ckpt.step != step) {
      throw TrainerError(mpath + ": manifest says step " + std::to_string(ckpt.step));
    }
    const std::string ppath = options_.dir + "/" + m.at("payload").get<std::string>();
    if (!read_whole(ppath, &payload)) throw TrainerError(ppath + ": cannot read payload");
    const uint64_t want_bytes = m.at("payload_bytes").get<uint64_t>();
    if (payload.size() != want_bytes) {
      throw TrainerError(ppath + ": payload is " + std::to_string(payload.size()) +
                         " bytes, manifest says " + std::to_string(want_bytes) +
                         " (truncated?)");
    }
    if (sha256_hex(payload.data(), payload.size()) != m.at("payload_sha256").get<std::string>()) {
      throw TrainerError(ppath + ": SHA-256 does not match the manifest (corrupt)");
    }
    for (const auto& entry : m.at("blobs")) {
      Blob b;
      b.name = entry.at("name").get<std::string>();
      b.dtype = entry.at("dtype").get<std::string>();
      b.shape = entry.at("shape").get<std::vector<int64_t>>();
      const uint64_t off = entry.at("offset").get<uint64_t>();
      const uint64_t len = entry.at("bytes").get<uint64_t>();
      if (off > payload.size() || len > payload.size() - off) {
        throw TrainerError(mpath + ": blob " + b.name + " lies outside the payload");
      }
      b.bytes.assign(payload.begin() + off, payload.begin() + off + len);
      ckpt.blobs.push_back(std::move(b));
    }
  } catch (const nlohmann::json::exception& e) {
    throw TrainerError(mpath + ": malformed manifest: " + e.what());
  }
  return ckpt;
}

std::optional<Checkpoint> CheckpointDir::load_newest() {
  std::vector<int64_t> steps = list_steps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    try {
      Checkpoint c = load_step(*it);
      verified_.insert(*it);
      return c;
    } catch (const TrainerError& e) {
      spdlog::warn("skipping checkpoint {}: {}", manifest_path(*it), e.what());
    }
  }
  return std::nullopt;
}

}  // namespace ddprun::trainer
