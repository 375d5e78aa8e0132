// LeRobot datasets read by lf::data::LeRobotDataset against lerobot 0.6 itself
// (tests/data/lerobot_dataset_oracle.py, run with .venv-lerobot): a v3.0 dataset lerobot recorded
// (create / add_frame / save_episode / finalize, two AV1 cameras) read item by item with delta
// timestamps, an episode as `inspect --dump-episode` writes it, normalisation in every mode, the
// same recording in the v2.1 layout, and the errors a user meets (each naming file and episode).
//
// Frames are compared exactly: LeRobot decodes with PyAV here (torchcodec cannot load against
// Debian 12's FFmpeg 5.1), whose RGB conversion is swscale's default unscaled YUV -> RGB path, which
// the reader asks the system libswscale for (media::RgbConversion::kPyAV). Float32 values
// (states, actions, timestamps, normalised values) are compared bit for bit too.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/error_message.h"
#include "../support/oracle_cache.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/lerobot_dataset.h"

namespace {

namespace fs = std::filesystem;
using lf::data::LeRobotDataset;
using lf::testing::error_message;

std::string oracle_dir() {
  static const std::string d =
      lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/data/lerobot_dataset_oracle.py", "lerobot_dataset",
                                 "done", lf::testing::lerobot_python());
  return d;
}

#define NEED_ORACLE()   \
  const std::string o = oracle_dir(); \
  if (o.empty()) GTEST_SKIP() << "LeRobot oracle unavailable (.venv-lerobot missing)"

std::map<std::string, at::Tensor> read_tensors(const std::string& file) {
  auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : r.tensors()) {
    at::ScalarType dtype = at::kFloat;
    switch (info.dtype) {
      case lf::safetensors::DType::F32: dtype = at::kFloat; break;
      case lf::safetensors::DType::F64: dtype = at::kDouble; break;
      case lf::safetensors::DType::I64: dtype = at::kLong; break;
      case lf::safetensors::DType::U8: dtype = at::kByte; break;
      case lf::safetensors::DType::BOOL: dtype = at::kBool; break;
      default: ADD_FAILURE() << file << ": unexpected dtype of " << info.name;
    }
    auto t = at::empty(info.shape, at::TensorOptions().dtype(dtype));
    std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
    out[info.name] = t;
  }
  return out;
}

// Same dtype, shape and every value (NaN-free data).
void expect_identical(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (got.scalar_type() == at::kByte) {
    const int64_t diff = (got.to(at::kInt) - want.to(at::kInt)).abs().max().item<int64_t>();
    EXPECT_EQ(diff, 0) << what << ": frames differ by up to " << diff;
  } else {
    EXPECT_TRUE(at::equal(got, want)) << what << "\ngot\n" << got << "\nwant\n" << want;
  }
}

std::string copy_of(const std::string& dir, const std::string& name) {
  const std::string d = lf::testing::make_temp_dir("lerobot-" + name);
  fs::copy(dir, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

const std::map<std::string, std::vector<double>> kDeltas = {
    {"action", {0.0, 0.1, 0.2, 0.3}},
    {"observation.state", {-0.1, 0.0}},
    {"observation.images.front", {-0.2, 0.0}},
};

TEST(LeRobotV30, MetadataAsLeRobotWroteIt) {
  NEED_ORACLE();
  LeRobotDataset ds(o + "/v30");
  EXPECT_EQ(ds.version(), "v3.0");
  EXPECT_EQ(ds.fps(), 10);
  EXPECT_EQ(ds.num_episodes(), 3);
  EXPECT_EQ(ds.num_frames(), 12 + 7 + 9);
  EXPECT_EQ(ds.camera_keys(), (std::vector<std::string>{"observation.images.front", "observation.images.wrist"}));
  EXPECT_EQ(ds.feature("observation.state").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(ds.feature("observation.state").names, (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(ds.feature("observation.images.front").shape, (std::vector<int64_t>{32, 48, 3}));
  EXPECT_EQ(ds.tasks(), (std::vector<std::string>{"pick up the red cube", "put the cube in the bowl"}));
  EXPECT_EQ(ds.episode(1).from_index, 12);
  EXPECT_EQ(ds.episode(1).to_index, 19);
  EXPECT_EQ(ds.episode(1).tasks, (std::vector<std::string>{"put the cube in the bowl"}));
  // v3.0 concatenates episodes: episode 2 starts 1.9 s into the camera's file.
  EXPECT_NEAR(ds.episode(2).videos.at("observation.images.front").from_timestamp, 1.9, 1e-9);
  EXPECT_TRUE(ds.has_stats("action"));
  EXPECT_EQ(ds.stats("action").at("mean").sizes(), (at::IntArrayRef{2}));
  EXPECT_EQ(ds.stats("observation.images.front").at("mean").sizes(), (at::IntArrayRef{3, 1, 1}));
}

void expect_items_equal(const std::string& o, const std::string& name) {
  LeRobotDataset ds(o + "/" + name, {kDeltas, 1e-4});
  const auto want = read_tensors(o + "/" + name + "_items.safetensors");
  const auto meta = nlohmann::json::parse(lf::testing::read_text(o + "/" + name + "_items.json"));
  ASSERT_EQ(ds.num_frames(), meta["num_frames"].get<int64_t>());
  for (int64_t i = 0; i < ds.num_frames(); ++i) {
    const auto item = ds.get(i);
    size_t keys = 0;
    for (const auto& [name, t] : want) {
      const std::string prefix = std::to_string(i) + "/";
      if (name.rfind(prefix, 0) != 0) continue;
      ++keys;
      const std::string key = name.substr(prefix.size());
      auto it = item.tensors.find(key);
      ASSERT_NE(it, item.tensors.end()) << "frame " << i << ": no " << key;
      expect_identical(it->second, t, "frame " + std::to_string(i) + " " + key);
    }
    EXPECT_EQ(item.tensors.size(), keys) << "frame " << i;
    EXPECT_EQ(item.task, meta["tasks"][size_t(i)].get<std::string>()) << "frame " << i;
  }
}

TEST(LeRobotV30, EveryItemEqualsLeRobotDataset) {
  NEED_ORACLE();
  expect_items_equal(o, "v30");
}

// Episodes spread over several data, video and episode-table files (file-000 .. file-002).
TEST(LeRobotV30, EpisodesInSeveralFilesEqualLeRobotDataset) {
  NEED_ORACLE();
  LeRobotDataset ds(o + "/multi");
  EXPECT_EQ(ds.episode(2).data_path, "data/chunk-000/file-002.parquet");
  EXPECT_EQ(ds.episode(1).videos.at("observation.images.wrist").path,
            "videos/observation.images.wrist/chunk-000/file-001.mp4");
  expect_items_equal(o, "multi");
}

TEST(LeRobotV30, EpisodeTensorsEqualStackedItems) {
  NEED_ORACLE();
  LeRobotDataset ds(o + "/v30");
  const auto got = ds.episode_tensors(1);
  const auto want = read_tensors(o + "/v30_episode1.safetensors");
  for (const auto& [key, t] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << key;
    expect_identical(it->second, t, "episode 1 " + key);
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ(got.at("observation.images.wrist").sizes(), (at::IntArrayRef{7, 3, 32, 48}));
}

TEST(LeRobotNormalize, EveryModeEqualsNormalizerProcessorStep) {
  NEED_ORACLE();
  LeRobotDataset ds(o + "/v30");
  const auto want = read_tensors(o + "/norm.safetensors");
  for (const std::string mode : {"MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10", "IDENTITY"}) {
    for (const std::string key : {"observation.state", "action"}) {
      const at::Tensor x = want.at("input/" + key);
      const at::Tensor y = lf::data::normalize(x, lf::data::parse_norm_mode(mode), ds.stats(key));
      expect_identical(y, want.at(mode + "/" + key), mode + " " + key);
      const at::Tensor back = lf::data::normalize(y, lf::data::parse_norm_mode(mode), ds.stats(key), true);
      expect_identical(back, want.at(mode + "/inverse/" + key), mode + " inverse " + key);
    }
  }
  EXPECT_NE(error_message([] { lf::data::parse_norm_mode("ZSCORE"); }).find("ZSCORE"), std::string::npos);
  lf::data::LeRobotFeatureStats no_quantiles{{"mean", at::zeros({2}, at::kDouble)}};
  EXPECT_NE(error_message([&] {
              lf::data::normalize(at::zeros({2}), lf::data::LeRobotNormMode::kQuantiles, no_quantiles);
            }).find("'q01'"),
            std::string::npos);
}

TEST(LeRobotV21, SameRecordingReadsTheSame) {
  NEED_ORACLE();
  LeRobotDataset v21(o + "/v21", {kDeltas, 1e-4});
  EXPECT_EQ(v21.version(), "v2.1");
  EXPECT_EQ(v21.num_episodes(), 3);
  EXPECT_EQ(v21.num_frames(), 28);
  EXPECT_EQ(v21.tasks(), (std::vector<std::string>{"pick up the red cube", "put the cube in the bowl"}));
  EXPECT_EQ(v21.episode(2).data_path, "data/chunk-000/episode_000002.parquet");
  // Data columns and masks as the v3.0 reading (same recording); frames as lerobot decodes the
  // v2.1 per-episode videos (re-encoded, so they differ from v3.0's).
  const auto want = read_tensors(o + "/v30_items.safetensors");
  for (int64_t i = 0; i < v21.num_frames(); ++i) {
    const auto item = v21.get(i);
    for (const std::string key : {"observation.state", "action", "action_is_pad", "observation.state_is_pad",
                                  "timestamp", "frame_index", "episode_index", "index", "task_index"})
      expect_identical(item.tensors.at(key), want.at(std::to_string(i) + "/" + key), "v2.1 frame " + std::to_string(i) + " " + key);
  }
  const auto frames = read_tensors(o + "/v21_frames.safetensors");
  for (int64_t e = 0; e < 3; ++e) {
    const auto ep = v21.episode_tensors(e);
    for (const std::string cam : {"observation.images.front", "observation.images.wrist"})
      expect_identical(ep.at(cam), frames.at(std::to_string(e) + "/" + cam), "v2.1 episode " + std::to_string(e) + " " + cam);
  }
  // No stats.json: the episodes' stats aggregated as lerobot's aggregate_stats.
  const auto stats = read_tensors(o + "/v21_stats.safetensors");
  for (const auto& [name, t] : stats) {
    const auto slash = name.rfind('/');
    const at::Tensor got = v21.stats(name.substr(0, slash)).at(name.substr(slash + 1));
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), t.to(at::kDouble), 1e-12, 1e-12)) << name << "\n" << got << "\n" << t;
  }
}

// use_videos=False: the camera's PNG bytes live in the data parquet ({bytes, path} structs).
// LeRobotDataset gives them as ToTensor's float32 x / 255; we give uint8, which must match.
TEST(LeRobotV30, ImageFeaturesInTheParquet) {
  NEED_ORACLE();
  LeRobotDataset ds(o + "/images");
  EXPECT_EQ(ds.camera_keys(), (std::vector<std::string>{"observation.image"}));
  ASSERT_EQ(ds.num_frames(), 7);
  const auto want = read_tensors(o + "/images_items.safetensors");
  for (int64_t i = 0; i < ds.num_frames(); ++i) {
    const auto item = ds.get(i);
    const std::string p = std::to_string(i) + "/";
    expect_identical(item.tensors.at("observation.image").to(at::kFloat).div(255), want.at(p + "observation.image"),
                     "image frame " + std::to_string(i));
    expect_identical(item.tensors.at("observation.state"), want.at(p + "observation.state"),
                     "image frame " + std::to_string(i) + " state");
  }
  EXPECT_EQ(ds.episode_tensors(1).at("observation.image").sizes(), (at::IntArrayRef{4, 3, 32, 48}));
}

TEST(LeRobotErrors, NameTheFileAndEpisode) {
  NEED_ORACLE();
  const auto contains = [](const std::string& msg, std::initializer_list<std::string> parts) {
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  {  // not a dataset directory
    const std::string d = lf::testing::make_temp_dir("lerobot-empty");
    contains(error_message([&] { LeRobotDataset ds(d); }), {d, "meta/info.json is missing", "HINT"});
  }
  {  // an unsupported version
    const std::string d = copy_of(o + "/v30", "v20");
    auto info = nlohmann::json::parse(lf::testing::read_text(d + "/meta/info.json"));
    info["codebase_version"] = "v2.0";
    std::ofstream(d + "/meta/info.json") << info.dump();
    contains(error_message([&] { LeRobotDataset ds(d); }), {d + "/meta/info.json", "\"v2.0\"", "v3.0 and v2.1"});
  }
  LeRobotDataset ok(o + "/v30");
  contains(error_message([&] { ok.episode(3); }), {"episode 3 is outside [0, 3)"});
  contains(error_message([&] { ok.episode_tensors(-1); }), {"episode -1 is outside"});
  contains(error_message([&] { ok.get(28); }), {"frame 28 is outside [0, 28)"});
  contains(error_message([&] { ok.feature("observation.depth"); }), {"no feature 'observation.depth'", "action"});
  contains(error_message([&] { LeRobotDataset ds(o + "/v30", {{{"observation.velocity", {0.0}}}, 1e-4}); }),
           {"'observation.velocity'", "meta/info.json"});
  contains(error_message([&] { LeRobotDataset ds(o + "/v30", {{{"action", {0.05}}}, 1e-4}); }),
           {"0.05", "1/10"});
  {  // a missing data file
    const std::string d = copy_of(o + "/v30", "nodata");
    fs::remove(d + "/data/chunk-000/file-000.parquet");
    LeRobotDataset ds(d);
    contains(error_message([&] { ds.get(13); }),
             {d + "/data/chunk-000/file-000.parquet", "episode 1", "is missing"});
  }
  {  // a missing video file
    const std::string d = copy_of(o + "/v21", "novideo");
    fs::remove(d + "/videos/chunk-000/observation.images.wrist/episode_000002.mp4");
    LeRobotDataset ds(d);
    contains(error_message([&] { ds.episode_tensors(2); }),
             {"videos/chunk-000/observation.images.wrist/episode_000002.mp4", "episode 2", "is missing"});
  }
  {  // a video shorter than its episode (3 of 9 frames)
    const std::string d = copy_of(o + "/v21", "short");
    fs::copy_file(o + "/short.mp4", d + "/videos/chunk-000/observation.images.front/episode_000002.mp4",
                  fs::copy_options::overwrite_existing);
    LeRobotDataset ds(d);
    EXPECT_EQ(ds.get(19 + 2).tensors.at("observation.images.front").size(0), 3);  // early frames still read
    contains(error_message([&] { ds.episode_tensors(2); }),
             {"observation.images.front", "episode 2", "episode_000002.mp4", "no frame within", "shorter"});
  }
  {  // v2.1 metadata without its fields, no episodes, chunks_size 0
    const std::string d = copy_of(o + "/v21", "nolength");
    std::ofstream(d + "/meta/episodes.jsonl") << "{\"episode_index\": 0}\n";
    contains(error_message([&] { LeRobotDataset ds(d); }), {d + "/meta/episodes.jsonl", "length"});
    std::ofstream(d + "/meta/episodes.jsonl") << "";
    contains(error_message([&] { LeRobotDataset ds(d); }), {"lists no episodes"});
    const std::string z = copy_of(o + "/v21", "chunks0");
    auto info = nlohmann::json::parse(lf::testing::read_text(z + "/meta/info.json"));
    info["chunks_size"] = 0;
    std::ofstream(z + "/meta/info.json") << info.dump();
    contains(error_message([&] { LeRobotDataset ds(z); }), {z + "/meta/info.json", "chunks_size 0"});
  }
  {  // a damaged metadata file
    const std::string d = copy_of(o + "/v30", "badtasks");
    std::ofstream(d + "/meta/tasks.parquet") << "not parquet";
    contains(error_message([&] { LeRobotDataset ds(d); }), {d + "/meta/tasks.parquet", "not a readable parquet"});
  }
}

// The program: `loongforge-data inspect DATASET --dump-episode N OUT` writes what
// LeRobotDataset gives for the episode's frames, stacked; without it, a summary.
TEST(LeRobotInspectProgram, DumpEpisodeEqualsLeRobotDataset) {
  NEED_ORACLE();
  const std::string bin = lf::testing::binary_dir() + "/bin/loongforge-data";
  const std::string d = lf::testing::make_temp_dir("lerobot-inspect");
  auto r = lf::testing::run_command({bin, "inspect", o + "/v30", "--dump-episode", "1", d + "/ep1.safetensors"});
  ASSERT_TRUE(r.ok()) << r.output;
  const auto got = read_tensors(d + "/ep1.safetensors");
  const auto want = read_tensors(o + "/v30_episode1.safetensors");
  ASSERT_EQ(got.size(), want.size()) << r.output;
  for (const auto& [key, t] : want) {
    ASSERT_TRUE(got.count(key)) << key;
    expect_identical(got.at(key), t, "dumped " + key);
  }
  EXPECT_EQ(lf::safetensors::Reader::open(d + "/ep1.safetensors").metadata().at("tasks"),
            "[\"put the cube in the bowl\"]");

  r = lf::testing::run_command({bin, "inspect", o + "/v30"});
  ASSERT_TRUE(r.ok()) << r.output;
  for (const std::string part : {"version: v3.0", "fps: 10", "episodes: 3", "frames: 28", "observation.state",
                                 "observation.images.wrist", "[32, 48, 3]"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " not in\n" << r.output;

  r = lf::testing::run_command({bin, "inspect", "--help"});
  EXPECT_NE(r.output.find("--dump-episode"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("uint8"), std::string::npos) << r.output;

  r = lf::testing::run_command({bin, "inspect", o + "/v21", "--dump-episode", "3", d + "/ep3.safetensors"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("episode 3 is outside [0, 3)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(d + "/ep3.safetensors"));

  // Token-dataset flags on a LeRobot dataset are refused, not ignored.
  r = lf::testing::run_command({bin, "inspect", o + "/v30", "--sample", "2"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("apply to indexed token datasets"), std::string::npos) << r.output;
}

}  // namespace
