// The on-disk format of native checkpoints, independent of any running job: where a stored
// tensor sits in its full parameter (ShardSpec), writing one file of such pieces with a checksum,
// the manifest, durable file-system steps (fsync, atomic rename), and CheckpointReader, which
// reassembles any parameter's full tensor from whatever TP/DP layout wrote it. The save/load
// protocol of a training job (who writes what, the commit) is train/checkpoint.h. docs/checkpoints.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/parallel/sharding.h"

namespace lf {
class MappedFile;
}
namespace lf::safetensors {
class Reader;
}

namespace lf::train::ckpt {

// 2: shard pieces may be two-level splits ("outer", experts over EP x TP). A build that reads only
// version 1 would take such a piece for a plain split of the same element count and load it
// scrambled, so it refuses version 2 instead; this build reads both (version 1 has no "outer").
inline constexpr int kFormatVersion = 2;
inline constexpr int kOldestReadableVersion = 1;
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kStateFile = "state.json";
inline constexpr const char* kConfigFile = "config.yaml";

// Where one stored tensor lies in its parameter's full tensor: the parameter's Sharding
// (parallel/sharding.h: split dim, stacked blocks, vocabulary padding), recorded at every TP size,
// and the TP rank that stored it. The stored piece is the range [flat_begin, flat_end) of the
// flattened shard (ZeRO-1 owns contiguous ranges of the flat gradient buffer, so a DP rank holds
// a slice of it).
struct ShardSpec {
  std::vector<int64_t> global_shape;
  int64_t partition_dim = -1;
  int64_t blocks = 1;
  bool vocab = false;  // dim 0 is a padded vocabulary (loaders adapt the padding rows)
  int64_t outer = 1;   // two-level split (parallel/sharding.h: experts over ep x tp); 1: none
  int tp_rank = 0, tp_size = 1;
  // The record of a model parameter (its full shape, split and TP coordinates).
  static ShardSpec of(const lf::parallel::Parameter& p);
  lf::parallel::Sharding sharding() const { return {partition_dim, blocks, vocab, outer}; }

  std::vector<int64_t> shard_shape() const;
  int64_t shard_numel() const;
  // This shard's first element within each block, per dimension (0 on all but partition_dim).
  std::vector<int64_t> offsets() const;
  // Throws naming `what` when the shape does not split (blocks x tp_size must divide the dim).
  void validate(const std::string& what) const;
};

struct Piece {
  std::string param;  // parameter name (models/foundations/decoder.h)
  std::string kind;   // "param", "master", "exp_avg", "exp_avg_sq"
  ShardSpec shard;
  int64_t flat_begin = 0, flat_end = 0;
};

// One tensor of a file to write: `data` is CPU and contiguous, numel == flat_end - flat_begin.
struct Entry {
  Piece piece;
  at::Tensor data;
};

// The safetensors key of a piece: the name for "param" and "rng", NAME.KIND otherwise.
std::string entry_key(const Piece& p);

struct FileRecord {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Writes `entries` as one safetensors file (piece metadata in __metadata__["loongforge"]),
// fsynced; returns its size and the CRC-32 of the bytes written (computed from memory, so a
// torn or corrupted write is caught on load).
FileRecord write_entries(const std::string& path, const std::vector<Entry>& entries);
// Writes a small text file, fsynced.
FileRecord write_text(const std::string& path, const std::string& text);

uint32_t crc32_of(const void* data, size_t size, uint32_t crc = 0);
// fsync of a directory (makes renames and new entries in it durable). Throws naming it.
void fsync_dir(const std::string& dir);
// rename(2) then fsync of the parent directory.
void durable_rename(const std::string& from, const std::string& to);

std::string iteration_dir_name(int64_t iteration);  // iter_0000042
// The iteration of a directory named iter_NNNNNNN, or nullopt.
std::optional<int64_t> parse_iteration_dir(const std::string& name);
// latest_checkpointed_iteration.txt of save_dir, or nullopt when absent. A malformed file is an
// error naming it.
std::optional<int64_t> read_tracker(const std::string& save_dir);
// Writes it atomically: temp file, fsync, rename, fsync of save_dir.
void write_tracker(const std::string& save_dir, int64_t iteration);

// The checkpoint directory to load from `load_dir`: load_dir itself when it holds a manifest,
// else iter_N of load_dir for N = `iteration` (>= 0) or the tracker's. nullopt when load_dir has
// neither a tracker nor a manifest (a fresh start, as in Megatron).
std::optional<std::string> resolve_checkpoint_dir(const std::string& load_dir, int64_t iteration = -1);

// A read-only checkpoint directory. Opening it reads manifest.json and checks that every file it
// names exists with the recorded size; each file's CRC is verified on first use. Every problem
// (missing/truncated/corrupt file, bad metadata, gaps in a reassembled tensor, shapes that do
// not fit the model) is an lf::Error naming the file or tensor.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  int64_t iteration() const { return iteration_; }
  // state.json as JSON text and config.yaml (empty when absent).
  const std::string& state_json() const { return state_json_; }
  std::string config_yaml() const;
  bool has_file(const std::string& name) const { return files_.count(name) > 0; }
  const std::map<std::string, FileRecord>& files() const { return files_; }

  // Parameter names with a piece of `kind`, in the order state.json lists them (then by name).
  std::vector<std::string> params(const std::string& kind = "param");
  bool has(const std::string& param, const std::string& kind);
  // The stored global shape and TP split of a parameter (from any of its pieces).
  ShardSpec layout_of(const std::string& param, const std::string& kind = "param");
  // The full tensor of a parameter (CPU, stored dtype), reassembled from all its pieces; every
  // element must be covered exactly once.
  at::Tensor full(const std::string& param, const std::string& kind);
  // This rank's shard for `want` (its global shape, split and rank), as `dtype`. The vocabulary
  // dim of embedding/output weights may differ (padding depends on TP): missing rows are zero,
  // dropped rows must be zero.
  at::Tensor shard(const std::string& param, const std::string& kind, const ShardSpec& want,
                   at::ScalarType dtype);
  // The bytes of a U8 tensor stored under `key` in `file` (RNG states).
  std::vector<uint8_t> bytes(const std::string& file, const std::string& key);

 private:
  struct Located {
    std::string file, key;
    Piece piece;
  };
  const lf::safetensors::Reader& reader(const std::string& file);
  void index_file(const std::string& file);

  std::string dir_;
  int64_t iteration_ = -1;
  std::string state_json_;
  std::vector<std::string> param_order_;
  std::map<std::string, FileRecord> files_;
  std::vector<std::shared_ptr<lf::MappedFile>> mapped_;  // the readers point into these
  std::map<std::string, std::unique_ptr<lf::safetensors::Reader>> readers_;
  std::map<std::pair<std::string, std::string>, std::vector<Located>> pieces_;
  bool indexed_ = false;
};

// Cuts a full tensor into the shard `spec` describes (a copy, contiguous).
at::Tensor cut_shard(const at::Tensor& full, const ShardSpec& spec);

}  // namespace lf::train::ckpt
