// The flow_matching composite (the wan foundation) through loongforge-train as users run it, on mock
// latents and text embeddings: TP 2, TP 2 + SP, DP 2 with ZeRO-1, Ulysses CP 2, CP 2 x TP 2 + SP and
// full recomputation each equal the single process, and gradient-accumulation fusion equals
// autograd's path (fp32, 10 steps; per-step loss relative 1e-5, final parameters max-abs 1e-5,
// gradient norms relative 1e-4, as every equivalence test in pp_training.h: the same ops in
// another summation order); the I2V layout and first-frame
// conditioning train; a checkpoint resumes exactly; bf16 trains; layouts and keys it cannot take are
// configuration errors naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "loongforge/core/safetensors.h"
#include "loongforge/data/latent_store.h"
#include "loongforge/data/squares_demo.h"
#include "loongforge/models/wan_diffusers.h"
#include "loongforge/train/checkpoint.h"
#include "pp_training.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::TrainRun;

const std::string kConfig = lf::testing::source_dir() + "/configs/examples/wan_tiny.yaml";

TrainRun run(int procs, const std::vector<std::string>& extra, const std::string& tag) {
  return lf::testing::train_example(kConfig, procs, extra, "wan-" + tag);
}

const TrainRun& single() {
  static const TrainRun r = run(1, {}, "one");
  return r;
}

TEST(WanTraining, TensorParallelEqualsOneProcess) {
  lf::testing::expect_same_training(single(), run(2, {"--tensor-model-parallel-size", "2"}, "tp2"), "wan: tp 2");
  lf::testing::expect_same_training(single(), run(2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "sp2"),
                                    "wan: tp 2 + sp");
}

TEST(WanTraining, DataParallelEqualsOneProcess) {
  lf::testing::expect_same_training(single(), run(2, {"--use-distributed-optimizer"}, "dp2"), "wan: dp 2, ZeRO-1");
}

TEST(WanTraining, UlyssesContextParallelEqualsOneProcess) {
  lf::testing::expect_same_training(single(), run(2, {"--context-parallel-size", "2"}, "cp2"), "wan: cp 2 (Ulysses)");
  lf::testing::expect_same_training(
      single(), run(4, {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}, "cp2tp2"),
      "wan: cp 2 x tp 2 + sp");
}

TEST(WanTraining, FullRecomputationEqualsNone) {
  lf::testing::expect_same_training(single(), run(1, {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}, "recompute"), "wan: recompute");
  lf::testing::expect_same_training(
      single(), run(1, {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"},
                    "recompute_block"),
      "wan: recompute block 1");
}

// Gradient-accumulation fusion (the default: the DiT's linear layers write their fp32 weight
// gradients straight into the gradient buffer's slots, and their GEMMs take lf::ops::gemm) trains
// as autograd's path does (--no-gradient-accumulation-fusion: at::linear, the hooks' copies), over
// 2 micro-batches a step (the first writes the slots, the second adds) and with TP 2 + SP.
TEST(WanTraining, GradientAccumulationFusionEqualsAutograd) {
  const auto off = run(1, {"--no-gradient-accumulation-fusion"}, "gaf-off");
  lf::testing::expect_same_training(off, single(), "wan: fusion on vs off");
  lf::testing::expect_same_training(off, run(2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "gaf-sp2"),
                                    "wan: fusion, tp 2 + sp vs off, one process");
}

// Image-to-video (image embeddings through the image embedder and the added key/value projections),
// per-token timesteps with the first frame clean (Wan 2.2 TI2V), bf16: each trains, TP 2 equal.
TEST(WanTraining, ImageConditioningAndFirstFrameTrain) {
  const std::vector<std::string> i2v = {"model.foundation.image_dim=8", "model.foundation.added_kv_proj_dim=48"};
  auto one = run(1, i2v, "i2v1");
  auto extra = i2v;
  extra.insert(extra.end(), {"--tensor-model-parallel-size", "2"});
  lf::testing::expect_same_training(one, run(2, extra, "i2v2"), "wan i2v: tp 2");
  auto ff = run(1, {"model.first_frame_conditioning=true"}, "ff");
  ASSERT_EQ(ff.exit_code, 0) << ff.output;
  ASSERT_EQ(ff.losses.size(), 10u);
  EXPECT_NE(ff.losses[0], single().losses[0]);  // another objective: the first frame is not in it
  lf::testing::expect_same_training(ff, run(2, {"model.first_frame_conditioning=true", "--context-parallel-size", "2"}, "ffcp"),
                                    "wan first frame: cp 2");
  // Text dropout (the unconditional model of CFG) is drawn per sample from the same stream on every
  // layout: another objective, DP 2 equal.
  auto drop = run(1, {"model.text_dropout=0.5"}, "drop");
  ASSERT_EQ(drop.exit_code, 0) << drop.output;
  EXPECT_NE(drop.losses.back(), single().losses.back());  // (step 1 is the zero head's: the text cannot matter yet)
  lf::testing::expect_same_training(drop, run(2, {"model.text_dropout=0.5"}, "drop2"), "wan text dropout: dp 2");
  auto bf16 = run(1, {"--bf16"}, "bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(bf16.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(bf16.losses[i], single().losses[i], 0.05 * single().losses[i]) << i;
}

// Stop at step 5 with a checkpoint, resume: steps 6..10 equal the straight run (the step counter of
// the noise stream is in the checkpoint).
TEST(WanTraining, ResumeIsExact) {
  const std::string dir = lf::testing::make_temp_dir("wan-resume");
  auto first = run(1, {"--save", dir + "/ck", "--exit-interval", "5"}, "resume_a");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run(1, {"--load", dir + "/ck"}, "resume_b");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(second.losses.size(), 5u) << second.output;
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(second.losses[i], single().losses[5 + i], 1e-6 * single().losses[5 + i]) << i;
  EXPECT_LE(lf::testing::max_abs_diff(single().params, second.params), 1e-6);
}

// Saved at TP 2, resumed in one process: the per-rank RNG states are not loaded at another layout,
// and the noise and timestep streams continue from the checkpoint's iteration (they restarted at
// step 1: losses 50% off). Steps 6..10 equal the straight run within the equivalence tolerances.
TEST(WanTraining, ResumeAtAnotherLayoutContinuesTheNoiseStreams) {
  lf::testing::expect_resume_at_another_layout(kConfig, single(), 2, {"--tensor-model-parallel-size", "2"},
                                               "wan-resume-layout");
}

// --ema-decay: the checkpoint keeps ema_t = d ema_{t-1} + (1 - d) w_t after every step (checked
// between the checkpoints of steps 9 and 10), it survives a resume exactly, and a run without EMA
// keeps none (reading it is an error naming the flag).
TEST(WanTraining, EmaWeightsAreKeptInTheCheckpoint) {
  const std::string dir = lf::testing::make_temp_dir("wan-ema");
  const std::vector<std::string> ema = {"--ema-decay", "0.7"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), ema.begin(), ema.end());
    return extra;
  };
  auto a = run(1, with({"--save", dir + "/a", "--save-interval", "9"}), "ema_a");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // The weights are the ones trained without EMA (it only watches).
  EXPECT_EQ(lf::testing::max_abs_diff(single().params, a.params), 0.0);
  auto m9 = lf::train::read_model_checkpoint(dir + "/a", 9, false), e9 = lf::train::read_model_checkpoint(dir + "/a", 9, true);
  auto m10 = lf::train::read_model_checkpoint(dir + "/a", 10, false), e10 = lf::train::read_model_checkpoint(dir + "/a", 10, true);
  ASSERT_EQ(e10.tensors.size(), m10.tensors.size());
  double worst = 0, moved = 0;
  for (size_t i = 0; i < e10.tensors.size(); ++i) {
    ASSERT_EQ(e10.tensors[i].first, m10.tensors[i].first);
    const auto want = 0.7 * e9.tensors[i].second + 0.3 * m10.tensors[i].second;
    worst = std::max(worst, (e10.tensors[i].second - want).abs().max().item<double>());
    moved = std::max(moved, (e10.tensors[i].second - m10.tensors[i].second).abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-6);  // fp32: lerp rounds differently from the formula (an ulp near 1)
  EXPECT_GT(moved, 1e-4);  // the EMA is not the weights
  // Resume from step 9: the same EMA at step 10.
  auto b = run(1, with({"--load", dir + "/a/iter_0000009", "--save", dir + "/b"}), "ema_b");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto eb = lf::train::read_model_checkpoint(dir + "/b", 10, true);
  for (size_t i = 0; i < eb.tensors.size(); ++i)
    EXPECT_TRUE(at::equal(eb.tensors[i].second, e10.tensors[i].second)) << eb.tensors[i].first;
  // loongforge-convert lf2hf --ema exports them as the diffusers directory's weights.
  auto x = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", dir + "/a", "--out", dir + "/hf",
                                     "--dtype", "fp32", "--ema"});
  ASSERT_EQ(x.exit_code, 0) << x.output;
  auto hf = lf::models::diffusers::read_wan_weights(dir + "/hf");
  for (const auto& [name, t] : e10.tensors) EXPECT_TRUE(at::equal(hf.at(name), t)) << name;
  // No EMA kept: exporting it is an error naming the flag.
  auto c = run(1, {"--save", dir + "/c"}, "ema_c");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto y = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", dir + "/c", "--out", dir + "/hf2",
                                     "--ema"});
  EXPECT_NE(y.exit_code, 0);
  EXPECT_NE(y.output.find("--ema-decay"), std::string::npos) << y.output;
}

// Real data: `loongforge-data make-demo-squares` writes a latent store and example PNG frames;
// `loongforge-data diffusion` makes the same samples from a manifest of those frames and the text
// table; loongforge-train reads the store (a seeded permutation per epoch): DP 2 and CP 2 equal one
// process, a resume continues exactly, and a store of another latent space is an error.
TEST(WanTraining, TrainsOnALatentStore) {
  const std::string dir = lf::testing::make_temp_dir("wan-store");
  auto r = lf::testing::run_command({bin("loongforge-data"), "make-demo-squares", "--out", dir + "/demo", "--clips", "48",
                                     "--text-dim", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {
    std::ofstream m(dir + "/manifest.jsonl");
    for (int i = 0; i < 4; ++i) {
      m << R"({"caption": ")" << lf::data::squares_caption(lf::data::squares_colours()[i % 4],
                                                          lf::data::squares_directions()[(i / 4) % 4])
        << R"(", "frames": [)";
      for (int f = 0; f < 4; ++f)
        m << (f ? ", " : "") << '"' << "demo/example" << i << "_frame" << f << ".png" << '"';
      m << "]}\n";
    }
  }
  r = lf::testing::run_command({bin("loongforge-data"), "diffusion", "--manifest", dir + "/manifest.jsonl", "--out",
                                dir + "/manifest_store", "--text-table", dir + "/demo/text_table.safetensors"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  lf::data::LatentStore a(dir + "/demo/store"), b(dir + "/manifest_store");
  ASSERT_EQ(b.size(), 4);
  for (int i = 0; i < 4; ++i) {
    // The demo's values (-1, 1, the border's -0.6 = pixel 51) survive 8-bit PNG up to fp32 rounding.
    EXPECT_LE((a.get(i).latents - b.get(i).latents).abs().max().item<double>(), 1e-6) << i;
    EXPECT_TRUE(at::equal(a.get(i).text, b.get(i).text)) << i;
    EXPECT_EQ(a.get(i).caption, b.get(i).caption);
  }
  // A caption the table cannot encode names the manifest line and the word.
  {
    std::ofstream m(dir + "/bad.jsonl");
    m << R"({"caption": "a purple square", "image": "demo/example0_frame0.png"})" << "\n";
  }
  r = lf::testing::run_command({bin("loongforge-data"), "diffusion", "--manifest", dir + "/bad.jsonl", "--out",
                                dir + "/bad_store", "--text-table", dir + "/demo/text_table.safetensors"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("bad.jsonl:1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'purple'"), std::string::npos) << r.output;

  const std::vector<std::string> store = {"--data-path", dir + "/demo/store", "++data.mock_data=false",
                                          "model.foundation.in_channels=3", "model.foundation.out_channels=3",
                                          "--eval-iters", "1", "--eval-interval", "5"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), store.begin(), store.end());
    return extra;
  };
  auto one = run(1, with({}), "store1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("latent store"), std::string::npos) << one.output;
  lf::testing::expect_same_training(one, run(2, with({}), "store_dp2"), "wan store: dp 2");
  lf::testing::expect_same_training(one, run(2, with({"--context-parallel-size", "2"}), "store_cp2"), "wan store: cp 2");
  const std::string ck = dir + "/ck";
  auto first = run(1, with({"--save", ck, "--exit-interval", "5"}), "store_a");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run(1, with({"--load", ck}), "store_b");
  ASSERT_EQ(second.losses.size(), 5u) << second.output;
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(second.losses[i], one.losses[5 + i], 1e-6 * one.losses[5 + i]) << i;
  // score-squares on ground-truth clips (and the same clips reversed) as loongforge-generate writes
  // latents: every clip right, then every direction wrong.
  {
    const auto table = lf::data::squares_text_table(16, 1);
    std::vector<at::Tensor> clips;
    for (int i = 0; i < 3; ++i) clips.push_back(lf::data::squares_clip(16 * i, 9, {}, table).latents);  // red, left
    for (bool reverse : {false, true}) {
      at::Tensor all = at::stack(clips);
      if (reverse) all = all.flip(2).contiguous();
      lf::safetensors::Writer w;
      w.add("latents", lf::safetensors::DType::F32, all.sizes().vec(), all.data_ptr());
      w.write(dir + "/scored.safetensors");
      auto s = lf::testing::run_command({bin("loongforge-data"), "score-squares", "--latents", dir + "/scored.safetensors",
                                         "--caption", "a red square moving left"});
      ASSERT_EQ(s.exit_code, 0) << s.output;
      EXPECT_NE(s.output.find(reverse ? "\"direction_correct\": 0" : "\"both_correct\": 3"), std::string::npos)
          << s.output;
    }
    auto bad = lf::testing::run_command({bin("loongforge-data"), "score-squares", "--latents", dir + "/scored.safetensors",
                                         "--caption", "a square"});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("names no colour and direction"), std::string::npos) << bad.output;
  }
  // The tiny model's 4 latent channels are not the store's 3.
  auto wrong = run(1, {"--data-path", dir + "/demo/store", "++data.mock_data=false"}, "store_wrong");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("holds 3 latent channels"), std::string::npos) << wrong.output;
}

TEST(WanTraining, LayoutsAndKeysItCannotTakeAreConfigErrors) {
  auto expect = [](std::vector<std::string> args, int procs, const std::string& key) {
    std::vector<std::string> argv;
    if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    argv.insert(argv.end(), {bin("loongforge-train"), "--config-file", kConfig, "--dry-run"});
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = lf::testing::run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << key << "\n" << r.output;
  };
  expect({"--context-parallel-size", "2", "--cp-comm-type", "p2p"}, 2, "parallel.cp_comm_type");
  expect({"--pipeline-model-parallel-size", "2"}, 2, "parallel.pipeline_model_parallel_size");
  expect({"--recompute-granularity", "selective"}, 1, "training.recompute_granularity");
  // The DiT has no MoE experts: expert settings would do nothing (EP 2 used to run as DP 2).
  expect({"--expert-model-parallel-size", "2"}, 2, "parallel.expert_model_parallel_size: flow_matching has no MoE experts");
  expect({"--moe-token-dispatcher-type", "alltoall"}, 1, "parallel.moe_token_dispatcher_type");
  expect({"--expert-tensor-parallel-size", "1"}, 1, "parallel.expert_tensor_parallel_size");
  expect({"--delay-wgrad-compute"}, 1, "parallel.delay_wgrad_compute");
  // One pipeline stage: a stage layout would do nothing.
  expect({"--decoder-last-pipeline-num-layers", "1"}, 1, "parallel.decoder_last_pipeline_num_layers");
  expect({"--pipeline-model-parallel-layout", "Et|tL"}, 1, "parallel.pipeline_model_parallel_layout");
  expect({"--max-timestep-boundary", "0.2", "--min-timestep-boundary", "0.3"}, 1, "model.max_timestep_boundary");
  expect({"model.foundation.image_dim=8"}, 1, "model.foundation.added_kv_proj_dim");
  expect({"model.mock_latent_shape=[2,6,6]", "--context-parallel-size", "2"}, 2, "model.mock_latent_shape");
  expect({"--tensor-model-parallel-size", "3"}, 3, "model.foundation.num_attention_heads");
  // tokens/s and TFLOP/s count seq_length tokens a sample: it must be the mock latents' patch tokens.
  expect({"--seq-length", "64"}, 1, "training.seq_length 64 is not the mock latents' 32 patch tokens");
  // Validation comes from the latents (or the mock data), never from token datasets.
  expect({"--valid-data-path", "tokens"}, 1, "data.valid_data_path names token datasets");
  // The boundaries show in --dry-run: the high-noise expert of Wan 2.2 A14B, and the low-noise one.
  auto r = lf::testing::run_command({bin("loongforge-train"), "--config-file", kConfig, "--dry-run",
                                     "--max-timestep-boundary", "0.358"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("timestep indices [0, 358) of 1000"), std::string::npos) << r.output;
  r = lf::testing::run_command({bin("loongforge-train"), "--config-file", kConfig, "--dry-run",
                                "--min-timestep-boundary", "0.358"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("timestep indices [358, 1000) of 1000"), std::string::npos) << r.output;
}

}  // namespace
