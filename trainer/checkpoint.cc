#include "trainer/checkpoint.h"

#include <sys/file.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/contract.h"
#include "base/safe_file.h"
#include "base/system_error.h"
#include "trainer/error.h"

namespace ddprun::trainer {
namespace {

// 2: the manifest carries its own SHA-256 (kManifestSha256). Format 1
// manifests (no self-checksum) are not trusted: a flipped bit there could
// resume wrong weights or the wrong data position.
constexpr int kFormatVersion = 2;
constexpr const char* kManifestSha256 = "manifest_sha256";
constexpr const char* kLockFile = base::kFileLock;  // the one name
constexpr size_t kMaxManifestBytes = size_t(64) << 20;  // a blob table, never near this

// The folder, opened and checked by base::SafeDir (created when missing):
// owner us or root, not writable by others unless sticky, no planted symlink
// on the way. Every file below is opened by its descriptor.
base::SafeDir open_folder(const std::string& dir) {
  try {
    return base::SafeDir::open(dir, true, 0755);
  } catch (const base::FileError& e) {
    errno = e.error();
    throw TrainerError(std::string("checkpoint folder: ") + e.what());
  }
}

// Whole file under a random O_EXCL|O_NOFOLLOW (or O_TMPFILE) temp name,
// fsynced, renamed into place, folder fsynced; no temp file is left behind.
void write_atomically(const base::SafeDir& dir, const std::string& name, const uint8_t* data,
                      size_t size) {
  try {
    dir.write_atomically(name, std::string_view(reinterpret_cast<const char*>(data), size), true);
  } catch (const base::FileError& e) {
    if (e.error() == ENOSPC || e.error() == EDQUOT) throw CheckpointNoSpace(e.what());
    throw TrainerError(e.what());
  }
}

void unlink_logged(const base::SafeDir& dir, const std::string& name) {
  try {
    dir.remove(name);
  } catch (const base::FileError& e) {
    spdlog::warn("{}", e.what());
  }
}

// The manifest's own checksum: SHA-256 of the canonical dump (sorted keys,
// no spaces) of every other field. Any bit that changes what the manifest
// says changes it; a flip that changes nothing (blank to blank) is harmless.
std::string manifest_digest(nlohmann::json m) {
  m.erase(kManifestSha256);
  const std::string canon = m.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  return sha256_hex(reinterpret_cast<const uint8_t*>(canon.data()), canon.size());
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

namespace {

std::string step_name(int64_t step, const char* ext) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%010lld.%s", static_cast<long long>(step), ext);
  return name;
}

// The folder when it exists (nullopt when it does not); a folder that is
// there but refused (planted symlink, another owner) throws.
std::optional<base::SafeDir> existing_folder(const std::string& dir) {
  try {
    return base::SafeDir::open(dir);
  } catch (const base::FileError& e) {
    if (e.error() == ENOENT) return std::nullopt;
    throw TrainerError(std::string("checkpoint folder: ") + e.what());
  }
}

}  // namespace

std::string CheckpointDir::manifest_path(int64_t step) const {
  return options_.dir + "/" + step_name(step, "json");
}

std::string CheckpointDir::payload_path(int64_t step) const {
  return options_.dir + "/" + step_name(step, "bin");
}

void CheckpointDir::lock(const std::string& holder) {
  if (lock_) return;
  const base::SafeDir dir = open_folder(options_.dir);
  base::ScopedFd fd;
  try {
    fd = dir.open_append(kLockFile, 0644);
  } catch (const base::FileError& e) {
    throw TrainerError(std::string("cannot lock the checkpoint folder: ") + e.what());
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    std::string who;
    try {
      who = dir.read_file(kLockFile, 4096);
    } catch (const base::FileError&) {
    }
    while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
    if (e == EWOULDBLOCK) {
      throw TrainerError("checkpoint folder " + options_.dir + " is in use by " +
                         (who.empty() ? std::string("another run") : base::printable(who)) +
                         ": refusing to share it (give this run its own --checkpoint-dir)");
    }
    throw TrainerError(options_.dir + "/" + kLockFile + ": flock: " + base::errno_text(e));
  }
  // Ours now: say who holds it, for the run that is refused.
  const std::string line = holder + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::write(fd.get(), line.data(), line.size()) != ssize_t(line.size())) {
    spdlog::warn("cannot write the holder into {}/{}: {}", options_.dir, kLockFile,
                 base::errno_text(errno));
  }
  lock_ = std::move(fd);
}

std::string CheckpointDir::write(const Checkpoint& ckpt) {
  const base::SafeDir dir = open_folder(options_.dir);
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
      {"payload", step_name(ckpt.step, "bin")},
      {"payload_bytes", payload.size()},
      {"payload_sha256", sha256_hex(payload.data(), payload.size())},
      {"blobs", table},
  };
  if (std::isfinite(ckpt.loss)) manifest["loss"] = ckpt.loss;
  manifest[kManifestSha256] = manifest_digest(manifest);
  const std::string text = manifest.dump(1) + "\n";
  try {
    write_files(dir, ckpt.step, payload, text);
  } catch (const CheckpointNoSpace& e) {
    // The folder may be sized for `keep` checkpoints: make room for this one
    // from what is no longer needed, never from the newest that verifies.
    spdlog::warn("{}; pruning older checkpoints and retrying once", e.what());
    prune(std::max(1, options_.keep - 1), -1);
    try {
      write_files(dir, ckpt.step, payload, text);
    } catch (const CheckpointNoSpace& again) {
      // Still no room: keep only the newest good one, so the next write
      // fits (a folder smaller than --keep checkpoints must not stop every
      // new one from being written), and say so.
      const size_t have = list_steps().size();
      spdlog::warn("{}: room for fewer than --keep={} checkpoints ({} there); keeping only the "
                   "newest that verifies so new ones are written",
                   options_.dir, options_.keep, have);
      prune(1, -1);
      write_files(dir, ckpt.step, payload, text);
    }
  }
  verified_.insert(ckpt.step);
  prune(size_t(options_.keep), ckpt.step);
  return manifest_path(ckpt.step);
}

void CheckpointDir::write_files(const base::SafeDir& dir, int64_t step,
                                const std::vector<uint8_t>& payload, const std::string& manifest) {
  write_atomically(dir, step_name(step, "bin"), payload.data(), payload.size());
  try {
    write_atomically(dir, step_name(step, "json"),
                     reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size());
  } catch (const TrainerError&) {
    unlink_logged(dir, step_name(step, "bin"));  // no manifest: the payload would be an orphan
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
  const std::optional<base::SafeDir> dir = existing_folder(options_.dir);
  if (!dir) return;
  const std::vector<int64_t> steps = list_steps();
  size_t kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const bool good = verifies(*it);
    if (*it == keep_step || (good && kept < keep_verified)) {
      if (good) ++kept;
      continue;
    }
    // Manifest first, so a half-pruned checkpoint is never "found".
    try {
      dir->remove(step_name(*it, "json"));
    } catch (const base::FileError& e) {
      spdlog::warn("cannot remove checkpoint: {}", e.what());
      continue;
    }
    verified_.erase(*it);
    unlink_logged(*dir, step_name(*it, "bin"));
  }
}

std::vector<std::string> CheckpointDir::remove_leftovers() {
  std::vector<std::string> removed;
  const std::optional<base::SafeDir> dir = existing_folder(options_.dir);
  if (!dir) return removed;
  const std::vector<int64_t> steps = list_steps();
  std::vector<std::string> doomed;
  for (const std::string& name : dir->entries()) {
    // Temp files: ".step-*.tmp-<random>" (base::SafeDir) and, from older
    // versions, "step-*.tmp.<pid>".
    const bool tmp = (name.rfind(".step-", 0) == 0 && name.find(".tmp-") != std::string::npos) ||
                     (name.rfind("step-", 0) == 0 && name.find(".tmp.") != std::string::npos);
    long long step = -1;
    char tail[8] = {0};
    const bool orphan = !tmp && name.rfind("step-", 0) == 0 &&
                        std::sscanf(name.c_str(), "step-%lld.%4s", &step, tail) == 2 &&
                        std::strcmp(tail, "bin") == 0 && name == step_name(step, "bin") &&
                        !std::binary_search(steps.begin(), steps.end(), int64_t(step));
    if (tmp || orphan) doomed.push_back(name);
  }
  for (const std::string& name : doomed) {
    try {
      if (dir->remove(name)) removed.push_back(options_.dir + "/" + name);
    } catch (const base::FileError& e) {
      spdlog::warn("cannot remove leftover: {}", e.what());
    }
  }
  return removed;
}

std::vector<int64_t> CheckpointDir::list_steps() const {
  std::vector<int64_t> steps;
  const std::optional<base::SafeDir> dir = existing_folder(options_.dir);
  if (!dir) return steps;
  for (const std::string& name : dir->entries()) {
    long long step = -1;
    char tail[8] = {0};
    // Exactly "step-<digits>.json".
    if (std::sscanf(name.c_str(), "step-%lld.%5s", &step, tail) == 2 &&
        std::strcmp(tail, "json") == 0 && step >= 0 && name == step_name(step, "json")) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Checkpoint CheckpointDir::load_step(int64_t step) {
  const std::string mpath = manifest_path(step);
  const std::optional<base::SafeDir> dir = existing_folder(options_.dir);
  if (!dir) throw TrainerError(mpath + ": no checkpoint folder");
  std::string text;
  try {
    text = dir->read_file(step_name(step, "json"), kMaxManifestBytes);
  } catch (const base::FileError& e) {
    throw TrainerError(std::string("cannot read manifest: ") + e.what());
  }
  nlohmann::json m = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    throw TrainerError(mpath + ": manifest is not valid JSON (truncated?)");
  }
  Checkpoint ckpt;
  std::string payload;
  try {
    // Nothing in it is believed before its own checksum matches.
    if (!m.contains(kManifestSha256) || !m[kManifestSha256].is_string()) {
      throw TrainerError(mpath + ": manifest has no checksum of its own (written by an older "
                         "ddprun, or damaged): not trusted");
    }
    if (m[kManifestSha256].get<std::string>() != manifest_digest(m)) {
      throw TrainerError(mpath + ": manifest SHA-256 does not match its content (corrupt)");
    }
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
    const std::string pname = m.at("payload").get<std::string>();
    const std::string ppath = options_.dir + "/" + pname;
    const uint64_t want_bytes = m.at("payload_bytes").get<uint64_t>();
    try {
      payload = dir->read_file(pname, size_t(want_bytes));
    } catch (const base::FileError& e) {
      throw TrainerError(std::string("cannot read payload: ") + e.what());
    }
    if (payload.size() != want_bytes) {
      throw TrainerError(ppath + ": payload is " + std::to_string(payload.size()) +
                         " bytes, manifest says " + std::to_string(want_bytes) +
                         " (truncated?)");
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
    if (sha256_hex(bytes, payload.size()) != m.at("payload_sha256").get<std::string>()) {
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
      b.bytes.assign(bytes + off, bytes + off + len);
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
    } catch (const std::exception& e) {  // bad_alloc, length_error too: never a crash loop
      spdlog::warn("skipping checkpoint {}: {}", manifest_path(*it), e.what());
    }
  }
  return std::nullopt;
}

}  // namespace ddprun::trainer
