// The Wan diffusion transformer through the programs users run, against diffusers'
// WanTransformer3DModel (tests/models/wan_oracle.py: tiny random T2V, I2V and per-token-timestep
// models saved by save_pretrained, each with the forward's inputs and diffusers' fp32 prediction):
// loongforge-generate --denoise-inputs on the diffusers directory equals diffusers; loongforge-convert
// hf2lf (TP 1 and 2) gives a flow_matching checkpoint that generate reads to the same prediction,
// that loongforge-train --load reads to the same weights at TP 2, and that lf2hf writes back bit
// for bit; a checkpoint loongforge-train saved exports and runs the same way; mistakes are clear
// errors. (Model-level parity, TP 2 included: tests/models/test_wan.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "loongforge/core/safetensors.h"
#include "multiprocess.h"
#include "oracle_cache.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::run_command;

// The oracle's directory ("" when Python or diffusers is missing: the tests skip).
const std::string& oracle() {
  static const std::string dir = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/models/wan_oracle.py", "wan_oracle", "done");
  return dir;
}

#define NEED_ORACLE()                                                        \
  if (oracle().empty()) GTEST_SKIP() << "no .venv with torch and diffusers"; \
  ASSERT_TRUE(fs::exists(oracle() + "/done")) << oracle()

const char* const kCases[] = {"t2v", "i2v", "ti2v"};  // ti2v: per-token timesteps [b, tokens]

// A float32 tensor of a safetensors file: shape and values.
std::pair<std::vector<int64_t>, std::vector<float>> read_f32(const std::string& file, const std::string& name) {
  auto r = lf::safetensors::Reader::open(file);
  const auto& t = r.at(name);
  EXPECT_EQ(t.dtype, lf::safetensors::DType::F32) << file << " " << name;
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), r.data(t), v.size() * 4);
  return {t.shape, v};
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  return worst;
}

// loongforge-generate --denoise-inputs: the prediction's shape and values (ASSERTs the exit code).
std::pair<std::vector<int64_t>, std::vector<float>> predict(const std::string& load, const std::string& inputs,
                                                            const std::string& out) {
  auto r = run_command({bin("loongforge-generate"), "--load", load, "--denoise-inputs", inputs, "--dump-prediction",
                        out});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return read_f32(out, "prediction");
}

// name -> (dtype, shape, bytes) of the weights of a diffusers directory (the oracle's also holds
// its inputs and losses).
std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> contents(const std::string& dir) {
  std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors" || f.path().filename().string().rfind("diffusion_pytorch_model", 0) != 0)
      continue;
    auto r = lf::safetensors::Reader::open(f.path().string());
    for (const auto& t : r.tensors())
      out[t.name] = {std::string(lf::safetensors::dtype_name(t.dtype)), t.shape,
                     std::string(reinterpret_cast<const char*>(r.data(t)), t.end - t.begin)};
  }
  return out;
}

// Copies the safetensors file `from` to `to` without the tensor `drop`.
void copy_without(const std::string& from, const std::string& to, const std::string& drop) {
  auto r = lf::safetensors::Reader::open(from);
  lf::safetensors::Writer w;
  for (const auto& t : r.tensors())
    if (t.name != drop) w.add(t.name, t.dtype, t.shape, r.data(t));
  w.write(to);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(WanProgram, DenoiseInputsOnTheDiffusersDirectoryEqualsDiffusers) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_denoise");
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const std::string dir = oracle() + "/" + name;
    const auto [shape, got] = predict(dir, dir + "/io.safetensors", work + "/" + name + ".safetensors");
    const auto [want_shape, want] = read_f32(dir + "/io.safetensors", "prediction");
    EXPECT_EQ(shape, want_shape);  // [b, out_channels, f, h, w]
    // fp32, the same function in another summation order: measured 2e-6 to 4e-6.
    EXPECT_LE(max_abs(got, want), 1e-4);
  }
}

// hf2lf (TP 1 for T2V, TP 2 for the others: generate reassembles the shards) then generate on the
// checkpoint: the same weights, so the same prediction as from the diffusers directory.
TEST(WanProgram, Hf2LfCheckpointGivesTheSamePrediction) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_hf2lf");
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const std::string dir = oracle() + "/" + name, ckpt = work + "/" + name;
    auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", dir, "--out", ckpt, "--tp",
                          std::string(name) == "t2v" ? "1" : "2"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto from_dir = predict(dir, dir + "/io.safetensors", ckpt + ".dir.safetensors");
    const auto from_ckpt = predict(ckpt, dir + "/io.safetensors", ckpt + ".ckpt.safetensors");
    EXPECT_EQ(from_ckpt.first, from_dir.first);
    EXPECT_EQ(max_abs(from_ckpt.second, from_dir.second), 0.0);
    EXPECT_LE(max_abs(from_ckpt.second, read_f32(dir + "/io.safetensors", "prediction").second), 1e-4);
    // The checkpoint records the composite, so training resumes from its config.yaml.
    const std::string yaml = lf::testing::read_file(ckpt + "/iter_0000000/config.yaml");
    EXPECT_NE(yaml.find("type: flow_matching"), std::string::npos) << yaml;
    EXPECT_NE(yaml.find("type: wan"), std::string::npos) << yaml;
  }
}

TEST(WanProgram, Hf2LfAtTp2ThenLf2HfIsBitExact) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_roundtrip");
  for (const char* name : kCases) {
    SCOPED_TRACE(name);
    const std::string dir = oracle() + "/" + name, ckpt = work + "/" + name, back = work + "/" + name + "_hf";
    auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", dir, "--out", ckpt, "--tp", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::exists(ckpt + "/iter_0000000/model_tp1_pp0.safetensors")) << r.output;
    r = run_command({bin("loongforge-convert"), "lf2hf", "--load", ckpt, "--out", back, "--dtype", "fp32"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto want = contents(dir), got = contents(back);
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [tensor, v] : want) {
      ASSERT_TRUE(got.count(tensor)) << tensor;
      EXPECT_TRUE(got[tensor] == v) << tensor << " differs";
    }
    EXPECT_EQ(read_json(back + "/config.json"), read_json(dir + "/config.json"));
  }
  // Several files past --max-shard-size, as diffusers shards them (index + shards).
  auto r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/t2v", "--out", work + "/sharded",
                        "--dtype", "fp32", "--max-shard-size", "50KB"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(work + "/sharded/diffusion_pytorch_model.safetensors.index.json")) << r.output;
  EXPECT_TRUE(contents(work + "/sharded") == contents(oracle() + "/t2v"));
}

// loongforge-train --load of the hf2lf checkpoint at TP 2 (the tiny oracle's T2V shape is
// configs/examples/wan_tiny.yaml's): with lr 0 the parameters after one step (dumped, gathered)
// are the diffusers weights bit for bit.
TEST(WanProgram, TrainLoadsTheConvertedCheckpointAtTp2) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_train_load");
  const std::string dir = oracle() + "/t2v";
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", dir, "--out", work + "/ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2", bin("loongforge-train"),
                   "--config-file", lf::testing::source_dir() + "/configs/examples/wan_tiny.yaml",
                   "--tensor-model-parallel-size", "2", "--load", work + "/ckpt", "--finetune", "--train-iters", "1",
                   "--lr", "0", "--min-lr", "0", "--lr-warmup-iters", "0", "--eval-iters", "0"},
                  {{"OMP_NUM_THREADS", "1"}, {"LOONGFORGE_DUMP_PARAMS", work + "/p.safetensors"}},
                  std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto dumped = lf::testing::read_params(work + "/p.safetensors");
  const auto want = contents(dir);
  ASSERT_EQ(dumped.size(), want.size());
  for (const auto& [name, v] : want) {
    ASSERT_TRUE(dumped.count(name)) << name;
    const std::string& bytes = std::get<2>(v);
    ASSERT_EQ(dumped.at(name).size() * 4, bytes.size()) << name;
    EXPECT_EQ(std::memcmp(dumped.at(name).data(), bytes.data(), bytes.size()), 0) << name << " differs after loading";
  }
}

// A checkpoint loongforge-train saved (its config.yaml is the whole job's) exports to diffusers'
// layout and runs in generate, both giving the same prediction.
TEST(WanProgram, TrainedCheckpointExportsAndDenoises) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_trained");
  auto r = run_command({bin("loongforge-train"), "--config-file",
                        lf::testing::source_dir() + "/configs/examples/wan_tiny.yaml", "--train-iters", "3",
                        "--eval-iters", "0", "--save", work + "/ckpt"},
                       {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/ckpt", "--out", work + "/hf", "--dtype",
                   "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(work + "/hf/config.json"), read_json(oracle() + "/t2v/config.json"));
  const std::string inputs = oracle() + "/t2v/io.safetensors";
  const auto native = predict(work + "/ckpt", inputs, work + "/native.safetensors");
  const auto exported = predict(work + "/hf", inputs, work + "/hf.safetensors");
  ASSERT_FALSE(native.second.empty());
  EXPECT_EQ(max_abs(native.second, exported.second), 0.0);
  // Trained weights, not the oracle's: the prediction differs from diffusers' on its own model.
  EXPECT_GT(max_abs(native.second, read_f32(inputs, "prediction").second), 1e-3);
}

TEST(WanProgram, MistakesAreClearErrors) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_errors");
  const std::string t2v = oracle() + "/t2v", io = t2v + "/io.safetensors";
  auto expect_error = [](const lf::testing::RankResult& r, std::initializer_list<const char*> words) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const char* w : words) EXPECT_NE(r.output.find(w), std::string::npos) << "no '" << w << "' in " << r.output;
  };
  // A tensor missing from the inputs file: named with the file.
  copy_without(io, work + "/no_timestep.safetensors", "timestep");
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--denoise-inputs",
                            work + "/no_timestep.safetensors", "--dump-prediction", work + "/p.safetensors"}),
               {"'timestep'", "no_timestep.safetensors"});
  EXPECT_FALSE(fs::exists(work + "/p.safetensors"));
  // I2V inputs (with image features) for the T2V model.
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--denoise-inputs",
                            oracle() + "/i2v/io.safetensors", "--dump-prediction", work + "/p.safetensors"}),
               {"encoder_hidden_states_image", "i2v/io.safetensors"});
  // A directory that is not a Wan model.
  fs::create_directories(work + "/empty");
  expect_error(run_command({bin("loongforge-generate"), "--load", work + "/empty", "--denoise-inputs", io,
                            "--dump-prediction", work + "/p.safetensors"}),
               {"WanTransformer3DModel", "empty"});
  // --denoise-inputs without --dump-prediction; a Wan model without --denoise-inputs.
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--denoise-inputs", io}), {"--dump-prediction"});
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--input-ids", "1,2"}),
               {"Wan", "--denoise-inputs"});
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--prompt", "a", "--tokenizer-type",
                            "ByteTokenizer"}),
               {"Wan", "--denoise-inputs"});

  // hf2lf: another diffusers class; config.json and weights that disagree; a missing tensor.
  auto copy_dir = [&](const std::string& name) {
    fs::create_directories(work + "/" + name);
    fs::copy_file(t2v + "/config.json", work + "/" + name + "/config.json");
    fs::copy_file(t2v + "/diffusion_pytorch_model.safetensors",
                  work + "/" + name + "/diffusion_pytorch_model.safetensors");
    return work + "/" + name;
  };
  auto edit_config = [](const std::string& dir, const std::string& from, const std::string& to) {
    std::string text = lf::testing::read_file(dir + "/config.json");
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << text;
    std::ofstream(dir + "/config.json") << text.replace(at, from.size(), to);
  };
  const std::string unet = copy_dir("unet");
  edit_config(unet, "WanTransformer3DModel", "UNet2DConditionModel");
  expect_error(run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", unet, "--out", work + "/o1"}),
               {"UNet2DConditionModel", "config.json"});
  const std::string deeper = copy_dir("deeper");
  edit_config(deeper, "\"num_layers\": 2", "\"num_layers\": 3");
  expect_error(run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", deeper, "--out", work + "/o2"}),
               {"blocks.2.attn1.to_q.weight", "deeper"});
  const std::string partial = copy_dir("partial");
  copy_without(t2v + "/diffusion_pytorch_model.safetensors", partial + "/diffusion_pytorch_model.safetensors",
               "blocks.1.ffn.net.2.bias");
  expect_error(run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", partial, "--out", work + "/o3"}),
               {"blocks.1.ffn.net.2.bias", "partial"});
  for (const char* o : {"/o1", "/o2", "/o3"}) EXPECT_FALSE(fs::exists(work + o + "/latest_checkpointed_iteration.txt"));
  // lf2hf of a model diffusers' config.json cannot express (another RoPE base).
  auto r = run_command({bin("loongforge-train"), "--config-file",
                        lf::testing::source_dir() + "/configs/examples/wan_tiny.yaml", "--train-iters", "3",
                        "--eval-iters", "0", "--save", work + "/theta", "++model.foundation.rope_theta=500"},
                       {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_error(run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/theta", "--out", work + "/o5"}),
               {"rope_theta 500", "diffusers"});
  EXPECT_FALSE(fs::exists(work + "/o5/config.json"));
  // tiny Wan: 4 heads, TP 3 cannot split them.
  expect_error(run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", t2v, "--out", work + "/o4", "--tp", "3"}),
               {"--tp 3", "num_attention_heads"});
}

}  // namespace
