// LeRobot datasets, v3.0 and v2.1 (data/lerobot_dataset.h). Field names and semantics follow
// lerobot 0.6's datasets/ (utils.py for the layout, dataset_reader.py for what an item holds,
// video_utils.py for frame lookup, compute_stats.py for stats) and processor/normalize_processor.py.
#include "loongforge/data/lerobot_dataset.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "loongforge/core/error.h"
#include "loongforge/media/image.h"
#include "loongforge/media/video.h"
#include "parquet_table.h"

namespace lf::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The columns every LeRobot frame carries besides the recorded features.
const std::set<std::string> kIndexColumns = {"timestamp", "frame_index", "episode_index", "index", "task_index"};

bool numeric_dtype(const std::string& d) {
  static const std::set<std::string> kNumeric = {"float32", "float64", "int64", "int32", "int16",
                                                 "int8",    "uint8",   "bool"};
  return kNumeric.count(d) > 0;
}

json read_json(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  LF_CHECK(in.good(), path.string(), " (", what, ") is missing or unreadable",
           lf::hint("the dataset is incomplete: download or copy it again"));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    LF_FAIL(path.string(), " (", what, "): not valid JSON (", e.what(), ")");
  }
}

std::vector<json> read_jsonl(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  LF_CHECK(in.good(), path.string(), " (", what, ") is missing or unreadable",
           lf::hint("a v2.1 dataset keeps meta/episodes.jsonl and meta/tasks.jsonl; copy them again"));
  std::vector<json> out;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception& e) {
      LF_FAIL(path.string(), " line ", line_no, ": not valid JSON (", e.what(), ")");
    }
  }
  return out;
}

// Python's str.format for the path templates of info.json: "{name}" and "{name:0Nd}".
std::string format_template(const std::string& tpl, const std::map<std::string, std::string>& strings,
                            const std::map<std::string, int64_t>& ints, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < tpl.size();) {
    if (tpl[i] != '{') {
      out += tpl[i++];
      continue;
    }
    const size_t close = tpl.find('}', i);
    LF_CHECK(close != std::string::npos, where, ": unterminated '{' in path template \"", tpl, "\"");
    std::string field = tpl.substr(i + 1, close - i - 1), spec;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (auto s = strings.find(field); s != strings.end()) {
      out += s->second;
    } else if (auto n = ints.find(field); n != ints.end()) {
      std::string digits = std::to_string(n->second);
      if (!spec.empty()) {
        LF_CHECK(spec.back() == 'd', where, ": path template field {", field, ":", spec, "} is not an integer format");
        const size_t width = size_t(std::stoul(spec.substr(0, spec.size() - 1)));
        if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      }
      out += digits;
    } else {
      LF_FAIL(where, ": unknown field {", field, "} in path template \"", tpl, "\"");
    }
    i = close + 1;
  }
  return out;
}

// Nested JSON number lists -> a float64 tensor of their shape.
at::Tensor json_tensor(const json& j, const std::string& where) {
  std::vector<int64_t> shape;
  const json* level = &j;
  while (level->is_array()) {
    shape.push_back(int64_t(level->size()));
    if (level->empty()) break;
    level = &(*level)[0];
  }
  std::vector<double> values;
  std::function<void(const json&, size_t)> walk = [&](const json& v, size_t depth) {
    if (depth == shape.size()) {
      LF_CHECK(v.is_number(), where, ": expected a number, got ", v.dump());
      values.push_back(v.get<double>());
      return;
    }
    LF_CHECK(v.is_array() && int64_t(v.size()) == shape[depth], where, ": ragged nested lists");
    for (const auto& e : v) walk(e, depth + 1);
  };
  walk(j, 0);
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble)).reshape(shape);
}

LeRobotFeatureStats stats_from_json(const json& j, const std::string& where) {
  LeRobotFeatureStats s;
  for (const auto& [name, v] : j.items()) s[name] = json_tensor(v, where + " stat " + name);
  return s;
}

// compute_stats.aggregate_feature_stats: count-weighted mean, pooled variance, min of mins, max of
// maxes, count-weighted quantiles; in float64 like numpy.
LeRobotFeatureStats aggregate_stats(const std::vector<const LeRobotFeatureStats*>& list, const std::string& where) {
  auto stack = [&](const std::string& k) {
    std::vector<at::Tensor> v;
    for (const auto* s : list) {
      auto it = s->find(k);
      LF_CHECK(it != s->end(), where, ": an episode has no '", k, "'");
      v.push_back(it->second);
    }
    return at::stack(v);
  };
  const at::Tensor means = stack("mean"), variances = stack("std").pow(2);
  at::Tensor counts = stack("count");
  const at::Tensor total = counts.sum(0);
  while (counts.dim() < means.dim()) counts = counts.unsqueeze(-1);
  const at::Tensor total_mean = (means * counts).sum(0) / total;
  const at::Tensor delta = means - total_mean;
  const at::Tensor total_var = ((variances + delta.pow(2)) * counts).sum(0) / total;
  LeRobotFeatureStats out{{"min", std::get<0>(stack("min").min(0))},
                          {"max", std::get<0>(stack("max").max(0))},
                          {"mean", total_mean},
                          {"std", at::sqrt(total_var)},
                          {"count", total}};
  for (const auto& [k, v] : *list.front()) {
    if (k.size() < 2 || k[0] != 'q' || !std::all_of(k.begin() + 1, k.end(), ::isdigit)) continue;
    if (!std::all_of(list.begin(), list.end(), [&](const auto* s) { return s->count(k) > 0; })) continue;
    out[k] = (stack(k) * counts).sum(0) / total;
  }
  return out;
}

// A data parquet file's frames: numeric columns as tensors, rows found by their `index`.
struct FrameTable {
  std::string path;
  std::map<std::string, at::Tensor> columns;
  std::map<std::string, std::vector<std::string>> images;  // PNG/JPEG bytes of image features
  int64_t first_index = 0;
  bool contiguous = true;
  std::unordered_map<int64_t, int64_t> rows;  // index -> row when not contiguous
  int64_t num_rows = 0;

  int64_t row_of(int64_t index) const {
    if (contiguous) return index - first_index >= 0 && index - first_index < num_rows ? index - first_index : -1;
    auto it = rows.find(index);
    return it == rows.end() ? -1 : it->second;
  }
};

at::Tensor image_tensor(const lf::media::Image& im) {
  at::Tensor hwc = at::empty({im.height, im.width, 3}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(hwc.data_ptr(), im.rgb.data(), im.rgb.size());
  return hwc.permute({2, 0, 1}).contiguous();  // [C, H, W] as torchvision / LeRobot
}

}  // namespace

struct LeRobotDataset::Impl {
  std::string root, version;
  LeRobotOptions options;
  int64_t fps = 0, total_frames = 0, chunks_size = 1000;
  std::vector<LeRobotFeature> features;
  std::vector<std::string> tasks;
  std::vector<LeRobotEpisode> episodes;  // by episode_index
  std::map<std::string, LeRobotFeatureStats> stats;
  std::map<std::string, std::vector<int64_t>> delta_indices;
  json info;  // meta/info.json

  mutable std::mutex mu;
  mutable std::map<std::string, std::shared_ptr<const FrameTable>> tables;

  std::string info_path() const { return (fs::path(root) / "meta" / "info.json").string(); }
  std::string where() const { return "LeRobot dataset " + root; }

  const LeRobotFeature* find_feature(const std::string& key) const {
    for (const auto& f : features)
      if (f.key == key) return &f;
    return nullptr;
  }

  void read_info() {
    LF_CHECK(fs::exists(info_path()), where(), ": meta/info.json is missing",
             lf::hint("DATASET must be a LeRobot dataset's root directory (the one holding meta/, data/ and "
                      "videos/), e.g. a local copy of its hub repository"));
    info = read_json(info_path(), "LeRobot metadata");
    version = info.value("codebase_version", "");
    LF_CHECK(version == "v3.0" || version == "v2.1", info_path(), ": codebase_version \"", version,
             "\" is not supported (v3.0 and v2.1 are)",
             lf::hint("convert older datasets with lerobot: python -m lerobot.datasets.v21.convert_dataset_v20_to_v21, "
                      "then lerobot.scripts.convert_dataset_v21_to_v30"));
    try {
      fps = int64_t(std::llround(info.at("fps").get<double>()));
      total_frames = info.value("total_frames", int64_t(0));
      chunks_size = info.value("chunks_size", int64_t(1000));
      // Features in info.json's order (LeRobot's camera order), which json's sorted map loses.
      std::ifstream in(info_path());
      const auto ordered = nlohmann::ordered_json::parse(in);
      for (const auto& entry : ordered.at("features").items()) {
        const std::string& key = entry.key();
        const json& f = info.at("features").at(key);
        LeRobotFeature ft;
        ft.key = key;
        ft.dtype = f.at("dtype").get<std::string>();
        for (const auto& d : f.value("shape", json::array())) ft.shape.push_back(d.get<int64_t>());
        std::function<void(const json&)> names = [&](const json& n) {
          if (n.is_string()) ft.names.push_back(n.get<std::string>());
          else if (n.is_array() || n.is_object())
            for (const auto& e : n) names(e);
        };
        if (f.contains("names") && !f["names"].is_null()) names(f["names"]);
        features.push_back(std::move(ft));
      }
    } catch (const json::exception& e) {
      LF_FAIL(info_path(), ": malformed (", e.what(), ")");
    }
    LF_CHECK(fps > 0, info_path(), ": fps ", fps, " must be positive");
  }

  std::string path_template(const char* key, const char* fallback) const {
    return info.contains(key) && info[key].is_string() ? info[key].get<std::string>() : std::string(fallback);
  }

  void read_v3() {
    const fs::path meta = fs::path(root) / "meta";
    // Tasks: the index of the pandas frame lerobot writes is a column named "task".
    const auto tasks_table = parquet::Table::read((meta / "tasks.parquet").string(), "tasks");
    const at::Tensor task_index = tasks_table.tensor("task_index").to(at::kLong);
    const auto task_strings = tasks_table.strings("task");
    tasks.assign(size_t(task_index.numel()), "");
    for (int64_t i = 0; i < task_index.numel(); ++i) {
      const int64_t t = task_index[i].item<int64_t>();
      LF_CHECK(t >= 0 && t < task_index.numel(), tasks_table.path(), ": task_index ", t, " out of range");
      tasks[size_t(t)] = task_strings[size_t(i)];
    }
    // Episodes: meta/episodes/chunk-*/file-*.parquet, one row per episode.
    std::vector<std::string> files;
    const fs::path ep_dir = meta / "episodes";
    LF_CHECK(fs::is_directory(ep_dir), where(), ": meta/episodes/ is missing",
             lf::hint("a v3.0 dataset keeps its episode table in meta/episodes/chunk-*/file-*.parquet"));
    for (const auto& e : fs::recursive_directory_iterator(ep_dir))
      if (e.is_regular_file() && e.path().extension() == ".parquet") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    LF_CHECK(!files.empty(), where(), ": no parquet file under meta/episodes/");
    const std::string data_tpl = path_template("data_path", "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet");
    const std::string video_tpl =
        path_template("video_path", "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4");
    for (const auto& file : files) {
      const auto t = parquet::Table::read(file, "episode table");
      const at::Tensor idx = t.tensor("episode_index").to(at::kLong), len = t.tensor("length").to(at::kLong),
                       from = t.tensor("dataset_from_index").to(at::kLong),
                       to = t.tensor("dataset_to_index").to(at::kLong),
                       dchunk = t.tensor("data/chunk_index").to(at::kLong),
                       dfile = t.tensor("data/file_index").to(at::kLong);
      const auto ep_tasks = t.string_lists("tasks");
      std::map<std::string, std::array<at::Tensor, 4>> vids;
      for (const auto& f : features) {
        if (f.dtype != "video") continue;
        const std::string p = "videos/" + f.key + "/";
        vids[f.key] = {t.tensor(p + "chunk_index").to(at::kLong), t.tensor(p + "file_index").to(at::kLong),
                       t.tensor(p + "from_timestamp").to(at::kDouble), t.tensor(p + "to_timestamp").to(at::kDouble)};
      }
      for (int64_t r = 0; r < t.num_rows(); ++r) {
        LeRobotEpisode ep;
        ep.index = idx[r].item<int64_t>();
        ep.length = len[r].item<int64_t>();
        ep.from_index = from[r].item<int64_t>();
        ep.to_index = to[r].item<int64_t>();
        ep.tasks = ep_tasks[size_t(r)];
        ep.data_path = format_template(data_tpl, {}, {{"chunk_index", dchunk[r].item<int64_t>()},
                                                      {"file_index", dfile[r].item<int64_t>()}}, info_path());
        for (const auto& [key, v] : vids) {
          ep.videos[key] = {format_template(video_tpl, {{"video_key", key}},
                                            {{"chunk_index", v[0][r].item<int64_t>()},
                                             {"file_index", v[1][r].item<int64_t>()}},
                                            info_path()),
                            v[2][r].item<double>(), v[3][r].item<double>()};
        }
        episodes.push_back(std::move(ep));
      }
    }
    const fs::path stats_path = meta / "stats.json";
    if (fs::exists(stats_path)) read_stats_json(stats_path);
  }

  void read_stats_json(const fs::path& path) {
    const json j = read_json(path, "stats");  // kept alive: items() only views it
    for (const auto& [key, s] : j.items()) stats[key] = stats_from_json(s, path.string() + " " + key);
  }

  void read_v21() {
    const fs::path meta = fs::path(root) / "meta";
    LF_CHECK(chunks_size > 0, info_path(), ": chunks_size ", chunks_size, " must be positive");
    for (const auto& j : read_jsonl(meta / "tasks.jsonl", "tasks")) {
      int64_t t = 0;
      std::string text;
      try {
        t = j.at("task_index").get<int64_t>();
        text = j.at("task").get<std::string>();
      } catch (const json::exception& e) {
        LF_FAIL((meta / "tasks.jsonl").string(), ": ", e.what(), " in ", j.dump());
      }
      LF_CHECK(t >= 0 && t < 10'000'000, (meta / "tasks.jsonl").string(), ": task_index ", t);
      if (int64_t(tasks.size()) <= t) tasks.resize(size_t(t + 1));
      tasks[size_t(t)] = text;
    }
    const std::string data_tpl =
        path_template("data_path", "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet");
    const std::string video_tpl =
        path_template("video_path", "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4");
    for (const auto& j : read_jsonl(meta / "episodes.jsonl", "episodes")) {
      LeRobotEpisode ep;
      try {
        ep.index = j.at("episode_index").get<int64_t>();
        ep.length = j.at("length").get<int64_t>();
        for (const auto& t : j.value("tasks", json::array())) ep.tasks.push_back(t.get<std::string>());
      } catch (const json::exception& e) {
        LF_FAIL((meta / "episodes.jsonl").string(), ": ", e.what(), " in ", j.dump().substr(0, 200));
      }
      LF_CHECK(ep.index >= 0, (meta / "episodes.jsonl").string(), ": episode_index ", ep.index, " is negative");
      const std::map<std::string, int64_t> ints{{"episode_chunk", ep.index / chunks_size},
                                                {"episode_index", ep.index}};
      ep.data_path = format_template(data_tpl, {}, ints, info_path());
      for (const auto& f : features)
        if (f.dtype == "video")
          ep.videos[f.key] = {format_template(video_tpl, {{"video_key", f.key}}, ints, info_path()), 0.0,
                              double(ep.length) / double(fps)};
      episodes.push_back(std::move(ep));
    }
    // v2.1 numbers frames globally in episode order.
    std::sort(episodes.begin(), episodes.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
    int64_t next = 0;
    for (auto& ep : episodes) ep.from_index = next, ep.to_index = next += ep.length;
    // Stats: meta/stats.json when present, else the episodes' stats aggregated as lerobot does.
    const fs::path stats_path = meta / "stats.json", ep_stats = meta / "episodes_stats.jsonl";
    if (fs::exists(stats_path)) {
      read_stats_json(stats_path);
    } else if (fs::exists(ep_stats)) {
      std::map<std::string, std::vector<LeRobotFeatureStats>> per_key;
      for (const auto& j : read_jsonl(ep_stats, "episode stats")) {
        LF_CHECK(j.contains("stats") && j.at("stats").is_object(), ep_stats.string(), ": a line without a \"stats\" object");
        for (const auto& [key, s] : j.at("stats").items())
          per_key[key].push_back(stats_from_json(s, ep_stats.string() + " " + key));
      }
      for (const auto& [key, list] : per_key) {
        std::vector<const LeRobotFeatureStats*> ptrs;
        for (const auto& s : list) ptrs.push_back(&s);
        stats[key] = aggregate_stats(ptrs, ep_stats.string() + " " + key);
      }
    }
  }

  void check_episodes() {
    std::sort(episodes.begin(), episodes.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
    LF_CHECK(!episodes.empty(), where(), ": the dataset lists no episodes", lf::hint("check meta/episodes"));
    LF_CHECK(episodes.front().from_index == 0, where(), ": episode 0 starts at frame ", episodes.front().from_index,
             ", not 0");
    for (size_t i = 0; i < episodes.size(); ++i) {
      const auto& ep = episodes[i];
      LF_CHECK(ep.index == int64_t(i), where(), ": episode indices are not 0..", episodes.size() - 1, " (found ",
               ep.index, " at position ", i, ")", lf::hint("read the dataset before filtering or deleting episodes"));
      LF_CHECK(ep.to_index - ep.from_index == ep.length && ep.length > 0, where(), ": episode ", ep.index,
               " spans frames [", ep.from_index, ", ", ep.to_index, ") but has length ", ep.length);
      LF_CHECK(i == 0 || ep.from_index == episodes[i - 1].to_index, where(), ": episode ", ep.index,
               " starts at frame ", ep.from_index, ", not where episode ", i - 1, " ends (", episodes[i - 1].to_index,
               ")");
    }
    total_frames = episodes.back().to_index;
  }

  void set_deltas() {
    for (const auto& [key, deltas] : options.delta_timestamps) {
      LF_CHECK(find_feature(key) != nullptr, where(), ": delta_timestamps names '", key,
               "', which is not a feature of ", info_path());
      auto& idx = delta_indices[key];
      for (double d : deltas) {
        // feature_utils.check_delta_timestamps / get_delta_indices (round half to even).
        const double frames = d * double(fps);
        LF_CHECK(std::fabs(frames - std::nearbyint(frames)) / double(fps) <= options.tolerance_s, where(),
                 ": delta timestamp ", d, " s of '", key, "' is not a multiple of 1/", fps, " s within ",
                 options.tolerance_s, " s");
        idx.push_back(int64_t(std::nearbyint(frames)));
      }
    }
  }

  const LeRobotEpisode& episode_of(int64_t index) const {
    LF_CHECK(index >= 0 && index < total_frames, where(), ": frame ", index, " is outside [0, ", total_frames, ")");
    auto it = std::upper_bound(episodes.begin(), episodes.end(), index,
                               [](int64_t i, const LeRobotEpisode& ep) { return i < ep.from_index; });
    return *std::prev(it);
  }

  std::shared_ptr<const FrameTable> table(const LeRobotEpisode& ep) const {
    const std::string path = (fs::path(root) / ep.data_path).string();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = tables.find(path); it != tables.end()) return it->second;
    }
    const auto raw = parquet::Table::read(path, "data of episode " + std::to_string(ep.index));
    auto t = std::make_shared<FrameTable>();
    t->path = path;
    t->num_rows = raw.num_rows();
    for (const auto& f : features) {
      if (f.dtype == "image" && raw.has(f.key)) t->images[f.key] = raw.struct_binary(f.key, "bytes");
      if (!numeric_dtype(f.dtype) || !raw.has(f.key)) continue;
      t->columns[f.key] = raw.tensor(f.key);
    }
    for (const auto& k : kIndexColumns) {
      LF_CHECK(raw.has(k), path, " (data of episode ", ep.index, "): no column '", k, "'",
               lf::hint("every LeRobot frame has timestamp, frame_index, episode_index, index and task_index"));
      if (!t->columns.count(k)) t->columns[k] = raw.tensor(k);
    }
    const at::Tensor index = t->columns.at("index").to(at::kLong).contiguous();
    const int64_t* p = index.data_ptr<int64_t>();
    t->first_index = t->num_rows ? p[0] : 0;
    for (int64_t r = 0; r < t->num_rows; ++r) t->contiguous = t->contiguous && p[r] == t->first_index + r;
    if (!t->contiguous)
      for (int64_t r = 0; r < t->num_rows; ++r) t->rows[p[r]] = r;
    std::lock_guard<std::mutex> lock(mu);
    return tables.emplace(path, std::move(t)).first->second;
  }

  int64_t row(const FrameTable& t, const LeRobotEpisode& ep, int64_t index) const {
    const int64_t r = t.row_of(index);
    LF_CHECK(r >= 0, t.path, " (data of episode ", ep.index, "): no row with index ", index,
             lf::hint("the data file and meta/episodes disagree; the dataset is damaged or partly copied"));
    return r;
  }

  const LeRobotFeature& feature_or_fail(const std::string& key) const {
    if (const auto* f = find_feature(key)) return *f;
    std::string keys;
    for (const auto& f : features) keys += (keys.empty() ? "" : ", ") + f.key;
    LF_FAIL(where(), ": no feature '", key, "' in meta/info.json (features: ", keys, ")");
  }

  const LeRobotEpisode& episode_or_fail(int64_t e) const {
    LF_CHECK(e >= 0 && e < int64_t(episodes.size()), where(), ": episode ", e, " is outside [0, ", episodes.size(),
             ")", lf::hint("episodes are numbered from 0; `loongforge-data inspect DATASET` shows how many there are"));
    return episodes[size_t(e)];
  }

  // Frames of camera `key` of episode `ep` at the episode's `timestamps` -> uint8 [n, C, H, W].
  at::Tensor camera(const LeRobotEpisode& ep, const std::string& key, const std::vector<double>& timestamps,
                    const FrameTable& t, const std::vector<int64_t>& rows) const {
    const LeRobotFeature& f = feature_or_fail(key);
    std::vector<at::Tensor> frames;
    if (f.dtype == "image") {
      auto it = t.images.find(key);
      LF_CHECK(it != t.images.end(), t.path, " (data of episode ", ep.index, "): no column '", key, "'");
      for (int64_t r : rows)
        frames.push_back(image_tensor(lf::media::decode_image_bytes(
            reinterpret_cast<const uint8_t*>(it->second[size_t(r)].data()), it->second[size_t(r)].size(),
            t.path + " " + key + " row " + std::to_string(r))));
      return at::stack(frames);
    }
    const LeRobotVideoSpan& span = ep.videos.at(key);
    const std::string path = (fs::path(root) / span.path).string();
    LF_CHECK(fs::exists(path), path, " (camera ", key, " of episode ", ep.index, ") is missing",
             lf::hint("the dataset's videos/ are incomplete: download or copy them again"));
    std::vector<double> shifted;
    for (double ts : timestamps) shifted.push_back(span.from_timestamp + ts);
    std::vector<lf::media::Image> images;
    try {
      images = lf::media::decode_video_at(path, shifted, options.tolerance_s, lf::media::RgbConversion::kPyAV);
    } catch (const lf::Error& e) {
      LF_FAIL("camera ", key, " of episode ", ep.index, " (frames ", ep.from_index, "..", ep.to_index - 1,
              ", video from ", span.from_timestamp, " s): ", e.message(), lf::hint(e.hint()));
    }
    for (const auto& im : images) frames.push_back(image_tensor(im));
    return at::stack(frames);
  }
};

LeRobotNormMode parse_norm_mode(const std::string& name) {
  if (name == "IDENTITY") return LeRobotNormMode::kIdentity;
  if (name == "MEAN_STD") return LeRobotNormMode::kMeanStd;
  if (name == "MIN_MAX") return LeRobotNormMode::kMinMax;
  if (name == "QUANTILES") return LeRobotNormMode::kQuantiles;
  if (name == "QUANTILE10") return LeRobotNormMode::kQuantile10;
  LF_FAIL("unknown normalisation mode '", name, "'",
          lf::hint("one of IDENTITY, MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10 (lerobot's NormalizationMode)"));
}

LeRobotDataset::LeRobotDataset(const std::string& root, LeRobotOptions options) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.root = root;
  m.options = std::move(options);
  m.read_info();
  if (m.version == "v3.0") m.read_v3();
  else m.read_v21();
  m.check_episodes();
  m.set_deltas();
}

bool LeRobotDataset::is_dataset(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "meta" / "info.json", ec);
}

LeRobotDataset::~LeRobotDataset() = default;
LeRobotDataset::LeRobotDataset(LeRobotDataset&&) noexcept = default;
LeRobotDataset& LeRobotDataset::operator=(LeRobotDataset&&) noexcept = default;

const std::string& LeRobotDataset::root() const { return impl_->root; }
const std::string& LeRobotDataset::version() const { return impl_->version; }
int64_t LeRobotDataset::fps() const { return impl_->fps; }
int64_t LeRobotDataset::num_frames() const { return impl_->total_frames; }
int64_t LeRobotDataset::num_episodes() const { return int64_t(impl_->episodes.size()); }
const std::vector<LeRobotFeature>& LeRobotDataset::features() const { return impl_->features; }
const LeRobotFeature& LeRobotDataset::feature(const std::string& key) const { return impl_->feature_or_fail(key); }
const std::vector<std::string>& LeRobotDataset::tasks() const { return impl_->tasks; }
const LeRobotEpisode& LeRobotDataset::episode(int64_t e) const { return impl_->episode_or_fail(e); }
bool LeRobotDataset::has_stats(const std::string& key) const { return impl_->stats.count(key) > 0; }

std::vector<std::string> LeRobotDataset::camera_keys() const {
  std::vector<std::string> keys;
  for (const char* dtype : {"video", "image"})
    for (const auto& f : impl_->features)
      if (f.dtype == dtype) keys.push_back(f.key);
  return keys;
}

const LeRobotFeatureStats& LeRobotDataset::stats(const std::string& key) const {
  auto it = impl_->stats.find(key);
  LF_CHECK(it != impl_->stats.end(), impl_->where(), ": no stats for '", key, "' (meta/stats.json",
           impl_->version == "v2.1" ? " or meta/episodes_stats.jsonl" : "", ")",
           lf::hint("recompute the dataset's stats with lerobot, or normalise this key with IDENTITY"));
  return it->second;
}

LeRobotItem LeRobotDataset::get(int64_t index) const {
  const auto& m = *impl_;
  const LeRobotEpisode& ep = m.episode_of(index);
  const auto t = m.table(ep);
  const int64_t row = m.row(*t, ep, index);
  LeRobotItem item;
  // Copies: the table is cached and shared, the item is the caller's to modify.
  for (const auto& [key, col] : t->columns) item.tensors[key] = col[row].clone();
  // dataset_reader._get_query_indices: offsets clamped into the episode, pads where they left it.
  std::map<std::string, std::vector<int64_t>> query_rows;
  for (const auto& [key, deltas] : m.delta_indices) {
    std::vector<int64_t> rows;
    at::Tensor pad = at::empty({int64_t(deltas.size())}, at::TensorOptions().dtype(at::kBool));
    for (size_t i = 0; i < deltas.size(); ++i) {
      const int64_t q = index + deltas[i];
      pad.data_ptr<bool>()[i] = q < ep.from_index || q >= ep.to_index;
      rows.push_back(m.row(*t, ep, std::clamp(q, ep.from_index, ep.to_index - 1)));
    }
    item.tensors[key + "_is_pad"] = pad;
    query_rows[key] = rows;
    if (auto col = t->columns.find(key); col != t->columns.end()) {
      item.tensors[key] = col->second.index_select(0, at::tensor(rows, at::TensorOptions().dtype(at::kLong)));
    }
  }
  const at::Tensor& ts = t->columns.at("timestamp");
  for (const auto& key : camera_keys()) {
    std::vector<int64_t> rows{row};
    if (auto q = query_rows.find(key); q != query_rows.end()) rows = q->second;
    std::vector<double> times;
    for (int64_t r : rows) times.push_back(ts[r].item<double>());
    at::Tensor frames = m.camera(ep, key, times, *t, rows);
    // LeRobot squeezes the query axis when it has one entry (frames.squeeze(0)).
    item.tensors[key] = frames.size(0) == 1 ? frames.squeeze(0) : frames;
  }
  const int64_t task = item.tensors.at("task_index").item<int64_t>();
  LF_CHECK(task >= 0 && task < int64_t(m.tasks.size()), t->path, " (data of episode ", ep.index, "): task_index ",
           task, " is not in the dataset's ", m.tasks.size(), " tasks");
  item.task = m.tasks[size_t(task)];
  return item;
}

std::map<std::string, at::Tensor> LeRobotDataset::episode_tensors(int64_t episode_index) const {
  const auto& m = *impl_;
  const LeRobotEpisode& ep = m.episode_or_fail(episode_index);
  const auto t = m.table(ep);
  const int64_t first = m.row(*t, ep, ep.from_index), last = m.row(*t, ep, ep.to_index - 1);
  LF_CHECK(last - first + 1 == ep.length, t->path, " (data of episode ", ep.index, "): rows ", first, "..", last,
           " for ", ep.length, " frames");
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, col] : t->columns) {
    at::Tensor v = col.slice(0, first, last + 1);
    // Indices keep their integer dtype (and timestamp its float32); recorded features go float32.
    out[key] = kIndexColumns.count(key) ? v.clone() : v.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  }
  std::vector<double> times;
  std::vector<int64_t> rows;
  const at::Tensor ts = out.at("timestamp").to(at::kDouble).contiguous();
  for (int64_t i = 0; i < ep.length; ++i) times.push_back(ts.data_ptr<double>()[i]), rows.push_back(first + i);
  for (const auto& key : camera_keys()) out[key] = m.camera(ep, key, times, *t, rows);
  return out;
}

at::Tensor normalize(const at::Tensor& x, LeRobotNormMode mode, const LeRobotFeatureStats& stats, bool inverse,
                     double eps) {
  if (mode == LeRobotNormMode::kIdentity) return x;
  auto stat = [&](const char* name, const char* mode_name) {
    auto it = stats.find(name);
    LF_CHECK(it != stats.end(), mode_name, " normalisation needs the '", name, "' statistic, which the stats lack",
             lf::hint("recompute the dataset's stats with lerobot (quantiles: its augment_dataset_quantile_stats "
                      "script), or pick another mode"));
    return it->second.to(x.dtype());
  };
  if (mode == LeRobotNormMode::kMeanStd) {
    const at::Tensor mean = stat("mean", "MEAN_STD"), std = stat("std", "MEAN_STD");
    return inverse ? x * std + mean : (x - mean) / (std + eps);
  }
  const char* lo_name = mode == LeRobotNormMode::kMinMax ? "min" : mode == LeRobotNormMode::kQuantiles ? "q01" : "q10";
  const char* hi_name = mode == LeRobotNormMode::kMinMax ? "max" : mode == LeRobotNormMode::kQuantiles ? "q99" : "q90";
  const char* mode_name = mode == LeRobotNormMode::kMinMax     ? "MIN_MAX"
                          : mode == LeRobotNormMode::kQuantiles ? "QUANTILES"
                                                                : "QUANTILE10";
  const at::Tensor lo = stat(lo_name, mode_name), hi = stat(hi_name, mode_name);
  at::Tensor denom = hi - lo;
  // A constant dimension (hi == lo) divides by eps instead of zero, as lerobot does.
  denom = at::where(denom == 0, at::scalar_tensor(eps, at::TensorOptions().dtype(x.dtype())), denom);
  // The same operations in lerobot's order (its MIN_MAX and quantile inverses differ in order).
  if (inverse) return mode == LeRobotNormMode::kMinMax ? (x + 1) / 2 * denom + lo : (x + 1.0) * denom / 2.0 + lo;
  return 2 * (x - lo) / denom - 1;
}

}  // namespace lf::data
