// LeRobot datasets read directly, as robot-learning users have them on disk: the v3.0 layout
// (episodes concatenated into chunked parquet and mp4 files) and the v2.1 layout (one parquet and
// one mp4 per episode), with what LeRobotDataset (lerobot 0.6) gives per frame: features, camera
// frames at the frame's timestamp, delta-timestamp windows with pad masks, the task string; and
// normalisation from the dataset's stats as lerobot's NormalizerProcessorStep does it. Not a
// writer, and not the hub: DATASET is a local directory (docs/data.md, "LeRobot datasets").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lf::data {

// One entry of meta/info.json "features".
struct LeRobotFeature {
  std::string key;
  std::string dtype;               // "float32", "int64", "bool", "video", "image", "string" ...
  std::vector<int64_t> shape;      // as info.json lists it ([H, W, C] for cameras)
  std::vector<std::string> names;  // flattened; empty when info.json has none
  bool is_camera() const { return dtype == "video" || dtype == "image"; }
};

// Where an episode's frames of one camera are: the file and the span within it.
struct LeRobotVideoSpan {
  std::string path;             // relative to the dataset root
  double from_timestamp = 0.0;  // the episode's first frame is at from_timestamp + timestamp
  double to_timestamp = 0.0;
};

struct LeRobotEpisode {
  int64_t index = 0;
  int64_t length = 0;
  int64_t from_index = 0, to_index = 0;  // global frame indices [from, to)
  std::vector<std::string> tasks;
  std::string data_path;  // relative to the root
  std::map<std::string, LeRobotVideoSpan> videos;
};

// Per-feature statistics (meta/stats.json, or v2.1's episodes_stats.jsonl aggregated as lerobot
// aggregates them): "mean", "std", "min", "max", "count", and the quantiles "q01", "q10", "q50",
// "q90", "q99" when present. Float64 tensors in the stats' own shapes ([C, 1, 1] for cameras).
using LeRobotFeatureStats = std::map<std::string, at::Tensor>;

enum class LeRobotNormMode { kIdentity, kMeanStd, kMinMax, kQuantiles, kQuantile10 };
// "IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10" (lerobot's NormalizationMode).
LeRobotNormMode parse_norm_mode(const std::string& name);

struct LeRobotOptions {
  // Per key, offsets in seconds from the frame's timestamp, each a multiple of 1 / fps within
  // tolerance_s: that key then comes as [len(deltas), ...] with `<key>_is_pad` (bool) marking the
  // offsets outside the episode (their values repeat the episode's first or last frame).
  std::map<std::string, std::vector<double>> delta_timestamps;
  // LeRobotDataset's tolerance_s: how far the chosen video frame may be from the wanted time.
  double tolerance_s = 1e-4;
};

// One frame as LeRobotDataset.__getitem__ returns it (return_uint8=True): features in their
// dtypes (float32 states/actions, int64 indices, float32 `timestamp`), camera frames uint8
// [C, H, W] (or [len(deltas), C, H, W]), `<key>_is_pad`, and the task string.
struct LeRobotItem {
  std::map<std::string, at::Tensor> tensors;
  std::string task;
};

// get() and episode_tensors() may run on several threads at once (a data file is read once, under
// a lock, and shared; each call opens its own video decoders).
class LeRobotDataset {
 public:
  // Reads meta/ (info, tasks, episodes, stats); data and videos are read when asked for. An
  // lf::Error naming the file for a missing meta/info.json, another codebase_version, a missing
  // or malformed metadata file, or a delta_timestamps key that is no feature.
  explicit LeRobotDataset(const std::string& root, LeRobotOptions options = {});
  ~LeRobotDataset();
  // Whether `dir` has a LeRobot dataset's layout (meta/info.json): how programs tell one from
  // LoongForge's own stores before opening it.
  static bool is_dataset(const std::string& dir);
  LeRobotDataset(LeRobotDataset&&) noexcept;
  LeRobotDataset& operator=(LeRobotDataset&&) noexcept;

  const std::string& root() const;
  const std::string& version() const;  // "v3.0" or "v2.1"
  int64_t fps() const;
  int64_t num_frames() const;
  int64_t num_episodes() const;
  const std::vector<LeRobotFeature>& features() const;
  const LeRobotFeature& feature(const std::string& key) const;  // an error naming the dataset and key
  std::vector<std::string> camera_keys() const;                 // video, then image features, in info.json order
  const std::vector<std::string>& tasks() const;                // by task_index
  const LeRobotEpisode& episode(int64_t episode_index) const;   // an error when out of range
  // Stats of `key`; an error naming meta/stats.json when the dataset has none for it.
  const LeRobotFeatureStats& stats(const std::string& key) const;
  bool has_stats(const std::string& key) const;

  // Frame `index` (global, 0 <= index < num_frames()) as LeRobotDataset[index] gives it. Errors
  // name the file and episode: a missing parquet or video file, a column absent, a video shorter
  // than the episode.
  LeRobotItem get(int64_t index) const;

  // Episode `episode_index` as the trainer sees it, one tensor per key over its T frames: each
  // recorded numeric feature as float32 [T, ...], each camera uint8 [T, C, H, W] decoded at the
  // frames' timestamps, `timestamp` float32 [T], and `frame_index`, `task_index`, `index`,
  // `episode_index` int64 [T] (what LeRobotDataset gives frame by frame, stacked).
  std::map<std::string, at::Tensor> episode_tensors(int64_t episode_index) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// lerobot's NormalizerProcessorStep._apply_transform on a float32 tensor (stats cast to float32
// and broadcast from the right; eps 1e-8): MEAN_STD (x - mean) / (std + eps); MIN_MAX and the
// quantile modes 2 (x - lo) / (hi - lo) - 1 with hi - lo == 0 replaced by eps, lo/hi being
// min/max, q01/q99 or q10/q90. `inverse` undoes it (MEAN_STD without eps, as lerobot). An error
// naming the missing statistic.
at::Tensor normalize(const at::Tensor& x, LeRobotNormMode mode, const LeRobotFeatureStats& stats, bool inverse = false,
                     double eps = 1e-8);

}  // namespace lf::data
