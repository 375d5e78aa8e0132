// loongforge-convert as users run it: an HF directory (written by the HF adapter from a random
// tiny model of each family) -> hf2lf at TP=2 -> lf2hf reproduces every tensor bit for bit in
// fp32, rounds to bf16 by default, keeps bf16 through TP=2 x PP=2, loads into loongforge-train
// at TP=2 unchanged, and usage mistakes are clear errors with exit codes 1 / 2. (Parity with
// transformers itself: tests/models/test_hf_parity.cpp.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "loongforge/backend/registry.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_adapter.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
namespace hf = lf::models::hf;
using lf::testing::bin;
using lf::testing::run_command;

lf::models::DecoderConfig tiny(const std::string& family) {
  auto node = lf::config::parse_yaml_file(lf::testing::source_dir() + "/configs/models/" + family +
                                          "/tiny.yaml");
  return lf::config::load<lf::models::DecoderConfig>(node, "model.foundation");
}

// An HF directory of a random model of `family` (several shards).
std::string make_hf_dir(const std::string& family, at::ScalarType dtype = at::kFloat) {
  auto c = tiny(family);
  if (family == "llama") c.rope_scaling = true;
  lf::models::CausalLm d(c, lf::backend::cpu_backend(), 3, at::kFloat);
  hf::NamedTensors full;
  for (const auto& p : d.parameters()) {
    // Random norms and biases too, so a swapped norm or bias cannot hide.
    auto t = p.tensor.detach().clone();
    if (p.name.find("norm") != std::string::npos || p.name.find("bias") != std::string::npos)
      t = at::randn(t.sizes());
    full.emplace_back(p.name, t);
  }
  const std::string dir = lf::testing::make_temp_dir("convert_hf_" + family);
  hf::WriteOptions o;
  o.dtype = dtype;
  o.max_shard_bytes = 100'000;
  hf::write_hf(dir, c, full, o);
  return dir;
}

// name -> (dtype, shape, bytes)
std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> contents(
    const std::string& dir) {
  std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    auto r = lf::safetensors::Reader::open(f.path().string());
    for (const auto& t : r.tensors())
      out[t.name] = {std::string(lf::safetensors::dtype_name(t.dtype)), t.shape,
                     std::string(reinterpret_cast<const char*>(r.data(t)), t.end - t.begin)};
  }
  return out;
}

TEST(ConvertProgram, Hf2LfAtTp2ThenLf2HfIsBitExact) {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    const std::string src = make_hf_dir(family);
    const std::string work = lf::testing::make_temp_dir(std::string("convert_") + family);
    auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src, "--out",
                          work + "/ckpt", "--tp", "2"});
    ASSERT_TRUE(r.ok()) << r.output;
    EXPECT_TRUE(fs::exists(work + "/ckpt/latest_checkpointed_iteration.txt")) << r.output;
    r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/ckpt", "--out",
                     work + "/hf32", "--dtype", "fp32", "--max-shard-size", "50KB"});
    ASSERT_TRUE(r.ok()) << r.output;
    auto want = contents(src), got = contents(work + "/hf32");
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, v] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(got[name] == v) << name << " differs";
    }
    EXPECT_TRUE(fs::exists(work + "/hf32/model.safetensors.index.json"));
    // Default dtype bf16: the fp32 values rounded once.
    r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/ckpt", "--out",
                     work + "/hf16"});
    ASSERT_TRUE(r.ok()) << r.output;
    auto m16 = hf::read_hf(work + "/hf16");
    auto m32 = hf::read_hf(src);
    ASSERT_EQ(m16.tensors.size(), m32.tensors.size());
    for (size_t i = 0; i < m16.tensors.size(); ++i) {
      EXPECT_EQ(m16.tensors[i].second.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::equal(m16.tensors[i].second, m32.tensors[i].second.to(at::kBFloat16)))
          << m16.tensors[i].first;
    }
  }
}

// bf16 files stay bf16 through a TP=2 x PP=2 checkpoint and back (hf2lf keeps the dtype).
TEST(ConvertProgram, Bf16ThroughTp2Pp2IsBitExact) {
  const std::string src = make_hf_dir("qwen2", at::kBFloat16);
  const std::string work = lf::testing::make_temp_dir("convert_bf16");
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src, "--out",
                        work + "/ckpt", "--tp", "2", "--pp", "2"});
  ASSERT_TRUE(r.ok()) << r.output;
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", work + "/ckpt", "--out", work + "/hf"});
  ASSERT_TRUE(r.ok()) << r.output;
  auto want = contents(src), got = contents(work + "/hf");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, v] : want) {
    EXPECT_EQ(std::get<0>(v), "BF16") << name;
    EXPECT_TRUE(got[name] == v) << name << " differs";
  }
}

// The checkpoint hf2lf writes is what loongforge-train --load reads: at TP=2 with lr 0, the
// parameters after one step (LOONGFORGE_DUMP_PARAMS, gathered) are exactly the HF weights.
TEST(ConvertProgram, TrainLoadsTheConvertedCheckpointAtTp2) {
  const std::string src = make_hf_dir("qwen3");
  const std::string work = lf::testing::make_temp_dir("convert_train");
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src, "--out",
                        work + "/ckpt", "--tp", "2"});
  ASSERT_TRUE(r.ok()) << r.output;
  const std::string job = work + "/job.yaml";
  std::ofstream(job) << "defaults:\n  - /train/base@_global_\n  - /models/qwen3@model.foundation: tiny\n"
                        "  - _self_\nmodel:\n  type: causal_lm\ntraining:\n  train_iters: 1\n"
                        "  micro_batch_size: 1\n  global_batch_size: 1\n  seq_length: 16\n"
                        "  eval_iters: 0\noptimizer:\n  lr: 0.0\n  min_lr: 0.0\n  lr_warmup_iters: 0\n"
                        "data:\n  mock_data: true\n";
  r = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2",
                   bin("loongforge-train"), "--config-file", job, "--tensor-model-parallel-size", "2",
                   "--load", work + "/ckpt", "--finetune", "--data-cache-path", work},
                  {{"OMP_NUM_THREADS", "1"}, {"LOONGFORGE_DUMP_PARAMS", work + "/p.safetensors"}},
                  std::chrono::seconds(300));
  ASSERT_TRUE(r.ok()) << r.output;
  auto dumped = lf::testing::read_params(work + "/p.safetensors");
  hf::ReadOptions ro;
  ro.vocab_tp = 2;
  auto m = hf::read_hf(src, ro);
  ASSERT_EQ(dumped.size(), m.tensors.size());
  for (const auto& [name, t] : m.tensors) {
    ASSERT_TRUE(dumped.count(name)) << name;
    const auto& got = dumped[name];
    auto want = t.to(at::kFloat).contiguous();
    ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel()) << name;
    EXPECT_EQ(std::memcmp(got.data(), want.data_ptr<float>(), got.size() * sizeof(float)), 0)
        << name << " differs after loading";
  }
}

TEST(ConvertProgram, MistakesAreClearErrors) {
  const std::string src = make_hf_dir("qwen3");
  const std::string work = lf::testing::make_temp_dir("convert_errors");
  // tiny qwen3: 4 heads, 2 query groups: TP 3 cannot split them.
  auto r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src, "--out", work + "/a",
                        "--tp", "3"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--tp 3"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(work + "/a/latest_checkpointed_iteration.txt"));
  fs::create_directories(work + "/empty");
  r = run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", work + "/empty", "--out",
                   work + "/b"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
  r = run_command({bin("loongforge-convert"), "lf2hf", "--load", src, "--out", work + "/c",
                   "--dtype", "int8"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("int8"), std::string::npos) << r.output;
  r = run_command({bin("loongforge-convert"), "hf2lf", "--out", work + "/d"});
  EXPECT_EQ(r.exit_code, 2) << r.output;  // --hf-dir is required
  r = run_command({bin("loongforge-convert"), "frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
