// loongforge-data inspect on a LeRobot dataset directory: a summary, or one episode dumped as the
// trainer sees it (data/lerobot_dataset.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "loongforge/core/strings.h"
#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/lerobot_dataset.h"

namespace lf::data::tools {
namespace {

lf::safetensors::DType st_dtype(at::ScalarType t, const std::string& key) {
  switch (t) {
    case at::kFloat: return lf::safetensors::DType::F32;
    case at::kDouble: return lf::safetensors::DType::F64;
    case at::kLong: return lf::safetensors::DType::I64;
    case at::kInt: return lf::safetensors::DType::I32;
    case at::kShort: return lf::safetensors::DType::I16;
    case at::kChar: return lf::safetensors::DType::I8;
    case at::kByte: return lf::safetensors::DType::U8;
    case at::kBool: return lf::safetensors::DType::BOOL;
    default: LF_FAIL("--dump-episode: tensor ", key, " has dtype ", t, ", which safetensors cannot hold here");
  }
}

int dump_episode(const LeRobotDataset& ds, const InspectOptions& o) {
  int64_t n = 0;
  try {
    size_t used = 0;
    n = std::stoll(o.dump_episode[0], &used);
    LF_CHECK(used == o.dump_episode[0].size(), "");
  } catch (...) {
    LF_FAIL("--dump-episode N OUT: N must be an episode index, got '", o.dump_episode[0], "'");
  }
  const std::string& out = o.dump_episode[1];
  const auto tensors = ds.episode_tensors(n);
  lf::safetensors::Writer w;
  for (const auto& [key, t] : tensors) w.add(key, st_dtype(t.scalar_type(), key), t.sizes().vec(), t.data_ptr());
  const LeRobotEpisode& ep = ds.episode(n);
  w.set_metadata("source", ds.root());
  w.set_metadata("codebase_version", ds.version());
  w.set_metadata("episode_index", std::to_string(n));
  w.set_metadata("fps", std::to_string(ds.fps()));
  w.set_metadata("tasks", nlohmann::json(ep.tasks).dump());
  const uint64_t bytes = w.write(out);
  std::printf("episode %lld (%lld frames) -> %s (%llu bytes):\n", static_cast<long long>(n),
              static_cast<long long>(ep.length), out.c_str(), static_cast<unsigned long long>(bytes));
  for (const auto& [key, t] : tensors)
    std::printf("  %-32s %-5s %s\n", key.c_str(), std::string(lf::safetensors::dtype_name(st_dtype(t.scalar_type(), key))).c_str(),
                lf::bracket_list(t.sizes().vec()).c_str());
  return 0;
}

}  // namespace

int run_inspect_lerobot(const InspectOptions& o) {
  LeRobotDataset ds(o.prefix);
  if (!o.dump_episode.empty()) return dump_episode(ds, o);
  std::printf("LeRobot dataset: %s\nversion: %s\nfps: %lld\nepisodes: %lld\nframes: %lld\ntasks: %zu\n",
              ds.root().c_str(), ds.version().c_str(), static_cast<long long>(ds.fps()),
              static_cast<long long>(ds.num_episodes()), static_cast<long long>(ds.num_frames()), ds.tasks().size());
  if (ds.num_episodes() > 0) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t e = 0; e < ds.num_episodes(); ++e)
      lo = std::min(lo, ds.episode(e).length), hi = std::max(hi, ds.episode(e).length);
    std::printf("episode length: min %lld, mean %.1f, max %lld frames\n", static_cast<long long>(lo),
                double(ds.num_frames()) / double(ds.num_episodes()), static_cast<long long>(hi));
  }
  std::printf("features:\n");
  for (const auto& f : ds.features()) {
    if (f.is_camera()) continue;
    std::string names;
    for (const auto& n : f.names) names += (names.empty() ? "" : ", ") + n;
    std::printf("  %-32s %-8s %-10s%s%s%s\n", f.key.c_str(), f.dtype.c_str(), lf::bracket_list(f.shape).c_str(),
                names.empty() ? "" : " (", names.c_str(), names.empty() ? "" : ")");
  }
  std::printf("cameras:\n");
  for (const auto& key : ds.camera_keys()) {
    const auto& f = ds.feature(key);
    std::printf("  %-32s %-8s %s%s\n", key.c_str(), f.dtype.c_str(), lf::bracket_list(f.shape).c_str(),
                ds.num_episodes() > 0 && f.dtype == "video" ? (" " + ds.episode(0).videos.at(key).path + " ...").c_str()
                                                            : "");
  }
  std::string with_stats;
  for (const auto& f : ds.features())
    if (ds.has_stats(f.key)) with_stats += (with_stats.empty() ? "" : ", ") + f.key;
  std::printf("stats: %s\n", with_stats.empty() ? "(none)" : with_stats.c_str());
  for (size_t t = 0; t < ds.tasks().size() && t < 10; ++t) std::printf("task %zu: %s\n", t, ds.tasks()[t].c_str());
  return 0;
}

}  // namespace lf::data::tools
