// loongforge-generate and loongforge-convert on a Qwen2.5-VL model as transformers saves it
// (tests/tools/vlm_generate_oracle.py, Python as an oracle only: a tiny random
// Qwen2_5_VLForConditionalGeneration, sharded safetensors + index, a Qwen2VLImageProcessorPil
// preprocessor_config.json with small pixel bounds, two PNGs): the logits of `--image a.png --image
// b.png` (decoded and preprocessed by us) and of `--vision-inputs` (the processor's tensors plus a
// video) equal transformers' within 1e-4; greedy tokens (the whole sequence recomputed per step)
// equal transformers'; hf2lf (TP 1, and TP 2 x PP 2) then generate from the LoongForge checkpoint
// gives the HF directory's logits; transformers 4's directory layout reads the same;
// loongforge-train loads that checkpoint, and the HF directory itself (at TP 2 and PP 2), and saves
// what exports back unchanged (lr 0); hf -> lf -> hf reproduces every tensor and a config.json
// transformers loads with identical logits; mistakes are errors naming the flag and the file.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loongforge/core/safetensors.h"
#include "multiprocess.h"
#include "oracle_cache.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::run_command;

std::string python() { return lf::testing::venv_python(); }
std::string script() { return lf::testing::source_dir() + "/tests/tools/vlm_generate_oracle.py"; }

using lf::testing::read_text;

// The oracle's directory, made once per script text (tests/support/oracle_cache.h); "" when
// transformers is not installed.
const std::string& oracle() {
  static const std::string dir = lf::testing::cached_oracle(script(), "vlm_generate_oracle", "ids.json");
  return dir;
}

#define REQUIRE_ORACLE()                                                                    \
  if (oracle().empty()) GTEST_SKIP() << "transformers is not installed in " << python();     \
  ASSERT_TRUE(fs::exists(oracle() + "/ids.json"))

std::string ids(const std::string& key) { return nlohmann::json::parse(read_text(oracle() + "/ids.json")).at(key); }

// A float32 tensor of a safetensors file, flattened, with its shape.
std::vector<float> read_f32(const std::string& file, const std::string& name, std::vector<int64_t>* shape = nullptr) {
  auto r = lf::safetensors::Reader::open(file);
  const auto& t = r.at(name);
  EXPECT_EQ(t.dtype, lf::safetensors::DType::F32) << name << " in " << file;
  if (shape) *shape = t.shape;
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), r.data(t), v.size() * 4);
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size()) return 1e9;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
  return d;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// loongforge-generate --dump-logits with `args`; the logits (asserting success).
std::vector<float> dump(const std::vector<std::string>& args, const std::string& out, std::vector<int64_t>* shape = nullptr) {
  std::vector<std::string> argv{bin("loongforge-generate")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--dump-logits", out});
  auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return read_f32(out, "logits", shape);
}

constexpr double kTolerance = 1e-4;  // fp32 end to end; a wrong splice or position is O(0.1)

std::vector<std::string> image_args(const std::string& load) {
  return {"--load", load, "--image", oracle() + "/a.png", "--image", oracle() + "/b.png", "--input-ids", ids("images_ids")};
}
std::vector<std::string> vision_input_args(const std::string& load) {
  return {"--load", load, "--vision-inputs", oracle() + "/vision_inputs.safetensors", "--input-ids", ids("vi_ids")};
}

TEST(GenerateVlm, ImageLogitsEqualTransformers) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  std::vector<int64_t> shape;
  const auto ours = dump(image_args(oracle() + "/hf"), work + "/l.safetensors", &shape);
  const auto want = read_f32(oracle() + "/expected.safetensors", "images_logits");
  ASSERT_FALSE(ours.empty());
  EXPECT_EQ(shape, (std::vector<int64_t>{28, 200}));
  EXPECT_GT(max_abs(want), 0.05);
  const double d = max_diff(ours, want);
  std::printf("--image a.png --image b.png: max |ours - transformers| = %.3g\n", d);
  EXPECT_LE(d, kTolerance);
}

TEST(GenerateVlm, VisionInputsWithAVideoEqualTransformers) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  const auto ours = dump(vision_input_args(oracle() + "/hf"), work + "/l.safetensors");
  const auto want = read_f32(oracle() + "/expected.safetensors", "vi_logits");
  ASSERT_FALSE(ours.empty());
  const double d = max_diff(ours, want);
  std::printf("--vision-inputs (image + video): max |ours - transformers| = %.3g\n", d);
  EXPECT_LE(d, kTolerance);
}

TEST(GenerateVlm, GreedyTokensEqualTransformers) {
  REQUIRE_ORACLE();
  auto args = image_args(oracle() + "/hf");
  std::vector<std::string> argv{bin("loongforge-generate")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--max-new-tokens", "4"});
  auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(ids("images_greedy") + "\n"), std::string::npos)
      << "transformers: " << ids("images_greedy") << "\n" << r.output;
  // A vision-language model recomputes the whole sequence per token already.
  argv.push_back("--no-kv-cache");
  r = run_command(argv, {{"OMP_NUM_THREADS", "1"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--no-kv-cache: a vision-language model recomputes"), std::string::npos) << r.output;
}

// hf2lf writes a qwen2_5_vl checkpoint (and carries preprocessor_config.json); generate from it
// gives the HF directory's logits, at TP 1 and from TP 2 x PP 2 shards.
TEST(ConvertVlm, Hf2LfCheckpointGivesTheSameLogits) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  const auto hf_images = dump(image_args(oracle() + "/hf"), work + "/hf_i.safetensors");
  const auto hf_vi = dump(vision_input_args(oracle() + "/hf"), work + "/hf_v.safetensors");
  for (const auto& [tp, pp] : {std::pair<const char*, const char*>{"1", "1"}, {"2", "2"}}) {
    const std::string ckpt = work + "/lf" + tp + pp;
    auto conv = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", oracle() + "/hf", "--out", ckpt, "--tp", tp,
                             "--pp", pp});
    ASSERT_EQ(conv.exit_code, 0) << conv.output;
    EXPECT_NE(read_text(ckpt + "/iter_0000000/config.yaml").find("type: qwen2_5_vl\n"), std::string::npos);
    EXPECT_TRUE(fs::exists(ckpt + "/preprocessor_config.json"));
    const double di = max_diff(dump(image_args(ckpt), work + "/i.safetensors"), hf_images);
    const double dv = max_diff(dump(vision_input_args(ckpt), work + "/v.safetensors"), hf_vi);
    std::printf("hf2lf --tp %s --pp %s: checkpoint vs HF directory logits: images %.3g, vision inputs %.3g\n", tp, pp,
                di, dv);
    EXPECT_EQ(di, 0.0);
    EXPECT_EQ(dv, 0.0);
  }
}

// loongforge-train --load of the hf2lf checkpoint (its model section as the job's model), two
// steps at lr 0, --save: generate from the trainer's checkpoint and lf2hf of it give the HF model.
TEST(ConvertVlm, TrainLoadsTheCheckpointAndSavesTheSameModel) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", oracle() + "/hf", "--out", work + "/lf"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {
    std::ofstream y(work + "/train.yaml");
    y << "defaults:\n  - /train/base@_global_\n  - _self_\n"
      << read_text(work + "/lf/iter_0000000/config.yaml")
      << "training:\n  train_iters: 2\n  micro_batch_size: 1\n  global_batch_size: 1\n  seq_length: 32\n"
         "  eval_iters: 0\noptimizer:\n  lr: 0.0\n  min_lr: 0.0\n  lr_warmup_iters: 0\ndata:\n  mock_data: true\n";
  }
  r = run_command({bin("loongforge-train"), "--config-file", work + "/train.yaml", "--load", work + "/lf", "--finetune",
                   "--save", work + "/trained", "--data-cache-path", work, "--save-hf", work + "/savehf"},
                  {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // --save-hf carries the image processor's settings of the checkpoint it started from, as lf2hf.
  EXPECT_EQ(read_text(work + "/savehf/preprocessor_config.json"), read_text(oracle() + "/hf/preprocessor_config.json"));
  EXPECT_EQ(max_diff(dump(image_args(work + "/trained"), work + "/a.safetensors"),
                     dump(image_args(oracle() + "/hf"), work + "/b.safetensors")),
            0.0);
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/trained", "--out", work + "/rt", "--dtype",
                   "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto cmp = run_command({python(), script(), "compare", oracle() + "/hf", work + "/rt"}, {{"HF_HUB_OFFLINE", "1"}},
                         std::chrono::seconds(240));
  ASSERT_EQ(cmp.exit_code, 0) << cmp.output;
  EXPECT_NE(cmp.output.find("tensors 69 69 equal 69\n"), std::string::npos) << cmp.output;
}

// --save-hf of the three vision-language composites (one at PP 2 with the tower on both stages,
// --enable-full-hetero-dp, whose copies are written once) writes what lf2hf writes from
// the run's own checkpoint: config.json and every tensor, bit for bit. It used to fail after the
// run ("vision_encoder.* has no place in the qwen2 mapping"); composites without an HF form are
// refused before training.
TEST(ConvertVlm, SaveHfWritesWhatLf2hfWritesFromTheCheckpoint) {
  const auto work = lf::testing::make_temp_dir("savehf_vlm");
  auto tensors = [](const std::string& dir) {
    auto r = lf::safetensors::Reader::open(dir + "/model.safetensors");
    std::map<std::string, std::string> out;
    for (const auto& t : r.tensors())
      out[t.name] = std::string(reinterpret_cast<const char*>(r.data(t)), t.end - t.begin);
    return out;
  };
  for (const auto& [config, procs] : {std::pair{"qwen2_5_vl_tiny", 2}, {"qwen3_vl_tiny", 1}, {"internvl_tiny", 1}}) {
    const std::string d = work + "/" + config;
    std::vector<std::string> argv;
    if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", "2"};
    argv.insert(argv.end(), {bin("loongforge-train"), "--config-file",
                             lf::testing::source_dir() + "/configs/examples/" + config + ".yaml", "--train-iters", "3",
                             "--eval-iters", "0", "--save", d + "/ck", "--save-hf", d + "/hf"});
    if (procs > 1) argv.insert(argv.end(), {"--pipeline-model-parallel-size", "2", "--enable-full-hetero-dp"});
    auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << config << "\n" << r.output;
    r = run_command({bin("loongforge-convert"), "lf2hf", "--load", d + "/ck", "--out", d + "/rt", "--dtype", "fp32"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(nlohmann::json::parse(read_text(d + "/hf/config.json")),
              nlohmann::json::parse(read_text(d + "/rt/config.json")))
        << config;
    const auto a = tensors(d + "/hf"), b = tensors(d + "/rt");
    EXPECT_GT(a.size(), 50u) << config;
    EXPECT_TRUE(a == b) << config << ": " << a.size() << " tensors against lf2hf's " << b.size();
  }
  auto spliced = run_command({bin("loongforge-train"), "--config-file",
                              lf::testing::source_dir() + "/configs/examples/spliced_lm_tiny.yaml", "--save-hf",
                              work + "/spliced"});
  EXPECT_NE(spliced.exit_code, 0);
  EXPECT_NE(spliced.output.find("model type spliced_lm has no HF form"), std::string::npos) << spliced.output;
  EXPECT_EQ(spliced.output.find("iteration 1"), std::string::npos) << "refused before training\n" << spliced.output;
}

// loongforge-train --load HF_DIR (load_hf_into -> load_vlm_hf_into): at foundation TP 2 and at
// PP 2 (loongforge-run, 2 processes) the HF weights load on the fly, two steps at lr 0 save a
// checkpoint that exports back to the HF tensors; a model that differs from config.json is
// refused listing every difference, a causal_lm naming the composite to configure.
TEST(ConvertVlm, TrainLoadsTheHfDirectoryOnline) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", oracle() + "/hf", "--out", work + "/lf"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {
    std::ofstream y(work + "/train.yaml");  // the job's model: the section hf2lf wrote
    y << "defaults:\n  - /train/base@_global_\n  - _self_\n"
      << read_text(work + "/lf/iter_0000000/config.yaml")
      << "training:\n  train_iters: 2\n  micro_batch_size: 1\n  global_batch_size: 1\n  seq_length: 32\n"
         "  eval_iters: 0\noptimizer:\n  lr: 0.0\n  min_lr: 0.0\n  lr_warmup_iters: 0\ndata:\n  mock_data: true\n";
  }
  for (const char* flag : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size"}) {
    const std::string save = work + "/trained" + std::string(flag).substr(2, 6);
    r = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2", bin("loongforge-train"),
                     "--config-file", work + "/train.yaml", "--load", oracle() + "/hf", flag, "2", "--save", save,
                     "--data-cache-path", work},
                    {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command({bin("loongforge-convert"), "lf2hf", "--load", save, "--out", save + "_hf", "--dtype", "fp32"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto cmp = run_command({python(), script(), "compare", oracle() + "/hf", save + "_hf"}, {{"HF_HUB_OFFLINE", "1"}},
                           std::chrono::seconds(240));
    ASSERT_EQ(cmp.exit_code, 0) << cmp.output;
    EXPECT_NE(cmp.output.find("tensors 69 69 equal 69\n"), std::string::npos) << flag << "\n" << cmp.output;
  }
  r = run_command({bin("loongforge-train"), "--config-file", work + "/train.yaml", "--load", oracle() + "/hf",
                   "--data-cache-path", work, "model.image_token_id=150", "model.vision_encoder.window_size=112",
                   "model.foundation.rotary_base=5000"},
                  {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const char* w : {"is not the configured model", "foundation.rotary_base: model 5000", "config.json 10000",
                        "vision_encoder.window_size: model 112, config.json 56", "image_token_id: model 150, config.json 192"})
    EXPECT_NE(r.output.find(w), std::string::npos) << "no '" << w << "' in:\n" << r.output;
  r = run_command({bin("loongforge-train"), "--config-file", lf::testing::source_dir() + "/configs/demo.yaml", "--load",
                   oracle() + "/hf", "--data-cache-path", work, "--train-iters", "4", "--lr-warmup-iters", "0"},
                  {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Qwen2_5_VLForConditionalGeneration (qwen2_5_vl); the configured model is causal_lm"),
            std::string::npos)
      << r.output;
}

// hf -> lf -> hf: every tensor bit for bit, a config.json transformers loads, the same logits.
TEST(ConvertVlm, RoundTripReproducesTheModel) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", oracle() + "/hf", "--out", work + "/lf"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/lf", "--out", work + "/rt", "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(work + "/rt/model.safetensors"));
  EXPECT_TRUE(fs::exists(work + "/rt/preprocessor_config.json"));
  auto cmp = run_command({python(), script(), "compare", oracle() + "/hf", work + "/rt"}, {{"HF_HUB_OFFLINE", "1"}},
                         std::chrono::seconds(240));
  ASSERT_EQ(cmp.exit_code, 0) << cmp.output;
  EXPECT_NE(cmp.output.find("tensors 69 69 equal 69\n"), std::string::npos) << cmp.output;
  EXPECT_NE(cmp.output.find("logits 0.000e+00\n"), std::string::npos) << cmp.output;
  // And the exported directory is a --load for generate, with the same logits.
  const double d = max_diff(dump(image_args(work + "/rt"), work + "/a.safetensors"),
                            dump(image_args(oracle() + "/hf"), work + "/b.safetensors"));
  EXPECT_EQ(d, 0.0);
  // A sharded export (the HF index) reads back the same.
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/lf", "--out", work + "/sharded", "--dtype",
                   "fp32", "--max-shard-size", "300KB"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(work + "/sharded/model.safetensors.index.json"));
  EXPECT_EQ(max_diff(dump(image_args(work + "/sharded"), work + "/c.safetensors"),
                     dump(image_args(oracle() + "/hf"), work + "/d.safetensors")),
            0.0);
}

// A directory in transformers 4's layout (flat text fields, rope_scaling {"type": "mrope"},
// in_chans, visual.* / model.* names) reads as the same model: the same logits, and hf2lf + lf2hf
// turns it into transformers 5's layout with the original's tensors.
TEST(ConvertVlm, Transformers4LayoutReadsTheSame) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  EXPECT_EQ(max_diff(dump(image_args(oracle() + "/hf_v4"), work + "/a.safetensors"),
                     dump(image_args(oracle() + "/hf"), work + "/b.safetensors")),
            0.0);
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", oracle() + "/hf_v4", "--out", work + "/lf"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/lf", "--out", work + "/rt", "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto cmp = run_command({python(), script(), "compare", oracle() + "/hf", work + "/rt"}, {{"HF_HUB_OFFLINE", "1"}},
                         std::chrono::seconds(240));
  ASSERT_EQ(cmp.exit_code, 0) << cmp.output;
  EXPECT_NE(cmp.output.find("tensors 69 69 equal 69\n"), std::string::npos) << cmp.output;
  EXPECT_NE(cmp.output.find("logits 0.000e+00\n"), std::string::npos) << cmp.output;
}

// Each mistake is an error (exit 1) naming the flag and the file.
TEST(GenerateVlm, MistakesAreClearErrors) {
  REQUIRE_ORACLE();
  const auto work = lf::testing::make_temp_dir("genvlm");
  const std::string hf = oracle() + "/hf", a = oracle() + "/a.png", vi = oracle() + "/vision_inputs.safetensors";
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), bin("loongforge-generate"));
    return run_command(args, {{"OMP_NUM_THREADS", "1"}});
  };
  auto expect_error = [&](const lf::testing::RankResult& r, const std::vector<std::string>& words) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const auto& w : words) EXPECT_NE(r.output.find(w), std::string::npos) << "no '" << w << "' in:\n" << r.output;
  };
  const std::string missing = work + "/missing.png";
  expect_error(run({"--load", hf, "--image", missing, "--input-ids", "1,2"}), {"--image", missing, "no such file"});
  expect_error(run({"--load", hf, "--image", a, "--vision-inputs", vi, "--input-ids", "1,2"}),
               {"--image", "--vision-inputs", "not both"});
  // One placeholder short of the two images' grids.
  std::string short_ids = ids("images_ids");
  short_ids = short_ids.substr(0, short_ids.find(",192,")) + short_ids.substr(short_ids.find(",192,") + 4);
  expect_error(run({"--load", hf, "--image", a, "--image", oracle() + "/b.png", "--input-ids", short_ids}),
               {"image placeholders", "--image " + a, "grids"});
  expect_error(run({"--load", hf, "--input-ids", ids("images_ids")}), {"image placeholders", "no media"});
  // Not an image.
  expect_error(run({"--load", hf, "--image", oracle() + "/ids.json", "--input-ids", "1,2"}),
               {"--image", oracle() + "/ids.json"});
  // Images for a text-only model.
  expect_error(run({"--load", oracle() + "/text_hf", "--image", a, "--input-ids", "1,2", "--dump-logits",
                    work + "/x.safetensors"}),
               {"--image " + a, "text-only"});
  expect_error(run({"--load", oracle() + "/text_hf", "--vision-inputs", vi, "--input-ids", "1,2"}),
               {"--vision-inputs " + vi, "text-only"});
}

}  // namespace
