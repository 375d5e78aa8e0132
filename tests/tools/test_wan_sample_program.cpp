// loongforge-generate's sampling mode for Wan diffusion transformers (tools/generate/sample.h)
// against diffusers (tests/models/wan_sample_oracle.py: a tiny random T2V model, noise drawn by
// torch.randn from torch.Generator().manual_seed(1234), text embeddings and the final latents of
// FlowMatchEulerDiscreteScheduler(shift 5) Euler sampling, 8 steps, guidance 4 and 1; a tiny model
// with 3 latent channels): --text-embeddings with --seed 1234 gives diffusers' latents (the
// program's documented noise is Python's), also with --first-frame (Wan 2.2 TI2V's conditioning,
// against diffusers' expand_timesteps loop) and with two noise experts (--load-low-noise, Wan 2.2
// A14B); on the 3-channel model --prompt with --text-table gives
// the in-process sampler's latents, every frame as a PNG that decodes to the latents' pixels and
// an animated GIF whose frames decode to the same pixels; --use-ema samples the EMA weights a
// training run kept (equal to sampling their lf2hf --ema export); mistakes are clear errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "../models/cached_oracle.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/text_table.h"
#include "loongforge/media/image.h"
#include "loongforge/media/video.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/flow_sampler.h"
#include "loongforge/models/wan_diffusers.h"
#include "multiprocess.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
namespace df = lf::models::diffusers;
using lf::testing::bin;
using lf::testing::run_command;

const std::string& oracle() {
  static const std::string dir = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/models/wan_sample_oracle.py", "wan_sample_oracle", "done");
  return dir;
}

#define NEED_ORACLE()                                                        \
  if (oracle().empty()) GTEST_SKIP() << "no .venv with torch and diffusers"; \
  ASSERT_TRUE(fs::exists(oracle() + "/done")) << oracle()

at::Tensor latents_of(const std::string& dir) {
  return lf::testing::read_safetensors(dir + "/latents.safetensors").at("latents");
}

void expect_error(const lf::testing::RankResult& r, std::initializer_list<std::string> words) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const auto& w : words) EXPECT_NE(r.output.find(w), std::string::npos) << "no '" << w << "' in " << r.output;
}

// loongforge-generate sampling `load` into `out`: 8 steps, guidance 4, shift 5, seed 1234, 2 samples
// unless `extra` gives the flag.
std::vector<std::string> sample_args(const std::string& load, const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> a = {bin("loongforge-generate"), "--load", load, "--output-dir", out};
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--num-inference-steps", "8"},
                                                                                    {"--guidance-scale", "4"},
                                                                                    {"--sample-shift", "5"},
                                                                                    {"--seed", "1234"},
                                                                                    {"--num-samples", "2"}})
    if (std::find(extra.begin(), extra.end(), flag) == extra.end()) a.insert(a.end(), {flag, value});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(WanSampleProgram, TextEmbeddingsGiveDiffusersLatents) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_sample_emb");
  const std::string t2v = oracle() + "/t2v";
  const auto want = lf::testing::read_safetensors(t2v + "/sample.safetensors");
  for (const auto& [g, name] : {std::pair<const char*, const char*>{"4", "latents_g4"}, {"1", "latents_g1"}}) {
    SCOPED_TRACE(name);
    auto r = run_command(sample_args(
        t2v, work + "/" + name,
        {"--text-embeddings", t2v + "/text.safetensors", "--latent-shape", "3,8,6", "--guidance-scale", g}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const at::Tensor got = latents_of(work + "/" + name);
    ASSERT_EQ(got.sizes(), want.at(name).sizes());
    const double diff = (got - want.at(name)).abs().max().item<double>();
    std::printf("[wan sample] guidance %s: max |program - diffusers| = %.3g\n", g, diff);
    EXPECT_LE(diff, 1e-4);
    // 4 latent channels: VAE latents, no frames.
    EXPECT_NE(r.output.find("AutoencoderKLWan"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(work + "/" + std::string(name) + "/sample_0.gif"));
  }
}

// --first-frame (Wan 2.2 TI2V): diffusers' WanImageToVideoPipeline loop with expand_timesteps.
TEST(WanSampleProgram, FirstFrameGivesDiffusersTi2vLatents) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_sample_first");
  const std::string t2v = oracle() + "/t2v";
  const auto want = lf::testing::read_safetensors(t2v + "/sample.safetensors");
  for (const bool per_sample : {true, false}) {
    SCOPED_TRACE(per_sample ? "[K, C, 1, H, W]" : "[C, 1, H, W]");
    // [C, 1, H, W]: the first sample's frame for both.
    const at::Tensor first =
        per_sample ? want.at("first_frame").contiguous() : want.at("first_frame")[0].contiguous();
    lf::safetensors::Writer w;
    w.add("first_frame", lf::safetensors::DType::F32, first.sizes().vec(), first.data_ptr());
    const std::string file = work + (per_sample ? "/ff2.safetensors" : "/ff1.safetensors");
    w.write(file);
    const std::string out = work + (per_sample ? "/out2" : "/out1");
    auto r = run_command(sample_args(t2v, out, {"--text-embeddings", t2v + "/text.safetensors", "--latent-shape",
                                                "3,8,6", "--first-frame", file}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const at::Tensor got = latents_of(out);
    if (per_sample) {
      const double diff = (got - want.at("latents_first_frame")).abs().max().item<double>();
      std::printf("[wan sample] first frame: max |program - diffusers| = %.3g\n", diff);
      EXPECT_LE(diff, 1e-4);
    } else {
      EXPECT_TRUE(at::equal(got[1].narrow(1, 0, 1), first));
      EXPECT_LE((got[0] - want.at("latents_first_frame")[0]).abs().max().item<double>(), 1e-4);
    }
  }
  // Another height than --latent-shape's: an error naming the flag and the file.
  expect_error(run_command(sample_args(t2v, work + "/bad", {"--text-embeddings", t2v + "/text.safetensors",
                                                            "--latent-shape", "3,10,6", "--first-frame",
                                                            work + "/ff2.safetensors"})),
               {"--first-frame", "ff2.safetensors", "first_frame"});
}

// --load-low-noise (Wan 2.2 A14B): diffusers' WanPipeline with boundary_ratio 0.8, guidance 4 and
// guidance_scale_2 2; the experts' mistakes name the flags.
TEST(WanSampleProgram, TwoNoiseExpertsGiveDiffusersLatents) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_sample_two");
  const std::string t2v = oracle() + "/t2v", text = t2v + "/text.safetensors";
  const auto want = lf::testing::read_safetensors(t2v + "/sample.safetensors");
  auto r = run_command(sample_args(t2v, work + "/out",
                                   {"--text-embeddings", text, "--latent-shape", "3,8,6", "--load-low-noise",
                                    oracle() + "/t2v_low", "--boundary-ratio", "0.8", "--guidance-scale-low", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double diff = (latents_of(work + "/out") - want.at("latents_two_experts")).abs().max().item<double>();
  std::printf("[wan sample] two experts: max |program - diffusers| = %.3g\n", diff);
  EXPECT_LE(diff, 1e-4);
  expect_error(run_command(sample_args(t2v, work + "/e1", {"--text-embeddings", text, "--latent-shape", "3,8,6",
                                                           "--load-low-noise", oracle() + "/t2v_low"})),
               {"--load-low-noise", "--boundary-ratio"});
  expect_error(run_command(sample_args(t2v, work + "/e2", {"--text-embeddings", text, "--latent-shape", "3,8,6",
                                                           "--boundary-ratio", "0.8"})),
               {"--boundary-ratio", "--load-low-noise"});
  // An expert of another latent space (the 3-channel model).
  expect_error(run_command(sample_args(t2v, work + "/e3", {"--text-embeddings", text, "--latent-shape", "3,8,6",
                                                           "--load-low-noise", oracle() + "/rgb", "--boundary-ratio",
                                                           "0.8"})),
               {"--load-low-noise", "rgb", "in_channels is 3"});
}

// The pixel latent space: PNG frames and GIFs, the prompt through a text table.
TEST(WanSampleProgram, PixelModelWritesFramesAndGifs) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_sample_rgb");
  const std::string rgb = oracle() + "/rgb";
  const auto table = lf::data::TextTable::random({"red", "green", "square", "moves", "left", "right"}, 16, 6, 3);
  table.write(work + "/table.safetensors");
  auto r = run_command(sample_args(rgb, work + "/out",
                                   {"--prompt", "red square moves left", "--negative-prompt", "green",
                                    "--text-table", work + "/table.safetensors", "--latent-shape", "5,8,6",
                                    "--fps", "10"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const at::Tensor latents = latents_of(work + "/out");
  ASSERT_EQ(latents.sizes(), (std::vector<int64_t>{2, 3, 5, 8, 6}));

  // The in-process sampler from the documented noise: torch.randn with manual_seed(1234).
  const auto c = df::read_wan_config(rgb);
  lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(0), at::kFloat, at::Device(at::kCPU),
                             lf::parallel::TensorParallel{}, false);
  lf::models::WanDit dit(c, lf::backend::cpu_backend(), b, 0, 0);
  df::load_into(b.params(), df::read_wan_weights(rgb, at::kFloat), rgb);
  dit.set_training(false);
  const at::Tensor noise = at::randn({2, 3, 5, 8, 6}, at::make_generator<at::CPUGeneratorImpl>(1234));
  lf::models::FlowSamplerOptions o;
  o.num_inference_steps = 8;
  o.guidance_scale = 4;
  const at::Tensor want = lf::models::flow_euler_sample(
      dit, noise, table.encode("red square moves left").unsqueeze(0).expand({2, -1, -1}),
      table.encode("green").unsqueeze(0).expand({2, -1, -1}), {}, o);
  EXPECT_LE((latents - want).abs().max().item<double>(), 1e-5);

  for (int64_t k = 0; k < 2; ++k) {
    const std::string dir = work + "/out/sample_" + std::to_string(k);
    const auto gif = lf::media::decode_video(dir + ".gif");
    ASSERT_EQ(gif.size(), 5u) << dir << ".gif";
    int64_t varied = 0;
    for (int64_t f = 0; f < 5; ++f) {
      char name[32];
      std::snprintf(name, sizeof(name), "/frame_%02lld.png", static_cast<long long>(f));
      const auto png = lf::media::decode_image(dir + name);
      ASSERT_EQ(png.height, 8);
      ASSERT_EQ(png.width, 6);
      // round((v + 1) / 2 x 255) clamped, channels last.
      const at::Tensor v = latents[k].select(1, f).permute({1, 2, 0}).contiguous();
      const float* p = v.data_ptr<float>();
      for (size_t i = 0; i < png.rgb.size(); ++i) {
        const double want_px = std::clamp(std::round((double(p[i]) + 1) / 2 * 255), 0.0, 255.0);
        ASSERT_EQ(png.rgb[i], static_cast<uint8_t>(want_px)) << dir << name << " byte " << i << " from " << p[i];
        varied += png.rgb[i] != 0 && png.rgb[i] != 255;
      }
      // At most 256 colours: the GIF's palette is exact.
      EXPECT_EQ(gif[size_t(f)].rgb, png.rgb) << dir << ".gif frame " << f;
    }
    EXPECT_GT(varied, 0) << "every pixel saturated: the check above would not see a wrong mapping";
  }
}

// --use-ema: the EMA weights a training run kept (the same as sampling their lf2hf --ema export);
// a checkpoint that keeps none and a diffusers directory are errors naming the flag.
TEST(WanSampleProgram, UseEmaSamplesTheEmaWeights) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_sample_ema");
  const std::string config = lf::testing::source_dir() + "/configs/examples/wan_tiny.yaml";
  for (const auto& [dir, extra] : {std::pair<const char*, std::vector<std::string>>{"ema", {"--ema-decay", "0.5"}},
                                   {"plain", {}}}) {
    std::vector<std::string> args = {bin("loongforge-train"), "--config-file", config, "--train-iters", "3",
                                     "--eval-iters", "0", "--save", work + "/" + dir};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_command(args, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(300));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  for (const auto& [out, flags] : {std::pair<const char*, std::vector<std::string>>{"hf_ema", {"--ema"}}, {"hf", {}}}) {
    std::vector<std::string> args = {bin("loongforge-convert"), "lf2hf", "--load", work + "/ema", "--out",
                                     work + "/" + out, "--dtype", "fp32"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_command(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::vector<std::string> what = {"--text-embeddings", oracle() + "/t2v/text.safetensors", "--latent-shape",
                                         "2,4,4", "--num-inference-steps", "3"};
  auto sample = [&](const std::string& load, const std::string& out, bool ema) {
    auto args = sample_args(load, work + "/" + out, what);
    if (ema) args.push_back("--use-ema");
    return run_command(args);
  };
  for (const auto& [load, out, ema] : {std::tuple<std::string, std::string, bool>{work + "/ema", "s_ema", true},
                                       {work + "/hf_ema", "s_hf_ema", false},
                                       {work + "/ema", "s_weights", false},
                                       {work + "/hf", "s_hf", false}}) {
    auto r = sample(load, out, ema);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_TRUE(at::equal(latents_of(work + "/s_ema"), latents_of(work + "/s_hf_ema")));
  EXPECT_TRUE(at::equal(latents_of(work + "/s_weights"), latents_of(work + "/s_hf")));
  EXPECT_GT((latents_of(work + "/s_ema") - latents_of(work + "/s_weights")).abs().max().item<double>(), 1e-6);
  expect_error(sample(work + "/plain", "e1", true), {"--use-ema", "keeps no EMA weights", "plain"});
  expect_error(sample(work + "/hf", "e2", true), {"--use-ema", "diffusers", "hf"});
  EXPECT_FALSE(fs::exists(work + "/e1/latents.safetensors"));
  EXPECT_FALSE(fs::exists(work + "/e2/latents.safetensors"));
}

TEST(WanSampleProgram, MistakesAreClearErrors) {
  NEED_ORACLE();
  const std::string work = lf::testing::make_temp_dir("wan_sample_errors");
  const std::string t2v = oracle() + "/t2v", out = work + "/out";
  const std::string text = t2v + "/text.safetensors";
  auto gen = [&](std::vector<std::string> extra) { return run_command(sample_args(t2v, out, extra)); };
  const auto table = lf::data::TextTable::random({"red", "square"}, 16, 4, 3);
  table.write(work + "/table.safetensors");
  // An unknown word, in the prompt and in the negative prompt.
  expect_error(gen({"--prompt", "purple square", "--text-table", work + "/table.safetensors", "--latent-shape", "3,8,6"}),
               {"--prompt", "'purple'", "table.safetensors"});
  expect_error(gen({"--prompt", "red square", "--negative-prompt", "blue", "--text-table", work + "/table.safetensors",
                    "--latent-shape", "3,8,6"}),
               {"--negative-prompt", "'blue'"});
  // A table of another width than the model's text_dim.
  lf::data::TextTable::random({"red"}, 8, 4, 3).write(work + "/narrow.safetensors");
  expect_error(gen({"--prompt", "red", "--text-table", work + "/narrow.safetensors", "--latent-shape", "3,8,6"}),
               {"--text-table", "narrow.safetensors", "text_dim is 16"});
  // Text embeddings without 'prompt', of another width, with an unknown tensor.
  const auto emb = lf::testing::read_safetensors(text);
  auto write = [&](const std::string& file, std::vector<std::pair<std::string, at::Tensor>> tensors) {
    lf::safetensors::Writer w;
    for (auto& [name, t] : tensors) {
      t = t.contiguous();
      w.add(name, lf::safetensors::DType::F32, t.sizes().vec(), t.data_ptr());
    }
    w.write(file);
    return file;
  };
  expect_error(gen({"--text-embeddings", write(work + "/no_prompt.safetensors", {{"negative_prompt", emb.at("prompt")}}),
                    "--latent-shape", "3,8,6"}),
               {"'prompt'", "no_prompt.safetensors"});
  expect_error(gen({"--text-embeddings",
                    write(work + "/narrow_emb.safetensors", {{"prompt", emb.at("prompt").narrow(1, 0, 8)}}),
                    "--latent-shape", "3,8,6"}),
               {"prompt", "narrow_emb.safetensors", "text_dim"});
  expect_error(gen({"--text-embeddings",
                    write(work + "/extra.safetensors", {{"prompt", emb.at("prompt")}, {"pooled", emb.at("prompt")}}),
                    "--latent-shape", "3,8,6"}),
               {"'pooled'", "extra.safetensors"});
  // Latent shapes the patches (1x2x2) do not divide, or malformed.
  expect_error(gen({"--text-embeddings", text, "--latent-shape", "3,7,6"}), {"--latent-shape", "3,7,6", "1x2x2"});
  expect_error(gen({"--text-embeddings", text, "--latent-shape", "3,8"}), {"--latent-shape", "F,H,W"});
  // Missing pieces: the text, the shape, the output directory; two text sources.
  expect_error(gen({"--latent-shape", "3,8,6", "--prompt", "red"}), {"--prompt", "--text-table"});
  expect_error(gen({"--text-embeddings", text}), {"--latent-shape"});
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--text-embeddings", text, "--latent-shape",
                            "3,8,6"}),
               {"--output-dir"});
  expect_error(gen({"--text-embeddings", text, "--prompt", "red", "--latent-shape", "3,8,6"}),
               {"--text-embeddings", "--prompt"});
  // A language-model flag on a Wan model; a sampling flag on what is not a Wan model.
  expect_error(gen({"--text-embeddings", text, "--latent-shape", "3,8,6", "--tokenizer-type", "ByteTokenizer"}),
               {"--tokenizer-type", "Wan"});
  fs::create_directories(work + "/empty");
  expect_error(run_command({bin("loongforge-generate"), "--load", work + "/empty", "--latent-shape", "3,8,6"}),
               {"--latent-shape", "Wan"});
  // A sampling flag with --denoise-inputs.
  expect_error(run_command({bin("loongforge-generate"), "--load", t2v, "--denoise-inputs", text, "--dump-prediction",
                            work + "/p.safetensors", "--latent-shape", "3,8,6"}),
               {"--latent-shape", "--denoise-inputs"});
  EXPECT_FALSE(fs::exists(out + "/latents.safetensors"));
}

}  // namespace
